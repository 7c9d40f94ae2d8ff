"""A study's folder as untrusted input: its summary read back, links refused, each run folder holding the run
its name stands for, and whether the folder resumes (same settings, finished or not).

A study's folder holds results.json (the summary), runs/<name>/ (one run directory per run), table.md,
findings.md and the figures. Before anything is read from it or written into it, the toolkit checks it
here: every check raises naming the file or the field (docs/reliability.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from .._io import read_json_object
from ..train import RESULTS_FILE, read_results
from ..train.config import config_differences
from .options import json_config
from .shards import is_sharded
from .spec import RunSpec

__all__ = ["read_summary", "summary_finished", "check_study_links", "check_run_folders", "stored_study",
           "check_same_settings", "check_study_folder"]


def read_summary(path: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """A study's summary `path` (its results.json) as an object whose 'config' (when present) is an
    object too; ValueError naming the file and the field otherwise (a file
    holding `[]` is the file's fault, said as such, not an AttributeError)."""
    summary = read_json_object(path, f"a {name} study's summary")
    if not isinstance(summary.get("config", {}), dict):
        raise ValueError(f"{path}: field 'config' holds {type(summary['config']).__name__}; accepted: an object "
                         f"(the file was edited or damaged)")
    return summary


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
