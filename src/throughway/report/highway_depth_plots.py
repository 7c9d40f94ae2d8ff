"""Highway paper figure 1 from a highway-depth results.json: training loss of plain and highway nets
by depth, the best trial (left) and the mean of the top 10 trials (right)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator

from .figures import save_figure, subplots

__all__ = ["plot_figure1", "LAYER_COLORS"]

LAYER_COLORS = {10: "#1f77b4", 20: "#2ca02c", 50: "#ff7f0e", 100: "#d62728"}
ARCH_STYLES = {"plain": "--", "highway": "-"}


def _positive(values: list[Any]) -> list[float]:
    # A log axis cannot show 0 or a missing value: NaN leaves a gap.
    return [v if isinstance(v, (int, float)) and v > 0 else float("nan") for v in values]


def plot_figure1(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Two panels, log-scale training loss against epoch: left the best trial of every (architecture,
    depth), right the mean of the top 10 trials (highway §3.1, figure 1), ranked as the summary's
    config says (rank: the lowest loss of any epoch; summaries without it: the last epoch's). Colour = depth, line style
    = architecture (dashed plain, solid highway)."""
    fig, axes = subplots(1, 2, figsize=(11, 4.2), sharey=True)
    ranked = {"best-loss": "lowest training loss of any epoch"}.get(summary.get("config", {}).get("rank", ""),
                                                                     "lowest final training loss")
    titles = (f"best trial ({ranked})", "mean of the top 10 trials")
    for ax, title, key in zip(axes, titles, ("best", "top10")):
        for cell in summary["cells"]:
            data = cell.get(key)
            curve = (data or {}).get("train_loss" if key == "best" else "mean_train_loss")
            if not curve:
                continue
            layers, arch = cell["layers"], cell["arch"]
            label = f"{arch}, {layers} layers" + (f" (n={data['n']})" if key == "top10" and data["n"] < 10 else "")
            ax.plot(range(1, len(curve) + 1), _positive(curve), ARCH_STYLES.get(arch, "-"),
                    color=LAYER_COLORS.get(layers), marker="o" if len(curve) < 10 else None, markersize=3, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("training cross-entropy (mean over the epoch)")
    config = summary.get("config", {})
    images = f"first {config['limit']:,}" if config.get("limit") else ("60,000" if config.get("train_on_full", True) else "50,000")
    fig.suptitle(f"MNIST, plain (dashed) vs highway (solid) nets — highway paper figure 1\n"
                 f"{config.get('trials', '?')} random-search trials per net, {config.get('epochs', '?')} epochs each, "
                 f"{images} training images", fontsize=10, y=1.03)
    return save_figure(fig, path)
