"""Figures, drawn from results files only (never from live models), so they can be remade any time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .figures import save_figure  # noqa: E402  (re-exported: it used to live here)

__all__ = ["plot_training_curves", "plot_error_by_depth", "save_figure", "ARCH_COLORS"]

ARCH_COLORS = {"plain": "#d62728", "residual": "#1f77b4", "gated": "#2ca02c", "highway": "#9467bd"}


def plot_training_curves(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """gated-residual-v2 figure 4: training loss against epoch, one panel per depth, one line per
    architecture (log scale), from an mnist-depth results.json summary."""
    config = summary["config"]
    depths, archs, seeds = config["depths"], config["archs"], config["seeds"]
    fig, axes = plt.subplots(1, len(depths), figsize=(3.4 * len(depths), 3.4), sharey=True, squeeze=False)
    for ax, depth in zip(axes[0], depths):
        for arch in archs:
            for seed in range(seeds):
                curve = summary["curves"].get(f"{arch}-d{depth}-s{seed}")
                if not curve or not curve["epoch"]:
                    continue
                losses = [v if v is not None else float("nan") for v in curve["train_loss"]]
                ax.plot(curve["epoch"], losses, color=ARCH_COLORS.get(arch), alpha=0.9 if seed == 0 else 0.4,
                        marker="o" if len(losses) < 10 else None, markersize=3,
                        label=arch if seed == 0 else None)
        ax.set_yscale("log")
        ax.set_title(f"d = {depth}")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("train cross-entropy (mean over the epoch)")
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), bbox_to_anchor=(0.5, 1.08), frameon=False)
    fig.suptitle("MNIST training loss by depth (gated-residual-v2 figure 4)", y=1.15)
    return save_figure(fig, path)


def plot_error_by_depth(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Test error against depth d, ours (solid, mean ± std over seeds) beside the paper's Table 1
    (dashed), one colour per architecture, from an mnist-depth results.json summary."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    archs = summary["config"]["archs"]
    for arch in archs:
        cells = sorted((c for c in summary["cells"] if c["arch"] == arch), key=lambda c: c["depth"])
        measured = [(c["depth"], c["test_error_pct"]["mean"], c["test_error_pct"]["std"]) for c in cells
                    if c["test_error_pct"]["mean"] is not None]
        if measured:
            ax.errorbar([m[0] for m in measured], [m[1] for m in measured], yerr=[m[2] for m in measured],
                        color=ARCH_COLORS.get(arch), marker="o", capsize=3, label=f"{arch} (ours)")
        paper = [(c["depth"], c["paper_test_error_pct"]) for c in cells if c["paper_test_error_pct"] is not None]
        if paper:
            ax.plot([p[0] for p in paper], [p[1] for p in paper], color=ARCH_COLORS.get(arch), linestyle="--",
                    marker="s", markerfacecolor="none", label=f"{arch} (paper)")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xticks(summary["config"]["depths"])
    ax.set_xticklabels([str(d) for d in summary["config"]["depths"]])
    ax.set_yscale("log")
    ax.set_xlabel("d (middle layers)")
    ax.set_ylabel("test error (%)")
    ax.set_title(f"MNIST test error by depth after {summary['config']['epochs']} epochs\n"
                 "(gated-residual-v2 Table 1: dashed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    return save_figure(fig, path)
