"""docs/reproductions/layer-drop.md: which layers a trained character-level GPT can lose (`reproduce layer-drop`).

The page places the study's own files: table.md and findings.md are written by the experiment's report
(`experiments.layer_drop.write_report`), the same text `throughway report` writes beside the results,
so the words on the page are the words the study says about itself; the README row counts its tests.
"""

from __future__ import annotations

from pathlib import Path

from throughway.experiments import layer_drop
from throughway.report.stats import CORRECTION, SIGNIFICANCE

from .common import _json, _report_file

STUDY = "layer-drop"


def _layer_drop_findings(root: Path) -> str:
    """The study's findings.md, checked against a findings text made anew from its results.json."""
    return _report_file(root, STUDY, "findings.md", layer_drop.findings_markdown)


def _layer_drop_table(root: Path) -> str:
    """The study's tables (loss by family, loss by layers removed and criterion, paired tests, healing)."""
    return layer_drop.table_markdown(_json(root, f"{STUDY}/results.json"))


def _layer_drop_setup(root: Path) -> str:
    """The model and budget the committed results were trained with, from their results.json."""
    summary = _json(root, f"{STUDY}/results.json")
    c = summary["config"]
    return (f"{c['layers']} layers of width {c['width']} ({c['heads']} heads, {summary['parameters'] / 1e6:.2f}M "
            f"parameters), context {c['context']}, {c['steps']} AdamW steps of {c['batch_size']} blocks "
            f"(evaluation every {c['eval_every']}), {c['seeds']} seeds per family; gated-l1's pressure λ = "
            f"{c['pressure']:g} with its gates at {c['gate_lr_mult']:g}× the learning rate; losses on "
            f"{c['eval_blocks']} fixed validation blocks; criteria computed on {c['calibration_blocks']} training "
            f"blocks; healing {c['heal_steps']} steps at lr {c['heal_lr']:g}")


def _layer_drop_status(root: Path) -> str:
    """Whether the committed results hold every seed the study plans (config.seeds), or how many of them."""
    summary = _json(root, f"{STUDY}/results.json")
    planned = summary["config"]["seeds"]
    counts = sorted({cell["val_loss"]["n"] for cell in summary["cells"]})
    if counts == [planned]:
        return f"All {planned} seeds of every family are in the committed results."
    held = counts[0] if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return (f"**Interim:** the committed results hold {held} of the {planned} seeds of each family; the other runs "
            f"were still training (the study resumes where it stopped), and this page is remade from the files "
            f"when they land. Every statistic below is over the seeds committed.")


def layer_drop_row(root: Path) -> str:
    """The README's row: the loss reached, and the counts of the criterion-against-gate tests by verdict."""
    summary = _json(root, f"{STUDY}/results.json")
    families = layer_drop.families_of(summary)
    base = families.get("prenorm")
    rows = [r for r in summary["comparisons"] if r.get("p_corrected") is not None]
    gate_worse = sum(1 for r in rows if r["verdict"] == f"{r['a']} better")
    gate_better = sum(1 for r in rows if r["verdict"] == "gate better")
    loss = (f"ungated {base['val_loss']['mean']:.3f} ± {base['val_loss']['std']:.3f} nats per character "
            f"({base['val_loss']['n']} seeds); " if base and base["val_loss"]["n"] else "")
    return (f"| [Which layers can a trained GPT lose?](docs/reproductions/layer-drop.md) (ours): a character-level "
            f"GPT on Shakespeare, layers removed by the learned gate and by today's criteria | — | {loss}"
            f"{len(rows)} paired tests of a criterion against the gate order ({CORRECTION}): the criterion keeps "
            f"a lower loss in {gate_worse}, the gate order in {gate_better}, no difference detected in "
            f"{len(rows) - gate_worse - gate_better} (p < {SIGNIFICANCE} corrected) | measured |")
