"""A study computed piece by piece in one process, its results.json rewritten after every piece.

The Demystifying studies (hessian-init, hessian-dynamics, shortcut-lr, weight-norms) and the
identity-distance study compute one cell, trace or curve at a time and keep them in one
results.json, so that an interrupted study resumes where it stopped. `ResumableStudy` is what they
share: the resume check of what the file already holds (`stored_study`), the summary's frame
(experiment, config, …, command, environment) written atomically, and the progress line.

    study = ResumableStudy(out, NAME, config, ("epochs", "lr"), resume)
    cells = study.stored_part("cells", {})
    def save(): return study.save(cells=cells, points=summarize(config, cells))
    for key, (depth, seed) in study.pending(((f"d{d}-s{s}", (d, s)) for d in depths for s in seeds), cells):
        cells[key] = ...; save(); study.progress(f"{key}: ...")
    return study.finish(save, write_report)

Such a study's Config derives from `ResumableOptions` (the options of every study, and the torch threads
of this one process). Its shard (study.shards) computes only its part of the pieces (`pending`, or
`in_shard(position)`: pieces i, i + N, ... in the study's order, each a batch of one) and saves with
`save_shared("cells", cells, parts)`: under the summary lock it records its own pieces in
`out`/shards/<i>-of-<N>/cells.json and writes results.json from the pieces of every shard, so shards
run at the same time into one folder (the same contract as the studies of run directories).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Container, Iterable, Iterator, Sequence, TypeVar

import torch

from .._io import atomic_write_json, environment_info, read_json_object
from .command import command_line
from .folders import stored_study
from .options import StudyOptions, option
from .shards import SHARDS_FOLDER, is_sharded, parse_shard, shard_folder, summary_lock

__all__ = ["ResumableStudy", "ResumableOptions"]

T = TypeVar("T")


@dataclass(frozen=True)
class ResumableOptions(StudyOptions):
    """The options of every study (`options.StudyOptions`) and `threads`, the torch threads of a study
    computed piece by piece in this one process (the command's own --threads is for worker processes)."""

    threads: int = option(1, "torch threads (1: best on a shared machine)", minimum=1)


class ResumableStudy:
    """The results.json of study `name` in `out`, computed piece by piece with `config`.

    Building it sets torch's intra-op threads to `config.threads` (these studies run in one
    process) and reads what `out`/results.json holds: `stored` is None for a new study, and
    `stored_study` raises when there is one and `resume` is False, or when it was computed with
    other values of `fields` (`legacy`: values of fields that older files do not record). With
    `progress` False, `progress(...)` prints nothing.
    `config` is a frozen dataclass with `threads` and `device` fields.
    """

    def __init__(self, out: str | os.PathLike[str], name: str, config: Any, fields: Sequence[str], resume: bool,
                 legacy: dict[str, Any] | None = None, *, progress: bool = True) -> None:
        torch.set_num_threads(config.threads)
        self.out = Path(out)
        self.path = self.out / "results.json"
        self.name = name
        self.config = config
        self.verbose = progress
        self.shard: str | None = getattr(config, "shard", None)
        self.merge = bool(getattr(config, "merge", False))
        # A shard or a merge expects the other shards' summary: resumed, its settings still checked.
        self.stored = stored_study(self.out, name, config, fields, resume or self.merge or is_sharded(self.shard),
                                   legacy=legacy)

    def in_shard(self, position: int) -> bool:
        """Whether the piece at `position` (0-based, in the study's order) is this process's to compute:
        every piece without a shard, pieces i − 1, i − 1 + N, ... for shard 'i/N', none under `merge`."""
        if self.merge:
            return False
        if self.shard is None:
            return True
        i, n = parse_shard(self.shard)
        return position % n == i - 1

    def pending(self, pieces: Iterable[tuple[str, T]], done: Container[str]) -> Iterator[tuple[str, T]]:
        """The (key, piece) pairs of `pieces` (every piece of the study, in its order) that this process
        computes now: those whose key `done` lacks (a resumed study keeps what it computed) and in this
        process's shard (`in_shard` of the piece's position among all of them). `done` is read as each
        piece comes, so a dict filled in the loop counts."""
        for position, (key, piece) in enumerate(pieces):
            if key not in done and self.in_shard(position):
                yield key, piece

    def save_shared(self, key: str, own: dict[str, Any], parts: Callable[[dict[str, Any]], dict[str, Any]],
                    stored_as: Callable[[Any], dict[str, Any]] = dict) -> dict[str, Any]:
        """Save the study with its part `key` merged over every shard, under the summary lock: `own` (this
        process's pieces, recorded in its shard's folder when sharded) over what results.json and every
        shard's `key`.json hold (`stored_as` makes results.json's `key` such a dict: a list of records,
        say); `parts(merged)` gives the parts `save` writes. Returns the summary."""
        with summary_lock(self.out):
            if is_sharded(self.shard):
                assert self.shard is not None
                atomic_write_json(shard_folder(self.out, self.shard) / f"{key}.json", own)
            merged: dict[str, Any] = {}
            if self.path.is_file():
                merged.update(stored_as(read_json_object(self.path, f"a {self.name} study's summary").get(key) or {}))
            for path in sorted((self.out / SHARDS_FOLDER).glob(f"*/{key}.json")):
                merged.update(read_json_object(path, f"a {self.name} shard's {key}"))
            merged.update(own)
            return self.save(**parts(merged))

    def stored_part(self, key: str, default: Any) -> Any:
        """The stored summary's `key` (cells, curves, traces, …), or `default` for a new study."""
        return self.stored.get(key, default) if self.stored is not None else default

    def save(self, **parts: Any) -> dict[str, Any]:
        """Write {"experiment", "config", **parts (in order), "command", "environment"} to results.json
        atomically and return it."""
        summary = {"experiment": self.name, "config": asdict(self.config), **parts, "command": command_line(),
                   "environment": environment_info(self.config.device)}
        atomic_write_json(self.path, summary)
        return summary

    def progress(self, text: str) -> None:
        """Print "[name] text" to stderr at once (one line per finished piece), unless built with
        progress=False."""
        if self.verbose:
            print(f"[{self.name}] {text}", file=sys.stderr, flush=True)

    def finish(self, save: Callable[[], dict[str, Any]], write_report: Callable[[Path], Any]) -> dict[str, Any]:
        """The study's last `save()`, then its table and figures (`write_report(out)`, under the summary
        lock: shards of the study may be writing them too); returns the summary."""
        summary = save()
        with summary_lock(self.out):
            write_report(self.out)
        return summary
