"""Running a study's runs as batches of models trained together (`throughway.train.batched`).

Runs whose configs share `batch_key` and the recipe's shared fields (same model shape, data,
optimiser kind, batch size, epochs) train as one batched computation; the others go in other
batches. Batches are independent, so `jobs` > 1 spreads them over spawned worker processes as
`run_many` does for single runs. Each run still gets its own ordinary run directory.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..data import load_dataset
from ..train.batched import PER_MODEL_RECIPE_FIELDS, batch_key, train_batched
from ..train.runner import resolve_recipe
from .common import RunSpec

__all__ = ["group_specs", "run_batched"]


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


_DATA_CACHE: dict[tuple[Any, ...], Any] = {}


def _data_for(config: Any) -> Any:
    # Batches of one study share their data set: load it once per process.
    key = (config.dataset, config.data_dir, config.train_on_full, config.device, config.limit)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = load_dataset(config.dataset, config.data_dir, train_on_full=config.train_on_full,
                                        device=config.device, limit=config.limit)
    return _DATA_CACHE[key]


def _batch_worker(batch: list[RunSpec], out: str, resume: bool, threads: int, progress: bool) -> tuple[list[str], str | None]:
    torch.set_num_threads(threads)
    names = [s.name for s in batch]
    try:
        print(f"[batch of {len(batch)}: {names[0]} ...] start", file=sys.stderr, flush=True)
        train_batched([s.config for s in batch], [Path(out) / s.name for s in batch], resume=resume, progress=progress,
                      data=_data_for(batch[0].config))
        print(f"[batch of {len(batch)}: {names[0]} ...] done", file=sys.stderr, flush=True)
        return names, None
    except Exception as exc:  # noqa: BLE001 - one failed batch must not stop the study
        return names, f"{type(exc).__name__}: {exc}"


def run_batched(specs: Sequence[RunSpec], out: str | os.PathLike[str], *, resume: bool, jobs: int = 1,
                threads: int | None = None, progress: bool = True, max_batch: int = 64,
                on_done: Callable[[str, str | None], None] | None = None) -> dict[str, str | None]:
    """Train every spec into `out`/<name>, batched by `group_specs`; return {name: error or None}.

    Batches are formed from all of `specs`, finished or not, so that an interrupted batch finds its
    checkpoint again on `resume` (train_batched skips the finished runs of a batch). With jobs > 1, batches go to `jobs` spawned processes of `threads` threads each.
    `on_done(name, error)` is called in this process for every run of a batch as the batch ends.
    """
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be ≥ 1")
    batches = group_specs(specs, max_batch)
    jobs = min(jobs, max(1, len(batches)))
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else torch.get_num_threads()
    errors: dict[str, str | None] = {}

    def done(names: list[str], error: str | None) -> None:
        for name in names:
            errors[name] = error
            if on_done is not None:
                on_done(name, error)

    if jobs == 1:
        for batch in batches:
            done(*_batch_worker(batch, str(out), resume, threads, progress))
        return errors
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_batch_worker, batch, str(out), resume, threads, progress) for batch in batches]
        for future in concurrent.futures.as_completed(futures):
            done(*future.result())
    return errors
