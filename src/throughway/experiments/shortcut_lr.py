"""Demystifying ResNet figures 7 and 8: best final loss and best learning rate against depth.

Each network kind trains by full-batch gradient descent for `epochs` epochs with every learning
rate of a log-spaced grid (all rates at once, as one batched model), and the lowest final training
loss and the rate that gave it are kept. Figure 7 (`--activation linear`): linear networks —
plain Xavier, plain orthogonal, 1- and 2-shortcut zero-initialised — on whitened MNIST condensed
exactly to its second moments (all 60,000 images' loss). Figure 8 (`--activation relu`): ReLUs at
the mid positions of 2-layer units of the plain Xavier / orthogonal networks and of the
2-shortcut network (the paper omits 1- and 3-shortcut networks there so that every network has
the same number of ReLUs); ReLU networks need the real samples, so on this machine they train on
the first `subset` whitened images (default 1,000) for fewer epochs: see results.json's config.

Writes results.json, table.md and figure7_lr_study_linear.png or figure8_lr_study_relu.png.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._io import read_json
from ..study.options import config_from_args as study_config_from_args
from ..study.options import option, MAX_SEEDS
from ..study.summary import remake_report
from ..study.shortcut import NETWORKS, network_kwargs, optimal_linear_loss, whitened_data
from ..train import History
from ..train.full_batch import StackedGD, train_full_batch
from ..study.resumable import ResumableOptions, ResumableStudy
from ..report.tables import table_header, table_row

__all__ = ["NAME", "DESCRIPTION", "Config", "run", "write_report", "config_from_args", "LINEAR", "RELU",
           "findings_markdown"]

NAME = "shortcut-lr"
DESCRIPTION = "Demystifying ResNet figures 7, 8: best final loss and learning rate vs depth over a log LR grid (linear / mid-ReLU)"

PAPER_STATEMENT = {
    "linear": ("Figure 7: the final losses of 2-shortcut linear networks stay close to optimal as the networks "
               "become deeper, and higher learning rates can be applied; at depth 96 the final losses of Xavier "
               "are basically the same for every learning rate."),
    "relu": ("Figure 8: with ReLUs at mid positions, linear networks with Xavier or orthogonal initialisation have "
             "difficulties finding the optimal points while 2-shortcut networks find them easily; at depth 64 "
             "Xavier-ReLU and orthogonal-ReLU final losses are the same for every learning rate."),
}


@dataclass(frozen=True)
class Config(ResumableOptions):
    """Settings; `activation` "linear" reproduces figure 7, "relu" figure 8."""

    activation: str = option("linear", "linear networks (figure 7) or ReLUs at mid positions (figure 8); relu "
                                       "starts from figure 8's settings (RELU)", choices=("linear", "relu"))
    depths: tuple[int, ...] = option((2, 4, 8, 16, 32, 64), "network depths L", quick=(2, 4), minimum=1)
    networks: tuple[str, ...] = option(("xavier", "orthogonal", "shortcut1-zero", "shortcut2-zero"), "networks",
                                       choices=tuple(NETWORKS))
    lr_exponents: tuple[float, ...] = option((-4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0),
                                             "learning rates as powers of 10", quick=(-2.0, -1.0))
    epochs: int = option(1000, "full-batch GD epochs (paper: 1000)", quick=20, minimum=1)
    seeds: int = option(1, "initialisations per point (final losses averaged)", minimum=1, maximum=MAX_SEEDS)
    subset: int | None = option(None, "ReLU networks: train on the first N whitened images", quick=1000, minimum=1,
                                 flag="--limit", aliases=("--subset",))
    zero_scale: float = option(1e-4, "multiple of Xavier of the zero init", minimum=0)


LINEAR = Config()
RELU = Config(activation="relu", depths=(2, 4, 8, 16, 32), networks=("xavier", "orthogonal", "shortcut2-zero"),
              lr_exponents=(-3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0), epochs=500, subset=1000)


def _applicable(network: str, depth: int) -> bool:
    n = NETWORKS[network][0]
    return depth % (n if n else 2) == 0


def summarize(config: Config, cells: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (network, depth): mean final loss over seeds for each rate, the best rate and its loss."""
    points = []
    lrs = [10.0 ** e for e in config.lr_exponents]
    for network in config.networks:
        for depth in config.depths:
            cell = cells.get(f"{network}-L{depth}")
            if cell is None:
                continue
            means = []
            for i in range(len(lrs)):
                finals = [cell["final_loss"][s][i] for s in range(config.seeds)]
                means.append(None if any(v is None for v in finals) else sum(finals) / len(finals))
            valid = [(m, lr) for m, lr in zip(means, lrs) if m is not None]
            best = min(valid) if valid else (None, None)
            spread = (max(m for m, _ in valid) - min(m for m, _ in valid)) if valid else None
            points.append({"network": network, "depth": depth, "final_loss_by_lr": means, "best_loss": best[0],
                           "best_lr": best[1], "loss_spread_over_lrs": spread,
                           "diverged_lrs": [lr for m, lr in zip(means, lrs) if m is None]})
    return points


def table_markdown(summary: dict[str, Any]) -> str:
    """Best final loss (and its learning rate) per network and depth, beside the paper's statement."""
    config = summary["config"]
    by = {(p["network"], p["depth"]): p for p in summary["points"]}
    networks = config["networks"]
    lines = [f"Best final training loss over the learning-rate grid (and the best rate), {config['activation']}, "
             f"{config['epochs']} epochs of full-batch GD, {config['seeds']} seed(s)", "",
             *table_header(["depth", *networks])]
    for depth in config["depths"]:
        row = [str(depth)]
        for network in networks:
            p = by.get((network, depth))
            if p is None:
                row.append("—")
            elif p["best_loss"] is None:
                row.append("all diverged")
            else:
                row.append(f"{p['best_loss']:.4f} (lr {p['best_lr']:.3g})")
        lines.append(table_row(row))
    lines += ["", f"Paper: {PAPER_STATEMENT[config['activation']]}", "",
              f"Learning rates: 10^{list(config['lr_exponents'])}. Data: {summary['data']}."]
    top = 10.0 ** max(config["lr_exponents"])
    edge = sorted({f"{p['network']} L={p['depth']}" for p in summary["points"]
                   if p["best_lr"] is not None and abs(p["best_lr"] - top) < 1e-12 * top})
    if edge:
        lines.append(f"Best rate at the grid's upper edge ({top:g}; a larger rate might do better): {', '.join(edge)}.")
    if summary.get("optimal_linear_loss") is not None:
        lines.append(f"Best loss of any linear map on this data (least squares): {summary['optimal_linear_loss']:.4f}.")
    return "\n".join(lines) + "\n"


def _lr_point(summary: dict[str, Any], network: str, depth: int) -> dict[str, Any]:
    """The learning-rate study's point of `network` at `depth`; ValueError naming both when absent."""
    for p in summary["points"]:
        if p["network"] == network and p["depth"] == depth:
            return dict(p)
    raise ValueError(f"results have no point for network {network!r} at depth {depth}")


def findings_markdown(summary: dict[str, Any]) -> str:
    """The study in words against the paper: figure 7 for linear networks (the 2-shortcut net's best loss
    against the least squares optimum by depth, its best learning rates, Xavier's, orthogonal and 1-shortcut
    nets' usable rates), figure 8 for mid ReLUs (the 2-shortcut net against Xavier and orthogonal from depth
    16 on). What `throughway report` writes as findings.md and the docs page shows; a pending line until
    every network and depth has a best loss and the depths reach the ones the sentences speak of."""
    config = summary["config"]
    linear = config["activation"] == "linear"
    done = {(p["network"], p["depth"]) for p in summary.get("points", []) if p.get("best_loss") is not None}
    needed = {(n, d) for n in config["networks"] for d in config["depths"]}
    if not needed <= done or max(config["depths"]) < (8 if linear else 16):
        return ("Pending: not every network and depth has a best loss yet, or the depths stop below "
                f"{8 if linear else 16}.\n")
    return _figure7_text(summary) if linear else _figure8_text(summary)


def _figure7_text(summary: dict[str, Any]) -> str:
    config = summary["config"]
    optimum = summary["optimal_linear_loss"]
    depths = config["depths"]
    gaps = {d: _lr_point(summary, "shortcut2-zero", d)["best_loss"] - optimum for d in depths}
    worst = max(gaps, key=lambda d: gaps[d])
    rates = sorted({_lr_point(summary, "shortcut2-zero", d)["best_lr"] for d in depths if d >= 8})
    xavier = _lr_point(summary, "xavier", depths[-1])["best_loss"]
    lrs = [10 ** e for e in config["lr_exponents"]]
    close: dict[str, float] = {}
    for network in ("orthogonal", "shortcut1-zero"):
        allowed = []
        for d in depths:
            p = _lr_point(summary, network, d)
            if p is None:
                continue
            allowed += [lr for lr, loss in zip(lrs, p["final_loss_by_lr"]) if loss is not None and loss - optimum <= 0.005]
        close[network] = max(allowed) if allowed else math.nan
    return (
        f"Figure 7 (linear, {config['epochs']:,} epochs of full-batch gradient descent, {len(lrs)} learning rates from "
        f"{lrs[0]:g} to {lrs[-1]:g}, depths {depths[0]}–{depths[-1]}): the 2-shortcut network's best final loss stays "
        f"within {max(gaps.values()):.1g} of the least-squares optimum ({optimum:.4f}) at every depth (largest gap at "
        f"depth {worst}; " + ", ".join(f"{gaps[d]:.0e}" for d in depths) + f" at depths {', '.join(map(str, depths))}), "
        f"with best learning rates of {' to '.join(f'{r:.3g}' for r in (rates[0], rates[-1]))} from depth 8 on, while "
        f"Xavier's rises to {xavier:.3f} at depth {depths[-1]}; orthogonal and 1-shortcut nets come within 0.005 of the "
        f"optimum only with rates ≤ {max(close.values()):.3g}."
    ) + "\n"


def _figure8_text(summary: dict[str, Any]) -> str:
    config = summary["config"]
    depths = config["depths"]

    def best(network: str, selected: list[int]) -> list[float]:
        return [_lr_point(summary, network, d)["best_loss"] for d in selected]

    deep = [d for d in depths if d >= 8]
    late = [d for d in depths if d >= 16]
    s, x, o = best("shortcut2-zero", deep), best("xavier", late), best("orthogonal", late)
    s_late = best("shortcut2-zero", late)
    s2 = _lr_point(summary, "shortcut2-zero", depths[0])
    holds = max(s_late) < min(x + o)
    early = [d for d in depths if d < late[0]
             and min(best("xavier", [d]) + best("orthogonal", [d])) <= best("shortcut2-zero", [d])[0]]
    return (
        f"Figure 8 (mid ReLUs, the first {config['subset']:,} images, {config['epochs']} epochs, depths "
        f"{depths[0]}–{depths[-1]} to fit this machine; the paper's statement is about depth 64): the 2-shortcut net "
        f"reaches {min(s):.2f}–{max(s):.2f} from depth 8 on; at depths {late[0]}–{late[-1]} Xavier reaches "
        f"{min(x):.2f}–{max(x):.2f} and orthogonal {min(o):.2f}–{max(o):.2f}, so the paper's statement "
        f"{'holds there' if holds else 'does not hold there'}"
        + (f", and only there: at depths {', '.join(map(str, early))} a plain net reaches a loss as low as or lower "
           f"than the 2-shortcut net's" if early else "") + ". With one unit of 10 mid ReLUs a 2-shortcut net cannot "
        f"cancel its identity path: its depth-{depths[0]} loss stays at {s2['best_loss']:.2f} after "
        f"{config['epochs']} epochs."
    ) + "\n"


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md, findings.md (`findings_markdown`) and the figure from `out`/results.json."""
    from ..report.hessian_plots import plot_lr_study

    linear = read_json(Path(out) / "results.json")["config"]["activation"] == "linear"
    name, label = (("figure7_lr_study_linear.png", "linear networks (figure 7)") if linear
                   else ("figure8_lr_study_relu.png", "ReLUs at mid positions (figure 8)"))
    return remake_report(out, table_markdown, [(lambda summary, path: plot_lr_study(summary, path, label), name)],
                         findings=findings_markdown)


def _loss_at(history: History, epoch: int) -> float | None:
    """The loss before the step of 0-based `epoch`, or None when the network diverged before it ended."""
    value = history.epochs[epoch]["train_loss"] if epoch < len(history.epochs) else None
    return value if value is not None and math.isfinite(value) else None


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Train every (network, depth) over the whole grid (resumable per cell), then report."""
    study = ResumableStudy(out, NAME, config, ("activation", "lr_exponents", "epochs", "seeds", "subset",
                                               "zero_scale"), resume, progress=progress)
    cells: dict[str, Any] = study.stored_part("cells", {})
    linear = config.activation == "linear"
    data = whitened_data(linear=linear, data_dir=config.data_dir, subset=config.subset)
    x, y = data.x.to(config.device), data.y.to(config.device)
    lrs = [10.0 ** e for e in config.lr_exponents]

    def save() -> dict[str, Any]:  # every shard's cells (study.shards): shards may run at once into `out`
        return study.save_shared("cells", cells, lambda every: dict(
            data=data.description, cells=every, points=summarize(config, every),
            optimal_linear_loss=optimal_linear_loss(x, y), paper=PAPER_STATEMENT[config.activation]))

    position = -1
    for depth in config.depths:
        for network in config.networks:
            key = f"{network}-L{depth}"
            position += 1
            if key in cells or not _applicable(network, depth) or not study.in_shard(position):
                continue
            started = time.perf_counter()
            kwargs = network_kwargs(network, depth, activation=None if linear else "relu", zero_scale=config.zero_scale)
            seeds = [s for s in range(config.seeds) for _ in lrs]
            gd = StackedGD(kwargs, seeds, lrs * config.seeds, device=config.device)
            histories = train_full_batch(gd, x, y, config.epochs)
            curve_every = max(1, config.epochs // 100)
            loss_curves = [[_loss_at(h, epoch) for h in histories] for epoch in range(0, config.epochs, curve_every)]
            with torch.no_grad():
                final = gd.losses(x, y)
            finals = [float(v) if bool(gd.active[i]) and math.isfinite(float(v)) else None for i, v in enumerate(final)]
            cells[key] = {"network": network, "depth": depth, "model": kwargs,
                          "final_loss": [finals[s * len(lrs):(s + 1) * len(lrs)] for s in range(config.seeds)],
                          "diverged_at": gd.diverged_at, "loss_curve_every": curve_every, "loss_curves": loss_curves,
                          "seconds": time.perf_counter() - started}
            save()
            best = min((v for v in finals if v is not None), default=None)
            study.progress(f"{config.activation} {key}: best final loss {best} ({cells[key]['seconds']:.0f} s)")
    return study.finish(save, write_report)


def config_from_args(args: argparse.Namespace) -> Config:
    """Config from parsed options, starting from the linear (figure 7) or ReLU (figure 8) preset."""
    base = RELU if args.activation == "relu" else LINEAR
    return study_config_from_args(Config, args, base=base, device=args.device, data_dir=args.data_dir)
