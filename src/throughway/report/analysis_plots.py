"""Figures of the gate analyses, drawn from their results files (never from live models).

* `plot_k_by_block`: k against block index (gated-residual-v2 figure 5 left, figure 7).
* `plot_removal_curves`: test accuracy against the number of removed layers, greedy and random
  (mean ± std) for gated and ungated residual nets (gated-residual-v2 figure 5 right).
* `plot_highway_maps`: layers × blocks heatmaps of transform-gate biases, mean gate output, gate
  outputs and block outputs for one sample (highway figure 2).
* `plot_class_differences`: class-mean minus overall-mean gate output (highway figure 3).
* `plot_lesion`: training-set error with one layer lesioned, per layer, and the unlesioned error as
  a dashed line (highway figure 4).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Patch
from matplotlib.ticker import FormatStrFormatter, MaxNLocator, NullFormatter

from .figures import save_figure, subplots

__all__ = ["plot_k_by_block", "plot_removal_curves", "plot_highway_maps", "plot_class_differences", "plot_lesion"]

_FAMILY_COLORS = {"gated": "#2ca02c", "residual": "#1f77b4", "augmented": "#ff7f0e", "highway": "#9467bd"}


def _run_label(result: dict[str, Any]) -> str:
    label = f"{result.get('family', '?')} d={result.get('depth', '?')}"
    final = result.get("run_final") or {}
    if final.get("snapshot"):  # an unfinished run analysed from a checkpoint: say which epoch
        label += f" (after epoch {final.get('epochs_completed')})"
    return label


def plot_k_by_block(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Bar plot of k by block index (1-based, as in the paper), with the mean k and k = 0 marked and
    dead gates (k ≤ 0) in red, from an `analyze gates` result (keys k, k_mean, dead_blocks, family,
    depth, dataset; paper.figure names the paper's figure: 5 left for MNIST, 7 for CIFAR)."""
    ks = np.asarray(result["k"], dtype=float)
    index = np.arange(1, len(ks) + 1)
    dead = set(result.get("dead_blocks", []))
    colors = ["#d62728" if i in dead else _FAMILY_COLORS["gated"] for i in range(len(ks))]
    fig, ax = subplots(figsize=(max(6.0, 0.14 * len(ks) + 2), 3.8))
    ax.bar(index, ks, color=colors, width=0.8, label="k of the block")
    ax.axhline(result["k_mean"], color="black", linestyle="--", linewidth=1,
               label=f"mean k = {result['k_mean']:.3f}")
    paper = result.get("paper", {}).get("k_mean")
    if paper is not None:
        differs = " (this run differs: " + ", ".join(d.split(" (")[0] for d in result["paper"]["setting_differences"]) + ")" \
            if result.get("paper", {}).get("setting_differences") else ""
        ax.axhline(paper, color="grey", linestyle=":", linewidth=1.2, label=f"paper's mean k = {paper}{differs}")
    ax.axhline(0, color="black", linewidth=0.6)
    handles, _ = ax.get_legend_handles_labels()
    if dead:  # an empty bar() gets the colour cycle's, not the red of the dead bars: draw the key itself
        handles.append(Patch(color="#d62728", label=f"dead gate (k ≤ 0): {len(dead)} blocks"))
    ax.set_xlabel("residual block index (1 = first block after the stem)")
    ax.set_ylabel("k")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0.3, len(ks) + 0.7)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(handles=handles, loc="best", fontsize=8)
    figure = result.get("paper", {}).get("figure", "figure 5 left")
    ax.set_title(f"k by block, {_run_label(result)} on {result.get('dataset', '?')} "
                 f"(gated-residual-v2 {figure})")
    return save_figure(fig, path)


def plot_removal_curves(results: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Test accuracy (%) against the number of removed layers: one line per strategy and run, the
    random strategy as mean ± std over its orders (shaded), from `analyze prune` results (keys
    family, layers_per_block, full_accuracy_pct, greedy {accuracy_pct}, random {mean, std})."""
    fig, ax = subplots(figsize=(7.0, 4.4))
    lowest = 100.0
    for result in results:
        color = _FAMILY_COLORS.get(str(result.get("family")), None)
        per = int(result.get("layers_per_block", 1))
        label = _run_label(result)
        random = result.get("random")
        if random:
            mean, std = np.asarray(random["mean"], float), np.asarray(random["std"], float)
            x = np.arange(len(mean)) * per
            ax.plot(x, mean, color=color, label=f"{label}, random (mean ± std of {len(random['orders'])} orders)")
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
            lowest = min(lowest, float((mean - std).min()))
        greedy = result.get("greedy")
        if greedy:
            acc = np.asarray(greedy["accuracy_pct"], float)
            ax.plot(np.arange(len(acc)) * per, acc, color=color, linestyle="--", label=f"{label}, greedy (smallest k first)")
            lowest = min(lowest, float(acc.min()))
    if results:
        total = int(results[0].get("num_blocks", 0)) * int(results[0].get("layers_per_block", 1))
        if total:
            ax.axvline(total / 2, color="grey", linestyle=":", linewidth=1, label="half of the layers removed")
        full = results[0].get("full_accuracy_pct")
        if full is not None:  # the gated-residual-v2 abstract's yardstick: "over 90% of its performance"
            ax.axhline(0.9 * full, color="grey", linestyle="-.", linewidth=1,
                       label=f"90% of the full {results[0].get('family', '')} model's accuracy")
            lowest = min(lowest, 0.9 * full)
    pers = sorted({int(r.get("layers_per_block", 1)) for r in results})
    ax.set_xlabel("number of removed layers" + (f" ({pers[0]} per removed block)" if len(pers) == 1 else ""))
    ax.set_ylabel("test accuracy (%)")
    # From a round number below the lowest curve: a 0–100 axis would squeeze 98% vs 80% into a sliver.
    ax.set_ylim(max(0.0, 10.0 * np.floor((lowest - 2.0) / 10.0)), 100)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    dataset = results[0].get("dataset", "?") if results else "?"
    ax.set_title(f"Accuracy after removing residual blocks, {dataset} (gated-residual-v2 figure 5 right)")
    return save_figure(fig, path)


def _heatmap(ax: Axes, data: np.ndarray, title: str, cmap: str, vmin: float | None = None,
             vmax: float | None = None) -> None:
    image = ax.imshow(data, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest",
                      extent=(0.5, data.shape[1] + 0.5, data.shape[0] + 0.5, 0.5))
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("block")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.03)


def plot_highway_maps(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Highway figure 2 (one row): heatmaps with highway layers on the y-axis and blocks on the x-axis
    of transform-gate biases, mean T(x) over the dataset, T(x) for one sample and the block outputs
    for that sample, from an `analyze highway` result."""
    biases = np.asarray(result["biases"], float)
    mean = np.asarray(result["mean_gate"], float)
    sample = result["sample"]
    gates = np.asarray(sample["gates"], float)
    outputs = np.asarray(sample["outputs"], float)
    fig, axes = subplots(1, 4, figsize=(18, 4.6), gridspec_kw={"wspace": 0.4})
    # The biases' own range: a scale symmetric about 0 would paint −2.5 and −1.7 the same blue.
    _heatmap(axes[0], biases, "transform gate biases b_T", "magma", float(biases.min()), float(biases.max()))
    _heatmap(axes[1], mean, f"mean T(x) over {result.get('mean_over', 'the data')}", "viridis", 0.0, 1.0)
    _heatmap(axes[2], gates, f"T(x), one sample (#{sample['index']}, class {sample['label']})", "viridis", 0.0, 1.0)
    span = float(np.abs(outputs).max()) or 1.0
    _heatmap(axes[3], outputs, "block outputs y, same sample", "RdBu_r", -span, span)
    axes[0].set_ylabel("highway layer (1 = first after the plain layer)")
    fig.suptitle(f"{_run_label(result)}: {result.get('num_layers')} highway layers × {result.get('num_blocks')} blocks, "
                 f"{result.get('dataset', '?')} (highway paper figure 2; bias initialised to {result.get('gate_bias_init')})",
                 y=1.02)
    return save_figure(fig, path)


def plot_class_differences(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Highway figure 3: for each chosen class, mean T(x) over that class minus the mean over all
    samples, layers × blocks, on one symmetric colour scale, from an `analyze highway` result."""
    diffs = result["class_differences"]
    labels = list(diffs)
    arrays = [np.asarray(diffs[k], float) for k in labels]
    span = max(float(np.abs(a).max()) for a in arrays) or 1.0
    fig, axes = subplots(1, len(arrays), figsize=(4.8 * len(arrays), 4.6), squeeze=False,
                             gridspec_kw={"wspace": 0.4})
    for ax, label, data in zip(axes[0], labels, arrays):
        _heatmap(ax, data, f"class {label}: class mean T(x) − overall mean", "RdBu_r", -span, span)
    axes[0][0].set_ylabel("highway layer")
    fig.suptitle(f"Data-dependent routing, {_run_label(result)} on {result.get('dataset', '?')} "
                 f"(highway paper figure 3)", y=1.03)
    return save_figure(fig, path)


def plot_lesion(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Highway figure 4: training-set error (%) with one layer's gates closed, against the lesioned
    layer (1-based block index), and the unlesioned error as a dashed line, from an `analyze lesion`
    result (keys lesioned_error_pct, unlesioned_error_pct, family, split)."""
    errors = np.asarray(result["lesioned_error_pct"], float)
    index = np.arange(1, len(errors) + 1)
    color = _FAMILY_COLORS.get(str(result.get("family")), "#9467bd")
    fig, ax = subplots(figsize=(max(6.0, 0.13 * len(errors) + 2), 4.0))
    unit = "highway layer" if result.get("family") == "highway" else "residual block"
    ax.plot(index, errors, marker="o", markersize=3.5, color=color, label=f"one {unit} lesioned")
    ax.axhline(result["unlesioned_error_pct"], color="black", linestyle="--", linewidth=1,
               label=f"not lesioned ({result['unlesioned_error_pct']:.2f}%)")
    ax.set_xlabel(f"lesioned {unit} (1 = first after the plain stem)")
    ax.set_ylabel(f"{result.get('split', 'training')}-set error (%)")
    # A log axis shows both a near-zero unlesioned error and large lesioned ones (the paper's figure 4
    # spans 0.1% to 90%). It needs every value > 0, and pays only across more than a decade: within
    # one, its ticks fall outside the data and a linear axis reads better.
    low = min(errors.min(), result["unlesioned_error_pct"])
    if low > 0 and errors.max() / low >= 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper center", fontsize=8)  # lesioned peaks sit at the first and last layers
    ax.set_title(f"Lesioning one layer at a time, {_run_label(result)} on {result.get('dataset', '?')} "
                 f"(highway paper figure 4)")
    return save_figure(fig, path)
