"""The figure of `reproduce transformer-gates`, drawn from its results.json summary alone
(`experiments.transformer_gates.summarize`): test error by depth per family, and the share of test
accuracy kept as layers are removed, smallest |gate| first against random orders.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .plots import plt, save_figure

__all__ = ["FAMILY_COLORS", "plot_transformer_gates"]

FAMILY_COLORS = {"prenorm": "#1f77b4", "gated": "#2ca02c", "rezero": "#ff7f0e", "layerscale": "#9467bd"}


def _mean(rows: list[list[float]]) -> list[float]:
    return [sum(column) / len(column) for column in zip(*rows)]


def plot_transformer_gates(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Left: the validation-selected test error (%) against the number of layers, one line per family
    (mean over seeds, bars: ± std). Right: at the deepest depth with removal records, the share of the
    full net's test accuracy kept after removing r layers, for each gated family: smallest |gate| first
    (solid) and random orders (dashed; the mean over seeds of each net's mean random curve)."""
    config = summary["config"]
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for family in config["families"]:
        points = [(d, by[(family, d)]["test_error_pct"]) for d in config["depths"] if by[(family, d)]["test_error_pct"]["n"]]
        if points:
            left.errorbar([d for d, _ in points], [s["mean"] for _, s in points], yerr=[s["std"] or 0.0 for _, s in points],
                          marker="o", capsize=3, color=FAMILY_COLORS.get(family), label=family)
    left.set_xlabel("transformer layers")
    left.set_ylabel("test error (%), validation-selected epoch")
    left.set_xticks(list(config["depths"]))
    left.set_title("test error by depth (mean ± std over seeds)")
    if left.get_legend_handles_labels()[0]:
        left.legend(fontsize=8)
    deepest = max((d for d in config["depths"] if any(by[(f, d)]["removal"] for f in config["families"])), default=None)
    if deepest is None:
        right.text(0.5, 0.5, "removal: pending", ha="center", va="center", transform=right.transAxes)
        right.set_axis_off()
    else:
        for family in config["families"]:
            records = by[(family, deepest)]["removal"]
            if not records:
                continue
            greedy = _mean([[v / r["greedy"][0] for v in r["greedy"]] for r in records])
            random = _mean([_mean([[v / curve[0] for v in curve] for curve in r["random"]]) for r in records])
            color = FAMILY_COLORS.get(family)
            right.plot(range(len(greedy)), greedy, color=color, marker="o", label=f"{family}: smallest |gate| first")
            right.plot(range(len(random)), random, color=color, linestyle="--", label=f"{family}: random order")
        right.set_xticks(range(deepest + 1))
        right.set_xlabel(f"layers removed (of {deepest})")
        right.set_ylabel("share of test accuracy kept")
        right.set_title(f"removing layers, {deepest}-layer nets (mean over seeds)")
        right.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
