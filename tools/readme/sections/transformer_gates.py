"""docs/reproductions/transformer-gates.md: which layers a trained vision transformer can lose
(`reproduce transformer-gates`).

The page places the study's own files: table.md and findings.md are written by the experiment's report
(`experiments.transformer_gates.write_report`), the same text `throughway report` writes beside the
results, so the words on the page are the words the study says about itself.

The committed results/transformer-gates may still be the earlier study (a ViT trained 6 epochs on 10,000
images at a constant rate; its summary has "removal_tests", the new one "criteria_tests"). Its files are
placed as that study wrote them (`_earlier`): its findings.md and table.md as they are, its removal
orders from its removal.json. Remove the `_earlier` paths once the folder holds the new study.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from throughway.experiments import transformer_gates

from .common import _json, _report_file, _text

STUDY = "transformer-gates"


def _earlier(summary: dict[str, Any]) -> bool:
    """Whether `summary` is the earlier study's (written before the criteria tests existed)."""
    return "criteria_tests" not in summary


def _transformer_gates_findings(root: Path) -> str:
    """The study's findings.md, checked against a findings text made anew from its results.json (the
    earlier study's as it wrote it)."""
    if _earlier(_json(root, f"{STUDY}/results.json")):
        return _text(root, f"{STUDY}/findings.md")
    return _report_file(root, STUDY, "findings.md", transformer_gates.findings_markdown)


def _transformer_gates_table(root: Path) -> str:
    """The study's tables (error, paired tests, gates, removal curves, criteria against the gate order),
    made from its results.json (the earlier study's: its table.md before its findings)."""
    summary = _json(root, f"{STUDY}/results.json")
    if _earlier(summary):
        return _text(root, f"{STUDY}/table.md").split("\nFindings\n", 1)[0]
    return transformer_gates.table_markdown(summary)


def _earlier_orders(summary: dict[str, Any], removal: dict[str, Any]) -> str:
    gated = [v for k, v in sorted(removal.items()) if k.startswith("gated-L4-")]
    early = sum(1 for v in gated if sorted(v["greedy_order"][:2]) == [0, 1])
    cell = next(c for c in summary["cells"] if c["family"] == "gated" and c["depth"] == 4)
    first = [sum(g["per_branch"][:4]) / 4 for g in cell["gates"]]
    last = [sum(g["per_branch"][4:]) / 4 for g in cell["gates"]]
    return (f"in {early} of {len(gated)} seeds the order removes layers 0 and 1 first; their branches' mean k is "
            f"{sum(first) / len(first):.3f} against {sum(last) / len(last):.3f} for layers 2 and 3")


def _transformer_gates_orders(root: Path) -> str:
    """How the deepest gated nets' gate order begins (`transformer_gates.orders_prose`)."""
    summary = _json(root, f"{STUDY}/results.json")
    if _earlier(summary):
        return _earlier_orders(summary, _json(root, f"{STUDY}/removal.json"))
    return transformer_gates.orders_prose(summary)
