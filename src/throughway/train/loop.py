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

The epoch loop itself is `engine.run_loop`, shared with `batched.train_batched` (one loop for one
model and for many stacked models); `fit` supplies the engine of one module (`_ModuleEngine`: the
batches, the forward, the divergence check, the step and `on_step_end`). The hooks' contract does
not depend on how many models the loop trains: `state.model` is whatever module is
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
from typing import Any, Callable, Iterator, Sequence, Union

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from ..data import DataSplits, Split
from ..layers import scalar_gate_values
from . import distributed
from .callbacks import ProgressPrinter
from .engine import EpochStats, Member, run_loop
from .flat import FlatOptimizer
from .inputs import model_device, resolve_data, to_device
from .loop_state import Callback, History, TrainState
from .loop_state import call as call_hook
from .recipes import Recipe, build_optimizer, get_recipe, learning_rate_at

__all__ = ["History", "TrainState", "Callback", "fit", "evaluate", "DEFAULT_EVAL_BATCH", "TrainData", "LossFn"]

DEFAULT_EVAL_BATCH = 10_000

# What `fit` trains on (see `fit`): in-memory splits, (x, y) tensors, a Dataset, or a DataLoader.
TrainData = Union[DataSplits, tuple[torch.Tensor, torch.Tensor], Sequence[torch.Tensor], Dataset, DataLoader]
# loss_fn(outputs, targets) -> the batch's mean loss, a scalar tensor (as F.cross_entropy returns it).
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
        device = model_device(model)
        for batch in split:
            yield to_device(batch, device, "eval_data")
        return
    for start in range(0, len(split), batch_size):
        yield split.x[start:start + batch_size], split.y[start:start + batch_size]


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def set_learning_rate(optimizer: torch.optim.Optimizer | FlatOptimizer, lr: float) -> None:
    """Set every parameter group's learning rate to `lr` times the group's "lr_mult" (1 when it has
    none; recipes.parameter_groups); the optimiser's state (momentum buffers, Adam moments) is left
    untouched, so a learning-rate step keeps the momentum."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)


def _check_finite_inputs(splits: dict[str, Any]) -> None:
    """ValueError naming the split when the inputs of a tensor split hold NaN or infinite values: the
    data's fault, said before training, not a divergence found after the first step (issue 25,
    finding 11). A DataLoader is not scanned (it would be read an extra time)."""
    for name, split in splits.items():
        if isinstance(split, Split) and split.x.is_floating_point():
            bad = ~torch.isfinite(split.x).flatten(1).all(dim=1) if split.x.dim() > 1 else ~torch.isfinite(split.x)
            if bool(bad.any()):
                first = int(bad.nonzero()[0, 0])
                raise ValueError(f"{name}: the inputs hold NaN or infinite values in {int(bad.sum())} sample(s) "
                                 f"(the first: index {first}); accepted: finite numbers (check how the data was "
                                 f"loaded or normalised); nothing was trained")


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
    device, train, val, test, splits = resolve_data(model, data, eval_data)
    if isinstance(train, Split) and len(train) < 2:
        raise ValueError("the training split needs at least 2 samples")
    _check_finite_inputs({"data": train, "eval_data": test} if splits is None else
                         {"data (training split)": train, "data (validation split)": val, "data (test split)": test})
    schedule = optimizer is None
    if optimizer is None:
        optimizer = build_optimizer(model, recipe)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    rank, world = distributed.rank_and_world()
    n = len(train) if isinstance(train, Split) else 0
    # A last batch of one sample (per rank) would break BatchNorm's training statistics: fold it away.
    starts = [s for s in range(0, n, recipe.batch_size) if n - s > 2 * world - 1 or s == 0]
    steps_per_epoch = len(starts) if isinstance(train, Split) else _loader_length(train)
    state = TrainState(model, optimizer, recipe, splits, generator, History(), steps_per_epoch=steps_per_epoch)
    if progress and rank == 0:
        callbacks = [*callbacks, ProgressPrinter(label=label)]
    engine = _ModuleEngine(state, optimizer, train, {"val": val, "test": test}, starts, schedule=schedule, device=device,
                           loss_fn=loss_fn, eval_batch_size=eval_batch_size, train_transform=train_transform,
                           amp=amp, channels_last=channels_last, compile_model=compile_model)
    run_loop(engine, [Member(state, list(callbacks))], recipe.epochs)
    return state.history


class _ModuleEngine:
    """`fit`'s engine (train.engine.Engine) for one `nn.Module`: the member at position 0 of the loop."""

    def __init__(self, state: TrainState, optimizer: torch.optim.Optimizer | FlatOptimizer, train: Split | DataLoader,
                 evals: dict[str, Split | DataLoader | None],
                 starts: list[int], *, schedule: bool, device: torch.device, loss_fn: LossFn | None,
                 eval_batch_size: int, train_transform: Callable[[torch.Tensor], torch.Tensor] | None, amp: bool,
                 channels_last: bool, compile_model: bool) -> None:
        self.state, self.optimizer, self.train, self.evals, self.starts = state, optimizer, train, evals, starts
        self.schedule, self.device, self.loss_fn, self.eval_batch_size = schedule, device, loss_fn, eval_batch_size
        self.train_transform, self.amp, self.channels_last = train_transform, amp, channels_last
        self.compile_model = compile_model
        self.compute_loss: LossFn = F.cross_entropy if loss_fn is None else loss_fn
        self.train_model: Callable[..., Any] = state.model
        self.snapshot: dict[str, torch.Tensor] = {}

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
        self.end_epoch()

    def set_learning_rates(self, epoch: int) -> list[float]:
        """The recipe's schedule, unless the caller gave its own optimizer (its lr is then recorded)."""
        if self.schedule:
            lr = learning_rate_at(self.state.recipe, epoch)
            set_learning_rate(self.optimizer, lr)
            return [lr]
        return [float(self.optimizer.param_groups[0]["lr"])]

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        train, rank, world = self.train, *distributed.rank_and_world()
        if not isinstance(train, Split):
            for batch in train:
                x, y = to_device(batch, self.device, "data")
                yield (x if self.train_transform is None else self.train_transform(x)), y
            return
        order = torch.randperm(len(train), generator=self.state.generator).to(self.device)
        batch_size = self.state.recipe.batch_size
        for start in self.starts:
            batch = order[start:start + batch_size]
            index = distributed.shard(batch, rank, world)
            if self.train_transform is None:
                x = train.x[index]
            else:
                # Augment the whole global batch, then keep this rank's share: every rank draws the
                # same random numbers, so a data-parallel step sees the images one process would.
                x = distributed.shard(self.train_transform(train.x[batch]), rank, world)
            yield x, train.y[index]

    def train_epoch(self, epoch: int, states: Sequence[TrainState], callbacks: Sequence[Sequence[Any]]) -> EpochStats:
        """fit's steps: forward, loss, the divergence check before backward, step, on_step_end."""
        state, optimizer, world = self.state, self.optimizer, distributed.rank_and_world()[1]
        state.model.train()
        stats = EpochStats([0.0], [0], 0, 0)
        wrong, classified = 0, True
        for step, (x, y) in enumerate(self._batches()):
            if self.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            if self.amp:
                with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                    logits = self.train_model(x)
                    loss = self.compute_loss(logits.float(), y)
            else:
                logits = self.train_model(x)
                loss = self.compute_loss(logits, y)
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
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            stats.loss_sum[0] += loss_value * batch_seen
            wrong += int(wrong_count)
            stats.seen += batch_seen
            stats.steps += 1
            state.step += 1
            call_hook(callbacks[0], "on_step_end", state, state.step, loss_value)
            if state.stop:
                break
        stats.wrong = [wrong if classified else None]
        return stats

    def evaluate(self, which: str) -> list[tuple[float | None, float | None]] | None:
        """Loss and error of the model on the val or test data (None without it)."""
        split = self.evals[which]
        return None if split is None else [_evaluate(self.state.model, split, self.eval_batch_size, self.loss_fn)]

    def gate_values(self) -> list[list[float]]:
        """The model's scalar gates' k (scalar_gate_values)."""
        return [scalar_gate_values(self.state.model)]

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


def _loader_length(loader: DataLoader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None
