"""A stack's checkpoint (`stack.train_stacked`): the same pair as a run's (train.checkpoint), in the stack's
state folder, written after every epoch so that an interrupted stack resumes where it stopped.

`batch-eNNNN.safetensors` holds the stacked parameters, running statistics, optimiser state and each
member's data-order generator; `batch.json` names that file with its SHA-256 and holds, per member, the
progress entry every checkpoint stores (`TrainState.progress_entry`: history and elapsed seconds, read back
by `TrainState.restore_progress`, the one resume path) and whether it has ended. Both are written through
`rundir.write_rotating` (the run checkpoint's write sequence) and read back as untrusted input with
train.checkpoint's checks (`check_history`, `is_int`, `is_number`). The default state folder is
`<parent of the first run folder>/.batched/<config_hash>`. The file names and the format string keep the
word "batch" they were written with (the stack was a "batch" then).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save

from .._io import read_json_object, sha256_file
from .checkpoint import check_history, is_int, is_number
from .config import RunConfig
from .loop import Member
from .rundir import BATCH_FILE, RunDir, member_file, write_rotating
from .stacked import StackedModels, StackedOptimizer

__all__ = ["STATE_JSON", "config_hash", "save_stack_state", "load_stack_state", "check_stack_members",
           "check_stack_tensors", "remove_stack_state"]

_STATE_FORMAT = "throughway-batched-1"
STATE_JSON = "batch.json"


def config_hash(configs: Sequence[RunConfig], out_dirs: Sequence[Path], *, relative: bool = True,
                every_field: bool = False) -> str:
    """A short hash of the stack's configs and run folders: the default name of its state folder.

    The run folders enter as paths relative to the first one's parent, so a study folder that is
    moved or copied keeps its stack states. The configs enter by the fields whose values differ from
    RunConfig's defaults, so that a field added to RunConfig later, with a default, leaves the name of
    a stack in progress as it was: a name over every field orphaned such a stack, which then restarted
    from its first epoch. The names used before, still looked for on resume (`state_candidates`):
    `every_field=True` (every field, relative paths) and `relative=False` (every field, resolved
    absolute paths).
    """
    root = Path(out_dirs[0]).resolve().parent
    paths = [os.path.relpath(Path(d).resolve(), root) if relative else str(Path(d).resolve()) for d in out_dirs]
    every = every_field or not relative
    text = json.dumps([[path, c.to_dict() if every else _non_default_fields(c)] for c, path in zip(configs, paths)],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _non_default_fields(config: RunConfig) -> dict[str, Any]:
    """The fields of `config` (as `to_dict` gives them) whose values differ from their defaults; a field without
    a default is always kept."""
    values = config.to_dict()
    kept = {}
    for field in dataclasses.fields(config):
        if field.default is not dataclasses.MISSING:
            default: Any = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            kept[field.name] = values[field.name]
            continue
        if values[field.name] != default:
            kept[field.name] = values[field.name]
    return kept


def state_candidates(configs: Sequence[RunConfig], out_dirs: Sequence[Path]) -> list[Path]:
    """The default state folder of a stack (`<parent of out_dirs[0]>/.batched/<config_hash>`), then the
    names it had before (`config_hash`'s `every_field` and `relative=False`): a resumed stack takes the
    first that exists, a new one the first."""
    states = Path(out_dirs[0]).parent / ".batched"
    return [states / config_hash(configs, out_dirs), states / config_hash(configs, out_dirs, every_field=True),
            states / config_hash(configs, out_dirs, relative=False)]


def save_stack_state(state_dir: Path, epoch: int, stack: StackedModels, optimizer: StackedOptimizer,
                     members: Sequence[Member], running: Sequence[Member]) -> None:
    """Checkpoint the stack after `epoch` finished epochs: `members` are every model of the stack, `running`
    those still in it, in the stack's order. Each member's progress entry (`TrainState.progress_entry`) and
    "done" (whether it has ended) go to the JSON file, the data-order generator of each running one to the
    tensors, under its index in `members`."""
    entries = [{**m.state.progress_entry(), "done": m.ended} for m in members]
    generators = {members.index(m): m.state.generator for m in running}
    active = list(generators)
    tensors: dict[str, torch.Tensor] = {"flat": stack.flat, "steps": stack.steps}
    tensors.update({f"running.{k}": v for k, v in stack.running.items()})
    tensors.update({f"optim.{k}": v for k, v in optimizer.state_tensors().items()})
    for i, generator in generators.items():
        tensors[f"generator.{i}"] = generator.get_state()
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    write_rotating(state_dir, STATE_JSON, f"batch-e{epoch:04d}.safetensors", save(tensors), {
        "format": _STATE_FORMAT, "epoch": epoch, "active": list(active), "step_count": optimizer.step_count,
        "members": entries,
    }, BATCH_FILE)


def load_stack_state(state_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """(batch.json, the tensors it names) of a stack's `state_dir`, checked (format, checksum, field types), or
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


def check_stack_members(state_dir: Path, meta: dict[str, Any], members: int) -> None:
    """ValueError naming batch.json unless its 'members' has one entry per model of the stack (`members`)."""
    if len(meta["members"]) != members:
        raise ValueError(f"{state_dir / STATE_JSON}: field 'members' holds {len(meta['members'])} entries; this batch "
                         f"has {members} models (the file belongs to another batch or was edited); delete "
                         f"{state_dir} to restart the batch")


def check_stack_tensors(state_dir: Path, meta: dict[str, Any], tensors: dict[str, torch.Tensor],
                        expected: dict[str, torch.Tensor]) -> None:
    """Check a loaded stack state (`load_stack_state`) against the stack it should resume: exactly the
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


def remove_stack_state(state_dir: Path) -> None:
    """Delete a finished stack's state: only the files this module writes (batch.json, batch-eNNNN.safetensors)
    and their temporary files, then the folder and the default folder's .batched parent when that empties
    them; a user's own file keeps them."""
    if not state_dir.is_dir():
        return
    for f in state_dir.iterdir():
        if f.name == STATE_JSON or BATCH_FILE.fullmatch(f.name):
            f.unlink()
    RunDir(state_dir).clean_tmp()
    with contextlib.suppress(OSError):
        state_dir.rmdir()
    if state_dir.parent.name == ".batched":
        with contextlib.suppress(OSError):
            state_dir.parent.rmdir()
