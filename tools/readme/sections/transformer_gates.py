"""docs/reproductions/transformer-gates.md: the 2017 gate in a transformer (`reproduce transformer-gates`).

The page places the study's own files: table.md and findings.md are written by the experiment's report
(`experiments.transformer_gates.write_report`), the same text `throughway report` writes beside the
results, so the words on the page are the words the study says about itself.
"""

from __future__ import annotations

from pathlib import Path

from throughway.experiments import transformer_gates

from .common import _json, _report_file


def _transformer_gates_findings(root: Path) -> str:
    """The study's findings.md, checked against a findings text made anew from its results.json."""
    return _report_file(root, "transformer-gates", "findings.md", transformer_gates.findings_markdown)


def _transformer_gates_table(root: Path) -> str:
    """The study's tables (error, paired tests, gates, removal), made from its results.json."""
    return transformer_gates.table_markdown(_json(root, "transformer-gates/results.json"))


def _transformer_gates_orders(root: Path) -> str:
    """How the smallest-|gate|-first orders of the 4-layer gated nets begin, counted over seeds: the
    layers they remove first, and the mean k of layers 0-1 against layers 2-3."""
    removal = _json(root, "transformer-gates/removal.json")
    summary = _json(root, "transformer-gates/results.json")
    gated = [v for k, v in sorted(removal.items()) if k.startswith("gated-L4-")]
    early = sum(1 for v in gated if sorted(v["greedy_order"][:2]) == [0, 1])
    cell = next(c for c in summary["cells"] if c["family"] == "gated" and c["depth"] == 4)
    first = [sum(g["per_branch"][:4]) / 4 for g in cell["gates"]]
    last = [sum(g["per_branch"][4:]) / 4 for g in cell["gates"]]
    return (f"in {early} of {len(gated)} seeds the order removes layers 0 and 1 first; their branches' mean k is "
            f"{sum(first) / len(first):.3f} against {sum(last) / len(last):.3f} for layers 2 and 3")
