"""Many small models of one shape trained together as one stack (`train_stacked`).

The MNIST studies train many tiny networks (width 50): the gated residual paper reports means over
seeds, the highway paper's section 3.1 runs a random search of 100 trials per depth and
architecture. One such model leaves the machine idle between operations: per-operation overhead,
not arithmetic, sets its speed (docs/design.md "Speed on this platform"). `train_stacked` stacks N
models of one architecture shape into tensors with a leading model dimension and trains them
together: activations are held feature-major, (N models, C channels, B samples), so that every
Linear is one `torch.baddbmm` and every BatchNorm one `F.batch_norm` over a (1, N·C, B) view
without a copy; the optimiser is a handful of elementwise operations over one flat (N, P)
parameter matrix. The stacked model is `train.stacked.StackedModels`; its optimiser
`StackedOptimizer` (the toolkit's one update rule, train.optim, over the (N, P) rows), their step
(`StackedStep`) and epoch (`train_epoch`) are in `train.stacked` too, the stack's checkpoint in
`train.stack_checkpoint`. Here is the trainer: the stack's engine of the one epoch loop
(`train.loop.run_loop`, shared with `fit`) and the run directories of its members (`train_stacked`).
The module was train/batched.py; that name now holds only the former names (train.batched).

Design choices, measured by benchmarks/batched_throughput.py (results/batched/
benchmark_batched_throughput.txt, its "design" lines, N = 32 depth-20 gated residual nets): stacked
parameters with batched matrix products ran forward + backward 1.75× faster than torch.func.vmap
over functional_call (which also cannot update BatchNorm running statistics in place), and the flat
(N, P) NAdam step 21.7× faster than torch's multi-tensor (foreach) NAdam over the models' parameter
tensors. Against the batch-major (N, B, C) layout that preceded it, the feature-major layout with
one-pass gate arithmetic ran a step 1.12× faster (N = 32 depth-20 gated residual, NAdam), 1.20×
(N = 16 50-layer highway, SGD) and 1.09× (N = 16 50-layer plain, SGD), interleaved A/B timing in
one process.

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
  end of its last finished epoch (as `fit` does), its files are written, and it leaves the stack at
  the end of that epoch; the other models are not disturbed (their slices of every operation are
  independent).

Each model gets an ordinary run directory: results.json with the keys of `run_training`'s
(`environment` additionally holds `batched`: the stack's size and what `epoch_time_s` means here;
the key keeps its old name) and model.safetensors loadable by `load_model`. The stack checkpoints
itself after every epoch (one safetensors file and one JSON file, written atomically, in
`state_dir`), so an interrupted stack resumes where it stopped and ends with the same numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from .._io import read_json
from ..data import DataSplits, load_dataset
from .config import RunConfig, RunExistsError, build_model, check_config, check_resumable
from .loop import EpochStats, Member, epoch_starts, run_loop
from .recipes import SCHEDULES, STEP_SCHEDULES, Recipe, learning_rate_at
from .rundir import RunDir
from .stacked import EVAL_CHUNK as _EVAL_CHUNK
from .stacked import SUPPORTED_MODELS, StackedStep, StackedModels, StackedOptimizer, stack_family, train_epoch
from .stacked import evaluate_stack as _evaluate  # a module global: tests interrupt training through it
from .graphed import GraphedStep
from .run import RESULTS_FILE, ResultsFiles, check_finished_model, read_results, results_header
from .stack_checkpoint import (STATE_JSON, check_stack_members, check_stack_tensors, load_stack_state,
                               remove_stack_state, save_stack_state, state_candidates)
from .stack_checkpoint import config_hash as config_hash  # its name here before the checkpoint had a module
from .state import History, TrainState

__all__ = ["train_stacked", "stack_key", "SHARED_RECIPE_FIELDS", "PER_MODEL_RECIPE_FIELDS", "INIT_ONLY_KWARGS"]

# Model arguments that change only initial values, so models of one stack may differ in them.
INIT_ONLY_KWARGS = frozenset({"gate_bias", "k_init", "init"})
# Recipe fields that may differ between the models of one stack.
PER_MODEL_RECIPE_FIELDS = frozenset({"lr", "momentum", "lr_decay", "weight_decay", "milestone_factor",
                                     "name", "source", "notes"})
# Every other recipe field must be shared; these matter most (the computation's shape, the optimiser's kind).
SHARED_RECIPE_FIELDS = frozenset({"optimizer", "epochs", "batch_size", "betas", "eps", "momentum_decay",
                                  "nesterov", "k_decay", "schedule", "milestones"})
# RunConfig fields shared by a stack (one data set, one device).
_SHARED_CONFIG_FIELDS = ("model", "depth", "dataset", "train_on_full", "device", "limit", "data_dir")


def stack_key(config: RunConfig) -> tuple[Any, ...]:
    """Configs with equal keys can share one stack: same model family (`stack_family`), depth, shape
    arguments, data and device.

    Seeds, initial values (INIT_ONLY_KWARGS) and the per-model recipe fields may differ; the
    recipe's shared fields are checked by `train_stacked` once the recipes are resolved.
    """
    shape = {k: v for k, v in config.model_kwargs.items() if k not in INIT_ONLY_KWARGS}
    shared = [stack_family(config.model) if f == "model" else getattr(config, f) for f in _SHARED_CONFIG_FIELDS]
    return (*shared, config.recipe, config.epochs, json.dumps(shape, sort_keys=True))


# ----------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def _check_stack(configs: Sequence[RunConfig], recipes: Sequence[Recipe]) -> None:
    for i, c in enumerate(configs):
        if c.model not in SUPPORTED_MODELS:
            raise ValueError(f"configs[{i}].model={c.model!r}: stacked training supports {list(SUPPORTED_MODELS)}")
    for f in _SHARED_CONFIG_FIELDS:
        values = {json.dumps(stack_family(c.model) if f == "model" else getattr(c, f), default=str) for c in configs}
        if len(values) > 1:
            raise ValueError(f"config field {f!r} differs within the batch ({sorted(values)}); a batch shares it")
    shapes = {json.dumps({k: v for k, v in c.model_kwargs.items() if k not in INIT_ONLY_KWARGS}, sort_keys=True)
              for c in configs}
    if len(shapes) > 1:
        raise ValueError(f"model_kwargs differ in shape arguments within the batch ({sorted(shapes)}); only "
                         f"{sorted(INIT_ONLY_KWARGS)} may differ")
    for i, (c, r) in enumerate(zip(configs, recipes)):
        if r.schedule in STEP_SCHEDULES:
            # a stack sets one rate per member per epoch (StackedOptimizer's (N, 1) rates): no per-step schedule
            raise ValueError(f"configs[{i}]: recipe {r.name!r} has schedule={r.schedule!r}, which sets the learning rate "
                             f"at every step; stacked training sets one rate per epoch and cannot follow it: train "
                             f"these runs one by one with run_training (fit sets it per step), or use a per-epoch "
                             f"schedule ({', '.join(s for s in SCHEDULES if s not in STEP_SCHEDULES)})")
        for option in ("amp", "channels_last", "compile"):
            if getattr(c, option, False):
                raise ValueError(f"configs[{i}].{option}=True: not supported by stacked training; train it alone")
        for option in ("augment", "normalize"):
            if getattr(r, option, "none") != "none":
                raise ValueError(f"recipe {r.name!r} has {option}={getattr(r, option)!r}: stacked training supports "
                                 f"only 'none' (the MNIST recipes)")
    first = recipes[0].to_dict()
    for i, r in enumerate(recipes[1:], 1):
        d = r.to_dict()
        bad = sorted(k for k in set(first) - PER_MODEL_RECIPE_FIELDS if d.get(k) != first[k])
        if bad:
            raise ValueError(f"recipe of configs[{i}] differs from configs[0] in {bad}; a batch shares every "
                             f"recipe field except {sorted(PER_MODEL_RECIPE_FIELDS)}")


def train_stacked(configs: Sequence[RunConfig], out_dirs: Sequence[str | os.PathLike[str]], *,
                  resume: bool = False, progress: bool = True, data: DataSplits | None = None,
                  state_dir: str | os.PathLike[str] | None = None, checkpoint: bool = True,
                  eval_chunk: int = _EVAL_CHUNK, compile: bool = False,
                  label: str | None = None, callbacks: Sequence[Any] = (),
                  cuda_graph: bool = True) -> list[dict[str, Any]]:
    """Train the models of `configs` together, model i writing its run directory `out_dirs[i]`;
    return their results dicts (those of `run_training`).

    The configs must share model, depth, shape arguments, data set and device, and the recipes'
    SHARED_RECIPE_FIELDS (check with `stack_key`). `resume` continues an interrupted stack from
    `state_dir` (default: `<parent of out_dirs[0]>/.batched/<hash of configs and folders>`), and
    skips models whose results are final; without `resume` an existing results.json raises
    RunExistsError, as `run_training` does. `checkpoint=False` writes no stack state (not resumable).
    `compile=True` trains through StackedStep(compile=True): torch.compile over the forward, loss and
    backward and over the optimiser's update (minutes of compilation per stack, again once when a
    diverged model first leaves it; worth it only for long stacks: measure with
    benchmarks/batched_throughput.py --compile).
    `label` starts every progress line of the stack as `[label]` (default: the first and last run
    directories' names, `first..last`), so that stacks trained in parallel can be told apart.
    On a CUDA device each epoch runs as replays of the step captured as a CUDA graph
    (`graphed.GraphedStep`: data orders drawn on the device, no host synchronisation inside an epoch);
    `cuda_graph=False` keeps the eager step there. Elsewhere `cuda_graph` changes nothing.
    """
    if len(configs) != len(out_dirs) or not configs:
        raise ValueError(f"configs ({len(configs)}) and out_dirs ({len(out_dirs)}) must be equally long and non-empty")
    dirs = [Path(d) for d in out_dirs]
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise ValueError("out_dirs must be distinct")
    recipes = [check_config(c) for c in configs]  # cheap checks first: device, recipe, model arguments
    _check_stack(configs, recipes)
    if state_dir is not None:
        state_path = Path(state_dir)
    else:
        candidates = state_candidates(configs, dirs)
        state_path = candidates[0]
        if not state_path.exists():  # a state written under an earlier name is resumed where it is
            earlier = [c for c in candidates[1:] if c.is_dir() and not c.is_symlink()]
            state_path = earlier[0] if earlier else state_path
    for d in dirs:
        RunDir(d).check_usable()
    # The state folder (and the default one's .batched parent) is read, written and emptied: never
    # through a symbolic link, which could lead anywhere.
    for folder in (state_path, state_path.parent) if state_dir is None else (state_path,):
        if folder.is_symlink():
            raise ValueError(f"{folder}: the batch's state folder is a symbolic link (to {os.readlink(folder)}); "
                             f"refused, nothing was read, written or deleted; remove the link to train the batch")
    with contextlib.ExitStack() as locks:
        # Every run directory of the stack is locked for the stack's lifetime (see rundir.RunDir).
        for d in dirs:
            locks.enter_context(RunDir(d).locked())
        RunDir(state_path).clean_tmp()
        if label is None:
            label = dirs[0].name if len(dirs) == 1 else f"{dirs[0].name}..{dirs[-1].name}"
        return _train_locked(configs, dirs, recipes, state_path, resume=resume, progress=progress, data=data,
                             checkpoint=checkpoint, eval_chunk=eval_chunk, compile=compile, label=label,
                             callbacks=callbacks, cuda_graph=cuda_graph)


def _train_locked(configs: Sequence[RunConfig], dirs: list[Path], recipes: list[Recipe], state_path: Path, *,
                  resume: bool, progress: bool, data: DataSplits | None, checkpoint: bool, eval_chunk: int,
                  compile: bool, label: str, callbacks: Sequence[Any], cuda_graph: bool) -> list[dict[str, Any]]:
    saved = load_stack_state(state_path) if (resume and checkpoint) else None
    results: list[dict[str, Any] | None] = [None] * len(configs)
    todo: list[int] = []
    for i, (c, d) in enumerate(zip(configs, dirs)):
        present = RunDir(d).artifacts()  # metrics.csv too: a user's file is never overwritten
        if present and not resume:
            raise RunExistsError(f"{d} already holds a run ({', '.join(present)}); pass --resume to continue "
                                 f"or skip it, or choose another --out")
        if (d / RESULTS_FILE).is_file():
            existing = read_results(d)
            check_resumable(existing, c, d)
            if existing.get("final") is not None and saved is None:
                check_finished_model(RunDir(d), existing)  # a finished run whose model file is gone or damaged
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
    steps_per_epoch = len(epoch_starts(len(data.train), recipes[0].batch_size))  # the batch size is shared
    models = [build_model(c, data) for c in configs]
    stack = StackedModels(models, device=first.device)
    optimizer = StackedOptimizer(stack, recipes, compile=compile)
    members, writers = [], []
    for i, (c, d, r, model) in enumerate(zip(configs, dirs, recipes, models)):
        header = results_header(c, r, model, data)
        header["environment"]["batched"] = {
            "models": len(configs), "index": i,
            "note": "trained by throughway.train.stack with the other models of its stack; epoch_time_s "
                    "and elapsed_s are the whole stack's wall time"}
        writers.append(ResultsFiles(d, header))
        state = TrainState(model, optimizer, r, data, order_generator(stack.device).manual_seed(c.seed), History(),
                           steps_per_epoch=steps_per_epoch)
        notes = [_DivergenceNote(f"[{label}] {d.name}")] if progress else []
        members.append(Member(state, [writers[-1], *notes, *callbacks], ended=i not in todo))
    if saved is not None:
        meta, tensors = saved
        active = [int(i) for i in meta["active"]]
        check_stack_members(state_path, meta, len(members))
        if meta["epoch"] > recipes[0].epochs or meta["step_count"] != meta["epoch"] * steps_per_epoch:
            raise ValueError(f"{state_path / STATE_JSON}: fields 'epoch' ({meta['epoch']}) and 'step_count' "
                             f"({meta['step_count']}) do not fit this batch ({recipes[0].epochs} epochs of "
                             f"{steps_per_epoch} steps); the file was edited or damaged; delete {state_path} to "
                             f"restart the batch")
        stack.select(active)
        optimizer.select(active)
        expected = {"flat": stack.flat, "steps": stack.steps,
                    **{f"running.{k}": v for k, v in stack.running.items()},
                    **{f"optim.{k}": v for k, v in optimizer.state_tensors().items()},
                    **{f"generator.{i}": members[i].state.generator.get_state() for i in active}}
        check_stack_tensors(state_path, meta, tensors, expected)
        stack.flat.copy_(tensors["flat"])
        stack.steps.copy_(tensors["steps"])
        for name, v in stack.running.items():
            v.copy_(tensors[f"running.{name}"])
        optimizer.load_state_tensors({k[len("optim."):]: v.to(stack.device) for k, v in tensors.items()
                                      if k.startswith("optim.")}, int(meta["step_count"]))
        for i, (m, entry) in enumerate(zip(members, meta["members"])):
            m.state.restore_progress(entry)
            m.ended = i not in active
            if not m.ended:
                m.state.generator.set_state(tensors[f"generator.{i}"])
        if progress:
            print(f"[{label}] resuming batch {state_path} after epoch {meta['epoch']} ({len(active)} models active)",
                  file=sys.stderr, flush=True)
    else:
        active = list(todo)
        if len(active) < len(configs):
            stack.select(active)
            optimizer.select(active)
    for i in active:
        dirs[i].mkdir(parents=True, exist_ok=True)

    def after_epoch(running: Sequence[Member]) -> None:
        epoch = running[0].state.epoch
        if checkpoint:
            save_stack_state(state_path, epoch, stack, optimizer, members, running)
        if progress:
            losses = [m.state.history.epochs[-1]["train_loss"] for m in running]
            best = min(range(len(running)), key=losses.__getitem__)
            print(f"[{label}] batch of {len(running)}: epoch {epoch:>3}/{recipes[0].epochs} train loss "
                  f"{min(losses):.4g}..{max(losses):.4g} (best {dirs[members.index(running[best])].name}) "
                  f"({running[0].state.history.epochs[-1]['epoch_time_s']:.1f}s)", file=sys.stderr, flush=True)

    engine = _StackEngine(stack, optimizer, [recipes[i] for i in active], data, eval_chunk, compile, cuda_graph)
    run_loop(engine, members, recipes[0].epochs, after_epoch=after_epoch)
    if checkpoint:
        remove_stack_state(state_path)
    for i, d in enumerate(dirs):
        if results[i] is None:
            # A model that ended in an earlier process (diverged before an interruption) is read back.
            results[i] = writers[i].results if "history" in writers[i].results else read_json(d / RESULTS_FILE)
    return [r for r in results if r is not None]


def _use_graphs(device: torch.device, cuda_graph: bool) -> bool:
    """Whether a stack on `device` trains through `GraphedStep` (a module global: the CPU tests run the
    trainer through its static-buffer body by replacing it)."""
    return device.type == "cuda" and cuda_graph


def order_generator(device: torch.device) -> torch.Generator:
    """A member's data-order generator: on the stack's device when that is a GPU (the epoch's
    `randperm` is drawn there, never copied from the host), else on the CPU (the CPU path's orders,
    which tests/test_bit_for_bit.py pins). Seeded by the caller with the member's seed."""
    return torch.Generator(device=device) if device.type == "cuda" else torch.Generator(device="cpu")


class _DivergenceNote:
    """Callback: one progress line when a member of a stack ends diverged (the others go on)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def on_fit_end(self, state: TrainState) -> None:
        """Say where the member diverged; its history is kept."""
        where = state.history.diverged_at
        if where is not None:
            print(f"{self.prefix}: diverged in epoch {where['epoch']} (loss {where['loss']}); history kept",
                  file=sys.stderr, flush=True)


class _StackEngine:
    """`train_stacked`'s engine (train.loop.Engine): the active members as one `StackedModels`.

    Differences from `fit`'s engine, by construction of a stacked step: `on_step_end` is not called
    (it would cost a device synchronisation per step for N models), so a member's `state.stop` takes
    effect at the end of the epoch; a member whose loss stops being finite keeps stepping to the
    epoch's end (its slices never mix with the others') and is then rolled back, as `fit` rolls back.
    `state.model` of each member holds its weights from the end of every epoch (`sync`)."""

    def __init__(self, stack: StackedModels, optimizer: StackedOptimizer, recipes: list[Recipe], data: DataSplits,
                 eval_chunk: int, compile: bool, cuda_graph: bool = True) -> None:
        self.stack, self.optimizer, self.recipes, self.data = stack, optimizer, recipes, data
        self.eval_chunk = eval_chunk
        # On a GPU the epoch is replays of one captured step (no host synchronisation within an epoch); the
        # CPU keeps the eager step. Decided first, then both steps are built.
        graphed = _use_graphs(stack.device, cuda_graph)
        self.step = StackedStep(stack, optimizer, compile=compile)
        self.graphed = GraphedStep(stack, optimizer, compile=compile) if graphed else None
        self.train_x, self.train_y = data.train.x.flatten(1), data.train.y
        self.snap: dict[str, torch.Tensor] = {}

    def begin(self) -> None:
        """Remember the starting weights (a divergence in the first epoch goes back to them)."""
        self.end_epoch()

    def set_learning_rates(self, epoch: int) -> list[float]:
        """Each member's own schedule (`learning_rate_at` of its recipe), into the optimiser's (N, 1) rates."""
        lrs = [learning_rate_at(r, epoch) for r in self.recipes]
        self.optimizer.param_groups[0]["lr"] = torch.tensor(lrs, dtype=self.stack.flat.dtype,
                                                            device=self.stack.device).view(-1, 1)
        return lrs

    def train_epoch(self, epoch: int, states: Sequence[TrainState], callbacks: Sequence[Sequence[Any]]) -> EpochStats:
        """`train_epoch` over every member, each in its own generator's order (drawn on the generator's
        device: the stack's on a GPU, `order_generator`); on a GPU the epoch is `GraphedStep.epoch`, and
        the totals are read from the device here, once, at the epoch's end."""
        n = len(self.train_x)
        orders = torch.stack([torch.randperm(n, generator=s.generator, device=s.generator.device)
                              for s in states]).to(self.stack.device)
        if self.graphed is not None:
            totals = self.graphed.epoch(self.train_x, self.train_y, orders, self.recipes[0].batch_size)
        else:
            totals = train_epoch(self.step, self.train_x, self.train_y, orders, self.recipes[0].batch_size)
        steps = len(epoch_starts(n, self.recipes[0].batch_size))
        for s in states:
            s.step += steps
        bad = totals.bad_step.tolist()
        diverged = {p: {"step": int(b), "loss": str(float(totals.bad_loss[p]))} for p, b in enumerate(bad) if b >= 0}
        return EpochStats(totals.loss_sum.tolist(), totals.wrong.tolist(), totals.seen, steps, diverged)

    def evaluate(self, which: str) -> list[tuple[float | None, float | None]] | None:
        """Every member's loss and error on the val or test split (None without it)."""
        split = getattr(self.data, which)
        if split is None:
            return None
        losses, errors = _evaluate(self.stack, split, self.eval_chunk)
        return list(zip(losses, errors))

    def gate_values(self) -> list[list[float]]:
        """Each member's gates in branch order, as `layers.branch_gate_values` gives a module's (k, or the
        mean λ of a vector gate); [] for members without gates (plain nets of a mixed stack)."""
        names = self.stack.gate_names()
        if not names:
            return [[] for _ in range(self.stack.n)]
        n = self.stack.n
        values = torch.stack([self.stack.params[name].detach().double().reshape(n, -1).mean(1) for name in names],
                             1).tolist()
        return [values[p] if self.stack.has_gates(p) else [] for p in range(self.stack.n)]

    def end_epoch(self) -> None:
        """Copy every stacked tensor (what a diverged member goes back to)."""
        self.snap = self.stack.snapshot()

    def roll_back(self, position: int, state: TrainState) -> None:
        """Member `position`'s model gets its weights from the end of the last finished epoch."""
        state.model.load_state_dict(self.stack.state_dict_of(position, self.snap))

    def sync(self, position: int, state: TrainState) -> None:
        """Copy member `position`'s weights out of the stack into its own model."""
        state.model.load_state_dict(self.stack.state_dict_of(position))

    def keep(self, positions: Sequence[int]) -> None:
        """Drop every other member from the stack and the optimiser (its state and per-model rates)."""
        self.stack.select(positions)
        self.optimizer.select(positions)
        self.recipes = [self.recipes[p] for p in positions]
        self.snap = {k: v.index_select(0, torch.tensor(list(positions), dtype=torch.long, device=v.device))
                     for k, v in self.snap.items()}
