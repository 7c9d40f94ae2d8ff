"""What the training loop keeps per model and shows its callbacks: `History`, `TrainState`, `Callback`.

A leaf of train/: these types name no trainer, so every trainer (`loop.fit`, `stack.train_stacked`,
`full_batch.train_full_batch`) and every callback (train.callbacks, a user's own) imports them from
here without importing another trainer. `TrainState.optimizer` is typed as an `Updater` (anything
with a `step` method: a torch.optim.Optimizer, or the full-batch trainer), not as one engine's class.
The loop's contract for them is in train.loop's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from ..data import DataSplits
from .recipes import Recipe

__all__ = ["History", "TrainState", "Callback", "Updater"]


class Updater(Protocol):
    """What updates a member's weights, as `TrainState.optimizer` holds it: a torch.optim.Optimizer
    (`fit`'s, a stack's `stacked.StackedOptimizer`) or the full-batch trainer (`full_batch.StackedGD`),
    whose `step` takes the data. Callbacks that need a torch optimiser check for one (`isinstance`)."""

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """One update of the weights."""


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

    def final(self) -> dict[str, Any]:
        """The run's outcome, as results.json's `final` field holds it once the run has ended: the epochs
        completed, whether it diverged, and the last record's errors, training loss and gates (a language
        model's bits per character too, train.lm); None for each number before the first epoch ends."""
        last = self.last()
        return {
            "epochs_completed": len(self.epochs),
            "diverged": self.diverged,
            "test_error_pct": last["test_error_pct"] if last else None,
            "val_error_pct": last["val_error_pct"] if last else None,
            "train_loss": last["train_loss"] if last else None,
            "k_mean": last.get("k_mean") if last else None,
            "k": last.get("k") if last else None,
            **{key: last[key] for key in ("train_bpc", "val_bpc", "test_bpc") if last and key in last},
        }


@dataclass
class TrainState:
    """What callbacks see and may change.

    `epoch` counts finished epochs and `step` finished optimiser steps (both continue across a
    resume); `steps_per_epoch` is None for a DataLoader without a length. `data` is the DataSplits
    `fit` was given, else None. Setting `stop = True` ends training (see the module docstring).
    `optimizer` is what updates the model (`Updater`): a torch.optim.Optimizer for `fit` and for the
    members of a stack (they share one `stacked.StackedOptimizer`, whose group holds per-model
    rates), and the full-batch trainer (`full_batch.StackedGD`) for the Demystifying studies.
    """

    model: nn.Module
    optimizer: Updater
    recipe: Recipe
    data: DataSplits | None
    generator: torch.Generator
    history: History
    epoch: int = 0
    elapsed_s: float = 0.0
    stop: bool = False
    step: int = 0
    steps_per_epoch: int | None = None

    def progress_entry(self) -> dict[str, Any]:
        """What a checkpoint stores of this member's progress besides tensors (JSON-able): its history and
        elapsed seconds; its epoch is the history's length. Both checkpoint kinds (a run's checkpoint.json,
        a stack's batch.json) store exactly this per model, read back by `restore_progress`."""
        return {"history": self.history.to_dict(), "elapsed_s": self.elapsed_s}

    def restore_progress(self, entry: dict[str, Any]) -> None:
        """Set the history, the epoch (finished epochs = the history's records) and the elapsed seconds from
        a `progress_entry` read back from a checkpoint: the one resume path of `fit` and `train_stacked`."""
        self.history = History.from_dict(entry["history"])
        self.epoch = len(self.history.epochs)
        self.elapsed_s = float(entry.get("elapsed_s", 0.0))


class Callback(Protocol):
    """Hooks called by `fit`; every method is optional (`fit` calls only those a callback has).

    The contract is the same whatever the number of models the loop trains (train.loop's docstring)."""

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
