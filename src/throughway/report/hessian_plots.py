"""Figures of the Hessian, shortcut-network and distance-to-identity studies, drawn from results files.

Every function takes the summary dict that an experiment wrote to results.json (never live
objects), so figures can be remade with `throughway report DIR`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

from .figures import save_figure, subplots

__all__ = ["NETWORK_COLORS", "plot_condition_vs_depth", "plot_spectrum_vs_loss", "plot_index_vs_loss",
           "plot_gradient_and_index", "plot_lr_study", "plot_weight_norms", "plot_identity_distance"]

NETWORK_COLORS = {"xavier": "#d62728", "orthogonal": "#1f77b4", "shortcut1-zero": "#9467bd",
                  "shortcut2-zero": "#2ca02c", "shortcut3-zero": "#ff7f0e"}
NETWORK_LABELS = {"xavier": "Xavier (plain)", "orthogonal": "orthogonal (plain)", "shortcut1-zero": "1-shortcut, zero init",
                  "shortcut2-zero": "2-shortcut, zero init", "shortcut3-zero": "3-shortcut, zero init"}


def _none_to_nan(values: list[Any]) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def plot_condition_vs_depth(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Demystifying ResNet figure 4: initial condition number (mean ± std over runs) against depth,
    log scale; a second panel shows the n = 1, 2 condition numbers at the exact zero point (Theorem 2)."""
    theorem2 = summary.get("theorem2") or []
    fig, axes = subplots(1, 2 if theorem2 else 1, figsize=(11 if theorem2 else 6, 4.2), squeeze=False)
    ax = axes[0][0]
    for network in summary["config"]["networks"]:
        # A mean over the runs whose condition number is defined would be biased: such depths show
        # their defined runs as dots only.
        pts = [p for p in summary["points"] if p["network"] == network and p["condition"]["mean"] is not None
               and not p.get("undefined_condition")]
        partial = [p for p in summary["points"] if p["network"] == network and p.get("undefined_condition")]
        ax.scatter([p["depth"] for p in partial for _ in p["condition"].get("values", [])],
                   [v for p in partial for v in p["condition"].get("values", [])], s=6, alpha=0.35,
                   color=NETWORK_COLORS.get(network))
        if not pts:
            continue
        depths = [p["depth"] for p in pts]
        means = [p["condition"]["mean"] for p in pts]
        stds = [p["condition"]["std"] or 0.0 for p in pts]
        # On a log axis a bar below zero cannot be drawn: the lower bar stops at the smallest run.
        lows = [min(s, m - min(p["condition"].get("values") or [m])) for s, m, p in zip(stds, means, pts)]
        ax.errorbar(depths, means, yerr=[lows, stds], marker="o", capsize=3, color=NETWORK_COLORS.get(network),
                    label=NETWORK_LABELS.get(network, network))
        ax.scatter([p["depth"] for p in pts for _ in p["condition"].get("values", [])],
                   [v for p in pts for v in p["condition"].get("values", [])], s=6, alpha=0.35,
                   color=NETWORK_COLORS.get(network))
    undefined = [f"{NETWORK_LABELS.get(p['network'], p['network'])} L={p['depth']}: {p['undefined_condition']} of "
                 f"{p['runs']}" for p in summary["points"] if p.get("undefined_condition")]
    if undefined:
        ax.text(0.02, 0.98, "undefined (P10 |λ| within tolerance), no mean drawn:\n" + "\n".join(undefined),
                transform=ax.transAxes, fontsize=7, va="top")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("depth L (number of 10×10 layers)")
    ax.set_ylabel("initial condition number  max|λ| / P10(|λ|)")
    ax.set_title(f"Initial Hessian condition number (mean ± std, dots: {summary['config']['runs']} runs)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if theorem2:
        ax2 = axes[0][1]
        for n, color in ((1, NETWORK_COLORS["shortcut1-zero"]), (2, NETWORK_COLORS["shortcut2-zero"])):
            rows = [r for r in theorem2 if r["shortcut_depth"] == n and r["spectrum_condition"] is not None]
            if rows:
                ax2.plot([r["depth"] for r in rows], [r["spectrum_condition"] for r in rows], marker="o", color=color,
                         label=f"{n}-shortcut at exactly zero")
        zero3 = [r for r in theorem2 if r["shortcut_depth"] == 3]
        if zero3 and all(r["spectrum_zero"] for r in zero3):
            ax2.text(0.25, 0.3, "3-shortcut: gradient and Hessian\nexactly zero at every depth", transform=ax2.transAxes, fontsize=9)
        ax2.set_xscale("log", base=2)
        ax2.set_yscale("log")
        ax2.set_xlabel("depth L")
        ax2.set_ylabel("condition number max|λ| / P10(|λ|)")
        ax2.set_title("Theorem 2 at the zero point")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend()
    fig.tight_layout()
    return save_figure(fig, path)


def plot_spectrum_vs_loss(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Figure 5: max |λ| and 10th-percentile |λ| of the Hessian against the training loss (depth fixed)."""
    fig, axes = subplots(1, 2, figsize=(11, 4.2))
    for trace in summary["traces"]:
        network = trace["network"]
        points = trace["hessian"]
        loss = [p["loss"] for p in points]
        first = trace["seed"] == summary["config"]["seeds"][0]
        kw = {"color": NETWORK_COLORS.get(network), "alpha": 0.9 if first else 0.45, "marker": ".",
              "label": NETWORK_LABELS.get(network, network) if first else None}
        axes[0].plot(loss, [p["max_abs"] for p in points], **kw)
        axes[1].plot(loss, [p["low_abs"] for p in points], **kw)
    for ax, what in zip(axes, ("max |λ|", "10th percentile of |λ|")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.invert_xaxis()
        ax.set_xlabel("training loss (decreasing →)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Hessian spectrum along training, depth {summary['config']['depth']} (Demystifying ResNet figure 5)")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_index_vs_loss(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Figure 6 left: index (fraction of negative eigenvalues) against the training loss; points
    whose Hessian is singular to tolerance (index None: undefined) are left out, and the networks
    that have only such points are named in the figure."""
    fig, ax = subplots(figsize=(6, 4.2))
    left_out = set()
    for trace in summary["traces"]:
        network = trace["network"]
        points = [p for p in trace["hessian"] if p["index"] is not None]
        if not points:
            left_out.add(NETWORK_LABELS.get(network, network))
            continue
        first = trace["seed"] == summary["config"]["seeds"][0]
        ax.plot([p["loss"] for p in points], [p["index"] for p in points], marker=".",
                color=NETWORK_COLORS.get(network), alpha=0.9 if first else 0.45,
                label=NETWORK_LABELS.get(network, network) if first else None)
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("training loss (decreasing →)")
    ax.set_ylabel("index (fraction of negative eigenvalues)")
    ax.set_title(f"Index along training, depth {summary['config']['depth']} (figure 6, left)")
    if left_out:
        ax.text(0.02, 0.02, "index undefined (Hessian singular to tolerance): " + ", ".join(sorted(left_out)),
                transform=ax.transAxes, fontsize=7, va="bottom")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_gradient_and_index(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Figure 6 right: gradient norm (every epoch) and index (at the Hessian epochs) along one run of
    the 2-shortcut network."""
    trace = next((t for t in summary["traces"] if t["network"] == "shortcut2-zero"), summary["traces"][0])
    fig, ax = subplots(figsize=(6, 4.2))
    epochs = list(range(len(trace["gradient_norm"])))
    ax.plot(epochs, _none_to_nan(trace["gradient_norm"]), color="#2ca02c", label="gradient norm")
    ax.set_xlabel("epoch")
    ax.set_ylabel("‖∇ℓ‖")
    ax.set_xscale("symlog", linthresh=10)
    ax.grid(True, which="both", alpha=0.3)
    ax2 = ax.twinx()
    defined = [p for p in trace["hessian"] if p["index"] is not None]
    ax2.plot([p["epoch"] for p in defined], [p["index"] for p in defined], color="#d62728",
             marker="o", markersize=3, label="index")
    ax2.set_ylabel("index (fraction of negative eigenvalues)")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center right")
    ax.set_title(f"{NETWORK_LABELS.get(trace['network'], trace['network'])}, depth {summary['config']['depth']}, "
                 f"seed {trace['seed']} (figure 6, right)", fontsize=9)
    return save_figure(fig, path)


def plot_lr_study(summary: dict[str, Any], path: str | os.PathLike[str], activation_label: str) -> Path:
    """Figures 7 and 8: best final loss against depth (left) and the learning rate that gave it (right)."""
    fig, axes = subplots(1, 2, figsize=(11, 4.2))
    # Linear networks cannot beat the least-squares loss, so their excess over it is what separates
    # the curves (a log scale of the loss itself hides it).
    excess = summary["config"].get("activation") == "linear" and summary.get("optimal_linear_loss") is not None
    floor = summary["optimal_linear_loss"] if excess else 0.0
    for network in summary["config"]["networks"]:
        pts = [p for p in summary["points"] if p["network"] == network and p["best_loss"] is not None]
        if not pts:
            continue
        kw = {"marker": "o", "color": NETWORK_COLORS.get(network), "label": NETWORK_LABELS.get(network, network)}
        axes[0].plot([p["depth"] for p in pts], [max(p["best_loss"] - floor, 1e-12) for p in pts], **kw)
        axes[1].plot([p["depth"] for p in pts], [p["best_lr"] for p in pts], **kw)
    lrs = [10.0 ** e for e in summary["config"]["lr_exponents"]]
    axes[1].axhline(max(lrs), color="grey", ls=":", lw=1, label="largest rate of the grid")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("depth L")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"best final loss − least-squares loss ({summary['optimal_linear_loss']:.4f})" if excess
                       else f"best final training loss after {summary['config']['epochs']} epochs")
    axes[1].set_ylabel("learning rate of the best final loss")
    fig.suptitle(f"Best final loss over a learning-rate grid, {activation_label}")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_weight_norms(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Figure 3: average Frobenius norm of the weight matrices along training, one line per depth,
    one panel per activation setting."""
    panels = summary["config"]["activations"]
    fig, axes = subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    cmap = matplotlib.colormaps["viridis"]
    depths = summary["config"]["depths"]
    for ax, activation in zip(axes[0], panels):
        for i, depth in enumerate(depths):
            curve = summary["curves"].get(f"{activation}-L{depth}")
            if not curve:
                continue
            ax.plot(range(len(curve["avg_frobenius"])), _none_to_nan(curve["avg_frobenius"]),
                    color=cmap(i / max(1, len(depths) - 1)), label=f"L = {depth}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("average ‖W‖_F over layers")
        ax.set_title("linear" if activation == "linear" else f"{activation} at mid positions")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("2-shortcut networks, zero init: average Frobenius norm of the weights (Demystifying ResNet figure 3)")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_identity_distance(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Distance travelled from initialisation and distance to the nearest identity configuration,
    per epoch, one panel per architecture (beyond the papers: is SDI a surrogate for the path?)."""
    runs = summary["runs"]
    fig, axes = subplots(1, len(runs), figsize=(4.6 * len(runs), 4.0), squeeze=False)
    for ax, run in zip(axes[0], runs):
        records = run["distance"]
        epochs = [r["epoch"] for r in records]
        ax.plot(epochs, [r["travelled_sq"] for r in records], marker="o", label="‖θ_t − θ_0‖² (travelled)")
        ax.plot(epochs, [r["path_length"] ** 2 for r in records], marker=".", ls=":", label="(path length)²")
        ax.plot(epochs, [r["identity_sq"] for r in records], marker="s", label="squared distance to the paper's identity")
        nearest = [r.get("nearest_identity_sq") for r in records]
        if all(v is not None for v in nearest):
            ax.plot(epochs, nearest, marker="^", ls="--", label="squared distance to the nearest identity")
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_xlabel("epoch")
        ax.set_title(f"{run['arch']}, d = {run['depth']}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("squared parameter distance (middle blocks)")
    fig.suptitle("Distance travelled vs distance to identity during MNIST training")
    fig.tight_layout()
    return save_figure(fig, path)


def _finite(values: list[Any]) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def plot_tsdi_vs_width(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """TSDI against layer width for classical, highway, residual and gated layers (gated-residual-v1
    section 2): one panel per initialisation convention (the paper's He with σ_b² = 2/n, the
    toolkit's Glorot with zero biases), each curve labelled at its right end instead of a legend;
    layers whose curves coincide share one label ("highway = residual")."""
    colors = {"classical": "#d62728", "highway": "#9467bd", "residual": "#1f77b4", "gated": "#2ca02c"}
    titles = {"paper": "paper's init: He, σ_b² = 2/n", "toolkit": "toolkit's init: Glorot, zero bias"}
    widths = summary["widths"]
    conventions = [c for c in ("paper", "toolkit") if c in summary["curves"]]
    fig, axes = subplots(1, len(conventions), figsize=(4.6 * len(conventions), 4.2), sharey=True, squeeze=False)
    for ax, convention in zip(axes[0], conventions):
        curves = summary["curves"][convention]
        drawn: list[list[str]] = []  # groups of layers with identical curves, drawn once, labelled once
        for layer, values in curves.items():
            group = next((g for g in drawn if curves[g[0]] == values), None)
            if group is not None:
                group.append(layer)
                # Highway (c = the gate's initial bias) and residual coincide: highway wide and pale underneath.
                ax.plot(widths, values, "-", color=colors.get(layer), lw=6, alpha=0.35, zorder=1)
                continue
            drawn.append([layer])
            ax.plot(widths, values, "-", marker="o", markersize=3, color=colors.get(layer), lw=1.8, zorder=2)
        for group in drawn:
            last = curves[group[0]][-1]
            ax.annotate(" = ".join(group), (widths[-1], last), xytext=(6, 0), textcoords="offset points",
                        va="center", fontsize=9, color=colors.get(group[0]), fontweight="bold")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(min(widths) * 0.8, max(widths) * 12)  # room for the labels at the right
        ax.set_xticks([w for w in widths if math.log10(w).is_integer()] + [max(widths)])
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("width n")
        ax.set_title(titles.get(convention, convention), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("TSDI (sum of M and B)")
    gate_bias = summary.get("config", {}).get("gate_bias")
    fig.suptitle("Distance to identity at initialisation grows with width, except for gated layers"
                 + (f"\n(highway: target c = initial gate bias = {gate_bias:g})" if gate_bias is not None else ""),
                 fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)
