"""Figures of the MNIST depth study (gated-residual-v2 Table 1, figures 4 and 5 left), drawn from
its results.json summary alone (`experiments.mnist_depth.summarize`), so they can be remade any time.

Every figure shows the spread over seeds: a band (min to max over seeds) around the mean curve, or
error bars of one standard deviation, because a single seed's curve is not a finding.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from .figures import mean_band, save_figure, subplots
from .plots import ARCH_COLORS

__all__ = ["plot_training_curves", "plot_error_by_depth", "plot_k_by_block"]


def _curves(summary: dict[str, Any], arch: str, depth: int, key: str) -> list[list[float]]:
    out = []
    for seed in range(summary["config"]["seeds"]):
        curve = summary["curves"].get(f"{arch}-d{depth}-s{seed}")
        if curve and curve["epoch"]:
            out.append([v if v is not None else math.nan for v in curve[key]])
    return out


def plot_training_curves(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """gated-residual-v2 figure 4: training loss against epoch, one panel per depth, one colour per
    architecture: the mean over seeds as a line, the band from the lowest to the highest seed."""
    config = summary["config"]
    depths, archs = config["depths"], config["archs"]
    fig, axes = subplots(1, len(depths), figsize=(3.2 * len(depths), 3.4), sharey=True, squeeze=False)
    for ax, depth in zip(axes[0], depths):
        for arch in archs:
            curves = _curves(summary, arch, depth, "train_loss")
            if not curves:
                continue
            mean, low, high = mean_band(curves)
            epochs = list(range(1, len(mean) + 1))
            color = ARCH_COLORS.get(arch)
            ax.plot(epochs, mean, color=color, marker="o" if len(mean) < 10 else None, markersize=3,
                    label=f"{arch} (n={len(curves)})" if len(curves) > 1 else arch)
            if len(curves) > 1:
                ax.fill_between(epochs, low, high, color=color, alpha=0.25, linewidth=0)
        ax.set_yscale("log")
        ax.set_title(f"d = {depth}")
        ax.set_xlabel("epoch")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("train cross-entropy (mean over the epoch)")
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab.split(" ")[0] not in [x.split(" ")[0] for x in labels]:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), bbox_to_anchor=(0.5, 1.08), frameon=False)
    fig.suptitle("MNIST training loss by depth, mean over seeds, band: lowest to highest seed "
                 "(gated-residual-v2 figure 4)", y=1.15)
    return save_figure(fig, path)


_ERROR_TICKS = [1, 1.5, 2, 3, 5, 10, 20, 50, 90]


def plot_error_by_depth(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Test error against depth d beside the paper's Table 1 (dashed, open squares). Left: every
    architecture on a log axis with labelled ticks from 1% to 90%; right: residual and gated alone
    on a linear axis, mean ± std over seeds, where their differences lie."""
    config = summary["config"]
    depths = config["depths"]
    fig, (left, right) = subplots(1, 2, figsize=(11, 4.2))
    for ax, archs in ((left, config["archs"]), (right, [a for a in ("residual", "gated") if a in config["archs"]])):
        for arch in archs:
            cells = sorted((c for c in summary["cells"] if c["arch"] == arch), key=lambda c: c["depth"])
            measured = [(c["depth"], c["test_error_pct"]["mean"], c["test_error_pct"]["std"] or 0.0) for c in cells
                        if c["test_error_pct"]["mean"] is not None]
            color = ARCH_COLORS.get(arch)
            if measured:
                n = max(c["test_error_pct"]["n"] for c in cells)
                ax.errorbar([m[0] for m in measured], [m[1] for m in measured], yerr=[m[2] for m in measured],
                            color=color, marker="o", capsize=3, label=f"{arch}, ours (n={n})")
            paper = [(c["depth"], c["paper_test_error_pct"]) for c in cells if c["paper_test_error_pct"] is not None]
            if paper:
                ax.plot([p[0] for p in paper], [p[1] for p in paper], color=color, linestyle="--", marker="s",
                        markerfacecolor="none", label=f"{arch}, paper")
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xticks(depths)
        ax.set_xticklabels([str(d) for d in depths])
        ax.set_xlabel("d (middle layers)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    left.set_yscale("log")
    left.set_yticks(_ERROR_TICKS)
    left.set_yticklabels([f"{t:g}" for t in _ERROR_TICKS])
    left.minorticks_off()
    left.set_ylabel("test error (%)")
    left.set_title("all architectures (log axis)")
    right.set_ylabel("test error (%)")
    right.set_title("residual and gated (linear axis, mean ± std)")
    fig.suptitle(f"MNIST test error by depth after {config['epochs']} epochs "
                 f"(gated-residual-v2 Table 1: dashed)", y=1.02)
    return save_figure(fig, path)


def plot_k_by_block(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """gated-residual-v2 figure 5 left: the final k of each residual block of the deepest gated net,
    one thin line per seed and their mean in bold; blocks with k ≤ 0 are dead (g(k) = 0, identity)."""
    gated = [c for c in summary["cells"] if c["arch"] == "gated" and c.get("per_seed")]
    fig, ax = subplots(figsize=(7.5, 3.8))
    if not gated:
        ax.text(0.5, 0.5, "no finished gated run yet", ha="center", va="center", transform=ax.transAxes)
        return save_figure(fig, path)
    cell = max(gated, key=lambda c: c["depth"])
    runs = [r for r in cell["per_seed"] if r.get("k")]
    blocks = list(range(1, len(runs[0]["k"]) + 1))
    for r in runs:
        ax.plot(blocks, r["k"], color=ARCH_COLORS["gated"], alpha=0.35, linewidth=1,
                label=f"seed {r['seed']}: {r['dead_gates']} dead")
    mean = [sum(r["k"][i] for r in runs) / len(runs) for i in range(len(blocks))]
    ax.plot(blocks, mean, color="black", linewidth=2, label=f"mean over {len(runs)} seeds")
    ax.axhline(0.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("residual block (1 = first after the first layer)")
    ax.set_ylabel("k (g(k) = max(k, 0))")
    ax.set_title(f"Final k by block, gated net d = {cell['depth']} "
                 f"(paper, figure 5 left: smaller k near the middle)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)
