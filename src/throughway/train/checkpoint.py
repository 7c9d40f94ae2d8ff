"""Checkpoints: safetensors for every tensor, JSON for the rest, both written atomically.

A training checkpoint is two files in the run directory:

* `checkpoint-eNNNN.safetensors`: model state (`model.*`), optimiser tensors (`optim.<index>.<key>`),
  RNG states (`rng.*`);
* `checkpoint.json`: the epoch, the history so far, the optimiser's non-tensor state and param
  groups, and the SHA-256 of the safetensors file it belongs to.

The safetensors file is written first under a new name, then the JSON that points to it, then the
previous safetensors file is deleted; an interrupt at any point leaves a consistent pair. Nothing is
ever unpickled: loading uses safetensors and JSON only.

`save_model` / `load_model` write and read a finished model (`model.safetensors`) whose metadata
holds `model.config`, so `load_model` rebuilds it with `create_model` without other input.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from .._io import atomic_write_bytes, atomic_write_json, read_json, sha256_file
from ..models import create_model, with_legacy_config
from .flat import FlatOptimizer

__all__ = ["save_checkpoint", "load_checkpoint", "has_checkpoint", "save_model", "load_model",
           "CHECKPOINT_JSON", "MODEL_FILE"]

CHECKPOINT_JSON = "checkpoint.json"
MODEL_FILE = "model.safetensors"
FORMAT = "throughway-checkpoint-1"
MODEL_FORMAT = "throughway-model-1"


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def _optimizer_split(optimizer: torch.optim.Optimizer | FlatOptimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state_dict = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in state_dict["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{key}"] = value
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"scalars": scalars, "param_groups": state_dict["param_groups"]}


def _optimizer_join(tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    for index, entry in rest["scalars"].items():
        state.setdefault(int(index), {}).update(entry)
    return {"state": state, "param_groups": rest["param_groups"]}


def has_checkpoint(run_dir: str | os.PathLike[str]) -> bool:
    """True when `run_dir` holds a checkpoint.json."""
    return (Path(run_dir) / CHECKPOINT_JSON).is_file()


def save_checkpoint(run_dir: str | os.PathLike[str], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | FlatOptimizer,
                    generator: torch.Generator, epoch: int, extra: dict[str, Any]) -> Path:
    """Write the checkpoint after `epoch` completed epochs; `extra` (JSON-able) goes into checkpoint.json.

    Returns the path of the new safetensors file.
    """
    run_dir = Path(run_dir)
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    optim_tensors, optim_rest = _optimizer_split(optimizer)
    tensors.update(optim_tensors)
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["rng.generator"] = generator.get_state()
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    name = f"checkpoint-e{epoch:04d}.safetensors"
    path = atomic_write_bytes(run_dir / name, save(_contiguous(tensors)))
    previous = read_json(run_dir / CHECKPOINT_JSON).get("file") if has_checkpoint(run_dir) else None
    atomic_write_json(run_dir / CHECKPOINT_JSON, {
        "format": FORMAT, "epoch": epoch, "file": name, "sha256": sha256_file(path),
        "optimizer": optim_rest, **extra,
    })
    if previous and previous != name:
        (run_dir / previous).unlink(missing_ok=True)
    return path


def load_checkpoint(run_dir: str | os.PathLike[str], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | FlatOptimizer,
                    generator: torch.Generator) -> dict[str, Any]:
    """Restore model, optimiser and RNG states from `run_dir`; return checkpoint.json's content.

    Raises ValueError naming the file when the safetensors file is missing or does not match the
    SHA-256 recorded in checkpoint.json.
    """
    run_dir = Path(run_dir)
    meta = read_json(run_dir / CHECKPOINT_JSON)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{run_dir / CHECKPOINT_JSON}: unknown checkpoint format {meta.get('format')!r}")
    path = run_dir / meta["file"]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: named by {run_dir / CHECKPOINT_JSON} but missing; the run cannot be resumed")
    if sha256_file(path) != meta["sha256"]:
        raise ValueError(f"{path}: checksum differs from {CHECKPOINT_JSON}; the checkpoint is damaged")
    tensors = load_file(str(path))
    model_state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    model.load_state_dict(model_state)
    # Optimizer.load_state_dict moves state to each parameter's device itself.
    optim_tensors = {k: v for k, v in tensors.items() if k.startswith("optim.")}
    optimizer.load_state_dict(_optimizer_join(optim_tensors, meta["optimizer"]))
    torch.set_rng_state(tensors["rng.torch"])
    generator.set_state(tensors["rng.generator"])
    cuda_states = [tensors[f"rng.cuda.{i}"] for i in range(torch.cuda.device_count()) if f"rng.cuda.{i}" in tensors]
    if cuda_states:
        torch.cuda.set_rng_state_all(cuda_states)
    return meta


def save_model(path: str | os.PathLike[str], model: torch.nn.Module) -> Path:
    """Write `model`'s weights and buffers to a safetensors file with `model.config` in its metadata."""
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("save_model needs a model built by create_model (it carries model.config)")
    metadata = {"format": MODEL_FORMAT, "config": json.dumps(config)}
    return atomic_write_bytes(path, save(_contiguous(model.state_dict()), metadata=metadata))


def load_model(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> torch.nn.Module:
    """Rebuild the model saved by `save_model` (with `create_model`) and load its weights, in eval mode."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: model file not found")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if metadata.get("format") != MODEL_FORMAT or "config" not in metadata:
        raise ValueError(f"{path}: not a throughway model file (no model config in its metadata)")
    config = with_legacy_config(json.loads(metadata["config"]))
    name = config.pop("name")
    model = create_model(name, **config)
    model.load_state_dict(load_file(str(path)))
    return model.to(device).eval()
