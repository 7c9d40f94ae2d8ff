"""The stacked computation of `train_batched`: one step (`BatchedStep`), one epoch (`train_epoch`) and
the evaluation of N stacked models; the design and its measurements are in train.batched's docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..data import Split
from .engine import epoch_starts
from .loop import evaluate_members
from .stacked import StackedModels, backward
from .optim import BatchedOptimizer

__all__ = ["BatchedStep", "EpochTotals", "train_epoch", "evaluate_stack", "EVAL_CHUNK"]

EVAL_CHUNK = 2500


def evaluate_stack(stack: StackedModels, split: Split, chunk: int = EVAL_CHUNK) -> tuple[list[float], list[float]]:
    """Per-model mean cross-entropy and error (%) on `split` in evaluation mode: `loop.evaluate_members`
    (the one evaluation of every path) over the stack's outputs, in chunks of `chunk` samples."""
    def outputs(x: torch.Tensor) -> list[torch.Tensor]:
        return list(stack.forward_logits(x.flatten(1), training=False).transpose(1, 2))  # N × (B, classes)

    chunks = ((split.x[s:s + chunk], split.y[s:s + chunk]) for s in range(0, len(split), chunk))
    results = evaluate_members(outputs, chunks, stack.n)
    return [loss for loss, _ in results], [error if error is not None else math.nan for _, error in results]


class BatchedStep:
    """One training step of every model of a stack: forward in training mode, per-model mean
    cross-entropy, backward into the flat gradient, and the optimiser's update with per-model
    learning rates; `fit`'s inner loop for N models at once (tests/test_batched.py).

    `compile=True` runs the forward and the loss through torch.compile (fusing BatchNorm, the
    activations and the gates' elementwise work; the backward is compiled with it) and the
    optimiser's update through its own compiled function. Compilation happens on the first call
    (tens of seconds to minutes, more with depth), and again when the number of models changes
    (a diverged model leaves the batch), so it pays only for long batches.
    """

    def __init__(self, stack: StackedModels, optimizer: BatchedOptimizer, compile: bool = False) -> None:
        self.stack, self.optimizer = stack, optimizer
        self._forward_loss = torch.compile(self._forward_loss_eager) if compile else self._forward_loss_eager

    def _forward_loss_eager(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.stack.forward_logits(x, training=True)  # (N, classes, B)
        losses = F.cross_entropy(logits, y, reduction="none").mean(1)
        wrong = (logits.detach().argmax(dim=1) != y).sum(1)
        return losses, wrong

    def __call__(self, x: torch.Tensor, y: torch.Tensor, lr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Train on `x` (N, B, features), `y` (N, B) with learning rates `lr` (N, 1); return each
        model's mean loss on the batch (N,) before the update and its number of errors (N,)."""
        losses, wrong = self._forward_loss(x, y)
        self.stack.grad.zero_()
        backward(losses.sum())  # each model's loss depends on its own parameters only
        self.optimizer.step(lr)
        return losses.detach(), wrong


@dataclass
class EpochTotals:
    """What `train_epoch` measured, per model of the stack: summed loss·batch size, errors, the
    first step whose loss was not finite (−1: none) and that loss, and the samples seen per model."""

    loss_sum: torch.Tensor
    wrong: torch.Tensor
    bad_step: torch.Tensor
    bad_loss: torch.Tensor
    seen: int


def train_epoch(step: BatchedStep, train_x: torch.Tensor, train_y: torch.Tensor, orders: torch.Tensor,
                batch_size: int, lr: torch.Tensor) -> EpochTotals:
    """One epoch of every model of `step`'s stack: model i visits the flattened training inputs
    `train_x` (n, features) and labels `train_y` (n,) in the order `orders[i]` (a permutation of
    range(n)), in mini-batches of `batch_size` (`epoch_starts`). A model whose loss stops being
    finite keeps stepping to the epoch's end (its slices never mix with the others'); the caller
    restores and drops it (see `train_batched`)."""
    k, n = orders.shape
    device = step.stack.device
    loss_sum = torch.zeros(k, dtype=torch.float64, device=device)
    wrong = torch.zeros(k, dtype=torch.long, device=device)
    bad_step = torch.full((k,), -1, dtype=torch.long, device=device)
    bad_loss = torch.zeros(k, dtype=torch.float32, device=device)
    seen = 0
    for i, start in enumerate(epoch_starts(n, batch_size)):
        index = orders[:, start:start + batch_size]
        x, y = train_x[index], train_y[index]  # (k, B, features), (k, B)
        losses, batch_wrong = step(x, y, lr)
        with torch.no_grad():
            bad = ~torch.isfinite(losses) & (bad_step < 0)
            bad_step = torch.where(bad, torch.full_like(bad_step, i), bad_step)
            bad_loss = torch.where(bad, losses.float(), bad_loss)
            loss_sum += losses.double() * y.shape[1]
            wrong += batch_wrong
        seen += y.shape[1]
    return EpochTotals(loss_sum, wrong, bad_step, bad_loss, seen)
