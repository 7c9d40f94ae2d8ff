"""The training loop: `fit(model, data, recipe, callbacks)` returns a `History`.

`fit` trains any `nn.Module` on the user's data: the toolkit's in-memory `DataSplits`, a pair of
tensors (x, y), a `torch.utils.data.Dataset`, or a `DataLoader` (see `fit` for what each form
does). A `Recipe` (or a registered recipe's name) supplies the epochs, the batch size, the
optimiser and the learning-rate schedule; the registered recipes are presets of it, and `loss_fn`
and `optimizer` replace the recipe's cross-entropy and optimiser.

One epoch, in order; each numbered step is a separate piece of the loop, and everything else a
run needs is a callback:

1. `on_epoch_start(state)`; the learning rate of the recipe's schedule is set (unless the caller
   gave its own optimizer). A schedule set per step (recipes.STEP_SCHEDULES: warm-up and cosine decay)
   is set again before every step from `recipes.learning_rate_at_step(recipe, step, total steps)`, the
   one rule the language-model path (train.lm) follows too; the epoch's record holds its first step's rate.
2. For each mini-batch: forward, loss, then the **divergence check** (a step of the loop, not a
   callback, because it must run before the backward pass): a loss that is NaN or infinite ends the
   run cleanly: the history is kept, the run is marked diverged (`History.diverged_at`), and the
   model is put back to its state at the end of the last finished epoch. Deep plain nets are
   expected to fail; a study must go on. Otherwise backward, optimiser step, then
   `on_step_end(state, step, loss)`. (`fit(..., loss_read="lagged")` reads each step's loss one step
   later, after the next forward pass is launched, with the same results; see `fit`.)
3. **Evaluation**: the model is evaluated in eval mode on the validation and test splits (recorded,
   never used to choose anything), and the epoch's record is appended to `state.history`.
4. `on_epoch_end(state, record)`.

`on_fit_start(state)` runs once before the first epoch (it may restore a checkpoint: the loop then
continues from `state.epoch`), `on_fit_end(state)` once at the end (finished, diverged or stopped).
A callback ends training by setting `state.stop = True`: in `on_epoch_end` after that epoch, in
`on_step_end` after that step (the shortened epoch is still evaluated and recorded, its record
marked `stopped_at_step`). The built-in pieces are callbacks too: progress output is
`callbacks.ProgressPrinter` (added by `progress=True`), and a run directory's checkpoints,
results.json, metrics.csv and TensorBoard events are callbacks that `run.run_training` adds.

The epoch loop itself is `run_loop`, shared with `stack.train_stacked` (many models as one stack) and
`full_batch.train_full_batch` (the Demystifying ResNet studies' full-batch descent): one loop for
one model and for many. What differs between them is only how an epoch of steps is computed,
evaluated and rolled back, the `Engine` (the one narrow seam); `fit` supplies the engine of one
module (`_ModuleEngine`: the batches, the forward, the divergence check, the step and
`on_step_end`), `stack._StackEngine` and `full_batch._FullBatchEngine` theirs. Everything else is
written once, here: the learning rates, the hooks, divergence (the member's history is kept and
marked, its weights go back to the end of its last finished epoch, it leaves the loop and its
`on_fit_end` runs), evaluation (`evaluate_outputs`, also a stack's), the epoch record
(`epoch_record`), the mini-batch starts (`epoch_starts`) and stopping.

What the loop keeps per model and shows its callbacks (`History`, `TrainState`, `Callback`) is in
train.state, a leaf that names no trainer (re-exported here), with the one resume path: what a
checkpoint stores of a member's progress (`TrainState.progress_entry`) and how it is read back
(`TrainState.restore_progress`). The file reads top to bottom: the callbacks' calls (`call`), the loop
(`Engine`, `Member`, `run_loop`), evaluation, then `fit` and its engine. The hooks' contract does
not depend on how many models the loop trains: `state.model` is whatever module is
trained, `loss` in `on_step_end` is the float the optimiser minimised in that step, and per-model
numbers belong in the record (a record's value may be a list, as `k` already is).

Options for GPUs and scale, all off by default (the default path is unchanged, bit for bit):
`train_transform` (a per-batch augmentation applied on the device, e.g. data.augment.RandomCropFlip),
`amp` (bf16 autocast for the forward pass and loss; also runs on the CPU), `channels_last` (NHWC
memory format for conv nets), `compile_model` (torch.compile of the training forward), `loss_read="lagged"`
(each step's loss read after the next step's forward pass is launched, so that the GPU does not wait
for the host between steps; same results). Under an
initialised torch.distributed process group (torchrun), training is data-parallel (see
train.distributed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence, Union

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from ..data import DataSplits, Split
from ..layers import branch_gate_values
from . import distributed
from .callbacks import ProgressPrinter
from .checks import (cast_inputs, check_first_batch, check_fit, check_gradients, check_labels, check_loss, check_outputs,
                     model_dtype, modes_kept, probe)
from .inputs import ItemSplit, loader_length, model_device, to_device, user_split
from .optim import build_optimizer
from .recipes import STEP_SCHEDULES, Recipe, learning_rate_at, learning_rate_at_step
from .state import Callback, History, TrainState

__all__ = ["History", "TrainState", "Callback", "call", "count_step", "EpochStats", "Engine",
           "Member", "epoch_starts", "epoch_record", "run_loop", "fit", "evaluate", "evaluate_members", "evaluate_outputs",
           "DEFAULT_EVAL_BATCH", "TrainData", "LossFn"]


# ----------------------------------------------------------------------------------------------
# Calling the callbacks
# ----------------------------------------------------------------------------------------------
def call(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    """Call `hook(*args)` on every callback that has it, in order (every hook is optional)."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


# ----------------------------------------------------------------------------------------------
# The one epoch loop
# ----------------------------------------------------------------------------------------------
def epoch_starts(n: int, batch_size: int, world: int = 1) -> list[int]:
    """The first index of each mini-batch of an epoch over n samples, for every path (fit's in-memory
    data, train_stacked's stacks): consecutive batches of `batch_size`, except that a final batch of
    fewer than two samples per rank (`world` data-parallel processes) is folded away, since it would
    break BatchNorm's training statistics."""
    return [s for s in range(0, n, batch_size) if n - s > 2 * world - 1 or s == 0]


@dataclass
class EpochStats:
    """What one epoch of training measured, per active member (positions as in the engine).

    `loss_sum[i]`: the sum over the epoch's batches of member i's batch-mean loss × batch size;
    `wrong[i]`: its misclassified training samples, or None when the outputs are not class scores;
    `seen`: samples per member; `steps`: optimiser steps taken; `diverged`: position → {"step",
    "loss"} for members whose loss stopped being finite (at that step of the epoch, 0-based);
    `extra`: per member, further numbers of the epoch for its record (e.g. the full-batch studies'
    gradient norm), or None.
    """

    loss_sum: list[float]
    wrong: list[int | None]
    seen: int
    steps: int
    diverged: dict[int, dict[str, Any]] = field(default_factory=dict)
    extra: list[dict[str, Any]] | None = None


class Engine(Protocol):
    """How the loop's members are trained, evaluated and rolled back (see the module docstring).

    Positions are indices into the engine's active members, in the order `run_loop` keeps them."""

    def begin(self) -> None:
        """Called once after every member's `on_fit_start` (which may have restored a checkpoint)."""

    def set_learning_rates(self, epoch: int) -> list[float]:
        """Set and return each active member's learning rate for `epoch` (0-based)."""

    def train_epoch(self, epoch: int, states: Sequence[TrainState], callbacks: Sequence[Sequence[Any]]) -> EpochStats:
        """One epoch of steps for every active member (the engine calls `on_step_end` where it can)."""

    def evaluate(self, which: str) -> list[tuple[float | None, float | None]] | None:
        """(loss, error %) of each active member on split `which` ("val" or "test"), or None without it."""

    def gate_values(self) -> list[list[float]]:
        """Each active member's scalar-gate k values in block order ([] for a member without gates)."""

    def end_epoch(self) -> None:
        """The epoch is finished: remember the weights a diverged member goes back to."""

    def roll_back(self, position: int, state: TrainState) -> None:
        """Put member `position`'s weights back to the end of its last finished epoch, into `state.model`."""

    def sync(self, position: int, state: TrainState) -> None:
        """Make `state.model` hold member `position`'s current weights (a no-op when it trains them)."""

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only the members at `positions`, in that order (members that ended leave the engine)."""


@dataclass
class Member:
    """One model of the loop: its state, its callbacks, and whether it has ended."""

    state: TrainState
    callbacks: list[Any]
    ended: bool = False


def epoch_record(epoch: int, lr: float, loss_sum: float, wrong: int | None, seen: int,
                 val: tuple[float | None, float | None] | None, test: tuple[float | None, float | None] | None,
                 ks: list[float], epoch_time: float, elapsed: float) -> dict[str, Any]:
    """One `History` record (its keys are documented there), written the same for every path."""
    record: dict[str, Any] = {"epoch": epoch + 1, "lr": lr, "train_loss": loss_sum / seen,
                              "train_error_pct": None if wrong is None else 100.0 * wrong / seen}
    # Evaluation: recorded, never used to choose anything.
    record["val_loss"], record["val_error_pct"] = val if val is not None else (None, None)
    record["test_loss"], record["test_error_pct"] = test if test is not None else (None, None)
    if ks:
        record["k"] = ks
        record["k_mean"] = sum(ks) / len(ks)
    record["epoch_time_s"] = epoch_time
    record["elapsed_s"] = elapsed
    return record


def count_step(stats: EpochStats, state: TrainState, callbacks: Sequence[Any], loss: float, seen: int) -> bool:
    """The bookkeeping of a finished step of a one-member engine (`fit`'s, train.lm's): the step's mean loss
    `loss` over `seen` samples (or targets) into the epoch's totals, the step counted in the epoch and in
    `state.step`, then `on_step_end`; returns whether a callback set `state.stop`."""
    stats.loss_sum[0] += loss * seen
    stats.seen += seen
    stats.steps += 1
    state.step += 1
    call(callbacks, "on_step_end", state, state.step, loss)
    return state.stop


def _end(member: Member) -> None:
    member.ended = True
    call(member.callbacks, "on_fit_end", member.state)


def run_loop(engine: Engine, members: Sequence[Member], epochs: int, *,
             after_epoch: Callable[[Sequence[Member]], None] | None = None) -> None:
    """Train `members` with `engine` until each has `epochs` finished epochs, diverged or stopped.

    Every member's `on_fit_start` runs first (it may restore its state, e.g. a checkpoint); members
    already ended (`Member.ended`) are skipped throughout. Per epoch, in order: the learning rates,
    `on_epoch_start`, the engine's epoch of steps, divergence (per member: history marked, weights
    rolled back, `on_fit_end`, out of the loop), evaluation on val and test, the record appended to
    each member's history, `after_epoch(active members)` (e.g. a stack's checkpoint), `on_epoch_end`;
    then members whose callbacks set `state.stop` end. `on_fit_end` runs once per member.

    The divergence rule, the same for every engine: a member whose training loss in a step is not
    finite (full-batch descent: or at least its bound, `StackedGD.divergence_loss`) is reported by
    the engine in `EpochStats.diverged`; here its history is marked (`diverged_at`: the 1-based epoch,
    the step within it, the loss), its weights go back to the end of its last finished epoch, its
    `on_fit_end` runs and it leaves the loop, the others going on undisturbed. Deep plain nets are
    expected to fail; a study must go on.
    """
    for m in members:
        if not m.ended:
            call(m.callbacks, "on_fit_start", m.state)
    active = [m for m in members if not m.ended]
    if len({m.state.epoch for m in active}) > 1:
        raise ValueError(f"members resume from different epochs {sorted({m.state.epoch for m in active})}; "
                         f"a loop's members are always at one epoch")
    engine.begin()
    while active and active[0].state.epoch < epochs:
        epoch = active[0].state.epoch
        lrs = engine.set_learning_rates(epoch)
        for m in active:
            call(m.callbacks, "on_epoch_start", m.state)
        started = time.perf_counter()
        stats = engine.train_epoch(epoch, [m.state for m in active], [m.callbacks for m in active])
        epoch_time = time.perf_counter() - started
        for pos, where in sorted(stats.diverged.items()):
            m = active[pos]
            m.state.history.diverged = True
            m.state.history.diverged_at = {"epoch": epoch + 1, **where}
            engine.roll_back(pos, m.state)
            _end(m)
        if stats.diverged:
            keep = [p for p in range(len(active)) if p not in stats.diverged]
            engine.keep(keep)
            active, lrs = [active[p] for p in keep], [lrs[p] for p in keep]
            stats.loss_sum = [stats.loss_sum[p] for p in keep]
            stats.wrong = [stats.wrong[p] for p in keep]
            if stats.extra is not None:
                stats.extra = [stats.extra[p] for p in keep]
        if not active:
            break
        if stats.seen == 0:
            raise ValueError("data: the DataLoader yielded no batches in an epoch")
        val, test, ks = engine.evaluate("val"), engine.evaluate("test"), engine.gate_values()
        for pos, m in enumerate(active):
            m.state.elapsed_s += epoch_time
            record = epoch_record(epoch, lrs[pos], stats.loss_sum[pos], stats.wrong[pos], stats.seen,
                                  val[pos] if val else None, test[pos] if test else None, ks[pos],
                                  epoch_time, m.state.elapsed_s)
            if stats.extra is not None:
                record.update(stats.extra[pos])
            steps_per_epoch = m.state.steps_per_epoch
            if m.state.stop and steps_per_epoch is not None and stats.steps < steps_per_epoch:
                record["stopped_at_step"] = stats.steps
            m.state.history.epochs.append(record)
            m.state.epoch = epoch + 1
        engine.end_epoch()
        if after_epoch is not None:
            after_epoch(active)
        for pos, m in enumerate(active):
            engine.sync(pos, m.state)
            call(m.callbacks, "on_epoch_end", m.state, m.state.history.epochs[-1])
        stopped = [p for p, m in enumerate(active) if m.state.stop]
        for p in stopped:
            _end(active[p])
        if stopped:
            keep = [p for p in range(len(active)) if p not in stopped]
            engine.keep(keep)
            active = [active[p] for p in keep]
    for m in active:
        _end(m)


# ----------------------------------------------------------------------------------------------
# fit: one nn.Module on the user's data
# ----------------------------------------------------------------------------------------------
DEFAULT_EVAL_BATCH = 10_000

# What `fit` trains on (see `fit`): in-memory splits, (x, y) tensors, a Dataset, or a DataLoader.
TrainData = Union[DataSplits, tuple[torch.Tensor, torch.Tensor], Sequence[torch.Tensor], Dataset, DataLoader]
# loss_fn(outputs, targets) -> the batch's mean loss, a scalar tensor (as F.cross_entropy returns it).
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _soft(outputs: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether `y` are class probabilities ("soft labels") for (N, classes) `outputs`: floating, of their shape."""
    return outputs.dim() == 2 and y.is_floating_point() and y.shape == outputs.shape


def _classifies(outputs: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether `outputs` are (N, classes) scores for N integer labels `y`, or for N rows of class
    probabilities (`_soft`), so that an error rate means something."""
    return _soft(outputs, y) or (outputs.dim() == 2 and y.dim() == 1 and not y.is_floating_point()
                                 and len(outputs) == len(y))


def _classes(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The class each row of `y` names: the label itself, or a soft label's most probable class (its argmax)."""
    return y.argmax(dim=1) if _soft(outputs, y) else y


def _wrong(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """Misclassified rows of a batch (the output's argmax is not the label, or not a soft label's argmax),
    or None when the outputs are not class scores for such labels."""
    return (outputs.argmax(dim=1) != _classes(outputs, y)).sum() if _classifies(outputs, y) else None


def evaluate(model: nn.Module, split: Split | DataLoader | TrainData, batch_size: int = DEFAULT_EVAL_BATCH,
             loss_fn: LossFn | None = None) -> tuple[float, float]:
    """Mean loss and error (%) of `model` on `split`, in eval mode; the model's mode is restored.

    `split` is an in-memory Split or a pair of tensors (x, y) or a Dataset of (x, y) items (moved to
    the model's device and evaluated in chunks of `batch_size`), or a DataLoader (its batches, moved
    to the model's device), as `fit` takes its data. The loss is cross-entropy unless `loss_fn` (a batch-mean loss) is
    given. A non-finite output row counts as an error and makes the loss NaN; the error is NaN when
    the outputs are not (N, classes) scores for integer or soft labels (class probabilities: the target's
    argmax is the class; the training records hold None then).
    """
    if not isinstance(split, (Split, DataLoader)):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: got {type(model).__name__}; accepted: a torch.nn.Module")
        split = user_split(split, "split", model_device(model))
    loss, error = _evaluate(model, split, batch_size, loss_fn)
    return loss, math.nan if error is None else error


def _evaluate(model: nn.Module, split: Split | DataLoader, batch_size: int,
              loss_fn: LossFn | None) -> tuple[float, float | None]:
    was_training = model.training
    model.eval()
    try:
        batches = _eval_batches(model, split, batch_size, labels=loss_fn is None)
        return evaluate_outputs((([check_outputs(model(x))], y) for x, y in batches), 1, loss_fn)[0]
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate_members(forward: Callable[[torch.Tensor], Sequence[torch.Tensor]],
                     batches: Iterable[tuple[torch.Tensor, torch.Tensor]], members: int,
                     loss_fn: LossFn | None = None) -> list[tuple[float, float | None]]:
    """`evaluate_outputs` of `forward(x)` for each of `batches` of (x, y): `forward(x)` returns one output
    per member (the caller puts the models in evaluation mode)."""
    return evaluate_outputs(((forward(x), y) for x, y in batches), members, loss_fn)


@torch.no_grad()
def evaluate_outputs(batches: Iterable[tuple[Sequence[torch.Tensor], torch.Tensor]], members: int,
                     loss_fn: LossFn | None = None) -> list[tuple[float, float | None]]:
    """The one evaluation of every path (`evaluate`, `fit`'s records, a stack's members): each member's
    mean loss and error (%) over `batches` of (outputs, y), `outputs` holding one output per member.

    The caller computes the outputs (in evaluation mode) and hands them over batch by batch, so the
    evaluation never calls back into it. The loss is cross-entropy unless `loss_fn` (a batch-mean loss)
    is given; each batch's loss sum is accumulated in float64. A non-finite output row counts as an
    error; a soft label (a row of class probabilities) counts its argmax as the class; the error is
    None when a member's outputs are not (N, classes) scores for integer or soft labels. ValueError for
    empty data."""
    losses: list[torch.Tensor | float] = [0.0] * members
    wrong: list[torch.Tensor | int] = [0] * members
    classified = [True] * members
    n = 0
    for member_outputs, y in batches:
        for i, outputs in enumerate(member_outputs):
            if loss_fn is None:
                losses[i] = losses[i] + F.cross_entropy(outputs, y, reduction="sum").double()
            else:
                losses[i] = losses[i] + loss_fn(outputs, y).double() * len(y)
            if not _classifies(outputs, y):
                classified[i] = False
            else:
                finite = torch.isfinite(outputs).all(dim=1)
                wrong[i] = wrong[i] + ((outputs.argmax(dim=1) != _classes(outputs, y)) | ~finite).sum()
        n += len(y)
    if n == 0:
        raise ValueError("evaluate: the evaluation data is empty")
    return [(float(losses[i]) / n, 100.0 * int(wrong[i]) / n if classified[i] else None) for i in range(members)]


def _eval_batches(model: nn.Module, split: Split | DataLoader, batch_size: int,
                  labels: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(split, DataLoader):
        device, dtype = model_device(model), model_dtype(model)
        for batch in split:
            x, y = to_device(batch, device, "eval_data")
            yield cast_inputs(x, dtype), _integer_labels(y) if labels else y
        return
    for start in range(0, len(split), batch_size):
        y = split.y[start:start + batch_size]
        yield split.x[start:start + batch_size], _integer_labels(y) if labels else y


def _integer_labels(y: torch.Tensor) -> torch.Tensor:
    """Integer labels of any width as int64 for cross-entropy (an int32 or uint8 label of a user's dataset is valid input); other labels as they are."""
    return y if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool else y.long()


class _LossCopy:
    """A step's loss on its way to the host, for `loss_read="lagged"`. On CUDA it is copied without
    blocking into pinned host memory and an event is recorded after the copy, so that reading it waits
    for that copy only: `float()` of the device tensor would wait for everything queued on the stream
    before the read, the next step's forward pass included, which is the wait "lagged" removes. Elsewhere
    the detached tensor is kept and read with `float()` (on the CPU every operation has finished when it
    returns)."""

    def __init__(self, loss: torch.Tensor) -> None:
        self.loss = loss.detach()
        self.done: torch.cuda.Event | None = None
        if self.loss.device.type == "cuda":
            host = torch.empty(self.loss.shape, dtype=self.loss.dtype, pin_memory=True)
            host.copy_(self.loss, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record(torch.cuda.current_stream(self.loss.device))
            self.loss = host

    def value(self) -> float:
        """The loss as a Python float (waiting, on CUDA, for its copy only)."""
        if self.done is not None:
            self.done.synchronize()
        return float(self.loss)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate to `lr` times the group's "lr_mult" (1 when it has
    none; recipes.parameter_groups); the optimiser's state (momentum buffers, Adam moments) is left
    untouched, so a learning-rate step keeps the momentum."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)


def fit(model: nn.Module, data: TrainData, recipe: Recipe | str, callbacks: Sequence[Any] = (), *,
        val_data: TrainData | None = None, test_data: TrainData | None = None,
        eval_data: TrainData | None = None, loss_fn: LossFn | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None, seed: int = 0, progress: bool = True,
        label: str | None = None, eval_batch_size: int = DEFAULT_EVAL_BATCH,
        train_transform: Callable[[torch.Tensor], torch.Tensor] | None = None, amp: bool = False,
        channels_last: bool = False, compile_model: bool = False, loss_read: str = "step") -> History:
    """Train `model` on `data` for `recipe.epochs` epochs; return the History (see the module docstring).

    `model` is any `nn.Module` mapping a batch x to outputs that `loss_fn(outputs, y)` scores.
    `data` may be:

    * `DataSplits` (the toolkit's datasets): trained on `.train`, evaluated on `.val` and `.test`.
      The model must already be on the data's device.
    * a pair of tensors `(x, y)`: moved to the model's device and trained on as an in-memory split
      (the fast path: batches are index slices of a random permutation, no DataLoader).
    * a `Dataset`: a `TensorDataset` of (x, y) is used as that pair; any other map-style Dataset of
      (x, y) items is read item by item every epoch (`dataset[i]` per item of each batch, so per-item
      random augmentation differs between epochs), in the order and batches the pair would be.
      Loading in worker processes goes in a DataLoader instead.
    * a `DataLoader` yielding (x, y) batches: iterated as given each epoch, each batch moved to the
      model's device; its own sampler decides the order (`seed` does not), so a resumed run is
      exact only if the loader's order is. The recipe's batch size does not apply.

    `val_data` and `test_data` (any of the last three forms; not with DataSplits, which has its own) are
    evaluated after each epoch and recorded as `val_loss` / `val_error_pct` and `test_loss` /
    `test_error_pct` (a Dataset given here is read once). `eval_data` is the older name of
    `test_data`. `recipe` is a Recipe or a registered recipe's name
    (use `get_recipe(name, epochs=...)` or `Recipe.replace` for variants); it gives the epochs, the
    batch size, the optimiser and the learning-rate schedule (a per-step one, recipes.STEP_SCHEDULES, is
    set before every step from `learning_rate_at_step` over the run's epochs × steps per epoch, and a
    resumed run continues it from its step count; a DataLoader without a length is refused with it). `loss_fn(outputs, y)` returns the
    batch's mean loss (default: cross-entropy); the error percentages are recorded only when the
    outputs are (N, classes) scores for integer labels or for soft labels: floating (N, classes)
    class probabilities, which the default cross-entropy takes as torch's does, a row counted wrong
    when the output's argmax is not the target's argmax. `optimizer` (any torch.optim.Optimizer)
    replaces the recipe's; `scheduler(optimizer)` returns a torch LR scheduler (e.g.
    `lambda opt: StepLR(opt, 1, gamma=0.5)`) that `fit` steps at the start of every epoch after the
    first. A user's optimizer, a `scheduler`, or a torch LR scheduler that a callback attached to
    `state.optimizer` (any torch scheduler marks the groups with "initial_lr") each switch the
    recipe's schedule off: the loop then leaves the learning rates alone, and every epoch's record
    holds the lr the optimiser's first group used in it. A scheduler attached after training started
    (e.g. lazily in the first `on_step_end`) rules from the next epoch on: it is looked for at every
    epoch, never overridden by the recipe's schedule. (A resumed run restarts a
    `scheduler` from its first epoch: fit's checkpoints hold the recipe's schedule only.)

    `seed` seeds the data-order generator only (seed the model's initialisation before building
    it). Callbacks' `on_fit_start` may restore a checkpoint into the TrainState; `fit` then
    continues from `state.epoch`. `progress` prints one line per epoch on stderr (and a bar on a
    terminal) through `callbacks.ProgressPrinter`, each line starting with `[label]` when `label`
    is given (e.g. the run's name, so that parallel runs can be told apart).

    `train_transform` maps each training batch x to its augmented version on the device (evaluation
    never sees it). `amp` runs the training forward and loss under bf16 autocast on the data's
    device type; the parameters, gradients, optimiser and evaluation stay float32. `channels_last`
    converts the model and 4-d batches to NHWC. `compile_model` trains through torch.compile(model).

    `loss_read` says when each step's loss is read from the device (for the divergence check and the
    records): "step" (the default) reads it after the step's forward pass, before its backward pass.
    "lagged" reads step t's loss only once step t + 1's batch, forward pass and loss have been launched
    (then the divergence check, the totals and `on_step_end(state, t, loss)` of step t, then step t + 1's
    backward pass and optimiser step; the epoch's last step is read after the loop), so that an
    asynchronous device (CUDA) is not left idle while the host waits for the number. On CUDA the loss
    is copied to pinned host memory without blocking, right after it is computed, and the read waits for
    that copy alone (reading the device tensor itself would wait for step t + 1's forward pass too); on
    the CPU, where every operation has finished when it returns, "lagged" gains nothing. A fit's first step reads its
    loss at once (its checks need it), and under data parallelism (world > 1) every step does, as with
    "step" (the all-reduce of the loss needs its value anyway). The results are "step"'s, bit for bit:
    the same records (losses, errors, steps), the same `on_step_end` calls with the same losses, the
    same final weights and buffers, the same `History.diverged_at`. What differs: a step t whose loss
    is not finite is found after its backward pass and optimiser step were applied; it is reported at
    step t all the same and the model goes back to the last finished epoch's weights and buffers, but
    the optimiser's state (momentum, Adam's moments and step counts) and the parameters' `.grad` then
    hold step t's non-finite update where "step" leaves step t − 1's (nothing `fit` or `run_training`
    saves holds them: a run's checkpoint is written only at the end of a finished epoch and its model
    file after the rollback; a callback of your own that saves the optimiser in `on_fit_end` would save
    them). When step t ends training (`state.stop` in its `on_step_end`, or its divergence), step t + 1's
    forward pass has already run: its updates of the model's buffers (BatchNorm's running statistics
    and counters: every buffer, updated in place) are undone, but the random numbers it drew (dropout,
    and a `train_transform`'s augmentation of batch t + 1) are consumed, so the global random streams
    differ from "step"'s afterwards, and a DataLoader has yielded one batch more. `on_step_end(t)` runs
    after step t + 1's forward pass: the buffers it sees already include that pass, and a callback must
    not change the weights there (step t + 1's forward pass has used them). Any other value is a
    ValueError naming `loss_read`, before training.

    Before the first optimiser step `fit` checks what flows through it (train.checks; the list is in
    docs/reliability.md): a TypeError / ValueError names the argument (`data`, the model's output,
    `optimizer`, `scheduler`, `loss_fn`, `callbacks`, `eval_batch_size`, ...) and the accepted
    values. Integer labels of any width are cast to int64 for the default cross-entropy (soft labels
    are taken as they are), and
    floating inputs to the model's floating dtype (the first floating parameter's). `callbacks` may
    be a single callback. An optimizer holding only some of the model's parameters is a warning.

    The model leaves `fit` in the mode it came in: every module's training flag is given back (it
    trains in training mode and is evaluated in eval mode in between).
    """
    checked = check_fit(model, data, recipe, callbacks, val_data=val_data, test_data=test_data, eval_data=eval_data,
                        loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler, train_transform=train_transform,
                        eval_batch_size=eval_batch_size, channels_last=channels_last, loss_read=loss_read)
    recipe, callbacks, train = checked.recipe, checked.callbacks, checked.train
    schedule = optimizer is None and scheduler is None
    if optimizer is None:
        optimizer = build_optimizer(model, recipe)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    rank, world = distributed.rank_and_world()
    n = 0 if isinstance(train, DataLoader) else len(train)
    starts = epoch_starts(n, recipe.batch_size, world)
    steps_per_epoch = loader_length(train) if isinstance(train, DataLoader) else len(starts)
    state = TrainState(model, optimizer, recipe, checked.splits, generator, History(), steps_per_epoch=steps_per_epoch)
    if progress and rank == 0:
        callbacks = [*callbacks, ProgressPrinter(label=label)]
    engine = _ModuleEngine(state, optimizer, train, {"val": checked.val, "test": checked.test}, starts,
                           schedule=schedule, scheduler=scheduler, device=checked.device,
                           loss_fn=loss_fn, eval_batch_size=eval_batch_size, train_transform=train_transform,
                           amp=amp, channels_last=channels_last, compile_model=compile_model, checked=checked.checked,
                           dtype=checked.dtype, loss_read=loss_read)
    with modes_kept(model):  # the caller's training flags come back, module by module (a frozen submodule stays in eval)
        run_loop(engine, [Member(state, callbacks)], recipe.epochs)
    return state.history


class _ModuleEngine:
    """`fit`'s engine (train.loop.Engine) for one `nn.Module`: the member at position 0 of the loop."""

    def __init__(self, state: TrainState, optimizer: torch.optim.Optimizer, train: Split | ItemSplit | DataLoader,
                 evals: dict[str, Split | DataLoader | None],
                 starts: list[int], *, schedule: bool, scheduler: Callable[[torch.optim.Optimizer], Any] | None,
                 device: torch.device, loss_fn: LossFn | None,
                 eval_batch_size: int, train_transform: Callable[[torch.Tensor], torch.Tensor] | None, amp: bool,
                 channels_last: bool, compile_model: bool, checked: bool = True,
                 dtype: torch.dtype | None = None, loss_read: str = "step") -> None:
        self.state, self.optimizer, self.train, self.evals, self.starts = state, optimizer, train, evals, starts
        self.schedule, self.device, self.loss_fn, self.eval_batch_size = schedule, device, loss_fn, eval_batch_size
        self.make_scheduler, self.scheduler, self.first_epoch = scheduler, None, 0
        self.train_transform, self.amp, self.channels_last = train_transform, amp, channels_last
        self.compile_model, self.loss_read = compile_model, loss_read
        self.compute_loss: LossFn = F.cross_entropy if loss_fn is None else loss_fn
        self.train_model: Callable[..., Any] = state.model
        self.snapshot: dict[str, torch.Tensor] = {}
        # Whether the first batch was checked up front (else at the first step: a DataLoader), and the
        # model's floating dtype (the inputs' of every batch; None: left as they come).
        self.checked, self.dtype, self.first_step, self.check_gradients = checked, dtype, True, True
        self.labels = loss_fn is None  # integer labels of any width are cast to int64 for cross-entropy

    def begin(self) -> None:
        """After on_fit_start (a restored checkpoint included): step count, memory format, wrappers, snapshot."""
        state = self.state
        if state.step == 0 and state.epoch > 0 and state.steps_per_epoch is not None:
            state.step = state.epoch * state.steps_per_epoch  # a restored run continues its step count
        if self.channels_last:
            state.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit memory_format
        self.train_model = distributed.wrap_model(state.model)
        if self.compile_model:
            self.train_model = torch.compile(self.train_model)
        if self.make_scheduler is not None:
            self.scheduler = self.make_scheduler(self.optimizer)
            if not callable(getattr(self.scheduler, "step", None)):
                raise TypeError(f"scheduler: scheduler(optimizer) returned {type(self.scheduler).__name__} "
                                f"{str(self.scheduler)[:40]}; accepted: a torch LR scheduler (an object with .step()), "
                                f"e.g. lambda opt: StepLR(opt, 1, gamma=0.5); nothing was trained")
        if any("initial_lr" in group for group in self.optimizer.param_groups):
            self.schedule = False  # a torch LR scheduler is attached (ours or a callback's): it sets the lr
        self.first_epoch = state.epoch
        self.end_epoch()

    def _per_step(self) -> bool:
        """Whether the recipe's schedule is set at every step: a STEP_SCHEDULES schedule that no torch LR
        scheduler has replaced (one attached since fit started, even within an epoch, rules from then on)."""
        if self.schedule and any("initial_lr" in group for group in self.optimizer.param_groups):
            self.schedule = False  # a torch LR scheduler attached since fit started (a callback may add one): it rules
        return self.schedule and self.state.recipe.schedule in STEP_SCHEDULES

    def _step_rate(self, step: int) -> float:
        """The per-step schedule's rate of 0-based step `step` of the run's recipe.epochs × steps_per_epoch."""
        recipe = self.state.recipe
        return learning_rate_at_step(recipe, step, recipe.epochs * (self.state.steps_per_epoch or 0))

    def set_learning_rates(self, epoch: int) -> list[float]:
        """The recipe's schedule, unless the caller's optimizer or scheduler sets the lr (it is then recorded);
        a per-step schedule records the rate of the epoch's first step and moves it at every step."""
        if self.scheduler is not None and epoch > self.first_epoch:
            self.scheduler.step()
        if self._per_step():
            lr = self._step_rate(self.state.step)
            set_learning_rate(self.optimizer, lr)
            return [lr]
        if self.schedule:
            lr = learning_rate_at(self.state.recipe, epoch)
            set_learning_rate(self.optimizer, lr)
            return [lr]
        return [float(self.optimizer.param_groups[0]["lr"])]

    def _typed(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch read now (a Dataset's, a DataLoader's) with its inputs in the model's dtype and, for
        cross-entropy, integer labels as int64 (in-memory splits were cast once, in fit)."""
        return cast_inputs(x, self.dtype), _integer_labels(y) if self.labels else y

    def _first_batch(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """fit's up-front checks on a DataLoader's first batch, before the first step (train.checks); the
        in-memory evaluation splits' labels are checked and cast once, here."""
        outputs = probe(self.state.model, x, "data")
        if self.loss_fn is None:  # else checked at its first use, in the step, before the backward pass
            checked = check_first_batch(outputs, len(x), {"data": y, **{f"{k}_data": v for k, v in self.evals.items()}})
            self.evals = {key: checked[f"{key}_data"] for key in self.evals}
        self.checked = True

    def _step_labels(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """A batch's labels, checked against its outputs when they were read now (a Dataset's items, a
        DataLoader's batches: in-memory labels were checked whole, before training)."""
        if self.labels and not isinstance(self.train, Split):
            return check_labels(y, "data", int(logits.shape[1]) if logits.dim() > 1 else None, tuple(logits.shape))
        return y

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        train, rank, world = self.train, *distributed.rank_and_world()
        if isinstance(train, DataLoader):
            for batch in train:
                x, y = self._typed(*to_device(batch, self.device, "data"))
                yield (x if self.train_transform is None else self.train_transform(x)), y
            return
        order = torch.randperm(len(train), generator=self.state.generator).to(self.device)
        batch_size = self.state.recipe.batch_size
        for start in self.starts:
            batch = order[start:start + batch_size]
            index = distributed.shard(batch, rank, world)
            if isinstance(train, ItemSplit):  # a Dataset: its items are read now, every epoch
                x, y = self._typed(*train.take(index.cpu() if self.train_transform is None else batch.cpu()))
                if self.train_transform is not None:
                    x, y = distributed.shard(self.train_transform(x), rank, world), distributed.shard(y, rank, world)
                yield x, y
            elif self.train_transform is None:
                yield train.x[index], train.y[index]
            else:
                # Augment the whole global batch, then keep this rank's share: every rank draws the
                # same random numbers, so a data-parallel step sees the images one process would.
                yield distributed.shard(self.train_transform(train.x[batch]), rank, world), train.y[index]

    def _forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One batch's forward pass and loss: (outputs, labels, loss); the first step's loss is checked here,
        before any backward pass (and a DataLoader's first batch before its forward)."""
        if not self.checked:
            self._first_batch(x, y)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.amp:
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                logits = check_outputs(self.train_model(x))
                y = self._step_labels(logits, y)
                loss = self.compute_loss(logits.float(), y)
        else:
            logits = check_outputs(self.train_model(x))
            y = self._step_labels(logits, y)
            loss = self.compute_loss(logits, y)
        if self.first_step:  # the loss a step follows, checked before the first backward pass
            check_loss(loss, training=True)
            self.first_step = False
        return logits, y, loss

    def _update(self, loss: torch.Tensor) -> None:
        """A step's update from its loss: the per-step rate, backward (the first one's gradients checked), step."""
        state, optimizer = self.state, self.optimizer
        if self._per_step():  # the rate of this step (state.step steps done before it, across resumes)
            set_learning_rate(optimizer, self._step_rate(state.step))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.check_gradients:  # before the first step: a loss that reaches no parameter trains nothing
            check_gradients(state.model, self.loss_fn is not None)
            self.check_gradients = False
        optimizer.step()

    def train_epoch(self, epoch: int, states: Sequence[TrainState], callbacks: Sequence[Sequence[Any]]) -> EpochStats:
        """fit's steps: forward, loss, the divergence check before backward, step, on_step_end (with
        `loss_read="lagged"` on one process: `_train_epoch_lagged`)."""
        state, world = self.state, distributed.rank_and_world()[1]
        state.model.train()
        stats = EpochStats([0.0], [0], 0, 0)
        if self.loss_read == "lagged" and world == 1:
            return self._train_epoch_lagged(stats, callbacks[0])
        # The epoch's errors are summed on the device and read once, at its end: the step's one read of the
        # device is the loss, which the divergence check needs before the backward pass.
        wrong: int | torch.Tensor = 0
        classified = True
        for step, (x, y) in enumerate(self._batches()):
            logits, y, loss = self._forward(x, y)
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
                stats.diverged[0] = {"step": step, "loss": str(loss_value)}
                break
            self._update(loss)
            wrong = wrong + wrong_count
            if count_step(stats, state, callbacks[0], loss_value, batch_seen):
                break
        stats.wrong = [int(wrong) if classified else None]
        return stats

    def _train_epoch_lagged(self, stats: EpochStats, callbacks: Sequence[Any]) -> EpochStats:
        """fit's steps with `loss_read="lagged"`: step t's loss is read (checked, counted, `on_step_end`) only
        once step t + 1's forward pass and loss are launched, so that the device is not left idle while the host
        waits for it (on CUDA the loss comes through a non-blocking copy, `_LossCopy`); the totals, the
        divergence step and the weights are eager mode's (see `fit`).

        Step t + 1's forward pass has already updated the model's buffers (BatchNorm's running statistics and
        counters) when step t's loss is read: they are copied on the device before each such forward pass and
        copied back when step t ends the epoch (divergence, or a callback's `state.stop`), so that the
        discarded forward pass leaves no trace in them."""
        state = self.state
        # Every buffer, updated in place by the forward pass as BatchNorm does; kept on its own device.
        buffers = list(state.model.buffers())
        kept = [torch.empty_like(b) for b in buffers]
        wrong: int | torch.Tensor = 0
        classified = True
        # Step t's index in the epoch, its loss on its way to the host, its errors (None: not class scores)
        # and its samples.
        pending: tuple[int, _LossCopy, torch.Tensor | None, int] | None = None

        def settle(step: int, loss: _LossCopy, batch_wrong: torch.Tensor | None, seen: int) -> bool:
            """Read step `step`'s loss: divergence, or the step counted (totals, `on_step_end`); whether the epoch ends."""
            nonlocal wrong, classified
            loss_value = loss.value()
            if not math.isfinite(loss_value):
                stats.diverged[0] = {"step": step, "loss": str(loss_value)}
                return True
            if batch_wrong is None:
                classified = False  # the epoch's errors are not recorded then
            else:
                wrong = wrong + batch_wrong
            return count_step(stats, state, callbacks, loss_value, seen)

        for step, (x, y) in enumerate(self._batches()):
            if pending is not None and buffers:
                torch._foreach_copy_(kept, buffers)
            eager = self.first_step  # a fit's first step reads its loss at once, as "step" does
            logits, y, loss = self._forward(x, y)
            batch_wrong = _wrong(logits.detach(), y)
            if pending is not None:
                ended, pending = settle(*pending), None
                if ended:  # this step is discarded: its forward pass's buffer updates are undone
                    if buffers:
                        torch._foreach_copy_(buffers, kept)
                    break
            if eager:
                loss_value = float(loss.detach())
                if not math.isfinite(loss_value):  # before the backward pass, as "step" checks every step
                    stats.diverged[0] = {"step": step, "loss": str(loss_value)}
                    break
            copy = _LossCopy(loss)  # queued before the backward pass: ready as soon as the loss is
            self._update(loss)
            if eager:
                if settle(step, copy, batch_wrong, len(y)):
                    break
            else:
                pending = (step, copy, batch_wrong, len(y))
        if pending is not None:  # the epoch's last step (a break leaves nothing pending)
            settle(*pending)
        stats.wrong = [int(wrong) if classified else None]
        return stats

    def evaluate(self, which: str) -> list[tuple[float | None, float | None]] | None:
        """Loss and error of the model on the val or test data (None without it)."""
        split = self.evals[which]
        return None if split is None else [_evaluate(self.state.model, split, self.eval_batch_size, self.loss_fn)]

    def gate_values(self) -> list[list[float]]:
        """The model's gates, one number per gated branch (layers.branch_gate_values: k, or a vector gate's
        mean λ)."""
        return [branch_gate_values(self.state.model)]

    def end_epoch(self) -> None:
        """Copy the weights a divergence in the next epoch goes back to."""
        self.snapshot = _snapshot(self.state.model)

    def roll_back(self, position: int, state: TrainState) -> None:
        """Back to the last finished epoch's weights."""
        self.state.model.load_state_dict(self.snapshot)

    def sync(self, position: int, state: TrainState) -> None:
        """Nothing to do: the state's model is the one trained."""

    def keep(self, positions: Sequence[int]) -> None:
        """Nothing to do: the one member has ended when it is dropped."""
