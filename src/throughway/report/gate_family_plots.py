"""Figures of `reproduce gate-family`, drawn from its results.json summary alone
(`experiments.gate_family.summarize`): training loss by depth, and the layer-removal curves.

Every curve is the mean over seeds with a band from the lowest to the highest seed: a single seed's
curve is not a finding.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from matplotlib.ticker import NullLocator

from .figures import dataset_title, figure_legend, mean_band, save_figure, subplots

__all__ = ["FAMILY_STYLE", "plot_training_curves", "plot_removal_curves", "plot_init_by_depth"]

# colour per mechanism; the BatchNorm-free variant (-nf) keeps its colour and is dashed
_COLORS = {"residual": "#1f77b4", "gated": "#2ca02c", "rezero": "#ff7f0e", "layerscale": "#9467bd"}
FAMILY_STYLE: dict[str, dict[str, Any]] = {
    family + suffix: {"color": color, "linestyle": "--" if suffix else "-"}
    for family, color in _COLORS.items() for suffix in ("", "-nf")}


def _depth_curves(summary: dict[str, Any], family: str, depth: int) -> list[list[float]]:
    out = []
    for seed in range(summary["config"]["seeds"]):
        curve = summary.get("curves", {}).get(f"{family}-d{depth}-s{seed}")
        if curve and curve["train_loss"]:
            out.append([math.nan if v is None else float(v) for v in curve["train_loss"]])
    return out


def plot_training_curves(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Training loss against epoch, one panel per depth, one line per family (mean over seeds, band:
    lowest to highest seed); BatchNorm-free variants dashed in their mechanism's colour; the title names
    the study's data set. Depths with no epoch yet are drawn as empty panels marked "pending"."""
    config = summary["config"]
    depths, families = config["depths"], config["families"]
    curves = {(family, depth): _depth_curves(summary, family, depth) for depth in depths for family in families}
    fig, axes = subplots(1, len(depths), figsize=(3.4 * len(depths), 3.6), sharey=True, squeeze=False)
    for ax, depth in zip(axes[0], depths):
        drawn = False
        for family in families:
            seeds = curves[(family, depth)]
            if not seeds:
                continue
            mean, low, high = mean_band(seeds)
            epochs = list(range(1, len(mean) + 1))
            style = FAMILY_STYLE.get(family, {})
            ax.plot(epochs, mean, label=f"{family} (n={len(seeds)})", marker="o" if len(mean) < 10 else None,
                    markersize=3, **style)
            if len(seeds) > 1:
                ax.fill_between(epochs, low, high, color=style.get("color"), alpha=0.15, linewidth=0)
            drawn = True
        ax.set_title(f"d = {depth}")
        if not drawn:
            _pending(ax)
        ax.set_xlim(0, config["epochs"] + 1)
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("train cross-entropy")
    figure_legend(fig, axes[0])
    # studies written before the study took --dataset record none: they ran on MNIST
    fig.suptitle(f"{dataset_title(config.get('dataset', 'mnist'))} training loss by depth and gate family: mean over "
                 f"seeds, band lowest to highest seed", y=1.12)
    return save_figure(fig, path)


def plot_removal_curves(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Share of test accuracy kept against the fraction of blocks removed, one panel per depth with more
    than one block, one colour per gated family: smallest |gate| first (solid) and random orders
    (dotted; mean over each net's orders); mean over seeds, band lowest to highest seed for the former."""
    config = summary["config"]
    depths = [d for d in config["depths"] if d // 2 >= 2]
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    families = [f for f in config["families"] if any(by.get((f, d), {}).get("removal") for d in depths)]
    fig, axes = subplots(1, max(1, len(depths)), figsize=(3.4 * max(1, len(depths)), 3.6), sharey=True,
                             squeeze=False)
    for ax, depth in zip(axes[0], depths):
        drawn = False
        for family in families:
            records = by[(family, depth)].get("removal") or []
            if not records:
                continue
            blocks = records[0]["blocks"]
            fraction = [r / blocks for r in range(blocks + 1)]
            greedy = [[v / r["greedy"][0] for v in r["greedy"]] for r in records]
            random = [[sum(c[i] for c in r["random"]) / len(r["random"]) / r["random"][0][0]
                       for i in range(blocks + 1)] for r in records]
            color = FAMILY_STYLE.get(family, {}).get("color")
            mean, low, high = mean_band(greedy)
            ax.plot(fraction, mean, color=color, linestyle=FAMILY_STYLE[family]["linestyle"],
                    label=f"{family} (n={len(records)})")
            ax.fill_between(fraction, low, high, color=color, alpha=0.15, linewidth=0)
            ax.plot(fraction, mean_band(random)[0], color=color, linestyle=":", alpha=0.8)
            drawn = True
        ax.set_title(f"d = {depth}")
        if drawn:
            ax.axvline(0.5, color="grey", linewidth=0.8)  # half the blocks: the tables' share
        else:
            _pending(ax)
        ax.set_xlim(0, 1)
        ax.set_xlabel("fraction of blocks removed")
        ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("test accuracy kept (share of full net)")
    figure_legend(fig, axes[0])
    fig.suptitle("Layer removal: smallest |gate| first (line, band over seeds) and random order (dotted)", y=1.12)
    return save_figure(fig, path)


def _pending(ax: Any) -> None:
    """Mark an empty panel: no seed of its depth has finished yet."""
    ax.text(0.5, 0.5, "pending", transform=ax.transAxes, ha="center", va="center", color="grey", fontsize="large")


def plot_init_by_depth(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """The gate families at initialisation against depth (experiments.gate_family_init): distance to
    identity, the fraction of the Hessian's eigenvalues that are zero, and over its non-zero eigenvalues
    the P10 condition number and the index (the paper's measures over the whole spectrum are undefined
    for most of these ReLU nets: see table.md); mean over seeds, error bars one standard deviation.
    A family whose distance is 0 at every depth (ReZero: α = 0) is named in the panel, as a log axis
    cannot draw it."""
    config = summary["config"]
    panels = [("distance_to_identity", "squared distance to identity", True),
              ("zero_fraction", "fraction of zero eigenvalues", False),
              ("nonzero_condition", "max|λ| / P10|λ|, non-zero λ", True),
              ("nonzero_index", "index (share of λ < 0), non-zero λ", False)]
    fig, axes = subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False)
    by = {(p["family"], p["depth"]): p for p in summary["points"]}
    depths = [d for d in config["depths"] if d > 0]
    for ax, (measure, label, log) in zip(axes[0], panels):
        zero = []
        for family in config["families"]:
            style = FAMILY_STYLE.get(family, {})
            shown = [(d, by[(family, d)][measure]) for d in depths
                     if by[(family, d)]["seeds"] and by[(family, d)][measure]["mean"] is not None]
            if log and shown and all(s["mean"] == 0 for _, s in shown):
                zero.append(family)
            if log:
                shown = [(d, s) for d, s in shown if s["mean"] > 0]
            if shown:
                ax.errorbar([d for d, _ in shown], [s["mean"] for _, s in shown], yerr=[s["std"] or 0.0 for _, s in shown],
                            marker="o", markersize=4, capsize=2, label=family, **style)
        if zero:
            ax.text(0.98, 0.02, " and ".join(zero) + ": 0 at every depth", transform=ax.transAxes, ha="right",
                    va="bottom", fontsize="x-small")
        ax.set_xscale("log")
        ax.set_xticks(depths)
        ax.set_xticklabels([str(d) for d in depths])
        ax.xaxis.set_minor_locator(NullLocator())
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("depth d")
        ax.set_title(label, fontsize="medium")
        ax.grid(True, which="both", alpha=0.3)
    figure_legend(fig, axes[0])
    fig.suptitle(f"Gate families at initialisation, mean ± std over {config['seeds']} seeds (Hessian of the "
                 f"cross-entropy: width-{config['hessian_width']} proxies, {config['samples']} whitened MNIST images)",
                 y=1.12)
    return save_figure(fig, path)
