"""Running a study's runs, and a study's resume checks (what every experiment shares).

Runs of a study are independent, so `run_many` can spread them over worker processes (`jobs`),
each limited to `threads` intra-op threads. For the MNIST studies' width-50 models per-operation
overhead dominates, so two single-threaded processes train about twice as fast as one process
with two threads on a 2-core machine.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import multiprocessing
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence, overload

import torch

from .._io import atomic_write_json, atomic_write_text, environment_info, json_safe, read_json_object
from ..train import RESULTS_FILE, RunConfig, read_results, run_training
from ..train.config import config_differences
from .options import check_stored_config
from .shards import (check_shard_fresh, is_sharded, select_shard, shard_environment, shard_states, study_lock,
                     summary_lock, write_shard_state)

__all__ = ["RunSpec", "run_many", "study_lock", "invoked_with", "damaged_finished_runs", "check_study_folder", "prepare_data", "check_specs", "command_line", "remake_report",
           "check_run_folders", "check_study_links",
           "StudySummary", "rebuild_from_runs", "stored_study", "check_same_settings", "read_runs", "read_summary", "summary_finished",
           "check_run_results", "json_config", "config_from_json", "run_status", "last_epochs_mean", "LAST_EPOCHS",
           "FINDINGS_FILE", "THREADS_ENV", "set_threads", "worker_threads"]

# The file of a study's findings in words, beside its table.md: written by the study's report (`remake_report`),
# placed by tools/readme on the study's docs page.
FINDINGS_FILE = "findings.md"

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


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: its name (the subfolder), its config."""

    name: str
    config: RunConfig


# The arguments `throughway.cli.main` parsed, while it runs (`invoked_with`); None outside it.
_INVOKED: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("throughway_invoked", default=None)


@contextlib.contextmanager
def invoked_with(argv: Sequence[str]) -> Iterator[None]:
    """While the block runs, `command_line()` is `throughway ARGV...`: the arguments `cli.main` parsed,
    which differ from the process's sys.argv when main([...]) is called from Python."""
    token = _INVOKED.set(tuple(argv))
    try:
        yield
    finally:
        _INVOKED.reset(token)


def command_line() -> str:
    """The command that made the results, shell-quoted, with the console script's name: the arguments
    `cli.main` parsed (`invoked_with`), else the process's sys.argv (a study run from Python)."""
    invoked = _INVOKED.get()
    if invoked is not None:
        return " ".join(shlex.quote(a) for a in ("throughway", *invoked))
    argv = list(sys.argv)
    if argv and (argv[0].endswith("throughway") or argv[0].endswith("__main__.py") or argv[0] == "-m"):
        argv[0] = "throughway"
    return " ".join(shlex.quote(a) for a in argv)


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


def check_specs(specs: Sequence[RunSpec]) -> None:
    """Check every run's config as `throughway train` does (`train.config.check_config`: device, dataset,
    depth, limit, recipe and its overrides, model arguments), before any data is read or any run
    starts, so that a bad study option is one error (ValueError naming the run and the field), not
    a study whose runs all fail. The model is built (on the meta device) once per batch shape
    (`batch_key`); the recipe of every run is resolved."""
    from ..train.batched import batch_key
    from ..train.config import check_config, resolve_recipe

    names = [spec.name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:  # a study list with a repeated value: refused before anything runs (it would train twice)
        raise ValueError(f"runs {', '.join(repeated)}: listed more than once (a study option repeats a value); "
                         f"accepted: each run once")
    checked: set[Any] = set()
    for spec in specs:
        try:
            key = batch_key(spec.config)
            if key not in checked:
                check_config(spec.config)
                checked.add(key)
            resolve_recipe(spec.config)
        except (ValueError, KeyError, TypeError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            raise ValueError(f"run {spec.name}: {message}") from exc


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


def read_runs(runs_dir: str | os.PathLike[str], names: Iterable[str]) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(name, its results.json) for each run `names` of a study's `runs_dir`, in order; the results are
    None for a run that has not started (a summary lists it as {"run", "state": "not started", "epochs": 0}).

    Each file is checked as `check_run_results` says, so a summary never fails on a damaged run's
    field with a bare key name: ValueError naming the file and the field."""
    for name in names:
        path = Path(runs_dir) / name / RESULTS_FILE
        yield name, check_run_results(read_results(path.parent), path) if path.is_file() else None


def _refuse_link(path: Path, what: str) -> None:
    if path.is_symlink():
        raise ValueError(f"{what}: {path} is a symbolic link (to {os.readlink(path)}); refused, nothing was read or "
                         f"written: the toolkit never writes, reads back or deletes through a link; replace it by "
                         f"a real folder or file (a copy)")


def check_study_links(out: str | os.PathLike[str]) -> None:
    """ValueError naming the link when the study folder `out`, its summary (results.json) or its runs folder
    is a symbolic link: a summary, a table or a figure written there would land wherever it points, and a
    summary read through it would be another folder's (docs/reliability.md)."""
    out = Path(out)
    _refuse_link(out, "the study folder")
    _refuse_link(out / RESULTS_FILE, "the study's summary")
    _refuse_link(out / "runs", "the study's runs folder")


def check_run_folders(runs_dir: str | os.PathLike[str], specs: Sequence[RunSpec]) -> None:
    """Check, before a summary reads any run, that each run folder `runs_dir`/<name> of `specs` holds the
    run its name stands for: ValueError naming the folder when it (or its results.json) is a symbolic
    link, or when the run config its results.json records differs from the spec's config in any field
    but those a resumed run may change (`train.config.config_differences`: model, depth, seed,
    epochs, limit, recipe and its overrides, dataset, model arguments...), naming each differing field
    with both values. A run folder copied in from a study with other options, or two swapped folders,
    would otherwise give a table cell of another run. Runs not started yet (no results.json) pass."""
    runs_dir = Path(runs_dir)
    _refuse_link(runs_dir, "the study's runs folder")
    for spec in specs:
        folder = runs_dir / spec.name
        _refuse_link(folder, f"run folder {spec.name}")
        path = folder / RESULTS_FILE
        _refuse_link(path, f"the results of run {spec.name}")
        if not path.is_file():
            continue
        differing = config_differences(read_results(folder), spec.config, path)
        if differing:
            details = "; ".join(f"{k}: recorded {old!r}, the study's {new!r}" for k, (old, new) in differing.items())
            raise ValueError(f"{folder}: holds a run of another config than the study's run {spec.name} ({details}); "
                             f"refused, nothing was written: a run folder copied from another study or renamed? "
                             f"Move it away (it is then trained again with --resume), or merge only folders of "
                             f"this study's runs")


# What a study's summary reads of each history record (`train.History`): a number or null each.
_RECORD_FIELDS = ("train_loss", "test_error_pct")


def check_run_results(results: dict[str, Any], path: Path) -> dict[str, Any]:
    """`results` (a run's results.json, already checked by `read_results`) when the fields a study
    summary reads have the types `run_training` writes: 'history' a list of records with an integer
    'epoch' and a number or null (or nothing: read as null) for 'train_loss' and 'test_error_pct',
    'diverged' a bool, 'final.k' null or a list of numbers; otherwise ValueError naming `path` and
    the field."""
    def number(value: Any) -> bool:
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))

    history = results.get("history")
    if not isinstance(history, list):
        raise ValueError(f"{path}: field 'history' is {type(history).__name__}; accepted: a list of epoch records "
                         f"(the file was edited or damaged)")
    for i, record in enumerate(history):
        bad = [key for key in _RECORD_FIELDS if not number(record.get(key))]  # a missing metric reads as null
        if not isinstance(record.get("epoch"), int) or isinstance(record.get("epoch"), bool):
            bad.insert(0, "epoch")
        if bad:
            raise ValueError(f"{path}: field 'history[{i}].{bad[0]}' is {record.get(bad[0])!r} "
                             f"({'missing' if bad[0] not in record else 'wrong type'}); accepted: "
                             f"{'an integer' if bad[0] == 'epoch' else 'a number or null'} (the file was edited or damaged)")
    if not isinstance(results.get("diverged", False), bool):
        raise ValueError(f"{path}: field 'diverged' is {results['diverged']!r}; accepted: true or false")
    k = (results.get("final") or {}).get("k")
    if not (k is None or (isinstance(k, list) and all(number(v) and v is not None for v in k))):
        raise ValueError(f"{path}: field 'final.k' is {str(k)[:60]}; accepted: null or a list of numbers")
    return results


def summary_finished(path: str | os.PathLike[str], summary: dict[str, Any]) -> bool:
    """Whether every run a study's `summary` (read from `path`) lists under 'cells' → 'runs' →
    'state' is finished or diverged; ValueError naming the file and the field when 'cells' is not a
    list of such cells (never a bare "error: cells")."""
    try:
        return all(r["state"] in ("finished", "diverged") for c in summary["cells"] for r in c["runs"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: field 'cells' is not a list of cells with their 'runs' and each run's 'state' as "
                         f"the study writes them ({type(exc).__name__}: {exc}); the file was edited or damaged: "
                         f"delete it (the runs are kept) and rerun with --resume") from exc


def read_summary(path: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """A study's summary `path` (its results.json) as an object whose 'config' (when present) is an
    object too; ValueError naming the file and the field otherwise (a file
    holding `[]` is the file's fault, said as such, not an AttributeError)."""
    summary = read_json_object(path, f"a {name} study's summary")
    if not isinstance(summary.get("config", {}), dict):
        raise ValueError(f"{path}: field 'config' holds {type(summary['config']).__name__}; accepted: an object "
                         f"(the file was edited or damaged)")
    return summary


def json_config(config: Any) -> dict[str, Any]:
    """A study's config (a dataclass) as its results.json stores it and reads it back: `asdict`, tuples as
    lists (`_io.json_safe`, the conversion every JSON file of the package goes through). The one way a
    config becomes JSON: what `check_study_folder` and `stored_study` compare with the stored config."""
    return dict(json_safe(asdict(config)))


def config_from_json(config_cls: type, stored: dict[str, Any]) -> Any:
    """The inverse of `json_config`: a `config_cls` from a stored JSON config, with the fields it knows
    (others, e.g. of a newer version, are left out) and lists as tuples."""
    known = {f.name for f in fields(config_cls)}
    return config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items() if k in known})


# "the mean of the last 10 epochs": a run's test error less sensitive to one epoch's noise.
LAST_EPOCHS = 10


def last_epochs_mean(history: Sequence[dict[str, Any]], key: str = "test_error_pct") -> float | None:
    """The mean of `key` over the last `LAST_EPOCHS` records of a run's `history` that hold it; None if none do."""
    tail = [h[key] for h in history[-LAST_EPOCHS:] if h.get(key) is not None]
    return sum(tail) / len(tail) if tail else None


def run_status(name: str, result: dict[str, Any] | None, *, diverged_at: bool = True) -> dict[str, Any]:
    """One run's line in a study summary's cell "runs": {"run", "state", "epochs"} with the state "not
    started" (no results.json: `result` None), "diverged", "finished" (a final record) or "running", and,
    with `diverged_at`, where it diverged (None unless it did). The one status loop of every study."""
    if result is None:
        return {"run": name, "state": "not started", "epochs": 0}
    state = "diverged" if result.get("diverged") else ("finished" if result.get("final") is not None else "running")
    status = {"run": name, "state": state, "epochs": len(result["history"])}
    if diverged_at:
        status["diverged_at"] = result.get("diverged_at")
    return status


def remake_report(out: str | os.PathLike[str], table_markdown: Callable[[dict[str, Any]], str],
                  figures: Sequence[tuple[Callable[[dict[str, Any], Path], Any], str]],
                  findings: Callable[[dict[str, Any]], str] | None = None) -> str:
    """Remake `out`/table.md with `table_markdown`, `out`/findings.md with `findings` (the study's findings in
    words, what its docs page shows) where given, and each (plot, file name) figure from `out`/results.json
    alone; return the table text."""
    out = Path(out)
    summary = read_summary(out / "results.json", "study")
    table = table_markdown(summary)
    atomic_write_text(out / "table.md", table)
    if findings is not None:
        atomic_write_text(out / FINDINGS_FILE, findings(summary))
    for plot, name in figures:
        plot(summary, out / name)
    return table


# A running study's summary, table and figures are rewritten at most this often as its runs end (the figures
# take seconds), and always at the end: StudySummary.for_study's default.
REFRESH_INTERVAL_S = 10.0


class StudySummary:
    """Keeps a running study's results.json, table and figures current as its runs end.

    Calling it (`refresh(name, error)`, the `on_done` hook of `run_many`/`run_batched`) records
    `error` against run `name` if there is one, rebuilds the summary with `summarize()`, adds the
    study's command line, environment and errors, writes `path` atomically and remakes the report
    with `write_report()` (not with `report=False`); it returns the summary. With `min_interval_s` > 0 a
    call that is not
    forced and comes sooner than that (or than 4 times the last write's duration) after the last write
    ended only records its error and returns None
    (a search whose batches end every few seconds need not rewrite its figure each time); the final
    call is forced, so nothing is lost, and `errors` always holds every failure.

    Shards (study.shards): the summary is made and written under the study's summary lock, so
    shards running at the same time into one folder write it in turn, each from every run on disk;
    a shard 'i/N' (N > 1) first records its finished runs and failures in its state.json, and the
    summary's 'errors' holds every shard's failures (less the runs this process has since finished)
    and 'shards' each shard's state.

    Before each summary is made, the study folder and its runs are checked as untrusted input
    (`check_study_links`; `check_run_folders` over `runs`, the study's RunSpecs, in `path`'s folder's
    runs/): a linked folder, or a run folder holding another run than its name stands for (copied in
    from a study with other options, swapped), is a ValueError naming it, and nothing is written."""

    def __init__(self, path: str | os.PathLike[str], summarize: Callable[[], dict[str, Any]],
                 write_report: Callable[[], Any], environment: dict[str, Any], *,
                 min_interval_s: float = 0.0, shard: str | None = None, runs: Sequence[RunSpec] = ()) -> None:
        self.shard = shard
        self.runs = tuple(runs)
        self.done: list[str] = []
        self.path = Path(path)
        self.summarize = summarize
        self.write_report = write_report
        self.command = command_line()
        self.environment = environment
        self.errors: dict[str, str] = {}
        self.min_interval_s = float(min_interval_s)
        self._last = -float("inf")
        self._cost = 0.0  # seconds the last write took

    @overload
    def __call__(self, name: str | None = None, error: str | None = None, *,
                 force: Literal[True] = True, report: bool = True) -> dict[str, Any]: ...

    @overload
    def __call__(self, name: str | None = None, error: str | None = None, *,
                 force: bool, report: bool = True) -> dict[str, Any] | None: ...

    def __call__(self, name: str | None = None, error: str | None = None, *,
                 force: bool = True, report: bool = True) -> dict[str, Any] | None:
        if name is not None and error:
            self.errors[name] = error
        elif name is not None:
            self.done.append(name)
        # the wait counts from the end of the last write, and is at least 4 times that write's cost: on a
        # loaded machine a rewrite (figures) takes seconds, and rewrites may not take most of the study's time
        wait = max(self.min_interval_s, 4 * self._cost) if self.min_interval_s > 0 else 0.0
        if not force and time.monotonic() - self._last < wait:
            return None
        began = time.monotonic()
        out = self.path.parent
        check_study_links(out)
        check_run_folders(out / "runs", self.runs)
        with summary_lock(out):
            if is_sharded(self.shard):
                assert self.shard is not None
                write_shard_state(out, self.shard, self.done, self.errors, self.command)
            states = shard_states(out)
            errors: dict[str, str] = {}
            for state in states:
                errors.update(state.get("errors", {}))
            for finished in self.done:
                errors.pop(finished, None)
            errors.update(self.errors)
            summary = self.summarize()
            summary.update(command=self.command, environment=self.environment, errors=errors)
            if states:
                summary["shards"] = states
            atomic_write_json(self.path, summary)
            if report:
                self.write_report()
        self._last = time.monotonic()
        self._cost = self._last - began
        return summary

    @classmethod
    def for_study(cls, out: str | os.PathLike[str], config: Any, summarize: Callable[[], dict[str, Any]],
                  write_report: Callable[[], Any], *, min_interval_s: float = REFRESH_INTERVAL_S,
                  runs: Sequence[RunSpec] = ()) -> "StudySummary":
        """The running summary of a study in `out` (its results.json), for a study `config` with `device` and
        `shard` fields: the environment of that device, that shard, rewritten at most every `min_interval_s`;
        `runs` (the study's RunSpecs, all shards') are the run folders under `out`/runs checked before each
        summary (`check_run_folders`)."""
        return cls(Path(out) / RESULTS_FILE, summarize, write_report, environment_info(config.device),
                   min_interval_s=min_interval_s, shard=config.shard, runs=runs)

    def around(self, train: Callable[[Callable[[str, str | None], Any]], Any], *, merge: bool) -> dict[str, Any]:
        """A study's training with its summary kept current, the shard opt-in of every study's `run`: with
        `merge` (`--merge`: every shard's runs are on disk) only the summary is written; else results.json
        at once (the folder shows the study before its first run ends; no table or figures of a study with
        no finished run, and a study shorter than `min_interval_s` draws its figures once), then
        `train(on_done)`, whose
        `on_done(name, error)` (the `run_many`/`run_batched` hook) refreshes it as runs end (not forced: at
        most every `min_interval_s`), then the final, forced summary. Returns the final summary."""
        if merge:
            return self()
        self(report=False)
        train(lambda name, error: self(name, error, force=False))
        return self()


def stored_study(out: Path, name: str, config: Any, fields: Sequence[str], resume: bool,
                 legacy: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What a study stored in `out`/results.json, or None when there is none yet.

    Raises FileExistsError when there is one and `resume` is False, and ValueError (see
    `check_same_settings`) when it was computed with other values of `fields`; `legacy` gives the
    value a field had in files written before it was recorded.
    """
    path = Path(out) / "results.json"
    if not path.is_file():
        return None
    if not resume:
        raise FileExistsError(f"{out} holds a {name} study; pass --resume to continue or extend it")
    stored = read_summary(path, name)
    stored_config = json_config(config)
    now = {field: stored_config[field] for field in fields}
    check_same_settings({**(legacy or {}), **stored.get("config", {})}, now, fields, out)
    return stored


def check_same_settings(stored: dict[str, Any], new: dict[str, Any], fields: Iterable[str], out: Any,
                        error: type[Exception] = ValueError) -> None:
    """Refuse to resume a study in `out` whose stored JSON config `stored` differs from `new` (the
    same study's JSON config now) in any of `fields`: `error` (ValueError unless the caller says
    otherwise) naming each differing field with both values. The one check of every study kind
    (`stored_study`, `check_study_folder`, the highway search).

    These are the settings that every finished cell depends on (a learning-rate grid, epochs, ...);
    resuming with other values would mix cells computed under different settings in one table.
    """
    changed = [f"{field}: stored {stored.get(field)!r}, now {new.get(field)!r}"
               for field in fields if stored.get(field) != new.get(field)]
    if changed:
        raise error(f"{out} holds a study computed with other settings ({'; '.join(changed)}); "
                    "use a new --out folder, or the stored settings, to resume")


def check_study_folder(out: Path, name: str, config: dict[str, Any], resume: bool, shard: str | None = None,
                       merge: bool = False) -> bool:
    """Whether the study `name` with JSON config `config` resumes in `out`: True where `out`/results.json
    holds the same study (finished: it is only re-reported; unfinished: only with `resume`), else
    `resume` as given. FileExistsError where the folder holds the study with other settings (device,
    data folder, --quick, --compile, --shard and --merge aside) or an unfinished one without `resume`.
    A shard 'i/N' (N > 1) or `merge` expects an unfinished summary (the other shards'): `resume` as
    given, and a shard checks its own runs instead (study.shards.check_shard_fresh)."""
    path = Path(out) / "results.json"
    if not path.is_file():
        return resume
    previous = read_summary(path, name)  # untrusted input: checked, the file named on error
    old = previous.get("config", {})
    ignored = {"device", "data_dir", "quick", "compile", "shard", "merge"}
    check_same_settings(old, config, sorted(set(old) & set(config) - ignored), out, error=FileExistsError)
    finished = summary_finished(path, previous)  # checked even on --resume: a damaged summary is named
    if is_sharded(shard) or merge:
        return resume
    if not resume and not finished:
        raise FileExistsError(f"{out} holds an unfinished {name} study; pass --resume to continue it")
    return True


def rebuild_from_runs(out: str | os.PathLike[str], config_cls: type, summarize: Callable[[Any, Path], dict[str, Any]],
                      write_report: Callable[[Path], Any],
                      before: Callable[[Any, Path], Any] | None = None,
                      specs: Callable[[Any], Sequence[RunSpec]] | None = None) -> dict[str, Any]:
    """Rebuild a study's `out`/results.json from its run folders as they stand, without training: the
    config that results.json records (the fields `config_cls` knows, lists as tuples; checked against the
    options' bounds first, `options.check_stored_config`), the run folders checked against `specs(config)`
    (`check_run_folders`; no link is followed), `before(config, out)` (e.g. removal curves of runs
    finished since), `summarize(config, out)` with the stored command,
    environment and errors kept, then `write_report(out)`. Returns the summary. For rendering a study
    that is still training elsewhere, run it on a copy of the folder."""
    out = Path(out)
    check_study_links(out)
    previous = read_summary(out / RESULTS_FILE, "study")
    check_stored_config(config_cls, previous.get("config"), out / RESULTS_FILE)
    config = config_from_json(config_cls, previous["config"])
    if specs is not None:
        check_run_folders(out / "runs", specs(config))
    if before is not None:
        before(config, out)
    summary = summarize(config, out)
    summary.update({k: previous[k] for k in ("command", "environment", "errors") if k in previous})
    atomic_write_json(out / RESULTS_FILE, summary)
    write_report(out)
    return summary
