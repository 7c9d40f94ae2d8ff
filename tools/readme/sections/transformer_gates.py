"""docs/reproductions/transformer-gates.md: which layers a trained vision transformer can lose
(`reproduce transformer-gates`).

The page places the study's own files: table.md and findings.md are written by the experiment's report
(`experiments.transformer_gates.write_report`), the same text `throughway report` writes beside the
results, so the words on the page are the words the study says about itself.
"""

from __future__ import annotations

from pathlib import Path

from throughway.experiments import transformer_gates
from throughway.report.tables import table_header, table_row

from .common import _json, _report_file

STUDY = "transformer-gates"


def _transformer_gates_setup(root: Path) -> str:
    """The model and budget the committed results were trained with, from their results.json."""
    summary = _json(root, f"{STUDY}/results.json")
    c = summary["config"]
    depths = ", ".join(str(d) for d in c["depths"])
    parameters = ", ".join(f"{int(n):,}" for n in summary["parameters"].values())
    return (f"{depths} pre-norm layers of width {c['width']} ({c['heads']} heads, feed-forward width "
            f"{2 * c['width']}; {parameters} parameters), {c['epochs']} epochs on all "
            f"{summary['training_images']:,} training images, {c['seeds']} seeds per family, the criteria computed "
            f"on {c['calibration_images']} training images")


def _transformer_gates_findings(root: Path) -> str:
    """The study's findings.md, checked against a findings text made anew from its results.json."""
    return _report_file(root, STUDY, "findings.md", transformer_gates.findings_markdown)


def _transformer_gates_table(root: Path) -> str:
    """The study's tables (error, paired tests, gates, removal curves, criteria against the gate order),
    made from its results.json."""
    return transformer_gates.table_markdown(_json(root, f"{STUDY}/results.json"))


def _transformer_gates_orders(root: Path) -> str:
    """How the deepest gated nets' gate order begins (`transformer_gates.orders_prose`)."""
    return transformer_gates.orders_prose(_json(root, f"{STUDY}/results.json"))


def _transformer_gates_first_layers(root: Path) -> str:
    """Which two layers each criterion removes first, by family, over the nets of the deepest depth: the pair
    most often removed first and in how many of the family's nets ("4 and 5 (3 of 5)"); the angular criterion's
    pair is its span for n = 2 (not nested in its other spans). A table."""
    summary = _json(root, f"{STUDY}/results.json")
    depth = max(summary["config"]["depths"])
    families = summary["config"]["families"]
    by_family = {c["family"]: [e["analysis"] for e in c["per_seed"] if "analysis" in e]
                 for c in summary["cells"] if c["depth"] == depth}
    lines = [f"The two layers each criterion removes first (layers numbered 0 to {depth - 1} from the input), the "
             f"pair most often first and in how many of the family's nets; angular: its span of two layers", "",
             *table_header(["criterion", *families])]
    for criterion in ("block_influence", "angular", "lesion", "lesion_greedy", "deepest", "gate"):
        cells = []
        for family in families:
            pairs: dict[str, int] = {}
            for record in by_family.get(family, []):
                first = (record.get("angular_spans", {}).get("2") if criterion == "angular"
                         else record["orders"].get(criterion, [])[:2])
                if first:
                    key = " and ".join(str(i) for i in sorted(int(n.rsplit(".", 1)[-1]) for n in first))
                    pairs[key] = pairs.get(key, 0) + 1
            if pairs:
                pair, count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
                cells.append(f"{pair} ({count} of {sum(pairs.values())})")
            else:
                cells.append("—")
        lines.append(table_row([criterion, *cells]))
    return "\n".join(lines) + "\n"
