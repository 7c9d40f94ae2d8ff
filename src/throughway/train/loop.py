"""The training loop: `fit(model, data, recipe, callbacks)` returns a `History`.

One epoch = one pass over a fresh random permutation of the training split (from a generator
seeded by `seed`, so the data order is reproducible and resumable), mini-batches of
`recipe.batch_size`, softmax cross-entropy. After each epoch the model is evaluated on the
validation and test splits (recorded, never used to choose anything) and the record is appended
to the history; callbacks then see it (checkpointing, results files, early stopping).

A loss that becomes NaN or infinite ends the run cleanly: the history is kept, the run is marked
diverged, and the model is put back to its state at the end of the last finished epoch. Deep plain
nets are expected to fail; a study must go on.

Options for GPUs and scale, all off by default (the default path is unchanged, bit for bit):
`train_transform` (a per-batch augmentation applied on the device, e.g. data.augment.RandomCropFlip),
`amp` (bf16 autocast for the forward pass and loss; also runs on the CPU), `channels_last` (NHWC
memory format for conv nets), `compile_model` (torch.compile of the training forward). Under an
initialised torch.distributed process group (torchrun), training is data-parallel (see
train.distributed).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ..data import DataSplits, Split
from ..layers import scalar_gate_values
from . import distributed
from .flat import FlatOptimizer
from .recipes import Recipe, build_optimizer, learning_rate_at

__all__ = ["History", "TrainState", "Callback", "fit", "evaluate", "DEFAULT_EVAL_BATCH"]

DEFAULT_EVAL_BATCH = 10_000


@dataclass
class History:
    """Per-epoch records and the run's outcome.

    Each record holds: `epoch` (1-based), `lr`, `train_loss` (mean mini-batch cross-entropy during
    the epoch, in training mode, as Keras reports it and the paper's figure 4 plots),
    `train_error_pct` (mini-batch errors during the epoch), `val_loss`/`val_error_pct` (None when
    training on the full set), `test_loss`/`test_error_pct`, `k` and `k_mean` for models with scalar
    gates, `epoch_time_s` and `elapsed_s`.
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
    """What callbacks see and may restore: `epoch` counts finished epochs."""

    model: nn.Module
    optimizer: FlatOptimizer
    recipe: Recipe
    data: DataSplits
    generator: torch.Generator
    history: History
    epoch: int = 0
    elapsed_s: float = 0.0
    stop: bool = False


class Callback(Protocol):
    """Hooks called by `fit`; every method is optional (`fit` calls only those a callback has)."""

    def on_fit_start(self, state: TrainState) -> None:
        """Called once before training; may restore a checkpoint into `state`."""

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Called after each finished epoch with its record."""

    def on_fit_end(self, state: TrainState) -> None:
        """Called once when training ends (finished, diverged or stopped)."""


@torch.no_grad()
def evaluate(model: nn.Module, split: Split, batch_size: int = DEFAULT_EVAL_BATCH) -> tuple[float, float]:
    """Mean cross-entropy and error (%) of `model` on `split`, in eval mode; the model's mode is restored.

    A non-finite logit row counts as an error and makes the loss NaN.
    """
    was_training = model.training
    model.eval()
    try:
        total_loss, wrong, n = 0.0, 0, len(split)
        for start in range(0, n, batch_size):
            x, y = split.x[start:start + batch_size], split.y[start:start + batch_size]
            logits = model(x)
            total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
            finite = torch.isfinite(logits).all(dim=1)
            wrong += int(((logits.argmax(dim=1) != y) | ~finite).sum())
        return total_loss / n, 100.0 * wrong / n
    finally:
        model.train(was_training)


def _call(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def set_learning_rate(optimizer: torch.optim.Optimizer | FlatOptimizer, lr: float) -> None:
    """Set every parameter group's learning rate to `lr` times the group's "lr_mult" (1 when it has
    none; recipes.parameter_groups); the optimiser's state (momentum buffers, Adam moments) is left
    untouched, so a learning-rate step keeps the momentum."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)


def fit(model: nn.Module, data: DataSplits, recipe: Recipe, callbacks: Sequence[Any] = (), *,
        seed: int = 0, progress: bool = True, eval_batch_size: int = DEFAULT_EVAL_BATCH,
        train_transform: Callable[[torch.Tensor], torch.Tensor] | None = None, amp: bool = False,
        channels_last: bool = False, compile_model: bool = False) -> History:
    """Train `model` on `data.train` with `recipe`; return the History (see the module docstring).

    The model must already be on the data's device. `seed` seeds the data-order generator only
    (seed the model's initialisation before building it). Callbacks' `on_fit_start` may restore a
    checkpoint into the TrainState; `fit` then continues from `state.epoch`.

    `train_transform` maps each training batch x to its augmented version on the device (evaluation
    never sees it). `amp` runs the training forward and loss under bf16 autocast on the data's
    device type; the parameters, gradients, optimiser and evaluation stay float32. `channels_last`
    converts the model and 4-d batches to NHWC. `compile_model` trains through torch.compile(model).
    """
    device = data.train.x.device
    if next(model.parameters()).device != device:
        raise ValueError(f"model is on {next(model.parameters()).device} but the data on {device}; move one")
    if len(data.train) < 2:
        raise ValueError("the training split needs at least 2 samples")
    optimizer = build_optimizer(model, recipe)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    state = TrainState(model, optimizer, recipe, data, generator, History())
    _call(callbacks, "on_fit_start", state)
    rank, world = distributed.rank_and_world()
    progress = progress and rank == 0
    if channels_last:
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit memory_format
    train_model: Callable[..., Any] = distributed.wrap_model(model)
    if compile_model:
        train_model = torch.compile(train_model)
    snapshot = _snapshot(model)
    n, batch_size = len(data.train), recipe.batch_size
    interactive = progress and sys.stderr.isatty()

    while state.epoch < recipe.epochs and not state.history.diverged and not state.stop:
        epoch = state.epoch
        lr = learning_rate_at(recipe, epoch)
        set_learning_rate(optimizer, lr)
        model.train()
        started = time.perf_counter()
        order = torch.randperm(n, generator=generator).to(device)
        # A last batch of one sample (per rank) would break BatchNorm's training statistics: fold it away.
        starts = [s for s in range(0, n, batch_size) if n - s > 2 * world - 1 or s == 0]
        loss_sum, wrong, seen = 0.0, 0, 0
        bar = None
        if interactive:
            from tqdm import tqdm

            bar = tqdm(total=len(starts), desc=f"epoch {epoch + 1}/{recipe.epochs}", leave=False, file=sys.stderr)
        for step, start in enumerate(starts):
            batch = order[start:start + batch_size]
            index = distributed.shard(batch, rank, world)
            y = data.train.y[index]
            if train_transform is None:
                x = data.train.x[index]
            else:
                # Augment the whole global batch, then keep this rank's share: every rank draws the
                # same random numbers, so a data-parallel step sees the images one process would.
                x = distributed.shard(train_transform(data.train.x[batch]), rank, world)
            if channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            if amp:
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                    logits = train_model(x)
                    loss = F.cross_entropy(logits.float(), y)
            else:
                logits = train_model(x)
                loss = F.cross_entropy(logits, y)
            batch_wrong = (logits.detach().argmax(dim=1) != y).sum()
            if world > 1:
                # One all-reduce gives every rank the global batch's loss, errors and size, so the
                # divergence check and the records agree across ranks and with one process.
                totals = distributed.all_reduce_sum(torch.stack([
                    loss.detach().double() * len(y), batch_wrong.double(),
                    torch.tensor(float(len(y)), dtype=torch.float64, device=loss.device)]))
                loss_value = float(totals[0] / totals[2])
                batch_wrong, batch_seen = int(totals[1]), int(totals[2])
            else:
                loss_value = float(loss.detach())
                batch_seen = len(y)
            if not math.isfinite(loss_value):
                state.history.diverged = True
                state.history.diverged_at = {"epoch": epoch + 1, "step": step, "loss": str(loss_value)}
                break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss_value * batch_seen
            wrong += int(batch_wrong)
            seen += batch_seen
            if bar is not None:
                bar.update(1)
                if step % 20 == 0:
                    bar.set_postfix(loss=f"{loss_sum / seen:.4f}")
        if bar is not None:
            bar.close()
        if state.history.diverged:
            model.load_state_dict(snapshot)  # back to the last finished epoch's weights
            if progress:
                print(f"  diverged in epoch {epoch + 1} (loss {(state.history.diverged_at or {}).get('loss')}); "
                      f"run ends, history kept", file=sys.stderr, flush=True)
            break

        epoch_time = time.perf_counter() - started
        state.elapsed_s += epoch_time
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "lr": lr,
            "train_loss": loss_sum / seen,
            "train_error_pct": 100.0 * wrong / seen,
        }
        if data.val is not None:
            record["val_loss"], record["val_error_pct"] = evaluate(model, data.val, eval_batch_size)
        else:
            record["val_loss"], record["val_error_pct"] = None, None
        record["test_loss"], record["test_error_pct"] = evaluate(model, data.test, eval_batch_size)
        ks = scalar_gate_values(model)
        if ks:
            record["k"] = ks
            record["k_mean"] = sum(ks) / len(ks)
        record["epoch_time_s"] = epoch_time
        record["elapsed_s"] = state.elapsed_s
        state.history.epochs.append(record)
        state.epoch = epoch + 1
        snapshot = _snapshot(model)
        if progress:
            val = f" val {record['val_error_pct']:.2f}%" if record["val_error_pct"] is not None else ""
            kinfo = f" k̄ {record['k_mean']:.3f}" if ks else ""
            print(f"  epoch {epoch + 1:>3}/{recipe.epochs} loss {record['train_loss']:.4f}{val} "
                  f"test {record['test_error_pct']:.2f}%{kinfo} ({epoch_time:.1f}s)", file=sys.stderr, flush=True)
        _call(callbacks, "on_epoch_end", state, record)

    _call(callbacks, "on_fit_end", state)
    return state.history
