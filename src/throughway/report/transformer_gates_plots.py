"""The figure of `reproduce transformer-gates`, drawn from its results.json summary alone
(`experiments.transformer_gates.summarize`): the test error of each family, seed by seed, and for
each family the test accuracy kept as layers are removed by each criterion, the gate order drawn
thick and black so that every other criterion reads against it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .figures import subplots
from .plots import save_figure

__all__ = ["FAMILY_COLORS", "CRITERION_STYLES", "LABELS", "plot_transformer_gates"]

FAMILY_COLORS = {"prenorm": "#1f77b4", "gated": "#2ca02c", "rezero": "#ff7f0e", "layerscale": "#9467bd"}
# criterion -> (colour, line style, line width): the gate order is the reference line; random the floor
CRITERION_STYLES = {"gate": ("black", "-", 2.6), "block_influence": ("#d62728", "-", 1.4),
                    "angular": ("#17becf", "-", 1.4), "lesion": ("#8c564b", "-", 1.4),
                    "lesion_greedy": ("#e377c2", "--", 1.4), "deepest": ("#bcbd22", "-", 1.4),
                    "random": ("#7f7f7f", ":", 1.8)}
LABELS = {"gate": "gate order (smallest |gate| first)", "block_influence": "block influence (ShortGPT)",
          "angular": "angular span (Gromov et al.)", "lesion": "lesion (one shot)", "lesion_greedy": "lesion greedy (SLEB)",
          "deepest": "deepest first", "random": "random (mean)"}
CHANCE_ACCURACY = 10.0  # ten classes
DODGE = 0.04  # layers: the sideways shift between criteria's curves


def _mean(rows: list[list[float]]) -> list[float]:
    return [sum(column) / len(column) for column in zip(*rows)]


def plot_transformer_gates(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Left: the last epoch's test error (%) of each family at the deepest depth, one dot per seed and
    the mean. Then one panel per family at that depth: the test accuracy (%) with n layers removed, mean
    over seeds, one line per criterion (gate order: thick black; random: the exact mean over subsets,
    dotted grey; chance: 10%), each criterion's curve shifted by DODGE layers so that equal curves stay visible."""
    config = summary["config"]
    depth = max(config["depths"])
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    families = config["families"]
    fig, axes = subplots(1, 1 + len(families), figsize=(3.0 * (1 + len(families)), 3.6),
                             gridspec_kw={"width_ratios": [0.8] + [1.0] * len(families)})
    errors = axes[0]
    for i, family in enumerate(families):
        seeds = [e["test_error_pct"] for e in by[(family, depth)]["per_seed"]]
        color = FAMILY_COLORS.get(family)
        errors.scatter([i] * len(seeds), seeds, color=color, alpha=0.6, s=14)
        if seeds:
            errors.plot([i - 0.25, i + 0.25], [sum(seeds) / len(seeds)] * 2, color=color, linewidth=2.5)
    errors.set_xticks(range(len(families)))
    errors.set_xticklabels(families, rotation=30, fontsize=8)
    errors.set_ylabel("test error (%)")
    errors.set_title(f"{depth} layers: test error\n(dots: seeds, bar: mean)", fontsize=9)
    errors.set_xlim(-0.6, len(families) - 0.4)
    handles: dict[str, Any] = {}
    for ax, family in zip(axes[1:], families):
        records = [e["analysis"] for e in by[(family, depth)]["per_seed"] if "analysis" in e]
        if not records:
            ax.text(0.5, 0.5, "removal: pending", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        for k, (criterion, (color, style, width)) in enumerate(CRITERION_STYLES.items()):
            curves = [r["curves"][criterion] for r in records if criterion in r["curves"]]
            if not curves:
                continue
            # criteria that remove the same layers draw the same curve: each is shifted a little sideways
            # (DODGE per criterion, the gate order unshifted) so that none hides another
            shift = DODGE * (k - (len(CRITERION_STYLES) - 1) / 2) if criterion != "gate" else 0.0
            (line,) = ax.plot([n + shift for n in range(len(curves[0]))], _mean(curves), color=color, linestyle=style,
                              linewidth=width, marker="o" if criterion == "gate" else ".", markersize=3,
                              label=criterion)
            handles[criterion] = line
        ax.axhline(CHANCE_ACCURACY, color="#cccccc", linewidth=0.8)
        ax.set_ylim(0, 100)
        ax.set_xticks(range(depth + 1))
        ax.set_xlabel(f"layers removed (of {depth})")
        ax.set_title(f"{family} ({len(records)} seed{'' if len(records) == 1 else 's'})", fontsize=9,
                     color=FAMILY_COLORS.get(family))
    axes[1].set_ylabel("test accuracy (%), mean over seeds")
    if handles:
        names = [c for c in CRITERION_STYLES if c in handles]  # the gate order first, random last
        fig.legend([handles[c] for c in names], [LABELS.get(c, c) for c in names], loc="lower center",
                   ncol=len(names), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08 if handles else 0, 1, 1))
    return save_figure(fig, path)
