"""A batch's checkpoint (`train_batched`): one safetensors file and batch.json in the batch's state folder.

The stacked parameters, running statistics, optimiser state and each member's data-order generator
go into `batch-eNNNN.safetensors`; batch.json names that file with its SHA-256 and holds, per
member, the progress entry every checkpoint stores (`loop_state.progress_entry`: history and
elapsed seconds, read back by `restore_progress`, the one resume path) and whether it has ended.
Written by `rundir.write_rotating`, like a run's checkpoint: the new file first, then the JSON, then the
old file is deleted.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save

from .._io import read_json_object, sha256_file
from .engine import Member
from .loop_state import progress_entry
from .rundir import BATCH_FILE, member_file, write_rotating
from .runner import RunConfig
from .stacked import StackedModels
from .stacked_optim import BatchedOptimizer

__all__ = ["config_hash", "save_batch_state", "load_batch_state", "STATE_JSON"]

_STATE_FORMAT = "throughway-batched-1"
STATE_JSON = "batch.json"


def config_hash(configs: Sequence[RunConfig], out_dirs: Sequence[Path]) -> str:
    """A short hash of the batch's configs and run folders: the default name of its state folder."""
    text = json.dumps([[str(d.resolve()), c.to_dict()] for c, d in zip(configs, out_dirs)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def save_batch_state(state_dir: Path, epoch: int, stack: StackedModels, optimizer: BatchedOptimizer,
                     members: Sequence[Member], active: Sequence[int]) -> None:
    """Checkpoint the batch after `epoch` finished epochs; `active` are the indices into `members` of the
    models still in the stack, in the stack's order."""
    tensors: dict[str, torch.Tensor] = {"flat": stack.flat, "steps": stack.steps}
    tensors.update({f"running.{k}": v for k, v in stack.running.items()})
    tensors.update({f"optim.{k}": v for k, v in optimizer.state_tensors().items()})
    for i in active:
        tensors[f"generator.{i}"] = members[i].state.generator.get_state()
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    write_rotating(state_dir, STATE_JSON, f"batch-e{epoch:04d}.safetensors", save(tensors), {
        "format": _STATE_FORMAT, "epoch": epoch, "active": list(active), "step_count": optimizer.step_count,
        "members": [{**progress_entry(m.state), "done": m.ended} for m in members],
    }, BATCH_FILE)


def load_batch_state(state_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """(batch.json, the tensors it names) of `state_dir`, checked (format, checksum, field types), or
    None when there is no batch.json; ValueError naming the file otherwise."""
    meta_path = state_dir / STATE_JSON
    if not meta_path.is_file():
        return None
    meta = read_json_object(meta_path, "a batch's state")
    if meta.get("format") != _STATE_FORMAT:
        raise ValueError(f"{meta_path}: unknown batch-state format {meta.get('format')!r}")
    path = _state_file(state_dir, meta.get("file"))
    if not path.is_file() or sha256_file(path) != meta.get("sha256"):
        raise ValueError(f"{path}: missing or damaged (checksum differs from {meta_path}); delete {state_dir} to restart the batch")
    if not (isinstance(meta.get("epoch"), int) and isinstance(meta.get("step_count"), int)
            and isinstance(meta.get("active"), list) and all(isinstance(i, int) for i in meta["active"])
            and isinstance(meta.get("members"), list) and all(isinstance(m, dict) for m in meta["members"])):
        raise ValueError(f"{meta_path}: fields 'epoch', 'step_count' (integers), 'active' (list of integers) or "
                         f"'members' (list of objects) malformed; delete {state_dir} to restart the batch")
    try:
        return meta, load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable safetensors file ({exc}); delete {state_dir} to restart the batch") from exc


def _state_file(state_dir: Path, name: Any) -> Path:
    return member_file(state_dir, name, BATCH_FILE, source=state_dir / STATE_JSON, field="file")


