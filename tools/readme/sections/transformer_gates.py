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
    """How the 4-layer gated nets' removal orders begin (`transformer_gates.orders_prose`)."""
    return transformer_gates.orders_prose(_json(root, "transformer-gates/results.json"),
                                          _json(root, "transformer-gates/removal.json"))
