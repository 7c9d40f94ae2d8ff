"""Shared machinery of the Demystifying ResNet reproductions (figures 2-8 on whitened MNIST).

* `NETWORKS`: the network kinds the paper compares (plain Xavier, plain orthogonal, n-shortcut
  zero-initialised), each a `create_model("shortcut_net", ...)` configuration.
* `whitened_data`: whitened MNIST (10 principal components, one-hot targets) and, for linear
  networks, the condensed set with the same second moments (exactly the same loss, gradient and
  Hessian; see `throughway.data.whiten.second_moment_dataset`).
* `optimal_linear_loss`: the least-squares optimum a linear network can reach.

Their trainer, `StackedGD` (full-batch gradient descent of R networks at once), is in
`throughway.train.full_batch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..data.whiten import load_whitened_mnist, second_moment_dataset

__all__ = ["NETWORKS", "network_kwargs", "whitened_data", "WhitenedSet", "optimal_linear_loss"]

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


def optimal_linear_loss(x: torch.Tensor, y: torch.Tensor) -> float:
    """min over A of mean ‖Ax − y‖²: the best any linear network can reach (least squares)."""
    solution = torch.linalg.lstsq(x, y).solution
    return float(((x @ solution - y) ** 2).sum(dim=1).mean())
