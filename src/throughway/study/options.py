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
`dataclasses.asdict(config)`: nothing is declared twice, and adding an option is one line.

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
from typing import Any, Iterable, Sequence, TypeVar, Union

__all__ = ["option", "add_options", "config_from_args", "quick_config", "option_fields", "NO_QUICK", "DeprecatedAlias",
           "check_known", "check_residual_depths"]

T = TypeVar("T")
NO_QUICK: Any = object()  # the field keeps its default under --quick
_META = "throughway.option"


def option(default: Any, help: str, *, quick: Any = NO_QUICK, choices: Sequence[Any] | None = None,
           cli: bool = True, flag: str | None = None, minimum: float | None = None, empty_ok: bool = False,
           negatable: bool = True, aliases: Sequence[str] = (), count: bool = False,
           convert: Any = None) -> Any:
    """A dataclass field that is also a command-line option.

    `default` is the paper's value (tuples for sequences: the dataclass is frozen); `help` is the
    option's help text; `quick` the value under --quick; `choices` the accepted values (for a tuple
    field, of each element); `cli=False` keeps the field off the command line; `flag` overrides the
    option name (default `--field-name`); `minimum` refuses smaller numbers (exit 2 via argparse);
    `empty_ok` lets a tuple field be given with no values (e.g. to skip a part of a study);
    `negatable=False` makes a bool field a plain switch (`--merge`, no `--no-merge`) that sets True;
    `aliases` are older spellings of the flag, still accepted but hidden from --help and warned
    about on stderr; `count=True` makes a tuple-of-int field (seeds 0, 1, 2) a count on the command
    line (`--seeds 3`), as every study's `--seeds` is, while the config keeps the tuple (several
    values, `--seeds 0 1 2`, still name the seeds, as recorded commands do); `convert(text)` reads a
    str field's value from the command line instead of the type (a ValueError there is exit 2 naming
    the option: `--shard auto` becomes i/N so, study.shards).
    """
    metadata = {_META: {"help": help, "quick": quick, "choices": tuple(choices) if choices is not None else None,
                        "cli": cli, "flag": flag, "minimum": minimum, "empty_ok": empty_ok, "negatable": negatable,
                        "aliases": tuple(aliases), "count": count,
                        "convert": convert}}
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


def _converter(kind: Any, name: str, minimum: float | None, custom: Any = None) -> Any:
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
        return value
    return convert


def add_options(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """Add one option per `option(...)` field of `config_cls` (cli=True) to `parser`, and --quick
    when any field has a quick value. Defaults stay None in the parser, so that `config_from_args`
    can tell what the user set."""
    hints = typing.get_type_hints(config_cls)
    has_quick = False
    for f, meta in option_fields(config_cls):
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
        settings = {"type": _converter(kind, flag.lstrip("-"), 0 if count else meta["minimum"], meta.get("convert")),
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
            if given[0] < 1:
                flag = meta["flag"] or "--" + f.name.replace("_", "-")
                raise ValueError(f"{flag} {given[0]}: a count must be ≥ 1 (or give several values: the seeds)")
            values[f.name] = tuple(range(given[0]))
        elif given is not None:
            if isinstance(given, list):
                # A study's lists are sets of values (depths, seeds, networks): a repeated value would
                # train a run twice or count it twice in a row (issue 25, finding 8).
                repeated = sorted({str(v) for v in given if given.count(v) > 1})
                if repeated:
                    flag = meta["flag"] or "--" + f.name.replace("_", "-")
                    raise ValueError(f"{flag} {' '.join(map(str, given))}: lists {', '.join(repeated)} more than once; "
                                     f"accepted: distinct values")
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
