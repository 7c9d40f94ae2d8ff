"""What each `throughway` sub-command does once its options are parsed: one `_cmd_<command>(args)`
per command, returning the exit status (the dispatch and the error handling are in throughway.cli)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

def cmd_list() -> int:
    from ..experiments import EXPERIMENTS
    from ..models import list_models
    from ..train import list_recipes

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



def _check_dataset_source(dataset: str, data_dir: str | None) -> None:
    """A dataset that cannot be downloaded (CIFAR) needs --data-dir holding its files: checked before the
    run folder is created, so that a refused run leaves no empty folder behind."""
    from ..data.cifar import CIFAR_LAYOUT, missing_cifar_files
    from ..data.sources import load_arrays

    if dataset not in CIFAR_LAYOUT:
        return
    if data_dir is None:
        load_arrays(dataset, None)  # raises its ValueError naming --data-dir
    missing = missing_cifar_files(dataset, str(data_dir))
    if missing:
        raise FileNotFoundError(f"--data-dir {data_dir}: {missing[0]} is missing ({len(missing)} file(s) of "
                                f"--dataset {dataset}); accepted: the folder holding the official CIFAR python "
                                f"batches; nothing was written")


def _remove_if_only_lock(out: Path) -> None:
    """Remove `out`, created by this command, when it holds nothing but the lock's own empty file."""
    import contextlib

    from ..train.rundir import LOCK_TARGET

    with contextlib.suppress(OSError):
        if [p.name for p in out.iterdir()] == [LOCK_TARGET]:
            (out / LOCK_TARGET).unlink()
        out.rmdir()  # only succeeds when empty


def cmd_train(args: argparse.Namespace) -> int:
    """One run: the arguments become a RunConfig, which `run_training` checks once (`check_config`: the
    device, the recipe and its overrides, the model) with the run folder (`RunDir.check_usable`) before
    it reads or writes anything. Checked here is only what the command line itself can get wrong: an
    empty --out, --model-arg's syntax and its conflicts with the dedicated options, a CIFAR --data-dir
    without its files, --tensorboard without its package."""
    import dataclasses

    from ..train import RunConfig, distributed, run_training
    from ..train.recipes import FULL_TRAINING_SET

    if args.out is not None and not args.out.strip():
        raise ValueError(f"--out {args.out!r}: an empty path; accepted: a folder for the run (leave --out out "
                         f"for the default runs/MODEL-dDEPTH-sSEED)")
    _check_dataset_source(args.dataset, args.data_dir)
    if args.tensorboard:
        from ..train.callbacks import require_tensorboard

        try:
            require_tensorboard()
        except ImportError as exc:
            raise ValueError(f"--tensorboard: {exc}") from None
    model_kwargs: dict[str, Any] = {}
    for option, key in (("width", "width"), ("k_init", "k_init"), ("gate_bias", "gate_bias"),
                        ("activation", "activation")):
        value = getattr(args, option)
        if value is not None:
            model_kwargs[key] = value
    model_kwargs.update(_parse_model_args(args.model_arg, given=["depth", *model_kwargs]))
    overrides: dict[str, Any] = {}
    for option in ("lr", "momentum", "lr_decay", "batch_size", "weight_decay", "augment", "normalize"):
        value = getattr(args, option)
        if value is not None:
            overrides[option] = value
    if args.k_decay:
        overrides["k_decay"] = True
    # The recipes whose authors trained on every training image do so unless told otherwise.
    train_on_full = args.train_on_full if args.train_on_full is not None else args.recipe in FULL_TRAINING_SET

    config = RunConfig(model=args.model, depth=args.depth, dataset=args.dataset, recipe=args.recipe,
                       epochs=args.epochs, seed=args.seed, train_on_full=train_on_full, device=args.device,
                       limit=args.limit, data_dir=args.data_dir, model_kwargs=model_kwargs,
                       recipe_overrides=overrides, amp=args.amp, channels_last=args.channels_last,
                       compile=args.compile, eval_batch_size=args.eval_batch_size)
    out = Path(args.out if args.out is not None else f"runs/{args.model}-d{args.depth}-s{args.seed}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun (what init_from_env reads): one process per device
        from ..train.config import check_device

        check_device(args.device)  # setting this rank's device needs a real one ("cuda" on a CPU torch: exit 2)
        config = dataclasses.replace(config, device=distributed.init_from_env(args.device))
    main_process = distributed.is_main_process()
    created = not out.exists()
    try:
        results = run_training(config, out, resume=args.resume, progress=not args.quiet, tensorboard=args.tensorboard)
    except BaseException:
        if created and main_process:
            _remove_if_only_lock(out)  # a run refused before it wrote anything leaves no folder
        raise
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



def cmd_reproduce(args: argparse.Namespace) -> int:
    from ..experiments import get_experiment
    from ..study.options import config_from_args

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
    if hasattr(module, "specs"):  # every run's config, before anything is read or written
        from ..study.spec import check_specs

        check_specs(module.specs(config))
    from ..study.shards import study_lock

    # one unsharded process per study folder (two would train the same runs and overwrite each other's
    # summary); shards side by side (study.shards)
    with study_lock(out, getattr(config, "shard", None), getattr(config, "merge", False)):
        # The study's files are checked as they are read (the summary, each run's results.json): an exception
        # that no check raised is a bug of the study's code, shown with its traceback (cli.errors), never
        # blamed on the files.
        summary = module.run(config, out, resume=args.resume, jobs=jobs, progress=not args.quiet)
    print((out / "table.md").read_text())
    print(f"results: {out / 'results.json'}; table: {out / 'table.md'}; figures in {out}/")
    errors = summary.get("errors") if isinstance(summary, dict) else None
    if errors:
        # The other runs went on (one failure does not stop a study); the exit status says it failed.
        name, message = next(iter(errors.items()))
        print(f"throughway: error: {len(errors)} run(s) of the study failed, e.g. {name}: {message} (all in "
              f"{out / 'results.json'}, field 'errors'); fix the cause and rerun with --resume", file=sys.stderr)
        return 2
    return 0



def cmd_report(args: argparse.Namespace) -> int:
    """Remake a study's table and figures from DIR/results.json. Before anything is read or written: no
    link is followed (DIR, its summary, its runs folder, a run folder: `study.folders.check_study_links`),
    the summary's config is checked against the study's option bounds (`study.options.check_stored_config`:
    a hand-edited `seeds` of 10**7 is refused at once), and each run folder under DIR/runs must hold the run
    its name stands for in that config (`study.folders.check_run_folders`)."""
    from .._io import read_json_object
    from ..experiments import get_experiment
    from ..study.folders import check_study_links

    path = Path(args.dir) / "results.json"
    check_study_links(args.dir)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; `report` needs an experiment's output folder")
    summary = read_json_object(path, "an experiment's summary")
    name = summary.get("experiment")
    if name is None:
        if "history" in summary or "final" in summary:  # what `train` writes: one run, not a study
            raise ValueError(f"{path}: a single run's results, not an experiment summary; `report` remakes a "
                             f"study's table and figures. For one run use `throughway analyze gates {args.dir}` "
                             f"(k per block; or prune, lesion, highway)")
        raise ValueError(f"{path}: not an experiment summary (no 'experiment' field); is it a single run?")
    module = get_experiment(name)
    _check_study_summary(module, summary, path)
    try:
        text = module.write_report(args.dir)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        # results.json is untrusted input too: a field of the wrong type is the file's fault, said as such
        # (a ValueError too, unless it names the file already: "invalid literal for int()" does not).
        if isinstance(exc, ValueError) and str(path) in str(exc):
            raise
        raise ValueError(f"{path}: does not hold a {name} summary as the study writes it ({_what(exc)}); the file was "
                         f"edited or damaged; rerun the study with --resume to rewrite it") from exc
    print(text)
    return 0


def _check_study_summary(module: Any, summary: dict[str, Any], path: Path) -> None:
    """A study summary's config within the study's option bounds, and each of its run folders (`path`'s
    folder's runs/) holding the run its name stands for (see `cmd_report`)."""
    from ..study.folders import check_run_folders
    from ..study.options import check_stored_config, config_from_json

    config_cls = getattr(module, "Config", None)
    if config_cls is None or "config" not in summary:
        return
    check_stored_config(config_cls, summary["config"], path)
    runs = path.parent / "runs"
    if not hasattr(module, "specs") or not runs.is_dir():
        return
    try:
        config = config_from_json(config_cls, summary["config"])
        specs = module.specs(config)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"{path}: field 'config' does not describe a {module.NAME} study ({_what(exc)}); the file "
                         f"was edited or damaged") from exc
    check_run_folders(runs, specs)


def _what(exc: BaseException) -> str:
    """An exception raised while reading a JSON file's fields, in a few words (a KeyError is a missing field)."""
    if isinstance(exc, KeyError):
        return f"field {exc.args[0]!r} missing" if exc.args else "a field is missing"
    return f"{type(exc).__name__}: {str(exc)[:200]}"



def cmd_sdi(args: argparse.Namespace) -> int:
    from ..analysis.sdi import LAYERS, monte_carlo_sdi, sdi

    layers = list(LAYERS) if "all" in args.layer else args.layer
    rows = []  # computed before anything is printed, so bad input gives an error and no half table
    for layer in layers:
        result = sdi(layer, args.width, args.init, kernel_size=args.kernel_size, target=args.target,
                     gate_bias=args.gate_bias, k_init=args.k_init)
        row = (f"| {layer} | {args.init if layer != 'gated' else f'k = {args.k_init:g}'} | {args.width} | "
               f"{args.kernel_size or '—'} | {result.m_diagonal():.6g} | {result.m_off_diagonal():.6g} | "
               f"{result.b_value():.6g} | {result.tsdi:.6g} |")
        if args.mc_samples:
            if args.init == "paper_he":
                row += " — (paper_he is not a toolkit initialiser) |"
            else:
                mc = monte_carlo_sdi(layer, args.width, args.init, samples=args.mc_samples, kernel_size=args.kernel_size,
                                     target=args.target, gate_bias=args.gate_bias, k_init=args.k_init)
                row += f" {mc['tsdi']:.6g} ± {mc['tsdi_stderr']:.2g} |"
        rows.append(row)
    header = "| layer | init | n | kernel | M (identity position) | M (other) | B | TSDI |" + (" Monte Carlo ± s.e. |" if args.mc_samples else "")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    print("\n".join(rows))
    if "highway" in layers:
        print(f"\nhighway: transform gate W_t, b_t (initial b_t = {args.gate_bias:g}), target W_t = 0, b_t = c = {args.target:g}")
    return 0



def cmd_data(args: argparse.Namespace) -> int:
    from ..data import load_arrays

    arrays = load_arrays(args.dataset, args.data_dir)
    print(f"{args.dataset}: train {len(arrays.train_y)}, validation {len(arrays.val_y)}, test {len(arrays.test_y)} "
          f"(verified and cached)")
    return 0



def cmd_analyze(args: argparse.Namespace) -> int:
    from .. import analyze_runs

    if args.analysis == "redraw":
        try:
            paths = analyze_runs.redraw(args.dir, compare=args.compare)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
            if isinstance(exc, ValueError) and str(args.dir) in str(exc):
                raise  # already names the file (read_json's "not valid JSON", say)
            # The analysis folder's JSON files are untrusted input: a wrong field is the files' fault.
            raise ValueError(f"{args.dir}: its analysis JSON files (or --compare's) do not hold what `analyze` writes "
                             f"({_what(exc)}); they were edited or damaged; rerun the analysis to rewrite them") from exc
        for path in paths:
            print(path)
        return 0
    if args.analysis == "bn-stats":
        if args.batch_size < 2:
            raise ValueError(f"--batch-size {args.batch_size}: must be at least 2 (BatchNorm needs a batch variance)")
        _, text = analyze_runs.analyze_bn_stats(args.run_dirs, args.out, batch_size=args.batch_size, seed=args.seed,
                                   device=args.device, data_dir=args.data_dir)
        print(text)
        return 0
    common = {"device": args.device, "checkpoint": args.checkpoint}
    if args.analysis == "gates":
        _, text = analyze_runs.analyze_gates(args.run_dir, args.out, **common)
    elif args.analysis == "prune":
        _, text = analyze_runs.analyze_prune(args.run_dir, args.out, strategy=args.strategy, orders=args.orders,
                                        seed=args.seed, compare=args.compare, data_dir=args.data_dir,
                                        progress=not args.quiet, **common)
    elif args.analysis == "highway":
        _, text = analyze_runs.analyze_highway(args.run_dir, args.out, classes=args.classes, sample=args.sample,
                                          seed=args.seed, data_dir=args.data_dir, **common)
    else:
        _, text = analyze_runs.analyze_lesion(args.run_dir, args.out, split=args.split, data_dir=args.data_dir,
                                         progress=not args.quiet, **common)
    print(text)
    return 0
