"""docs/reproductions/gate-family.md: the 2017 scalar gate beside ReZero, SkipInit and LayerScale.

The analyses at initialisation come from results/gate-family-init (`throughway reproduce
gate-family-init`); the trained study's tables come from results/gate-family once it is committed,
and the page says "pending" until then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from throughway.experiments import gate_family, gate_family_init
from throughway.experiments.gate_family_report import removal_comparisons
from throughway.report.stats import SIGNIFICANCE

from .common import _json


def _gate_family_init_table(root: Path) -> str:
    """The distance-to-identity and Hessian tables at initialisation, by family and depth."""
    return gate_family_init.table_markdown(_json(root, "gate-family-init/results.json"))


def _finished_depths(summary: dict[str, Any]) -> list[int]:
    """The depths at which every family finished all its seeds."""
    seeds = summary["config"]["seeds"]
    return [d for d in summary["config"]["depths"]
            if all(c["test_error_pct"]["n"] == seeds for c in summary["cells"] if c["depth"] == d)]


def _verdict_phrase(row: dict[str, Any]) -> str:
    """A significant paired test of gated against row["b"] in words: "gated better than rezero" or
    "rezero better than gated"."""
    return f"{row['verdict']} than {row['b'] if row['verdict'].startswith('gated') else 'gated'}"


def _gate_family_findings(root: Path) -> str:
    """One line per finished depth: the family with the lowest mean test error, and what the paired
    tests of gated against each family say (the significant ones named with p; the rest counted with
    their range of p); the depths still training named last. Pending while results/gate-family is not
    committed."""
    if not (Path(root) / "gate-family" / "results.json").is_file():
        return "Pending: no trained cell is committed yet."
    summary = _json(root, "gate-family/results.json")
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    done = _finished_depths(summary)
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
    return "\n".join(lines)


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


# ----------------------------------------------------------------------------------------------------------
# Sentences of the page's prose that carry numbers: each rendered from the committed results, so that it says
# exactly what they support.

RELU_FAMILIES = ("gated", "gated-nf")  # relu(k) gates: k ≤ 0 closes a block exactly


def _removal_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    done = _finished_depths(summary)
    return [r for r in removal_comparisons(summary) if r["depth"] in done and r["test"]["p_value"] is not None
            and r["verdict"] != "too few seeds"]


def _gate_family_removal_prose(root: Path) -> str:
    """What survives the Bonferroni correction of the removal tests, by family and depth; where the
    relu-gated nets' uncorrected significance does not survive; and the size of the gains, relu gates
    against the identity gates; then the gated net's dead gates per seed at the deepest depth against the
    blocks its gate order removes."""
    summary = _json(root, "gate-family/results.json")
    rows = _removal_rows(summary)
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
    deepest = max(_finished_depths(summary))
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


def _gate_family_first_epoch(root: Path) -> str:
    """The families whose first epoch's loss ran into the thousands at the deepest depth, whether they
    finished, and where their final error ranks among the families there."""
    summary = _json(root, "gate-family/results.json")
    deepest = max(_finished_depths(summary))
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


# What a replay must repeat exactly: the trajectory (training loss, every error, the gates). The evaluated
# losses are sums whose order depends on the evaluation's batch of models: compared to a relative tolerance.
_EXACT_FIELDS = ("epoch", "train_loss", "train_error_pct", "val_error_pct", "test_error_pct", "k", "k_mean")
_EVALUATED_LOSSES = ("val_loss", "test_loss")


def _history(run: Path) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = json.loads((run / "results.json").read_text())["history"]
    return history


def _loss_gap(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    """The largest relative difference of two histories' evaluated losses."""
    return max((abs(x[k] - y[k]) / max(abs(y[k]), 1e-30) for x, y in zip(a, b) for k in _EVALUATED_LOSSES
                if x.get(k) is not None and y.get(k) is not None), default=0.0)


def replay_comparison(root: Path, other: str = "mnist-depth-val") -> dict[int, dict[str, Any]]:
    """Per depth that both studies trained, for the residual and gated nets of the same seeds: whether
    every run repeats the other study's trajectory exactly (`_EXACT_FIELDS` of every epoch), the largest
    relative difference of the evaluated losses, and the largest difference of the two cell means (points)."""
    here, there = Path(root) / "gate-family" / "runs", Path(root) / other / "runs"
    summary = _json(root, "gate-family/results.json")
    out: dict[int, dict[str, Any]] = {}
    for depth in _finished_depths(summary):
        equal, gaps, loss_gap = True, [], 0.0
        for arch in ("residual", "gated"):
            names = [f"{arch}-d{depth}-s{s}" for s in range(summary["config"]["seeds"])]
            if not all((there / n / "results.json").is_file() for n in names):
                break
            for n in names:
                a, b = _history(here / n), _history(there / n)
                equal &= [{k: r.get(k) for k in _EXACT_FIELDS} for r in a] == [{k: r.get(k) for k in _EXACT_FIELDS} for r in b]
                loss_gap = max(loss_gap, _loss_gap(a, b))
            means = [sum(_history(folder / n)[-1]["test_error_pct"] for n in names) / len(names) for folder in (here, there)]
            gaps.append(abs(means[0] - means[1]))
        else:
            out[depth] = {"replay": equal, "max_mean_gap": max(gaps), "loss_gap": loss_gap}
    return out


def _gate_family_replay(root: Path) -> str:
    """Where the gate-family study's residual and gated runs repeat results/mnist-depth-val's bit for bit
    (the same seeds), and how far the same seeds land elsewhere."""
    summary = _json(root, "gate-family/results.json")
    compared = replay_comparison(root)
    replays = [d for d, c in compared.items() if c["replay"]]
    others = [d for d, c in compared.items() if not c["replay"]]
    gated = {c["depth"]: c["test_error_pct"]["mean"] for c in summary["cells"] if c["family"] == "gated"}
    deepest = max(gated)
    text = f"The gated net at d = {deepest} ends at {gated[deepest]:.2f}, not at the paper's 1.26."
    if replays:
        text += (f" Its d = {', '.join(map(str, replays))} gated and residual runs are replays of the "
                 f"[MNIST depth study](mnist-depth.md)'s (`results/mnist-depth-val`: the same seeds; every epoch's "
                 f"training loss, errors and k equal bit for bit, the evaluated losses to a relative "
                 f"{max(compared[d]['loss_gap'] for d in replays):.0e}), not a second sample.")
    if others:
        gap = max(compared[d]["max_mean_gap"] for d in others)
        text += (f" At d = {', '.join(map(str, others))} the same seeds, trained in other batches of stacked models, "
                 f"differ: the two studies' cell means by up to {gap:.2f} points. A run's numbers can depend on which "
                 f"models share its stack: bit for bit holds for the same command, not across stack compositions.")
    return text


def _gate_family_rezero_condition(root: Path) -> str:
    """ReZero's condition number over the non-zero eigenvalues at initialisation, from the shallowest to
    the deepest depth (its smallest and largest mean)."""
    points = [p for p in _json(root, "gate-family-init/results.json")["points"] if p["family"] == "rezero"
              and p["nonzero_condition"]["mean"] is not None]
    points.sort(key=lambda p: p["depth"])
    values = [(p["depth"], p["nonzero_condition"]["mean"]) for p in points]
    low, high = min(values, key=lambda v: v[1]), max(values, key=lambda v: v[1])
    last = values[-1]
    return (f"a non-zero condition number that grows from {low[1]:.0f} at d = {low[0]} to {high[1]:.0f} at d = {high[0]}"
            + (f" ({last[1]:.0f} at d = {last[0]})" if last not in (low, high) else ""))


def _gate_family_trained(root: Path) -> str:
    """The trained study's error table, paired tests, gate values and removal table, or a pending line
    naming the command while results/gate-family is not committed."""
    if not (Path(root) / "gate-family" / "results.json").is_file():
        return ("Pending: the trained study (`throughway reproduce gate-family`, 7 families × 5 depths × 5 seeds × "
                "100 epochs) has not finished on this machine; `results/gate-family` will hold it.")
    return gate_family.report_markdown(_json(root, "gate-family/results.json"))
