"""Figures of the convolutional runs, drawn from results files only (stdlib + matplotlib).

* `plot_error_curves`: training error (dashed) and test error (solid) against epoch, one colour
  per run or per model, in the style of gated-residual-v2 figure 6.
* `plot_k_by_block`: final k of each gated run by block index (gated-residual-v2 figure 7).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

import matplotlib
from matplotlib.ticker import FuncFormatter, MaxNLocator

from .figures import save_figure, subplots

__all__ = ["plot_error_curves", "plot_k_by_block"]


def plot_error_curves(runs: Mapping[str, dict[str, Any]], path: str | os.PathLike[str], title: str,
                      colors: Mapping[str, str] | None = None,
                      reference: tuple[float, str] | None = None) -> Path:
    """Train (dashed) and test (solid, with markers) error (%) by epoch for each run, on a log axis
    (gated-residual-v2 figure 6). `runs` maps a label to a results.json dict (its `history`); runs
    without a finished epoch are skipped. `colors` may give labels a colour (e.g. one per model, so
    that seeds share it; they then differ by marker); otherwise each run gets the next colour.
    `reference` = (error %, label) draws a paper's number as a black dotted line, labelled in the
    legend. The legend names each run once, by its test line."""
    fig, ax = subplots(figsize=(6.4, 4.2))
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v"
    uses: dict[str, int] = {}
    drawn = 0
    for i, (label, result) in enumerate(runs.items()):
        history = result.get("history") or []
        if not history:
            continue
        epochs = [h["epoch"] for h in history]
        color = colors[label] if colors and label in colors else cycle[i % len(cycle)]
        marker = markers[uses.get(color, 0) % len(markers)]
        uses[color] = uses.get(color, 0) + 1
        ax.plot(epochs, [h["train_error_pct"] for h in history], linestyle="--", color=color, alpha=0.7)
        ax.plot(epochs, [h["test_error_pct"] for h in history], linestyle="-", color=color, marker=marker,
                markersize=3, label=label)
        drawn += 1
    if reference is not None:
        ax.axhline(reference[0], color="black", linestyle=":", linewidth=1.4, label=reference[1])
    ax.set_yscale("log")
    # Plain numbers on the log axis: error percentages read better as 8, 10, 20 than as 10^1.
    # Labels at the decades and at 2 and 5 times them; the other minor ticks stay unlabelled.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v)), 6) in (2.0, 5.0) else ""))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("epoch")
    ax.set_ylabel("error (%) — solid: test, dashed: training")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="both", alpha=0.3)
    if drawn or reference is not None:
        ax.legend(fontsize=7, frameon=False)
    ax.set_title(title)
    return save_figure(fig, path)


def plot_k_by_block(runs: Mapping[str, dict[str, Any]], path: str | os.PathLike[str], title: str) -> Path:
    """Final k by block index (1-based) for each gated run; runs without k are skipped."""
    fig, ax = subplots(figsize=(6.4, 3.6))
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
