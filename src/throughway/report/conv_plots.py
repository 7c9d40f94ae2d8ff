"""Figures of the convolutional runs, drawn from results files only (stdlib + matplotlib).

* `plot_error_curves`: training error (dashed) and test error (solid) against epoch, one colour
  per run, in the style of gated-residual-v2 figure 6.
* `plot_k_by_block`: final k of each gated run by block index (gated-residual-v2 figure 7).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .plots import save_figure  # noqa: E402

__all__ = ["plot_error_curves", "plot_k_by_block"]


def plot_error_curves(runs: Mapping[str, dict[str, Any]], path: str | os.PathLike[str], title: str) -> Path:
    """Train (dashed) and test (solid) error (%) by epoch for each run; `runs` maps a label to a
    results.json dict (its `history`). Runs without a finished epoch are skipped."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, result) in enumerate(runs.items()):
        history = result.get("history") or []
        if not history:
            continue
        epochs = [h["epoch"] for h in history]
        color = colors[i % len(colors)]
        ax.plot(epochs, [h["train_error_pct"] for h in history], linestyle="--", color=color, alpha=0.8,
                label=f"{label} (train)")
        ax.plot(epochs, [h["test_error_pct"] for h in history], linestyle="-", color=color, marker="o",
                markersize=3, label=f"{label} (test)")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("error (%)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    ax.set_title(title)
    return save_figure(fig, path)


def plot_k_by_block(runs: Mapping[str, dict[str, Any]], path: str | os.PathLike[str], title: str) -> Path:
    """Final k by block index (1-based) for each gated run; runs without k are skipped."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    drawn = 0
    for label, result in runs.items():
        history = result.get("history") or []
        if not history or not history[-1].get("k"):
            continue
        ks = history[-1]["k"]
        ax.plot(range(1, len(ks) + 1), ks, marker="o", label=label)
        drawn += 1
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("residual block (input to output)")
    ax.set_ylabel("k at the last epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, frameon=False)
    ax.set_title(title)
    return save_figure(fig, path)
