"""The MNIST depth study: gated-residual-v2 Table 1 (test error) and Table 2 (mean k), figure 4.

Plain, residual and gated residual fully connected nets (width 50) with d ∈ {2, 10, 20, 50, 100}
middle layers, trained with the `gresnet-mnist` recipe (Nadam, lr 0.002, batch 128, 100 epochs).
A highway net of the same shape (tanh H, transform-gate bias −2, the settings of the highway
paper's figure 2 MNIST net) trains beside them with the same recipe: it is not in the paper's table.

Writes, in the output folder: runs/<arch>-d<d>-s<seed>/ (one run directory each), results.json
(the summary that tables and figures are made from), table.md, findings.md, figure4_train_loss.png,
table1_test_error_by_depth.png, figure5_k_by_block.png and best_epoch.md (Table 1 under each epoch
selection, from the runs' histories). The tables and findings are made in experiments.mnist_depth_report
(re-exported here).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._io import atomic_write_text
from ..models import STEMS
from ..report.stats import LAST_EPOCHS, last_epochs_mean, mean_std
from ..study.folders import read_summary
from ..study.options import MAX_SEEDS, StudyOptions, check_residual_depths, option, quick_config
from ..study.papers import PAPER_MEAN_K, PAPER_TEST_ERROR
from ..study.runner import Study
from ..study.spec import RunSpec
from ..study.stacking import add_estimate_options, depth_study_markdown, project_batches
from ..study.summary import REFRESH_INTERVAL_S, StudySummary, read_runs, remake_report, run_status
from ..train import RESULTS_FILE, RunConfig
from .mnist_depth_report import (batchnorm_ablation_markdown, differences_from_paper, findings_markdown,
                                 paired_comparisons, selection_report_markdown, stem_ablation_markdown, table_markdown)

__all__ = ["Config", "QUICK", "ARCHITECTURES", "PAPER_TEST_ERROR", "PAPER_MEAN_K", "specs", "run", "summarize",
           "write_report", "STUDY", "NAME", "estimate", "estimate_text", "paired_comparisons", "findings_markdown", "middle_minus_ends", "table_markdown", "stem_ablation_markdown",
           "batchnorm_ablation_markdown", "LAST_EPOCHS",
           "differences_from_paper"]

NAME = "mnist-depth"
DESCRIPTION = "gated-residual-v2 Table 1 and 2, figure 4: plain / residual / gated (and highway) MLPs on MNIST, d = 2..100"

# arch -> (registered model, model kwargs)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("mlp_plain", {}),
    "residual": ("mlp_residual", {}),
    "gated": ("mlp_gated_residual", {}),
    "highway": ("mlp_highway", {"activation": "tanh", "gate_bias": -2.0}),
}

# gated-residual-v2 Table 1 (test error, %) and Table 2 (mean k): study.papers.


# BatchNorm constants (model arguments, PyTorch's convention) of the study's `batchnorm` option. "torch"
# adds none, so those runs keep the model's defaults and their recorded configs stay as they were.
BATCHNORM_CONSTANTS: dict[str, dict[str, float]] = {"torch": {}, "keras": {"bn_momentum": 0.01, "bn_eps": 1e-3}}


@dataclass(frozen=True)
class Config(StudyOptions):
    """The study's settings; the defaults are the paper's (except `train_on_full`, see docs/reproductions/mnist-depth.md)."""

    depths: tuple[int, ...] = option((2, 10, 20, 50, 100), "values of d, the middle layers (paper: 2 10 20 50 100)",
                                     minimum=0, check=check_residual_depths)
    archs: tuple[str, ...] = option(("plain", "residual", "gated", "highway"), "architectures to train",
                                    choices=tuple(ARCHITECTURES))
    epochs: int = option(100, "epochs per run (paper: 100)", quick=2, minimum=1)
    # 2 seeds under --quick: the fewest that give a spread and a paired test.
    seeds: int = option(5, "seeds per configuration: mean ± std, best, and the paired gated − residual test",
                        quick=2, minimum=1, maximum=MAX_SEEDS)
    recipe: str = option("gresnet-mnist", "training recipe (paper: Nadam, lr 0.002, batch 128)", cli=False)
    stem: str = option("linear", "first layer of the plain/residual/gated nets: linear (a single Dot, the paper's) "
                                 "or dense (Dot-BN-ReLU, the stem ablation)", choices=STEMS)
    batchnorm: str = option("torch", "BatchNorm constants of the plain/residual/gated nets: torch (PyTorch's momentum "
                                     "0.1, eps 1e-5; ours, the paper states none) or keras (Keras's defaults, momentum "
                                     "0.99 = PyTorch's 0.01, eps 1e-3: the framework of the paper's code)",
                            choices=tuple(BATCHNORM_CONSTANTS))
    train_on_full: bool = option(False, "train on all 60,000 images as the paper did (default: 50,000, 10,000 "
                                        "held out)")
    width: int = option(50, "units per layer (paper: 50)", minimum=1)
    limit: int | None = option(None, "keep only the first N samples of each split (smoke tests)", minimum=1)
    compile: bool | None = option(None, "torch.compile each batch's training step; default: only the batches that "
                                        "train at least 10,000 steps (the full study: about 100 s of compilation "
                                        "per batch for a measured 1.5x faster step; not bitwise equal to eager)",
                                  quick=False)
    quick: bool = option(False, "made by --quick", quick=True, cli=False)


# What --quick runs (the fields' quick values): every depth and architecture for 2 epochs and 2
# seeds, so that the whole main job fits in 10 minutes on 2 cores; the README gives its time.
QUICK = quick_config(Config)


def run_name(arch: str, depth: int, seed: int) -> str:
    """The folder name of one run: <arch>-d<depth>-s<seed>."""
    return f"{arch}-d{depth}-s{seed}"


def specs(config: Config) -> list[RunSpec]:
    """One RunSpec per (depth, arch, seed), deepest first so that the longest runs start early."""
    out = []
    for depth in sorted(config.depths, reverse=True):
        for arch in config.archs:
            model, kwargs = ARCHITECTURES[arch]
            if arch in PAPER_TEST_ERROR:  # the gated residual paper's three nets take the study's first layer
                kwargs = {**kwargs, "stem": config.stem, **BATCHNORM_CONSTANTS[config.batchnorm]}
            for seed in range(config.seeds):
                out.append(RunSpec(run_name(arch, depth, seed), RunConfig(
                    model=model, depth=depth, dataset="mnist", recipe=config.recipe, epochs=config.epochs,
                    seed=seed, train_on_full=config.train_on_full, device=config.device, limit=config.limit,
                    data_dir=config.data_dir, model_kwargs={"width": config.width, **kwargs},
                )))
    return out


def _run_record(result: dict[str, Any], seed: int) -> dict[str, Any]:
    """One finished run's numbers: last-epoch and last-10-epoch test error, its k's."""
    history = result["history"]
    final = result["final"]
    ks = final.get("k")
    return {"seed": seed, "test_error_pct": final["test_error_pct"],
            "test_error_last10_pct": last_epochs_mean(history),
            "k_mean": final.get("k_mean"), "k": ks,
            "dead_gates": sum(1 for k in ks if k <= 0.0) if ks else None,
            "k_middle_minus_ends": middle_minus_ends(ks) if ks and len(ks) >= 3 else None}


def middle_minus_ends(values: list[float]) -> float:
    """Mean of the middle third of `values` minus the mean of the first and last thirds: negative
    when the middle blocks have smaller k, the dip gated-residual-v2 figure 5 (left) describes."""
    third = len(values) // 3
    middle = values[third:len(values) - third]
    ends = values[:third] + values[len(values) - third:]
    return sum(middle) / len(middle) - sum(ends) / len(ends)


def summarize(config: Config, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Collect every run's results.json under `out`/runs into the study summary (finished or not).

    Per cell (architecture, depth): last-epoch test error as mean ± std and best over seeds, the
    mean of the last `LAST_EPOCHS` epochs (mean ± std over seeds), mean k (mean ± std), and each
    finished seed's numbers (`per_seed`). `comparisons` holds, per depth, the paired t-test of
    gated − residual over the seeds both finished (`mnist_depth_report.paired_comparisons`: Holm over the
    table's tests).
    """
    out = Path(out)
    cells = []
    curves: dict[str, dict[str, list[Any]]] = {}
    for depth in config.depths:
        for arch in config.archs:
            per_seed, status = [], []
            names = [run_name(arch, depth, seed) for seed in range(config.seeds)]
            for seed, (name, result) in enumerate(read_runs(out / "runs", names)):
                status.append(run_status(name, result))
                if result is None:
                    continue
                history = result["history"]
                curves[name] = {"epoch": [h["epoch"] for h in history], "train_loss": [h.get("train_loss") for h in history],
                                "test_error_pct": [h.get("test_error_pct") for h in history]}
                if result.get("final") is not None:
                    per_seed.append(_run_record(result, seed))
            errors = [r["test_error_pct"] for r in per_seed]
            cells.append({
                "arch": arch, "model": ARCHITECTURES[arch][0], "depth": depth,
                "test_error_pct": mean_std(errors),
                "test_error_best_pct": min(errors) if errors else None,
                "test_error_last10_pct": mean_std([r["test_error_last10_pct"] for r in per_seed]),
                "k_mean": mean_std([r["k_mean"] for r in per_seed if r["k_mean"] is not None]),
                "k_middle_minus_ends": mean_std([r["k_middle_minus_ends"] for r in per_seed
                                                 if r["k_middle_minus_ends"] is not None]),
                "per_seed": per_seed, "runs": status,
                "paper_test_error_pct": PAPER_TEST_ERROR.get(arch, {}).get(depth),
                "paper_k_mean": PAPER_MEAN_K.get(depth) if arch == "gated" else None,
            })
    summary = {"experiment": NAME, "config": asdict(config), "cells": cells, "curves": curves}
    summary["comparisons"] = paired_comparisons(summary)
    return summary


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md, findings.md (`findings_markdown`: the findings against the paper that the docs page
    shows) and the figures from `out`/results.json alone; return the table text. Where
    `out`/runs holds the runs' results.json files, also best_epoch.md: Table 1 under each epoch
    selection (`selection_report_markdown`; the validation-selected epoch where the study held out a
    validation split)."""
    from ..report.depth_study_plots import plot_error_by_depth, plot_k_by_block, plot_training_curves

    table = remake_report(out, table_markdown, [(plot_training_curves, "figure4_train_loss.png"),
                                                (plot_error_by_depth, "table1_test_error_by_depth.png"),
                                                (plot_k_by_block, "figure5_k_by_block.png")],
                          findings=findings_markdown)
    if (Path(out) / "runs").is_dir():
        config = read_summary(Path(out) / RESULTS_FILE, NAME)["config"]
        selections = ("last", "best-test") if config["train_on_full"] else ("last", "best-test", "best-val")
        atomic_write_text(Path(out) / "best_epoch.md", selection_report_markdown(out, selections))
    return table


# The study as the study machinery runs it (study.runner): the nets of one depth (every architecture and seed)
# train together as one stack (train.stack: per-model semantics of fit, one ordinary run directory each),
# whatever the number of seeds, so that a one-seed study trains through the same code as a five-seed one; the
# summary, table and figures are rewritten as stacks end (at most every REFRESH_INTERVAL_S), so that those of a
# long study can be read while it runs. `run` trains it (or its shard, `config.shard`; resumable).
STUDY = Study(NAME, Config, specs, summarize, write_report)
run = STUDY.run


def estimate(config: Config, jobs: int = 1, steps: int = 4) -> dict[str, Any]:
    """Project the study's training time on this machine without training it: the batches `run`
    would train (plain, residual and gated nets of one depth together, every seed), timed and
    handed to `jobs` workers (`stacking.project_batches`). The study's own rewrites of its summary,
    table and figures are timed once and counted in."""
    import tempfile
    import time

    projection = project_batches(specs(config), jobs, steps, compile=config.compile, shard=config.shard)
    # The study draws its table and figures as stacks end (at most every REFRESH_INTERVAL_S, none before the
    # first has ended) and at the end: time one such rewrite, of the study before any run.
    with tempfile.TemporaryDirectory(prefix="throughway-estimate-") as folder:
        began = time.perf_counter()
        StudySummary(folder, config, summarize, write_report)()
        report_s = time.perf_counter() - began
    rewrites = 1 + min(len(projection["batches"]), int(projection["wall_s"] / REFRESH_INTERVAL_S))
    for key in ("fixed_s", "serial_s", "wall_s"):
        projection[key] += rewrites * report_s
    return projection


def estimate_text(config: Config, jobs: int = 1, steps: int = 4) -> str:
    """`estimate` as a table and a projected wall time."""
    return depth_study_markdown(NAME, f"{len(config.archs)} architectures x {len(config.depths)} depths",
                                config.seeds, config.epochs, estimate(config, jobs, steps))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The study's command-line options: one per Config field, and --estimate (study.stacking)."""
    add_estimate_options(parser, Config)

