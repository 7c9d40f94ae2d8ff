"""What the training loop keeps per model and shows its callbacks: `History`, `TrainState`, `Callback`.

Shared by `loop.fit`, `engine.run_loop` and `batched.train_batched` (one loop, see train.engine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch
from torch import nn

from ..data import DataSplits
from .recipes import Recipe

if TYPE_CHECKING:
    from .full_batch import BatchedGD
    from .optim import BatchedOptimizer

__all__ = ["History", "TrainState", "Callback", "call", "progress_entry", "restore_progress"]


@dataclass
class History:
    """Per-epoch records and the run's outcome.

    Each record holds: `epoch` (1-based), `lr`, `train_loss` (mean mini-batch loss during the
    epoch, in training mode, as Keras reports it and the paper's figure 4 plots),
    `train_error_pct` (mini-batch errors during the epoch; None when the outputs are not class
    scores for integer labels), `val_loss`/`val_error_pct` (None when training on the full set or
    without a validation split), `test_loss`/`test_error_pct` (None without evaluation data), `k`
    and `k_mean` for models with scalar gates, `epoch_time_s` and `elapsed_s`; and
    `stopped_at_step` for an epoch a callback ended early.
    """

    epochs: list[dict[str, Any]] = field(default_factory=list)
    diverged: bool = False
    diverged_at: dict[str, Any] | None = None

    def last(self) -> dict[str, Any] | None:
        """The last epoch's record, or None before the first epoch ends."""
        return self.epochs[-1] if self.epochs else None

    def to_dict(self) -> dict[str, Any]:
        """The history as a JSON-able dict (for checkpoints and results files)."""
        return {"epochs": self.epochs, "diverged": self.diverged, "diverged_at": self.diverged_at}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "History":
        """Rebuild a History from `to_dict`'s output."""
        return cls(epochs=list(data["epochs"]), diverged=bool(data["diverged"]), diverged_at=data["diverged_at"])


@dataclass
class TrainState:
    """What callbacks see and may change.

    `epoch` counts finished epochs and `step` finished optimiser steps (both continue across a
    resume); `steps_per_epoch` is None for a DataLoader without a length. `data` is the DataSplits
    `fit` was given, else None. Setting `stop = True` ends training (see the module docstring).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | BatchedOptimizer | BatchedGD
    recipe: Recipe
    data: DataSplits | None
    generator: torch.Generator
    history: History
    epoch: int = 0
    elapsed_s: float = 0.0
    stop: bool = False
    step: int = 0
    steps_per_epoch: int | None = None


class Callback(Protocol):
    """Hooks called by `fit`; every method is optional (`fit` calls only those a callback has).

    The contract is the same whatever the number of models the loop trains (module docstring)."""

    def on_fit_start(self, state: TrainState) -> None:
        """Called once before training; may restore a checkpoint into `state`."""

    def on_epoch_start(self, state: TrainState) -> None:
        """Called before each epoch's first step (`state.epoch` is the number of finished epochs)."""

    def on_step_end(self, state: TrainState, step: int, loss: float) -> None:
        """Called after each optimiser step: `step` is the run's step count (1-based, continuing across
        epochs and resumes; equal to `state.step`), `loss` the batch's mean training loss as a Python
        float (the loss the step minimised; under data parallelism, the global batch's). Setting
        `state.stop = True` ends the epoch after this step and then training."""

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Called after each finished epoch with its record (already in `state.history`)."""

    def on_fit_end(self, state: TrainState) -> None:
        """Called once when training ends (finished, diverged or stopped)."""


def call(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    """Call `hook(*args)` on every callback that has it, in order (every hook is optional)."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


def progress_entry(state: TrainState) -> dict[str, Any]:
    """What a checkpoint stores of a member's progress besides tensors (JSON-able): its history and
    elapsed seconds; its epoch is the history's length. Both checkpoint kinds (a run's
    checkpoint.json, a batch's batch.json) store exactly this per model, read back by `restore_progress`."""
    return {"history": state.history.to_dict(), "elapsed_s": state.elapsed_s}


def restore_progress(state: TrainState, entry: dict[str, Any]) -> None:
    """Set `state`'s history, epoch (finished epochs = the history's records) and elapsed seconds from a
    `progress_entry` read back from a checkpoint. The one resume path of `fit` and `train_batched`."""
    state.history = History.from_dict(entry["history"])
    state.epoch = len(state.history.epochs)
    state.elapsed_s = float(entry.get("elapsed_s", 0.0))
