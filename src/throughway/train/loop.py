"""The training loop: `fit(model, data, recipe, callbacks)` returns a `History`.

`fit` trains any `nn.Module` on the user's data: the toolkit's in-memory `DataSplits`, a pair of
tensors (x, y), a `torch.utils.data.Dataset`, or a `DataLoader` (see `fit` for what each form
does). A `Recipe` (or a registered recipe's name) supplies the epochs, the batch size, the
optimiser and the learning-rate schedule; the registered recipes are presets of it, and `loss_fn`
and `optimizer` replace the recipe's cross-entropy and optimiser.

One epoch, in order; each numbered step is a separate piece of the loop, and everything else a
run needs is a callback:

1. `on_epoch_start(state)`; the learning rate of the recipe's schedule is set (unless the caller
   gave its own optimizer).
2. For each mini-batch: forward, loss, then the **divergence check** (a step of the loop, not a
   callback, because it must run before the backward pass): a loss that is NaN or infinite ends the
   run cleanly: the history is kept, the run is marked diverged (`History.diverged_at`), and the
   model is put back to its state at the end of the last finished epoch. Deep plain nets are
   expected to fail; a study must go on. Otherwise backward, optimiser step, then
   `on_step_end(state, step, loss)`.
3. **Evaluation**: the model is evaluated in eval mode on the validation and test splits (recorded,
   never used to choose anything), and the epoch's record is appended to `state.history`.
4. `on_epoch_end(state, record)`.

`on_fit_start(state)` runs once before the first epoch (it may restore a checkpoint: the loop then
continues from `state.epoch`), `on_fit_end(state)` once at the end (finished, diverged or stopped).
A callback ends training by setting `state.stop = True`: in `on_epoch_end` after that epoch, in
`on_step_end` after that step (the shortened epoch is still evaluated and recorded, its record
marked `stopped_at_step`). The built-in pieces are callbacks too: progress output is
`callbacks.ProgressPrinter` (added by `progress=True`), and a run directory's checkpoints,
results.json, metrics.csv and TensorBoard events are callbacks that `runner.run_training` adds.

The hooks' contract does not depend on how many models the loop trains, so that a stacked ensemble
(many models as one module) can run through the same hooks: `state.model` is whatever module is
trained, `loss` in `on_step_end` is the float the optimiser minimised in that step, and per-model
numbers belong in the record (a record's value may be a list, as `k` already is).

Options for GPUs and scale, all off by default (the default path is unchanged, bit for bit):
`train_transform` (a per-batch augmentation applied on the device, e.g. data.augment.RandomCropFlip),
`amp` (bf16 autocast for the forward pass and loss; also runs on the CPU), `channels_last` (NHWC
memory format for conv nets), `compile_model` (torch.compile of the training forward). Under an
initialised torch.distributed process group (torchrun), training is data-parallel (see
train.distributed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence, Union

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from ..data import DataSplits, Split
from ..layers import scalar_gate_values
from . import distributed
from .callbacks import ProgressPrinter
from .flat import FlatOptimizer
from .recipes import Recipe, build_optimizer, get_recipe, learning_rate_at

__all__ = ["History", "TrainState", "Callback", "fit", "evaluate", "DEFAULT_EVAL_BATCH", "TrainData", "LossFn"]

DEFAULT_EVAL_BATCH = 10_000

# What `fit` trains on (see `fit`): in-memory splits, (x, y) tensors, a Dataset, or a DataLoader.
TrainData = Union[DataSplits, tuple[torch.Tensor, torch.Tensor], Sequence[torch.Tensor], Dataset, DataLoader]
# loss_fn(outputs, targets) -> the batch's mean loss, a scalar tensor (as F.cross_entropy returns it).
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_ACCEPTED_DATA = ("DataSplits, a pair of tensors (x, y), a torch.utils.data.Dataset of (x, y) items, "
                  "or a torch.utils.data.DataLoader yielding (x, y) batches")


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
    optimizer: FlatOptimizer | torch.optim.Optimizer
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
        epochs and resumes; equal to `state.step`), `loss` the step's training loss. Setting
        `state.stop = True` ends the epoch after this step and then training."""

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Called after each finished epoch with its record (already in `state.history`)."""

    def on_fit_end(self, state: TrainState) -> None:
        """Called once when training ends (finished, diverged or stopped)."""


def _classifies(outputs: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether `outputs` are (N, classes) scores for N integer labels `y`, so that an error rate means something."""
    return outputs.dim() == 2 and y.dim() == 1 and not y.is_floating_point() and len(outputs) == len(y)


def _wrong(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """Misclassified rows of a batch, or None when the outputs are not class scores for integer labels."""
    return (outputs.argmax(dim=1) != y).sum() if _classifies(outputs, y) else None


def evaluate(model: nn.Module, split: Split | DataLoader, batch_size: int = DEFAULT_EVAL_BATCH,
             loss_fn: LossFn | None = None) -> tuple[float, float]:
    """Mean loss and error (%) of `model` on `split`, in eval mode; the model's mode is restored.

    `split` is an in-memory Split (evaluated in chunks of `batch_size`) or a DataLoader (its batches,
    moved to the model's device). The loss is cross-entropy unless `loss_fn` (a batch-mean loss) is
    given. A non-finite output row counts as an error and makes the loss NaN; the error is NaN when
    the outputs are not (N, classes) scores for integer labels (the training records hold None then).
    """
    loss, error = _evaluate(model, split, batch_size, loss_fn)
    return loss, math.nan if error is None else error


@torch.no_grad()
def _evaluate(model: nn.Module, split: Split | DataLoader, batch_size: int,
              loss_fn: LossFn | None) -> tuple[float, float | None]:
    was_training = model.training
    model.eval()
    try:
        total_loss, wrong, n, classified = 0.0, 0, 0, True
        for x, y in _eval_batches(model, split, batch_size):
            outputs = model(x)
            if loss_fn is None:
                total_loss += float(F.cross_entropy(outputs, y, reduction="sum"))
            else:
                total_loss += float(loss_fn(outputs, y)) * len(y)
            if not _classifies(outputs, y):
                classified = False
            else:
                finite = torch.isfinite(outputs).all(dim=1)
                wrong += int(((outputs.argmax(dim=1) != y) | ~finite).sum())
            n += len(y)
        if n == 0:
            raise ValueError("evaluate: the evaluation data is empty")
        return total_loss / n, (100.0 * wrong / n if classified else None)
    finally:
        model.train(was_training)


def _eval_batches(model: nn.Module, split: Split | DataLoader,
                  batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(split, DataLoader):
        device = _model_device(model)
        for batch in split:
            yield _to_device(batch, device, "eval_data")
        return
    for start in range(0, len(split), batch_size):
        yield split.x[start:start + batch_size], split.y[start:start + batch_size]


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


def _model_device(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    raise ValueError("model has no parameters or buffers; fit needs a model with parameters to train")


def _to_device(batch: Any, device: torch.device, argument: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        raise TypeError(f"{argument}: a DataLoader batch is {type(batch).__name__}; accepted: a pair of tensors (x, y)")
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def _pair(x: Any, y: Any, argument: str, device: torch.device) -> Split:
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        raise TypeError(f"{argument}: (x, y) must both be tensors, got ({type(x).__name__}, {type(y).__name__})")
    if x.dim() == 0 or y.dim() == 0 or len(x) != len(y):
        raise ValueError(f"{argument}: x and y must have one row per sample and as many rows; got shapes "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    return Split(x.to(device), y.to(device))


def _stack_dataset(dataset: Dataset, argument: str, device: torch.device) -> Split:
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return _pair(*dataset.tensors, argument, device)
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise TypeError(f"{argument}: an iterable Dataset has no length to stack; pass it inside a DataLoader")
    xs, ys = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"{argument}: item {i} is {type(item).__name__}; accepted: a pair (x, y) per item "
                            f"(or pass a DataLoader that builds the batches)")
        xs.append(torch.as_tensor(item[0]))
        ys.append(torch.as_tensor(item[1]))
    if not xs:
        raise ValueError(f"{argument}: the Dataset is empty")
    return _pair(torch.stack(xs), torch.stack(ys), argument, device)


def _user_split(data: Any, argument: str, device: torch.device) -> Split | DataLoader:
    """A user's data as an in-memory Split on `device` where possible, else the DataLoader itself."""
    if isinstance(data, DataLoader):
        return data
    if isinstance(data, Split):
        return _pair(data.x, data.y, argument, device)
    if isinstance(data, Dataset):
        return _stack_dataset(data, argument, device)
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _pair(data[0], data[1], argument, device)
    raise TypeError(f"{argument}: got {type(data).__name__}; accepted: {_ACCEPTED_DATA}")


def _resolve(model: nn.Module, data: Any, eval_data: Any) -> tuple[torch.device, Split | DataLoader,
                                                                    Split | DataLoader | None,
                                                                    Split | DataLoader | None, DataSplits | None]:
    """(device, train, val, test, the DataSplits given or None)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: got {type(model).__name__}; accepted: a torch.nn.Module")
    if isinstance(data, DataSplits):
        if eval_data is not None:
            raise ValueError("eval_data: DataSplits carries its own val and test splits; give eval_data only "
                             "with tensors, a Dataset or a DataLoader")
        device = data.train.x.device
        if _model_device(model) != device:
            raise ValueError(f"model is on {_model_device(model)} but the data on {device}; move one")
        return device, data.train, data.val, data.test, data
    device = _model_device(model)
    train = _user_split(data, "data", device)
    test = None if eval_data is None else _user_split(eval_data, "eval_data", device)
    return device, train, None, test, None


def fit(model: nn.Module, data: TrainData, recipe: Recipe | str, callbacks: Sequence[Any] = (), *,
        eval_data: TrainData | None = None, loss_fn: LossFn | None = None,
        optimizer: torch.optim.Optimizer | FlatOptimizer | None = None, seed: int = 0, progress: bool = True,
        label: str | None = None, eval_batch_size: int = DEFAULT_EVAL_BATCH,
        train_transform: Callable[[torch.Tensor], torch.Tensor] | None = None, amp: bool = False,
        channels_last: bool = False, compile_model: bool = False) -> History:
    """Train `model` on `data` for `recipe.epochs` epochs; return the History (see the module docstring).

    `model` is any `nn.Module` mapping a batch x to outputs that `loss_fn(outputs, y)` scores.
    `data` may be:

    * `DataSplits` (the toolkit's datasets): trained on `.train`, evaluated on `.val` and `.test`.
      The model must already be on the data's device.
    * a pair of tensors `(x, y)`: moved to the model's device and trained on as an in-memory split
      (the fast path: batches are index slices of a random permutation, no DataLoader).
    * a `Dataset`: a `TensorDataset` of (x, y) is used as that pair; any other map-style Dataset of
      (x, y) items is read once, item by item, and stacked into such a pair on the model's device.
      Data too large for memory, or needing per-item work, goes in a DataLoader instead.
    * a `DataLoader` yielding (x, y) batches: iterated as given each epoch, each batch moved to the
      model's device; its own sampler decides the order (`seed` does not), so a resumed run is
      exact only if the loader's order is. The recipe's batch size does not apply.

    `eval_data` (any of the last three forms; not with DataSplits) is evaluated after each epoch and
    recorded as `test_loss` / `test_error_pct`. `recipe` is a Recipe or a registered recipe's name
    (use `get_recipe(name, epochs=...)` or `Recipe.replace` for variants); it gives the epochs, the
    batch size, the optimiser and the learning-rate schedule. `loss_fn(outputs, y)` returns the
    batch's mean loss (default: cross-entropy); the error percentages are recorded only when the
    outputs are (N, classes) scores for integer labels. `optimizer` replaces the recipe's: the loop
    then leaves its learning rates alone (step a torch lr scheduler from a callback) and records
    its first group's lr.

    `seed` seeds the data-order generator only (seed the model's initialisation before building
    it). Callbacks' `on_fit_start` may restore a checkpoint into the TrainState; `fit` then
    continues from `state.epoch`. `progress` prints one line per epoch on stderr (and a bar on a
    terminal) through `callbacks.ProgressPrinter`, each line starting with `[label]` when `label`
    is given (e.g. the run's name, so that parallel runs can be told apart).

    `train_transform` maps each training batch x to its augmented version on the device (evaluation
    never sees it). `amp` runs the training forward and loss under bf16 autocast on the data's
    device type; the parameters, gradients, optimiser and evaluation stay float32. `channels_last`
    converts the model and 4-d batches to NHWC. `compile_model` trains through torch.compile(model).

    Raises TypeError / ValueError naming the argument for data, model, recipe or optimizer of a
    kind it does not accept.
    """
    if isinstance(recipe, str):
        recipe = get_recipe(recipe)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe: got {type(recipe).__name__}; accepted: a Recipe or a registered recipe's name")
    if optimizer is not None and not isinstance(optimizer, (torch.optim.Optimizer, FlatOptimizer)):
        raise TypeError(f"optimizer: got {type(optimizer).__name__}; accepted: a torch.optim.Optimizer, a "
                        f"FlatOptimizer, or None for the recipe's")
    device, train, val, test, splits = _resolve(model, data, eval_data)
    if isinstance(train, Split) and len(train) < 2:
        raise ValueError("the training split needs at least 2 samples")
    schedule = optimizer is None
    if optimizer is None:
        optimizer = build_optimizer(model, recipe)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    rank, world = distributed.rank_and_world()
    n, batch_size = (len(train), recipe.batch_size) if isinstance(train, Split) else (0, 1)
    # A last batch of one sample (per rank) would break BatchNorm's training statistics: fold it away.
    starts = [s for s in range(0, n, batch_size) if n - s > 2 * world - 1 or s == 0]
    steps_per_epoch = len(starts) if isinstance(train, Split) else _loader_length(train)
    state = TrainState(model, optimizer, recipe, splits, generator, History(), steps_per_epoch=steps_per_epoch)
    if progress and rank == 0:
        callbacks = [*callbacks, ProgressPrinter(label=label)]
    _call(callbacks, "on_fit_start", state)
    if state.step == 0 and state.epoch > 0 and steps_per_epoch is not None:
        state.step = state.epoch * steps_per_epoch  # a restored run continues its step count
    if channels_last:
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit memory_format
    train_model: Callable[..., Any] = distributed.wrap_model(model)
    if compile_model:
        train_model = torch.compile(train_model)
    compute_loss: LossFn = F.cross_entropy if loss_fn is None else loss_fn
    snapshot = _snapshot(model)

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not isinstance(train, Split):
            for batch in train:
                yield _to_device(batch, device, "data")
            return
        order = torch.randperm(n, generator=generator).to(device)
        for start in starts:
            batch = order[start:start + batch_size]
            index = distributed.shard(batch, rank, world)
            y = train.y[index]
            if train_transform is None:
                x = train.x[index]
            else:
                # Augment the whole global batch, then keep this rank's share: every rank draws the
                # same random numbers, so a data-parallel step sees the images one process would.
                x = distributed.shard(train_transform(train.x[batch]), rank, world)
            yield x, y

    while state.epoch < recipe.epochs and not state.history.diverged and not state.stop:
        epoch = state.epoch
        if schedule:
            lr = learning_rate_at(recipe, epoch)
            set_learning_rate(optimizer, lr)
        else:
            lr = float(optimizer.param_groups[0]["lr"])
        _call(callbacks, "on_epoch_start", state)
        model.train()
        started = time.perf_counter()
        loss_sum, wrong, seen, classified, steps = 0.0, 0, 0, True, 0
        for step, (x, y) in enumerate(batches()):
            if not isinstance(train, Split) and train_transform is not None:
                x = train_transform(x)
            if channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            if amp:
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                    logits = train_model(x)
                    loss = compute_loss(logits.float(), y)
            else:
                logits = train_model(x)
                loss = compute_loss(logits, y)
            batch_wrong = _wrong(logits.detach(), y)
            if batch_wrong is None:
                classified, batch_wrong = False, torch.zeros((), device=loss.device)
            wrong_count: int | torch.Tensor
            if world > 1:
                # One all-reduce gives every rank the global batch's loss, errors and size, so the
                # divergence check and the records agree across ranks and with one process.
                totals = distributed.all_reduce_sum(torch.stack([
                    loss.detach().double() * len(y), batch_wrong.double(),
                    torch.tensor(float(len(y)), dtype=torch.float64, device=loss.device)]))
                loss_value = float(totals[0] / totals[2])
                wrong_count, batch_seen = int(totals[1]), int(totals[2])
            else:
                loss_value = float(loss.detach())
                wrong_count, batch_seen = batch_wrong, len(y)
            # Divergence check: before the backward pass, so that no non-finite update is applied.
            if not math.isfinite(loss_value):
                state.history.diverged = True
                state.history.diverged_at = {"epoch": epoch + 1, "step": step, "loss": str(loss_value)}
                break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss_value * batch_seen
            wrong += int(wrong_count)
            seen += batch_seen
            steps += 1
            state.step += 1
            _call(callbacks, "on_step_end", state, state.step, loss_value)
            if state.stop:
                break
        if state.history.diverged:
            model.load_state_dict(snapshot)  # back to the last finished epoch's weights
            break
        if seen == 0:
            raise ValueError("data: the DataLoader yielded no batches in an epoch")

        epoch_time = time.perf_counter() - started
        state.elapsed_s += epoch_time
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "lr": lr,
            "train_loss": loss_sum / seen,
            "train_error_pct": 100.0 * wrong / seen if classified else None,
        }
        # Evaluation: recorded, never used to choose anything.
        for name, split in (("val", val), ("test", test)):
            if split is None:
                record[f"{name}_loss"], record[f"{name}_error_pct"] = None, None
            else:
                record[f"{name}_loss"], record[f"{name}_error_pct"] = _evaluate(model, split, eval_batch_size, loss_fn)
        ks = scalar_gate_values(model)
        if ks:
            record["k"] = ks
            record["k_mean"] = sum(ks) / len(ks)
        record["epoch_time_s"] = epoch_time
        record["elapsed_s"] = state.elapsed_s
        if state.stop and steps_per_epoch is not None and steps < steps_per_epoch:
            record["stopped_at_step"] = steps
        state.history.epochs.append(record)
        state.epoch = epoch + 1
        snapshot = _snapshot(model)
        _call(callbacks, "on_epoch_end", state, record)

    _call(callbacks, "on_fit_end", state)
    return state.history


def _loader_length(loader: DataLoader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None
