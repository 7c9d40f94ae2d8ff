"""Which layers can a trained vision transformer lose? The 2017 gate (ours: none of the papers trains a
transformer) against today's layer-dropping criteria, on a small ViT trained on MNIST as the field
trains one.

The model is `vit_patch` (models.vit): 16 patches of 7 × 7 pixels, `width` channels, `heads` heads,
`depth` pre-norm layers of torch's `nn.TransformerEncoderLayer` (GELU, feed-forward width 2·width, no
dropout), LayerNorm, mean over tokens, linear. The families differ only in the gate at the end of
each residual branch (two per layer: attention and feed-forward) and, for each seed, start from the
same weights (the gates are added by `add_gates` after the base weights are drawn) and read the same
batches:

* prenorm: u = x + f(x) (no gate);
* gated: u = x + relu(k)·f(x), k = 1 at first (gated-residual-v2 §2.2; the same function as prenorm
  at initialisation);
* rezero: u = x + α·f(x), α = 0 at first (ReZero's gate; the pre-norm LayerNorm is kept: ours);
* layerscale: u = x + diag(λ)·f(x), λ = CaiT's ε for the number of layers.

**Training** (recipe `vit-mnist`, ours): AdamW (lr 1e-3, weight decay 0.05 on weights only: gates,
norms, biases and the position embedding are not decayed), 400 linear warm-up steps and cosine decay
to 1e-5 per step, batch 128, on all 50,000 MNIST training images (the 10,000 validation images held
out as MNIST's split does; the 10,000 test images for the table). No augmentation.

**For scale**, a published small ViT on MNIST (`REFERENCE`): the from-scratch tutorial
s-chh/PyTorch-Scratch-Vision-Transformer-ViT (GitHub, commit 5d66670, README "Datasets and
Performance" and "Model Configurations", main.py, solver.py, data_loader.py): 6 layers, width 64, 4
heads, feed-forward 2 × 64, dropout 0.1, 210k parameters (the shape of this study's default, which has
no dropout), but patches of 4 × 4 (49 tokens against our 16), trained 100 epochs on all 60,000
training images with random crops (pad 2), AdamW (lr 5e-4, weight decay 1e-3, 10 warm-up epochs,
cosine to 1e-5), batch 128: 99.5% test accuracy (0.5% error), one run, no seeds, and whether of the
last or the best epoch the README does not say (the script prints both). Our nets see fewer, larger
patches, 20 epochs and no augmentation: the comparison says what error a ViT of this size reaches on
MNIST, not a like-for-like target.

**The checkpoint.** The cosine schedule ends near zero, so the last epoch's weights (each run's
model.safetensors) are the trained net: the error table reports their test error, and the removal
analysis reads the same file (`WEIGHTS`). The validation error of each epoch is recorded, never used
to choose anything.

**Which layers can go** (`analyse_run`, in the worker that trained the run, right after training:
runs/<name>/analysis.json, resumable). Every criterion of `analysis.importance` orders the layers
(a layer is one transformer block, both its branches), computed on `calibration_images` images of the
*training* split drawn with a recorded seed:

* "gate" (ascending |g|: relu(k), |α|, mean |λ|; the gated families only);
* "block_influence" (ShortGPT, Men et al. 2024: 1 − cosine of a layer's input and output);
* "angular" (Gromov et al. 2024: the n consecutive layers of smallest angular distance, chosen afresh
  for each n: a span curve, not nested);
* "lesion" (the calibration loss increase with the layer closed alone) and "lesion_greedy" (SLEB,
  Song et al. 2024: remove, re-score, repeat);
* "deepest" (the last layers first, the final one kept);
* "random": RANDOM_ORDERS orders drawn for this net alone from recorded seeds (`random_seed`), and
  for each n the exact mean over every subset of n layers where there are at most MAX_EXACT_SUBSETS
  (6 layers: every n), else the mean of the random orders.

Hidden states are compared over every token (token="all"; the head averages all tokens, so the last
token, Gromov et al.'s choice for a causal language model, means nothing here). The cross-entropy on
the calibration images is the lesion criteria's loss. The measure of a removal is the **test accuracy
(%)** of the net with those layers physically removed (`analysis.prune`), each subset evaluated once.

The summary compares gated against each family by the paired t-test over seeds of the test error,
and, for each gated family, each criterion with the gate order at n = layers/4 and layers/2 removed
(paired over seeds, test accuracy, criterion − gate): each table one family of tests under Holm's
correction (report.stats). Writes runs/, results.json, table.md, findings.md and transformer_gates.png
(report.transformer_gates_plots).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.nn import functional as F

from .._io import atomic_write_json, read_json
from ..analysis import prune
from ..analysis.blocks import find_blocks, gate_value
from ..analysis.importance import angular_spans, importance_order
from ..analysis.removal import removable_blocks
from ..data import load_dataset
from ..layers import find_branches
from ..models import create_model
from ..report.stats import (CONFIDENCE, CORRECTION, MIN_PAIRS_FOR_VERDICT, NO_DIFFERENCE, SIGNIFICANCE, TOO_FEW,
                            format_interval, format_mean_std, format_p, gated_comparisons, judge, judged_in_words,
                            mean_curve, mean_std, paired_by_seed)
from ..report.tables import paired_cells, paired_columns, table_header, table_row
from ..study.nets import seeded_model, test_accuracy
from ..study.options import MAX_SEEDS, StudyOptions, add_options, option, quick_config
from ..study.runner import Study
from ..study.spec import RunSpec
from ..study.summary import read_runs, remake_report, run_status
from ..train import RunConfig, get_recipe, load_model
from ..train.loop import epoch_starts

__all__ = ["NAME", "DESCRIPTION", "FAMILIES", "CRITERIA", "REFERENCE", "WEIGHTS", "Config", "QUICK", "run_name",
           "specs", "random_seed", "analyse_run", "summarize", "checkpoints", "table_markdown", "findings_markdown",
           "orders_prose", "report_markdown", "write_report", "STUDY", "run", "report_finished", "estimate",
           "estimate_text", "add_arguments"]

NAME = "transformer-gates"
DESCRIPTION = ("ours: which layers of a trained vision transformer can go: the 2017 gate (relu(k) via add_gates), "
               "ReZero and LayerScale against ShortGPT's block influence, the angular distance of Gromov et al., "
               "SLEB's lesion test, deepest-first and random orders, on a small ViT trained on MNIST with AdamW, "
               "warm-up and cosine decay")

# family -> the `gate` argument of vit_patch
FAMILIES: dict[str, str] = {"prenorm": "none", "gated": "relu", "rezero": "rezero", "layerscale": "layerscale"}
# The families with a gate to order the layers by, and what the report calls it.
GATE_SYMBOL = {"gated": "k", "rezero": "α", "layerscale": "|λ|"}
# The orders whose removal curves are compared; "angular" is the span curve of Gromov et al.
CRITERIA = ("gate", "block_influence", "angular", "lesion", "lesion_greedy", "deepest", "random")
RANDOM_ORDERS = 3
# The random baseline at n layers removed is the exact mean over all C(layers, n) subsets where there are at
# most this many (6 layers: at most 20, every n), else the mean of the RANDOM_ORDERS orders' curves.
MAX_EXACT_SUBSETS = 20
CALIBRATION_BATCH = 256
ANALYSIS_FILE = "analysis.json"
# What both the error table and the removal analysis read: each run's model.safetensors, written at the end.
WEIGHTS = "last epoch"
# The published figure the page compares with (module docstring): s-chh/PyTorch-Scratch-Vision-Transformer-ViT.
REFERENCE = {"source": "s-chh/PyTorch-Scratch-Vision-Transformer-ViT (GitHub, commit 5d66670: README, main.py, "
                       "solver.py, data_loader.py)",
             "test_error_pct": 0.5, "layers": 6, "width": 64, "heads": 4, "patch": 4, "tokens": 49, "epochs": 100,
             "training_images": 60000, "augmentation": "random crop, pad 2", "parameters": 210_000}


@dataclass(frozen=True)
class Config(StudyOptions):
    """The study's settings (ours; see the module docstring); the defaults fit about 2 hours on 2 cores."""

    depths: tuple[int, ...] = option((6,), "transformer layers (two gated branches each; layers/4 and layers/2 are "
                                           "removed); one set of runs per value", quick=(4,), minimum=2)
    families: tuple[str, ...] = option(tuple(FAMILIES), "families to train", choices=tuple(FAMILIES))
    epochs: int = option(20, "epochs per run (the cosine schedule spans them)", quick=2, minimum=1)
    seeds: int = option(5, "seeds per family: mean ± std and paired tests", quick=2, minimum=1, maximum=MAX_SEEDS)
    width: int = option(64, "channels per token", quick=16, minimum=1)
    heads: int = option(4, "attention heads", minimum=1)
    limit: int | None = option(None, "keep only the first N images of each split (default: all 50,000 / 10,000 / "
                                     "10,000)", quick=512, minimum=2)
    calibration_images: int = option(1024, "training images the data-dependent criteria are computed on", quick=128,
                                     minimum=1)
    recipe: str = option("vit-mnist", "training recipe (AdamW, warm-up, cosine decay per step)", cli=False)
    quick: bool = option(False, "made by --quick", quick=True, cli=False)

    def check(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width={self.width} is not divisible by heads={self.heads}")


QUICK = quick_config(Config)


def run_name(family: str, depth: int, seed: int) -> str:
    """The folder name of one run: <family>-L<layers>-s<seed>."""
    return f"{family}-L{depth}-s{seed}"


def _training_images(config: Config) -> int:
    return 50000 if config.limit is None else min(config.limit, 50000)


def _warmup_steps(config: Config) -> int:
    """The recipe's warm-up, or a tenth of the run's steps where the run is shorter than ten warm-ups (--quick)."""
    recipe = get_recipe(config.recipe)
    steps = config.epochs * len(epoch_starts(_training_images(config), recipe.batch_size))
    return min(recipe.warmup_steps, steps // 10)


def specs(config: Config) -> list[RunSpec]:
    """One RunSpec per (depth, seed, family): shallowest depth first, then seed-major, so that a study
    stopped early holds whole seeds, which the paired tests need."""
    overrides = {"warmup_steps": _warmup_steps(config)}
    return [RunSpec(run_name(family, depth, seed), RunConfig(
        model="vit_patch", depth=depth, dataset="mnist", recipe=config.recipe, epochs=config.epochs, seed=seed,
        device=config.device, limit=config.limit, data_dir=config.data_dir,
        model_kwargs={"width": config.width, "heads": config.heads, "gate": FAMILIES[family]},
        recipe_overrides=dict(overrides)))
        for depth in sorted(config.depths) for seed in range(config.seeds) for family in config.families]


# ---- the analysis of one trained net --------------------------------------------------------------------

def random_seed(name: str, index: int) -> int:
    """The recorded seed of random order `index` of run `name`: CRC-32 of "<name>/random/<index>", so each
    net draws its own orders, reproducibly, whatever order the nets are analysed in."""
    return zlib.crc32(f"{name}/random/{index}".encode())


def _calibration_seed(name: str) -> int:
    return zlib.crc32(f"{name}/calibration".encode())


def _gate_record(model: torch.nn.Module, family: str) -> dict[str, Any]:
    """One net's gates at the end, per branch (two per layer): the raw value (k or α; mean |λ| over
    channels for LayerScale), the mean, the dead branches (relu gate with k ≤ 0: an exact identity) and
    the negative ones (identity gate below 0 in every entry: a sign flip, not a closed branch)."""
    gates = {name: ref.gate for name, ref in find_branches(model).items() if ref.gate is not None}
    values = [gate_value(g) for g in gates.values()]
    raw = [float(torch.as_tensor(g.k).detach().double().mean()) if family != "layerscale"
           else float(gate_value(g).abs().mean()) for g in gates.values()]
    return {"branches": list(gates), "per_branch": raw, "mean": sum(raw) / len(raw),
            "dead": sum(1 for v in values if bool((v == 0).all())) if family == "gated" else None,
            "negative": sum(1 for v in values if bool((v < 0).all())) if family != "gated" else None,
            "count": len(values)}


def _family(name: str) -> str:
    return name.split("-L", 1)[0]


def analyse_run(config: Config, spec: RunSpec, run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The layer-removal analysis of one finished run (module docstring) on its last epoch's weights,
    written atomically to run_dir/analysis.json and returned; a run analysed before is read back, not
    recomputed. Fields: family, seed, layers (the blocks' names), weights, epochs, test_accuracy (the
    intact net's, %), calibration (images, seed, batch), orders (criterion → layer names, first removed
    first), angular_spans (n → the layers Gromov et al. remove), random_orders / random_seeds /
    random_curves, random_kind (per n: "exact" over every subset, or "orders"), random_subsets (per n),
    curves (criterion → test accuracy (%) with n = 0, 1, ... layers removed; deepest stops at layers − 1),
    gates (`_gate_record`; gated families)."""
    run_dir = Path(run_dir)
    path = run_dir / ANALYSIS_FILE
    if path.is_file():
        return read_json(path)
    family, seed = _family(spec.name), spec.config.seed
    data = load_dataset("mnist", config.data_dir, device=config.device, limit=config.limit)
    model = load_model(run_dir / "model.safetensors", device=config.device).eval()
    layers = list(find_blocks(model))
    position = {name: i for i, name in enumerate(layers)}
    cache: dict[frozenset[str], float] = {}

    def accuracy(removed: Sequence[str]) -> float:
        """Test accuracy (%) with `removed` physically removed; each subset evaluated once."""
        key = frozenset(removed)
        if key not in cache:
            names: list[str] = sorted(key, key=lambda name: position[name])
            net = prune(model, names) if names else model
            cache[key] = test_accuracy(data.test)(net)
        return cache[key]

    calibration = _calibration_seed(spec.name)
    generator = torch.Generator().manual_seed(calibration)
    chosen = torch.randperm(len(data.train), generator=generator)[:config.calibration_images].to(data.train.x.device)
    batches = [(data.train.x[chosen[i:i + CALIBRATION_BATCH]], data.train.y[chosen[i:i + CALIBRATION_BATCH]].long())
               for i in range(0, len(chosen), CALIBRATION_BATCH)]
    orders: dict[str, list[str]] = {}
    for criterion in ("gate", "block_influence", "angular", "lesion", "lesion_greedy", "deepest"):
        if criterion == "gate" and family not in GATE_SYMBOL:
            continue
        token = "all" if criterion in ("block_influence", "angular") else None
        orders[criterion] = importance_order(model, criterion, batches, loss_fn=F.cross_entropy, token=token)
    spans = angular_spans(model, batches, token="all")
    seeds = [random_seed(spec.name, i) for i in range(RANDOM_ORDERS)]
    randoms = [importance_order(model, "random", seed=s) for s in seeds]
    curves = {criterion: [accuracy(order[:n]) for n in range(len(order) + 1)] for criterion, order in orders.items()}
    curves["angular"] = [accuracy([]), *(accuracy(spans[n]) for n in sorted(spans))]
    random_curves = [[accuracy(order[:n]) for n in range(len(order) + 1)] for order in randoms]
    removable = removable_blocks(model)
    random_curve, kinds, subsets = [], [], []
    for n in range(len(removable) + 1):
        count = math.comb(len(removable), n)
        if count <= MAX_EXACT_SUBSETS:
            values = [accuracy(subset) for subset in itertools.combinations(removable, n)]
            kinds.append("exact")
        else:
            values = [curve[n] for curve in random_curves]
            kinds.append("orders")
        random_curve.append(sum(values) / len(values))
        subsets.append(count)
    curves["random"] = random_curve
    record: dict[str, Any] = {
        "family": family, "seed": seed, "layers": layers, "weights": WEIGHTS, "test_accuracy": accuracy([]),
        "calibration": {"images": len(chosen), "seed": calibration, "batch": CALIBRATION_BATCH, "split": "train"},
        "orders": orders, "angular_spans": {str(n): span for n, span in spans.items()},
        "random_orders": randoms, "random_seeds": seeds, "random_curves": random_curves, "random_kind": kinds,
        "random_subsets": subsets, "curves": curves, "evaluations": len(cache)}
    if family in GATE_SYMBOL:
        record["gates"] = _gate_record(model, family)
    atomic_write_json(path, record)
    return record


# ---- the summary --------------------------------------------------------------------------------------

def checkpoints(depth: int) -> list[int]:
    """The numbers of layers removed at which the criteria are tested against the gate order: layers/4
    (at least 1) and layers/2."""
    return sorted({max(1, depth // 4), max(1, depth // 2)})


def _parameters(config: Config, depth: int) -> int:
    with torch.device("meta"):
        model = create_model("vit_patch", depth=depth, width=config.width, heads=config.heads)
    return sum(p.numel() for p in model.parameters())


def summarize(config: Config, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Every run's results.json and analysis.json under `out`/runs collected: per cell (family, depth) the
    last epoch's test error (mean ± std over the finished seeds; `WEIGHTS`) and each seed's numbers with
    its analysis record; `comparisons` the paired t-tests over seeds of gated − each other family's test
    error (Holm over them); `criteria_tests` for each gated family and n in `checkpoints`, the paired test of
    each criterion's test accuracy − the gate order's with n layers removed (Holm over them, a higher
    accuracy better); `reference` the published figure; `parameters` per depth."""
    out = Path(out)
    cells: list[dict[str, Any]] = []
    for depth in sorted(config.depths):
        for family in config.families:
            per_seed: list[dict[str, Any]] = []
            status = []
            names = [run_name(family, depth, seed) for seed in range(config.seeds)]
            for seed, (name, result) in enumerate(read_runs(out / "runs", names)):
                status.append(run_status(name, result, diverged_at=False))
                if result is None or result.get("final") is None:
                    continue
                final = result["final"]
                entry: dict[str, Any] = {"seed": seed, "test_error_pct": final["test_error_pct"],
                                         "val_error_pct": final.get("val_error_pct"),
                                         "epochs": final.get("epochs_completed"),
                                         "training_images": (result.get("data") or {}).get("train"),
                                         "history": [{"epoch": h["epoch"], "lr": h.get("lr"),
                                                      "val_error_pct": h.get("val_error_pct"),
                                                      "test_error_pct": h.get("test_error_pct"),
                                                      "train_loss": h.get("train_loss")} for h in result["history"]]}
                analysis = out / "runs" / name / ANALYSIS_FILE
                if analysis.is_file():
                    entry["analysis"] = read_json(analysis)
                per_seed.append(entry)
            cells.append({"family": family, "depth": depth, "gate": FAMILIES[family],
                          "test_error_pct": mean_std([e["test_error_pct"] for e in per_seed]),
                          "per_seed": per_seed, "runs": status,
                          "gates": [{"seed": e["seed"], **e["analysis"]["gates"]} for e in per_seed
                                    if "gates" in e.get("analysis", {})]})
    trained = [e["training_images"] for c in cells for e in c["per_seed"] if e.get("training_images")]
    summary: dict[str, Any] = {"experiment": NAME, "config": asdict(config), "cells": cells, "weights": WEIGHTS,
                               "reference": REFERENCE,
                               "training_images": trained[0] if trained else _training_images(config),
                               "parameters": {str(d): _parameters(config, d) for d in sorted(config.depths)}}
    summary["config"]["depths"] = sorted(config.depths)
    summary["comparisons"] = judge([row for other in config.families if other != "gated" and "gated" in config.families
                                    for row in gated_comparisons(summary, other)])
    rows = []
    for cell in cells:
        if cell["family"] not in GATE_SYMBOL:
            continue
        analysed = {e["seed"]: e["analysis"]["curves"] for e in cell["per_seed"] if "analysis" in e}
        for n in checkpoints(cell["depth"]):
            gate = {s: curves["gate"][n] for s, curves in analysed.items()}
            for criterion in CRITERIA[1:]:
                seeds, test = paired_by_seed({s: curves[criterion][n] for s, curves in analysed.items()}, gate)
                rows.append({"depth": cell["depth"], "family": cell["family"], "n": n, "a": criterion, "b": "gate",
                             "seeds": seeds, "test": test.to_dict()})
    summary["criteria_tests"] = judge(rows, better="higher")
    return summary


# ---- tables and words -----------------------------------------------------------------------------------

def _by(summary: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(c["family"], c["depth"]): c for c in summary["cells"]}


def _mean_curve(cell: dict[str, Any], criterion: str) -> list[float] | None:
    return mean_curve([e["analysis"]["curves"][criterion] for e in cell["per_seed"]
                       if criterion in e.get("analysis", {}).get("curves", {})])


def _layers(depth: int) -> str:
    return f"{depth} layer" + ("" if depth == 1 else "s")


def _seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def table_markdown(summary: dict[str, Any]) -> str:
    """The tables: test error by layers and family; the paired tests of gated against each family; the
    gates at the end; test accuracy with n layers removed by family and criterion; the paired tests of
    each criterion against the gate order. Each test with its 95% interval, p uncorrected and
    Holm-corrected over the tests of its table, the difference it could detect with 80% power and the
    verdict at the corrected p."""
    config = summary["config"]
    families, depths = config["families"], config["depths"]
    by = _by(summary)
    lines = [f"Test error (%) of the {summary['weights']}'s weights (the cosine schedule's end; the weights the "
             f"removal analysis reads), mean ± std over seeds", "",
             *table_header(["layers", "parameters", *families])]
    for depth in depths:
        lines.append(table_row([depth, f"{summary['parameters'][str(depth)]:,}", *(
            format_mean_std(by[(f, depth)]["test_error_pct"], count=True, empty="pending") for f in families)]))
    lines += ["", f"Paired t-test (two-sided) over seeds, gated − other, test error in points: the mean difference, "
              f"its {CONFIDENCE:.0%} interval, p uncorrected and {CORRECTION}-corrected over this table's tests, the "
              f"difference the test detects with 80% power; a verdict only with n ≥ {MIN_PAIRS_FOR_VERDICT} and "
              f"{CORRECTION}-corrected p < {SIGNIFICANCE}", "",
              *table_header(["layers", "other", "n", *paired_columns("gated − other")])]
    for row in summary["comparisons"]:
        lines.append(table_row([row["depth"], row["b"], len(row["seeds"]), *paired_cells(row)]))
    gated = [f for f in families if f in GATE_SYMBOL]
    if gated:
        lines += ["", "Gates at the end, per branch (two per layer): mean over seeds of each net's mean gate; dead = "
                  "relu gate with k ≤ 0 (an exact identity), negative = identity gate below 0", "",
                  *table_header(["layers", *(f"{f} (mean {GATE_SYMBOL[f]})".replace("|λ|", "\\|λ\\|") for f in gated)])]
        for depth in depths:
            cells = []
            for family in gated:
                gates = by[(family, depth)]["gates"]
                if not gates:
                    cells.append("pending")
                    continue
                total = sum(g["count"] for g in gates)
                extra = (f"dead {sum(g['dead'] for g in gates)}/{total}" if family == "gated"
                         else f"negative {sum(g['negative'] for g in gates)}/{total}")
                cells.append(f"{format_mean_std(mean_std([g['mean'] for g in gates]), '.3g', '.2g')} ({extra})")
            lines.append(table_row([depth, *cells]))
    for depth in depths:
        lines += ["", f"{_layers(depth)}: test accuracy (%) with n layers removed, mean over seeds (angular: the best "
                  f"span of n consecutive layers for each n, not nested; deepest keeps the last layer; random: the "
                  f"exact mean over every subset of n layers where there are at most {MAX_EXACT_SUBSETS}, else over "
                  f"{RANDOM_ORDERS} orders drawn for each net)", "",
                  *table_header(["family", "criterion", *[f"n = {n}" for n in range(depth + 1)]])]
        for family in families:
            for criterion in CRITERIA:
                curve = _mean_curve(by[(family, depth)], criterion)
                if curve is None:
                    continue
                cells = [f"{v:.2f}" for v in curve] + ["—"] * (depth + 1 - len(curve))
                lines.append(table_row([family, criterion, *cells]))
    lines += ["", f"Paired t-test (two-sided) over seeds of the test accuracy with n layers removed, criterion − gate "
              f"order, in points (positive: the criterion keeps more accuracy); {CONFIDENCE:.0%} CI; p uncorrected "
              f"and {CORRECTION}-corrected over this table's tests; a verdict only with n ≥ {MIN_PAIRS_FOR_VERDICT} "
              f"seeds and {CORRECTION}-corrected p < {SIGNIFICANCE}", "",
              *table_header(["layers", "family", "n removed", "criterion", "seeds", *paired_columns("criterion − gate")])]
    for row in summary["criteria_tests"]:
        lines.append(table_row([row["depth"], row["family"], row["n"], row["a"], len(row["seeds"]),
                                *paired_cells(row, "+.2f", 1.0, 2)]))
    return "\n".join(lines) + "\n"


def _criteria_findings(summary: dict[str, Any], depth: int, family: str) -> str | None:
    rows = [r for r in summary["criteria_tests"] if r["depth"] == depth and r["family"] == family]
    judged = [r for r in rows if r.get("p_corrected") is not None]
    # every seed's difference 0 (the criterion removed the same layers as the gate, or layers whose removal
    # changed no test prediction): no p, nothing to correct
    same = [r for r in rows if r["test"]["n"] >= MIN_PAIRS_FOR_VERDICT and r["test"]["p_value"] is None]
    if not rows:
        return None
    if not any(r["seeds"] for r in rows):
        return f"- {family}, {_layers(depth)}: layers removed by each criterion against the gate order: pending."
    if not judged and not same:
        seeds = min(len(r["seeds"]) for r in rows)
        return (f"- {family}, {_layers(depth)}: layers removed by each criterion against the gate order: {TOO_FEW} "
                f"for a verdict ({_seeds(seeds)}).")

    def said(r: dict[str, Any]) -> str:
        return (f"{r['a']} at n = {r['n']} ({r['test']['mean_difference']:+.2f} points, {CORRECTION} p = "
                f"{format_p(r['p_corrected'])})")

    above = [r for r in judged if r["verdict"] == f"{r['a']} better"]
    below = [r for r in judged if r["verdict"] == "gate better"]
    parts = []
    if below:
        parts.append("the gate order keeps more test accuracy than " + ", ".join(said(r) for r in below))
    if above:
        parts.append("more test accuracy than the gate order: " + ", ".join(said(r) for r in above))
    uncorrected = [r for r in judged if r not in above and r not in below and r["test"]["p_value"] < SIGNIFICANCE]
    rest = [r for r in judged if r not in above and r not in below and r not in uncorrected]
    if uncorrected:
        parts.append(f"{NO_DIFFERENCE} after {CORRECTION}, significant only uncorrected: " + ", ".join(
            f"{r['a']} at n = {r['n']} ({r['test']['mean_difference']:+.2f} points, p = {format_p(r['test']['p_value'])})"
            for r in uncorrected))
    if rest:
        parts.append(f"{NO_DIFFERENCE} for " + ", ".join(
            f"{r['a']} at n = {r['n']} (95% CI {format_interval(r['test']['ci_low'], r['test']['ci_high'], '+.2f')})"
            for r in rest))
    if same:
        parts.append("the gate order's test accuracy at every seed: " + ", ".join(f"{r['a']} at n = {r['n']}"
                                                                                for r in same))
    total = sum(1 for r in summary["criteria_tests"] if r.get("p_corrected") is not None)
    corrected = f"; {CORRECTION} over the {total} tests" if judged else ""
    return (f"- {family}, {_layers(depth)}: test accuracy after removing n layers by each criterion against the gate "
            f"order (paired, criterion − gate{corrected}): " + "; ".join(parts) + ".")


def findings_markdown(summary: dict[str, Any]) -> str:
    """The findings in words, exactly as the tests support them: the ungated net's test error against the
    published small ViT, per depth the family with the lowest mean error and the paired tests of gated
    against each family, the dead gates, the mean accuracy each criterion keeps at layers/2, and each
    criterion against the gate order at the Holm-corrected p. What `throughway report` writes as
    findings.md and the docs page shows."""
    config = summary["config"]
    by = _by(summary)
    reference = summary["reference"]
    lines = []
    for depth in config["depths"]:
        if "prenorm" in config["families"] and by[("prenorm", depth)]["test_error_pct"]["n"]:
            stat = by[("prenorm", depth)]["test_error_pct"]
            lines.append(f"- The ungated ViT ({_layers(depth)}, width {config['width']}, "
                         f"{summary['parameters'][str(depth)]:,} parameters, {config['epochs']} epochs on "
                         f"{summary['training_images']:,} training images) reaches "
                         f"{format_mean_std(stat)}% test error ({_seeds(stat['n'])}; {summary['weights']}'s weights); "
                         f"the published small ViT of {reference['source'].split(' (')[0]} ({reference['layers']} "
                         f"layers, width {reference['width']}, {reference['tokens']} patches of {reference['patch']} × "
                         f"{reference['patch']}, {reference['epochs']} epochs on {reference['training_images']:,} "
                         f"images with random crops) reports {reference['test_error_pct']}%: not a like-for-like "
                         f"comparison.")
    for depth in config["depths"]:
        finished = {f: by[(f, depth)]["test_error_pct"] for f in config["families"]
                    if by[(f, depth)]["test_error_pct"]["n"]}
        if not finished:
            lines.append(f"- {_layers(depth)}: pending.")
            continue
        best = min(finished, key=lambda f: finished[f]["mean"])
        tests = [r for r in summary["comparisons"] if r["depth"] == depth and r.get("p_corrected") is not None]
        parts = judged_in_words(tests)
        seeds = min(v["n"] for v in finished.values())
        total = sum(1 for r in summary["comparisons"] if r.get("p_corrected") is not None)
        compared = [r for r in summary["comparisons"] if r["depth"] == depth]
        said = (f"{TOO_FEW} for a verdict (n = {seeds})" if compared and not tests else
                f"gated against each family (paired, gated − other in points, {CORRECTION} over the {total} tests): "
                + "; ".join(parts) if tests else "")
        lines.append(f"- {_layers(depth)}: lowest mean test error {best} ({format_mean_std(finished[best])}%, "
                     f"n={finished[best]['n']})" + (f"; {said}" if said else "") + ".")
    dead = [(c["depth"], sum(g["dead"] for g in c["gates"]), sum(g["count"] for g in c["gates"]))
            for c in summary["cells"] if c["family"] == "gated" and c["gates"]]
    if dead:
        lines.append("- Dead relu gates (k ≤ 0) at the end, summed over seeds: "
                     + "; ".join(f"{_layers(d)} {n}/{total}" for d, n, total in dead) + ".")
    for depth in config["depths"]:
        half = max(1, depth // 2)
        kept = []
        for family in config["families"]:
            means = {c: curve[half] for c in CRITERIA if (curve := _mean_curve(by[(family, depth)], c)) is not None}
            if means:
                ranked = sorted(means, key=lambda c: -means[c])
                kept.append(f"{family}: " + ", ".join(f"{c} {means[c]:.1f}" for c in ranked))
        if kept:
            lines.append(f"- Mean test accuracy (%) with {half} of {depth} layers removed, highest mean first (the "
                         f"paired tests below say which differences the seeds support): " + "; ".join(kept) + ".")
        for family in [f for f in config["families"] if f in GATE_SYMBOL]:
            text = _criteria_findings(summary, depth, family)
            if text:
                lines.append(text)
    return "\n".join(lines) + "\n"


def orders_prose(summary: dict[str, Any]) -> str:
    """How the gate order of the deepest gated nets begins, counted over seeds: the layer it removes
    first, and the mean k of each layer's two branches (shallowest first). The docs page's sentence."""
    depth = max(summary["config"]["depths"])
    cell = _by(summary).get(("gated", depth))
    records = [e["analysis"] for e in cell["per_seed"] if "analysis" in e] if cell else []
    if not records:
        return f"the {depth}-layer gated nets: pending"
    firsts: dict[str, int] = {}
    for record in records:
        firsts[record["orders"]["gate"][0]] = firsts.get(record["orders"]["gate"][0], 0) + 1
    counted = ", ".join(f"{name} in {n}" for name, n in sorted(firsts.items(), key=lambda kv: (-kv[1], kv[0])))
    per_layer = [sum(sum(r["gates"]["per_branch"][2 * i:2 * i + 2]) / 2 for r in records) / len(records)
                 for i in range(depth)]
    return (f"the gate order of the {depth}-layer gated nets removes first {counted} of {len(records)} seeds; the mean k "
            f"of each layer's two branches, shallowest first: " + ", ".join(f"{k:.3f}" for k in per_layer))


def report_markdown(summary: dict[str, Any]) -> str:
    """table.md: the tables, then the findings."""
    return table_markdown(summary) + "\nFindings\n\n" + findings_markdown(summary)


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md, findings.md and transformer_gates.png from `out`/results.json alone; return the
    table text."""
    from ..report.transformer_gates_plots import plot_transformer_gates

    return remake_report(out, report_markdown, [(plot_transformer_gates, "transformer_gates.png")], findings=findings_markdown)


# The study as the study machinery runs it (study.runner): one run per worker process, analysed in the worker
# that trained it (analysis.json); the summary and report rewritten at most every 30 s as runs end. `run` trains it
# (resumable), `report_finished` rebuilds its summary from the run folders as they stand.
STUDY = Study(NAME, Config, specs, summarize, write_report, stacked=False, analyse=analyse_run, min_interval_s=30.0)
run = STUDY.run
report_finished = STUDY.rebuild


# ---- --estimate -----------------------------------------------------------------------------------------

def _step_seconds(config: Config, depth: int, steps: int) -> float:
    model = seeded_model("vit_patch", 0, depth=depth, width=config.width, heads=config.heads, gate="relu")
    recipe = get_recipe(config.recipe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    x, y = torch.rand(recipe.batch_size, 784), torch.randint(0, 10, (recipe.batch_size,))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def _evaluations(depth: int) -> int:
    """The distinct removals the analysis of one net evaluates on the test split (an upper bound): every
    subset of n layers where the random baseline is exact, else each order's n layers."""
    total = 0
    for n in range(1, depth + 1):
        count = math.comb(depth, n)
        total += count if count <= MAX_EXACT_SUBSETS else len(CRITERIA) + RANDOM_ORDERS
    return total


def estimate(config: Config, jobs: int = 1, steps: int = 3) -> dict[str, Any]:
    """Project the study's wall time on this machine without training it: one training step per depth
    timed (median of `steps`, the recipe's batch, one thread per worker as `run` gives them), times
    every run's steps, plus the evaluations during training and the analysis after it in training-step
    equivalents (a forward pass over B images ≈ B / batch / 3 steps: 20,000 images an epoch; the
    removals on the 10,000 test images; the calibration passes of the criteria), spread over `jobs`."""
    torch.set_num_threads(1)
    batch = get_recipe(config.recipe).batch_size
    train = _training_images(config)
    test = 10000 if config.limit is None else min(config.limit, 10000)
    per_run, analysis = {}, {}
    for depth in sorted(config.depths):
        step = _step_seconds(config, depth, steps)
        training = config.epochs * (len(epoch_starts(train, batch)) + 2 * test / batch / 3)
        calibration = (2 + (depth + 1) + depth * (depth + 1) / 2 + depth) * config.calibration_images / batch / 3
        analysis[depth] = (_evaluations(depth) * test / batch / 3 + calibration) * step
        per_run[depth] = training * step + analysis[depth]
    runs = len(config.families) * config.seeds
    total = sum(per_run.values()) * runs
    return {"per_run_s": per_run, "analysis_s": analysis, "runs": runs * len(config.depths), "cpu_s": total,
            "jobs": jobs, "wall_s": total / max(1, jobs)}


def estimate_text(config: Config, jobs: int = 1) -> str:
    """`estimate` as a table and a projected wall time."""
    projection = estimate(config, jobs)
    lines = [f"{NAME}: {len(config.families)} families x {len(config.depths)} depth(s) x {config.seeds} seeds, width "
             f"{config.width}, {config.epochs} epochs on {_training_images(config):,} training images", "",
             *table_header(["layers", "parameters", "one run with its analysis (min)", "of which analysis (min)"])]
    lines += [table_row([d, f"{_parameters(config, d):,}", f"{s / 60:.1f}", f"{projection['analysis_s'][d] / 60:.1f}"])
              for d, s in projection["per_run_s"].items()]
    lines += ["", f"{projection['runs']} runs: about {projection['wall_s'] / 3600:.2f} h on {jobs} worker(s) "
              f"(one thread each)"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The study's command-line options: one per Config field, and --estimate."""
    add_options(parser, Config)
    parser.add_argument("--estimate", action="store_true",
                        help="train nothing: time one training step per depth and print the projected duration")

