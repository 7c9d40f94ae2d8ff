"""Full-batch gradient descent of many n-shortcut networks at once (Demystifying ResNet §5).

`BatchedGD` trains R shortcut networks of one architecture (seeds, learning rates) together on one
full batch, as the paper's figures 3 to 8 do; it moved here from the shortcut experiments (issue 15)
so that every trainer lives in `train`. Its update is the toolkit's one rule (`optim.update_rows`):
SGD without momentum, p ← p − lr·g, over the (R, P) rows of the R networks' weights.
"""

from __future__ import annotations

import math
from typing import Any, Sequence, cast

import torch
from torch import nn

from ..layers.shortcut import ShortcutUnit
from ..models import create_model
from ..models.shortcut import ShortcutNet
from .optim import update_rows

__all__ = ["BatchedGD"]


class BatchedGD:
    """R shortcut networks of one architecture trained together by full-batch gradient descent.

    Args:
        model_kwargs: create_model("shortcut_net", ...) arguments shared by all R networks.
        seeds: the torch seed of each network's initialisation (R = len(seeds)).
        lrs: one learning rate per network.
        device: where every tensor of the trainer lives (weights, learning rates, the active mask,
            the models of `model_at`); the data given to `step` must be there too.
    Loss: mean over samples of ‖f(x) − y‖² (the paper's squared error). A network whose loss
    becomes non-finite (or above `divergence_loss`) is marked diverged and frozen.
    """

    def __init__(self, model_kwargs: dict[str, Any], seeds: Sequence[int], lrs: Sequence[float],
                 dtype: torch.dtype = torch.float64, divergence_loss: float = 1e6,
                 device: str | torch.device = "cpu") -> None:
        if len(seeds) != len(lrs):
            raise ValueError(f"seeds and lrs must have the same length; got {len(seeds)} and {len(lrs)}")
        self.model_kwargs = dict(model_kwargs)
        weights = []
        for seed in seeds:
            torch.manual_seed(seed)
            model = cast(ShortcutNet, create_model("shortcut_net", **self.model_kwargs))
            weights.append(torch.stack([w.detach() for w in model.weight_matrices()]))
        self.template = model
        self.device = torch.device(device)
        self.weights = torch.stack(weights).to(device=self.device, dtype=dtype).requires_grad_(True)  # (R, L, d, d)
        self.lrs = torch.tensor(list(lrs), dtype=dtype, device=self.device)
        self.active = torch.ones(len(seeds), dtype=torch.bool, device=self.device)
        self.optimizer_state: dict[str, Any] = {}
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
            rows = len(self.weights)
            update_rows("sgd", self.weights.view(rows, -1), torch.nan_to_num(grads).view(rows, -1), self.optimizer_state,
                        lr=(self.lrs * self.active).view(-1, 1))
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
        model = cast(ShortcutNet, create_model("shortcut_net", **self.model_kwargs).to(self.device, torch.float64))
        with torch.no_grad():
            for w, v in zip(model.weight_matrices(), self.weights[r]):
                w.copy_(v)
        return model
