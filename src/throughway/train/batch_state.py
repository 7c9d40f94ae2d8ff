"""A batch's checkpoint (`train_batched`): one safetensors file and batch.json in the batch's state folder.

The stacked parameters, running statistics, optimiser state and each member's data-order generator
go into `batch-eNNNN.safetensors`; batch.json names that file with its SHA-256 and holds, per
member, the progress entry every checkpoint stores (`loop.progress_entry`: history and
elapsed seconds, read back by `restore_progress`, the one resume path) and whether it has ended.
Written by `rundir.write_rotating`, like a run's checkpoint: the new file first, then the JSON, then the
old file is deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save

from .._io import read_json_object, sha256_file
from .checkpoint import check_history, is_int, is_number
from .loop import Member, progress_entry
from .rundir import BATCH_FILE, member_file, write_rotating
from .runner import RunConfig
from .stacked import StackedModels
from .optim import BatchedOptimizer

__all__ = ["config_hash", "save_batch_state", "load_batch_state", "check_batch_members", "check_batch_tensors", "STATE_JSON"]

_STATE_FORMAT = "throughway-batched-1"
STATE_JSON = "batch.json"


def config_hash(configs: Sequence[RunConfig], out_dirs: Sequence[Path], *, relative: bool = True) -> str:
    """A short hash of the batch's configs and run folders: the default name of its state folder.

    The run folders enter as paths relative to the first one's parent, so a study folder that is
    moved or copied keeps its batch states; `relative=False` gives the name used before, from the
    resolved absolute paths (still looked for on resume, see `train_batched`).
    """
    root = Path(out_dirs[0]).resolve().parent
    paths = [os.path.relpath(Path(d).resolve(), root) if relative else str(Path(d).resolve()) for d in out_dirs]
    text = json.dumps([[path, c.to_dict()] for c, path in zip(configs, paths)], sort_keys=True, default=str)
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
    if not (is_int(meta.get("epoch")) and meta["epoch"] >= 0 and is_int(meta.get("step_count"))
            and meta["step_count"] >= 0
            and isinstance(meta.get("active"), list) and all(is_int(i) for i in meta["active"])
            and isinstance(meta.get("members"), list) and all(isinstance(m, dict) for m in meta["members"])):
        raise ValueError(f"{meta_path}: fields 'epoch', 'step_count' (integers ≥ 0), 'active' (list of integers) or "
                         f"'members' (list of objects) malformed; delete {state_dir} to restart the batch")
    members, active = meta["members"], meta["active"]
    # `active`: the members still in the stack, in the stack's (ascending) order; every other member has ended.
    if not active or active != sorted(set(active)) or active[0] < 0 or active[-1] >= len(members):
        raise ValueError(f"{meta_path}: field 'active' is {active}; accepted: distinct member indices in ascending "
                         f"order, 0..{len(members) - 1} (the file was edited or damaged); delete {state_dir} to "
                         f"restart the batch")
    for i, entry in enumerate(members):
        running = i in active
        check_history(meta_path, f"members[{i}].history", entry.get("history"),
                      epochs=meta["epoch"] if running else None, ended=not running)
        if not running and len(entry["history"]["epochs"]) > meta["epoch"]:
            raise ValueError(f"{meta_path}: field 'members[{i}].history.epochs' holds more records than the batch's "
                             f"'epoch' ({meta['epoch']}); delete {state_dir} to restart the batch")
        if not (is_number(entry.get("elapsed_s", 0.0)) and isinstance(entry.get("done", False), bool)):
            raise ValueError(f"{meta_path}: field 'members[{i}]' needs 'elapsed_s' (a number of seconds) and 'done' "
                             f"(bool); the file was edited or damaged; delete {state_dir} to restart the batch")
    try:
        return meta, load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable safetensors file ({exc}); delete {state_dir} to restart the batch") from exc


def _state_file(state_dir: Path, name: Any) -> Path:
    return member_file(state_dir, name, BATCH_FILE, source=state_dir / STATE_JSON, field="file")




def check_batch_members(state_dir: Path, meta: dict[str, Any], members: int) -> None:
    """ValueError naming batch.json unless its 'members' has one entry per model of the batch (`members`)."""
    if len(meta["members"]) != members:
        raise ValueError(f"{state_dir / STATE_JSON}: field 'members' holds {len(meta['members'])} entries; this batch "
                         f"has {members} models (the file belongs to another batch or was edited); delete "
                         f"{state_dir} to restart the batch")


def check_batch_tensors(state_dir: Path, meta: dict[str, Any], tensors: dict[str, torch.Tensor],
                        expected: dict[str, torch.Tensor]) -> None:
    """Check a loaded batch state (`load_batch_state`) against the batch it should resume: exactly the
    tensors of `expected` (name -> a tensor of the resumed stack and optimiser, for its shape).
    ValueError naming the files otherwise; nothing is changed."""
    meta_path = state_dir / STATE_JSON
    path = state_dir / str(meta["file"])
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    wrong = sorted(k for k in set(expected) & set(tensors) if tuple(tensors[k].shape) != tuple(expected[k].shape))
    if missing or extra or wrong:
        details = "; ".join(part for part in (
            f"missing {missing[:3]}" if missing else "", f"unexpected {extra[:3]}" if extra else "",
            ", ".join(f"{k}: file {tuple(tensors[k].shape)}, batch {tuple(expected[k].shape)}" for k in wrong[:3]))
            if part)
        raise ValueError(f"{path} with {meta_path}: does not fit this batch ({details}); the state belongs to another "
                         f"batch or was edited; delete {state_dir} to restart the batch")
