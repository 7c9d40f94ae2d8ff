"""One declaration per experiment option: a frozen dataclass field is the command-line option.

An experiment's `Config` is a frozen dataclass whose fields are declared with `option(...)`:

    @dataclass(frozen=True)
    class Config:
        epochs: int = option(100, "epochs per run (paper: 100)", quick=2)
        archs: tuple[str, ...] = option(("plain", "residual"), "architectures", choices=("plain", "residual"))

`add_options(parser, Config)` then adds one `--epochs` / `--archs` option per field (its type,
`nargs`, choices and help from the declaration), `config_from_args(Config, args)` builds the config
(the `quick` values when `--quick` is given, then every option the user set), and
`quick_config(Config)` is the --quick variant. The config recorded in results.json is
`json_config(config)`: nothing is declared twice, and adding an option is one line.

The options every study of many runs shares (`--shard`, `--merge`, and the `device` and `data_dir`
every command sets) are declared once, by `StudyOptions`, the base of such a study's Config; its
`__post_init__` checks every option field against its declaration (type, choices, bounds, `check`)
and then the study's own rules (`StudyOptions.check`), so a Config built from Python is refused as
the command line would refuse it.

One idea has one name across the studies: `--seeds` is a count, `--limit` the first N samples,
`--depths` the depths, `--mc-samples` Monte Carlo draws; an older spelling stays accepted as a
hidden alias (`option(..., aliases=("--layers",))`), and tests/test_cli_consistency.py checks it.

Fields the command line does not set (e.g. `device`, `data_dir`, which every command shares, or an
internal flag) are declared with `option(..., cli=False)` or as plain fields. Ours, not tyro or
simple-parsing: the toolkit's commands are argparse sub-commands with shared options (--device,
--out, --jobs), and a 120-line builder over dataclasses.fields keeps them in one parser without a
dependency; `option` covers the types the experiments use (bool, int, float, str, their optional
forms and tuples of them).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar, Union

from .._io import json_safe
from .shards import parse_shard, resolve_shard

__all__ = ["option", "add_options", "config_from_args", "quick_config", "option_fields", "NO_QUICK", "DeprecatedAlias",
           "StudyOptions", "check_options", "check_known", "check_residual_depths", "check_even_depths",
           "check_stored_config", "json_config", "config_from_json", "MAX_SEEDS", "MAX_VALUES"]

T = TypeVar("T")
NO_QUICK: Any = object()  # the field keeps its default under --quick
_META = "throughway.option"
# The most seeds (or random-search trials) per cell a study accepts: the papers use 5 to 10, and a
# thousand runs per cell would take days; a study's run names are walked per seed, so a summary
# edited to name 10**7 seeds must be refused before anything reads its runs.
MAX_SEEDS = 1_000
# The most values a study's list option holds (depths, architectures, seeds named one by one).
MAX_VALUES = 1_000


def option(default: Any, help: str, *, quick: Any = NO_QUICK, choices: Sequence[Any] | None = None,
           cli: bool = True, flag: str | None = None, minimum: float | None = None, empty_ok: bool = False,
           negatable: bool = True, aliases: Sequence[str] = (), count: bool = False,
           convert: Any = None, maximum: float | None = None,
           check: Callable[[Any], object] | None = None) -> Any:
    """A dataclass field that is also a command-line option.

    `default` is the paper's value (tuples for sequences: the dataclass is frozen); `help` is the
    option's help text; `quick` the value under --quick; `choices` the accepted values (for a tuple
    field, of each element); `cli=False` keeps the field off the command line; `flag` overrides the
    option name (default `--field-name`); `minimum` refuses smaller numbers and `maximum` larger ones
    (exit 2 via argparse; for a `count` field, `maximum` bounds the count);
    `empty_ok` lets a tuple field be given with no values (e.g. to skip a part of a study);
    `negatable=False` makes a bool field a plain switch (`--merge`, no `--no-merge`) that sets True;
    `aliases` are older spellings of the flag, still accepted but hidden from --help and warned
    about on stderr; `count=True` makes a tuple-of-int field (seeds 0, 1, 2) a count on the command
    line (`--seeds 3`), as every study's `--seeds` is, while the config keeps the tuple (several
    values, `--seeds 0 1 2`, still name the seeds, as recorded commands do); `convert(text)` reads a
    str field's value from the command line instead of the type (a ValueError there is exit 2 naming
    the option: `--shard auto` becomes i/N so, study.shards). A tuple field holds at most `MAX_VALUES`
    values. `check(value)` raises ValueError where a value the declaration allows is still wrong (odd
    residual depths: `check_residual_depths`). The same bounds are checked on every Config a study
    builds (`StudyOptions`, `check_options`) and on a config read back from a study's summary
    (`check_stored_config`).
    """
    metadata = {_META: {"help": help, "quick": quick, "choices": tuple(choices) if choices is not None else None,
                        "cli": cli, "flag": flag, "minimum": minimum, "maximum": maximum, "empty_ok": empty_ok,
                        "negatable": negatable,
                        "aliases": tuple(aliases), "count": count,
                        "convert": convert, "check": check}}
    return dataclasses.field(default=default, metadata=metadata)


class DeprecatedAlias(argparse.Action):
    """An older spelling of an option: stores like the option and says, on stderr, what to write now."""

    def __init__(self, option_strings: Sequence[str], dest: str, current: str = "", **kwargs: Any) -> None:
        self.current = current
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated; use {self.current}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def option_fields(config_cls: type) -> list[tuple[dataclasses.Field[Any], dict[str, Any]]]:
    """The fields of `config_cls` declared with `option(...)`, with their declarations."""
    return [(f, f.metadata[_META]) for f in dataclasses.fields(config_cls) if _META in f.metadata]


def _own_first(config_cls: type) -> list[tuple[dataclasses.Field[Any], dict[str, Any]]]:
    """`option_fields` with the fields `config_cls` declares itself first, then those it inherits
    (`StudyOptions`: --shard, --merge; `ResumableOptions`: --threads), each group in declaration order: a
    study's --help lists its own options first."""
    own = vars(config_cls).get("__annotations__", {})
    return sorted(option_fields(config_cls), key=lambda field: field[0].name not in own)


def _base_type(annotation: Any) -> tuple[Any, bool, bool]:
    """(element type, is a tuple, is optional) of a field's resolved annotation."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0]
        origin = typing.get_origin(annotation)
    if origin is tuple:
        return typing.get_args(annotation)[0], True, optional
    return annotation, False, optional


def _converter(kind: Any, name: str, minimum: float | None, custom: Any = None, maximum: float | None = None) -> Any:
    def convert(text: str) -> Any:
        if custom is not None:
            try:
                return custom(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name}: {text!r} is not a valid {kind.__name__}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"--{name}: {text!r} is not a finite number")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"--{name}: {text} is below the smallest accepted value {minimum:g}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"--{name}: {text} is above the largest accepted value {maximum:g}")
        return value
    return convert


def add_options(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """Add one option per `option(...)` field of `config_cls` (cli=True) to `parser`, and --quick
    when any field has a quick value. Defaults stay None in the parser, so that `config_from_args`
    can tell what the user set."""
    hints = typing.get_type_hints(config_cls)
    has_quick = False
    for f, meta in _own_first(config_cls):
        if not meta["cli"]:
            continue
        has_quick |= meta["quick"] is not NO_QUICK
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        kind, is_tuple, _ = _base_type(hints[f.name])
        count = meta.get("count", False)
        auto = kind is bool and f.default is None  # a switch whose default the study decides
        text = f"{meta['help']} (default {'auto' if auto else _shown(f.default, count)}"
        text += ")" if meta["quick"] is NO_QUICK else f"; --quick: {_shown(meta['quick'], count)})"
        if kind is bool and not is_tuple:
            action = argparse.BooleanOptionalAction if meta.get("negatable", True) else "store_true"
            parser.add_argument(flag, dest=f.name, action=action, default=None, help=text)
            continue
        if count:  # a tuple of seeds given as how many: --seeds 3 is seeds 0 1 2 (several values: the seeds)
            text = text.replace(" (default", "; several values name the seeds themselves (default", 1)
            settings_metavar: dict[str, Any] = {"metavar": "N"}
        else:
            settings_metavar = {}
        settings = {"type": _converter(kind, flag.lstrip("-"), 0 if count else meta["minimum"], meta.get("convert"),
                                       None if count else meta.get("maximum")),
                    "nargs": ("*" if meta.get("empty_ok") else "+") if is_tuple else None,
                    "choices": meta["choices"], "default": None}
        parser.add_argument(flag, dest=f.name, help=text, **settings, **settings_metavar)
        for alias in meta.get("aliases", ()):
            parser.add_argument(alias, dest=f.name, action=DeprecatedAlias, current=flag, help=argparse.SUPPRESS,
                                **settings)
    if has_quick and not any("--quick" in a.option_strings for a in parser._actions):
        parser.add_argument("--quick", action="store_true",
                            help="the quick variant: every field's --quick value (shown in each option's help)")


def _shown(value: Any, count: bool = False) -> str:
    """A default or --quick value as the user would type it: tuples space-separated, counts as the count."""
    if count and isinstance(value, tuple):
        return f"{len(value)}: seeds {' '.join(map(str, value))}" if value else "0"
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def quick_config(config_cls: type[T], **changes: Any) -> T:
    """`config_cls` with every field's quick value (fields without one keep their default), then `changes`."""
    values = {f.name: meta["quick"] for f, meta in option_fields(config_cls) if meta["quick"] is not NO_QUICK}
    return config_cls(**{**values, **changes})


def config_from_args(config_cls: type[T], args: argparse.Namespace, base: T | None = None, **changes: Any) -> T:
    """The config the command line asks for: `base` (a preset; default the defaults), with every
    field's quick value when `args.quick`, then every option the user set (tuples for sequence
    fields), then `changes` (e.g. device and data_dir)."""
    if base is None:
        base = config_cls()
    if getattr(args, "quick", False):
        base = dataclasses.replace(base, **{f.name: meta["quick"] for f, meta in option_fields(config_cls)  # type: ignore[type-var]
                                            if meta["quick"] is not NO_QUICK})
    values: dict[str, Any] = {}
    for f, meta in option_fields(config_cls):
        given = getattr(args, f.name, None) if meta["cli"] else None
        if given is not None and meta.get("count") and len(given) == 1:
            flag = meta["flag"] or "--" + f.name.replace("_", "-")
            if given[0] < 1:
                raise ValueError(f"{flag} {given[0]}: a count must be ≥ 1 (or give several values: the seeds)")
            if meta.get("maximum") is not None and given[0] > meta["maximum"]:
                raise ValueError(f"{flag} {given[0]}: accepted: a count up to {meta['maximum']:g}")
            values[f.name] = tuple(range(given[0]))
        elif given is not None:
            if isinstance(given, list):
                # A study's lists are sets of values (depths, seeds, networks): a repeated value would
                # train a run twice or count it twice in a row.
                repeated = sorted({str(v) for v in given if given.count(v) > 1})
                flag = meta["flag"] or "--" + f.name.replace("_", "-")
                if repeated:
                    raise ValueError(f"{flag} {' '.join(map(str, given))}: lists {', '.join(repeated)} more than once; "
                                     f"accepted: distinct values")
                limit = meta["maximum"] if meta.get("count") and meta.get("maximum") is not None else MAX_VALUES
                if len(given) > limit:
                    raise ValueError(f"{flag}: {len(given)} values; accepted: at most {limit:g}")
            values[f.name] = tuple(given) if isinstance(given, list) else given
    return dataclasses.replace(base, **{**values, **changes})  # type: ignore[type-var]


def check_known(field: str, values: Iterable[str], accepted: Iterable[str]) -> None:
    """ValueError naming `field`, the unknown `values` and the accepted ones, where any is not in `accepted`."""
    accepted = list(accepted)
    unknown = sorted(set(values) - set(accepted))
    if unknown:
        raise ValueError(f"{field}: {unknown} not known; accepted values: {accepted}")


def check_residual_depths(depths: Sequence[int]) -> None:
    """ValueError naming the depths d that are not even integers ≥ 0 (d counts middle layers, and every
    residual block holds two of them: gated-residual-v2 §3.1)."""
    bad = [d for d in depths if d < 0 or d % 2]
    if bad:
        raise ValueError(f"depths: {bad} invalid; each d must be an even integer ≥ 0 (residual blocks hold 2 layers)")


def check_even_depths(depths: int | Sequence[int]) -> None:
    """ValueError naming the depths (one, or several) that are odd: nets built of two-layer units (residual blocks,
    2-shortcut units) have an even depth."""
    odd = [d for d in ([depths] if isinstance(depths, int) else depths) if d % 2]
    if odd:
        raise ValueError(f"depths {odd} are odd; accepted: even depths (the net is built of two-layer units)")


_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}


def _stored_value_problem(value: Any, kind: Any, meta: dict[str, Any]) -> str | None:
    """Why one stored value (an element of a list field) is not one the command line could give, or None."""
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif kind is str:
        ok = isinstance(value, str)
    else:
        return None  # a type the options do not declare: its study checks it
    if not ok:
        return f"accepted: {_KIND_NAMES[kind]}"
    if meta["choices"] is not None and value not in meta["choices"]:
        return f"accepted values: {list(meta['choices'])}"
    if kind in (int, float) and not meta.get("count"):
        if meta["minimum"] is not None and value < meta["minimum"]:
            return f"accepted: at least {meta['minimum']:g}"
        if meta.get("maximum") is not None and value > meta["maximum"]:
            return f"accepted: at most {meta['maximum']:g}"
    return None


def _field_problem(meta: dict[str, Any], annotation: Any, value: Any) -> str | None:
    """Why `value` (JSON-like: a list for a tuple field) is not one an `option(...)` field declared with
    `meta` and of type `annotation` accepts, or None: the type, a list for a tuple field (one or more values
    unless `empty_ok`; at most `MAX_VALUES`, or a `count` field's `maximum`; distinct), null only for an
    optional field, the choices, `minimum` and `maximum`, then the declaration's own `check`."""
    kind, is_tuple, optional = _base_type(annotation)
    if value is None:
        return None if optional else "accepted: a value (the field is not optional)"
    values = value if is_tuple else [value]
    if is_tuple:
        if not isinstance(value, list):
            return "accepted: a list"
        limit = meta["maximum"] if meta.get("count") and meta.get("maximum") is not None else MAX_VALUES
        if len(value) > limit:
            return f"holds {len(value)} values; accepted: at most {limit:g}"
        if not value and not meta.get("empty_ok"):
            return "accepted: one or more values"
        if len({_json_key(v) for v in value}) != len(value):
            return "accepted: distinct values"
    for element in values:
        problem = _stored_value_problem(element, kind, meta)
        if problem:
            return problem
    if meta.get("check") is not None:
        try:
            meta["check"](tuple(value) if is_tuple else value)
        except ValueError as exc:
            return str(exc)
    return None


def check_stored_config(config_cls: type, stored: Any, source: Any) -> None:
    """Check a study's config read back from a file (`source`, its summary's 'config') against the bounds
    its options declare, before anything uses it to name or read runs: each `option(...)` field present
    has the declared type (a list for a tuple field, null only for an optional one), its choices,
    `minimum` and `maximum` (a `count` field's maximum bounds how many values it holds), distinct list
    values and at most `MAX_VALUES` of them (`_field_problem`, as `check_options` checks a Config).
    ValueError naming `source`, the field 'config.<name>' and what is accepted: a hand-edited `seeds`
    of 10**7 is refused at once instead of walking run names for minutes."""
    if not isinstance(stored, dict):
        raise ValueError(f"{source}: field 'config' holds {type(stored).__name__}; accepted: an object")
    hints = _hints(config_cls)
    for f, meta in option_fields(config_cls):
        if f.name not in stored:
            continue
        value = stored[f.name]
        problem = _field_problem(meta, hints[f.name], value)
        if problem is None:
            continue
        if problem.startswith("holds "):
            raise ValueError(f"{source}: field 'config.{f.name}' {problem}; the file was edited or damaged")
        raise ValueError(f"{source}: field 'config.{f.name}' is {str(value)[:60]}; {problem}; the file was edited "
                         f"or damaged")


def check_options(config: Any) -> None:
    """Check every `option(...)` field of the Config dataclass `config` against its declaration, as
    `check_stored_config` checks a stored one (`_field_problem`: type, choices, bounds, distinct values,
    the declaration's `check`): ValueError "<field>=<value>: <what is accepted>". What a Config built from
    Python meets that the command line checks as it parses (`StudyOptions.__post_init__` calls it)."""
    hints = _hints(type(config))
    for f, meta in _own_first(type(config)):
        value = getattr(config, f.name)
        problem = _field_problem(meta, hints[f.name], list(value) if isinstance(value, tuple) else value)
        if problem is not None:
            raise ValueError(f"{f.name}={value!r}: {problem}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(config_cls: type) -> dict[str, Any]:
    """The resolved annotations of a Config class (read once per class)."""
    if config_cls not in _HINTS:
        _HINTS[config_cls] = typing.get_type_hints(config_cls)
    return _HINTS[config_cls]


@dataclass(frozen=True)
class StudyOptions:
    """The options every study of many runs or pieces shares, declared once: the base of its Config.

        @dataclass(frozen=True)
        class Config(StudyOptions):
            epochs: int = option(100, "epochs per run (paper: 100)", quick=2, minimum=1)

    `shard` (`--shard i/N | auto`: train only shard i of N, study.shards) and `merge` (`--merge`: train
    nothing, write the summary of every run on disk) are options; `device` and `data_dir` are set by the
    command's own `--device` and `--data-dir`. Building a Config checks every option field against its
    declaration (`check_options`), then, where the Config defines one, its method `check(self)`: the study's
    own rules beyond what its options declare (e.g. a width divisible by the heads), a ValueError naming the
    fields; it may also put a field in its one form (gate-family's depths shallowest first, set with
    `object.__setattr__`)."""

    shard: str = option("1/1", "train only shard i of N (i = 1..N): the study's stacked batches dealt in turn, so "
                               "shards may run at the same time into one --out; auto: i and N from a job array "
                               "(SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT, SGE_TASK_ID, PBS_ARRAY_INDEX with "
                               "THROUGHWAY_SHARD_COUNT and THROUGHWAY_SHARD_FIRST; docs/cluster.md)",
                        convert=resolve_shard, check=parse_shard)
    merge: bool = option(False, "train nothing: write the summary, table and figures from every run under --out "
                                "(all shards)", negatable=False)
    device: str = "cpu"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        check_options(self)
        check = getattr(self, "check", None)
        if check is not None:
            check()



def json_config(config: Any) -> dict[str, Any]:
    """A study's config (a dataclass) as its results.json stores it and reads it back: `asdict`, tuples as
    lists (`_io.json_safe`, the conversion every JSON file of the package goes through). The one way a
    config becomes JSON: what `folders.check_study_folder` and `folders.stored_study` compare with the
    stored config."""
    return dict(json_safe(asdict(config)))


def config_from_json(config_cls: type, stored: dict[str, Any]) -> Any:
    """The inverse of `json_config`: a `config_cls` from a stored JSON config, with the fields it knows
    (others, e.g. of a newer version, are left out) and lists as tuples."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    return config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items() if k in known})


def _json_key(value: Any) -> str:
    """A JSON value as a hashable key (lists and objects included), for telling repeated values apart."""
    import json

    return json.dumps(value, sort_keys=True, default=str)
