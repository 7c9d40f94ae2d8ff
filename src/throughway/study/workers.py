"""Training a study's runs in worker processes: `run_many` (each run alone, in parallel), the threads each
worker takes, the data prepared once before any worker starts, and the finished runs whose files are damaged.

Runs of a study are independent, so `run_many` can spread them over worker processes (`jobs`),
each limited to `threads` intra-op threads. For the MNIST studies' width-50 models per-operation
overhead dominates, so two single-threaded processes train about twice as fast as one process
with two threads on a 2-core machine. (study.stacking trains runs as stacks of models instead.)
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..train import RESULTS_FILE, RunConfig, read_results, run_training
from .shards import check_shard_fresh, select_shard, shard_environment
from .spec import RunSpec, check_specs

__all__ = ["run_many", "prepare_data", "damaged_finished_runs", "set_threads", "worker_threads", "THREADS_ENV"]

# The thread count that `--threads` asks for, for this process and every worker it starts (a run re-runs
# bit for bit only with the thread count it was trained with; results.json records it).
THREADS_ENV = "THROUGHWAY_THREADS"


def set_threads(threads: int) -> None:
    """Train with `threads` intra-op threads here and in every worker process a study starts
    (`worker_threads`), as `--threads` asks: sets torch's count and $THROUGHWAY_THREADS."""
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"--threads {threads!r}: must be a positive integer")
    torch.set_num_threads(threads)
    os.environ[THREADS_ENV] = str(threads)


def worker_threads(jobs: int) -> int:
    """Intra-op threads of each of `jobs` worker processes: $THROUGHWAY_THREADS where set (`--threads`),
    else cpu_count // jobs (at least 1) with jobs > 1, else this process's torch thread count."""
    text = os.environ.get(THREADS_ENV)
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"${THREADS_ENV}={text!r}: must be a positive integer (the --threads option sets it)")
        return int(text)
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else torch.get_num_threads()


def damaged_finished_runs(specs: Sequence[RunSpec], out: str | os.PathLike[str]) -> dict[str, str]:
    """{name: error} of the finished runs of `specs` (results.json final) whose model file is missing or
    damaged and cannot be rebuilt from a checkpoint (`train.run.check_finished_model` rebuilds it where it
    can), each error saying how to retrain that run alone: checked run by run, so
    that a damaged run fails alone, never its batch-mates."""
    from ..train.rundir import RunDir
    from ..train.run import check_finished_model

    damaged: dict[str, str] = {}
    for spec in specs:
        run_dir = Path(out) / spec.name
        if not (run_dir / RESULTS_FILE).is_file():
            continue
        try:
            results = read_results(run_dir)
            if results.get("final") is not None:
                check_finished_model(RunDir(run_dir), results, advice=(
                    f"delete the run's folder {run_dir} and rerun the study with --resume: only that run is trained "
                    f"again (another --out would train the whole study again)"))
        except ValueError as exc:
            damaged[spec.name] = f"{type(exc).__name__}: {exc}"
    return damaged


def _worker(spec: RunSpec, out: str, resume: bool, threads: int, progress: bool,
            after: Callable[[RunSpec, Path], Any] | None = None) -> tuple[str, str | None]:
    torch.set_num_threads(threads)
    try:
        if resume and spec.name in (damaged := damaged_finished_runs([spec], out)):
            return spec.name, damaged[spec.name]
        if progress:  # --quiet prints nothing
            print(f"[{spec.name}] start", file=sys.stderr, flush=True)
        run_training(spec.config, Path(out) / spec.name, resume=resume, progress=progress)
        if after is not None:  # the study's own analysis of the run, in the worker that trained it
            after(spec, Path(out) / spec.name)
        if progress:
            print(f"[{spec.name}] done", file=sys.stderr, flush=True)
        return spec.name, None
    except Exception as exc:  # noqa: BLE001 - one failed run must not stop the study
        return spec.name, f"{type(exc).__name__}: {exc}"


def prepare_data(configs: Sequence[RunConfig]) -> None:
    """Fetch, verify and cache every dataset that `configs` train on, once, in this process.

    Worker processes then only read the verified cache: they do not race to fetch the same files,
    and a missing dataset is one clear error before any worker starts instead of one per run.
    """
    from ..data import load_arrays
    from ..data.loader import TEXT_DATASETS, load_text_dataset

    for dataset, data_dir in sorted({(c.dataset, c.data_dir) for c in configs}, key=str):
        if dataset in TEXT_DATASETS:
            load_text_dataset(dataset, data_dir)  # fetched, checked and cached once (shakespeare-char)
        else:
            load_arrays(dataset, data_dir)


def run_many(specs: Sequence[RunSpec], out: str | os.PathLike[str], *, resume: bool, jobs: int = 1,
             threads: int | None = None, progress: bool = True,
             on_done: Callable[[str, str | None], Any] | None = None,
             shard: str | None = None, after: Callable[[RunSpec, Path], Any] | None = None) -> dict[str, str | None]:
    """Run every spec into `out`/<name>; return {name: error message or None}.

    With jobs > 1 the runs go to a pool of `jobs` spawned processes, each with `threads` threads
    (default: cpu_count // jobs, at least 1). A run that raises is reported and the others go on.
    `on_done(name, error)` is called in this process as each run ends (e.g. to refresh a summary).
    `shard` 'i/N' trains only runs i, i + N, ... of `specs` (study.shards: each run is a batch of one).
    `after(spec, run_dir)`, a picklable function, runs in the worker once the run has finished (on
    resume too, for a run finished earlier): a study's analysis of each run, in parallel; it should skip
    what it already wrote.
    """
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be ≥ 1")
    check_specs(specs)
    specs = select_shard(specs, shard)
    check_shard_fresh([s.name for s in specs], out, shard, resume)
    with shard_environment(shard):
        return _run_many(specs, out, resume=resume, jobs=jobs, threads=threads, progress=progress, on_done=on_done,
                         after=after)


def _run_many(specs: Sequence[RunSpec], out: str | os.PathLike[str], *, resume: bool, jobs: int,
              threads: int | None, progress: bool,
              on_done: Callable[[str, str | None], Any] | None,
              after: Callable[[RunSpec, Path], Any] | None = None) -> dict[str, str | None]:
    jobs = min(jobs, max(1, len(specs)))
    if threads is None:
        threads = worker_threads(jobs)
    errors: dict[str, str | None] = {}
    prepare_data([spec.config for spec in specs])
    if jobs == 1:
        for spec in specs:
            name, error = _worker(spec, str(out), resume, threads, progress, after)
            errors[name] = error
            if on_done is not None:
                on_done(name, error)
        return errors
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_worker, spec, str(out), resume, threads, progress, after) for spec in specs]
        for future in concurrent.futures.as_completed(futures):
            name, error = future.result()
            errors[name] = error
            if on_done is not None:
                on_done(name, error)
    return errors
