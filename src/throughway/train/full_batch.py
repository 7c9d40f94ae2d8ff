"""Full-batch gradient descent of many n-shortcut networks at once (Demystifying ResNet §5).

`StackedGD` trains R shortcut networks of one architecture (seeds, learning rates) together on one
full batch, as the paper's figures 3 to 8 do; it moved here from the shortcut experiments
so that every trainer lives in `train`. Its update is the toolkit's one rule (`optim.update_rows`):
SGD without momentum, p ← p − lr·g, over the (R, P) rows of the R networks' weights.

`train_full_batch(gd, x, y, epochs)` trains them through the toolkit's one epoch loop
(`loop.run_loop`, as `fit` and `train_stacked` do): each network is a member with its own
`TrainState` and `History`, one full-batch step is its epoch, and divergence follows the loop's rule
(the history marks it, the weights go back to the end of the last finished epoch, the network
leaves the loop). The studies (experiments.shortcut_lr, hessian_dynamics, weight_norms) read what
they report from the histories, and take measurements in callbacks (`on_epoch_start`, `on_fit_end`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence, cast

import torch
from torch import nn

from ..layers.shortcut import ShortcutUnit
from ..models import create_model
from ..models.shortcut import ShortcutNet
from .loop import EpochStats, Member, run_loop
from .optim import update_rows
from .recipes import Recipe
from .state import History, TrainState

__all__ = ["StackedGD", "train_full_batch"]


class StackedGD:
    """R shortcut networks of one architecture trained together by full-batch gradient descent.

    Args:
        model_kwargs: create_model("shortcut_net", ...) arguments shared by all R networks.
        seeds: the torch seed of each network's initialisation (R = len(seeds)).
        lrs: one learning rate per network.
        device: where every tensor of the trainer lives (weights, learning rates, the active mask,
            the models of `model_at`); the data given to `step` must be there too.
    Loss: mean over samples of ‖f(x) − y‖² (the paper's squared error). A network whose loss
    becomes non-finite or reaches `divergence_loss` (1e6, far above any loss the paper's figures
    plot), or whose gradient is not finite, is marked diverged (`diverged_at`, the 0-based epoch)
    and frozen: `active` turns False and later steps leave its weights as they were before that step.
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
        self.last_losses = torch.full((len(seeds),), math.nan, dtype=dtype, device=self.device)
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
            gnorm = grads.flatten(1).norm(dim=1)
        self.epoch += 1
        self.last_losses = losses.detach()
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


# `BatchedGD`: the former name of `StackedGD`, the same class, for code written against it where it lived;
# the toolkit itself uses `StackedGD`, and train.batched lists every former name.
BatchedGD = StackedGD


def _copy_into(model: nn.Module, weights: torch.Tensor) -> None:
    with torch.no_grad():
        for w, v in zip(cast(ShortcutNet, model).weight_matrices(), weights):
            w.copy_(v)


class _FullBatchEngine:
    """`train_full_batch`'s engine (train.loop.Engine): one full-batch GD step of every active network is
    an epoch. Positions are the active networks in order; `rows` maps them to rows of `gd`."""

    def __init__(self, gd: StackedGD, x: torch.Tensor, y: torch.Tensor) -> None:
        self.gd, self.x, self.y = gd, x, y
        self.rows = list(range(len(gd.weights)))
        self.snapshot = gd.weights.detach().clone()

    def begin(self) -> None:
        """Remember the starting weights (a divergence in the first epoch goes back to them)."""
        self.end_epoch()

    def set_learning_rates(self, epoch: int) -> list[float]:
        """Each network's own constant learning rate."""
        lrs = self.gd.lrs.tolist()
        return [lrs[r] for r in self.rows]

    def train_epoch(self, epoch: int, states: Sequence[TrainState], callbacks: Sequence[Sequence[Any]]) -> EpochStats:
        """One step of StackedGD; records the loss before it, the gradient norm and the mean ‖W‖_F after it."""
        was_active = self.gd.active.tolist()
        losses, gnorm = self.gd.step(self.x, self.y)
        active, loss, norm = self.gd.active.tolist(), losses.tolist(), gnorm.tolist()
        frobenius, raw = self.gd.average_frobenius_norm().tolist(), self.gd.last_losses.tolist()
        for s in states:
            s.step += 1
        return EpochStats(
            loss_sum=[loss[r] for r in self.rows], wrong=[None] * len(self.rows), seen=1, steps=1,
            diverged={p: {"step": 0, "loss": str(raw[r])} for p, r in enumerate(self.rows)
                      if was_active[r] and not active[r]},
            extra=[{"gradient_norm": norm[r], "avg_frobenius": frobenius[r]} for r in self.rows])

    def evaluate(self, which: str) -> list[tuple[float | None, float | None]] | None:
        """No evaluation split: the studies measure the training loss (their own callbacks do the rest)."""
        return None

    def gate_values(self) -> list[list[float]]:
        """Shortcut networks have no scalar gates."""
        return [[] for _ in self.rows]

    def end_epoch(self) -> None:
        """Copy the weights a divergence in the next epoch goes back to."""
        self.snapshot = self.gd.weights.detach().clone()

    def roll_back(self, position: int, state: TrainState) -> None:
        """Network `position` back to the end of its last finished epoch (it stays frozen)."""
        r = self.rows[position]
        with torch.no_grad():
            self.gd.weights[r] = self.snapshot[r]
        _copy_into(state.model, self.snapshot[r])

    def sync(self, position: int, state: TrainState) -> None:
        """Copy network `position`'s weights into its member's model."""
        _copy_into(state.model, self.gd.weights[self.rows[position]])

    def keep(self, positions: Sequence[int]) -> None:
        """Keep the networks at `positions` in the loop (the others are frozen in `gd`)."""
        self.rows = [self.rows[p] for p in positions]


def train_full_batch(gd: StackedGD, x: torch.Tensor, y: torch.Tensor, epochs: int,
                     callbacks: Sequence[Sequence[Any]] | None = None) -> list[History]:
    """Train the R networks of `gd` on the full batch (x, y) for `epochs` steps through the one epoch loop
    (`loop.run_loop`); return each network's History.

    Network r is a member whose `TrainState.model` is a real `shortcut_net` holding its weights at the
    end of every epoch (`gd.model_at`), with the recipe of plain full-batch GD (SGD, its lr, no
    momentum, the whole set as one batch) and the callbacks `callbacks[r]`. Its record per epoch:
    `lr`, `train_loss` (the loss before the epoch's step), `gradient_norm` (before the step),
    `avg_frobenius` (the mean ‖W‖_F after it), the times. Divergence (see StackedGD) ends a network
    by the loop's rule: `history.diverged_at` holds the 1-based epoch, `gd.diverged_at[r]` the
    0-based one, its weights are those before that step.
    """
    members = []
    for r, lr in enumerate(gd.lrs.tolist()):
        recipe = Recipe(name="full-batch-gd", optimizer="sgd", lr=lr, epochs=epochs, batch_size=len(x),
                        source="Demystifying ResNet §5: full-batch gradient descent")
        state = TrainState(gd.model_at(r), gd, recipe, None, torch.Generator(), History(), steps_per_epoch=1)
        members.append(Member(state, list(callbacks[r]) if callbacks is not None else []))
    run_loop(_FullBatchEngine(gd, x, y), members, epochs)
    return [m.state.history for m in members]
