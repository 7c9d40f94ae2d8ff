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
import types
import typing
from typing import Any, Sequence, TypeVar, Union

__all__ = ["option", "add_options", "config_from_args", "quick_config", "option_fields", "NO_QUICK"]

T = TypeVar("T")
NO_QUICK: Any = object()  # the field keeps its default under --quick
_META = "throughway.option"


def option(default: Any, help: str, *, quick: Any = NO_QUICK, choices: Sequence[Any] | None = None,
           cli: bool = True, flag: str | None = None, minimum: float | None = None, empty_ok: bool = False,
           negatable: bool = True) -> Any:
    """A dataclass field that is also a command-line option.

    `default` is the paper's value (tuples for sequences: the dataclass is frozen); `help` is the
    option's help text; `quick` the value under --quick; `choices` the accepted values (for a tuple
    field, of each element); `cli=False` keeps the field off the command line; `flag` overrides the
    option name (default `--field-name`); `minimum` refuses smaller numbers (exit 2 via argparse);
    `empty_ok` lets a tuple field be given with no values (e.g. to skip a part of a study);
    `negatable=False` makes a bool field a plain switch (`--merge`, no `--no-merge`) that sets True.
    """
    metadata = {_META: {"help": help, "quick": quick, "choices": tuple(choices) if choices is not None else None,
                        "cli": cli, "flag": flag, "minimum": minimum, "empty_ok": empty_ok, "negatable": negatable}}
    return dataclasses.field(default=default, metadata=metadata)


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


def _converter(kind: type, name: str, minimum: float | None) -> Any:
    def convert(text: str) -> Any:
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
        default = f.default
        shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
        quick = "" if meta["quick"] is NO_QUICK else f"; --quick: {meta['quick']}"
        text = f"{meta['help']} (default {shown}{quick})"
        if kind is bool and not is_tuple:
            action = argparse.BooleanOptionalAction if meta.get("negatable", True) else "store_true"
            parser.add_argument(flag, dest=f.name, action=action, default=None, help=text)
            continue
        parser.add_argument(flag, dest=f.name, type=_converter(kind, f.name.replace("_", "-"), meta["minimum"]),
                            nargs=("*" if meta.get("empty_ok") else "+") if is_tuple else None, choices=meta["choices"], default=None, help=text)
    if has_quick and not any("--quick" in a.option_strings for a in parser._actions):
        parser.add_argument("--quick", action="store_true",
                            help="the quick variant: every field's --quick value (shown in each option's help)")


def quick_config(config_cls: type[T], **changes: Any) -> T:
    """`config_cls` with every field's quick value (fields without one keep their default), then `changes`."""
    values = {f.name: meta["quick"] for f, meta in option_fields(config_cls) if meta["quick"] is not NO_QUICK}
    return config_cls(**{**values, **changes})


def config_from_args(config_cls: type[T], args: argparse.Namespace, base: T | None = None, **changes: Any) -> T:
    """The config the command line asks for: `base` (a preset; default the quick values when
    `args.quick`, else the defaults), then every option the user set (tuples for sequence fields),
    then `changes` (e.g. device and data_dir)."""
    if base is None:
        base = quick_config(config_cls) if getattr(args, "quick", False) else config_cls()
    values: dict[str, Any] = {}
    for f, meta in option_fields(config_cls):
        given = getattr(args, f.name, None) if meta["cli"] else None
        if given is not None:
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
