"""The report of `reproduce gate-family`: error, paired tests, gates at the end, removal curves.

Everything here reads a finished (or partly finished) gate-family folder: the summary in results.json
(`gate_family.summarize`), and for the gates and the removal curves the runs' model.safetensors. Each
table is one markdown function that returns text, so the docs page can take them one by one:

* `gate_family.table_markdown`: test error by depth and family (mean ± std, best seed, "pending");
* `comparisons_markdown`: paired t-tests of gated against every other family, seed by seed, with their 95%
  intervals, p uncorrected and corrected (report.stats.CORRECTION: Holm over the table's tests) and the
  difference each could detect with 80% power;
* `gate_values_markdown`: the gates at the end by depth (mean k, mean α, mean |λ|; dead and negative);
* `removal_markdown`: the share of test accuracy kept after removing half the blocks, smallest |gate|
  first and against random removal (gated-residual-v2 §3.1's experiment, for every gated kind): the exact
  mean over every subset of half the blocks where there are at most `MAX_EXACT_SUBSETS`, else random
  orders drawn for each net from its own recorded seed; and the paired t-test of the two over seeds
  (`removal_comparisons`).

Gate values are read with `block.gate.k` (the raw parameter: k, α or the vector λ) and `block.gate.value()`
(what scales the branch: relu(k), α, λ), so LayerScale's vector gate is handled like the scalar ones.
"""

from __future__ import annotations

import itertools
import math
import os
import zlib
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import torch
from torch import nn

from .._io import atomic_write_json, read_json
from ..analysis.removal import prune, removal_curve, removal_order
from ..data import load_dataset
from ..layers import find_branches
from ..report.stats import (CONFIDENCE, CORRECTION, MIN_PAIRS_FOR_VERDICT, NO_DIFFERENCE, POWER, SIGNIFICANCE,
                            TOO_FEW, difference_text, format_interval, format_mean_std, format_p, gated_comparisons,
                            judge, judged, judged_in_words, mean_std, paired_by_seed)
from ..train import load_model
from ..report.tables import paired_cells, paired_columns, table_header, table_row
from ..study.nets import test_accuracy

__all__ = ["SIGNIFICANCE", "MIN_SEEDS", "GATE_SYMBOL", "REMOVAL_FILE", "REMOVAL_SEED", "MAX_EXACT_SUBSETS",
           "judge", "comparisons", "pairwise_comparisons", "comparisons_markdown",
           "paired_columns", "paired_cells", "block_gates", "gate_record", "gate_values_markdown", "removal_seed",
           "removal_record", "update_removal", "removal_comparisons", "removal_baseline", "removal_markdown",
           "findings_markdown", "removal_rows", "removal_prose", "errors_prose", "finished_depths", "first_epoch_prose",
           "dataset_verdicts", "verdict_changes", "datasets_markdown"]

MIN_SEEDS = MIN_PAIRS_FOR_VERDICT  # fewer paired seeds than this: "too few seeds", no verdict
# What the report calls each family's gate at the end: the raw parameter of its blocks.
GATE_SYMBOL = {"gated": "k", "gated-nf": "k", "rezero": "α", "rezero-nf": "α", "layerscale": "|λ|"}
REMOVAL_FILE = "removal.json"
MODEL_FILE = "model.safetensors"


# ----------------------------------------------------------------------------------------------------------
# Paired t-tests of gated against each other family (report.comparisons.gated_comparisons: one per depth)

def comparisons(summary: dict[str, Any], reference: str = "gated") -> list[dict[str, Any]]:
    """The paired tests of `reference` against every other family at every depth (`gated_comparisons`,
    recomputed from the cells' per-seed errors, so that a summary written before the intervals existed
    reads the same) as one family (`report.stats.judge`: Holm over every judged test of the table), ordered by depth
    and family."""
    families = summary["config"]["families"]
    if reference not in families:
        return []
    rows = [row for other in families if other != reference for row in gated_comparisons(summary, other, reference)]
    return judge(sorted(rows, key=lambda r: (r["depth"], r["b"])))


def pairwise_comparisons(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pair of families at every depth (a before b in the config's order): the paired test of
    a − b last-epoch test error over the seeds both finished, all of them one family (`report.stats.judge`: Holm over
    every judged test). What a sentence about the families' errors in general rests on, not only gated's."""
    families = summary["config"]["families"]
    rows = [row for i, a in enumerate(families) for b in families[i + 1:] for row in gated_comparisons(summary, b, a)]
    return judge(sorted(rows, key=lambda r: (r["depth"], families.index(r["a"]), families.index(r["b"]))))


def comparisons_markdown(summary: dict[str, Any]) -> str:
    """The paired t-tests of gated against each family (`comparisons`), one row per depth and family:
    pairs n, mean difference gated − other (percentage points of test error), its 95% interval, p
    uncorrected and Holm-corrected over the table's tests, the difference the test detects with 80%
    power, and the verdict at the corrected p."""
    every = comparisons(summary)
    rows = [r for r in every if r["seeds"]]
    waiting: dict[int, list[str]] = {}  # depth -> families without a seed finished beside gated's
    for r in every:
        if not r["seeds"]:
            waiting.setdefault(r["depth"], []).append(r["b"])
    tested = sum(1 for r in rows if r["p_corrected"] is not None)
    lines = ["Paired t-test (two-sided) of the last-epoch test error, gated − other, over the seeds both "
             f"finished (n pairs), in points: the mean difference, its {CONFIDENCE:.0%} confidence interval, p "
             f"uncorrected and {CORRECTION}-corrected over this table's {tested} tests, and the smallest difference "
             f"the test detects with {POWER:.0%} power at p < {SIGNIFICANCE} (at the observed spread); a verdict "
             f"only at {CORRECTION}-corrected p < {SIGNIFICANCE} with n ≥ {MIN_SEEDS}, \"{TOO_FEW}\" below",
             "", *table_header(["d", "other", "n", *paired_columns("gated − other")])]
    for row in rows:
        lines.append(table_row([row["depth"], row["b"], len(row["seeds"]), *paired_cells(row)]))
    if not rows:
        lines.append(table_row(["—", "—", 0, "—", "—", "—", "—", "—", "pending"]))
    if waiting:
        others = len({r["b"] for r in every})
        parts = [f"d = {depth}: " + ("every family" if len(families) == others else ", ".join(sorted(families)))
                 for depth, families in sorted(waiting.items())]
        lines += ["", f"Pending (no seed finished for both gated and the other family): {'; '.join(parts)}."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------
# The gates at the end

def block_gates(model: nn.Module) -> list[torch.Tensor]:
    """The raw gate parameter of every gated branch, in branch order (`layers.find_branches`): k (gated),
    α (ReZero), λ (LayerScale, a vector per channel); float64 copies. ValueError naming the first branch
    without a gate parameter."""
    out = []
    for name, ref in find_branches(model).items():
        k = getattr(ref.gate, "k", None)
        if not isinstance(k, torch.Tensor):
            raise ValueError(f"branch {name!r} ({type(model.get_submodule(ref.block)).__name__}) has no gate "
                             f"parameter k")
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
             *table_header(["d", *(f"{f} (mean {_cell(GATE_SYMBOL[f])})" for f in families)])]
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
        lines.append(table_row([depth, *cells]))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------
# Layer removal

# The random baseline: the exact mean over every subset of ⌊blocks/2⌋ removable blocks where there are at most
# this many (d = 10: 10 subsets, d = 20: 252; a 4-layer transformer: 6), else the mean of the random orders.
MAX_EXACT_SUBSETS = 256
# The study-level seed from which each net's random orders are drawn (`removal_seed`: one stream per net).
REMOVAL_SEED = 0
# What the removal is computed on: the run's model.safetensors, written at the end of training.
REMOVAL_WEIGHTS = "last epoch"


def removal_seed(name: str, base: int = REMOVAL_SEED) -> int:
    """The seed of net `name`'s random removal orders: CRC-32 of "<base>/<name>", so that every net draws its
    own orders (independent of the other nets', reproducible from `base` and its name, whatever the order in
    which the nets are analysed)."""
    return zlib.crc32(f"{base}/{name}".encode())


def removal_record(model: nn.Module, metric: Callable[[nn.Module], float], orders: int = 3, seed: int = 0,
                   max_exact: int = MAX_EXACT_SUBSETS) -> dict[str, Any]:
    """Test accuracy (%) of `model` with r = 0 .. all blocks physically removed (analysis.removal.prune),
    smallest |gate| first (analysis.removal.removal_order "greedy": ascending |g(k)|, mean |λ| for
    LayerScale) and in `orders` random orders drawn from a generator seeded with `seed` (the caller gives
    each net its own: `removal_seed`): `greedy` and `random` (each random curve) hold accuracy after r
    removals; `half_share_greedy` holds accuracy at r = half = ⌊blocks/2⌋ over the full model's
    (gated-residual-v2 §3.1's "retains over 90% of its performance"). `half_share_random` is the random
    baseline at r = half: the exact mean over all C(removable, half) subsets where there are at most
    `max_exact` (`half_random` = "exact", `half_subsets` their number), else the mean over the random
    orders (`half_random` = "orders"). `random_seed` records `seed`."""
    count = len(cast(nn.ModuleList, model.blocks))
    greedy_order = removal_order(model, "greedy")
    greedy = removal_curve(model, greedy_order, metric)
    generator = torch.Generator().manual_seed(seed)
    random = [removal_curve(model, removal_order(model, "random", generator), metric) for _ in range(orders)]
    half = count // 2

    def share(curve: list[float]) -> float | None:
        return curve[half] / curve[0] if curve[0] > 0 else None

    removable = sorted(greedy_order)  # the greedy order holds every removable block once
    subsets = math.comb(len(removable), half)
    baseline: float | None
    if 0 < half <= len(removable) and subsets <= max_exact and greedy[0] > 0:
        # every subset of `half` blocks, each once: the expectation over random orders, without sampling
        kept = [float(metric(prune(model, list(subset)))) for subset in itertools.combinations(removable, half)]
        baseline, kind = sum(kept) / len(kept) / greedy[0], "exact"
    else:
        shares = [s for s in (share(c) for c in random) if s is not None]
        baseline, kind, subsets = (sum(shares) / len(shares) if shares else None), "orders", 0
    return {"blocks": count, "half": half, "greedy_order": greedy_order, "greedy": greedy, "random": random,
            "random_seed": seed, "half_random": kind, "half_subsets": subsets, "weights": REMOVAL_WEIGHTS,
            "half_share_greedy": share(greedy), "half_share_random": baseline}


def update_removal(out: str | os.PathLike[str], runs: Sequence[tuple[str, dict[str, Any]]], *, orders: int = 3,
                   device: str = "cpu", data_dir: str | None = None, seed: int = REMOVAL_SEED,
                   redo_shared_orders: bool = False) -> dict[str, Any]:
    """Add to `out`/removal.json the removal record (`removal_record`, on the run's test split, random
    orders from `removal_seed(name, seed)`) of every finished run in `runs` ((name, run config) pairs)
    that it lacks; return the file's records by run name. Runs without a model.safetensors are skipped
    (not finished). With `redo_shared_orders`, records made before each net drew its own orders (no
    "random_seed": every net of a depth had the same permutations) are computed again. Resumable:
    existing records are kept, and the file is rewritten after each new one."""
    out = Path(out)
    path = out / REMOVAL_FILE
    records: dict[str, Any] = read_json(path) if path.is_file() else {}
    splits: dict[tuple[Any, ...], Any] = {}
    for name, config in runs:
        model_path = out / "runs" / name / MODEL_FILE
        stale = redo_shared_orders and name in records and "random_seed" not in records[name]
        if (name in records and not stale) or not model_path.is_file():
            continue
        key = (config.get("dataset", "mnist"), bool(config.get("train_on_full")), config.get("limit"))
        if key not in splits:
            splits[key] = load_dataset(key[0], data_dir if data_dir is not None else config.get("data_dir"),
                                       train_on_full=key[1], device=device, limit=key[2]).test
        split = splits[key]
        model = load_model(model_path, device=device)
        model.eval()
        records[name] = removal_record(model, test_accuracy(split), orders=orders, seed=removal_seed(name, seed))
        atomic_write_json(path, records)
    return records


def removal_comparisons(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per depth with at least two blocks to halve and per gated family, the paired t-test
    (report.stats.paired_t_test, two-sided) over seeds of the accuracy share LOST with ⌊blocks/2⌋ blocks
    removed, smallest |gate| first − random removal (each net's `half_share_random`), so that a negative
    mean difference means the gate order keeps more. `kept_difference` is the gate order's share kept
    minus the random baseline's, in points (×100). The rows are one family (`report.stats.judge`: Holm over the judged
    tests): "gate order better", "random order better", "no difference detected", or "too few seeds"
    below MIN_PAIRS_FOR_VERDICT seeds. Cells without a finished seed are left out."""
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
            rows.append({"depth": depth, "family": family, "a": "gate order", "b": "random order", "seeds": seeds,
                         "test": test.to_dict(),
                         "kept_difference": None if test.mean_difference is None else -100.0 * test.mean_difference})
    return judge(rows)


def removal_baseline(summary: dict[str, Any], error_weights: str = REMOVAL_WEIGHTS, depth_unit: str = "d") -> str:
    """What the random baseline of the removal records in `summary` is, by depth, in one sentence: the
    exact mean over all subsets, or the mean of random orders drawn for each net from its own seed, or
    (records made before each net drew its own orders) the same permutations for every net of a depth;
    then the weights the removal used (each run's model.safetensors: its last epoch), against
    `error_weights`, the epoch whose test error the study's error table reports. Depths are said as
    "d = 10, 20" (`depth_unit` "d") or "4 layers" (`depth_unit` "layers")."""
    records = [(c["depth"], r) for c in summary["cells"] for r in c.get("removal") or [] if c["depth"] // 2 >= 2]
    if not records:
        return "No removal record yet."
    kinds: dict[str, list[int]] = {}
    for depth, record in records:
        orders = f"{len(record['random'])} random orders" if record.get("random") else "random orders"
        if "random_seed" not in record:
            kind = (f"the mean of {orders}, the same permutations for every net of a depth (records made before "
                    "each net drew its own)")
        elif record.get("half_random") == "exact":
            kind = f"the exact mean over all {record['half_subsets']} subsets of {record['half']} blocks"
        else:
            kind = f"the mean of {orders} drawn for each net from its own seed"
        kinds.setdefault(kind, [])
        if depth not in kinds[kind]:
            kinds[kind].append(depth)
    weights = sorted({r.get("weights", REMOVAL_WEIGHTS) for _, r in records})
    def depths_text(depths: list[int]) -> str:
        listed = ", ".join(map(str, sorted(depths)))
        return f"d = {listed}" if depth_unit == "d" else f"{listed} {depth_unit}"

    said = "; ".join(f"{depths_text(depths)}: {kind}" for kind, depths in kinds.items())
    where = ("the weights whose test error the error table reports" if weights == [error_weights] else
             f"the error table reports the test error at the {error_weights}, not these weights'")
    return (f"Random baseline at half the blocks removed: {said}. Removal on the {' and '.join(weights)}'s "
            f"weights (model.safetensors), {where}.")


def removal_markdown(summary: dict[str, Any]) -> str:
    """The share of test accuracy kept with half the blocks removed, by depth and gated family: mean ±
    std over seeds, smallest |gate| first ("gate order") and the random baseline (`removal_record`);
    "pending" where no seed's model is there. d = 2 has a single block: half of it is none. Then the
    paired tests of the two (`removal_comparisons`), one row per depth and family, with intervals, p
    uncorrected and Holm-corrected, detectable differences and the verdict at the corrected p."""
    families = [f for f in summary["config"]["families"] if f in GATE_SYMBOL]
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    lines = ["Share of test accuracy kept with ⌊blocks/2⌋ blocks removed (accuracy after / full accuracy), mean "
             "± std over seeds: smallest |gate| first / random removal. " + removal_baseline(summary), "",
             *table_header(["d", *families])]
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
        lines.append(table_row([depth, *cells]))
    tests = removal_comparisons(summary)
    if tests:
        tested = sum(1 for r in tests if r["p_corrected"] is not None)
        lines += ["", "Paired t-test (two-sided) over seeds of the share kept, smallest |gate| first − random removal, "
                  f"in points of test accuracy share: the mean difference, its {CONFIDENCE:.0%} confidence interval, p "
                  f"uncorrected and {CORRECTION}-corrected over this table's {tested} tests, and the smallest difference "
                  f"the test detects with {POWER:.0%} power; a verdict only at {CORRECTION}-corrected p < "
                  f"{SIGNIFICANCE} with n ≥ {MIN_PAIRS_FOR_VERDICT}", "",
                  *table_header(["d", "family", "n", *paired_columns("gate order − random")])]
        for row in tests:
            lines.append(table_row([row["depth"], row["family"], len(row["seeds"]),
                                    *paired_cells(row, "+.2f", -100.0, 2)]))
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """`text` inside a markdown table cell: its "|" escaped."""
    return text.replace("|", "\\|")


def _share(stat: dict[str, Any]) -> str:
    return format_mean_std(stat, ".3f")


# ----------------------------------------------------------------------------------------------------------
# Findings: the sentences the docs page shows (findings.md and the page's prose), each saying exactly what
# the tests above support

RELU_FAMILIES = ("gated", "gated-nf")  # relu(k) gates: k ≤ 0 closes a block exactly


def finished_depths(summary: dict[str, Any]) -> list[int]:
    """The depths at which every family finished all its seeds."""
    seeds = summary["config"]["seeds"]
    return [d for d in summary["config"]["depths"]
            if all(c["test_error_pct"]["n"] == seeds for c in summary["cells"] if c["depth"] == d)]


def _verdict_phrase(row: dict[str, Any]) -> str:
    """A paired test of a against b that its corrected p calls significant, in words: "gated better than
    rezero" or "rezero better than gated"."""
    winner = row["verdict"].replace(" better", "")
    return f"{winner} better than {row['b'] if winner == row['a'] else row['a']}"


def findings_markdown(summary: dict[str, Any]) -> str:
    """One line per finished depth: the families with the lowest and highest mean test error, and what
    the paired tests of gated against each family say (`comparisons`: Holm over the table's tests): the
    significant ones named with their difference, interval and both p; those significant only
    uncorrected said so; the rest "no difference detected" with their 95% intervals and the differences
    the tests could detect. Then the count after the correction, the tests of every pair of families
    (`pairwise_comparisons`), the removal tests (`_removal_findings`) and the depths still training.
    What `throughway report` writes as findings.md and the docs page shows."""
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    done = finished_depths(summary)
    table = comparisons(summary)
    # the lines on every pair of families and on removal, said after the depths' lines
    pairs, removal = _pairwise_findings(summary, done), _removal_findings(summary, done)
    lines = []
    for depth in done:
        means = {f: by[(f, depth)]["test_error_pct"] for f in summary["config"]["families"]}
        best = min(means, key=lambda f: means[f]["mean"])
        worst = max(means, key=lambda f: means[f]["mean"])
        rows = [r for r in table if r["depth"] == depth and judged(r["test"])]
        parts = judged_in_words(rows, _verdict_phrase, detectable=True)
        lines.append(f"- **d = {depth}**: lowest mean test error {best} {format_mean_std(means[best])}, highest "
                     f"{worst} {format_mean_std(means[worst])}; "
                     f"gated against each family (paired, n = {len(rows[0]['seeds']) if rows else 0}; gated − other in "
                     "points): " + "; ".join(parts) + ".")
    tested = [r for r in table if r["depth"] in done and r["p_corrected"] is not None]
    if tested:
        passing = [r for r in tested if r["p_corrected"] < SIGNIFICANCE]
        below = [r for r in tested if r["test"]["p_value"] < SIGNIFICANCE]
        named = "; ".join(f"{_verdict_phrase(r)} at d = {r['depth']} ({CORRECTION} p = {format_p(r['p_corrected'])})"
                          for r in passing)
        lines.append(f"- {CORRECTION}'s correction over the {len(tested)} paired tests of gated against each family: "
                     f"{len(passing)} of the {len(tested)} significant" + (f" ({named})" if passing else "")
                     + f"; {len(below)} at uncorrected p < {SIGNIFICANCE}.")
    lines += pairs + removal
    pending = [d for d in summary["config"]["depths"] if d not in done]
    if not done:
        lines.append("- No depth has finished every family and seed yet.")
    if pending:
        lines.append(f"- Pending (not every family and seed finished): d = {', '.join(map(str, pending))}.")
    return "\n".join(lines) + "\n"


def _pairwise_findings(summary: dict[str, Any], done: list[int]) -> list[str]:
    """One line on the paired tests of every pair of families at the finished depths (Holm over all of
    them): how many are significant, which, and how many only uncorrected."""
    rows = [r for r in pairwise_comparisons(summary) if r["depth"] in done and judged(r["test"])]
    if not rows:
        return []
    judge(rows)  # the family is the finished depths' tests
    passing = [r for r in rows if r["verdict"] not in (NO_DIFFERENCE, TOO_FEW)]
    below = [r for r in rows if r not in passing and r["test"]["p_value"] < SIGNIFICANCE]
    families = len(summary["config"]["families"])
    return [f"- **Every pair of families** ({families * (families - 1) // 2} pairs at each of {len(done)} depths, "
            f"{len(rows)} paired tests of the last-epoch test error, {CORRECTION} over all {len(rows)}): "
            + (f"{len(passing)} significant: " + "; ".join(
                f"{_verdict_phrase(r)} at d = {r['depth']} ({difference_text(r)})" for r in passing)
               if passing else f"none significant after {CORRECTION}")
            + (f". Significant at uncorrected p < {SIGNIFICANCE} only ({NO_DIFFERENCE} after {CORRECTION}): {len(below)} "
               "more, " + "; ".join(f"d = {depth}: " + ", ".join(
                   f"{r['a']} − {r['b']} {r['test']['mean_difference']:+.2f} (p = {format_p(r['test']['p_value'])})"
                   for r in below if r["depth"] == depth) for depth in dict.fromkeys(r["depth"] for r in below))
               if below else "") + "."]


def _removal_findings(summary: dict[str, Any], done: list[int]) -> list[str]:
    """One line on the paired tests of removal orders at the finished depths (removal_comparisons, Holm
    over them): per gated family, the depths where removing the smallest |gate| first keeps significantly
    more (or less) accuracy than random removal after the correction, with the difference, interval and
    both p; the depths significant only uncorrected; then the count, and the random baseline used.
    Nothing when no depth with two or more blocks has finished."""
    rows = removal_rows(summary)
    if not rows:
        return []
    parts = []
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        significant = [r for r in mine if r["verdict"] not in (NO_DIFFERENCE, TOO_FEW)]
        uncorrected = [r for r in mine if r not in significant and r["test"]["p_value"] < SIGNIFICANCE]
        said = [f"d = {r['depth']} {r['verdict']} by {_kept(r)}" for r in significant]
        said += [f"d = {r['depth']} significant only uncorrected {_kept(r)}" for r in uncorrected]
        rest = [r for r in mine if r not in significant and r not in uncorrected]
        if rest:
            said.append(f"{NO_DIFFERENCE} at d = {', '.join(str(r['depth']) for r in rest)}")
        parts.append(f"{family}: " + ", ".join(said))
    passing = [r for r in rows if r["verdict"] not in (NO_DIFFERENCE, TOO_FEW)]
    named = "; ".join(f"{family} at d = {', '.join(str(r['depth']) for r in passing if r['family'] == family)}"
                      for family in dict.fromkeys(r["family"] for r in passing))
    return [f"- **Removal** (half the blocks, paired over seeds: share of accuracy kept with the smallest |gate| "
            f"removed first − with random removal, in points, {CORRECTION} over the {len(rows)} tests): "
            f"{'; '.join(parts)}. {len(passing)} of the {len(rows)} significant after {CORRECTION}"
            + (f" ({named})." if passing else ".") + " " + removal_baseline(summary)]


def _kept(row: dict[str, Any]) -> str:
    """A removal test's difference in share kept (points), its interval and both p."""
    test = row["test"]
    return (f"{row['kept_difference']:+.1f} points ({CONFIDENCE:.0%} CI "
            f"{format_interval(-100.0 * test['ci_high'], -100.0 * test['ci_low'], '+.1f')}, p = "
            f"{format_p(test['p_value'])}, {CORRECTION} p = {format_p(row['p_corrected'])})")


def removal_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The removal tests at the finished depths that are judged (n ≥ MIN_SEEDS), as one family (`report.stats.judge`:
    Holm over them)."""
    done = finished_depths(summary)
    return judge([r for r in removal_comparisons(summary) if r["depth"] in done and judged(r["test"])])


def removal_prose(summary: dict[str, Any]) -> str:
    """What the removal tests say after Holm's correction, by family and depth; which are significant only
    uncorrected; the size of the gains, relu gates against identity gates (with intervals; not compared by
    a test); then the gated net's dead gates per seed at the deepest depth against the blocks its gate
    order removes, with the accuracy its half-pruned nets lose."""
    rows = removal_rows(summary)
    if not rows:
        return "Pending: no removal test at a finished depth yet."
    passing = [r for r in rows if r["verdict"] == "gate order better"]
    worse = [r for r in rows if r["verdict"] == "random order better"]
    by_family = {f: [r["depth"] for r in passing if r["family"] == f] for f in dict.fromkeys(r["family"] for r in passing)}
    survived = "; ".join(f"{f} at d = {', '.join(map(str, depths))}" for f, depths in by_family.items())
    only = [r for r in rows if r["kept_difference"] > 0 and r not in passing and r["test"]["p_value"] < SIGNIFICANCE]
    text = (f"Corrected by {CORRECTION} over the {len(rows)} removal tests, removing the smallest gate first keeps "
            f"significantly more than random removal for {survived or 'no family'}.")
    if worse:
        text += (" It keeps significantly less for " + ", ".join(f"{r['family']} at d = {r['depth']}" for r in worse) + ".")
    if only:
        text += (f" Significant at uncorrected p < {SIGNIFICANCE} only ({NO_DIFFERENCE} after {CORRECTION}): "
                 + ", ".join(f"{r['family']} at d = {r['depth']} (p = {format_p(r['test']['p_value'])}, {CORRECTION} p = "
                             f"{format_p(r['p_corrected'])})" for r in only) + ".")
    relu = [r for r in passing if r["family"] in RELU_FAMILIES]
    other = [r for r in passing if r["family"] not in RELU_FAMILIES]
    if relu and other:
        text += (f" Where they pass, the relu gates' gains are {min(r['kept_difference'] for r in relu):+.1f} to "
                 f"{max(r['kept_difference'] for r in relu):+.1f} points (95% CIs from "
                 f"{min(-100 * r['test']['ci_high'] for r in relu):+.1f} to {max(-100 * r['test']['ci_low'] for r in relu):+.1f}),"
                 f" the identity gates' {min(r['kept_difference'] for r in other):+.1f} to "
                 f"{max(r['kept_difference'] for r in other):+.1f} (from {min(-100 * r['test']['ci_high'] for r in other):+.1f} "
                 f"to {max(-100 * r['test']['ci_low'] for r in other):+.1f}); the sizes are not compared by a test.")
    deepest = max(finished_depths(summary))
    cell = next((c for c in summary["cells"] if c["family"] == "gated" and c["depth"] == deepest), None)
    if cell and cell.get("removal"):
        dead = [p["dead_gates"] for p in cell["per_seed"]]
        records = cell["removal"]
        half = records[0]["half"]
        shares = [r["half_share_greedy"] for r in records]
        lost = {r["seed"]: r["greedy"][0] - r["greedy"][half] for r in records}
        worst = max(lost, key=lambda s: lost[s])
        live = sum(1 for n in dead if n < half)
        text += (f" At d = {deepest} the gated net with BatchNorm keeps {min(shares):.3f} to {max(shares):.3f} of its "
                 f"accuracy with {half} of its {records[0]['blocks']} blocks removed smallest k first. Its dead "
                 f"gates (k ≤ 0: blocks already closed) number {', '.join(map(str, dead))} in the {len(dead)} seeds, so in "
                 f"{live} of {len(dead)} seeds the removed half also takes live blocks, those of smallest k; the "
                 f"half-pruned nets' test accuracy changes by {-max(lost.values()):+.2f} to {-min(lost.values()):+.2f} "
                 f"points (the largest loss in seed {worst}).")
    return text


def errors_prose(summary: dict[str, Any]) -> str:
    """What the paired tests of the test error say at the finished depths, in two sentences: the tests of
    gated against each family that survive Holm's correction (`comparisons`), the family with the lowest
    mean error where it is not gated, with the intervals of gated − it; then how many of the tests of every
    pair of families (`pairwise_comparisons`, Holm over all of them) detect a difference, and which."""
    done = finished_depths(summary)
    if not done:
        return "Pending: no depth has finished every family and seed."
    table = judge([r for r in comparisons(summary) if r["depth"] in done and judged(r["test"])])
    passing = [r for r in table if r["verdict"] not in (NO_DIFFERENCE, TOO_FEW)]
    text = (f"Of the {len(table)} paired tests of gated against each family, {len(passing)} detect"
            f"{'s' if len(passing) == 1 else ''} a difference after {CORRECTION}'s correction"
            + (": " + "; ".join(f"{_verdict_phrase(r)} at d = {r['depth']} ({CORRECTION} p = {format_p(r['p_corrected'])})"
                                for r in passing) if passing else "") + ".")
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    lowest: dict[str, list[int]] = {}
    for depth in done:
        means = {f: by[(f, depth)]["test_error_pct"]["mean"] for f in summary["config"]["families"]}
        lowest.setdefault(min(means, key=lambda f: means[f]), []).append(depth)
    for family, depths in lowest.items():
        if family == "gated":
            continue
        rows = [r for r in table if r["b"] == family and r["depth"] in depths]
        quiet = [r for r in rows if r["verdict"] == NO_DIFFERENCE]
        text += (f" {family} has the lowest mean error at d = {', '.join(map(str, depths))}"
                 + (f"; against gated {NO_DIFFERENCE} there (gated − {family}, 95% CI "
                    + ", ".join(f"{format_interval(r['test']['ci_low'], r['test']['ci_high'])} at d = {r['depth']}"
                                for r in quiet) + ")" if quiet else "") + ".")
    pairs = [r for r in pairwise_comparisons(summary) if r["depth"] in done and judged(r["test"])]
    judge(pairs)
    detected = [r for r in pairs if r["verdict"] not in (NO_DIFFERENCE, TOO_FEW)]
    text += (f" Over every pair of families ({len(pairs)} tests, {CORRECTION} over all of them), {len(detected)} "
             f"detect{'s' if len(detected) == 1 else ''} a difference"
             + (": " + "; ".join(f"{_verdict_phrase(r)} at d = {r['depth']} ({CORRECTION} p = "
                                 f"{format_p(r['p_corrected'])})" for r in detected) if detected else "")
             + f"; in the others {NO_DIFFERENCE}, which is not equality (their intervals, and the differences the "
             "tests could detect, are in the findings and the table).")
    return text


def first_epoch_prose(summary: dict[str, Any]) -> str:
    """The families whose first epoch's loss ran into the thousands at the deepest depth, whether they
    finished, and where their final error ranks among the families there."""
    deepest = max(finished_depths(summary))
    seeds = range(summary["config"]["seeds"])
    first = {f: [summary["curves"][f"{f}-d{deepest}-s{s}"]["train_loss"][0] for s in seeds]
             for f in summary["config"]["families"]}
    blown = [f for f, losses in first.items() if min(losses) >= 1000]
    if not blown:
        return f"At d = {deepest} no family's first-epoch loss reached 1,000."
    errors = {c["family"]: c["test_error_pct"]["mean"] for c in summary["cells"] if c["depth"] == deepest}
    ranked = sorted(errors, key=lambda f: -errors[f])
    states = {r["state"] for c in summary["cells"] if c["family"] in blown and c["depth"] == deepest for r in c["runs"]}
    finished = "every seed finishes its 100 epochs" if states == {"finished"} else f"their runs end {sorted(states)}"
    ranks = [ranked.index(f) + 1 for f in blown]
    worst = sorted(ranks) == list(range(1, len(blown) + 1))
    return (f"Without BatchNorm, the {' and '.join(blown)} nets at d = {deepest} start off far from the identity: "
            f"their first-epoch loss runs into the thousands ({min(min(first[f]) for f in blown):,.0f} to "
            f"{max(max(first[f]) for f in blown):,.0f}), while SkipInit's stays at "
            f"{max(first['rezero-nf']):.1f} or less. {finished[0].upper() + finished[1:]}, but they end "
            + (f"with the {len(blown)} highest mean test errors of the {len(errors)} families"
               if worst else f"ranked {', '.join(map(str, ranks))} of {len(errors)} by mean test error (1 = highest)")
            + f" ({', '.join(f'{f} {errors[f]:.2f}' for f in blown)}; next {ranked[len(blown)]} "
            f"{errors[ranked[len(blown)]]:.2f}): whether the blow-up costs accuracy is not tested here.")


def _verdict_cell(row: dict[str, Any] | None, scale: float = 1.0) -> str:
    """A judged row's verdict with the 95% interval of its difference times `scale` (a negative scale
    flips the interval: the removal tests' lost share, -100, gives points kept) and its Holm p ("—"
    without the test)."""
    if row is None or not row.get("seeds"):
        return "—"
    test = row["test"]
    if row["p_corrected"] is None:
        return row["verdict"]
    low, high = sorted((test["ci_low"] * scale, test["ci_high"] * scale))
    return f"{row['verdict']} ({CONFIDENCE:.0%} CI [{low:+.2f}, {high:+.2f}], {CORRECTION} p = {format_p(row['p_corrected'])})"


def _holds(first: dict[str, Any] | None, second: dict[str, Any] | None) -> str:
    """Whether two datasets' judged rows give one verdict: "same verdict", "differs", or "—" when either
    has no verdict (too few seeds, or not run)."""
    if first is None or second is None or first["p_corrected"] is None or second["p_corrected"] is None:
        return "—"
    return "same verdict" if first["verdict"] == second["verdict"] else "differs"


def _judged_count(rows: Sequence[dict[str, Any]]) -> int:
    return sum(1 for r in rows if r["p_corrected"] is not None)


def dataset_verdicts(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The gate-family tests dataset by dataset (`summaries`: dataset name → that study's summary, the first
    the reference): at every depth the later datasets ran, gated − each family's test error
    (`comparisons`) and each gated family's removal test (`removal_comparisons`), one record per test
    that a later dataset holds: {"test", "depth", "kind" ("error" or "removal"), "rows": {dataset: its judged
    row or None}, "holds": {later dataset: "same verdict", "differs" or "—" (either without a verdict)}}.
    Each dataset's rows are corrected over its own study's tests."""
    names = list(summaries)
    if len(names) < 2:
        raise ValueError(f"dataset_verdicts needs two summaries or more; got {names}")
    errors = {name: {(r["depth"], r["b"]): r for r in comparisons(s)} for name, s in summaries.items()}
    removal = {name: {(r["depth"], r["family"]): r for r in removal_comparisons(s)} for name, s in summaries.items()}
    depths = sorted({d for name in names[1:] for d in summaries[name]["config"]["depths"]})
    families = summaries[names[0]]["config"]["families"]
    records = []
    for kind, table, members in (("error", errors, [f for f in families if f != "gated"]),
                                 ("removal", removal, [f for f in families if f in GATE_SYMBOL])):
        for depth in depths:
            for family in members:
                rows = {n: table[n].get((depth, family)) for n in names}
                if not any((row := rows[n]) is not None and row.get("seeds") for n in names[1:]):
                    continue
                test = (f"error, gated − {family}" if kind == "error"
                        else f"removal, {family}: gate order − random (points kept)")
                records.append({"test": test, "depth": depth, "kind": kind, "rows": rows,
                                "holds": {n: _holds(rows[names[0]], rows[n]) for n in names[1:]}})
    return records


def verdict_changes(records: Sequence[dict[str, Any]], other: str) -> tuple[int, list[dict[str, Any]]]:
    """(same, changed) of `dataset_verdicts` records for the later dataset `other`: how many judged tests give
    the reference's verdict, and the records of those that do not (tests without a verdict on either dataset
    are neither)."""
    same = sum(1 for r in records if r["holds"][other] == "same verdict")
    return same, [r for r in records if r["holds"][other] == "differs"]


def _change_text(record: dict[str, Any], reference: str, other: str) -> str:
    """A changed verdict in words: the test, its depth, both verdicts and `other`'s corrected p."""
    return (f"{record['test']} at d = {record['depth']}: {record['rows'][reference]['verdict']} on {reference}, "
            f"{record['rows'][other]['verdict']} on {other} ({CORRECTION} p = "
            f"{format_p(record['rows'][other]['p_corrected'])})")


def datasets_markdown(summaries: dict[str, dict[str, Any]]) -> str:
    """`dataset_verdicts` as a table: one row per test with each dataset's verdict, its 95% interval (points
    of test error; for removal, points of the accuracy share kept with half the blocks removed) and Holm
    p, and whether each later dataset gives the reference's verdict. Each dataset's verdicts are corrected
    over its own study's tests (its depths and families), as its own page says: a study with fewer
    depths corrects over fewer tests, so "same verdict" compares two decisions, not two effect sizes, and
    "no difference detected" twice is two tests that detect nothing, not a shown equality."""
    names = list(summaries)
    records = dataset_verdicts(summaries)
    counts = ", ".join(
        f"{n} {_judged_count(comparisons(summaries[n]))} error and {_judged_count(removal_comparisons(summaries[n]))} "
        f"removal tests" for n in names)
    lines = [f"Verdicts dataset by dataset (paired t-tests over seeds; the error tests in points of test error, the "
             f"removal tests in points of the accuracy share kept with half the blocks removed; each dataset's p "
             f"{CORRECTION}-corrected over its own study's tests: {counts}; the 95% intervals are each test's own, "
             f"uncorrected, so one that excludes zero beside a {CORRECTION} p of 0.05 or more is a difference "
             f"significant only before the correction; \"same verdict\" on \"{NO_DIFFERENCE}\" is two tests that "
             f"detect nothing, not a shown equality)", "",
             *table_header(["test", "d", *names, *(f"{name}: {names[0]}'s verdict?" for name in names[1:])])]
    for record in records:
        scale = 1.0 if record["kind"] == "error" else -100.0
        lines.append(table_row([record["test"], record["depth"],
                                *(_verdict_cell(record["rows"][n], scale) for n in names),
                                *(record["holds"][n] for n in names[1:])]))
    for name in names[1:]:
        same, changed = verdict_changes(records, name)
        lines += ["", f"On {name}, {same} of {same + len(changed)} tests judged on both datasets give {names[0]}'s "
                  f"verdict" + (f"; {len(changed)} differ: " + "; ".join(_change_text(r, names[0], name) for r in changed)
                                + "." if changed else ".")]
    return "\n".join(lines) + "\n"
