"""A study's summary: what each run's results.json gives it, the summary kept current while the study trains
(`StudySummary`), and its report remade from results.json alone (`remake_report`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence, overload

from .._io import atomic_write_json, atomic_write_text, environment_info
from ..train import RESULTS_FILE, read_results
from .command import command_line
from .folders import check_run_folders, check_study_links, read_summary
from .shards import is_sharded, shard_states, summary_lock, write_shard_state
from .spec import RunSpec

__all__ = ["StudySummary", "REFRESH_INTERVAL_S", "read_runs", "check_run_results", "run_status", "remake_report", "FINDINGS_FILE"]

# The file of a study's findings in words, beside its table.md: written by the study's report (`remake_report`),
# placed by tools/readme on the study's docs page.
FINDINGS_FILE = "findings.md"

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


def read_runs(runs_dir: str | os.PathLike[str], names: Iterable[str]) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(name, its results.json) for each run `names` of a study's `runs_dir`, in order; the results are
    None for a run that has not started (a summary lists it as {"run", "state": "not started", "epochs": 0}).

    Each file is checked as `check_run_results` says, so a summary never fails on a damaged run's
    field with a bare key name: ValueError naming the file and the field."""
    for name in names:
        path = Path(runs_dir) / name / RESULTS_FILE
        yield name, check_run_results(read_results(path.parent), path) if path.is_file() else None


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


# A running study's summary, table and figures are rewritten at most this often as its runs end (the figures
# take seconds), and always at the end: StudySummary's default.
REFRESH_INTERVAL_S = 10.0


class StudySummary:
    """Keeps a running study's results.json (in `out`), table and figures current as its runs end.

    `summarize(config, out)` and `write_report(out)` are the study's own functions (what `study.runner.Study`
    declares). Calling the StudySummary (`summary(name, error)`, the `on_done` hook of
    `run_many`/`run_stacked`) records `error` against run `name` if there is one, rebuilds the summary with
    `summarize(config, out)`, adds the study's command line (`command.command_line`), environment (of
    `config.device`) and errors, writes `out`/results.json atomically and remakes the report with
    `write_report(out)` (not with `report=False`); it returns the summary. With `min_interval_s` > 0 a call
    that is not forced and comes sooner than that (or than 4 times the last write's duration) after the
    last write ended only records its error and returns None (a search whose batches end every few seconds
    need not rewrite its figure each time); the final call is forced, so nothing is lost, and `errors`
    always holds every failure.

    Shards (study.shards, `config.shard`): the summary is made and written under the study's summary lock,
    so shards running at the same time into one folder write it in turn, each from every run on disk; a
    shard 'i/N' (N > 1) first records its finished runs and failures in its state.json, and the summary's
    'errors' holds every shard's failures (less the runs this process has since finished) and 'shards'
    each shard's state.

    Before each summary is made, the study folder and its runs are checked as untrusted input
    (`folders.check_study_links`; `folders.check_run_folders` over `runs`, the study's RunSpecs of every
    shard, in `out`/runs): a linked folder, or a run folder holding another run than its name stands for
    (copied in from a study with other options, swapped), is a ValueError naming it, and nothing is
    written."""

    def __init__(self, out: str | os.PathLike[str], config: Any, summarize: Callable[[Any, Path], dict[str, Any]],
                 write_report: Callable[[Path], Any], *, runs: Sequence[RunSpec] = (),
                 min_interval_s: float = REFRESH_INTERVAL_S, environment: dict[str, Any] | None = None) -> None:
        self.out = Path(out)
        self.config = config
        self.summarize = summarize
        self.write_report = write_report
        self.runs = tuple(runs)
        self.min_interval_s = float(min_interval_s)
        self.shard: str | None = getattr(config, "shard", None)
        self.done: list[str] = []
        self.errors: dict[str, str] = {}
        self._last = -float("inf")
        self._cost = 0.0  # seconds the last write took
        self.command = command_line()
        self.environment = environment if environment is not None else environment_info(config.device)

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
        out = self.out
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
            summary = self.summarize(self.config, out)
            summary.update(command=self.command, environment=self.environment, errors=errors)
            if states:
                summary["shards"] = states
            atomic_write_json(out / RESULTS_FILE, summary)
            if report:
                self.write_report(out)
        self._last = time.monotonic()
        self._cost = self._last - began
        return summary


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
