"""The figure of `reproduce layer-drop`, drawn from its results.json summary alone
(`experiments.layer_drop.summarize`): for the gated family and the family under pressure, the
validation loss as layers are removed by each criterion; and the validation loss of every family.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .figures import save_figure, subplots

__all__ = ["CRITERION_STYLES", "plot_layer_drop"]

# criterion -> (colour, line style); the learned gate is the thick black line
CRITERION_STYLES = {"gate": ("#000000", "-"), "block_influence": ("#1f77b4", "-"), "angular": ("#ff7f0e", "-"),
                    "lesion": ("#2ca02c", "-"), "lesion_greedy": ("#2ca02c", "--"), "deepest": ("#9467bd", "-"),
                    "random": ("#7f7f7f", ":")}
FAMILY_ORDER = ("prenorm", "gated", "gated-l1", "rezero", "layerscale")


def _curves(cell: dict[str, Any], criterion: str) -> list[list[float]]:
    out = []
    for entry in cell["per_seed"]:
        dropping = entry.get("dropping")
        if not dropping or criterion not in dropping["curves"]:
            continue
        out.append(list(dropping["curves"][criterion]))  # element n: the loss with n layers removed
    return out


def plot_layer_drop(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Left and middle: validation loss (nats per character) against the number of layers removed, one
    line per criterion (mean over seeds; the gate order thick and black), for the gated family and the
    family trained under pressure (gated-l1). Right: each family's validation loss at the end of
    training (one dot per seed, the mean as a bar)."""
    config = summary["config"]
    families = {cell["family"]: cell for cell in summary["cells"]}
    shown = [f for f in ("gated", "gated-l1") if f in families] or list(families)[:1]
    fig, axes = subplots(1, len(shown) + 1, figsize=(5 * (len(shown) + 1), 4.2))
    top = None
    for axis, family in zip(axes, shown):
        for criterion, (color, style) in CRITERION_STYLES.items():
            rows = _curves(families[family], criterion)
            if not rows:
                continue
            mean = [sum(c) / len(c) for c in zip(*rows)]
            axis.plot(range(len(mean)), mean, color=color, linestyle=style, marker="o", markersize=3,
                      linewidth=2.5 if criterion == "gate" else 1.3, label=criterion.replace("_", " "))
            top = max(top or mean[0], mean[len(mean) // 2])
        axis.set_xlabel(f"layers removed (of {config['layers']})")
        axis.set_ylabel("validation loss (nats per character)")
        axis.set_title(f"{family}: loss as layers go (mean over seeds)")
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
        if top is not None:
            axis.set_ylim(top=top * 1.15 + 0.05)
    right = axes[-1]
    names = [f for f in FAMILY_ORDER if f in families]
    for x, family in enumerate(names):
        values = [e["dropping"]["val_loss"] for e in families[family]["per_seed"] if "dropping" in e]
        if values:
            right.bar(x, sum(values) / len(values), color="#cccccc")
            right.scatter([x] * len(values), values, color="#333333", s=12, zorder=3)
    right.set_xticks(range(len(names)))
    right.set_xticklabels(names, rotation=20)
    right.set_ylabel("validation loss (nats per character)")
    right.set_title("after training (dots: seeds)")
    values = [e["dropping"]["val_loss"] for f in names for e in families[f]["per_seed"] if "dropping" in e]
    if values:
        right.set_ylim(min(values) - 0.05, max(values) + 0.05)
    fig.tight_layout()
    return save_figure(fig, path)
