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
from ..data.augment import RandomCropFlip, normalize_splits
from ..models import LEGACY_STEM, MLP_FAMILIES, create_model, model_entry
from . import distributed
from .checkpoint import has_checkpoint, load_checkpoint, save_checkpoint, save_model, MODEL_FILE
from .loop import DEFAULT_EVAL_BATCH, History, TrainState, fit
from .recipes import Recipe, get_recipe

__all__ = ["RunConfig", "run_training", "RESULTS_FILE", "RunExistsError", "read_results", "build_model",
           "resolve_recipe", "results_header", "final_summary", "check_resumable", "RESULTS_FORMAT"]

RESULTS_FILE = "results.json"
RESULTS_FORMAT = "throughway-results-1"
# Fields that may differ between an interrupted run and its resumption.
_RESUMABLE_DIFFERENCES = {"device", "data_dir", "amp", "channels_last", "compile", "eval_batch_size"}


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
    # Execution options (see loop.fit): bf16 autocast, NHWC memory format, torch.compile.
    amp: bool = False
    channels_last: bool = False
    compile: bool = False
    # Images per evaluation forward (None: loop.DEFAULT_EVAL_BATCH); wide conv nets need fewer on a GPU.
    eval_batch_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-able dict (results.json's `config`)."""
        return dataclasses.asdict(self)


def read_results(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read `run_dir`/results.json, with an error naming the file when it is missing."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results file; is {run_dir} a throughway run directory?")
    return read_json(path)


def build_model(config: RunConfig, data: DataSplits) -> torch.nn.Module:
    """The model of `config`, initialised as every run does: torch.manual_seed(config.seed), then
    create_model with the data's input size and classes, on config.device (shared with the batched trainer)."""
    accepted = model_entry(config.model).parameters()
    kwargs = dict(config.model_kwargs)
    kwargs["depth"] = config.depth
    if "in_features" in accepted and "in_features" not in kwargs:
        kwargs["in_features"] = int(math.prod(data.input_shape))
    if "num_classes" in accepted and "num_classes" not in kwargs:
        kwargs["num_classes"] = data.num_classes
    # Conv nets take the image's channels and side from the data.
    if "in_channels" in accepted and "in_channels" not in kwargs and len(data.input_shape) == 3:
        kwargs["in_channels"] = int(data.input_shape[0])
    if "image_size" in accepted and "image_size" not in kwargs and len(data.input_shape) == 3:
        kwargs["image_size"] = int(data.input_shape[-1])
    torch.manual_seed(config.seed)  # the initialisation is a function of the seed
    return create_model(config.model, **kwargs).to(config.device)



def resolve_recipe(config: RunConfig) -> Recipe:
    """The recipe `run_training` trains `config` with: the named recipe, its overrides, then `epochs`."""
    recipe = get_recipe(config.recipe, **config.recipe_overrides)
    if config.epochs is not None:
        recipe = recipe.replace(epochs=config.epochs)
    return recipe


def results_header(config: RunConfig, recipe: Recipe, model: torch.nn.Module, data: DataSplits) -> dict[str, Any]:
    """The results.json fields known before training (format, config, environment, recipe, model, data)."""
    return {
        "format": RESULTS_FORMAT,
        "config": config.to_dict(),
        "environment": environment_info(config.device),
        "recipe": recipe.to_dict(),
        "model": {"name": config.model, "parameters": sum(p.numel() for p in model.parameters()),
                  "config": getattr(model, "config", {})},
        "data": {"dataset": data.name, "train": len(data.train), "val": len(data.val) if data.val else 0,
                 "test": len(data.test)},
    }




def final_summary(history: History) -> dict[str, Any]:
    """results.json's `final` field for a run that ended with `history`."""
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

    def __init__(self, out_dir: Path, results: dict[str, Any], resume: bool, write: bool = True) -> None:
        # write=False: a non-zero rank of a distributed run, which reads checkpoints but writes nothing.
        self.out_dir, self.results, self.resume, self.write = out_dir, results, resume, write

    def _write(self, state: TrainState, final: bool) -> None:
        if not self.write:
            return
        self.results["history"] = state.history.epochs
        self.results["diverged"] = state.history.diverged
        self.results["diverged_at"] = state.history.diverged_at
        self.results["final"] = final_summary(state.history) if final else None
        atomic_write_json(self.out_dir / RESULTS_FILE, self.results)

    def on_fit_start(self, state: TrainState) -> None:
        """Restore the checkpoint when resuming, then write results.json."""
        if self.resume and has_checkpoint(self.out_dir):
            meta = load_checkpoint(self.out_dir, model=state.model, optimizer=state.optimizer,
                                   generator=state.generator)
            state.epoch = int(meta["epoch"])
            state.history = History.from_dict(meta["history"])
            state.elapsed_s = float(meta.get("elapsed_s", 0.0))
            if self.write:
                print(f"  resuming {self.out_dir} after epoch {state.epoch}", file=sys.stderr, flush=True)
        self._write(state, final=False)

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Checkpoint the epoch and rewrite results.json."""
        if not self.write:
            return
        save_checkpoint(self.out_dir, model=state.model, optimizer=state.optimizer, generator=state.generator,
                        epoch=state.epoch, extra={"history": state.history.to_dict(), "elapsed_s": state.elapsed_s})
        self._write(state, final=False)

    def on_fit_end(self, state: TrainState) -> None:
        """Write model.safetensors and the final results.json."""
        if self.write:
            save_model(self.out_dir / MODEL_FILE, state.model)
        self._write(state, final=True)


def check_resumable(existing: dict[str, Any], config: RunConfig, out_dir: Path) -> None:
    """Raise RunExistsError when `existing` (a results.json) holds a run of another config than `config`.

    A field that an older results.json lacks counts as its default value, so runs written before a
    field was added to RunConfig still resume."""
    defaults = RunConfig(model=config.model, depth=config.depth).to_dict()
    old = {**defaults, **existing.get("config", {})}
    new = config.to_dict()
    if config.model in MLP_FAMILIES and isinstance(old.get("model_kwargs"), dict):
        # The first layer an MLP was built with: recorded in the model's config since issue 12,
        # else the dense stem of every earlier run; compared as built, not as spelled.
        built = (existing.get("model") or {}).get("config") or {}
        old["model_kwargs"] = {"stem": built.get("stem", LEGACY_STEM), **old["model_kwargs"]}
        new["model_kwargs"] = {"stem": model_entry(config.model).parameters()["stem"], **new["model_kwargs"]}
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
        check_resumable(existing, config, out_dir)
        if existing.get("final") is not None:
            if progress:
                print(f"  {out_dir}: finished earlier, skipped", file=sys.stderr, flush=True)
            return existing
    recipe = resolve_recipe(config)
    if data is None:
        data = load_dataset(config.dataset, config.data_dir, train_on_full=config.train_on_full,
                            device=config.device, limit=config.limit)
    data = normalize_splits(data, recipe.normalize)  # training-split statistics, once, on the device
    model = build_model(config, data)
    results: dict[str, Any] = results_header(config, recipe, model, data)
    main_process = distributed.is_main_process()
    distributed.barrier()  # every rank has checked out_dir before rank 0 writes into it
    if main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
    files = _RunFiles(out_dir, results, resume, write=main_process)
    transform = RandomCropFlip(padding=4, flip_p=0.5) if recipe.augment == "crop-flip" else None
    fit(model, data, recipe, [files, *callbacks], seed=config.seed, progress=progress, train_transform=transform,
        amp=config.amp, channels_last=config.channels_last, compile_model=config.compile,
        eval_batch_size=config.eval_batch_size or DEFAULT_EVAL_BATCH)
    return results
