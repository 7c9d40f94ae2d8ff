"""The highway paper's optimisation study (section 3.1, figure 1): plain against highway nets of
10, 20, 50 and 100 layers on MNIST, each the best of a random hyperparameter search.

Protocol (highway §3.1): thin nets, "each layer has 50 blocks for highway networks and 71 units
for plain networks"; "the first layer is a fully connected plain layer followed by 9, 19, 49, or 99
fully connected plain or highway layers" (so L layers = depth L − 1 here), then a softmax layer;
plain layers without BatchNorm (`mlp_plain(norm="none", width=71)`), highway layers
`mlp_highway(width=50)`; SGD with momentum and an exponentially decaying learning rate (recipe
`highway-mnist`); "a random search of 100 runs for both plain and highway networks" over the
initial learning rate, momentum, the decay factor, the activation (ReLU or tanh) and, for highway
nets, the initial transform-gate bias (−1 to −10). Weights: "the same normalized initialization
[16, 17]" for plain and highway nets, the paper citing Glorot & Bengio [16] and He et al. [17]; here
(`init="normalized"`) Glorot uniform for tanh nets and He normal for ReLU nets, the scheme each
reference derives for that activation (Glorot's keeps ReLU activations shrinking by half a layer,
which alone would make deep plain ReLU nets untrainable).

Layer counting: a net of L layers has the first plain layer (the model's stem) and L − 1 middle
layers (the model's `depth`), so the paper's 10-layer highway net is `mlp_highway(depth=9)`; the
softmax output layer is not counted, as in the paper.

Epochs: the text does not state them, and the project's copy of the paper (shared/papers) does not
carry figure 1's image, so they could not be read from its x-axis here. The default, 400
(FIGURE1_EPOCHS), is a recollection of the published figure's x-axis ("Number of Epochs") that no
file checked: treat it as ours until someone with the PDF confirms it (`--epochs` sets it). The
caption gives the rest: "top 10 (out of 100) hyperparameter settings".

Ranking: trials are ranked by the lowest mean training cross-entropy of any epoch
(`rank="best-loss"`, the default). The paper's footnote 3 (§4, on the "best" nets of figure 2) says
the search was run "to minimize the best training set error achieved using each configuration": the
best value reached during training, not the last one. We rank by the loss rather than the
classification error because figure 1 plots "mean cross-entropy error" and ranking by the plotted
quantity keeps its top 10 the ones it draws, and because the training error of the shallow nets
reaches 0 in many trials, which would tie them. `rank="last-loss"` (the last epoch's loss, the
ranking of earlier versions) stays an option. Diverged trials rank last under both.

Gate bias: "between -1 and -10" (§3.1); the paper's best nets of figure 2 started at −2
and −4 (§4). `gate_bias="continuous"` (the default) draws it uniformly in [−10, −1];
`gate_bias="integer"` draws one of −10, −9, ..., −1 with equal probability. The default stays
continuous because the text gives a range, not a set, and because trial t then keeps the
hyperparameters the committed search (results/highway-depth) trained with; the other
hyperparameters of trial t are the same under both.

Our choices where the paper is silent (printed with every table): the ranges of the search
(`SEARCH_SPACE`); trial t of an architecture uses the same hyperparameters at every depth (a paired
design: depths differ only in depth) and seed t; batch 100; the loss plotted is the mean training
cross-entropy of each epoch in training mode (the paper's figure shows training loss; it does not
say how it was measured); the whole 60,000-image training set (no validation split is needed for
an optimisation study).

Trials of one (architecture, depth, activation) train together as one batched computation
(throughway.train.stack); trials with different activations cannot share a batch. `--shard i/N`
trains the i-th of N disjoint parts of the search (i = 1..N; batches i, i + N, ... of its batches,
study.shards), so a job array spreads the search over machines, its shards running at once into one
folder (docs/cluster.md); `--merge` (or `throughway report DIR`) builds the summary, table and figure
from every run directory under DIR/runs, whichever shard wrote it.

Writes, in the output folder: runs/<arch>-L<layers>-t<trial>/ (one run directory each),
results.json (the summary), table.md and figure1.png; the table and the observations are made in
experiments.highway_depth_report (re-exported here).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..layers.init import INIT_SCHEMES
from ..train import RESULTS_FILE, RunConfig, RunExistsError, read_results
from ..study.folders import check_same_settings, read_summary
from ..study.options import MAX_SEEDS, StudyOptions, json_config, option, quick_config
from ..study.shards import parse_shard, select_shard
from ..study.spec import RunSpec
from ..study.stacking import add_estimate_options, group_specs, project_batches, projection_markdown, run_stacked
from ..study.summary import StudySummary, check_run_results, remake_report
from .highway_depth_report import (PAPER_OBSERVATIONS, PAPER_SEARCH_TRIALS, RANKINGS, findings_markdown, observations,
                                   ranked_loss, table_markdown)

__all__ = ["Config", "QUICK", "FIGURE1_EPOCHS", "SEARCH_SPACE", "GATE_BIAS_SAMPLING", "RANKINGS", "ranked_loss", "PAPER_OBSERVATIONS", "sample_trial", "specs", "run", "summarize",
           "write_report", "estimate", "estimate_text", "NAME", "parse_shard", "observations", "table_markdown",
           "PAPER_SEARCH_TRIALS"]

NAME = "highway-depth"
DESCRIPTION = "highway §3.1 figure 1: random search, plain vs highway MLPs of 10-100 layers on MNIST (batched)"

# arch -> (registered model, fixed model kwargs): highway §3.1's thin nets.
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("mlp_plain", {"width": 71, "norm": "none", "stem": "dense"}),
    "highway": ("mlp_highway", {"width": 50}),
}

# Ours: the paper names the hyperparameters searched, not their ranges (except the gate bias).
SEARCH_SPACE: dict[str, str] = {
    "lr": "log-uniform in [1e-3, 1]",
    "momentum": "1 − log-uniform in [0.01, 0.5], i.e. 0.5 to 0.99",
    "lr_decay": "uniform in [0.9, 1.0] per epoch",
    "activation": "relu or tanh, each with probability 1/2",
    "gate_bias": "uniform in [−10, −1] (highway nets only; the paper's range)",
}
# How the transform-gate bias is drawn (Config.gate_bias), as SEARCH_SPACE words it.
GATE_BIAS_SAMPLING: dict[str, str] = {
    "continuous": SEARCH_SPACE["gate_bias"],
    "integer": "an integer in −10, ..., −1, each with probability 1/10 (highway nets only; the paper's range; "
               "its best nets started at −2 and −4)",
}

# init="normalized": highway §3.1's "normalized initialization [16, 17]", by activation.
NORMALIZED_INIT = {"tanh": "glorot_uniform", "relu": "he_normal"}
INIT_CHOICES = ("normalized", *INIT_SCHEMES)


# Figure 1's x-axis (see the module docstring): the epochs of the paper's scale, the default.
FIGURE1_EPOCHS = 400


@dataclass(frozen=True)
class Config(StudyOptions):
    """The study's settings; the defaults are the paper's scale (FIGURE1_EPOCHS): 100 trials per
    architecture and depth, all 60,000 training images, 400 epochs."""

    # at least 2 layers: the first plain layer and one more
    layers: tuple[int, ...] = option((10, 20, 50, 100), "network depths in layers (paper: 10 20 50 100)",
                                     quick=(10, 20), flag="--depths", aliases=("--layers",), minimum=2)
    archs: tuple[str, ...] = option(("plain", "highway"), "architectures", choices=tuple(ARCHITECTURES))
    trials: int = option(100, "random-search trials per architecture and depth (paper: 100)", quick=4,
                         minimum=1, maximum=MAX_SEEDS)
    epochs: int = option(FIGURE1_EPOCHS, "epochs per trial (ours, an unchecked recollection of figure 1's x-axis; "
                                         "the text does not state it)", quick=2, minimum=1)
    search_seed: int = option(0, "seed of the random search")
    train_on_full: bool = True
    limit: int | None = option(None, "keep only the first N samples of each split", quick=3000)
    max_batch: int = option(64, "most trials trained together in one batch", minimum=1)
    quick: bool = option(False, "made by --quick", quick=True, cli=False)
    init: str = option("normalized", "weight init (normalized: Glorot uniform for tanh, He normal for ReLU nets)",
                       choices=INIT_CHOICES)
    compile: bool | None = option(None, "torch.compile each batch's step; default: only the batches that train "
                                        "at least 10,000 steps (minutes of compilation per batch; pays for long "
                                        "batches)", quick=False)
    gate_bias: str = option("continuous", "how the initial transform-gate bias is drawn in [−10, −1]: continuous "
                                          "(uniform) or integer (−10..−1; the paper's best nets used −2 and −4)",
                            choices=tuple(GATE_BIAS_SAMPLING))
    rank: str = option("best-loss", "what ranks the trials: best-loss (the lowest training loss of any epoch, the "
                                    "paper's 'best training set error achieved') or last-loss (the last epoch's)",
                       choices=tuple(RANKINGS))


# What --quick runs (the fields' quick values): 10 and 20 layers, 4 trials, 2 epochs, 3000 images.
QUICK = quick_config(Config)

# Fields that may differ between the processes of one study (shards, merge, device), and the ranking,
# which trains nothing: a finished search is re-ranked with --merge --rank.
_PER_PROCESS = {"shard", "merge", "device", "data_dir", "max_batch", "compile", "rank"}


def sample_trial(arch: str, trial: int, search_seed: int = 0, gate_bias: str = "continuous") -> dict[str, Any]:
    """The hyperparameters of `trial` of `arch`: a pure function of (arch, trial, search_seed,
    gate_bias), so every shard and every depth draws the same ones (see SEARCH_SPACE). The gate bias
    is drawn last, so `gate_bias` ("continuous" or "integer", GATE_BIAS_SAMPLING) changes nothing else."""
    if gate_bias not in GATE_BIAS_SAMPLING:
        raise ValueError(f"gate_bias={gate_bias!r}; accepted values: {list(GATE_BIAS_SAMPLING)}")
    rng = random.Random(f"{search_seed}/{arch}/{trial}")
    sample = {
        "lr": 10 ** rng.uniform(-3.0, 0.0),
        "momentum": 1.0 - 10 ** rng.uniform(-2.0, math.log10(0.5)),
        "lr_decay": rng.uniform(0.9, 1.0),
        "activation": rng.choice(["relu", "tanh"]),
    }
    bias = rng.uniform(-10.0, -1.0) if gate_bias == "continuous" else float(rng.randint(-10, -1))
    if arch == "highway":
        sample["gate_bias"] = bias
    return sample


def run_name(arch: str, layers: int, trial: int) -> str:
    """The folder name of one trial: <arch>-L<layers>-t<trial>."""
    return f"{arch}-L{layers}-t{trial:03d}"


def specs(config: Config, shard: str | None = None) -> list[RunSpec]:
    """One RunSpec per (layers, arch, trial), shallowest first (a time-boxed search then completes whole
    cells of the table, the cheapest first); with `shard` 'i/N', only that shard's: the runs of batches
    i, i + N, ... of the search's batches (study.shards, as `run_stacked(..., shard=...)` trains them)."""
    out = []
    for layers in sorted(config.layers):
        for arch in config.archs:
            model, fixed = ARCHITECTURES[arch]
            for trial in range(config.trials):
                hp = sample_trial(arch, trial, config.search_seed, config.gate_bias)
                init = NORMALIZED_INIT[hp["activation"]] if config.init == "normalized" else config.init
                kwargs = {**fixed, "activation": hp["activation"], "init": init}
                if "gate_bias" in hp:
                    kwargs["gate_bias"] = hp["gate_bias"]
                out.append(RunSpec(run_name(arch, layers, trial), RunConfig(
                    model=model, depth=layers - 1, dataset="mnist", recipe="highway-mnist", epochs=config.epochs,
                    seed=trial, train_on_full=config.train_on_full, device=config.device, limit=config.limit,
                    data_dir=config.data_dir, model_kwargs=kwargs,
                    recipe_overrides={"lr": hp["lr"], "momentum": hp["momentum"], "lr_decay": hp["lr_decay"]},
                )))
    if shard is None:
        return out
    return [spec for batch in select_shard(group_specs(out, config.max_batch), shard) for spec in batch]


def _losses(result: dict[str, Any]) -> tuple[float, float]:
    """A trial's (last epoch's, lowest of any epoch's) training loss; +inf for both if it diverged or
    has no finite loss, so that diverged trials rank last."""
    values = [h["train_loss"] for h in result["history"]
              if h.get("train_loss") is not None and math.isfinite(h["train_loss"])]
    if result.get("diverged") or not values or values[-1] != result["history"][-1]["train_loss"]:
        return math.inf, math.inf
    return values[-1], min(values)


def summarize(config: Config, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Collect every trial's results under `out`/runs (all shards) into the study summary, each cell's
    trials ranked by `config.rank` (RANKINGS): the best trial and the top 10 with their mean curve."""
    out = Path(out)
    key = RANKINGS[config.rank][0]
    trials, cells = [], []
    for layers in config.layers:
        for arch in config.archs:
            finished, diverged, running, missing = [], 0, 0, 0
            for trial in range(config.trials):
                name = run_name(arch, layers, trial)
                path = out / "runs" / name / RESULTS_FILE
                hp = sample_trial(arch, trial, config.search_seed, config.gate_bias)
                if not path.is_file():
                    missing += 1
                    continue
                result = check_run_results(read_results(path.parent), path)
                curve = [h.get("train_loss") for h in result["history"]]
                state = "running" if result.get("final") is None else ("diverged" if result.get("diverged") else "finished")
                last, lowest = _losses(result)
                entry = {"run": name, "arch": arch, "layers": layers, "trial": trial, **hp, "state": state,
                         "epochs": len(curve), "final_train_loss": last if math.isfinite(last) else None,
                         "best_train_loss": lowest if math.isfinite(lowest) else None,
                         "diverged_at": result.get("diverged_at"), "train_loss": curve}
                trials.append(entry)
                if state == "running":
                    running += 1
                elif state == "diverged":
                    diverged += 1
                    finished.append(entry)
                else:
                    finished.append(entry)
            good = sorted((e for e in finished if e[key] is not None), key=lambda e: (e[key], e["trial"]))
            top = good[:10]
            mean_curve = None
            if top:
                length = min(len(e["train_loss"]) for e in top)
                mean_curve = [sum(e["train_loss"][k] for e in top) / len(top) for k in range(length)]
            cells.append({
                "arch": arch, "layers": layers, "finished": len(finished), "diverged": diverged, "running": running,
                "not_started": missing,
                "best": {"run": top[0]["run"], "final_train_loss": top[0]["final_train_loss"],
                         "best_train_loss": top[0]["best_train_loss"], "train_loss": top[0]["train_loss"],
                         "hyperparameters": {k: top[0][k] for k in ("lr", "momentum", "lr_decay", "activation", "gate_bias")
                                             if k in top[0]}} if top else None,
                "top10": {"n": len(top),
                          "mean_final_train_loss": (sum(e["final_train_loss"] for e in top) / len(top)) if top else None,
                          "mean_best_train_loss": (sum(e["best_train_loss"] for e in top) / len(top)) if top else None,
                          "mean_train_loss": mean_curve, "runs": [e["run"] for e in top]},
            })
    search_space = {**SEARCH_SPACE, "gate_bias": GATE_BIAS_SAMPLING[config.gate_bias]}
    return {"experiment": NAME, "config": asdict(config), "search_space": search_space, "ranked_by": RANKINGS[config.rank][1],
            "cells": cells, "trials": [{k: v for k, v in t.items() if k != "train_loss"} for t in trials]}


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md, findings.md (`highway_depth_report.findings_markdown`, what the docs page shows) and
    figure1.png from `out`/results.json alone; return the table text."""
    from ..report.highway_depth_plots import plot_figure1

    return remake_report(out, table_markdown, [(plot_figure1, "figure1.png")], findings=findings_markdown)


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Train this shard's trials into `out`/runs (resumable, batched), then write the summary, table and
    figure from every run under `out`/runs. With `config.merge` nothing is trained."""
    out = Path(out)
    summary_path = out / RESULTS_FILE
    if summary_path.is_file():
        previous = read_summary(summary_path, NAME).get("config", {})
        settings = json_config(config)
        # A setting the previous summary lacks was written before the option existed: it had the default.
        defaults = json_config(Config())
        fields = sorted(k for k in settings if k not in _PER_PROCESS)
        check_same_settings({k: previous.get(k, defaults[k]) for k in fields}, {k: settings[k] for k in fields},
                            fields, out)
    out.mkdir(parents=True, exist_ok=True)
    # Rewritten as batches end (at most once a minute), so a long search can be read while it runs.
    refresh = StudySummary(out, config, summarize, write_report, min_interval_s=60, runs=specs(config))

    if not config.merge:
        mine = specs(config, config.shard)
        started = [s.name for s in mine if (out / "runs" / s.name / RESULTS_FILE).is_file()]
        if started and not resume:
            raise RunExistsError(f"{out}/runs already holds {len(started)} of this shard's {len(mine)} trials "
                                 f"(e.g. {started[0]}); pass --resume to continue them, or choose another --out")
        run_stacked(specs(config), out / "runs", resume=resume, jobs=jobs, progress=progress,
                    max_batch=config.max_batch, compile=config.compile,
                    on_done=partial(refresh, force=False), shard=config.shard)
    summary = refresh()
    assert summary is not None
    if refresh.errors:
        # One failed batch does not stop the search; say so loudly at its end (also in results.json).
        first = next(iter(refresh.errors.items()))
        print(f"{len(refresh.errors)} trial(s) failed, e.g. {first[0]}: {first[1]}", file=sys.stderr, flush=True)
    return summary


def estimate(config: Config, jobs: int = 1, steps: int = 4) -> dict[str, Any]:
    """Project this shard's search's duration on this machine without training it
    (`stacking.project_batches`: timed steps of every batch, scaled, handed to `jobs` workers)."""
    e = project_batches(specs(config), jobs, steps, config.max_batch, compile=config.compile, shard=config.shard)
    rows = [{"arch": r["batch"][0].name.split("-")[0], "layers": r["batch"][0].config.depth + 1,
             "activation": r["batch"][0].config.model_kwargs["activation"], "models": r["models"],
             "compiled": r["compiled"], "step_s": r["step_s"], "setup_s": r["setup_s"], "epoch_s": r["epoch_s"],
             "total_s": r["total_s"]} for r in e["batches"]]
    return {**e, "epochs": config.epochs, "batches": rows}


def estimate_text(config: Config, jobs: int = 1, steps: int = 4) -> str:
    """`estimate` as a table and a projected wall time."""
    e = estimate(config, jobs, steps)
    title = (f"Projected cost of this shard ({config.shard}) of the highway-depth search: {config.trials} trials, "
             f"{e['epochs']} epochs, {e['train_images']} training images (+ {e['eval_images']} evaluated per epoch)")
    return projection_markdown(title, e, [("arch", lambda r: str(r["arch"])), ("layers", lambda r: str(r["layers"])),
                                          ("activation", lambda r: str(r["activation"])),
                                          ("trials in batch", lambda r: str(r["models"]))],
                               " (an estimate from wall-clock step times measured under the load stated above, not a "
                               "bound; diverged trials, which leave their batch, would shorten it)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The search's command-line options: one per Config field, and --estimate (study.stacking)."""
    add_estimate_options(parser, Config)
