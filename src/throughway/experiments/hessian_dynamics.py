"""Demystifying ResNet figures 5 and 6: the Hessian along full-batch gradient descent at depth 16.

Linear networks on whitened MNIST (condensed exactly to its second moments), plain Xavier, plain
orthogonal and 2-shortcut zero-initialised (zero + 1e-4 × Xavier), `seeds` runs each, full-batch
GD with one learning rate for all (the paper's rate was lost in conversion; 0.01 by default,
which trains all three without diverging). The exact Hessian and its full spectrum are computed
at `hessian_points` log-spaced epochs (the paper: every epoch); the gradient norm every epoch.

Figure 5: max |λ| and the 10th percentile of |λ| against the loss; figure 6 left: the index
against the loss; figure 6 right: gradient norm and index along one 2-shortcut run.
Writes results.json, table.md and figure5_spectrum_vs_loss.png, figure6_index_vs_loss.png,
figure6_gradient_and_index.png.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .._io import atomic_write_json
from ..analysis.hessian import apply_tolerance, exact_hessian, spectrum_summary, squared_error_loss
from ..report.stats import finite
from ..report.tables import table_head, table_row
from ..study.options import option, MAX_SEEDS
from ..study.folders import read_summary
from ..study.summary import remake_report
from ..study.shortcut import network_kwargs, whitened_data
from ..train import TrainState
from ..train.full_batch import StackedGD, train_full_batch
from ..study.resumable import ResumableOptions, ResumableStudy

__all__ = ["NAME", "DESCRIPTION", "Config", "run", "write_report", "hessian_epochs", "findings_markdown",
           "figures56_contrary_pairs"]

NAME = "hessian-dynamics"
DESCRIPTION = "Demystifying ResNet figures 5, 6: Hessian max/P10 |λ|, index and gradient norm along GD training, depth 16"

PAPER_STATEMENT = ("Figure 5: the condition numbers of 2-shortcut networks at different losses are always smaller, "
                   "especially when the loss is large; orthogonal and 2-shortcut evolve to roughly the same value. "
                   "Figure 6: the index of a 2-shortcut network is always smaller and drops dramatically at the "
                   "beginning; the gradient norm reaches its maximum while the index drops.")


@dataclass(frozen=True)
class Config(ResumableOptions):
    """Settings of the study (see the module docstring)."""

    depth: int = option(16, "network depth L (paper: 16)", quick=4, minimum=1)
    networks: tuple[str, ...] = option(("xavier", "orthogonal", "shortcut2-zero"), "networks",
                                       choices=("xavier", "orthogonal", "shortcut1-zero", "shortcut2-zero"))
    seeds: tuple[int, ...] = option((0, 1, 2), "initialisation seeds, as a count", quick=(0,), count=True,
                                      maximum=MAX_SEEDS)
    epochs: int = option(1000, "full-batch GD epochs", quick=20, minimum=1)
    lr: float = option(0.01, "learning rate", minimum=0)
    hessian_points: int = option(30, "number of log-spaced epochs with an exact Hessian", quick=3, minimum=1)
    zero_scale: float = option(1e-4, "multiple of Xavier of the zero init", minimum=0)


def hessian_epochs(epochs: int, points: int) -> list[int]:
    """About `points` epochs from 0 to `epochs`, log-spaced (dense early, where things change fast)."""
    values = np.unique(np.round(np.geomspace(1, epochs + 1, points)).astype(int) - 1)
    return sorted(set(values.tolist()) | {0, epochs})


def _trace_key(network: str, seed: int) -> str:
    return f"{network}-s{seed}"


def table_markdown(summary: dict[str, Any]) -> str:
    """Start and end of every trace: loss, max |λ|, P10 |λ|, condition number and index."""
    config = summary["config"]
    lines = table_head(f"Hessian along full-batch GD, depth {config['depth']}, lr {config['lr']}, {config['epochs']} "
                       f"epochs (Demystifying ResNet figures 5 and 6)",
                       ["network", "seed", "epoch", "loss", "max abs eigenvalue", "P10 abs eigenvalue", "condition",
                        "index", "max grad norm (epoch)"])
    for t in summary["traces"]:
        grads = [g if g is not None else -1 for g in t["gradient_norm"]]
        peak = int(np.argmax(grads)) if grads else 0
        for p in (t["hessian"][0], t["hessian"][-1]):
            cond = p["condition"]
            index = "undefined (singular)" if p["index"] is None else f"{p['index']:.3f}"
            lines.append(table_row([t["network"], t["seed"], p["epoch"], f"{p['loss']:.4f}", f"{p['max_abs']:.4g}",
                                    f"{p['low_abs']:.4g}", "undefined" if cond is None else f"{cond:.4g}", index,
                                    f"{grads[peak]:.3g} ({peak})"]))
    singular: dict[str, int] = {}
    for t in summary["traces"]:
        count = sum(bool(p.get("singular")) for p in t["hessian"])
        if count:
            singular[t["network"]] = singular.get(t["network"], 0) + count
    if singular:
        total = {n: sum(len(t["hessian"]) for t in summary["traces"] if t["network"] == n) for n in singular}
        lines += ["", "Singular to tolerance (min |λ| ≤ P · eps · max |λ|): " + ", ".join(
            f"{n}: {c} of {total[n]} Hessians" for n, c in singular.items()) + ". Their index is undefined (the "
            "signs of their zero eigenvalues are rounding noise) and left out of figure 6; their condition number "
            "max|λ| / P10(|λ|) is kept where the 10th percentile exceeds the tolerance, since the measure leaves "
            "out the smallest tenth of |λ| on purpose."]
    lines += ["", f"Paper: {PAPER_STATEMENT}", "", f"Data: {summary['data']}. Hessian at epochs "
              f"{summary['hessian_epochs']}. Best linear loss (least squares): {summary['optimal_linear_loss']:.4f}."]
    return "\n".join(lines) + "\n"


def figures56_contrary_pairs(summary: dict[str, Any], loss_window: float = 0.05) -> dict[str, Any]:
    """Figure 5's claim, "the 2-shortcut network's condition number is smaller at every loss", pair by pair.

    A pair is a 2-shortcut point and a point of another network (any seeds) whose loss differs
    from the 2-shortcut point's by at most `loss_window` (5%) of it (the figure compares the
    networks at equal loss); it is contrary when the 2-shortcut condition number is not the
    smaller. Points with an undefined condition number are left out.
    Returns {"pairs", "contrary", "by_network": {name: (pairs, contrary)}}.
    """
    traces = summary["traces"]
    shortcut = [t for t in traces if t["network"] == "shortcut2-zero"]
    others = [t for t in traces if t["network"] != "shortcut2-zero"]
    by_network: dict[str, list[int]] = {}
    for s in shortcut:
        for o in others:
            counts = by_network.setdefault(o["network"], [0, 0])
            for p in s["hessian"]:
                for q in o["hessian"]:
                    if p["condition"] is None or q["condition"] is None:
                        continue
                    if abs(q["loss"] - p["loss"]) <= loss_window * p["loss"]:
                        counts[0] += 1
                        counts[1] += p["condition"] >= q["condition"]
    return {"pairs": sum(c[0] for c in by_network.values()), "contrary": sum(c[1] for c in by_network.values()),
            "by_network": {k: tuple(v) for k, v in by_network.items()}}


def findings_markdown(summary: dict[str, Any]) -> str:
    """Figures 5 and 6 in words: how often the 2-shortcut network's condition number is the larger at equal
    loss (`figures56_contrary_pairs`), its index from start to end, the final losses against the least squares
    optimum and the singular Hessians. What `throughway report` writes as findings.md and the docs page
    shows; a pending line until the 2-shortcut and orthogonal networks have Hessians."""
    traces = summary.get("traces") or []
    if not all(t["hessian"] for t in traces) or not {"shortcut2-zero", "orthogonal"} <= {t["network"] for t in traces}:
        return "Pending: the 2-shortcut and orthogonal networks' Hessians are not all computed yet.\n"
    if any(t["hessian"][i]["index"] is None for t in traces if t["network"] == "shortcut2-zero" for i in (0, -1)):
        return "The 2-shortcut network's index is undefined (singular to tolerance) at its first or last Hessian.\n"
    config = summary["config"]
    pairs = figures56_contrary_pairs(summary)
    by = pairs["by_network"]
    finals: dict[str, list[float]] = {}
    for t in summary["traces"]:
        finals.setdefault(t["network"], []).append(t["hessian"][-1]["loss"])
    orth, short = finals.get("orthogonal", []), finals.get("shortcut2-zero", [])
    starts = sorted({round(t["hessian"][0]["index"], 3) for t in summary["traces"] if t["network"] == "shortcut2-zero"})
    ends = [t["hessian"][-1]["index"] for t in summary["traces"] if t["network"] == "shortcut2-zero"]
    singular = sum(1 for t in summary["traces"] for p in t["hessian"] if p.get("singular"))
    singular_networks = sorted({t["network"] for t in summary["traces"] if any(p.get("singular") for p in t["hessian"])})
    points = sum(len(t["hessian"]) for t in summary["traces"])
    share = 100.0 * pairs["contrary"] / pairs["pairs"] if pairs["pairs"] else math.nan
    return (
        f"Along full-batch gradient descent (depth {config['depth']}, lr {config['lr']:g}, {config['epochs']:,} "
        f"epochs, {len(config['seeds'])} seeds; figures 5 and 6, `results/hessian/figures5-6`) the 2-shortcut "
        f"network mostly keeps the smaller condition number at equal loss, not at every loss: of {pairs['pairs']} "
        f"pairs of a 2-shortcut point and another network's point whose loss is within 5% of it, {pairs['contrary']} "
        f"({share:.0f}%) have the 2-shortcut condition number the larger ("
        + ", ".join(f"against {n}: {c} of {p}" for n, (p, c) in by.items()) + "). "
        f"Its index starts at {' / '.join(f'{s:.2f}' for s in starts)} and drops to "
        f"{min(ends):.3f}–{max(ends):.3f}; at the end orthogonal and 2-shortcut reach similar losses "
        f"({min(orth + short):.2f}–{max(orth + short):.2f} against the least squares optimum "
        f"{summary['optimal_linear_loss']:.3f}). {singular} of the {points} Hessians are singular to tolerance"
        + (f" (all {', '.join(singular_networks)})" if singular_networks else "")
        + "; their index is undefined and left out of figure 6."
    ) + "\n"


def refresh_summary(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Mark every stored Hessian point of `out`/results.json singular to tolerance or not
    (`apply_tolerance`; no Hessian is recomputed) and rewrite the file when that changed something."""
    path = Path(out) / "results.json"
    summary = read_summary(path, NAME)
    traces = [{**t, "hessian": [apply_tolerance(p) for p in t["hessian"]]} for t in summary["traces"]]
    updated = {**summary, "traces": traces}
    if updated != summary:
        atomic_write_json(path, updated)
    return updated


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md, findings.md (`findings_markdown`) and the figures from `out`/results.json (marking
    singular Hessians first)."""
    from ..report.hessian_plots import plot_gradient_and_index, plot_index_vs_loss, plot_spectrum_vs_loss

    refresh_summary(out)
    return remake_report(out, table_markdown, [(plot_spectrum_vs_loss, "figure5_spectrum_vs_loss.png"),
                                               (plot_index_vs_loss, "figure6_index_vs_loss.png"),
                                               (plot_gradient_and_index, "figure6_gradient_and_index.png")],
                         findings=findings_markdown)


class _HessianPoints:
    """A network's callback: the Hessian and its spectrum at the epochs in `marks`, before that epoch's
    step and after the last one (a network that diverged is measured no more), into `trace`."""

    def __init__(self, trace: dict[str, Any], marks: Sequence[int], x: torch.Tensor, y: torch.Tensor) -> None:
        self.trace, self.marks, self.x, self.y = trace, marks, x, y

    def _measure(self, state: TrainState) -> None:
        if state.epoch not in self.marks:
            return
        h = exact_hessian(state.model, squared_error_loss, self.x, self.y)
        spectrum = spectrum_summary(torch.linalg.eigvalsh(h))
        with torch.no_grad():
            loss = float(squared_error_loss(state.model(self.x.double()), self.y.double()))
        self.trace["hessian"].append({"epoch": state.epoch, "loss": loss, **spectrum.to_dict()})

    def on_epoch_start(self, state: TrainState) -> None:
        self._measure(state)

    def on_fit_end(self, state: TrainState) -> None:
        if not state.history.diverged:
            self._measure(state)


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Train each network (all seeds of one network at once) and record the Hessian spectra.

    Resumable per network: traces already in results.json are kept.
    """
    from ..study.shortcut import optimal_linear_loss

    study = ResumableStudy(out, NAME, config, ("depth", "epochs", "lr", "hessian_points", "zero_scale"), resume, progress=progress)
    traces: dict[str, Any] = {_trace_key(t["network"], t["seed"]): t for t in study.stored_part("traces", [])}
    data = whitened_data(linear=True, data_dir=config.data_dir)
    x, y = data.x.to(config.device), data.y.to(config.device)
    marks = hessian_epochs(config.epochs, config.hessian_points)

    def save() -> dict[str, Any]:  # every shard's traces (study.shards): shards may run at once into `out`
        def parts(every: dict[str, Any]) -> dict[str, Any]:
            ordered = [every[k] for k in (_trace_key(n, s) for n in config.networks for s in config.seeds) if k in every]
            return dict(data=data.description, hessian_epochs=marks, optimal_linear_loss=optimal_linear_loss(x, y),
                        traces=ordered, paper=PAPER_STATEMENT)

        return study.save_shared("traces", traces, parts,
                                 stored_as=lambda stored: {_trace_key(t["network"], t["seed"]): t for t in stored})

    for position, network in enumerate(config.networks):
        if all(_trace_key(network, s) in traces for s in config.seeds) or not study.in_shard(position):
            continue
        started = time.perf_counter()
        kwargs = network_kwargs(network, config.depth, zero_scale=config.zero_scale)
        gd = StackedGD(kwargs, list(config.seeds), [config.lr] * len(config.seeds), device=config.device)
        new: dict[int, dict[str, Any]] = {
            s: {"network": network, "seed": s, "model": kwargs, "lr": config.lr, "hessian": [],
                "loss": [], "gradient_norm": [], "diverged_at": None} for s in config.seeds}
        points = [[_HessianPoints(new[s], marks, x, y)] for s in config.seeds]
        histories = train_full_batch(gd, x, y, config.epochs, points)
        for seed, history in zip(config.seeds, histories):
            for epoch in range(config.epochs):
                record = history.epochs[epoch] if epoch < len(history.epochs) else {}
                new[seed]["loss"].append(finite(record.get("train_loss")))
                new[seed]["gradient_norm"].append(finite(record.get("gradient_norm")))
        for r, seed in enumerate(config.seeds):
            new[seed]["diverged_at"] = gd.diverged_at[r]
            traces[_trace_key(network, seed)] = new[seed]
        save()
        study.progress(f"{network}: {time.perf_counter() - started:.0f} s; final losses "
                       f"{[round(new[s]['hessian'][-1]['loss'], 4) for s in config.seeds if new[s]['hessian']]}")
    return study.finish(save, write_report)

