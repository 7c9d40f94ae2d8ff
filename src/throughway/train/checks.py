"""What `fit` checks before its first optimiser step: what flows through the loop, and the
user's callables and callbacks.

`check_fit` is the one entry: `fit` calls it first, and it runs every check below in order, cheapest
first (nothing is read before the arguments are checked), and returns what `fit` trains with
(`FitInputs`). Each failure is a TypeError / ValueError that names the argument and the accepted
values (docs/reliability.md lists them):

* the arguments: `recipe` (a Recipe or a registered name), `optimizer` (a torch optimiser),
  `scheduler`, `loss_fn` and `train_transform` (callables), `eval_batch_size` (`check_eval_batch_size`),
  `loss_read` (`check_loss_read`: "step" or "lagged"),
  `callbacks` (`check_callbacks`: a single callback is wrapped in a list; a string, a class, or an
  object with none of the hooks is refused, a misspelt hook is named with the nearest hook),
  `eval_data` beside `test_data`;
* the data's containers (`inputs.resolve_data`), `channels_last` on the CPU (`check_channels_last`),
  at least two training samples, finite inputs in every tensor split, `optimizer`'s parameters
  (`check_optimizer_parameters`: none of the model's is refused, some of them is a warning);
* inputs: floating inputs are cast to the model's floating dtype (`model_dtype`; `cast_inputs`);
* a probe batch (`probe`): the model's output on the first training batch, computed in eval mode
  under no_grad with every module's mode restored afterwards (BatchNorm's running statistics are
  not updated), checked as a tensor (`check_outputs`); with the default cross-entropy, the labels
  of every tensor split are checked against its width (`check_first_batch`, `check_labels`: integers
  of any width, cast to int64, one per output row, in 0 … classes − 1, or floating class
  probabilities of the outputs' shape, as torch's cross-entropy takes them; a Dataset's or a
  DataLoader's labels as each batch is read). A DataLoader's first batch is probed at the first step
  instead (reading it up front would move its sampler's order);
* a per-step schedule needs the steps of an epoch: a DataLoader without a length is refused with it.

At first use, in the loop: the loss (`check_loss`: a 0-d floating tensor with a gradient, before the
first backward pass; a loss_fn is not called an extra time) and `scheduler(optimizer)` (an object with
`.step()`); after the first backward pass, before the first optimiser step, that some trainable
parameter received a gradient (`check_gradients`: a loss not computed from the outputs would train
nothing).
"""

from __future__ import annotations

import contextlib
import difflib
import random
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..data import DataSplits, Split
from .inputs import ItemSplit, loader_length, resolve_data
from .recipes import STEP_SCHEDULES, Recipe, get_recipe

__all__ = ["HOOKS", "LOSS_READS", "FitInputs", "check_fit", "check_eval_batch_size", "check_loss_read", "check_callbacks",
           "check_optimizer_parameters",
           "model_dtype", "cast_inputs", "check_labels", "check_outputs", "check_first_batch", "check_loss",
           "check_gradients", "probe", "modes_kept", "rng_kept", "OUTPUT_ACCEPTED"]

HOOKS = ("on_fit_start", "on_epoch_start", "on_step_end", "on_epoch_end", "on_fit_end")
# When fit reads a step's loss from the device for the divergence check (see fit's `loss_read`).
LOSS_READS = ("step", "lagged")
OUTPUT_ACCEPTED = ("a tensor of class scores (N, classes) for the default cross-entropy, or any tensor that "
                   "loss_fn(outputs, y) scores; return only that tensor from forward (wrap a model that "
                   "returns a tuple or dict)")


_CALLABLES = {"scheduler": "a function of the optimizer that returns a torch LR scheduler",
              "loss_fn": "a function loss_fn(outputs, y) returning the batch's mean loss as a 0-d tensor",
              "train_transform": "a function of a batch x returning its augmented version"}


@dataclass
class FitInputs:
    """What `fit` trains with, as `check_fit` checked it: the recipe, the callbacks as a list, the data's
    device, the training split (a Split, an ItemSplit or a DataLoader) and the evaluation splits with their
    floating inputs in the model's dtype and, under the default cross-entropy, their labels as int64; the
    DataSplits given (None for the other forms), the model's floating dtype, and whether the first batch
    was checked (False for a DataLoader: its first batch is checked at the first step)."""

    recipe: Recipe
    callbacks: list[Any]
    device: torch.device
    train: Split | ItemSplit | DataLoader
    val: Split | DataLoader | None
    test: Split | DataLoader | None
    splits: DataSplits | None
    dtype: torch.dtype | None
    checked: bool


def check_fit(model: nn.Module, data: Any, recipe: Recipe | str, callbacks: Any, *, val_data: Any, test_data: Any,
              eval_data: Any, loss_fn: Any, optimizer: Any, scheduler: Any, train_transform: Any,
              eval_batch_size: Any, channels_last: bool, loss_read: Any = "step") -> FitInputs:
    """Every check `fit` makes before its first step, in order (the module docstring lists them); the
    arguments are `fit`'s. Returns what `fit` trains with (`FitInputs`)."""
    if isinstance(recipe, str):
        recipe = get_recipe(recipe)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe: got {type(recipe).__name__}; accepted: a Recipe or a registered recipe's name")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer: got {type(optimizer).__name__}; accepted: a torch.optim.Optimizer (a "
                        f"FlatOptimizer is one), or None for the recipe's")
    for name, function in (("scheduler", scheduler), ("loss_fn", loss_fn), ("train_transform", train_transform)):
        if function is not None and not callable(function):
            raise TypeError(f"{name}: got {type(function).__name__}; accepted: {_CALLABLES[name]}, or None")
    check_eval_batch_size(eval_batch_size)
    check_loss_read(loss_read)
    callbacks = check_callbacks(callbacks, stacklevel=4)  # the warning points at the line that called fit
    if eval_data is not None:
        if test_data is not None:
            raise ValueError("eval_data and test_data: give one (eval_data is the older name of test_data)")
        test_data = eval_data
    device, train, val, test, splits = resolve_data(model, data, val_data, test_data)
    check_channels_last(model, device, channels_last)
    if not isinstance(train, DataLoader) and len(train) < 2:
        raise ValueError("the training split needs at least 2 samples")
    names = ({"data": "data", "val": "val_data", "test": "test_data"} if splits is None else
             {"data": "data (training split)", "val": "data (validation split)", "test": "data (test split)"})
    _check_finite_inputs({names["data"]: train, names["val"]: val, names["test"]: test})
    if optimizer is not None:
        check_optimizer_parameters(model, optimizer)
    dtype = model_dtype(model)
    train, val, test = (_cast_split(split, dtype) for split in (train, val, test))
    checked = not isinstance(train, DataLoader)
    if checked:  # a DataLoader's first batch is checked at the first step instead (reading it now would move its order)
        train, val, test = _probe_first_batch(model, train, {names["val"]: val, names["test"]: test},
                                              recipe.batch_size, loss_fn, device, names["data"])
    elif (optimizer is None and scheduler is None and recipe.schedule in STEP_SCHEDULES
          and loader_length(train) is None):
        raise ValueError(f"recipe {recipe.name!r}: schedule={recipe.schedule!r} sets the learning rate at every step "
                         f"of {recipe.epochs} epochs, but data is a DataLoader without a length, so the steps are not "
                         f"known; accepted: a DataLoader with a length (a map-style Dataset), in-memory data, or a "
                         f"per-epoch schedule")
    return FitInputs(recipe, callbacks, device, train, val, test, splits, dtype, checked)


def _check_finite_inputs(splits: dict[str, Any]) -> None:
    """ValueError naming the split when the inputs of a tensor split hold NaN or infinite values: the
    data's fault, said before training, not a divergence found after the first step. A DataLoader is
    not scanned (it would be read an extra time)."""
    for name, split in splits.items():
        if isinstance(split, Split) and split.x.is_floating_point():
            bad = ~torch.isfinite(split.x).flatten(1).all(dim=1) if split.x.dim() > 1 else ~torch.isfinite(split.x)
            if bool(bad.any()):
                first = int(bad.nonzero()[0, 0])
                raise ValueError(f"{name}: the inputs hold NaN or infinite values in {int(bad.sum())} sample(s) "
                                 f"(the first: index {first}); accepted: finite numbers (check how the data was "
                                 f"loaded or normalised); nothing was trained")


def _cast_split(split: Any, dtype: torch.dtype | None) -> Any:
    """An in-memory split with its floating inputs in the model's floating dtype (the split itself when they are)."""
    if not isinstance(split, Split):
        return split
    x = cast_inputs(split.x, dtype)
    return split if x is split.x else Split(x, split.y)


def _probe_first_batch(model: nn.Module, train: Split | ItemSplit, evals: dict[str, Any], batch_size: int,
                       loss_fn: Any, device: torch.device, argument: str) -> tuple[Any, Any, Any]:
    """Probe the model with the first training batch and check its output and the labels (`check_first_batch`);
    return (train, val, test) with their labels cast to int64 under the default cross-entropy."""
    if isinstance(train, ItemSplit):  # the item read when it was checked, as a batch of one: no extra read
        x, y = (t.unsqueeze(0).to(device) for t in train.first)
        x = cast_inputs(x, model_dtype(model))
    else:
        x, y = train.x[:batch_size], train.y[:batch_size]
    with rng_kept(device):  # a model may draw random numbers even in eval mode: training must draw the same ones
        outputs = probe(model, x, argument)
    if loss_fn is not None:  # checked at its first use, the first step, before the backward pass
        return (train, *evals.values())
    labelled = {argument: y if isinstance(train, ItemSplit) else train, **evals}
    checked = list(check_first_batch(outputs, len(x), labelled).values())
    return (train if isinstance(train, ItemSplit) else checked[0]), checked[1], checked[2]


def check_first_batch(outputs: torch.Tensor, batch: int, labelled: dict[str, Any]) -> dict[str, Any]:
    """Under the default cross-entropy: the model's `outputs` on a first training batch of `batch` samples
    must be class scores (N, classes, ...) (ValueError naming the model's output), and the labels of each
    entry of `labelled` (argument name → a Split, whose labels are checked whole, or a batch's label tensor;
    anything else is left alone) must fit them (`check_labels`). Returns `labelled` with each Split's labels
    cast to int64."""
    if outputs.dim() < 2 or outputs.shape[0] != batch:
        raise ValueError(f"model's output: shape {tuple(outputs.shape)} for a batch of {batch}; accepted: "
                         f"{OUTPUT_ACCEPTED}")
    classes = int(outputs.shape[1])
    checked = {}
    for name, split in labelled.items():
        if isinstance(split, Split):
            split = Split(split.x, check_labels(split.y, name, classes, (len(split), *outputs.shape[1:])))
        elif isinstance(split, torch.Tensor):
            check_labels(split, name, classes, (len(split), *outputs.shape[1:]))
        checked[name] = split
    return checked


def check_eval_batch_size(eval_batch_size: Any) -> None:
    """TypeError / ValueError naming `eval_batch_size` unless it is an integer ≥ 1."""
    if not isinstance(eval_batch_size, int) or isinstance(eval_batch_size, bool):
        raise TypeError(f"eval_batch_size: got {type(eval_batch_size).__name__} {eval_batch_size!r}; accepted: an "
                        f"integer ≥ 1 (samples per evaluation chunk)")
    if eval_batch_size < 1:
        raise ValueError(f"eval_batch_size={eval_batch_size}: accepted: an integer ≥ 1 (samples per evaluation chunk)")


def check_loss_read(loss_read: Any) -> None:
    """ValueError naming `loss_read` and the accepted values (`LOSS_READS`) unless it is one of them."""
    if not (isinstance(loss_read, str) and loss_read in LOSS_READS):
        raise ValueError(f"loss_read: got {type(loss_read).__name__} {loss_read!r}; accepted: 'step' (each step's "
                         f"loss read before its backward pass) or 'lagged' (read after the next step's forward pass "
                         f"is launched, so that an asynchronous device never waits); nothing was trained")


def check_channels_last(model: nn.Module, device: torch.device, channels_last: bool) -> None:
    """`channels_last` on the CPU with one intra-op thread, for a model with a strided 1×1 convolution (a
    ResNet's projection shortcut): refused with a ValueError naming the way out, before any step. torch 2.13's
    oneDNN corrupts the heap in that convolution's backward pass there ("corrupted double-linked list", an
    abort; 2 threads, stride 1, NCHW or oneDNN off all run). The five-line reproduction is in
    docs/reliability.md; a memory corruption may also pass silently, so it is refused, not tried."""
    if not channels_last or device.type != "cpu" or torch.get_num_threads() != 1:
        return
    for name, module in model.named_modules():
        if (isinstance(module, nn.Conv2d) and tuple(module.kernel_size) == (1, 1)
                and any(s > 1 for s in module.stride)):
            raise ValueError(f"channels_last=True on the CPU with 1 thread: the model's {name or 'root'} is a strided "
                             f"1x1 convolution, whose backward pass corrupts memory in torch's oneDNN there; "
                             f"use channels_last=False on the CPU (it is a GPU option), or more threads "
                             f"(torch.set_num_threads(2) / --threads 2)")


def _hook_names(callback: Any) -> tuple[list[str], list[str]]:
    """(the hooks `callback` has, the other callable `on_*` attributes it has)."""
    names = [name for name in dir(callback) if name.startswith("on_") and callable(getattr(callback, name, None))]
    return [n for n in names if n in HOOKS], [n for n in names if n not in HOOKS]


def check_callbacks(callbacks: Any, stacklevel: int = 3) -> list[Any]:
    """`callbacks` as a list: None or () is empty, a single callback object is wrapped in a list.

    TypeError naming `callbacks` for a string, a class instead of an instance, or an object with none
    of the hooks (`HOOKS`); ValueError for an object whose only `on_*` methods are near misses of a
    hook (e.g. `on_epoch_ends`, named with the hook it resembles), which the loop would never call,
    and a warning saying the same for a near miss beside real hooks (`stacklevel` as warnings.warn's,
    counted from this function: 3 is the line that called its caller)."""
    if callbacks is None:
        return []
    if isinstance(callbacks, (str, bytes)):
        raise TypeError(f"callbacks: got a string {callbacks!r}; accepted: a callback object or a list of them, "
                        f"each with any of the hooks {', '.join(HOOKS)}")
    if (isinstance(callbacks, type) or any(callable(getattr(callbacks, hook, None)) for hook in HOOKS)
            or not hasattr(callbacks, "__iter__")):
        callbacks = [callbacks]  # one callback given alone (or an object that is none: refused below)
    result = list(callbacks)
    for i, callback in enumerate(result):
        where = f"callbacks[{i}] ({type(callback).__name__})"
        if isinstance(callback, type):
            raise TypeError(f"{where}: is a class; accepted: an instance, e.g. {callback.__name__}(...)")
        if isinstance(callback, (str, bytes)):
            raise TypeError(f"{where}: got a string {callback!r}; accepted: an object with any of the hooks "
                            f"{', '.join(HOOKS)}")
        hooks, others = _hook_names(callback)
        near = {name: difflib.get_close_matches(name, HOOKS, n=1, cutoff=0.75) for name in others}
        misspelt = {name: match[0] for name, match in near.items() if match}
        if misspelt:
            name, hook = next(iter(misspelt.items()))
            message = (f"{where}: has a method {name!r} that fit never calls; did you mean {hook!r}? accepted "
                       f"hooks: {', '.join(HOOKS)}")
            if not hooks:
                raise ValueError(message)
            warnings.warn(message, UserWarning, stacklevel=stacklevel)  # it has hooks too: the near miss may be its own
        if not hooks:
            raise TypeError(f"{where}: has none of the hooks fit calls; accepted: an object with any of "
                            f"{', '.join(HOOKS)}")
    return result


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    # A FlatOptimizer's param_groups hold flat copies; the model's own tensors are its _group_params.
    groups = getattr(optimizer, "_group_params", None)
    if groups is not None:
        return [p for group in groups for p in group]
    return [p for group in optimizer.param_groups for p in group["params"]]


def check_optimizer_parameters(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """ValueError naming `optimizer` when it holds none of `model`'s trainable parameters (it would train
    nothing, silently); a warning naming how many it lacks when it holds only some of them (pointing at the
    line that called `fit`, which checks it through `check_fit`)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        return
    held = {id(p) for p in _optimizer_tensors(optimizer)}
    missing = sum(1 for p in trainable if id(p) not in held)
    if missing == len(trainable):
        raise ValueError(f"optimizer: holds none of the model's {len(trainable)} trainable parameters (built over "
                         f"another module's?); it would train nothing; accepted: an optimizer over "
                         f"model.parameters() (or a part of them), or None for the recipe's")
    if missing:
        warnings.warn(f"optimizer: holds {len(trainable) - missing} of the model's {len(trainable)} trainable "
                      f"parameters; the other {missing} are not trained", UserWarning, stacklevel=4)


def model_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of `model`'s first floating parameter or buffer (None when it has none)."""
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def cast_inputs(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Floating inputs `x` in the model's floating `dtype` (x itself when it already is, or is not floating)."""
    if dtype is None or not x.is_floating_point() or x.dtype == dtype:
        return x
    return x.to(dtype)


def check_labels(y: torch.Tensor, argument: str, classes: int | None = None,
                 outputs_shape: Sequence[int] | None = None) -> torch.Tensor:
    """Labels `y` for cross-entropy, as torch's `F.cross_entropy` takes them: class indices as int64
    (integer labels of any width are cast), or class probabilities ("soft labels": floating targets of
    the outputs' own shape, (N, classes, ...), returned as they are; fit's error % then counts a row
    wrong when the output's argmax differs from the target's).

    TypeError naming `argument` for bool or complex labels, and for floating labels that are not of the
    outputs' shape (or given without it); ValueError for index labels whose shape does not fit outputs
    of `outputs_shape` (one label per output row: (N,) for (N, classes) outputs) or outside
    0 … `classes` − 1, and for soft labels holding NaN or infinite values."""
    soft = y.is_floating_point() and outputs_shape is not None and tuple(y.shape) == tuple(outputs_shape)
    if y.is_complex() or y.dtype == torch.bool or (y.is_floating_point() and not soft):
        shape = "" if outputs_shape is None else f" {tuple(outputs_shape)}"
        raise TypeError(f"{argument}: the labels are {y.dtype} of shape {tuple(y.shape)}; accepted: integer class "
                        f"indices (any integer dtype, cast to int64), or floating class probabilities of the outputs' "
                        f"shape{shape}, for the default cross-entropy; for regression or other targets pass a loss_fn")
    if soft:
        if y.numel() and not bool(torch.isfinite(y).all()):
            raise ValueError(f"{argument}: the soft labels (class probabilities) hold NaN or infinite values; "
                             f"accepted: finite numbers")
        return y
    if outputs_shape is not None:
        wanted = (int(y.shape[0]), *outputs_shape[2:]) if y.dim() else ()
        if tuple(y.shape) != wanted:
            raise ValueError(f"{argument}: the labels have shape {tuple(y.shape)} for outputs of shape "
                             f"{tuple(outputs_shape)}; accepted: one class index per output row, shape {wanted}")
    elif y.dim() != 1:
        raise ValueError(f"{argument}: the labels have shape {tuple(y.shape)}; accepted: one class index per sample, "
                         f"shape (N,)")
    y = y.long()
    if classes is not None and y.numel():
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            raise ValueError(f"{argument}: label {bad} is out of range for a model with {classes} outputs; "
                             f"accepted: class indices 0 … {classes - 1}")
    return y


def check_outputs(outputs: Any, argument: str = "model") -> torch.Tensor:
    """`outputs` when they are a tensor; TypeError naming the model's output otherwise."""
    if not isinstance(outputs, torch.Tensor):
        kind = f"{type(outputs).__name__}" + (f" with keys {sorted(map(str, outputs))[:4]}"
                                             if isinstance(outputs, dict) else "")
        raise TypeError(f"{argument}'s output: forward returned {kind}; accepted: {OUTPUT_ACCEPTED}")
    return outputs


def check_loss(loss: Any, *, training: bool = False) -> torch.Tensor:
    """`loss` when it is what the loop minimises: a 0-d floating tensor (the batch's mean loss), with a
    gradient when `training` (the first step's loss); TypeError / ValueError naming `loss_fn` otherwise."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"loss_fn: returned {type(loss).__name__} {str(loss)[:40]}; accepted: a 0-d tensor, the "
                        f"batch's mean loss computed from the outputs (as F.cross_entropy returns it)")
    if loss.dim() != 0:
        raise ValueError(f"loss_fn: returned a tensor of shape {tuple(loss.shape)}; accepted: a 0-d tensor, the "
                         f"batch's mean loss (use reduction='mean', not 'none')")
    if not loss.is_floating_point():
        raise TypeError(f"loss_fn: returned a {loss.dtype} tensor; accepted: a floating 0-d tensor")
    if training and not loss.requires_grad:
        raise ValueError("loss_fn: returned a tensor without a gradient (computed with .item(), .detach() or "
                         "torch.tensor(...)?); accepted: a 0-d tensor computed from the outputs, so that the "
                         "optimiser has something to follow; nothing was trained")
    return loss


def check_gradients(model: nn.Module, custom_loss: bool) -> None:
    """After the first backward pass, before the first optimiser step: ValueError naming `loss_fn` (when
    `custom_loss`, else the model's output) when none of `model`'s trainable parameters received a
    gradient. A loss with a gradient of its own that is not computed from the parameters (e.g.
    `torch.tensor(1.0, requires_grad=True)`) would train nothing, silently. A model without trainable
    parameters is left alone."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable or any(p.grad is not None for p in trainable):
        return
    if custom_loss:
        raise ValueError(f"loss_fn: returned a loss from which none of the model's {len(trainable)} trainable "
                         f"parameters received a gradient (a tensor made with torch.tensor(..., requires_grad=True), "
                         f"or computed from something other than the outputs?); it would train nothing; accepted: "
                         f"the batch's mean loss computed from loss_fn's outputs argument; nothing was trained")
    raise ValueError(f"model's output: none of the model's {len(trainable)} trainable parameters received a "
                     f"gradient from the loss (is the output computed from detached tensors?); it would train "
                     f"nothing; accepted: outputs computed from the model's parameters; nothing was trained")


@contextlib.contextmanager
def modes_kept(model: nn.Module) -> Iterator[None]:
    """Restore every submodule's training flag on exit (a caller's mixed modes included)."""
    modes = [(module, module.training) for module in model.modules()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@contextlib.contextmanager
def rng_kept(device: torch.device) -> Iterator[None]:
    """Restore the global random states (torch's, on the CPU and `device`; Python's; numpy's) on exit, so that
    reading a probe batch (a Dataset's random augmentation) changes nothing that training draws."""
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


def probe(model: nn.Module, x: torch.Tensor, argument: str = "data") -> torch.Tensor:
    """The model's output on batch `x`, in eval mode under no_grad (every module's mode restored, so
    BatchNorm's running statistics do not move), checked as a tensor (`check_outputs`). A forward that
    fails with a RuntimeError is reported as a ValueError naming `argument` and the batch's shape and
    dtype (and the model's dtype), the torch message kept."""
    with modes_kept(model), torch.no_grad():
        model.eval()
        try:
            outputs = model(x)
        except RuntimeError as exc:
            dtype = model_dtype(model)
            message = (f"{argument}: the model's forward failed on the first batch (x of shape {tuple(x.shape)}, "
                       f"{x.dtype}): {(str(exc).splitlines() or [''])[0][:300]}")
            if dtype is not None and x.dtype != dtype:
                raise TypeError(f"{message}; the inputs are {x.dtype} and the model is {dtype}: accepted: floating "
                                f"point inputs (cast to the model's dtype) or inputs the model takes") from exc
            raise ValueError(message) from exc
    return check_outputs(outputs)
