"""Running a study's runs as stacks: models trained together (`throughway.train.stack`).

Runs whose configs share `stack_key` and the recipe's shared fields (same model shape, data,
optimiser kind, mini-batch size, epochs) train as one stack; the others go in other stacks. Stacks
are independent, so `jobs` > 1 spreads them over spawned worker processes as `run_many` does for
single runs. Each run still gets its own ordinary run directory.

(This module was study/batching.py before. Some of its names and of the dictionaries it
returns still say "batch" for a stack: `time_batch`, `BatchTiming`, `batch_seconds`, `project_batches`
and its "batches"/"batch" keys; `run_batched` is `run_stacked`'s former name.)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import heapq
import multiprocessing
import os
import subprocess
import sys
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.nn import functional as F

from ..data import DataSplits, Split, load_dataset
from ..report.tables import table_header, table_row
from ..train import RESULTS_FILE, read_results
from ..train.stack import PER_MODEL_RECIPE_FIELDS, stack_key, train_stacked
from ..train.stacked import StackedStep, StackedModels, StackedOptimizer
from ..train.config import build_model, resolve_recipe
from .options import add_options
from .spec import RunSpec, check_specs
from .workers import damaged_finished_runs, prepare_data, worker_threads
from .shards import check_shard_fresh, select_shard, shard_environment

__all__ = ["group_specs", "run_stacked", "run_batched", "time_batch", "BatchTiming", "batch_seconds", "worker_start_s", "makespan", "depth_study_markdown",
           "project_batches", "projection_markdown", "add_estimate_options", "StudyProgress", "run_work", "compiles",
           "COMPILE_MIN_STEPS"]


def group_specs(specs: Sequence[RunSpec], max_batch: int = 64) -> list[list[RunSpec]]:
    """Partition `specs` into batches of at most `max_batch` runs that can train together, in the
    order of their first member in `specs` (so a study's deepest-first order is kept)."""
    if max_batch < 1:
        raise ValueError(f"max_batch={max_batch}: must be ≥ 1")
    groups: dict[Any, list[RunSpec]] = {}
    for spec in specs:
        recipe = resolve_recipe(spec.config).to_dict()
        key = (stack_key(spec.config), tuple((f, str(recipe[f])) for f in sorted(recipe) if f not in PER_MODEL_RECIPE_FIELDS))
        groups.setdefault(key, []).append(spec)
    out = []
    for members in groups.values():
        out += [members[i:i + max_batch] for i in range(0, len(members), max_batch)]
    return out


# Compile a batch's step by default only when it trains at least this many steps. Measured on this
# project's 2-core CPU (results/protocol): compilation takes about 100 s per batch shape (more with
# depth) and makes the step about 1.5x faster, so at 20-40 ms a step it pays after roughly 10,000
# steps; the 5-seed MNIST study trains about 47,000 per batch, --quick runs about 800.
COMPILE_MIN_STEPS = 10_000


def compiles(batch: Sequence[RunSpec], compile: bool | None, train_images: int) -> bool:
    """Whether `batch` trains through torch.compile: `compile` when the user said (--compile /
    --no-compile), else (None, the default) when it trains at least COMPILE_MIN_STEPS steps."""
    if compile is not None:
        return compile
    from ..train.loop import epoch_starts

    recipe = resolve_recipe(batch[0].config)
    return recipe.epochs * len(epoch_starts(train_images, recipe.batch_size)) >= COMPILE_MIN_STEPS


@dataclass(frozen=True)
class BatchTiming:
    """What one batch costs on this machine: seconds per training step of all its models (`step_s`),
    per evaluated sample (`eval_s`), and once before its first epoch (`setup_s`: building and
    stacking the models and the optimiser, and the first step's extra cost over a later one, which
    under `compile` is the compilation)."""

    step_s: float
    eval_s: float
    setup_s: float


def time_batch(batch: Sequence[RunSpec], steps: int = 4, input_shape: tuple[int, ...] = (784,),
               num_classes: int = 10, eval_chunk: int = 2500, compile: bool = False) -> BatchTiming:
    """Measure, on this machine with the current thread setting, the batch's costs (`BatchTiming`):
    the median of `steps` training steps after the first (each on a mini-batch gathered from a
    resident training set by per-model random indices, as an epoch does), an evaluation pass of
    `eval_chunk` samples through the loss and error arithmetic of the real evaluation, and the
    set-up. Random data of `input_shape`; nothing is written."""
    if steps < 1:
        raise ValueError(f"steps={steps}: must be ≥ 1")
    g = torch.Generator().manual_seed(0)
    fake = DataSplits("timing", num_classes, Split(torch.zeros(2, *input_shape), torch.zeros(2, dtype=torch.long)),
                      None, Split(torch.zeros(2, *input_shape), torch.zeros(2, dtype=torch.long)))
    configs = [s.config for s in batch]
    start = time.perf_counter()
    recipes = [resolve_recipe(c) for c in configs]
    stack = StackedModels([build_model(c, fake) for c in configs], device=configs[0].device)
    optimizer = StackedOptimizer(stack, recipes, compile=compile)
    step = StackedStep(stack, optimizer, compile=compile)
    built = time.perf_counter() - start
    n, size = stack.n, recipes[0].batch_size
    features = int(torch.tensor(input_shape).prod())
    pool = torch.rand(4 * size, features, generator=g).to(stack.device)  # a small resident "training set"
    labels = torch.randint(0, num_classes, (4 * size,), generator=g).to(stack.device)
    # Small learning rates: timing must not run into non-finite values (which change the arithmetic's speed).
    optimizer.param_groups[0]["lr"] = torch.full((n, 1), 1e-4, dtype=stack.flat.dtype, device=stack.device)
    times = []
    for _ in range(steps + 1):
        index = torch.randint(0, len(pool), (n, size), generator=g).to(stack.device)
        began = time.perf_counter()
        step(pool[index], labels[index])
        times.append(time.perf_counter() - began)
    step_s = sorted(times[1:])[len(times[1:]) // 2]
    x = torch.rand(eval_chunk, features, generator=g).to(stack.device)
    y = torch.randint(0, num_classes, (eval_chunk,), generator=g).to(stack.device)

    def evaluate() -> None:  # the arithmetic of train.stack's evaluation of one chunk
        logits = stack.forward_logits(x, training=False)
        yy = y.unsqueeze(0).expand(n, -1)
        F.cross_entropy(logits, yy, reduction="none").sum(1, dtype=torch.float64)
        ((logits.argmax(dim=1) != yy) | ~torch.isfinite(logits).all(dim=1)).sum(1).tolist()

    with torch.no_grad():
        evaluate()
        began = time.perf_counter()
        evaluate()
        eval_s = (time.perf_counter() - began) / eval_chunk
    return BatchTiming(step_s, eval_s, built + max(0.0, times[0] - step_s))


def makespan(durations: Sequence[float], workers: int) -> float:
    """Wall time of jobs of `durations` handed, in order, to the first of `workers` that is free
    (what run_stacked's process pool does)."""
    free = [0.0] * max(1, workers)
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def batch_seconds(timing: BatchTiming, epochs: int, steps_per_epoch: int, eval_samples: int) -> dict[str, float]:
    """A batch's projected seconds from its timing: per epoch, `steps_per_epoch` steps and
    `eval_samples` evaluated samples; in all, the set-up once and `epochs` epochs."""
    epoch_s = timing.step_s * steps_per_epoch + timing.eval_s * eval_samples
    return {"epoch_s": epoch_s, "total_s": timing.setup_s + epoch_s * epochs}


def batch_overhead_s(batch: Sequence[RunSpec], data: DataSplits, timing: BatchTiming) -> float:
    """Seconds a batch costs beyond its steps and evaluations (checking the configs, building the
    models, writing every run directory's results, model and checkpoint files): measured by really
    training the batch for one epoch on two mini-batches of `data` into a temporary folder, less
    what `timing` gives for those steps and evaluations."""
    import tempfile

    recipe = resolve_recipe(batch[0].config)
    m = 2 * recipe.batch_size

    def head(split: Split) -> Split:
        return Split(split.x[:m], split.y[:m])

    tiny = DataSplits(data.name, data.num_classes, head(data.train), head(data.val) if data.val is not None else None,
                      head(data.test))
    configs = [dataclasses.replace(s.config, epochs=1, device="cpu") for s in batch]
    with tempfile.TemporaryDirectory(prefix="throughway-estimate-") as folder:
        began = time.perf_counter()
        train_stacked(configs, [Path(folder) / s.name for s in batch], progress=False, data=tiny)
        wall = time.perf_counter() - began
    evaluated = len(tiny.test) + (len(tiny.val) if tiny.val is not None else 0)
    return max(0.0, wall - 2 * timing.step_s - evaluated * timing.eval_s)


def _step_seconds(batch: list[RunSpec], threads: int, input_shape: tuple[int, ...], num_classes: int) -> float:
    # in a worker process: the batch's step time with `threads` threads, as time_batch measures it
    torch.set_num_threads(threads)
    return time_batch(batch, 8, input_shape=input_shape, num_classes=num_classes).step_s


def contention(batch: Sequence[RunSpec], jobs: int, threads: int, input_shape: tuple[int, ...],
               num_classes: int) -> float:
    """How much slower a step of `batch` is when `jobs` workers train at once than when one does
    (≥ 1): the workers share the cores' memory bandwidth and caches, and on a busy machine the cores
    themselves. Measured by timing the batch's steps in `jobs` spawned processes at once and in one."""
    if jobs < 2:
        return 1.0
    context = multiprocessing.get_context("spawn")
    args = (list(batch), threads, input_shape, num_classes)
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        list(pool.map(_step_seconds, *[[a] * jobs for a in args]))  # start and warm every worker first
        alone = pool.submit(_step_seconds, *args).result()
        together = list(pool.map(_step_seconds, *[[a] * jobs for a in args]))
    return max(1.0, sorted(together)[len(together) // 2] / alone)


def worker_start_s() -> float:
    """Seconds a fresh worker process of `run_stacked` (spawned) takes to start and import the toolkit:
    measured by starting one."""
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import throughway.study.stacking"], check=True, capture_output=True)
    return time.perf_counter() - began


# Below this many seconds of projected steps, evaluations and set-ups (a --quick study), project_batches
# does not spend the extra measurements (the workers' contention, a one-epoch run per batch and a fresh
# process's start: about 15 s on 2 cores) that would cost half as much as the study they project.
SHORT_STUDY_S = 300.0


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc; None elsewhere): a stand-in for a fresh worker's
    start and imports, which this process has just paid itself."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return max(0.0, float(f.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return None


def project_batches(specs: Sequence[RunSpec], jobs: int = 1, steps: int = 4, max_batch: int = 64,
                    compile: bool | None = None, shard: str | None = None,
                    measure_all: bool | None = None) -> dict[str, Any]:
    """Project how long `run_stacked(specs, jobs=jobs)` takes on this machine without training: time
    every batch (`time_batch`, with the threads a worker of `jobs` gets), scale it to the configs'
    epochs and data sizes (`batch_seconds`), hand the batches, in run_stacked's order, to `jobs`
    workers (`makespan`), and add the fixed costs: a process's start (`worker_start_s`) and loading
    the data (timed here), with jobs > 1 again for each worker. Each batch's set-up is measured by a
    real one-epoch run on two mini-batches (`batch_overhead_s`); with jobs > 1 the step and
    evaluation times are scaled by the measured slowdown of workers training at once (`contention`). A batch that `run_stacked` would
    compile (`compiles`) is timed compiled, its compilation included in its set-up (minutes). Assumes the machine is otherwise
    as busy as while measuring and that no model diverges (a diverged model leaves its batch: an
    upper bound); the study's own reporting after each batch is not included. `shard` 'i/N' projects
    only the batches that shard trains (`run_stacked(..., shard=...)`).

    `measure_all` False (None: when the timed steps, evaluations and set-ups project less than
    SHORT_STUDY_S) skips the three measurements that cost seconds each whatever the study's size, so
    that the estimate of a short study costs a small fraction of it: the contention is then taken as
    1 (none), each batch's set-up as `time_batch` measured it (no one-epoch run), and a worker's start
    as this process's own age (`_process_age_s`). The result's "measured_all" says which was done.

    Returns {"jobs", "threads_per_job", "train_images", "eval_images", "batches": [{"batch": the
    specs, "models", "step_s", "setup_s", "epoch_s", "total_s"}], "fixed_s", "serial_s", "wall_s",
    "load_average", "contention", "measured_all"}.
    """
    from ..train.loop import epoch_starts

    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be ≥ 1")
    first = specs[0].config
    began = time.perf_counter()
    data = load_dataset(first.dataset, first.data_dir, train_on_full=first.train_on_full, device="cpu",
                        limit=first.limit)
    load_s = time.perf_counter() - began
    n_train, n_eval = len(data.train), len(data.test) + (len(data.val) if data.val is not None else 0)
    batches = select_shard(group_specs(specs, max_batch), shard)
    if not batches:
        raise ValueError(f"--shard {shard}: this shard has no batch to train (the study has fewer batches than "
                         f"shards)")
    jobs = min(jobs, max(1, len(batches)))  # as run_stacked: no more workers than batches
    threads = worker_threads(jobs)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    timed: list[tuple[list[RunSpec], bool, BatchTiming]] = []
    try:
        for batch in batches:
            compiled = compiles(batch, compile, n_train)
            timed.append((batch, compiled, time_batch(batch, steps, input_shape=tuple(data.input_shape),
                                                      num_classes=data.num_classes, compile=compiled)))

        def seconds_of(batch: list[RunSpec], timing: BatchTiming) -> dict[str, float]:
            recipe = resolve_recipe(batch[0].config)
            return batch_seconds(timing, recipe.epochs, len(epoch_starts(n_train, recipe.batch_size)), n_eval)

        if measure_all is None:
            measure_all = sum(seconds_of(b, t)["total_s"] for b, _, t in timed) >= SHORT_STUDY_S
        # workers training at once slow each other down: measured on the largest batch, applied to all
        slowdown = contention(max(batches, key=len), jobs, threads, tuple(data.input_shape), data.num_classes) \
            if measure_all else 1.0
        rows: list[dict[str, Any]] = []
        for batch, compiled, timing in timed:
            timing = dataclasses.replace(timing, step_s=timing.step_s * slowdown, eval_s=timing.eval_s * slowdown)
            if measure_all:
                # the set-up: what time_batch measured (and its compilation), or a real one-epoch run's
                # extra costs beyond steps and evaluation, whichever is larger
                timing = dataclasses.replace(timing, setup_s=max(timing.setup_s, batch_overhead_s(batch, data, timing)))
            rows.append({"batch": batch, "models": len(batch), "compiled": compiled, "step_s": timing.step_s,
                         "setup_s": timing.setup_s, **seconds_of(batch, timing)})
    finally:
        torch.set_num_threads(previous)
    # this process's start and data load; with jobs > 1 each worker's start and data load too
    age = None if measure_all else _process_age_s()
    start_s = worker_start_s() if age is None else age
    fixed = start_s + load_s + (start_s + load_s if jobs > 1 else 0.0)
    return {"jobs": jobs, "threads_per_job": threads, "train_images": n_train, "eval_images": n_eval,
            "batches": rows, "fixed_s": fixed, "contention": slowdown, "measured_all": measure_all,
            "serial_s": fixed + sum(r["total_s"] for r in rows),
            "wall_s": fixed + makespan([float(r["total_s"]) for r in rows], jobs), "load_average": os.getloadavg()[0]}


def add_estimate_options(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """The options of a batched study: one per `config_cls` field (study.options), and --estimate,
    which trains nothing and prints the study's `estimate_text` (the projection above) instead."""
    add_options(parser, config_cls)
    parser.add_argument("--estimate", action="store_true",
                        help="train nothing: time a few steps of every batch and print the projected duration "
                             "for --jobs workers")


def projection_markdown(title: str, projection: dict[str, Any],
                        columns: Sequence[tuple[str, Callable[[dict[str, Any]], str]]], note: str = "") -> str:
    """A `project_batches` result as markdown: `title` with the machine's setting (and a warning when
    it was busy), one row per batch (the given `columns`, then seconds per step, per epoch and for all
    epochs, its set-up included), the fixed costs, and last the projected serial and wall times
    (`note` after the latter). The table's columns and the last line's start are those that
    estimates committed under results/ have."""
    e = projection
    cores = os.cpu_count() or 1
    lines = [f"{title}; {e['jobs']} worker(s) of {e['threads_per_job']} thread(s); measured with load average "
             f"{e['load_average']:.2f}", ""]
    if e["load_average"] > cores:
        lines += [f"The machine was busy while measuring (load average {e['load_average']:.1f} on {cores} cores): "
                  f"on a shared machine a step's time varies many-fold with the load, so the projection holds only "
                  f"for the same load; measure on a quiet machine.", ""]
    lines += table_header([c for c, _ in columns] + ["s per step", "s per epoch", "s for all epochs"])
    for r in e["batches"]:
        cells = [f(r) for _, f in columns] + [f"{r['step_s']:.3f}" + (" (compiled)" if r.get("compiled") else ""),
                                              f"{r['epoch_s']:.1f}", f"{r['total_s']:.0f}"]
        lines.append(table_row(cells))
    setup = sum(r.get("setup_s", 0.0) for r in e["batches"])
    lines += ["", f"Included: each batch's set-up (building, first step, compilation, files; {setup:.0f} s in all), "
                  f"fixed costs (process starts, data loads, the study's reports; {e.get('fixed_s', 0.0):.0f} s), and "
                  + (f"the slowdown of {e['jobs']} worker(s) training at once (×{e.get('contention', 1.0):.2f}, measured)."
                     if e.get("measured_all", True) else
                     f"no slowdown of workers training at once: a short study (under {SHORT_STUDY_S / 60:.0f} min of "
                     f"steps) is projected without the measurements that would cost a large share of it (the "
                     f"workers' contention, a one-epoch run per batch, a fresh process's start)."),
              "", f"serial sum {_duration(e['serial_s'])}; projected wall time with {e['jobs']} worker(s): "
                  f"{_duration(e['wall_s'])}{note}"]
    return "\n".join(lines) + "\n"


def depth_study_markdown(name: str, grid: str, seeds: int, epochs: int, projection: dict[str, Any],
                         columns: Sequence[tuple[str, Callable[[dict[str, Any]], str]]] = ()) -> str:
    """`projection_markdown` for a study of stacked MLPs by depth (mnist-depth, gate-family): the title
    names the study, its `grid` (e.g. "3 architectures x 5 depths"), seeds, epochs and images; each row
    its depth, then `columns`, then the models in its batch."""
    e = projection
    title = (f"Projected cost of the {name} study: {grid} x {seeds} seeds, {epochs} epochs, {e['train_images']} "
             f"training images (+ {e['eval_images']} evaluated per epoch)")
    return projection_markdown(title, e, [("d", lambda r: str(r["batch"][0].config.depth)), *columns,
                                          ("models in batch", lambda r: str(r["models"]))])


def _duration(seconds: float) -> str:
    """Seconds as a reader wants them: "45 s", "12.3 min", "2.05 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


_DATA_CACHE: dict[tuple[Any, ...], Any] = {}


def _data_for(config: Any) -> Any:
    # Batches of one study share their data set: load it once per process.
    key = (config.dataset, config.data_dir, config.train_on_full, config.device, config.limit)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = load_dataset(config.dataset, config.data_dir, train_on_full=config.train_on_full,
                                        device=config.device, limit=config.limit)
    return _DATA_CACHE[key]


def _finished_runs(specs: Sequence[RunSpec], out: str | os.PathLike[str]) -> set[str]:
    """The names of `specs` whose run folder under `out` holds a finished run (results.json with a final
    record): what a resumed study skips. A file that cannot be read counts as unfinished."""
    finished = set()
    for spec in specs:
        with contextlib.suppress(OSError, ValueError):
            if (Path(out) / spec.name / RESULTS_FILE).is_file() and read_results(Path(out) / spec.name).get("final"):
                finished.add(spec.name)
    return finished


def _batch_worker(batch: list[RunSpec], out: str, resume: bool, threads: int, progress: bool,
                  compile: bool | None = None) -> list[tuple[list[str], str | None]]:
    """Train `batch` (train_stacked); return (names, error or None) per outcome: the batch's, and on
    resume one per finished run whose model file is damaged beyond rebuilding (it fails alone)."""
    torch.set_num_threads(threads)
    names = [s.name for s in batch]
    try:
        damaged = damaged_finished_runs(batch, out) if resume else {}
        if damaged:  # each damaged finished run fails alone; its batch-mates go on (one bad file must not
            # cost the other runs of its stack)
            rest = [s for s in batch if s.name not in damaged]
            outcomes: list[tuple[list[str], str | None]] = [([name], error) for name, error in damaged.items()]
            return outcomes + (_batch_worker(rest, out, resume, threads, progress, compile) if rest else [])
        compile = compiles(batch, compile, len(_data_for(batch[0].config).train))
        if progress:
            what = "compiling its step first (minutes), then training" if compile else "training"
            _say(f"[batch of {len(batch)}: {names[0]} ...] {what}")
        train_stacked([s.config for s in batch], [Path(out) / s.name for s in batch], resume=resume, progress=progress,
                      data=_data_for(batch[0].config), compile=compile)
        return [(names, None)]
    except Exception as exc:  # noqa: BLE001 - one failed batch must not stop the study
        return [(names, f"{type(exc).__name__}: {exc}")]


def _say(line: str) -> None:
    """A progress line on stderr that does not break a study's progress bar."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
    sys.stderr.flush()


def run_work(config: Any) -> float:
    """A run's work in the units `StudyProgress` estimates time from: its parameter count times its
    epochs (the model built on the meta device: no memory). A step's arithmetic, forward, backward and
    the evaluation alike, grows with the parameter count, and the runs of a study read the same data.
    Not exact: many small layers cost more per parameter (results/mnist-depth: the depth-100 stack's
    epoch took 11.5 times the depth-2 one's, for 6.8 times the parameters), so while a study's deepest
    runs go first the time left errs long, by less than a factor of 2, where counting runs as equal
    promised more than twice the time (the quick MNIST depth study, after its depth-100 batch)."""
    from ..data.cache import DATASET_SHAPES
    from ..data.loader import TEXT_DATASETS
    from ..models import create_model
    from ..train.config import model_kwargs_for

    shape, classes = DATASET_SHAPES[config.dataset] if config.dataset in DATASET_SHAPES else \
        ((), TEXT_DATASETS[config.dataset])
    with torch.device("meta"):
        model = create_model(config.model, **model_kwargs_for(config, shape, classes))
    return float(sum(p.numel() for p in model.parameters()) * resolve_recipe(config).epochs)


class StudyProgress:
    """One progress bar over a study's runs, advanced as each batch ends: the runs done, the time
    elapsed and the time left. On a terminal it is a live tqdm bar; otherwise (a log file) one line per
    finished batch in the same format. `enabled=False` (--quiet) prints nothing.

    The time left is measured, never guessed: it appears once a batch has trained (before that the bar
    says so), and it is the seconds per unit of work measured so far times the work left, where a run's
    work is `run_work` (the caller passes each batch's). Counting runs instead would be far off: a
    study trains its deepest (costliest) runs first, so the first batches would promise far more time
    than the study takes. Without `work` every run counts as one unit. A run finished before this process
    started (a resumed study: `done_before`) counts as done but neither as work nor as time."""

    def __init__(self, total: int, label: str = "study", enabled: bool = True, stream: Any = None,
                 total_work: float | None = None, done_before: int = 0) -> None:
        from tqdm import tqdm

        self.total, self.label, self.enabled = total, label, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.done = done_before
        self.total_work = float(total - done_before) if total_work is None else float(total_work)
        self.work_done = 0.0
        self.start = time.monotonic()
        live = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar = tqdm(total=total, initial=done_before, desc=label, unit="run", file=self.stream,
                         dynamic_ncols=True, bar_format=self.BAR_FORMAT, postfix=self._estimate()) if live else None

    # tqdm's own rate and time left count runs as equal: replaced by `_estimate` in the postfix
    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed} elapsed{postfix}]"

    def remaining_s(self) -> float | None:
        """Seconds left at the rate measured so far (work per second), or None before any work is done."""
        if self.work_done <= 0:
            return None
        elapsed = time.monotonic() - self.start
        return elapsed * max(0.0, self.total_work - self.work_done) / self.work_done

    def _estimate(self, note: str = "") -> str:
        from tqdm import tqdm

        left = self.remaining_s()
        estimate = "time left: after the first batch" if left is None else f"{tqdm.format_interval(left)} left"
        return estimate + (f"; {note}" if note else "")

    def advance(self, runs: int, note: str = "", work: float | None = None) -> None:
        """Count `runs` more runs as finished (one batch) that did `work` (default: `runs` units), and show
        the bar."""
        from tqdm import tqdm

        self.done += runs
        self.work_done += float(runs if work is None else work)
        if self._bar is not None:
            self._bar.set_postfix_str(self._estimate(note), refresh=False)
            self._bar.update(runs)
        elif self.enabled:
            meter = tqdm.format_meter(self.done, self.total, time.monotonic() - self.start, prefix=self.label,
                                      unit="run", ncols=100, bar_format=self.BAR_FORMAT, postfix=self._estimate(note))
            print(meter, file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar (a live bar leaves its last state on screen)."""
        if self._bar is not None:
            self._bar.close()


def run_stacked(specs: Sequence[RunSpec], out: str | os.PathLike[str], *, resume: bool, jobs: int = 1,
                threads: int | None = None, progress: bool = True, max_batch: int = 64, compile: bool | None = None,
                on_done: Callable[[str, str | None], Any] | None = None,
                shard: str | None = None) -> dict[str, str | None]:
    """Train every spec into `out`/<name>, batched by `group_specs`; return {name: error or None}.

    `shard` 'i/N' trains only batches i, i + N, ... of the batches `group_specs` forms from all of
    `specs` (study.shards), so a shard is a whole number of the unsharded study's batches.

    Batches are formed from all of `specs`, finished or not, so that an interrupted batch finds its
    checkpoint again on `resume` (train_stacked skips the finished runs of a batch). With jobs > 1, batches go to `jobs` spawned processes of `threads` threads each.
    `compile` trains each batch through torch.compile (train_stacked(compile=True)); None (the
    default) compiles the batches that train at least COMPILE_MIN_STEPS steps (`compiles`).
    `on_done(name, error)` is called in this process for every run of a batch as the batch ends.
    """
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be ≥ 1")
    check_specs(specs)
    batches = select_shard(group_specs(specs, max_batch), shard)
    specs = [spec for batch in batches for spec in batch]
    check_shard_fresh([spec.name for spec in specs], out, shard, resume)
    with shard_environment(shard):
        return _run_batches(batches, out, resume=resume, jobs=jobs, threads=threads, progress=progress,
                            compile=compile, on_done=on_done)


# `run_batched`: the former name of `run_stacked`, the same function, for code written against it (the
# module's one former-name alias; the toolkit itself calls `run_stacked`).
run_batched = run_stacked


def _run_batches(batches: list[list[RunSpec]], out: str | os.PathLike[str], *, resume: bool, jobs: int,
                 threads: int | None, progress: bool, compile: bool | None,
                 on_done: Callable[[str, str | None], Any] | None) -> dict[str, str | None]:
    specs = [spec for batch in batches for spec in batch]
    prepare_data([spec.config for spec in specs])
    jobs = min(jobs, max(1, len(batches)))
    if threads is None:
        threads = worker_threads(jobs)
    errors: dict[str, str | None] = {}
    # the work each run still has to do (none for a run finished before: a resumed study)
    finished = _finished_runs(specs, out) if resume else set()
    work: dict[str, float] = {}
    for batch in batches:
        each = run_work(batch[0].config)  # a batch's members share the model's shape and the epochs (group_specs)
        work.update({spec.name: 0.0 if spec.name in finished else each for spec in batch})
    bar = StudyProgress(len(specs), f"{Path(out).parent.name or 'study'}: runs", enabled=progress,
                        total_work=sum(work.values()), done_before=len(finished))

    def done(names: list[str], error: str | None) -> None:
        for name in names:
            errors[name] = error
            if on_done is not None:
                on_done(name, error)
        trained = [name for name in names if name not in finished]
        bar.advance(len(trained), f"batch {names[0]} ... " + ("failed" if error else "done"),
                    work=sum(work[name] for name in trained))

    try:
        if jobs == 1:
            for batch in batches:
                for outcome in _batch_worker(batch, str(out), resume, threads, progress, compile):
                    done(*outcome)
            return errors
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [pool.submit(_batch_worker, batch, str(out), resume, threads, progress, compile)
                       for batch in batches]
            for future in concurrent.futures.as_completed(futures):
                for outcome in future.result():
                    done(*outcome)
        return errors
    finally:
        bar.close()
