"""Shared machinery of the Demystifying ResNet reproductions (figures 2-8 on whitened MNIST).

* `NETWORKS`: the network kinds the paper compares (plain Xavier, plain orthogonal, n-shortcut
  zero-initialised), each a `create_model("shortcut_net", ...)` configuration.
* `whitened_data`: whitened MNIST (10 principal components, one-hot targets) and, for linear
  networks, the condensed set with the same second moments (exactly the same loss, gradient and
  Hessian; see `throughway.data.whiten.second_moment_dataset`).
* `BatchedGD`: full-batch gradient descent of R networks of one architecture at once (R seeds or R
  learning rates), their weights stacked into one (R, L, d, d) tensor so that every step is a
  handful of batched matrix products. The networks are built with `create_model` and their
  weights copied, so the initialisation is the toolkit's own; `model_at(r)` copies run r back
  into a real model (for the exact Hessian).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, cast

import torch
from torch import nn

from .._io import read_json
from ..data.whiten import load_whitened_mnist, second_moment_dataset
from ..layers.shortcut import ShortcutUnit
from ..models import create_model
from ..models.shortcut import ShortcutNet

__all__ = ["NETWORKS", "network_kwargs", "whitened_data", "WhitenedSet", "BatchedGD", "optimal_linear_loss",
           "check_same_settings", "stored_study"]

# name -> (shortcut_depth, init); labels as in the paper's legends.
NETWORKS: dict[str, tuple[int, str]] = {
    "xavier": (0, "xavier"),
    "orthogonal": (0, "orthogonal"),
    "shortcut1-zero": (1, "zero"),
    "shortcut2-zero": (2, "zero"),
    "shortcut3-zero": (3, "zero"),
}


def network_kwargs(network: str, depth: int, activation: str | None = None, zero_scale: float = 1e-4,
                   width: int = 10) -> dict[str, Any]:
    """create_model("shortcut_net", **kwargs) arguments of network kind `network` at `depth`."""
    if network not in NETWORKS:
        raise ValueError(f"network={network!r} is not known; accepted values: {list(NETWORKS)}")
    n, init = NETWORKS[network]
    return {"depth": depth, "shortcut_depth": n, "width": width, "activation": activation,
            "activation_position": "mid", "init": init, "zero_scale": zero_scale, "plain_unit": 2}


@dataclass(frozen=True)
class WhitenedSet:
    """Training inputs and targets in float64; `exact` says whether they reproduce the full set's loss."""

    x: torch.Tensor
    y: torch.Tensor
    n_train: int
    exact: bool
    description: str


_CACHE: dict[Any, Any] = {}


def whitened_data(linear: bool, data_dir: str | None = None, subset: int | None = None,
                  train_images: str = "60k") -> WhitenedSet:
    """The training set for the experiments: condensed (exact) for linear nets, else the first
    `subset` whitened images (all when None)."""
    key = (data_dir, train_images)
    if key not in _CACHE:
        _CACHE[key] = load_whitened_mnist(data_dir, train_images=train_images)
    data = _CACHE[key]
    n = len(data.train_x)
    if linear:
        x, y = second_moment_dataset(data.train_x, data.train_y)
        return WhitenedSet(x, y, n, True, f"{n} whitened MNIST images condensed to {len(x)} samples with the "
                                          f"same second moments (exact for linear networks)")
    if subset is not None and subset < n:
        return WhitenedSet(data.train_x[:subset], data.train_y[:subset], subset, False,
                           f"the first {subset} of {n} whitened MNIST training images")
    return WhitenedSet(data.train_x, data.train_y, n, True, f"all {n} whitened MNIST training images")


def stored_study(out: Path, name: str, config: Any, fields: Sequence[str], resume: bool,
                 legacy: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What a study stored in `out`/results.json, or None when there is none yet.

    Raises FileExistsError when there is one and `resume` is False, and ValueError (see
    `check_same_settings`) when it was computed with other values of `fields`; `legacy` gives the
    value a field had in files written before it was recorded.
    """
    path = Path(out) / "results.json"
    if not path.is_file():
        return None
    if not resume:
        raise FileExistsError(f"{out} holds a {name} study; pass --resume to continue or extend it")
    stored = read_json(path)
    check_same_settings({**(legacy or {}), **stored.get("config", {})}, config, fields, out)
    return stored


def check_same_settings(stored: dict[str, Any], config: Any, fields: Sequence[str], out: Any) -> None:
    """Refuse to resume a study in `out` whose stored config differs from `config` in `fields`.

    These are the settings that every finished cell depends on (a learning-rate grid, epochs, ...);
    resuming with other values would mix cells computed under different settings in one table.
    """
    changed = []
    for field in fields:
        old, new = stored.get(field), getattr(config, field)
        new = list(new) if isinstance(new, tuple) else new
        if old != new:
            changed.append(f"{field}: stored {old!r}, now {new!r}")
    if changed:
        raise ValueError(f"{out} was computed with other settings ({'; '.join(changed)}); "
                         "use a new --out folder, or the stored settings, to resume")


def optimal_linear_loss(x: torch.Tensor, y: torch.Tensor) -> float:
    """min over A of mean ‖Ax − y‖²: the best any linear network can reach (least squares)."""
    solution = torch.linalg.lstsq(x, y).solution
    return float(((x @ solution - y) ** 2).sum(dim=1).mean())


class BatchedGD:
    """R shortcut networks of one architecture trained together by full-batch gradient descent.

    Args:
        model_kwargs: create_model("shortcut_net", ...) arguments shared by all R networks.
        seeds: the torch seed of each network's initialisation (R = len(seeds)).
        lrs: one learning rate per network.
    Loss: mean over samples of ‖f(x) − y‖² (the paper's squared error). A network whose loss
    becomes non-finite (or above `divergence_loss`) is marked diverged and frozen.
    """

    def __init__(self, model_kwargs: dict[str, Any], seeds: Sequence[int], lrs: Sequence[float],
                 dtype: torch.dtype = torch.float64, divergence_loss: float = 1e6) -> None:
        if len(seeds) != len(lrs):
            raise ValueError(f"seeds and lrs must have the same length; got {len(seeds)} and {len(lrs)}")
        self.model_kwargs = dict(model_kwargs)
        weights = []
        for seed in seeds:
            torch.manual_seed(seed)
            model = cast(ShortcutNet, create_model("shortcut_net", **self.model_kwargs))
            weights.append(torch.stack([w.detach() for w in model.weight_matrices()]))
        self.template = model
        self.weights = torch.stack(weights).to(dtype).requires_grad_(True)  # (R, L, d, d)
        self.lrs = torch.tensor(list(lrs), dtype=dtype)
        self.active = torch.ones(len(seeds), dtype=torch.bool)
        self.diverged_at: list[int | None] = [None] * len(seeds)
        self.divergence_loss = divergence_loss
        self.epoch = 0
        unit = cast(ShortcutUnit, model.blocks[0])
        self.group = unit.layers
        self.shortcut = unit.shortcut is not None
        self.positions = unit.positions
        self.act = torch.relu if model_kwargs.get("activation") == "relu" else (
            torch.tanh if model_kwargs.get("activation") == "tanh" else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Outputs (R, N, d) of every network for inputs x (N, d); the same map as the real model."""
        h = x.to(self.weights.dtype).unsqueeze(0).expand(len(self.weights), -1, -1)
        L = self.weights.shape[1]
        for start in range(0, L, self.group):
            t = h
            if self.act is not None and "pre" in self.positions:
                t = self.act(t)
            for i in range(self.group):
                t = t @ self.weights[:, start + i].transpose(1, 2)
                if self.act is not None and i < self.group - 1 and "mid" in self.positions:
                    t = self.act(t)
            if self.act is not None and "post" in self.positions:
                t = self.act(t)
            h = h + t if self.shortcut else t
        return h

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-network loss (R,), differentiable."""
        return ((self.forward(x) - y.to(self.weights.dtype)) ** 2).sum(dim=-1).mean(dim=-1)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One full-batch GD step; returns (loss before the step, gradient norm) per network."""
        losses = self.losses(x, y)
        grads = torch.autograd.grad(losses.sum(), self.weights)[0]
        with torch.no_grad():
            finite = torch.isfinite(losses) & (losses < self.divergence_loss) & torch.isfinite(grads).all(dim=(1, 2, 3))
            for r in torch.nonzero(self.active & ~finite).flatten().tolist():
                self.diverged_at[r] = self.epoch
            self.active &= finite
            scale = (self.lrs * self.active).view(-1, 1, 1, 1)
            self.weights -= scale * torch.nan_to_num(grads)
            self.weights[~self.active] = 0.0
            gnorm = grads.flatten(1).norm(dim=1)
        self.epoch += 1
        out = losses.detach().clone()
        out[~self.active] = math.nan
        gnorm[~self.active] = math.nan
        return out, gnorm

    def average_frobenius_norm(self) -> torch.Tensor:
        """Mean over the L weight matrices of ‖W‖_F, per network (R,) (paper figures 2 and 3)."""
        with torch.no_grad():
            return self.weights.flatten(2).norm(dim=2).mean(dim=1)

    def model_at(self, r: int) -> nn.Module:
        """A real `shortcut_net` model holding network r's current weights (float64)."""
        model = cast(ShortcutNet, create_model("shortcut_net", **self.model_kwargs).to(torch.float64))
        with torch.no_grad():
            for w, v in zip(model.weight_matrices(), self.weights[r]):
                w.copy_(v)
        return model
