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
from ..layers import find_branches
from ..report.stats import (MIN_PAIRS_FOR_VERDICT, SIGNIFICANCE, format_mean_std, mean_std, paired_by_seed,
                           paired_verdict)
from ..train import load_model
from ..train.loop import evaluate
from ..report.tables import table_header

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
             "", *table_header(["d", "other", "n", "gated − other (pp)", "p", "verdict"])]
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
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    tests = removal_comparisons(summary)
    if tests:
        lines += ["", "Paired t-test (two-sided) over seeds of the share kept, smallest |gate| first − random order "
                  f"(points of test accuracy share, n seeds); a verdict only at p < {SIGNIFICANCE} with n ≥ "
                  f"{MIN_PAIRS_FOR_VERDICT}", "", *table_header(["d", "family", "n", "gate order − random (pp)", "p",
                                                                 "verdict"])]
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
    """A significant paired test of gated against row["b"] in words: "gated better than rezero" or
    "rezero better than gated"."""
    return f"{row['verdict']} than {row['b'] if row['verdict'].startswith('gated') else 'gated'}"


def findings_markdown(summary: dict[str, Any]) -> str:
    """One line per finished depth: the family with the lowest mean test error, and what the paired
    tests of gated against each family say (the significant ones named with p; the rest counted with
    their range of p); the Bonferroni count over those tests; the removal tests (`_removal_findings`); the
    depths still training named last. What `throughway report` writes as findings.md and the docs page shows."""
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    done = finished_depths(summary)
    lines = []
    for depth in done:
        means = {f: by[(f, depth)]["test_error_pct"] for f in summary["config"]["families"]}
        best = min(means, key=lambda f: means[f]["mean"])
        worst = max(means, key=lambda f: means[f]["mean"])
        rows = [r for r in summary["comparisons"] if r["depth"] == depth and len(r["seeds"]) >= 3]
        significant = [r for r in rows if r["verdict"] not in ("no significant difference", "too few")]
        quiet = [r["test"]["p_value"] for r in rows if r["verdict"] == "no significant difference"
                 and r["test"]["p_value"] is not None]
        tests = "; ".join(f"{_verdict_phrase(r)} "
                          f"(gated − {r['b']} {r['test']['mean_difference']:+.2f} points, p = {r['test']['p_value']:.2g})"
                          for r in significant)
        rest = (f"no significant difference from {len(quiet)} famil{'y' if len(quiet) == 1 else 'ies'} "
                f"(p = {min(quiet):.2g} to {max(quiet):.2g})" if quiet else "")
        lines.append(f"- **d = {depth}**: lowest mean test error {best} {means[best]['mean']:.2f} ± "
                     f"{means[best]['std']:.2f}, highest {worst} {means[worst]['mean']:.2f} ± {means[worst]['std']:.2f}; "
                     f"gated (paired, n = {len(rows[0]['seeds']) if rows else 0}): "
                     + "; ".join(part for part in (tests, rest) if part) + ".")
    tested = [r for r in summary["comparisons"] if r["depth"] in done and len(r["seeds"]) >= 3
              and r["test"]["p_value"] is not None]
    if tested:
        threshold = SIGNIFICANCE / len(tested)
        passing = [r for r in tested if r["test"]["p_value"] < threshold]
        named = "; ".join(f"{_verdict_phrase(r)} at d = {r['depth']}" for r in passing)
        lines.append(f"- The p values are not corrected for multiple comparisons: {len(tested)} paired tests at the "
                     f"finished depths give a Bonferroni threshold of {SIGNIFICANCE} / {len(tested)} = {threshold:.2g}; {len(passing)} of "
                     f"the {len(tested)} pass it" + (f" ({named})." if passing else
                                                     " (no difference above is then significant)."))
    lines += _removal_findings(summary, done)
    pending = [d for d in summary["config"]["depths"] if d not in done]
    if not done:
        lines.append("- No depth has finished every family and seed yet.")
    if pending:
        lines.append(f"- Pending (not every family and seed finished): d = {', '.join(map(str, pending))}.")
    return "\n".join(lines) + "\n"


def _removal_findings(summary: dict[str, Any], done: list[int]) -> list[str]:
    """One line on the paired tests of removal orders at the finished depths (gate_family_report.
    removal_comparisons): per gated family, the depths where removing the smallest |gate| first keeps
    significantly more (or less) accuracy than random orders, with the difference and p; then the
    Bonferroni count over those tests. Nothing when no depth with two or more blocks has finished."""
    rows = [r for r in removal_comparisons(summary) if r["depth"] in done and r["test"]["p_value"] is not None
            and r["verdict"] != "too few seeds"]
    if not rows:
        return []
    parts = []
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        significant = [r for r in mine if r["verdict"] != "no significant difference"]
        parts.append(f"{family}: " + (", ".join(
            f"d = {r['depth']} {r['verdict'].replace(' better', '')} {r['kept_difference']:+.1f} points (p = "
            f"{r['test']['p_value']:.2g})" for r in significant) if significant else "no significant difference")
            + (f" (no difference at d = {', '.join(str(r['depth']) for r in mine if r not in significant)})"
               if significant and len(significant) < len(mine) else ""))
    threshold = SIGNIFICANCE / len(rows)
    passing = [r for r in rows if r["test"]["p_value"] < threshold]
    named = "; ".join(f"{family} at d = {', '.join(str(r['depth']) for r in passing if r['family'] == family)}"
                      for family in dict.fromkeys(r["family"] for r in passing))
    return [f"- **Removal** (half the blocks, paired over seeds: share of accuracy kept with the smallest |gate| "
            f"removed first − in random orders, where significant at p < {SIGNIFICANCE}, uncorrected): "
            f"{'; '.join(parts)}. Bonferroni over "
            f"{'this test' if len(rows) == 1 else f'these {len(rows)} tests'}: threshold {threshold:.2g}, {len(passing)} "
            f"pass{'es' if len(passing) == 1 else ''} it" + (f" ({named})." if passing else ".")]


def removal_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The removal tests (`removal_comparisons`) at the finished depths that give a verdict."""
    done = finished_depths(summary)
    return [r for r in removal_comparisons(summary) if r["depth"] in done and r["test"]["p_value"] is not None
            and r["verdict"] != "too few seeds"]


def removal_prose(summary: dict[str, Any]) -> str:
    """What survives the Bonferroni correction of the removal tests, by family and depth; where the
    relu-gated nets' uncorrected significance does not survive; and the size of the gains, relu gates
    against the identity gates; then the gated net's dead gates per seed at the deepest depth against the
    blocks its gate order removes."""
    rows = removal_rows(summary)
    if not rows:
        return "Pending: no removal test at a finished depth yet."
    threshold = SIGNIFICANCE / len(rows)
    better = [r for r in rows if r["kept_difference"] > 0]
    passing = [r for r in better if r["test"]["p_value"] < threshold]
    by_family = {f: [r["depth"] for r in passing if r["family"] == f] for f in dict.fromkeys(r["family"] for r in passing)}
    survived = "; ".join(f"{f} at d = {', '.join(map(str, depths))}" for f, depths in by_family.items())
    lost = [r for r in better if r["family"] in RELU_FAMILIES and r not in passing
            and r["verdict"] != "no significant difference"]
    relu_gain = [r["kept_difference"] for r in passing if r["family"] in RELU_FAMILIES]
    other_gain = [r["kept_difference"] for r in rows if r["family"] not in RELU_FAMILIES]
    text = (f"Corrected for the {len(rows)} removal tests (Bonferroni threshold {threshold:.2g}), removing the "
            f"smallest gate first keeps significantly more than random orders for {survived or 'no family'}.")
    if lost:
        text += (" Below that, the relu-gated nets' significance at p < 0.05 does not survive the correction: "
                 + ", ".join(f"{r['family']} at d = {r['depth']} (p = {r['test']['p_value']:.2g})" for r in lost) + ".")
    if relu_gain and other_gain:
        text += (f" The relu gates' advantage is in the size of the gain: {min(relu_gain):+.1f} to "
                 f"{max(relu_gain):+.1f} points where they pass, against at most {max(other_gain):+.1f} for ReZero, "
                 f"LayerScale and SkipInit at any depth.")
    deepest = max(finished_depths(summary))
    cell = next((c for c in summary["cells"] if c["family"] == "gated" and c["depth"] == deepest), None)
    if cell and cell.get("removal"):
        dead = [p["dead_gates"] for p in cell["per_seed"]]
        half = cell["removal"][0]["half"]
        shares = [r["half_share_greedy"] for r in cell["removal"]]
        live = sum(1 for n in dead if n < half)
        text += (f" At d = {deepest} the gated net with BatchNorm keeps {min(shares):.3f} to {max(shares):.3f} of its "
                 f"accuracy with {half} of its {cell['removal'][0]['blocks']} blocks removed smallest k first. Its dead "
                 f"gates (k ≤ 0: blocks already closed) number {', '.join(map(str, dead))} in the {len(dead)} seeds, so in "
                 f"{live} of {len(dead)} seeds the removed half also takes live blocks, those of smallest k, "
                 f"at no measurable cost either.")
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
