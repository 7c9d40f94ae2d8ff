"""Running a study's runs as batches of models trained together (`throughway.train.batched`).

Runs whose configs share `batch_key` and the recipe's shared fields (same model shape, data,
optimiser kind, batch size, epochs) train as one batched computation; the others go in other
batches. Batches are independent, so `jobs` > 1 spreads them over spawned worker processes as
`run_many` does for single runs. Each run still gets its own ordinary run directory.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import heapq
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..data import DataSplits, Split, load_dataset
from ..train.batched import (PER_MODEL_RECIPE_FIELDS, BatchedOptimizer, BatchedStep, StackedModels, batch_key,
                             train_batched)
from ..train.runner import build_model, resolve_recipe
from .options import add_options
from .runs import RunSpec, check_specs, prepare_data, worker_threads

__all__ = ["group_specs", "run_batched", "time_batch", "makespan", "project_batches", "projection_markdown",
           "add_estimate_options"]


def group_specs(specs: Sequence[RunSpec], max_batch: int = 64) -> list[list[RunSpec]]:
    """Partition `specs` into batches of at most `max_batch` runs that can train together, in the
    order of their first member in `specs` (so a study's deepest-first order is kept)."""
    if max_batch < 1:
        raise ValueError(f"max_batch={max_batch}: must be ≥ 1")
    groups: dict[Any, list[RunSpec]] = {}
    for spec in specs:
        recipe = resolve_recipe(spec.config).to_dict()
        key = (batch_key(spec.config), tuple((f, str(recipe[f])) for f in sorted(recipe) if f not in PER_MODEL_RECIPE_FIELDS))
        groups.setdefault(key, []).append(spec)
    out = []
    for members in groups.values():
        out += [members[i:i + max_batch] for i in range(0, len(members), max_batch)]
    return out


def time_batch(batch: Sequence[RunSpec], steps: int = 4, input_shape: tuple[int, ...] = (784,),
               num_classes: int = 10, eval_chunk: int = 2500) -> tuple[float, float]:
    """Measure, on this machine with the current thread setting, the batch's seconds per training step
    (all its models, the median of `steps` steps after one warm-up, random data of `input_shape`)
    and its seconds per evaluated sample (a forward pass of `eval_chunk` samples in evaluation
    mode): the two numbers that scale to an epoch. Nothing is written."""
    if steps < 1:
        raise ValueError(f"steps={steps}: must be ≥ 1")
    g = torch.Generator().manual_seed(0)
    fake = DataSplits("timing", num_classes, Split(torch.zeros(2, *input_shape), torch.zeros(2, dtype=torch.long)),
                      None, Split(torch.zeros(2, *input_shape), torch.zeros(2, dtype=torch.long)))
    configs = [s.config for s in batch]
    recipes = [resolve_recipe(c) for c in configs]
    stack = StackedModels([build_model(c, fake) for c in configs], device=configs[0].device)
    step = BatchedStep(stack, BatchedOptimizer(stack, recipes))
    n, size = stack.n, recipes[0].batch_size
    features = int(torch.tensor(input_shape).prod())
    # Small learning rates: timing must not run into non-finite values (which change the arithmetic's speed).
    lr = torch.full((n, 1), 1e-4, device=stack.device)
    times = []
    for _ in range(steps + 1):
        x = torch.rand(n, size, features, generator=g).to(stack.device)
        y = torch.randint(0, num_classes, (n, size), generator=g).to(stack.device)
        start = time.perf_counter()
        step(x, y, lr)
        times.append(time.perf_counter() - start)
    x = torch.rand(eval_chunk, features, generator=g).to(stack.device)
    with torch.no_grad():
        stack.forward_logits(x, training=False)
        start = time.perf_counter()
        stack.forward_logits(x, training=False)
        per_sample = (time.perf_counter() - start) / eval_chunk
    return sorted(times[1:])[len(times[1:]) // 2], per_sample


def makespan(durations: Sequence[float], workers: int) -> float:
    """Wall time of jobs of `durations` handed, in order, to the first of `workers` that is free
    (what run_batched's process pool does)."""
    free = [0.0] * max(1, workers)
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def project_batches(specs: Sequence[RunSpec], jobs: int = 1, steps: int = 4, max_batch: int = 64) -> dict[str, Any]:
    """Project how long `run_batched(specs, jobs=jobs)` takes on this machine without training: time
    `steps` training steps and one evaluation pass of every batch (`time_batch`, with the threads a
    worker of `jobs` gets), scale them to the configs' epochs and data sizes, and hand the batches,
    in run_batched's order, to `jobs` workers (`makespan`). Assumes the machine is otherwise quiet and
    that no model diverges (a diverged model leaves its batch: the projection is an upper bound).

    Returns {"jobs", "threads_per_job", "train_images", "eval_images", "batches": [{"batch": the
    specs, "models", "step_s", "epoch_s", "total_s"}], "serial_s", "wall_s", "load_average"}.
    """
    from ..train.batched import epoch_starts

    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be ≥ 1")
    first = specs[0].config
    data = load_dataset(first.dataset, first.data_dir, train_on_full=first.train_on_full, device="cpu",
                        limit=first.limit)
    n_train, n_eval = len(data.train), len(data.test) + (len(data.val) if data.val is not None else 0)
    threads = worker_threads(jobs)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    try:
        for batch in group_specs(specs, max_batch):
            config = batch[0].config
            recipe = resolve_recipe(config)
            step_s, eval_s = time_batch(batch, steps, input_shape=tuple(data.input_shape), num_classes=data.num_classes)
            epoch_s = step_s * len(epoch_starts(n_train, recipe.batch_size)) + eval_s * n_eval
            rows.append({"batch": batch, "models": len(batch), "step_s": step_s, "epoch_s": epoch_s,
                         "total_s": epoch_s * recipe.epochs})
    finally:
        torch.set_num_threads(previous)
    return {"jobs": jobs, "threads_per_job": threads, "train_images": n_train, "eval_images": n_eval,
            "batches": rows, "serial_s": sum(r["total_s"] for r in rows),
            "wall_s": makespan([float(r["total_s"]) for r in rows], jobs), "load_average": os.getloadavg()[0]}


def add_estimate_options(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """The options of a batched study: one per `config_cls` field (study.options), and --estimate,
    which trains nothing and prints the study's `estimate_text` (the projection above) instead."""
    add_options(parser, config_cls)
    parser.add_argument("--estimate", action="store_true",
                        help="train nothing: time a few steps of every batch and print the projected duration "
                             "for --jobs workers")


def projection_markdown(title: str, projection: dict[str, Any],
                        columns: Sequence[tuple[str, Callable[[dict[str, Any]], str]]], note: str = "") -> str:
    """A `project_batches` result as markdown: `title` with the machine's setting, one row per batch
    (the given `columns`, then seconds per step, per epoch and for all epochs), and the projected
    serial and wall times (`note` after the latter)."""
    e = projection
    lines = [f"{title}; {e['jobs']} worker(s) of {e['threads_per_job']} thread(s); measured with load average "
             f"{e['load_average']:.2f}", "",
             "| " + " | ".join([c for c, _ in columns] + ["s per step", "s per epoch", "s for all epochs"]) + " |",
             "|" + "---|" * (len(columns) + 3)]
    for r in e["batches"]:
        cells = [f(r) for _, f in columns] + [f"{r['step_s']:.3f}", f"{r['epoch_s']:.1f}", f"{r['total_s']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"serial sum {e['serial_s'] / 3600:.2f} h; projected wall time with {e['jobs']} worker(s): "
                  f"{e['wall_s'] / 3600:.2f} h{note}"]
    return "\n".join(lines) + "\n"


_DATA_CACHE: dict[tuple[Any, ...], Any] = {}


def _data_for(config: Any) -> Any:
    # Batches of one study share their data set: load it once per process.
    key = (config.dataset, config.data_dir, config.train_on_full, config.device, config.limit)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = load_dataset(config.dataset, config.data_dir, train_on_full=config.train_on_full,
                                        device=config.device, limit=config.limit)
    return _DATA_CACHE[key]


def _batch_worker(batch: list[RunSpec], out: str, resume: bool, threads: int, progress: bool,
                  compile: bool = False) -> tuple[list[str], str | None]:
    torch.set_num_threads(threads)
    names = [s.name for s in batch]
    try:
        if progress:  # --quiet prints nothing (issue 25, finding 16)
            print(f"[batch of {len(batch)}: {names[0]} ...] start", file=sys.stderr, flush=True)
        train_batched([s.config for s in batch], [Path(out) / s.name for s in batch], resume=resume, progress=progress,
                      data=_data_for(batch[0].config), compile=compile)
        if progress:
            print(f"[batch of {len(batch)}: {names[0]} ...] done", file=sys.stderr, flush=True)
        return names, None
    except Exception as exc:  # noqa: BLE001 - one failed batch must not stop the study
        return names, f"{type(exc).__name__}: {exc}"


def run_batched(specs: Sequence[RunSpec], out: str | os.PathLike[str], *, resume: bool, jobs: int = 1,
                threads: int | None = None, progress: bool = True, max_batch: int = 64, compile: bool = False,
                on_done: Callable[[str, str | None], Any] | None = None) -> dict[str, str | None]:
    """Train every spec into `out`/<name>, batched by `group_specs`; return {name: error or None}.

    Batches are formed from all of `specs`, finished or not, so that an interrupted batch finds its
    checkpoint again on `resume` (train_batched skips the finished runs of a batch). With jobs > 1, batches go to `jobs` spawned processes of `threads` threads each.
    `compile` trains each batch through torch.compile (train_batched(compile=True)).
    `on_done(name, error)` is called in this process for every run of a batch as the batch ends.
    """
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be ≥ 1")
    check_specs(specs)
    batches = group_specs(specs, max_batch)
    prepare_data([spec.config for spec in specs])
    jobs = min(jobs, max(1, len(batches)))
    if threads is None:
        threads = worker_threads(jobs)
    errors: dict[str, str | None] = {}

    def done(names: list[str], error: str | None) -> None:
        for name in names:
            errors[name] = error
            if on_done is not None:
                on_done(name, error)

    if jobs == 1:
        for batch in batches:
            done(*_batch_worker(batch, str(out), resume, threads, progress, compile))
        return errors
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_batch_worker, batch, str(out), resume, threads, progress, compile) for batch in batches]
        for future in concurrent.futures.as_completed(futures):
            done(*future.result())
    return errors
