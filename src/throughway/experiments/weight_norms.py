"""Demystifying ResNet figure 3 (and the claim of figure 2): average Frobenius norm of the weights.

2-shortcut networks, zero-initialised (zero + 1e-4 × Xavier), of several depths, trained by
full-batch GD on whitened MNIST: linear (left panel; the condensed, exact training set) and with
ReLUs at the mid positions (right panel; the first `subset` images, fewer epochs on this machine).
Records the mean over the L weight matrices of ‖W‖_F after every epoch. Figure 2 of the paper is
the same measurement on CIFAR-10 pre-ResNets, which cannot be run here (no CIFAR data).

Writes results.json, table.md and figure3_weight_norms.png.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..report.stats import finite
from ..report.tables import table_head, table_row
from ..study.options import check_even_depths, option
from ..study.summary import remake_report
from ..study.shortcut import network_kwargs, whitened_data
from ..train.full_batch import StackedGD, train_full_batch
from ..study.resumable import ResumableOptions, ResumableStudy

__all__ = ["NAME", "DESCRIPTION", "Config", "run", "write_report"]

NAME = "weight-norms"
DESCRIPTION = "Demystifying ResNet figure 3: average Frobenius norm of the weights along training, 2-shortcut zero init, several depths"

PAPER_STATEMENT = ("Figures 2 and 3: the deeper a residual network is, the smaller the average Frobenius norm of its "
                   "weight matrices, both during training and when training ends.")


@dataclass(frozen=True)
class Config(ResumableOptions):
    """Settings (see the module docstring)."""

    depths: tuple[int, ...] = option((2, 4, 8, 16, 32, 64), "network depths L (even: 2-shortcut units)",
                                     quick=(2, 4), minimum=2, check=check_even_depths)
    activations: tuple[str, ...] = option(("linear", "relu"), "networks to train", choices=("linear", "relu"))
    lr: float = option(0.1, "learning rate", minimum=0)
    epochs: int = option(1000, "epochs of the linear networks", quick=20, minimum=1)
    relu_epochs: int = option(500, "epochs of the ReLU networks", quick=20, minimum=1)
    relu_subset: int | None = option(1000, "ReLU networks train on the first N whitened images", minimum=1,
                                      flag="--relu-limit", aliases=("--relu-subset",))
    seed: int = 0
    zero_scale: float = 1e-4


def table_markdown(summary: dict[str, Any]) -> str:
    """Average ‖W‖_F at the end of training (and its maximum along training) per depth."""
    config = summary["config"]
    lines = table_head(f"Average Frobenius norm of the weights, 2-shortcut zero init, lr {config['lr']} "
                       f"(Demystifying ResNet figure 3)",
                       ["activation", "depth", "epochs", "final loss", "final avg ‖W‖_F", "max avg ‖W‖_F along training"])
    for activation in config["activations"]:
        for depth in config["depths"]:
            c = summary["curves"].get(f"{activation}-L{depth}")
            if not c:
                continue
            norms = [v for v in c["avg_frobenius"] if v is not None]
            loss = c["loss"][-1]
            lines.append(table_row([activation, depth, len(c["avg_frobenius"]) - 1,
                                    "diverged" if loss is None else f"{loss:.4f}", f"{norms[-1]:.4f}",
                                    f"{max(norms):.4f}"]))
    lines += ["", f"Paper: {PAPER_STATEMENT}", "", "Data: " + "; ".join(f"{k}: {v}" for k, v in summary["data"].items()) + "."]
    return "\n".join(lines) + "\n"


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md and the figure from `out`/results.json."""
    from ..report.hessian_plots import plot_weight_norms

    return remake_report(out, table_markdown, [(plot_weight_norms, "figure3_weight_norms.png")])


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Train one network per (activation, depth) (resumable per curve), then report."""
    study = ResumableStudy(out, NAME, config, ("lr", "epochs", "relu_epochs", "relu_subset", "seed", "zero_scale"),
                           resume, progress=progress)
    curves: dict[str, Any] = study.stored_part("curves", {})
    sets = {a: whitened_data(linear=a == "linear", data_dir=config.data_dir,
                             subset=None if a == "linear" else config.relu_subset) for a in config.activations}

    def save() -> dict[str, Any]:  # every shard's curves (study.shards): shards may run at once into `out`
        return study.save_shared("curves", curves, lambda every: dict(
            data={a: s.description for a, s in sets.items()}, curves=every, paper=PAPER_STATEMENT))

    position = -1
    for activation in config.activations:
        x, y = sets[activation].x.to(config.device), sets[activation].y.to(config.device)
        epochs = config.epochs if activation == "linear" else config.relu_epochs
        for depth in config.depths:
            key = f"{activation}-L{depth}"
            position += 1
            if key in curves or not study.in_shard(position):
                continue
            started = time.perf_counter()
            kwargs = network_kwargs("shortcut2-zero", depth, activation=None if activation == "linear" else "relu",
                                    zero_scale=config.zero_scale)
            gd = StackedGD(kwargs, [config.seed], [config.lr], device=config.device)
            norms: list[float | None] = [float(gd.average_frobenius_norm()[0])]
            records = train_full_batch(gd, x, y, epochs)[0].epochs  # one per finished epoch
            losses: list[float | None] = [finite(r["train_loss"]) for r in records] + [None] * (epochs - len(records))
            norms += [finite(r["avg_frobenius"]) for r in records] + [None] * (epochs - len(records))
            with torch.no_grad():
                last = float(gd.losses(x, y)[0])
            losses.append(last if bool(gd.active[0]) and math.isfinite(last) else None)
            curves[key] = {"activation": activation, "depth": depth, "avg_frobenius": norms, "loss": losses,
                           "diverged_at": gd.diverged_at[0], "seconds": time.perf_counter() - started}
            save()
            study.progress(f"{key}: final avg ‖W‖_F {norms[-1]}, loss {losses[-1]} ({curves[key]['seconds']:.0f} s)")
    return study.finish(save, write_report)

