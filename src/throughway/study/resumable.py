"""A study computed piece by piece in one process, its results.json rewritten after every piece.

The Demystifying studies (hessian-init, hessian-dynamics, shortcut-lr, weight-norms) and the
identity-distance study compute one cell, trace or curve at a time and keep them in one
results.json, so that an interrupted study resumes where it stopped. `ResumableStudy` is what they
share: the resume check of what the file already holds (`stored_study`), the summary's frame
(experiment, config, …, command, environment) written atomically, and the progress line.

    study = ResumableStudy(out, NAME, config, ("epochs", "lr"), resume)
    cells = study.stored_part("cells", {})
    def save(): return study.save(cells=cells, points=summarize(config, cells))
    for key in ...: cells[key] = ...; save(); study.progress(f"{key}: ...")
    return study.finish(save, write_report)
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .._io import atomic_write_json, environment_info
from .runs import command_line, stored_study

__all__ = ["ResumableStudy"]


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
        self.stored = stored_study(self.out, name, config, fields, resume, legacy=legacy)

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
        """The study's last `save()`, then its table and figures (`write_report(out)`); returns the summary."""
        summary = save()
        write_report(self.out)
        return summary
