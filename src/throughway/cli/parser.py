"""The argument parser of every `throughway` sub-command (`build_parser`) and its option types."""

from __future__ import annotations

import argparse
import difflib
import math
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = ["build_parser", "command_of", "COMMANDS", "did_you_mean"]


def did_you_mean(value: str, accepted: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the accepted value closest to a mistyped `value` (difflib), or ""."""
    close = difflib.get_close_matches(str(value), [str(a) for a in accepted], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class _Parser(argparse.ArgumentParser):
    """argparse, plus: a mistyped choice (`--dataset fashion_mnist`, `reproduce mnist_depth`, `analyze
    gate`) or option (`train --epcohs 1`) gets the closest accepted one suggested, and an unknown
    option is refused with the usage of the sub-command it was given to, not the program's."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from "
                                                 f"{', '.join(map(repr, action.choices))})"
                                                 f"{did_you_mean(value, action.choices)}")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._innermost(parsed)
            options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
            hint = did_you_mean(extras[0].split("=", 1)[0], options) if extras[0].startswith("--") else ""
            parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _innermost(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The sub-command parser that `parsed` went through last (this one when there is none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, _Parser):
                    return chosen._innermost(parsed)
        return self

def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive integer")
    return value



def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or a positive integer")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("throughway")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "(not installed)"


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number")
    return value



def _add_common(parser: argparse.ArgumentParser, threads: bool = True) -> None:
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1 (default cpu)")
    parser.add_argument("--data-dir", help="dataset cache folder (default $THROUGHWAY_DATA, else "
                                           "$XDG_CACHE_HOME/throughway or ~/.cache/throughway); for CIFAR the folder holding the official python batches")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    if not threads:  # the experiment's Config declares its own --threads (its single-process studies)
        return
    parser.add_argument("--threads", type=_positive_int,
                        help="torch intra-op threads of this process and of each worker (--jobs); default: torch's, "
                             "or cores // jobs with several workers. Recorded in results.json (environment.threads): "
                             "a run re-runs bit for bit only with the same count")



def _registered(kind: str, names: Callable[[], Iterable[str]]) -> Any:
    """An argparse type accepting one of `names()` (a registry's keys, read when the value is checked, so
    that entries registered after the parser was built count), and refusing any other with the accepted
    values and the closest one."""
    def check(text: str) -> str:
        accepted = sorted(names())
        if text not in accepted:
            raise argparse.ArgumentTypeError(f"{kind} {text!r} is not known; accepted values: "
                                             f"{', '.join(accepted)}{did_you_mean(text, accepted)}")
        return text
    check.__name__ = kind
    return check


def _run_dir(text: str) -> str:
    """A run directory; a run's results.json or model.safetensors stands for the folder holding it."""
    path = Path(text)
    if path.is_file():
        if path.name in ("results.json", "model.safetensors"):
            return str(path.parent)
        raise argparse.ArgumentTypeError(f"{text} is a file: pass the run directory (the folder holding "
                                         f"results.json and model.safetensors)")
    return text


def _add_format(parser: argparse.ArgumentParser) -> None:
    from ..report.figures import FIGURE_FORMATS

    parser.add_argument("--format", choices=list(FIGURE_FORMATS), default="png",
                        help="file format of the figures: png (default), or svg / pdf (vector, for papers)")



def _usage() -> str:
    """The command summary that `throughway --help` prints: the first part of throughway.cli's docstring."""
    return (import_module("throughway.cli").__doc__ or "").split("\n(This text")[0]


# The sub-commands, in the order `throughway --help` lists them, with their one-line help.
COMMANDS = {
    "list": "registered models, recipes and experiments, one per line, name first",
    "train": "train one model; writes OUT/results.json and OUT/model.safetensors",
    "reproduce": "reproduce a paper's table or figure",
    "report": "remake an experiment's table and figures from DIR/results.json",
    "analyze": "what a finished run's gates learned (k, pruning, highway maps, lesioning)",
    "sdi": "squared distance to identity (SDI/TSDI) of layers at initialisation (gated-residual-v1 section 2)",
    "data": "datasets",
}


def command_of(argv: Sequence[str]) -> str:
    """The sub-command `argv` runs: its first word when that is one of COMMANDS, else "" (`--help`,
    `--version`, no command, or a mistyped one, which the parser refuses with the closest name)."""
    first = next((a for a in argv if not a.startswith("-")), "")
    return first if first in COMMANDS else ""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the `throughway` command line.

    With `command=None` every sub-command has all its options (what the tests and the docs read).
    `main` passes the sub-command being run (`command_of(argv)`): only that one gets its options, the
    others are listed by name and help alone, so that parsing `train` imports no experiment's code and
    builds no study's config. `throughway --help`, the names a mistyped command is matched against and
    the exit statuses are the same either way."""
    parser = _Parser(prog="throughway", description=_usage(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    builders: dict[str, Callable[[argparse.ArgumentParser], None]] = {
        "list": lambda _: None, "train": _add_train, "reproduce": _add_reproduce, "report": _add_report,
        "analyze": _add_analyze, "sdi": _add_sdi, "data": _add_data}
    for name, help in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help)
        if command is None or command == name:
            builders[name](command_parser)
    return parser


def _add_train(train: argparse.ArgumentParser) -> None:
    from ..data import DATASETS
    from ..data.augment import AUGMENTATIONS, NORMALIZATIONS

    def recipes() -> Iterable[str]:  # imported when --recipe is checked
        from ..train.recipes import RECIPES

        return RECIPES

    train.add_argument("--model", required=True, help="a registered model name (see `throughway list`)")
    train.add_argument("--depth", type=int, required=True,
                       help="the paper's d: number of middle layers (MLPs); the network's depth for conv nets "
                            "(e.g. 28 for WRN-28-10, 32 for the ResNet n=5, 10 for the conv highway net)")
    train.add_argument("--dataset", default="mnist", choices=list(DATASETS), help="the data (default mnist)")
    train.add_argument("--recipe", default="gresnet-mnist", type=_registered("recipe", recipes),
                       help="a registered recipe name (default gresnet-mnist; see `throughway list`)")
    train.add_argument("--epochs", type=_positive_int, help="override the recipe's epochs (default: the recipe's)")
    train.add_argument("--seed", type=int, default=0,
                       help="seed of the initialisation and of the mini-batches' order (default 0)")
    train.add_argument("--out", help="run directory (default runs/<model>-d<depth>-s<seed>)")
    train.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    train.add_argument("--train-on-full", action=argparse.BooleanOptionalAction, default=None,
                       help="train on train+validation (60,000 for MNIST, 50,000 for CIFAR); default: on for the "
                            "recipes whose authors did (highway-conv-cifar, highway-conv-mnist), off otherwise")
    train.add_argument("--augment", choices=list(AUGMENTATIONS),
                       help="override the recipe's training augmentation (crop-flip: pad 4, crop-flip-8: pad 8; "
                            "default: the recipe's)")
    train.add_argument("--normalize", choices=list(NORMALIZATIONS),
                       help="override the recipe's normalisation (e.g. mean: per-channel means; gcn-mean-image: "
                            "the highway authors' GCN + mean image; default: the recipe's)")
    train.add_argument("--limit", type=_positive_int,
                       help="keep only the first N samples of each split (smoke tests; default: all)")
    train.add_argument("--width", type=_positive_int, help="units per layer (default: the model's, 50 for the MLPs)")
    train.add_argument("--k-init", type=_finite_float, help="initial k of scalar gates (default 1)")
    train.add_argument("--gate-bias", type=_finite_float,
                       help="initial transform-gate bias of highway layers (default: the model's, -2 for mlp_highway)")
    train.add_argument("--activation", choices=["relu", "tanh"], help="activation of the layers (default: the model's)")
    train.add_argument("--lr", type=_finite_float, help="override the recipe's learning rate (default: the recipe's)")
    train.add_argument("--momentum", type=_finite_float,
                       help="override the recipe's momentum, SGD recipes only (default: the recipe's)")
    train.add_argument("--lr-decay", type=_finite_float,
                       help="override the recipe's per-epoch decay factor (default: the recipe's)")
    train.add_argument("--batch-size", type=_positive_int, help="override the recipe's batch size (default: the recipe's)")
    train.add_argument("--weight-decay", type=_finite_float,
                       help="override the recipe's weight decay (default: the recipe's)")
    train.add_argument("--k-decay", action="store_true",
                       help="apply weight decay to k too (the paper's 'k decay'; default off)")
    train.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                       help="any model argument, VALUE parsed as JSON when it parses (e.g. gated=true, "
                            "widen_factor=10, dropout=0.3, shortcut=A); repeatable (default: none)")
    train.add_argument("--amp", action="store_true", help="bf16 autocast for the training forward pass (default off)")
    train.add_argument("--channels-last", action="store_true", help="NHWC memory format, conv nets (default off)")
    train.add_argument("--compile", action="store_true", help="train through torch.compile(model) (default off)")
    train.add_argument("--tensorboard", action="store_true",
                       help="also write TensorBoard event files into --out (needs: pip install "
                            "'throughway[tensorboard]'; default off)")
    train.add_argument("--eval-batch-size", type=_positive_int,
                       help="images per evaluation forward (default 10000; e.g. 1000 for WRN-28-10 on a GPU)")
    _add_common(train)


def _add_reproduce(reproduce: argparse.ArgumentParser) -> None:
    from ..experiments import EXPERIMENTS
    from ..study.options import add_options

    exp_sub = reproduce.add_subparsers(dest="experiment", required=True)
    for name, module in EXPERIMENTS.items():
        exp = exp_sub.add_parser(name, help=module.DESCRIPTION, description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        if hasattr(module, "add_arguments"):
            module.add_arguments(exp)
        else:  # the Config dataclass declares every option (study.options)
            add_options(exp, module.Config)
        exp.add_argument("--out", help=f"output folder (default runs/{name}, or runs/{name}-quick with --quick)")
        exp.add_argument("--resume", action="store_true", help="continue an interrupted study in --out")
        exp.add_argument("--jobs", type=_positive_int,
                         help="runs trained at once, in separate single-threaded processes "
                              "(default: the number of CPU cores on a CPU device, 1 on a GPU)")
        _add_common(exp, threads="threads" not in getattr(getattr(module, "Config", None), "__dataclass_fields__", {}))
        _add_format(exp)


def _add_report(report: argparse.ArgumentParser) -> None:
    report.add_argument("dir", help="an experiment's output folder (holding its results.json)")
    _add_format(report)


def _add_analyze(analyze: argparse.ArgumentParser) -> None:
    analyze_sub = analyze.add_subparsers(dest="analysis", required=True)
    gates = analyze_sub.add_parser("gates", help="k per block, mean k, dead gates of a gated residual run "
                                                 "(gated-residual-v2 Table 2, figure 5 left)")
    prune = analyze_sub.add_parser("prune", help="remove residual blocks greedily by k or at random, test accuracy "
                                                 "after each removal (gated-residual-v2 figure 5 right)")
    prune.add_argument("--strategy", choices=["greedy", "random", "all"], default="all",
                       help="greedy: smallest k first (gated runs only); random: --orders random orders; "
                            "all (default): greedy where there is k, and random")
    prune.add_argument("--orders", type=_positive_int, default=10, help="random orders (default 10)")
    prune.add_argument("--seed", type=int, default=0, help="seed of the random orders (default 0)")
    prune.add_argument("--compare", nargs="+", default=[], metavar="PRUNE_JSON",
                       help="other runs' prune.json (or analysis folders) to draw in the same figure (default: none)")
    highway = analyze_sub.add_parser("highway", help="transform-gate maps of a highway run (highway paper figures 2, 3)")
    highway.add_argument("--classes", type=int, nargs="+", default=[0, 7], help="classes for figure 3 (default 0 7)")
    highway.add_argument("--sample", type=int, help="index of the training sample for figure 2 (default: random)")
    highway.add_argument("--seed", type=int, default=0, help="seed that picks the sample when --sample is not given (default 0)")
    lesion = analyze_sub.add_parser("lesion", help="error with one layer's gates closed, per layer (highway paper figure 4)")
    lesion.add_argument("--split", choices=["train", "val", "test"], default="train",
                        help="split to evaluate (default train, as the paper)")
    for command in (gates, prune, highway, lesion):
        command.add_argument("run_dir", type=_run_dir,
                             help="a finished run directory (results.json + model.safetensors; its results.json "
                                  "stands for it)")
        command.add_argument("--out", help="output folder (default RUN_DIR/analysis)")
        command.add_argument("--checkpoint", action="store_true",
                             help="analyse the latest checkpoint of a run that has not finished (figures say "
                                  "'after epoch N')")
        _add_common(command)
        _add_format(command)
    bn_stats = analyze_sub.add_parser("bn-stats", help="test error with each run's BatchNorm running statistics and "
                                                       "with statistics re-estimated over its training split (could "
                                                       "BatchNorm momentum explain a gap?), mean ± std per model and depth")
    bn_stats.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished run directories (e.g. a study's "
                                                                         "runs/*)")
    bn_stats.add_argument("--out", required=True, help="output folder for bn_stats.json and bn_stats.txt")
    bn_stats.add_argument("--batch-size", type=_positive_int, default=128,
                          help="batch size of the re-estimation (default 128, the gresnet-mnist recipe's)")
    bn_stats.add_argument("--seed", type=int, default=0, help="seed of the batches' order (default 0)")
    _add_common(bn_stats)
    redraw = analyze_sub.add_parser("redraw", help="redraw an analysis folder's figures from its JSON files")
    redraw.add_argument("dir", help="a folder written by `analyze ...` (e.g. RUN_DIR/analysis)")
    redraw.add_argument("--compare", nargs="+", default=[], metavar="PRUNE_JSON",
                        help="other runs' prune.json to draw instead of the ones stored in its prune.json "
                             "(default: the stored ones)")
    _add_format(redraw)


def _add_sdi(sdi_cmd: argparse.ArgumentParser) -> None:
    from ..study.options import DeprecatedAlias

    sdi_cmd.add_argument("--layer", nargs="+", default=["all"],
                         choices=["all", "classical", "highway", "residual", "gated"], help="layer types (default all)")
    sdi_cmd.add_argument("--width", type=_positive_int, default=50,
                         help="n: units, or channels of a conv layer (default 50)")
    sdi_cmd.add_argument("--init", default="he_normal",
                         help="he_normal (default), he_uniform, glorot_uniform, glorot_normal, torch_default, or "
                              "paper_he (He weights and He-variance biases: the paper's convention)")
    sdi_cmd.add_argument("--gate-bias", type=_finite_float, default=-4.0,
                         help="initial transform-gate bias of highway layers (default -4)")
    sdi_cmd.add_argument("--target", type=_finite_float, default=-4.0,
                         help="highway degeneration target c for b_t (default -4)")
    sdi_cmd.add_argument("--k-init", type=_finite_float, default=1.0, help="initial k of gated layers (default 1)")
    sdi_cmd.add_argument("--kernel-size", type=_positive_int, help="k for a k×k convolutional layer (default: dense)")
    sdi_cmd.add_argument("--mc-samples", type=_non_negative_int, default=0, metavar="N",
                         help="also estimate TSDI from N draws of the real initialisers (default 0: none)")
    sdi_cmd.add_argument("--mc", type=_non_negative_int, dest="mc_samples", action=DeprecatedAlias,
                         current="--mc-samples", help=argparse.SUPPRESS)


def _add_data(data: argparse.ArgumentParser) -> None:
    data_sub = data.add_subparsers(dest="data_command", required=True)
    fetch = data_sub.add_parser("fetch", help="fetch, verify and cache a dataset")
    fetch.add_argument("dataset", choices=["mnist", "fashion-mnist"], help="the dataset to fetch")
    fetch.add_argument("--data-dir", help="cache folder (default $THROUGHWAY_DATA, else "
                       "$XDG_CACHE_HOME/throughway or ~/.cache/throughway)")
