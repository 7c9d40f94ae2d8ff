"""The report of `reproduce gate-family` (issue 24): error, paired tests, gates at the end, removal curves.

Everything here reads a finished (or partly finished) gate-family folder: the summary in results.json
(`gate_family.summarize`), and for the gates and the removal curves the runs' model.safetensors. Each
table is one markdown function that returns text, so the docs page can take them one by one:

* `gate_family.table_markdown`: test error by depth and family (mean ± std, best seed, "pending");
* `comparisons_markdown`: paired t-tests of gated against every other family, seed by seed;
* `gate_values_markdown`: the gates at the end by depth (mean k, mean α, mean |λ|; dead and negative);
* `removal_markdown`: the share of test accuracy kept after removing half the blocks, smallest |gate|
  first and in random orders (gated-residual-v2 §3.1's experiment, for every gated kind), and the
  paired t-test of the two orders over seeds (`removal_comparisons`).

Gate values are read with `block.gate.k` (the raw parameter: k, α or the vector λ) and `block.gate.value()`
(what scales the branch: relu(k), α, λ), so LayerScale's vector gate is handled like the scalar ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import torch
from torch import nn

from .._io import atomic_write_json, read_json
from ..analysis.removal import removal_curve, removal_order
from ..data import load_dataset
from ..report.stats import (MIN_PAIRS_FOR_VERDICT, SIGNIFICANCE, format_mean_std, mean_std, paired_by_seed,
                           paired_verdict)
from ..train import load_model
from ..train.loop import evaluate

__all__ = ["SIGNIFICANCE", "MIN_SEEDS", "GATE_SYMBOL", "REMOVAL_FILE", "gated_comparisons", "comparisons_markdown",
           "block_gates", "gate_record", "gate_values_markdown", "removal_record",
           "update_removal", "removal_comparisons", "removal_markdown"]

MIN_SEEDS = MIN_PAIRS_FOR_VERDICT  # fewer paired seeds than this: "too few", no verdict (issue 24)
# What the report calls each family's gate at the end: the raw parameter of its blocks.
GATE_SYMBOL = {"gated": "k", "gated-nf": "k", "rezero": "α", "rezero-nf": "α", "layerscale": "|λ|"}
REMOVAL_FILE = "removal.json"
MODEL_FILE = "model.safetensors"


# ----------------------------------------------------------------------------------------------------------
# Paired t-tests of gated against each other family

def gated_comparisons(summary: dict[str, Any], other: str, reference: str = "gated") -> list[dict[str, Any]]:
    """Per depth, the paired t-test (report.stats.paired_t_test, two-sided) of `reference` − `other`
    last-epoch test error over the seeds both finished. Verdict: "too few" with fewer than `MIN_SEEDS`
    pairs (no test is read), "<family> better" at p < `SIGNIFICANCE`, else "no significant difference"."""
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    rows = []
    for depth in summary["config"]["depths"]:
        if (reference, depth) not in by or (other, depth) not in by:
            continue
        first = {r["seed"]: r["test_error_pct"] for r in by[(reference, depth)]["per_seed"]}
        second = {r["seed"]: r["test_error_pct"] for r in by[(other, depth)]["per_seed"]}
        seeds, test = paired_by_seed(first, second)
        if len(seeds) < MIN_SEEDS:
            verdict = "too few"
        elif test.p_value is not None and test.p_value < SIGNIFICANCE and test.mean_difference:
            verdict = f"{reference} better" if test.mean_difference < 0 else f"{other} better"
        else:
            verdict = "no significant difference"
        rows.append({"depth": depth, "a": reference, "b": other, "seeds": seeds, "test": test.to_dict(),
                     "verdict": verdict})
    return rows


def comparisons_markdown(summary: dict[str, Any]) -> str:
    """The paired t-tests of gated against each family, one row per depth and family: pairs n, mean
    difference gated − other (percentage points of test error), p and the verdict."""
    rows = [r for r in summary.get("comparisons", []) if r["seeds"]]
    waiting: dict[int, list[str]] = {}  # depth -> families without a seed finished beside gated's
    for r in summary.get("comparisons", []):
        if not r["seeds"]:
            waiting.setdefault(r["depth"], []).append(r["b"])
    lines = ["Paired t-test (two-sided) of the last-epoch test error, gated − other, over the seeds both "
             f"finished (n pairs); a verdict only at p < {SIGNIFICANCE} with n ≥ {MIN_SEEDS}, \"too few\" below",
             "", "| d | other | n | gated − other (pp) | p | verdict |", "|---|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: (r["depth"], r["b"])):
        test = row["test"]
        diff = "—" if test["mean_difference"] is None else f"{test['mean_difference']:+.3f}"
        p = "—" if test["p_value"] is None or row["verdict"] == "too few" else f"{test['p_value']:.3g}"
        lines.append(f"| {row['depth']} | {row['b']} | {len(row['seeds'])} | {diff} | {p} | {row['verdict']} |")
    if not rows:
        lines.append("| — | — | 0 | — | — | pending |")
    if waiting:
        others = len({r["b"] for r in summary.get("comparisons", [])})
        parts = [f"d = {depth}: " + ("every family" if len(families) == others else ", ".join(sorted(families)))
                 for depth, families in sorted(waiting.items())]
        lines += ["", f"Pending (no seed finished for both gated and the other family): {'; '.join(parts)}."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------
# The gates at the end

def block_gates(model: nn.Module) -> list[torch.Tensor]:
    """The raw gate parameter of every block, in block order: k (gated), α (ReZero), λ (LayerScale,
    a vector per channel); float64 copies. Raises ValueError for a block without a `gate.k`."""
    out = []
    for index, block in enumerate(cast(nn.ModuleList, getattr(model, "blocks", []))):
        k = getattr(getattr(block, "gate", None), "k", None)
        if not isinstance(k, torch.Tensor):
            raise ValueError(f"block {index} ({type(block).__name__}) has no gate parameter k")
        out.append(k.detach().double().reshape(-1).cpu())
    return out


def gate_record(model: nn.Module, function: str) -> dict[str, Any]:
    """One model's gates at the end: `mean` (of k or α; of |λ| for a vector gate: the mean over blocks
    and channels), `per_block` (the same per block), `mean_abs` (the mean |gate| over all entries),
    and for g = relu the dead gates (k ≤ 0: relu(k)
    = 0, the block is an exact identity, gated-residual-v2 §2.2); for g = identity the negative gates
    (α < 0, or λ entries < 0: the branch is flipped in sign, not closed). `count` is the number of
    gates (blocks, or blocks × channels)."""
    gates = block_gates(model)
    vector = any(g.numel() > 1 for g in gates)
    per_block = [float(g.abs().mean()) if vector else float(g[0]) for g in gates]
    values = torch.cat(gates) if gates else torch.zeros(0, dtype=torch.float64)
    return {"mean": sum(per_block) / len(per_block) if per_block else None, "per_block": per_block,
            "mean_abs": float(values.abs().mean()) if len(values) else None,
            "vector": vector, "count": int(values.numel()),
            "dead": int((values <= 0).sum()) if function == "relu" else None,
            "negative": int((values < 0).sum()) if function == "identity" else None}


def gate_values_markdown(summary: dict[str, Any]) -> str:
    """The gates at the end by depth (rows) and gated family (columns): the mean over seeds of each
    model's mean gate (k, α, or |λ| over channels) ± std, and beside it the dead gates (g = relu:
    k ≤ 0) or negative gates (g = identity: α or λ_c < 0), summed over seeds, out of all gates; for
    ReZero also the mean |α| (positive and negative α cancel in the mean)."""
    families = [f for f in summary["config"]["families"] if f in GATE_SYMBOL]
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    lines = ["Gates at the end of training, mean over seeds ± std of each net's mean gate; dead = relu gate with "
             "k ≤ 0 (an exact identity), negative = identity gate below 0 (a sign flip, not a closed block)", "",
             "| d | " + " | ".join(f"{f} (mean {_cell(GATE_SYMBOL[f])})" for f in families) + " |",
             "|---|" + "---|" * len(families)]
    for depth in summary["config"]["depths"]:
        cells = []
        for family in families:
            gates = by[(family, depth)].get("gates") or []
            if not gates:
                cells.append("pending")
                continue
            stat = mean_std([g["mean"] for g in gates if g["mean"] is not None])
            total = sum(g["count"] for g in gates)
            dead = [g["dead"] for g in gates if g["dead"] is not None]
            negative = [g["negative"] for g in gates if g["negative"] is not None]
            extra = f"dead {sum(dead)}/{total}" if dead else f"negative {sum(negative)}/{total}"
            if negative and not gates[0]["vector"]:  # signs may cancel in the mean α: give the mean |α| too
                extra = f"mean \\|α\\| {sum(g['mean_abs'] for g in gates) / len(gates):.3g}, " + extra
            cells.append(f"{format_mean_std(stat, '.3g', '.2g')} ({extra}, n={stat['n']})")
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------
# Layer removal

def removal_record(model: nn.Module, metric: Callable[[nn.Module], float], orders: int = 3,
                   seed: int = 0) -> dict[str, Any]:
    """Test accuracy (%) of `model` with r = 0 .. all blocks physically removed (analysis.removal.prune),
    smallest |gate| first (analysis.removal.removal_order "greedy": ascending |g(k)|, mean |λ| for
    LayerScale) and in `orders` random orders from `seed`:
    `greedy` and `random` (each random curve) hold accuracy after r removals; `half_share_greedy` and
    `half_share_random` (mean over the random orders) hold accuracy at r = ⌊blocks/2⌋ over the full
    model's (gated-residual-v2 §3.1's "retains over 90% of its performance")."""
    count = len(cast(nn.ModuleList, model.blocks))
    greedy_order = removal_order(model, "greedy")
    greedy = removal_curve(model, greedy_order, metric)
    generator = torch.Generator().manual_seed(seed)
    random = [removal_curve(model, removal_order(model, "random", generator), metric) for _ in range(orders)]
    half = count // 2

    def share(curve: list[float]) -> float | None:
        return curve[half] / curve[0] if curve[0] > 0 else None

    shares = [s for s in (share(c) for c in random) if s is not None]
    return {"blocks": count, "half": half, "greedy_order": greedy_order, "greedy": greedy, "random": random,
            "half_share_greedy": share(greedy), "half_share_random": sum(shares) / len(shares) if shares else None}


def _test_accuracy(split: Any) -> Callable[[nn.Module], float]:
    return lambda model: 100.0 - evaluate(model, split)[1]


def update_removal(out: str | os.PathLike[str], runs: Sequence[tuple[str, dict[str, Any]]], *, orders: int = 3,
                   device: str = "cpu", data_dir: str | None = None) -> dict[str, Any]:
    """Add to `out`/removal.json the removal record (`removal_record`, on the run's test split) of every
    finished run in `runs` ((name, run config) pairs) that it lacks; return the file's records by run
    name. Runs without a model.safetensors are skipped (not finished). Resumable: existing records are
    kept, and the file is rewritten after each new one."""
    out = Path(out)
    path = out / REMOVAL_FILE
    records: dict[str, Any] = read_json(path) if path.is_file() else {}
    splits: dict[tuple[Any, ...], Any] = {}
    for name, config in runs:
        model_path = out / "runs" / name / MODEL_FILE
        if name in records or not model_path.is_file():
            continue
        key = (config.get("dataset", "mnist"), bool(config.get("train_on_full")), config.get("limit"))
        if key not in splits:
            splits[key] = load_dataset(key[0], data_dir if data_dir is not None else config.get("data_dir"),
                                       train_on_full=key[1], device=device, limit=key[2]).test
        split = splits[key]
        model = load_model(model_path, device=device)
        model.eval()
        records[name] = removal_record(model, _test_accuracy(split), orders=orders)
        atomic_write_json(path, records)
    return records


def removal_comparisons(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per depth with at least two blocks to halve and per gated family, the paired t-test
    (report.stats.paired_t_test, two-sided) over seeds of the accuracy share LOST with ⌊blocks/2⌋ blocks
    removed, smallest |gate| first − random order (each net's mean over its random orders), so that a
    negative mean difference means the gate order keeps more. `kept_difference` is the gate order's share
    kept minus the random orders', in points (×100). Verdict (report.stats.paired_verdict): "gate order
    better", "random order better", "no significant difference", or "too few seeds" below
    MIN_PAIRS_FOR_VERDICT seeds. Cells without a finished seed are left out."""
    families = [f for f in summary["config"]["families"] if f in GATE_SYMBOL]
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    rows = []
    for depth in summary["config"]["depths"]:
        if depth // 2 < 2:
            continue
        for family in families:
            pairs = [(r["seed"], r["half_share_greedy"], r["half_share_random"]) for r in by[(family, depth)].get("removal") or []
                     if r["half_share_greedy"] is not None and r["half_share_random"] is not None]
            if not pairs:
                continue
            seeds, test = paired_by_seed({seed: 1.0 - greedy for seed, greedy, _ in pairs},
                                         {seed: 1.0 - random for seed, _, random in pairs})
            rows.append({"depth": depth, "family": family, "seeds": seeds, "test": test.to_dict(),
                         "kept_difference": None if test.mean_difference is None else -100.0 * test.mean_difference,
                         "verdict": paired_verdict(test, "gate order", "random order")})
    return rows


def removal_markdown(summary: dict[str, Any]) -> str:
    """The share of test accuracy kept with half the blocks removed, by depth and gated family: mean ±
    std over seeds, smallest |gate| first ("gate order") and in random orders (mean of each net's random
    orders); "pending" where no seed's model is there. d = 2 has a single block: half of it is none.
    Then the paired tests of the two orders (`removal_comparisons`), one row per depth and family."""
    families = [f for f in summary["config"]["families"] if f in GATE_SYMBOL]
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    lines = ["Share of test accuracy kept with ⌊blocks/2⌋ blocks removed (accuracy after / full accuracy), mean "
             "± std over seeds: smallest |gate| first / random order", "",
             "| d | " + " | ".join(families) + " |", "|---|" + "---|" * len(families)]
    for depth in summary["config"]["depths"]:
        if depth // 2 < 2:
            continue
        cells = []
        for family in families:
            removal = by[(family, depth)].get("removal") or []
            if not removal:
                cells.append("pending")
                continue
            greedy = mean_std([r["half_share_greedy"] for r in removal if r["half_share_greedy"] is not None])
            random = mean_std([r["half_share_random"] for r in removal if r["half_share_random"] is not None])
            cells.append(f"{_share(greedy)} / {_share(random)} (n={len(removal)})")
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    tests = removal_comparisons(summary)
    if tests:
        lines += ["", "Paired t-test (two-sided) over seeds of the share kept, smallest |gate| first − random order "
                  f"(points of test accuracy share, n seeds); a verdict only at p < {SIGNIFICANCE} with n ≥ "
                  f"{MIN_PAIRS_FOR_VERDICT}", "", "| d | family | n | gate order − random (pp) | p | verdict |",
                  "|---|---|---|---|---|---|"]
        for row in tests:
            test, few = row["test"], len(row["seeds"]) < MIN_PAIRS_FOR_VERDICT
            diff = "—" if row["kept_difference"] is None else f"{row['kept_difference']:+.2f}"
            p = "—" if test["p_value"] is None or few else f"{test['p_value']:.2g}"
            lines.append(f"| {row['depth']} | {row['family']} | {len(row['seeds'])} | {diff} | {p} | {row['verdict']} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """`text` inside a markdown table cell: its "|" escaped."""
    return text.replace("|", "\\|")


def _share(stat: dict[str, Any]) -> str:
    return format_mean_std(stat, ".3f")
