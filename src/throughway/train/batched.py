"""Many small models of one shape trained as one batched computation (`train_batched`).

The MNIST studies train many tiny networks (width 50): the gated residual paper reports means over
seeds, the highway paper's section 3.1 runs a random search of 100 trials per depth and
architecture. One such model leaves the machine idle between operations: per-operation overhead,
not arithmetic, sets its speed (docs/design.md "Speed on this platform"). `train_batched` stacks N
models of one architecture shape into tensors with a leading model dimension and trains them
together: activations are held feature-major, (N models, C channels, B samples), so that every
Linear is one `torch.baddbmm` and every BatchNorm one `F.batch_norm` over a (1, N·C, B) view
without a copy; the optimiser is a handful of elementwise operations over one flat (N, P)
parameter matrix. The stacked model is `train.stacked.StackedModels`, its optimiser
`train.stacked_optim.BatchedOptimizer`; here are the step (`BatchedStep`), the epoch
(`train_epoch`) and the trainer with its run directories and batch checkpoints (`train_batched`).

Design choices, measured by benchmarks/batched_throughput.py (its "design" lines print both for the
benchmark's N and depth; the figures here are from N = 4, depth 2, on this shared machine under
load): stacked parameters with batched matrix products ran forward + backward 2.2× faster than
torch.func.vmap over functional_call (which also cannot update BatchNorm running statistics in
place), and the flat (N, P) optimiser step 18× faster than torch's multi-tensor (foreach) NAdam
over the models' parameter tensors. Against the batch-major (N, B, C) layout that preceded it, the
feature-major layout with one-pass gate arithmetic ran a step 1.12× faster (N = 32 depth-20 gated
residual, NAdam), 1.20× (N = 16 50-layer highway, SGD) and 1.09× (N = 16 50-layer plain, SGD),
interleaved A/B timing in one process.

Per-model semantics are those of `fit` run on each model alone (tests/test_batched.py):

* initialisation: `build_model(config)` (torch.manual_seed(config.seed), then create_model), so the
  models may differ in seed and in initial values (gate bias, k_init, init scheme);
* data order: a `torch.Generator` seeded with the model's seed, one `torch.randperm` per epoch,
  batches of recipe.batch_size with a final batch of one sample folded away, as `fit` does;
* BatchNorm: batch statistics per model in training mode, running statistics per model, evaluation
  with the running statistics;
* the optimiser (SGD with momentum, NAdam, Adam) with per-model learning rate, momentum, decay
  factor and weight decay, and the per-model schedule `learning_rate_at`; the other recipe fields
  (optimiser, betas, batch size, epochs, schedule kind) must be shared;
* a model whose loss becomes NaN or infinite is marked diverged, its parameters are restored to the
  end of its last finished epoch (as `fit` does), its files are written, and it leaves the batch at
  the end of that epoch; the other models are not disturbed (their slices of every operation are
  independent).

Each model gets an ordinary run directory: results.json with the keys of `run_training`'s
(`environment` additionally holds `batched`: the batch size and what `epoch_time_s` means here) and
model.safetensors loadable by `load_model`. The batch checkpoints itself after every epoch (one
safetensors file and one JSON file, written atomically, in `state_dir`), so an interrupted batch
resumes where it stopped and ends with the same numbers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, cast

import torch
from safetensors.torch import load_file, save
from torch.nn import functional as F

from .._io import atomic_write_bytes, atomic_write_json, read_json, read_json_object, sha256_file
from ..data import DataSplits, Split, load_dataset
from ..models import create_model, with_legacy_config
from .callbacks import write_metrics_csv
from .checkpoint import MODEL_FILE, save_model
from .loop import History
from .recipes import Recipe, learning_rate_at
from .rundir import BATCH_FILE, RunDir, member_file
from .stacked import _MIXED_FAMILY, MIXABLE_MODELS, SUPPORTED_MODELS, StackedModels, backward
from .stacked_optim import BatchedOptimizer
from .runner import (RESULTS_FILE, RunConfig, RunExistsError, build_model, check_config, check_resumable,
                     final_summary, read_results, resolve_recipe, results_header)

__all__ = ["StackedModels", "BatchedOptimizer", "BatchedStep", "EpochTotals", "train_epoch", "epoch_starts",
           "train_batched", "backward", "batch_key", "SUPPORTED_MODELS", "SHARED_RECIPE_FIELDS",
           "PER_MODEL_RECIPE_FIELDS", "INIT_ONLY_KWARGS", "MIXABLE_MODELS", "batch_family"]

# Model arguments that change only initial values, so models of one batch may differ in them.
INIT_ONLY_KWARGS = frozenset({"gate_bias", "k_init", "init"})
# Recipe fields that may differ between the models of one batch.
PER_MODEL_RECIPE_FIELDS = frozenset({"lr", "momentum", "lr_decay", "weight_decay", "milestone_factor",
                                     "name", "source", "notes"})
# Every other recipe field must be shared; these matter most (the computation's shape, the optimiser's kind).
SHARED_RECIPE_FIELDS = frozenset({"optimizer", "epochs", "batch_size", "betas", "eps", "momentum_decay",
                                  "nesterov", "k_decay", "schedule", "milestones"})
# RunConfig fields shared by a batch (one data set, one device).
_SHARED_CONFIG_FIELDS = ("model", "depth", "dataset", "train_on_full", "device", "limit", "data_dir")
_EVAL_CHUNK = 2500
_STATE_FORMAT = "throughway-batched-1"
_STATE_JSON = "batch.json"


def batch_family(model: str) -> str:
    """The name under which models can share a batch: the model's own, or one name for the three
    MIXABLE_MODELS (plain, residual and gated residual MLPs of one depth train together)."""
    return _MIXED_FAMILY if model in MIXABLE_MODELS else model


def batch_key(config: RunConfig) -> tuple[Any, ...]:
    """Configs with equal keys can share one batch: same model family (`batch_family`), depth, shape
    arguments, data and device.

    Seeds, initial values (INIT_ONLY_KWARGS) and the per-model recipe fields may differ; the
    recipe's shared fields are checked by `train_batched` once the recipes are resolved.
    """
    shape = {k: v for k, v in config.model_kwargs.items() if k not in INIT_ONLY_KWARGS}
    shared = [batch_family(config.model) if f == "model" else getattr(config, f) for f in _SHARED_CONFIG_FIELDS]
    return (*shared, config.recipe, config.epochs, json.dumps(shape, sort_keys=True))


# ----------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def _evaluate(stack: StackedModels, split: Split, chunk: int = _EVAL_CHUNK) -> tuple[list[float], list[float]]:
    """Per-model mean cross-entropy and error (%) on `split` in evaluation mode (as `evaluate`)."""
    n_models, n = stack.n, len(split)
    loss = torch.zeros(n_models, dtype=torch.float64, device=stack.device)
    wrong = torch.zeros(n_models, dtype=torch.long, device=stack.device)
    for start in range(0, n, chunk):
        x, y = split.x[start:start + chunk], split.y[start:start + chunk]
        logits = stack.forward_logits(x.flatten(1), training=False)  # (N, classes, B)
        yy = y.unsqueeze(0).expand(n_models, -1)
        ce = F.cross_entropy(logits, yy, reduction="none")  # (N, B)
        loss += ce.sum(1, dtype=torch.float64)
        finite = torch.isfinite(logits).all(dim=1)
        wrong += ((logits.argmax(dim=1) != yy) | ~finite).sum(1)
    return (loss / n).tolist(), (100.0 * wrong.double() / n).tolist()


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


def epoch_starts(n: int, batch_size: int) -> list[int]:
    """The first index of each mini-batch of an epoch over n samples, as `fit` makes them: a final
    batch of one sample is folded away (it would break BatchNorm's training statistics)."""
    return [s for s in range(0, n, batch_size) if n - s > 1 or s == 0]


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


def _config_hash(configs: Sequence[RunConfig], out_dirs: Sequence[Path]) -> str:
    text = json.dumps([[str(d.resolve()), c.to_dict()] for c, d in zip(configs, out_dirs)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class _Member:
    """One model of the batch: where it writes and what it has done."""

    index: int
    config: RunConfig
    out_dir: Path
    recipe: Recipe
    results: dict[str, Any]
    model_config: dict[str, Any]
    generator: torch.Generator
    history: History = field(default_factory=History)
    elapsed_s: float = 0.0
    done: bool = False


def _check_batch(configs: Sequence[RunConfig], recipes: Sequence[Recipe]) -> None:
    for i, c in enumerate(configs):
        if c.model not in SUPPORTED_MODELS:
            raise ValueError(f"configs[{i}].model={c.model!r}: batched training supports {list(SUPPORTED_MODELS)}")
    for f in _SHARED_CONFIG_FIELDS:
        values = {json.dumps(batch_family(c.model) if f == "model" else getattr(c, f), default=str) for c in configs}
        if len(values) > 1:
            raise ValueError(f"config field {f!r} differs within the batch ({sorted(values)}); a batch shares it")
    shapes = {json.dumps({k: v for k, v in c.model_kwargs.items() if k not in INIT_ONLY_KWARGS}, sort_keys=True)
              for c in configs}
    if len(shapes) > 1:
        raise ValueError(f"model_kwargs differ in shape arguments within the batch ({sorted(shapes)}); only "
                         f"{sorted(INIT_ONLY_KWARGS)} may differ")
    for i, (c, r) in enumerate(zip(configs, recipes)):
        for option in ("amp", "channels_last", "compile"):
            if getattr(c, option, False):
                raise ValueError(f"configs[{i}].{option}=True: not supported by batched training; train it alone")
        for option in ("augment", "normalize"):
            if getattr(r, option, "none") != "none":
                raise ValueError(f"recipe {r.name!r} has {option}={getattr(r, option)!r}: batched training supports "
                                 f"only 'none' (the MNIST recipes)")
    first = recipes[0].to_dict()
    for i, r in enumerate(recipes[1:], 1):
        d = r.to_dict()
        bad = sorted(k for k in set(first) - PER_MODEL_RECIPE_FIELDS if d.get(k) != first[k])
        if bad:
            raise ValueError(f"recipe of configs[{i}] differs from configs[0] in {bad}; a batch shares every "
                             f"recipe field except {sorted(PER_MODEL_RECIPE_FIELDS)}")


def _save_state(state_dir: Path, epoch: int, stack: StackedModels, optimizer: BatchedOptimizer,
                members: Sequence[_Member], active: Sequence[int], snap: dict[str, torch.Tensor]) -> None:
    tensors: dict[str, torch.Tensor] = {"flat": stack.flat, "steps": stack.steps}
    tensors.update({f"running.{k}": v for k, v in stack.running.items()})
    tensors.update({f"optim.{k}": v for k, v in optimizer.state_tensors().items()})
    for i in active:
        tensors[f"generator.{i}"] = members[i].generator.get_state()
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    name = f"batch-e{epoch:04d}.safetensors"
    path = atomic_write_bytes(state_dir / name, save(tensors))
    try:  # the file the old batch.json names, deleted below: only a name this module writes, inside state_dir
        previous = _state_file(state_dir, read_json_object(state_dir / _STATE_JSON).get("file")).name \
            if (state_dir / _STATE_JSON).is_file() else None
    except ValueError:
        previous = None
    atomic_write_json(state_dir / _STATE_JSON, {
        "format": _STATE_FORMAT, "epoch": epoch, "file": name, "sha256": sha256_file(path),
        "active": list(active), "step_count": optimizer.step_count,
        "members": [{"history": m.history.to_dict(), "elapsed_s": m.elapsed_s, "done": m.done} for m in members],
    })
    if previous and previous != name:
        (state_dir / previous).unlink(missing_ok=True)


def _load_state(state_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    meta_path = state_dir / _STATE_JSON
    if not meta_path.is_file():
        return None
    meta = read_json_object(meta_path, "a batch's state")
    if meta.get("format") != _STATE_FORMAT:
        raise ValueError(f"{meta_path}: unknown batch-state format {meta.get('format')!r}")
    path = _state_file(state_dir, meta.get("file"))
    if not path.is_file() or sha256_file(path) != meta.get("sha256"):
        raise ValueError(f"{path}: missing or damaged (checksum differs from {meta_path}); delete {state_dir} to restart the batch")
    if not (isinstance(meta.get("epoch"), int) and isinstance(meta.get("step_count"), int)
            and isinstance(meta.get("active"), list) and all(isinstance(i, int) for i in meta["active"])
            and isinstance(meta.get("members"), list) and all(isinstance(m, dict) for m in meta["members"])):
        raise ValueError(f"{meta_path}: fields 'epoch', 'step_count' (integers), 'active' (list of integers) or "
                         f"'members' (list of objects) malformed; delete {state_dir} to restart the batch")
    try:
        return meta, load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable safetensors file ({exc}); delete {state_dir} to restart the batch") from exc


def _state_file(state_dir: Path, name: Any) -> Path:
    return member_file(state_dir, name, BATCH_FILE, source=state_dir / _STATE_JSON, field="file")


def _write_results(member: _Member, final: bool) -> None:
    member.results["history"] = member.history.epochs
    member.results["diverged"] = member.history.diverged
    member.results["diverged_at"] = member.history.diverged_at
    member.results["final"] = final_summary(member.history) if final else None
    atomic_write_json(member.out_dir / RESULTS_FILE, member.results)
    write_metrics_csv(member.out_dir, member.history.epochs)  # as run_training writes it


def _save_member_model(member: _Member, state: dict[str, torch.Tensor]) -> None:
    cfg = with_legacy_config(member.model_config)
    name = cfg.pop("name")
    model = create_model(name, **cfg)
    model.load_state_dict(state)
    save_model(member.out_dir / MODEL_FILE, model)


def train_batched(configs: Sequence[RunConfig], out_dirs: Sequence[str | os.PathLike[str]], *,
                  resume: bool = False, progress: bool = True, data: DataSplits | None = None,
                  state_dir: str | os.PathLike[str] | None = None, checkpoint: bool = True,
                  eval_chunk: int = _EVAL_CHUNK, compile: bool = False,
                  label: str | None = None) -> list[dict[str, Any]]:
    """Train the models of `configs` together, model i writing its run directory `out_dirs[i]`;
    return their results dicts (those of `run_training`).

    The configs must share model, depth, shape arguments, data set and device, and the recipes'
    SHARED_RECIPE_FIELDS (check with `batch_key`). `resume` continues an interrupted batch from
    `state_dir` (default: `<parent of out_dirs[0]>/.batched/<hash of configs and folders>`), and
    skips models whose results are final; without `resume` an existing results.json raises
    RunExistsError, as `run_training` does. `checkpoint=False` writes no batch state (not resumable).
    `compile=True` trains through BatchedStep(compile=True): torch.compile over the forward, loss and
    backward and over the optimiser's update (minutes of compilation per batch, again once when a
    diverged model first leaves it; worth it only for long batches: measure with
    benchmarks/batched_throughput.py --compile).
    `label` starts every progress line of the batch as `[label]` (default: the first and last run
    directories' names, `first..last`), so that batches trained in parallel can be told apart.
    """
    if len(configs) != len(out_dirs) or not configs:
        raise ValueError(f"configs ({len(configs)}) and out_dirs ({len(out_dirs)}) must be equally long and non-empty")
    dirs = [Path(d) for d in out_dirs]
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise ValueError("out_dirs must be distinct")
    for c in configs:
        check_config(c)  # cheap checks first: device, recipe, model arguments
    recipes = [resolve_recipe(c) for c in configs]
    _check_batch(configs, recipes)
    state_path = Path(state_dir) if state_dir is not None else dirs[0].parent / ".batched" / _config_hash(configs, dirs)
    for d in dirs:
        RunDir(d).check_usable()
    with contextlib.ExitStack() as locks:
        # Every run directory of the batch is locked for the batch's lifetime (see rundir.RunDir).
        for d in dirs:
            locks.enter_context(RunDir(d).locked())
        RunDir(state_path).clean_tmp()
        if label is None:
            label = dirs[0].name if len(dirs) == 1 else f"{dirs[0].name}..{dirs[-1].name}"
        return _train_locked(configs, dirs, recipes, state_path, resume=resume, progress=progress, data=data,
                             checkpoint=checkpoint, eval_chunk=eval_chunk, compile=compile, label=label)


def _train_locked(configs: Sequence[RunConfig], dirs: list[Path], recipes: list[Recipe], state_path: Path, *,
                  resume: bool, progress: bool, data: DataSplits | None, checkpoint: bool, eval_chunk: int,
                  compile: bool, label: str) -> list[dict[str, Any]]:
    saved = _load_state(state_path) if (resume and checkpoint) else None

    results: list[dict[str, Any] | None] = [None] * len(configs)
    todo: list[int] = []
    for i, (c, d) in enumerate(zip(configs, dirs)):
        path = d / RESULTS_FILE
        if path.is_file():
            existing = read_results(d)
            if not resume:
                raise RunExistsError(f"{d} already holds a run ({RESULTS_FILE}); pass --resume to continue "
                                     f"or skip it, or choose another --out")
            check_resumable(existing, c, d)
            if existing.get("final") is not None and saved is None:
                results[i] = existing
                if progress:
                    print(f"  {d}: finished earlier, skipped", file=sys.stderr, flush=True)
                continue
        todo.append(i)
    if saved is None and not todo:
        return [r for r in results if r is not None]

    first = configs[0]
    if data is None:
        data = load_dataset(first.dataset, first.data_dir, train_on_full=first.train_on_full,
                            device=first.device, limit=first.limit)
    if len(data.train) < 2:
        raise ValueError("the training split needs at least 2 samples")
    models = [build_model(c, data) for c in configs]
    members = []
    for i, (c, d, r, model) in enumerate(zip(configs, dirs, recipes, models)):
        header = results_header(c, r, model, data)
        header["environment"]["batched"] = {
            "models": len(configs), "index": i,
            "note": "trained by throughway.train.batched with the other models of its batch; epoch_time_s "
                    "and elapsed_s are the whole batch's wall time"}
        members.append(_Member(i, c, d, r, header, dict(cast(dict, model.config)),
                               torch.Generator(device="cpu").manual_seed(c.seed)))

    stack = StackedModels(models, device=first.device)
    del models
    optimizer = BatchedOptimizer(stack, recipes, compile=compile)
    epoch = 0
    if saved is not None:
        meta, tensors = saved
        active = [int(i) for i in meta["active"]]
        stack.select(active)
        optimizer.select(active)
        stack.flat.copy_(tensors["flat"])
        stack.steps.copy_(tensors["steps"])
        for name, v in stack.running.items():
            v.copy_(tensors[f"running.{name}"])
        optimizer.load_state_tensors({k[len("optim."):]: v.to(stack.device) for k, v in tensors.items()
                                      if k.startswith("optim.")}, int(meta["step_count"]))
        for m, entry in zip(members, meta["members"]):
            m.history = History.from_dict(entry["history"])
            m.elapsed_s = float(entry["elapsed_s"])
            m.done = bool(entry["done"])
        for i in active:
            members[i].generator.set_state(tensors[f"generator.{i}"])
        epoch = int(meta["epoch"])
        if progress:
            print(f"[{label}] resuming batch {state_path} after epoch {epoch} ({len(active)} models active)",
                  file=sys.stderr, flush=True)
    else:
        active = list(todo)
        if len(active) < len(configs):
            stack.select(active)
            optimizer.select(active)
    for i in active:
        dirs[i].mkdir(parents=True, exist_ok=True)
        _write_results(members[i], final=False)

    recipe0 = recipes[0]
    n, batch_size, device = len(data.train), recipe0.batch_size, stack.device
    train_x, train_y = data.train.x.flatten(1), data.train.y
    step = BatchedStep(stack, optimizer, compile=compile)
    snap = stack.snapshot()
    while active and epoch < recipe0.epochs:
        lrs = [learning_rate_at(members[i].recipe, epoch) for i in active]
        lr = torch.tensor(lrs, dtype=stack.flat.dtype, device=device).view(-1, 1)
        started = time.perf_counter()
        orders = torch.stack([torch.randperm(n, generator=members[i].generator) for i in active]).to(device)
        k = len(active)
        totals = train_epoch(step, train_x, train_y, orders, batch_size, lr)
        loss_sum, wrong, bad_step, bad_loss, seen = (totals.loss_sum, totals.wrong, totals.bad_step,
                                                     totals.bad_loss, totals.seen)
        epoch_time = time.perf_counter() - started

        diverged_pos = [pos for pos in range(k) if int(bad_step[pos]) >= 0]
        for pos in diverged_pos:
            # Back to the last finished epoch (as fit does), files written, and the model leaves the
            # batch; its slices of every operation never mixed with the others'.
            m = members[active[pos]]
            m.history.diverged = True
            m.history.diverged_at = {"epoch": epoch + 1, "step": int(bad_step[pos]), "loss": str(float(bad_loss[pos]))}
            _save_member_model(m, stack.state_dict_of(pos, snap))
            m.done = True
            _write_results(m, final=True)
            if progress:
                print(f"[{label}] {m.out_dir.name}: diverged in epoch {epoch + 1} (loss {m.history.diverged_at['loss']}); "
                      f"history kept", file=sys.stderr, flush=True)
        if diverged_pos:
            keep = [pos for pos in range(k) if pos not in set(diverged_pos)]
            stack.select(keep)
            optimizer.select(keep)
            active = [active[pos] for pos in keep]
            lrs = [lrs[pos] for pos in keep]
            loss_sum, wrong = loss_sum[keep], wrong[keep]
        if active:
            val = _evaluate(stack, data.val, eval_chunk) if data.val is not None else None
            test = _evaluate(stack, data.test, eval_chunk)
            k_names = stack.scalar_gate_names()
            k_values = torch.stack([stack.params[name].detach() for name in k_names], 1).tolist() if k_names else None
            sums, wrongs = loss_sum.tolist(), wrong.tolist()
            for pos, i in enumerate(active):
                m = members[i]
                m.elapsed_s += epoch_time
                record: dict[str, Any] = {"epoch": epoch + 1, "lr": lrs[pos], "train_loss": sums[pos] / seen,
                                          "train_error_pct": 100.0 * wrongs[pos] / seen}
                record["val_loss"], record["val_error_pct"] = (val[0][pos], val[1][pos]) if val else (None, None)
                record["test_loss"], record["test_error_pct"] = test[0][pos], test[1][pos]
                if k_values is not None and stack.has_gates(pos):
                    record["k"] = k_values[pos]
                    record["k_mean"] = sum(k_values[pos]) / len(k_values[pos])
                record["epoch_time_s"] = epoch_time
                record["elapsed_s"] = m.elapsed_s
                m.history.epochs.append(record)
                _write_results(m, final=False)
            if progress:
                best = min(range(len(active)), key=lambda p: sums[p])
                print(f"[{label}] batch of {len(active)}: epoch {epoch + 1:>3}/{recipe0.epochs} train loss "
                      f"{min(sums) / seen:.4g}..{max(sums) / seen:.4g} (best {members[active[best]].out_dir.name}) "
                      f"({epoch_time:.1f}s)", file=sys.stderr, flush=True)
        epoch += 1
        snap = stack.snapshot()
        if checkpoint and active:
            _save_state(state_path, epoch, stack, optimizer, members, active, snap)
    for i in active:
        m = members[i]
        _save_member_model(m, stack.state_dict_of(active.index(i)))
        m.done = True
        _write_results(m, final=True)
    if checkpoint and state_path.is_dir():
        for f in state_path.iterdir():
            f.unlink()
        state_path.rmdir()
        if state_path.parent.name == ".batched" and not any(state_path.parent.iterdir()):
            state_path.parent.rmdir()
    for m in members:
        if results[m.index] is None:
            # A model that ended in an earlier process (diverged before an interruption) is read back.
            results[m.index] = m.results if "history" in m.results else read_json(m.out_dir / RESULTS_FILE)
    return [r for r in results if r is not None]
