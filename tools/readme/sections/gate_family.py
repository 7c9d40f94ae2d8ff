"""docs/reproductions/gate-family.md: the 2017 scalar gate beside ReZero, SkipInit and LayerScale (issue 24).

The analyses at initialisation come from results/gate-family-init (`throughway reproduce
gate-family-init`); the trained study's tables come from results/gate-family once it is committed,
and the page says "pending" until then.
"""

from __future__ import annotations

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
    passing = sum(1 for r in rows if r["test"]["p_value"] < threshold)
    return [f"- **Removal** (half the blocks, paired over seeds: share of accuracy kept with the smallest |gate| "
            f"removed first − in random orders, where significant): {'; '.join(parts)}. Bonferroni over "
            f"{'this test' if len(rows) == 1 else f'these {len(rows)} tests'}: threshold {threshold:.2g}, {passing} "
            f"pass{'es' if passing == 1 else ''} it."]


def _gate_family_trained(root: Path) -> str:
    """The trained study's error table, paired tests, gate values and removal table, or a pending line
    naming the command while results/gate-family is not committed."""
    if not (Path(root) / "gate-family" / "results.json").is_file():
        return ("Pending: the trained study (`throughway reproduce gate-family`, 7 families × 5 depths × 5 seeds × "
                "100 epochs) has not finished on this machine; `results/gate-family` will hold it.")
    return gate_family.report_markdown(_json(root, "gate-family/results.json"))
