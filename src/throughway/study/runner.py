"""The one way a study of run folders runs: `Study.run` trains its runs with its summary kept current, and
`Study.rebuild` remakes the summary from the run folders as they stand.

An experiment of many runs (gate-family, mnist-depth, transformer-gates, layer-drop, cifar-gated) declares
what the machinery needs of it once, as a `Study`: its name, Config class, runs (`specs`), summary
(`summarize`), report (`write_report`), whether its runs train as stacks (study.stacking) or one per
worker (study.workers), and the analysis of each run in the worker that trained it. Its `run` is then
`STUDY.run` (and `report_finished` `STUDY.rebuild`): the study's functions are called at fixed points with
the study's (config, out), never through closures built per call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from .._io import atomic_write_json
from ..train import RESULTS_FILE
from .folders import check_run_folders, check_study_folder, check_study_links, read_summary
from .options import check_stored_config, config_from_json, json_config
from .spec import RunSpec
from .stacking import run_stacked
from .summary import REFRESH_INTERVAL_S, StudySummary
from .workers import run_many

__all__ = ["Study"]


@dataclass(frozen=True)
class Study:
    """A study of run folders as its `run` and `rebuild` drive it (each function the study's own, at module
    level so that worker processes can import it):

    * `name`: the study's NAME (results.json's "experiment"); `config`: its Config class;
    * `specs(config)`: every run of the study (all shards'), in the order they train;
    * `summarize(config, out)`: the summary of the runs under `out`/runs as they stand (finished or not),
      after any analysis it needs of the finished runs (gate-family: their removal curves);
    * `write_report(out)`: table.md, findings.md and the figures from `out`/results.json alone;
    * `stacked`: the runs train as stacks of models (`stacking.run_stacked`, a config's `compile` honoured),
      else one per worker process (`workers.run_many`);
    * `analyse(config, spec, run_dir)`: the study's analysis of one finished run, in the worker that trained
      it (one run per worker only), skipping what it already wrote;
    * `min_interval_s`: the summary and report are rewritten at most this often as runs end.
    """

    name: str
    config: type
    specs: Callable[[Any], Sequence[RunSpec]]
    summarize: Callable[[Any, Path], dict[str, Any]]
    write_report: Callable[[Path], Any]
    stacked: bool = True
    analyse: Callable[[Any, RunSpec, Path], Any] | None = None
    min_interval_s: float = REFRESH_INTERVAL_S

    def run(self, config: Any, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
            progress: bool = True) -> dict[str, Any]:
        """Train every run of the study with `config` (or of its shard, `config.shard`) into `out`/runs,
        resumable, with the summary kept current (`summary.StudySummary`); return the final summary.

        First the folder: a study with other settings (device, data folder, --quick, --compile, --shard and
        --merge aside) or an unfinished one without `resume` is refused (`folders.check_study_folder`). Then
        results.json at once (the folder shows the study before its first run ends; no table or figures of a
        study with no finished run), the runs trained (as each ends, summary and report are rewritten, at most
        every `min_interval_s`) and the final summary and report. With `config.merge` (every shard's runs are
        on disk) only the final summary and report are written. Whatever the seed count, a stacked study's
        runs train through the one stacked path: were the trainer picked by the seed count, seed 0's run would
        differ between a 1-seed and a 5-seed study."""
        if self.stacked and self.analyse is not None:
            raise ValueError(f"study {self.name}: `analyse` runs in the worker of a single run; a stacked study "
                             f"analyses its runs in `summarize`")
        out = Path(out)
        resume = check_study_folder(out, self.name, json_config(config), resume, config.shard, config.merge)
        out.mkdir(parents=True, exist_ok=True)
        specs = self.specs(config)
        summary = StudySummary(out, config, self.summarize, self.write_report, runs=specs,
                               min_interval_s=self.min_interval_s)
        if config.merge:
            return summary()
        summary(report=False)
        on_done = partial(summary, force=False)
        if self.stacked:
            run_stacked(specs, out / "runs", resume=resume, jobs=jobs, progress=progress, on_done=on_done,
                        compile=getattr(config, "compile", None), shard=config.shard)
        else:
            run_many(specs, out / "runs", resume=resume, jobs=jobs, progress=progress, on_done=on_done,
                     shard=config.shard, after=None if self.analyse is None else partial(self.analyse, config))
        return summary()

    def rebuild(self, out: str | os.PathLike[str], before: Callable[[Any, Path], Any] | None = None) -> dict[str, Any]:
        """Rebuild the study's `out`/results.json from its run folders as they stand, without training: the
        config that results.json records (the fields the Config knows, lists as tuples; checked against the
        options' bounds first, `options.check_stored_config`), the run folders checked against the study's runs
        (`folders.check_run_folders`; no link is followed), `analyse` of every finished run (it skips what it
        wrote before), `before(config, out)` (gate-family: removal curves made again), the summary with the
        stored command, environment and errors kept, then the report. Returns the summary. For rendering a
        study that is still training elsewhere, run it on a copy of the folder."""
        out = Path(out)
        check_study_links(out)
        previous = read_summary(out / RESULTS_FILE, "study")
        check_stored_config(self.config, previous.get("config"), out / RESULTS_FILE)
        config = config_from_json(self.config, previous["config"])
        specs = self.specs(config)
        check_run_folders(out / "runs", specs)
        if self.analyse is not None:
            for spec in specs:
                if (out / "runs" / spec.name / "model.safetensors").is_file():
                    self.analyse(config, spec, out / "runs" / spec.name)
        if before is not None:
            before(config, out)
        summary = self.summarize(config, out)
        summary.update({k: previous[k] for k in ("command", "environment", "errors") if k in previous})
        atomic_write_json(out / RESULTS_FILE, summary)
        self.write_report(out)
        return summary
