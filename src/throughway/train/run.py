"""One training run from a config to a run directory: results.json, model.safetensors, checkpoints.

`run_training(config, out_dir)` is what `throughway train` and every experiment call. The run
directory holds:

* results.json: `config`, `environment` (torch version, device, threads, git revision),
  `recipe`, `model` (name, parameter count, config), `history` (per-epoch records, see `History`),
  `diverged`/`diverged_at`, and `final` (None until the run ends; then `test_error_pct`,
  `val_error_pct`, `train_loss`, `k_mean`, `diverged`, `epochs_completed`). It is rewritten
  atomically after every epoch, so a crashed run still shows its history.
* metrics.csv: one row per epoch, every metric of the history's records (`callbacks.metrics_table`),
  rewritten atomically with results.json, so it resumes with the run and holds each epoch once.
* with `tensorboard=True`, TensorBoard event files (`callbacks.TensorBoardLogger`), written before
  each checkpoint so that a resumed run logs no epoch twice.
* checkpoint.json + checkpoint-eNNNN.safetensors after every epoch (see `checkpoint`).
* model.safetensors when the run ends (the last finished epoch's weights, also for a diverged run).

`resume=True` continues an interrupted run from its checkpoint and ends with the same numbers as an
uninterrupted run on the CPU; a finished run is returned as it is.

On a text data set (TEXT_DATASETS) the run trains a causal language model through `lm.fit_lm`, with
the same files: an epoch is the recipe's `steps_per_epoch` steps, the block length is the model's
`context`, `config.eval_blocks` bounds each evaluation, and the records and `final` add bits per
character (`train_bpc`, `val_bpc`, `test_bpc`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file

from .._io import atomic_write_json, environment_info, read_json_object
from ..data import DataSplits, TextSplits, load_dataset
from ..data.augment import normalize_splits, train_transform
from ..models import create_model
from . import distributed
from .callbacks import TensorBoardLogger, require_tensorboard, write_metrics_csv
from .checkpoint import (check_model_config, has_checkpoint, load_checkpoint, load_model, read_checkpoint_meta,
                         save_checkpoint, save_model, verify_checkpoint_file)
from .config import RunConfig, RunExistsError, build_model, check_config, check_resumable
from .lm import DEFAULT_LM_EVAL_BATCH, fit_lm
from .loop import DEFAULT_EVAL_BATCH, TrainState, fit
from .stacked import StackedOptimizer
from .recipes import Recipe
from .rundir import MODEL_FILE, RESULTS_FILE, RunDir, interrupts_deferred

__all__ = ["run_training", "RESULTS_FILE", "RESULTS_FORMAT", "read_results", "results_header", "ResultsFiles",
           "prepare_run_dir", "check_finished_model"]

RESULTS_FORMAT = "throughway-results-1"


def run_training(config: RunConfig, out_dir: str | os.PathLike[str], *, resume: bool = False,
                 progress: bool = True, data: DataSplits | TextSplits | None = None,
                 callbacks: Sequence[Any] = (), tensorboard: bool = False) -> dict[str, Any]:
    """Train one model as `config` says, writing results into `out_dir`; return the results dict.

    `data` may be passed to share loaded data between runs (it must match the config's dataset,
    split and device). `callbacks` are added to `fit`'s after the run directory's own. `tensorboard`
    also writes TensorBoard event files into `out_dir` (ImportError naming `throughway[tensorboard]`
    when it is not installed). Progress lines start with `[<out_dir's name>]`, so that runs trained
    in parallel can be told apart. Raises RunExistsError when `out_dir` already holds a run and
    `resume` is False, or holds a run of another config.
    """
    out_dir = Path(out_dir)
    recipe = check_config(config)  # before the lock, the data and anything else that takes time
    if tensorboard:
        require_tensorboard()  # before the lock and the data, like every other check
    run = RunDir(out_dir)
    run.check_usable()
    main_process = distributed.is_main_process()
    # Rank 0 alone writes, so it alone holds the lock (for the whole run).
    with (run.locked() if main_process else contextlib.nullcontext(run)):
        existing = prepare_run_dir(run, config, resume, recipe)
        if existing is not None:
            if progress:
                print(f"  {out_dir}: finished earlier, skipped", file=sys.stderr, flush=True)
            return existing
        return _train(config, recipe, out_dir, resume=resume, progress=progress, data=data, callbacks=callbacks,
                      main_process=main_process, tensorboard=tensorboard)


def _train(config: RunConfig, recipe: Recipe, out_dir: Path, *, resume: bool, progress: bool,
           data: DataSplits | TextSplits | None, callbacks: Sequence[Any], main_process: bool,
           tensorboard: bool = False) -> dict[str, Any]:
    if data is None:
        data = load_dataset(config.dataset, config.data_dir, train_on_full=config.train_on_full,
                            device=config.device, limit=config.limit)
    if isinstance(data, TextSplits):
        return _train_text(config, recipe, out_dir, data, resume=resume, progress=progress, callbacks=callbacks,
                           main_process=main_process, tensorboard=tensorboard)
    data = normalize_splits(data, recipe.normalize)  # training-split statistics, once, on the device
    transform = train_transform(recipe.augment)
    model = build_model(config, data)
    results: dict[str, Any] = results_header(config, recipe, model, data)
    distributed.barrier()  # every rank has checked out_dir before rank 0 writes into it
    files = _RunFiles(out_dir, results, resume, write=main_process, progress=progress)
    # The event files are written before each checkpoint (TensorBoardLogger: no epoch twice on resume).
    logs = [TensorBoardLogger(out_dir)] if tensorboard and main_process else []
    fit(model, data, recipe, [*logs, files, *callbacks], seed=config.seed, progress=progress, label=out_dir.name,
        train_transform=transform, amp=config.amp, channels_last=config.channels_last, compile_model=config.compile,
        eval_batch_size=config.eval_batch_size or DEFAULT_EVAL_BATCH)
    return results


def _train_text(config: RunConfig, recipe: Recipe, out_dir: Path, data: TextSplits, *, resume: bool, progress: bool,
                callbacks: Sequence[Any], main_process: bool, tensorboard: bool) -> dict[str, Any]:
    """`_train` on a text data set: the causal language model of `config` through `lm.fit_lm`."""
    model = build_model(config, data)
    results: dict[str, Any] = results_header(config, recipe, model, data)
    distributed.barrier()
    files = _RunFiles(out_dir, results, resume, write=main_process, progress=progress)
    logs = [TensorBoardLogger(out_dir)] if tensorboard and main_process else []
    fit_lm(model, data, recipe, [*logs, files, *callbacks],
           eval_blocks=config.eval_blocks, seed=config.seed, progress=progress, label=out_dir.name, amp=config.amp,
           compile_model=config.compile, eval_batch_size=config.eval_batch_size or DEFAULT_LM_EVAL_BATCH)
    return results


def prepare_run_dir(run: RunDir, config: RunConfig, resume: bool, recipe: Recipe) -> dict[str, Any] | None:
    """Check what `run` holds before training `config` (with `recipe`, from `check_config`) into it;
    return the results of a finished run (to be skipped), else None (train: from scratch, or from the
    checkpoint when `resume`).

    Refused (RunExistsError / ValueError naming the file and field): any run file without `resume`;
    a results.json or checkpoint.json of another config (the config is stored in both, and checked on
    every resume); checkpoint files without the checkpoint.json that describes them; a checkpoint.json
    whose fields are not what `save_checkpoint` writes or whose file is missing or damaged.
    """
    present = run.artifacts() if run.path.is_dir() else []
    if present and not resume:
        raise RunExistsError(f"{run.path} already holds a run ({', '.join(present)}); pass --resume to continue "
                             f"or skip it, or choose another --out")
    existing = read_results(run.path) if run.results.is_file() else None
    if existing is not None:
        check_resumable(existing, config, run.path)
        if existing.get("final") is not None:
            check_finished_model(run, existing)
            return existing
    if run.checkpoint_json.is_file():
        meta = read_checkpoint_meta(run.path)
        if "config" in meta:
            check_resumable(meta, config, run.path)
        elif existing is None:
            raise RunExistsError(f"{run.checkpoint_json}: records no config (written by an older version) and "
                                 f"{RESULTS_FILE} is missing, so the config cannot be checked; choose another --out")
        epochs = recipe.epochs
        if meta["epoch"] > epochs:
            raise ValueError(f"{run.checkpoint_json}: field 'epoch' is {meta['epoch']}, beyond the run's {epochs} "
                             f"epochs; the file was edited or damaged")
        verify_checkpoint_file(run.path, meta)
    elif run.checkpoint_files():
        names = ", ".join(p.name for p in run.checkpoint_files()[:3])
        raise RunExistsError(f"{run.path} holds checkpoint files ({names}) but no {run.checkpoint_json.name} to "
                             f"resume them from; move them away or choose another --out (nothing was overwritten)")
    elif run.model.is_file() and existing is None:
        raise RunExistsError(f"{run.path} holds {run.model.name} but no {RESULTS_FILE}; move it away or choose "
                             f"another --out (nothing was overwritten)")
    return None


def check_finished_model(run: RunDir, results: dict[str, Any], advice: str | None = None) -> None:
    """Make sure a finished run (`results`' final is set) still has its model.safetensors before it is
    skipped as finished: a missing, truncated or damaged file, or one that is
    not a regular file (a FIFO, a folder), is rebuilt from the run's checkpoint of the final epoch
    (checked against its SHA-256 and against results.json's model config); without that checkpoint
    (a stacked run keeps none), ValueError naming the file and ending with `advice` (default: choose
    another --out; a study says how to retrain that one run). Nothing else is written."""
    path = run.model
    try:
        problem = None if stat.S_ISREG(os.lstat(path).st_mode) else "is not a regular file (a FIFO or a folder?)"
    except FileNotFoundError:
        problem = "is missing"
    if problem is None:
        try:
            load_model(path)
            return
        except ValueError as exc:
            problem = f"cannot be read ({str(exc)[:200]})"
    final_epoch = results["final"].get("epochs_completed")
    model_config = (results.get("model") or {}).get("config")
    if run.checkpoint_json.is_file() and isinstance(model_config, dict):
        meta = read_checkpoint_meta(run.path)
        if meta["epoch"] == final_epoch:
            tensors = load_file(str(verify_checkpoint_file(run.path, meta)))
            state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
            rebuilt = check_model_config(model_config, {k: tuple(v.shape) for k, v in state.items()}, run.results)
            model = create_model(rebuilt.pop("name"), **rebuilt)
            model.load_state_dict(state)
            if path.is_dir():
                raise ValueError(f"{path}: is a folder where the run's model file belongs; move it away and rerun "
                                 f"with --resume (the model is then rebuilt from {meta['file']})")
            path.unlink(missing_ok=True)  # a FIFO or a damaged file of the run's own name
            save_model(path, model)
            print(f"  {path}: {problem}; rebuilt from {meta['file']} (epoch {final_epoch})", file=sys.stderr, flush=True)
            return
    advice = advice or "choose another --out to train the run again"
    raise ValueError(f"{path}: {problem}, but {run.results} says the run finished after epoch {final_epoch} and no "
                     f"checkpoint of that epoch is left to rebuild it from; the trained weights are lost: {advice}")


def read_results(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read `run_dir`/results.json, with an error naming the file when it is missing."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results file; is {run_dir} a throughway run directory?")
    results = read_json_object(path, "a run's results")
    for key in ("config", "model", "final", "recipe", "data", "environment"):
        if results.get(key) is not None and not isinstance(results[key], dict):
            raise ValueError(f"{path}: field {key!r} holds {type(results[key]).__name__}; accepted: an object "
                             f"(or null for 'final'); the file was edited or damaged")
    final = results.get("final")
    if final is not None:
        numbers = ("test_error_pct", "val_error_pct", "train_loss", "k_mean")
        if not (isinstance(final.get("epochs_completed", 0), int) and isinstance(final.get("diverged", False), bool)
                and all(final.get(k) is None or (isinstance(final.get(k), (int, float))
                                                 and not isinstance(final.get(k), bool)) for k in numbers)):
            raise ValueError(f"{path}: field 'final' may hold epochs_completed (integer), diverged (bool) and "
                             f"numbers or null for {', '.join(numbers)}; the file was edited or damaged")
    if "history" in results and not (isinstance(results["history"], list)
                                     and all(isinstance(r, dict) for r in results["history"])):
        raise ValueError(f"{path}: field 'history' must be a list of objects (one per epoch); the file was edited "
                         f"or damaged")
    return results


def results_header(config: RunConfig, recipe: Recipe, model: torch.nn.Module,
                   data: DataSplits | TextSplits) -> dict[str, Any]:
    """The results.json fields known before training (format, config, environment, launch, recipe, model, data).
    The environment holds the data set's checksums (`DataSplits.checksums`, `TextSplits.checksums`) where the
    data has them; `data` is the data's own summary (`DataSplits.summary`, `TextSplits.summary`: for a text
    data set the split sizes count characters, and the vocabulary and works are added)."""
    environment = environment_info(config.device)
    if data.checksums:
        environment["data_sha256"] = dict(data.checksums)
    return {
        "format": RESULTS_FORMAT,
        "config": config.to_dict(),
        "environment": environment,
        "launch": distributed.launch_info(),  # world size, rank layout, the study's shard i/N
        "recipe": recipe.to_dict(),
        "model": {"name": config.model, "parameters": sum(p.numel() for p in model.parameters()),
                  "config": getattr(model, "config", {})},
        "data": data.summary(),
    }


class ResultsFiles:
    """Callback that keeps a run directory's results.json and metrics.csv current every epoch and writes
    model.safetensors at the end; shared by `run_training` and `train_stacked` (one writer for both).

    `results` is the header (`results_header`); `write=False` (a non-zero rank of a distributed run)
    writes nothing."""

    def __init__(self, out_dir: Path, results: dict[str, Any], write: bool = True) -> None:
        self.out_dir, self.results, self.write = out_dir, results, write

    def _write(self, state: TrainState, final: bool) -> None:
        if not self.write:
            return
        self.results["history"] = state.history.epochs
        self.results["diverged"] = state.history.diverged
        self.results["diverged_at"] = state.history.diverged_at
        self.results["final"] = state.history.final() if final else None
        atomic_write_json(self.out_dir / RESULTS_FILE, self.results)
        write_metrics_csv(self.out_dir, state.history.epochs)

    def on_fit_start(self, state: TrainState) -> None:
        """Write results.json as the run starts (or resumes)."""
        self._write(state, final=False)

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Rewrite results.json and metrics.csv."""
        self._write(state, final=False)

    def on_fit_end(self, state: TrainState) -> None:
        """Write model.safetensors and the final results.json."""
        if self.write:
            save_model(self.out_dir / MODEL_FILE, state.model)
        self._write(state, final=True)


def _own_optimizer(state: TrainState) -> torch.optim.Optimizer:
    if not isinstance(state.optimizer, torch.optim.Optimizer) or isinstance(state.optimizer, StackedOptimizer):
        raise TypeError("a run's own checkpoint needs the run's own optimiser; a stacked run checkpoints the stack")
    return state.optimizer


class _RunFiles(ResultsFiles):
    """`ResultsFiles` plus the run's own checkpoint every epoch, restored on resume (`run_training`)."""

    def __init__(self, out_dir: Path, results: dict[str, Any], resume: bool, write: bool = True,
                 progress: bool = True) -> None:
        super().__init__(out_dir, results, write)
        self.resume = resume
        self.progress = progress  # False (--quiet): no "resuming" line either; quiet means nothing on stderr
        # Stored in every checkpoint.json, so a resume is checked even when results.json is gone.
        self.identity = {"config": results["config"], "model": {"config": results["model"]["config"]}}
        self.optimizer: torch.optim.Optimizer | None = None  # the run's own, checked as it starts

    def on_fit_start(self, state: TrainState) -> None:
        """Check that the run has an optimiser of its own to checkpoint, restore the checkpoint when resuming,
        then write results.json."""
        self.optimizer = _own_optimizer(state)
        if self.resume and has_checkpoint(self.out_dir):
            meta = load_checkpoint(self.out_dir, model=state.model, optimizer=self.optimizer, generator=state.generator)
            state.restore_progress(meta)
            if self.write and self.progress:
                print(f"  resuming {self.out_dir} after epoch {state.epoch}", file=sys.stderr, flush=True)
        super().on_fit_start(state)

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Checkpoint the epoch and rewrite results.json, both or neither under Ctrl-C (`interrupts_deferred`)."""
        with interrupts_deferred():
            if self.write:
                save_checkpoint(self.out_dir, model=state.model, optimizer=self.optimizer or _own_optimizer(state),
                                generator=state.generator,
                                epoch=state.epoch, extra={**state.progress_entry(), **self.identity})
            super().on_epoch_end(state, record)
