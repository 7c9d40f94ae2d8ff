"""`throughway ...`: the command line.

    throughway list                          models, recipes and experiments, one per line, name first
    throughway train --model NAME --depth D  one training run into --out
    throughway reproduce EXPERIMENT          a paper's table or figure, with the paper's numbers beside ours
    throughway report DIR                    remake an experiment's table and figures from DIR/results.json
    throughway report --readme README.md [--check]   rewrite (check) the README's generated result blocks
    throughway data fetch DATASET            fetch, verify and cache a dataset
    throughway analyze gates|prune|highway|lesion RUN_DIR   what a finished run's gates learned
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

__all__ = ["main", "build_parser"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive integer")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1 (default cpu)")
    parser.add_argument("--data-dir", help="dataset cache folder (default $THROUGHWAY_DATA or ~/.cache/throughway); "
                                           "for CIFAR the folder holding the official python batches")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def _add_format(parser: argparse.ArgumentParser) -> None:
    from .report.figures import FIGURE_FORMATS

    parser.add_argument("--format", choices=list(FIGURE_FORMATS), default="png",
                        help="file format of the figures: png (default), or svg / pdf (vector, for papers)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    from .data import DATASETS
    from .experiments import EXPERIMENTS
    from .study.options import add_options

    parser = argparse.ArgumentParser(prog="throughway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="registered models, recipes and experiments, one per line, name first")

    train = sub.add_parser("train", help="train one model; writes OUT/results.json and OUT/model.safetensors")
    train.add_argument("--model", required=True, help="a registered model name (see `throughway list`)")
    train.add_argument("--depth", type=int, required=True,
                       help="the paper's d: number of middle layers (MLPs); the network's depth for conv nets "
                            "(e.g. 28 for WRN-28-10, 32 for the ResNet n=5, 10 for the conv highway net)")
    train.add_argument("--dataset", default="mnist", choices=list(DATASETS))
    train.add_argument("--recipe", default="gresnet-mnist", help="a registered recipe name")
    train.add_argument("--epochs", type=_positive_int, help="override the recipe's epochs")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", help="run directory (default runs/<model>-d<depth>-s<seed>)")
    train.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    train.add_argument("--train-on-full", action="store_true", help="train on train+validation (60,000 for MNIST)")
    train.add_argument("--limit", type=_positive_int, help="keep only the first N samples of each split (smoke tests)")
    train.add_argument("--width", type=_positive_int, help="units per layer (default 50)")
    train.add_argument("--k-init", type=_finite_float, help="initial k of scalar gates (default 1)")
    train.add_argument("--gate-bias", type=_finite_float, help="initial transform-gate bias of highway layers")
    train.add_argument("--activation", choices=["relu", "tanh"], help="activation of the layers")
    train.add_argument("--lr", type=_finite_float, help="override the recipe's learning rate")
    train.add_argument("--momentum", type=_finite_float, help="override the recipe's momentum (SGD)")
    train.add_argument("--lr-decay", type=_finite_float, help="override the recipe's per-epoch decay factor")
    train.add_argument("--batch-size", type=_positive_int, help="override the recipe's batch size")
    train.add_argument("--weight-decay", type=_finite_float, help="override the recipe's weight decay")
    train.add_argument("--k-decay", action="store_true", help="apply weight decay to k too (the paper's 'k decay')")
    train.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                       help="any model argument, VALUE parsed as JSON when it parses (e.g. gated=true, "
                            "widen_factor=10, dropout=0.3, shortcut=A); repeatable")
    train.add_argument("--amp", action="store_true", help="bf16 autocast for the training forward pass")
    train.add_argument("--channels-last", action="store_true", help="NHWC memory format (conv nets)")
    train.add_argument("--compile", action="store_true", help="train through torch.compile(model)")
    train.add_argument("--tensorboard", action="store_true",
                       help="also write TensorBoard event files into --out (needs: pip install 'throughway[tensorboard]')")
    train.add_argument("--eval-batch-size", type=_positive_int,
                       help="images per evaluation forward (default 10000; e.g. 1000 for WRN-28-10 on a GPU)")
    _add_common(train)

    reproduce = sub.add_parser("reproduce", help="reproduce a paper's table or figure")
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
        _add_common(exp)
        _add_format(exp)

    report = sub.add_parser("report", help="remake an experiment's table and figures from DIR/results.json, "
                                           "or (--readme) the README's generated blocks from results/")
    report.add_argument("dir", nargs="?", help="an experiment's output folder")
    report.add_argument("--readme", metavar="README", help="rewrite every <!-- generated:NAME --> block of this "
                                                           "file from the JSON under results/ beside it")
    report.add_argument("--results", metavar="DIR", help="with --readme: the results folder (default: results/ "
                                                         "beside the README)")
    report.add_argument("--check", action="store_true", help="with --readme: change nothing; exit 1 naming the "
                                                             "blocks that differ from what the results give")
    _add_format(report)

    analyze = sub.add_parser("analyze", help="what a finished run's gates learned (k, pruning, highway maps, lesioning)")
    analyze_sub = analyze.add_subparsers(dest="analysis", required=True)
    gates = analyze_sub.add_parser("gates", help="k per block, mean k, dead gates of a gated residual run "
                                                 "(gated-residual-v2 Table 2, figure 5 left)")
    prune = analyze_sub.add_parser("prune", help="remove residual blocks greedily by k or at random, test accuracy "
                                                 "after each removal (gated-residual-v2 figure 5 right)")
    prune.add_argument("--strategy", choices=["greedy", "random", "all"], default="all",
                       help="greedy: smallest k first (gated runs only); random: --orders random orders; "
                            "all (default): greedy where there is k, and random")
    prune.add_argument("--orders", type=_positive_int, default=10, help="random orders (default 10)")
    prune.add_argument("--seed", type=int, default=0, help="seed of the random orders")
    prune.add_argument("--compare", nargs="+", default=[], metavar="PRUNE_JSON",
                       help="other runs' prune.json (or analysis folders) to draw in the same figure")
    highway = analyze_sub.add_parser("highway", help="transform-gate maps of a highway run (highway paper figures 2, 3)")
    highway.add_argument("--classes", type=int, nargs="+", default=[0, 7], help="classes for figure 3 (default 0 7)")
    highway.add_argument("--sample", type=int, help="index of the training sample for figure 2 (default: random)")
    highway.add_argument("--seed", type=int, default=0, help="seed that picks the sample when --sample is not given")
    lesion = analyze_sub.add_parser("lesion", help="error with one layer's gates closed, per layer (highway paper figure 4)")
    lesion.add_argument("--split", choices=["train", "val", "test"], default="train",
                        help="split to evaluate (default train, as the paper)")
    for command in (gates, prune, highway, lesion):
        command.add_argument("run_dir", help="a finished run directory (results.json + model.safetensors)")
        command.add_argument("--out", help="output folder (default RUN_DIR/analysis)")
        command.add_argument("--checkpoint", action="store_true",
                             help="analyse the latest checkpoint of a run that has not finished (figures say "
                                  "'after epoch N')")
        _add_common(command)
        _add_format(command)
    redraw = analyze_sub.add_parser("redraw", help="redraw an analysis folder's figures from its JSON files")
    redraw.add_argument("dir", help="a folder written by `analyze ...` (e.g. RUN_DIR/analysis)")
    redraw.add_argument("--compare", nargs="+", default=[], metavar="PRUNE_JSON",
                        help="other runs' prune.json to draw instead of the ones stored in its prune.json")
    _add_format(redraw)

    sdi_cmd = sub.add_parser("sdi", help="squared distance to identity (SDI/TSDI) of layers at initialisation "
                                          "(gated-residual-v1 section 2)")
    sdi_cmd.add_argument("--layer", nargs="+", default=["all"],
                         choices=["all", "classical", "highway", "residual", "gated"], help="layer types (default all)")
    sdi_cmd.add_argument("--width", type=_positive_int, default=50, help="n: units, or channels of a conv layer")
    sdi_cmd.add_argument("--init", default="he_normal",
                         help="he_normal, he_uniform, glorot_uniform, glorot_normal, torch_default, or paper_he "
                              "(He weights and He-variance biases: the paper's convention)")
    sdi_cmd.add_argument("--gate-bias", type=float, default=-4.0, help="initial transform-gate bias of highway layers")
    sdi_cmd.add_argument("--target", type=float, default=-4.0, help="highway degeneration target c for b_t")
    sdi_cmd.add_argument("--k-init", type=float, default=1.0, help="initial k of gated layers")
    sdi_cmd.add_argument("--kernel-size", type=_positive_int, help="k for a k×k convolutional layer (default: dense)")
    sdi_cmd.add_argument("--mc", type=int, default=0, help="also estimate TSDI from N draws of the real initialisers")

    data = sub.add_parser("data", help="datasets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    fetch = data_sub.add_parser("fetch", help="fetch, verify and cache a dataset")
    fetch.add_argument("dataset", choices=["mnist", "fashion-mnist"])
    fetch.add_argument("--data-dir", help="cache folder")
    return parser


def _cmd_list() -> int:
    from .experiments import EXPERIMENTS
    from .models import list_models
    from .train import list_recipes

    rows = [(m.name, "model", m.description) for m in list_models()]
    rows += [(r.name, "recipe", r.source) for r in list_recipes()]
    rows += [(name, "experiment", module.DESCRIPTION) for name, module in EXPERIMENTS.items()]
    width = max(len(r[0]) for r in rows)
    for name, kind, description in rows:
        print(f"{name:<{width}}  {kind:<10}  {description}")
    return 0


# Model arguments that have their own option: giving them through --model-arg too is a conflict.
_DEDICATED_MODEL_OPTIONS = {"depth": "--depth", "width": "--width", "k_init": "--k-init",
                            "gate_bias": "--gate-bias", "activation": "--activation"}


def _parse_model_args(items: Sequence[str], given: Sequence[str] = ("depth",)) -> dict[str, Any]:
    """--model-arg KEY=VALUE pairs as a dict; VALUE is JSON when it parses, else the string.

    Raises ValueError for a malformed pair, a key given twice, a non-finite number, or a key whose own
    option (depth, width, k_init, gate_bias, activation) is among `given`, naming both."""
    import json

    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--model-arg {item!r}: expected KEY=VALUE, e.g. gated=true")
        if key in _DEDICATED_MODEL_OPTIONS and key in given:
            raise ValueError(f"--model-arg {item!r} conflicts with {_DEDICATED_MODEL_OPTIONS[key]}: give {key} "
                             f"once, with {_DEDICATED_MODEL_OPTIONS[key]}")
        if key in parsed:
            raise ValueError(f"--model-arg {key}= is given twice; give each model argument once")
        try:
            parsed[key] = json.loads(text)
        except json.JSONDecodeError:
            parsed[key] = text
        if isinstance(parsed[key], float) and not math.isfinite(parsed[key]):
            raise ValueError(f"--model-arg {item!r}: {key} must be a finite number")
    return parsed


def _check_recipe_options(args: argparse.Namespace) -> None:
    """--momentum / --lr-decay only where the recipe uses them: an error naming both otherwise."""
    from .train import get_recipe

    recipe = get_recipe(args.recipe)
    if args.momentum is not None and recipe.optimizer != "sgd":
        raise ValueError(f"--momentum with --recipe {recipe.name}: that recipe trains with {recipe.optimizer}, "
                         f"which has no momentum option; --momentum applies to SGD recipes (e.g. highway-mnist)")
    if args.lr_decay is not None and recipe.schedule != "exponential":
        raise ValueError(f"--lr-decay with --recipe {recipe.name}: its learning-rate schedule is {recipe.schedule!r}; "
                         f"--lr-decay applies to recipes with the exponential schedule (e.g. highway-mnist)")


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import RunConfig, run_training
    from .train.rundir import RunDir
    from .train.runner import check_config, check_device

    # Everything cheap is checked before the data is read or anything is written.
    check_device(args.device)
    if args.tensorboard:
        from .train.callbacks import require_tensorboard

        try:
            require_tensorboard()
        except ImportError as exc:
            raise ValueError(f"--tensorboard: {exc}") from None
    _check_recipe_options(args)
    model_kwargs: dict[str, Any] = {}
    for option, key in (("width", "width"), ("k_init", "k_init"), ("gate_bias", "gate_bias"),
                        ("activation", "activation")):
        value = getattr(args, option)
        if value is not None:
            model_kwargs[key] = value
    model_kwargs.update(_parse_model_args(args.model_arg, given=["depth", *model_kwargs]))
    overrides: dict[str, Any] = {}
    for option in ("lr", "momentum", "lr_decay", "batch_size", "weight_decay"):
        value = getattr(args, option)
        if value is not None:
            overrides[option] = value
    if args.k_decay:
        overrides["k_decay"] = True
    import dataclasses

    from .train import distributed

    config = RunConfig(model=args.model, depth=args.depth, dataset=args.dataset, recipe=args.recipe,
                       epochs=args.epochs, seed=args.seed, train_on_full=args.train_on_full, device=args.device,
                       limit=args.limit, data_dir=args.data_dir, model_kwargs=model_kwargs,
                       recipe_overrides=overrides, amp=args.amp, channels_last=args.channels_last,
                       compile=args.compile, eval_batch_size=args.eval_batch_size)
    out = Path(args.out or f"runs/{args.model}-d{args.depth}-s{args.seed}")
    check_config(config)
    RunDir(out).check_usable()
    device = distributed.init_from_env(args.device)  # torchrun: one process per device
    config = dataclasses.replace(config, device=device)
    main_process = distributed.is_main_process()
    try:
        results = run_training(config, out, resume=args.resume, progress=not args.quiet, tensorboard=args.tensorboard)
    finally:
        distributed.cleanup()
    if not main_process or results.get("final") is None:
        return 0
    final = results["final"]
    line = f"{out}: test error {final['test_error_pct']:.2f}% after {final.get('epochs_completed')} epochs" \
        if final.get("test_error_pct") is not None else f"{out}: no epoch finished"
    if final.get("diverged"):
        line += " (diverged)"
    if final.get("k_mean") is not None:
        line += f", mean k {final['k_mean']:.3f}"
    print(line)
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .experiments import get_experiment
    from .study.options import config_from_args

    module = get_experiment(args.experiment)
    if hasattr(module, "config_from_args"):
        config = module.config_from_args(args)
    else:
        config = config_from_args(module.Config, args, device=args.device, data_dir=args.data_dir)
    out = Path(args.out or (f"runs/{module.NAME}-quick" if getattr(args, "quick", False) else f"runs/{module.NAME}"))
    jobs = args.jobs or (1 if args.device != "cpu" else max(1, os.cpu_count() or 1))
    if getattr(args, "estimate", False):  # project the study's duration, train nothing
        print(module.estimate_text(config, jobs))
        return 0
    module.run(config, out, resume=args.resume, jobs=jobs, progress=not args.quiet)
    print((out / "table.md").read_text())
    print(f"results: {out / 'results.json'}; table: {out / 'table.md'}; figures in {out}/")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from ._io import read_json_object
    from .experiments import get_experiment

    if args.readme is not None:
        from .readme import update_readme

        if args.dir is not None:
            raise ValueError("report: give either DIR or --readme README, not both")
        names = update_readme(args.readme, args.results, check=args.check)
        if args.check:
            if names:
                print(f"{args.readme}: generated blocks differ from the results files: {', '.join(names)}; "
                      f"run `throughway report --readme {args.readme}`")
                return 1
            print(f"{args.readme}: every generated block matches the results files")
            return 0
        print(f"{args.readme}: rewrote {len(names)} block(s)" + (f": {', '.join(names)}" if names else ""))
        return 0
    if args.dir is None:
        raise ValueError("report: give an experiment's output folder DIR, or --readme README")
    path = Path(args.dir) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; `report` needs an experiment's output folder")
    name = read_json_object(path, "an experiment's summary").get("experiment")
    if name is None:
        raise ValueError(f"{path}: not an experiment summary (no 'experiment' field); is it a single run?")
    print(get_experiment(name).write_report(args.dir))
    return 0


def _cmd_sdi(args: argparse.Namespace) -> int:
    from .analysis.sdi import LAYERS, monte_carlo_sdi, sdi

    layers = list(LAYERS) if "all" in args.layer else args.layer
    rows = []  # computed before anything is printed, so bad input gives an error and no half table
    for layer in layers:
        result = sdi(layer, args.width, args.init, kernel_size=args.kernel_size, target=args.target,
                     gate_bias=args.gate_bias, k_init=args.k_init)
        row = (f"| {layer} | {args.init if layer != 'gated' else f'k = {args.k_init:g}'} | {args.width} | "
               f"{args.kernel_size or '—'} | {result.m_diagonal():.6g} | {result.m_off_diagonal():.6g} | "
               f"{result.b_value():.6g} | {result.tsdi:.6g} |")
        if args.mc:
            if args.init == "paper_he":
                row += " — (paper_he is not a toolkit initialiser) |"
            else:
                mc = monte_carlo_sdi(layer, args.width, args.init, samples=args.mc, kernel_size=args.kernel_size,
                                     target=args.target, gate_bias=args.gate_bias, k_init=args.k_init)
                row += f" {mc['tsdi']:.6g} ± {mc['tsdi_stderr']:.2g} |"
        rows.append(row)
    header = "| layer | init | n | kernel | M (identity position) | M (other) | B | TSDI |" + (" Monte Carlo ± s.e. |" if args.mc else "")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    print("\n".join(rows))
    if "highway" in layers:
        print(f"\nhighway: transform gate W_t, b_t (initial b_t = {args.gate_bias:g}), target W_t = 0, b_t = c = {args.target:g}")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from .data import load_arrays

    arrays = load_arrays(args.dataset, args.data_dir)
    print(f"{args.dataset}: train {len(arrays.train_y)}, validation {len(arrays.val_y)}, test {len(arrays.test_y)} "
          f"(verified and cached)")
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from .study import analyze

    if args.analysis == "redraw":
        for path in analyze.redraw(args.dir, compare=args.compare):
            print(path)
        return 0
    common = {"device": args.device, "checkpoint": args.checkpoint}
    if args.analysis == "gates":
        _, text = analyze.analyze_gates(args.run_dir, args.out, **common)
    elif args.analysis == "prune":
        _, text = analyze.analyze_prune(args.run_dir, args.out, strategy=args.strategy, orders=args.orders,
                                        seed=args.seed, compare=args.compare, data_dir=args.data_dir,
                                        progress=not args.quiet, **common)
    elif args.analysis == "highway":
        _, text = analyze.analyze_highway(args.run_dir, args.out, classes=args.classes, sample=args.sample,
                                          seed=args.seed, data_dir=args.data_dir, **common)
    else:
        _, text = analyze.analyze_lesion(args.run_dir, args.out, split=args.split, data_dir=args.data_dir,
                                         progress=not args.quiet, **common)
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `throughway` console script; returns the exit status."""
    from .report.figures import figure_format

    parser = build_parser()
    args = parser.parse_args(argv)
    with figure_format(getattr(args, "format", "png")):  # `--format` of the commands that draw
        return _run(parser, args)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        if getattr(args, "device", None) is not None and args.command != "train":
            from .train.runner import check_device

            check_device(args.device)
        if args.command == "list":
            return _cmd_list()
        if args.command == "train":
            return _cmd_train(args)
        if args.command == "reproduce":
            return _cmd_reproduce(args)
        if args.command == "report":
            return _cmd_report(args)
        if args.command == "data":
            return _cmd_data(args)
        if args.command == "sdi":
            return _cmd_sdi(args)
        if args.command == "analyze":
            return _cmd_analyze(args)
    except KeyboardInterrupt:
        print("interrupted: finished epochs are checkpointed; rerun with --resume to continue", file=sys.stderr)
        return 130
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as exc:
        # Bad input (options, files, JSON), a held lock, a full disk: a message naming the option or the
        # file, and exit 2. OSError covers FileNotFoundError, NotADirectoryError and _io.WriteError.
        if isinstance(exc, KeyError) and exc.args:
            message = exc.args[0]
        elif isinstance(exc, OSError) and exc.filename is None and len(exc.args) == 2:
            message = exc.args[1]  # WriteError: its message already names the file
        else:
            message = str(exc)
        print(f"throughway: error: {message}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
