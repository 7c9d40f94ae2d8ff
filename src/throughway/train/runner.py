"""One training run from a config to a run directory: results.json, model.safetensors, checkpoints.

`run_training(config, out_dir)` is what `throughway train` and every experiment call. The run
directory holds:

* results.json: `config`, `environment` (torch version, device, threads, git revision),
  `recipe`, `model` (name, parameter count, config), `history` (per-epoch records, see `History`),
  `diverged`/`diverged_at`, and `final` (None until the run ends; then `test_error_pct`,
  `val_error_pct`, `train_loss`, `k_mean`, `diverged`, `epochs_completed`). It is rewritten
  atomically after every epoch, so a crashed run still shows its history.
* checkpoint.json + checkpoint-eNNNN.safetensors after every epoch (see `checkpoint`).
* model.safetensors when the run ends (the last finished epoch's weights, also for a diverged run).

`resume=True` continues an interrupted run from its checkpoint and ends with the same numbers as an
uninterrupted run on the CPU; a finished run is returned as it is.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from .._io import atomic_write_json, environment_info, read_json
from ..data import DataSplits, load_dataset
from ..models import create_model, model_entry
from .checkpoint import has_checkpoint, load_checkpoint, save_checkpoint, save_model, MODEL_FILE
from .loop import History, TrainState, fit
from .recipes import get_recipe

__all__ = ["RunConfig", "run_training", "RESULTS_FILE", "RunExistsError", "read_results"]

RESULTS_FILE = "results.json"
# Fields that may differ between an interrupted run and its resumption.
_RESUMABLE_DIFFERENCES = {"device", "data_dir"}


class RunExistsError(RuntimeError):
    """The output directory already holds a run and --resume was not given."""


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run (written to results.json as `config`)."""

    model: str
    depth: int
    dataset: str = "mnist"
    recipe: str = "gresnet-mnist"
    epochs: int | None = None
    seed: int = 0
    train_on_full: bool = False
    device: str = "cpu"
    limit: int | None = None
    data_dir: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    recipe_overrides: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_results(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read `run_dir`/results.json, with an error naming the file when it is missing."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results file; is {run_dir} a throughway run directory?")
    return read_json(path)


def _build_model(config: RunConfig, data: DataSplits) -> torch.nn.Module:
    accepted = model_entry(config.model).parameters()
    kwargs = dict(config.model_kwargs)
    kwargs["depth"] = config.depth
    if "in_features" in accepted and "in_features" not in kwargs:
        kwargs["in_features"] = int(math.prod(data.input_shape))
    if "num_classes" in accepted and "num_classes" not in kwargs:
        kwargs["num_classes"] = data.num_classes
    torch.manual_seed(config.seed)  # the initialisation is a function of the seed
    return create_model(config.model, **kwargs).to(config.device)


def _final(history: History) -> dict[str, Any]:
    last = history.last()
    return {
        "epochs_completed": len(history.epochs),
        "diverged": history.diverged,
        "test_error_pct": last["test_error_pct"] if last else None,
        "val_error_pct": last["val_error_pct"] if last else None,
        "train_loss": last["train_loss"] if last else None,
        "k_mean": last.get("k_mean") if last else None,
        "k": last.get("k") if last else None,
    }


class _RunFiles:
    """Callback that checkpoints, rewrites results.json every epoch, and restores on resume."""

    def __init__(self, out_dir: Path, results: dict[str, Any], resume: bool) -> None:
        self.out_dir, self.results, self.resume = out_dir, results, resume

    def _write(self, state: TrainState, final: bool) -> None:
        self.results["history"] = state.history.epochs
        self.results["diverged"] = state.history.diverged
        self.results["diverged_at"] = state.history.diverged_at
        self.results["final"] = _final(state.history) if final else None
        atomic_write_json(self.out_dir / RESULTS_FILE, self.results)

    def on_fit_start(self, state: TrainState) -> None:
        if self.resume and has_checkpoint(self.out_dir):
            meta = load_checkpoint(self.out_dir, model=state.model, optimizer=state.optimizer,
                                   generator=state.generator)
            state.epoch = int(meta["epoch"])
            state.history = History.from_dict(meta["history"])
            state.elapsed_s = float(meta.get("elapsed_s", 0.0))
            print(f"  resuming {self.out_dir} after epoch {state.epoch}", file=sys.stderr, flush=True)
        self._write(state, final=False)

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        save_checkpoint(self.out_dir, model=state.model, optimizer=state.optimizer, generator=state.generator,
                        epoch=state.epoch, extra={"history": state.history.to_dict(), "elapsed_s": state.elapsed_s})
        self._write(state, final=False)

    def on_fit_end(self, state: TrainState) -> None:
        save_model(self.out_dir / MODEL_FILE, state.model)
        self._write(state, final=True)


def _check_resumable(existing: dict[str, Any], config: RunConfig, out_dir: Path) -> None:
    old = existing.get("config", {})
    new = config.to_dict()
    differing = sorted(k for k in set(old) | set(new) if k not in _RESUMABLE_DIFFERENCES and old.get(k) != new.get(k))
    if differing:
        details = ", ".join(f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in differing)
        raise RunExistsError(f"{out_dir} holds a run with a different config ({details}); "
                             f"choose another --out or repeat the original arguments")


def run_training(config: RunConfig, out_dir: str | os.PathLike[str], *, resume: bool = False,
                 progress: bool = True, data: DataSplits | None = None,
                 callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train one model as `config` says, writing results into `out_dir`; return the results dict.

    `data` may be passed to share loaded data between runs (it must match the config's dataset,
    split and device). Raises RunExistsError when `out_dir` already holds a run and `resume` is
    False, or holds a run of another config.
    """
    out_dir = Path(out_dir)
    results_path = out_dir / RESULTS_FILE
    if results_path.is_file():
        existing = read_json(results_path)
        if not resume:
            raise RunExistsError(f"{out_dir} already holds a run ({RESULTS_FILE}); pass --resume to continue "
                                 f"or skip it, or choose another --out")
        _check_resumable(existing, config, out_dir)
        if existing.get("final") is not None:
            if progress:
                print(f"  {out_dir}: finished earlier, skipped", file=sys.stderr, flush=True)
            return existing
    recipe = get_recipe(config.recipe, **config.recipe_overrides)
    if config.epochs is not None:
        recipe = recipe.replace(epochs=config.epochs)
    if data is None:
        data = load_dataset(config.dataset, config.data_dir, train_on_full=config.train_on_full,
                            device=config.device, limit=config.limit)
    model = _build_model(config, data)
    results: dict[str, Any] = {
        "format": "throughway-results-1",
        "config": config.to_dict(),
        "environment": environment_info(config.device),
        "recipe": recipe.to_dict(),
        "model": {"name": config.model, "parameters": sum(p.numel() for p in model.parameters()),
                  "config": getattr(model, "config", {})},
        "data": {"dataset": data.name, "train": len(data.train), "val": len(data.val) if data.val else 0,
                 "test": len(data.test)},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _RunFiles(out_dir, results, resume)
    fit(model, data, recipe, [files, *callbacks], seed=config.seed, progress=progress)
    return results
