"""The scalar gate beside its successors: gated residual, ReZero, SkipInit and LayerScale on
the gated-residual-v2 MNIST protocol.

Fully connected nets of width 50 after a single linear first layer (gated-residual-v2 §3.1), d ∈ {2,
10, 20, 50, 100} middle layers (d/2 residual blocks of two Dot-BN-ReLU layers), trained with the
`gresnet-mnist` recipe (NAdam, lr 0.002, batch 128, 100 epochs), 5 seeds per cell. The families
(`FAMILIES`) differ only in what scales the residual branch f_r and whether the branch has BatchNorm:

* residual: u = x + f_r(x);                      residual-nf: the same without BatchNorm;
* gated: u = x + relu(k)·f_r(x), k = 1 at first (gated-residual-v2 §2.2); gated-nf: without BatchNorm;
* rezero: u = x + α·f_r(x), α = 0 at first (ReZero, Bachlechner et al. 2020);
  rezero-nf: without BatchNorm, SkipInit's setting (De & Smith 2020);
* layerscale: u = x + diag(λ)·f_r(x), λ ∈ R^50 = ε at first, CaiT's ε by depth (Touvron et al. 2021 §3;
  `layers.cait_layerscale_init`: d = 2, 10 → 0.1; d = 20 → 1e-5; d = 50, 100 → 1e-6).

Depths run shallowest first, so that the cells that finish first are whole depths; every finished
cell is usable alone (results.json is rewritten as each batch ends). By default 10,000 training images
are held out (`train_on_full`), so each run records the validation error beside the test error.

Writes, in the output folder: runs/<family>-d<d>-s<seed>/ (one run directory each), results.json
(the summary), removal.json (the layer-removal curves of the gated families' finished runs,
gate_family_report.update_removal), table.md (`report_markdown`: error, paired tests, gates at the
end, removal), findings.md (the sentences the docs page shows: gate_family_report.findings_markdown),
train_loss.png and removal.png (report.gate_family_plots). The analyses at initialisation are a study
of their own: `reproduce gate-family-init` (experiments.gate_family_init).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..report.stats import format_mean_std, gated_comparisons, last_epochs_mean, mean_std
from ..report.tables import markdown_table
from ..study.gate_families import FAMILIES, family_kwargs
from ..study.options import MAX_SEEDS, StudyOptions, check_residual_depths, option, quick_config
from ..study.runner import Study
from ..study.spec import RunSpec
from ..study.stacking import add_estimate_options, depth_study_markdown, project_batches
from ..study.summary import read_runs, remake_report, run_status
from ..train import RunConfig, load_model
from .gate_family_report import (GATE_SYMBOL, comparisons_markdown, findings_markdown, gate_record,
                                 gate_values_markdown, removal_markdown, update_removal)

__all__ = ["NAME", "DESCRIPTION", "FAMILIES", "family_kwargs", "GATE_KINDS", "Config", "QUICK", "run_name", "specs",
           "summarize", "table_markdown", "report_markdown", "write_report", "STUDY",
           "report_finished", "run", "estimate", "estimate_text", "add_arguments"]

NAME = "gate-family"
DESCRIPTION = ("residual, gated (relu(k)), ReZero (α), LayerScale (λ) MLPs and their BatchNorm-free "
               "variants (SkipInit's setting) on MNIST (or Fashion-MNIST: --dataset), d = 2..100")

# the datasets of 28x28 grey images that the MLPs' 784 inputs fit
DATASETS = ("mnist", "fashion-mnist")

# The families (study.gate_families.FAMILIES, shared with gate-family-init) and their model arguments by depth
# (family_kwargs: CaiT's LayerScale ε for d).

# The gate of each family's blocks: "relu" (k ≤ 0 closes the gate: a dead gate), "identity" (α or λ
# may turn negative: a negative gate, not a dead one), None (ungated).
GATE_KINDS: dict[str, str | None] = {"residual": None, "gated": "relu", "rezero": "identity",
                                     "layerscale": "identity", "residual-nf": None, "gated-nf": "relu",
                                     "rezero-nf": "identity"}


@dataclass(frozen=True)
class Config(StudyOptions):
    """The study's settings; the defaults are the gated-residual-v2 MNIST protocol. The depths are kept
    shallowest first (the order the runs train in, and the one results.json records)."""

    depths: tuple[int, ...] = option((2, 10, 20, 50, 100), "values of d, the middle layers (run shallowest first)",
                                     quick=(2, 10), minimum=0, check=check_residual_depths)
    families: tuple[str, ...] = option(tuple(FAMILIES), "families to train", choices=tuple(FAMILIES))
    epochs: int = option(100, "epochs per run (gated-residual-v2: 100)", quick=2, minimum=1)
    seeds: int = option(5, "seeds per cell: mean ± std, best seed, paired tests of gated against each family",
                        quick=2, minimum=1, maximum=MAX_SEEDS)
    recipe: str = option("gresnet-mnist", "training recipe (gated-residual-v2: NAdam, lr 0.002, batch 128)", cli=False)
    train_on_full: bool = option(False, "train on all 60,000 images (default: 50,000, 10,000 held out for the "
                                        "validation error)")
    width: int = option(50, "units per layer (gated-residual-v2: 50)", minimum=1)
    dataset: str = option("mnist", "the data every run trains on (gated-residual-v2: MNIST; fashion-mnist asks "
                                   "whether the verdicts hold on a second dataset)", choices=DATASETS)
    limit: int | None = option(None, "keep only the first N samples of each split (smoke tests)", quick=2000,
                               minimum=1)
    compile: bool | None = option(None, "torch.compile each batch's training step; default: only the batches that "
                                        "train at least 10,000 steps (CPU: about 100 s of compilation per batch; "
                                        "not bitwise equal to eager)", quick=False)
    quick: bool = option(False, "made by --quick", quick=True, cli=False)

    def check(self) -> None:
        object.__setattr__(self, "depths", tuple(sorted(self.depths)))  # shallowest first, however given


# random removal orders per net (beside the one smallest-|gate|-first order)
REMOVAL_ORDERS = 3

# --quick: d = 2 and 10, every family, 2 epochs, 2 seeds, 2,000 images per split (a test runs it).
QUICK = quick_config(Config)


def run_name(family: str, depth: int, seed: int) -> str:
    """The folder name of one run: <family>-d<depth>-s<seed>."""
    return f"{family}-d{depth}-s{seed}"


def specs(config: Config) -> list[RunSpec]:
    """One RunSpec per (depth, family, seed), SHALLOWEST depth first: batches keep this order, so a
    study stopped early leaves whole shallow depths finished (the deep ones cost the most)."""
    return [RunSpec(run_name(family, depth, seed), RunConfig(
        model=FAMILIES[family][0], depth=depth, dataset=config.dataset, recipe=config.recipe, epochs=config.epochs,
        seed=seed, train_on_full=config.train_on_full, device=config.device, limit=config.limit,
        data_dir=config.data_dir, model_kwargs={"width": config.width, **family_kwargs(family, depth)}))
        for depth in config.depths for family in config.families for seed in range(config.seeds)]


def _run_record(family: str, result: dict[str, Any], seed: int) -> dict[str, Any]:
    """One finished run's numbers: last-epoch test and validation error, the mean test error of the last
    `LAST_EPOCHS` epochs, and its scalar gates at the end (k for gated, α for ReZero; LayerScale's λ
    are vectors, kept in the run's model.safetensors and not recorded per epoch)."""
    history = result["history"]
    final = result["final"]
    ks = final.get("k") or None
    kind = GATE_KINDS[family]
    return {"seed": seed, "test_error_pct": final["test_error_pct"], "val_error_pct": final.get("val_error_pct"),
            "test_error_last10_pct": last_epochs_mean(history),
            "k_mean": final.get("k_mean") if ks else None, "k": ks,
            # relu(k) with k ≤ 0 is an exact zero: a dead gate; an identity gate below 0 is only negative
            "dead_gates": sum(1 for k in ks if k <= 0.0) if ks and kind == "relu" else None,
            "negative_gates": sum(1 for k in ks if k < 0.0) if ks and kind == "identity" else None}


def summarize(config: Config, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Collect every run's results.json under `out`/runs into the study summary (finished or not).

    Per cell (family, depth): last-epoch test error as mean ± std and best over the finished seeds,
    the validation error, the mean of the last `LAST_EPOCHS` epochs, the mean scalar gate, each
    finished seed's numbers (`per_seed`) and each run's state; for the gated families also `gates`
    (each finished seed's gates at the end, read from its model.safetensors:
    gate_family_report.gate_record) and `removal` (each seed's layer-removal record in `out`/removal.json,
    where the records of gated runs finished since are added first: `gate_family_report.update_removal`,
    which evaluates each such net once). `curves` holds each run's training loss per epoch. `comparisons`
    holds, per depth and family, the paired t-test of gated − that family over the seeds both finished
    (report.stats.gated_comparisons; the report judges them as one family: gate_family_report.
    comparisons). A cell is keyed "arch" as in mnist-depth so that its tools apply.
    """
    out = Path(out)
    removal = _update_removal(config, out)
    cells = []
    curves: dict[str, Any] = {}
    for depth in config.depths:
        for family in config.families:
            per_seed, status, gates, removals = [], [], [], []
            names = [run_name(family, depth, seed) for seed in range(config.seeds)]
            for seed, (name, result) in enumerate(read_runs(out / "runs", names)):
                status.append(run_status(name, result))
                if result is None:
                    continue
                final = result.get("final")
                curves[name] = {"train_loss": [h.get("train_loss") for h in result["history"]]}
                if final is not None:
                    per_seed.append(_run_record(family, result, seed))
                    model_path = out / "runs" / name / "model.safetensors"
                    if family in GATE_SYMBOL and model_path.is_file():
                        gates.append({"seed": seed, **gate_record(load_model(model_path), GATE_KINDS[family] or "")})
                    if name in removal:
                        removals.append({"seed": seed, **removal[name]})
            errors = [r["test_error_pct"] for r in per_seed]
            cells.append({
                "arch": family, "family": family, "model": FAMILIES[family][0],
                "model_kwargs": FAMILIES[family][1], "gate_function": GATE_KINDS[family], "depth": depth,
                "test_error_pct": mean_std(errors),
                "test_error_best_pct": min(errors) if errors else None,
                "val_error_pct": mean_std([r["val_error_pct"] for r in per_seed if r["val_error_pct"] is not None]),
                "test_error_last10_pct": mean_std([r["test_error_last10_pct"] for r in per_seed]),
                "k_mean": mean_std([r["k_mean"] for r in per_seed if r["k_mean"] is not None]),
                "per_seed": per_seed, "runs": status, "gates": gates, "removal": removals,
            })
    summary: dict[str, Any] = {"experiment": NAME, "config": asdict(config), "cells": cells, "curves": curves}
    summary["comparisons"] = [row for other in config.families if other != "gated" and "gated" in config.families
                              for row in gated_comparisons(summary, other)]
    return summary


def _cell_text(cell: dict[str, Any]) -> str:
    error = cell["test_error_pct"]
    if not error["n"]:
        return "pending"
    return f"{format_mean_std(error)} (best {cell['test_error_best_pct']:.2f}, n={error['n']})"


def table_markdown(summary: dict[str, Any]) -> str:
    """Test error (%) at the last epoch by depth (rows) and family (columns): mean ± std over the
    finished seeds, the best seed and their number; "pending" where no seed has finished."""
    families = summary["config"]["families"]
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    rows = [[depth, *(_cell_text(by[(f, depth)]) for f in families)] for depth in summary["config"]["depths"]]
    return ("Test error (%) at the last epoch, mean ± std over seeds (best seed, finished seeds)\n\n"
            + markdown_table(["d", *families], rows) + "\n")


def report_markdown(summary: dict[str, Any]) -> str:
    """table.md: the error table, the paired tests, the gates at the end and the removal table, in that
    order (each also available alone: table_markdown, comparisons_markdown, gate_values_markdown,
    removal_markdown)."""
    return "\n".join([table_markdown(summary), comparisons_markdown(summary), gate_values_markdown(summary),
                      removal_markdown(summary)])


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md, findings.md (`gate_family_report.findings_markdown`: the sentences the docs page
    shows, every verdict at Holm-corrected p) and the figures (train_loss.png, removal.png) from `out`/results.json
    alone; return the table text."""
    from ..report.gate_family_plots import plot_removal_curves, plot_training_curves

    return remake_report(out, report_markdown, [(plot_training_curves, "train_loss.png"),
                                                (plot_removal_curves, "removal.png")],
                         findings=findings_markdown)


def _update_removal(config: Config, out: Path, redo_shared_orders: bool = False) -> dict[str, Any]:
    """Layer-removal records of the gated families' finished runs that removal.json lacks (with
    `redo_shared_orders`, also those made when every net of a depth drew the same random orders); returns
    every record of removal.json by run name."""
    gated = [(spec.name, asdict(spec.config)) for spec in specs(config)
             if spec.name.rsplit("-d", 1)[0] in GATE_SYMBOL and spec.config.depth >= 2]
    return update_removal(out, gated, orders=REMOVAL_ORDERS, device=config.device, data_dir=config.data_dir,
                          redo_shared_orders=redo_shared_orders)


# The study as the study machinery runs it (study.runner): the runs of a depth train as stacks (train.stack),
# whatever the seed count; the summary (with the removal curves of the runs finished since) and the figures are
# rewritten at most every study.summary.REFRESH_INTERVAL_S as stacks end. `run` trains it (resumable).
STUDY = Study(NAME, Config, specs, summarize, write_report)
run = STUDY.run


def report_finished(out: str | os.PathLike[str], *, redo_shared_orders: bool = False) -> dict[str, Any]:
    """Rebuild `out`/results.json from the run folders as they stand, without training: the summary of
    the config that results.json records (`summarize`; its command and environment kept), the removal
    curves of gated runs finished since (removal.json; with `redo_shared_orders`, also the records made
    when every net of a depth drew the same random orders, computed again with each net's own orders and
    the exact baseline: gate_family_report.update_removal), then table.md and the figures. For rendering
    a study that is still training elsewhere: run it on a copy of the folder, as that study's next batch
    rewrites results.json."""
    return STUDY.rebuild(out, lambda config, folder: _update_removal(config, folder, redo_shared_orders))



def estimate(config: Config, jobs: int = 1, steps: int = 4) -> dict[str, Any]:
    """Project the study's training time on this machine without training it: the batches `run` would
    train (residual and gated nets of one depth and norm share one; ReZero and LayerScale train in
    batches of their own), timed and handed to `jobs` workers (`stacking.project_batches`)."""
    return project_batches(specs(config), jobs, steps, compile=config.compile, shard=config.shard)


def estimate_text(config: Config, jobs: int = 1, steps: int = 4) -> str:
    """`estimate` as a table and a projected wall time."""
    return depth_study_markdown(NAME, f"{len(config.families)} families x {len(config.depths)} depths",
                                config.seeds, config.epochs, estimate(config, jobs, steps),
                                [("families", lambda r: _batch_families(r["batch"]))])


def _batch_families(batch: list[RunSpec]) -> str:
    """The families of a batch's runs (names <family>-d<d>-s<seed>), in order, joined by " + "."""
    return " + ".join(dict.fromkeys(spec.name.rsplit("-d", 1)[0] for spec in batch))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The study's command-line options: one per Config field, and --estimate (study.stacking)."""
    add_estimate_options(parser, Config)

