"""docs/reproductions/gate-family.md: the 2017 scalar gate beside ReZero, SkipInit and LayerScale (issue 24).

The analyses at initialisation come from results/gate-family-init (`throughway reproduce
gate-family-init`); the trained study's tables come from results/gate-family once it is committed,
and the page says "pending" until then.
"""

from __future__ import annotations

from pathlib import Path

from throughway.experiments import gate_family, gate_family_init

from .common import _json


def _gate_family_init_table(root: Path) -> str:
    """The distance-to-identity and Hessian tables at initialisation, by family and depth."""
    return gate_family_init.table_markdown(_json(root, "gate-family-init/results.json"))


def _gate_family_trained(root: Path) -> str:
    """The trained study's error table, paired tests, gate values and removal table, or a pending line
    naming the command while results/gate-family is not committed."""
    if not (Path(root) / "gate-family" / "results.json").is_file():
        return ("Pending: the trained study (`throughway reproduce gate-family`, 7 families × 5 depths × 5 seeds × "
                "100 epochs) has not finished on this machine; `results/gate-family` will hold it.")
    return gate_family.report_markdown(_json(root, "gate-family/results.json"))
