"""Figures, drawn from results files only (never from live models), so they can be remade any time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402

from .._io import atomic_write_bytes  # noqa: E402

__all__ = ["plot_training_curves", "save_figure", "ARCH_COLORS"]

ARCH_COLORS = {"plain": "#d62728", "residual": "#1f77b4", "gated": "#2ca02c", "highway": "#9467bd"}


def save_figure(fig: "plt.Figure", path: str | os.PathLike[str], dpi: int = 130) -> Path:
    """Save `fig` as PNG atomically and close it."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())


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
