"""gated-residual-v2 Table 3 and Table 4 (and v1 Table 4): ResNets and Wide ResNets on CIFAR,
original against gated against gated with "k decay".

Architectures (gated-residual-v2 §3.2):
* resnet-5: pre-activation ResNet n = 5 (depth 32), recipe preact-cifar (SGD Nesterov 0.9, lr 0.1
  ÷10 at 50% / 75%, wd 1e-4, mean subtraction, pad-4 crops and flips, batch 128);
* wrn-4-10: WRN-28-10 with dropout 0.3, recipe wrn-cifar (lr 0.1 ×0.2 at 30/60/80%, wd 5e-4,
  mean/std normalisation);
* wrn-3-4: WRN-22-4 (gated-residual-v1 Table 4's "Wide ResNet (3,4)"), recipe wrn-cifar.
Variants: original (ungated), gated (one k per block, k = 1 at start, no decay on k), gated with
k decay (the recipe's weight decay applied to k too).

CIFAR cannot be downloaded by this toolkit: `--data-dir` must name the folder holding the official
python batches (cifar-10-batches-py/ or cifar-100-python/, or their files). The validation split
(the last 5,000 training images) is held out of training; the test error is read at the last
epoch, never used to choose anything.

Writes in the output folder: runs/<arch>-<variant>-s<seed>/ (one run directory each),
results.json (summary), table.md, figure6_error_curves.png, figure7_k_by_block.png.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..data.sources import missing_cifar_files
from ..report.stats import format_mean_std, mean_std
from ..report.tables import table_header, table_row
from ..study.options import MAX_SEEDS, StudyOptions, option
from ..study.options import config_from_args as study_config_from_args
from ..study.runner import Study
from ..study.spec import RunSpec
from ..study.summary import read_runs, remake_report
from ..train import RunConfig

__all__ = ["NAME", "DESCRIPTION", "Config", "ARCHITECTURES", "VARIANTS", "PAPER", "specs", "run", "summarize",
           "write_report", "STUDY", "config_from_args", "needs_data_message"]

NAME = "cifar-gated"
DESCRIPTION = "gated-residual-v2 Tables 3 and 4: ResNet n=5 and Wide ResNet (4,10) on CIFAR, original / gated / gated with k decay"

# arch -> (model, model kwargs, recipe)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any], str]] = {
    "resnet-5": ("preact_resnet", {"depth": 32, "shortcut": "B"}, "preact-cifar"),
    "wrn-4-10": ("wide_resnet", {"depth": 28, "widen_factor": 10, "dropout": 0.3}, "wrn-cifar"),
    "wrn-3-4": ("wide_resnet", {"depth": 22, "widen_factor": 4, "dropout": 0.3}, "wrn-cifar"),
}
VARIANTS: dict[str, dict[str, Any]] = {
    "original": {"gated": False, "k_decay": False},
    "gated": {"gated": True, "k_decay": False},
    "gated-k-decay": {"gated": True, "k_decay": True},
}
# Test error (%). gated-residual-v2 Table 3 (CIFAR-10) and Table 4 (CIFAR-100, WRN (4,10): the
# original is Zagoruyko & Komodakis' 18.85, the gated one the paper's 18.27); gated-residual-v1
# Table 4 for wrn-3-4 (a different recipe: lr ÷10 at 40% / 60%, no dropout stated).
PAPER: dict[str, dict[str, dict[str, float]]] = {
    "cifar10": {
        "resnet-5": {"original": 7.16, "gated": 6.67, "gated-k-decay": 7.04},
        "wrn-4-10": {"original": 3.89, "gated": 3.65, "gated-k-decay": 3.74},
        "wrn-3-4": {"original": 5.36, "gated": 4.90},
    },
    "cifar100": {"wrn-4-10": {"original": 18.85, "gated": 18.27}},
}

PAPER_SOURCE: dict[str, dict[str, str]] = {
    "cifar10": {"resnet-5": "gated-residual-v2 Table 3", "wrn-4-10": "gated-residual-v2 Table 3",
                "wrn-3-4": "gated-residual-v1 Table 4, its own recipe"},
    "cifar100": {"wrn-4-10": "gated-residual-v2 Table 4; original: Zagoruyko & Komodakis"},
}


@dataclass(frozen=True)
class Config(StudyOptions):
    """The comparison's settings; defaults are the paper's CIFAR-10 Table 3."""

    dataset: str = option("cifar10", "cifar10 (Table 3) or cifar100 (Table 4: wrn-4-10, original and gated, "
                                     "unless --archs / --variants say otherwise)", choices=tuple(sorted(PAPER)))
    archs: tuple[str, ...] = option(("resnet-5", "wrn-4-10"), "models", quick=("resnet-5",), choices=tuple(ARCHITECTURES))
    variants: tuple[str, ...] = option(("original", "gated", "gated-k-decay"), "variants", choices=tuple(VARIANTS))
    epochs: int | None = option(None, "epochs per run (None: the recipe's 200)", quick=2, minimum=1)
    seeds: int = option(1, "seeds per configuration", minimum=1, maximum=MAX_SEEDS)
    limit: int | None = option(None, "keep only the first N images of each split (smoke tests)", quick=1000,
                                 minimum=1)
    amp: bool = option(False, "bf16 autocast (GPU)")
    channels_last: bool = option(False, "NHWC memory format")
    compile: bool = option(False, "torch.compile the training forward")
    # Evaluation in chunks of 1,000 images: for WRN-28-10, one 160-channel 32×32 feature map of 10,000
    # images is 6.5 GB in float32, and a block holds several at once.
    eval_batch_size: int = 1000

    def check(self) -> None:
        if self.eval_batch_size < 1:
            raise ValueError(f"eval_batch_size={self.eval_batch_size}: must be ≥ 1")


def run_name(arch: str, variant: str, seed: int) -> str:
    """The folder name of one run of the comparison."""
    return f"{arch}-{variant}-s{seed}"


def specs(config: Config) -> list[RunSpec]:
    """One RunSpec per (arch, variant, seed)."""
    out = []
    for arch in config.archs:
        model, kwargs, recipe = ARCHITECTURES[arch]
        kwargs = dict(kwargs)
        depth = kwargs.pop("depth")
        for variant in config.variants:
            v = VARIANTS[variant]
            for seed in range(config.seeds):
                out.append(RunSpec(run_name(arch, variant, seed), RunConfig(
                    model=model, depth=depth, dataset=config.dataset, recipe=recipe, epochs=config.epochs, seed=seed,
                    device=config.device, limit=config.limit, data_dir=config.data_dir,
                    model_kwargs={**kwargs, "gated": v["gated"]},
                    recipe_overrides={"k_decay": True} if v["k_decay"] else {},
                    amp=config.amp, channels_last=config.channels_last, compile=config.compile,
                    eval_batch_size=config.eval_batch_size,
                )))
    return out


def summarize(config: Config, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Collect every run's results.json under `out`/runs into the summary (finished or not)."""
    out = Path(out)
    cells, curves = [], {}
    for arch in config.archs:
        for variant in config.variants:
            errors, states = [], []
            for name, result in read_runs(out / "runs", [run_name(arch, variant, s) for s in range(config.seeds)]):
                if result is None:
                    states.append({"run": name, "state": "not started", "epochs": 0})
                    continue
                curves[name] = {"history": result["history"]}
                final = result.get("final")
                states.append({"run": name, "state": "finished" if final else "running",
                               "epochs": len(result["history"]), "parameters": result["model"]["parameters"]})
                if final:
                    errors.append(final["test_error_pct"])
            cells.append({"arch": arch, "variant": variant, "test_error_pct": mean_std(errors), "runs": states,
                          "paper_test_error_pct": PAPER[config.dataset].get(arch, {}).get(variant)})
    return {"experiment": NAME, "config": asdict(config), "cells": cells, "curves": curves}


def table_markdown(summary: dict[str, Any]) -> str:
    """Paper's test error beside ours, one row per architecture, one column pair per variant."""
    config = summary["config"]
    by = {(c["arch"], c["variant"]): c for c in summary["cells"]}
    header = ["model"] + [f"{v} ({who})" for v in config["variants"] for who in ("paper", "ours")]
    table = "Table 3" if config["dataset"] == "cifar10" else "Table 4"
    lines = [f"Test error (%) on {config['dataset']} — gated-residual-v2 {table} (paper) beside ours", "",
             *table_header(header)]
    for arch in config["archs"]:
        row = [arch]
        for variant in config["variants"]:
            cell = by[(arch, variant)]
            paper = cell["paper_test_error_pct"]
            row.append(f"{paper:.2f}" if paper is not None else "—")
            stat = cell["test_error_pct"]
            if stat["mean"] is not None:
                row.append(format_mean_std(stat))
            else:
                run = cell["runs"][0]
                row.append("not run" if run["state"] == "not started" else f"(running, epoch {run['epochs']})")
        lines.append(table_row(row))
    notes = [f"Epochs: {config['epochs'] or 'the recipe’s (200)'}; {config['seeds']} seed(s); trained on 45,000 "
             f"images (5,000 held out for validation; the paper trained on 50,000); test error at the last epoch."]
    if "wrn-3-4" in config["archs"]:
        notes.append("wrn-3-4's paper numbers are gated-residual-v1 Table 4 (lr ÷10 at 40% / 60%, 100 epochs); "
                     "ours follow the wrn-cifar recipe.")
    if config.get("limit"):
        notes.append(f"Only the first {config['limit']} images of each split: a smoke run, not a reproduction.")
    return "\n".join(lines + [""] + notes) + "\n"


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md and the figures from `out`/results.json alone; return the table text."""
    from ..report.conv_plots import plot_error_curves, plot_k_by_block

    def errors(summary: dict[str, Any], path: Path) -> None:
        plot_error_curves(summary["curves"], path,
                          f"{summary['config']['dataset']}: training and test error (gated-residual-v2 fig. 6)")

    def ks(summary: dict[str, Any], path: Path) -> None:
        plot_k_by_block(summary["curves"], path,
                        f"{summary['config']['dataset']}: final k by block (gated-residual-v2 fig. 7)")

    return remake_report(out, table_markdown, [(errors, "figure6_error_curves.png"), (ks, "figure7_k_by_block.png")])


# What the study machinery needs of the study (study.runner): one run per worker process.
STUDY = Study(NAME, Config, specs, summarize, write_report, stacked=False)


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Train every run into `out`/runs (resumable), then write the summary, table and figures
    (study.runner.run_study), once the CIFAR files are found in `config.data_dir`."""
    if config.data_dir is None:
        raise ValueError(needs_data_message(config.dataset))
    missing = missing_cifar_files(config.dataset, config.data_dir)
    if missing:
        raise FileNotFoundError(f"{config.data_dir} lacks {', '.join(str(m) for m in missing)}. "
                                + needs_data_message(config.dataset))
    return STUDY.run(config, out, resume=resume, jobs=jobs, progress=progress)


_NEEDS_DATA = ("cifar-gated needs CIFAR: pass --data-dir DIR, where DIR holds the official python version "
               "(cifar-10-batches-py/ with data_batch_1..5 and test_batch for CIFAR-10, or cifar-100-python/ "
               "with train and test for CIFAR-100, from https://www.cs.toronto.edu/~kriz/cifar.html). "
               "The toolkit does not download CIFAR. A GPU is advised: --device cuda --amp --channels-last.")


def needs_data_message(dataset: str = "cifar10") -> str:
    """What the study needs, followed by the paper's numbers that it would put its own beside."""
    lines = [_NEEDS_DATA, f"The paper's test error (%) on {dataset} that the study reproduces:"]
    for arch, cells in PAPER[dataset].items():
        model, kwargs, recipe = ARCHITECTURES[arch]
        shape = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        values = ", ".join(f"{variant} {error:.2f}" for variant, error in cells.items())
        lines.append(f"  {arch} ({model} {shape}; recipe {recipe}): {values} [{PAPER_SOURCE[dataset][arch]}]")
    return "\n".join(lines)


def config_from_args(args: argparse.Namespace) -> Config:
    """Build the Config from parsed options (CIFAR-100 defaults to Table 4's models); without
    --data-dir, say what is needed."""
    if not args.data_dir:
        raise ValueError(needs_data_message(args.dataset or "cifar10"))
    base = Config(archs=("wrn-4-10",), variants=("original", "gated")) if args.dataset == "cifar100" else Config()
    return study_config_from_args(Config, args, base=base, device=args.device, data_dir=args.data_dir)
