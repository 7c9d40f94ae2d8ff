"""Checkpoints: safetensors for every tensor, JSON for the rest, both written atomically.

A training checkpoint is two files in the run directory:

* `checkpoint-eNNNN.safetensors`: model state (`model.*`), optimiser tensors (`optim.<index>.<key>`),
  RNG states (`rng.*`);
* `checkpoint.json`: the epoch, the history so far, the optimiser's non-tensor state and param
  groups, and the SHA-256 of the safetensors file it belongs to.

The safetensors file is written first under a new name, then the JSON that points to it, then the
previous safetensors file is deleted; an interrupt at any point leaves a consistent pair. Nothing is
ever unpickled: loading uses safetensors and JSON only.

A stack's checkpoint (`stack.train_stacked`) is the same pair in the stack's state folder, written
and read by train.stack_checkpoint with this module's checks (`check_history`, `is_int`, `is_number`).

`save_model` / `load_model` write and read a finished model (`model.safetensors`): the state of any
nn.Module, with `model.config` in the metadata when the model has one (a registry model), so that
`load_model(path)` rebuilds it with `create_model` without other input. A researcher's own module
loads into a module the caller builds, as timm's `load_checkpoint(model, path)` does:
`load_model(path, model=MyNet())`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeGuard

import torch
from safetensors.torch import load_file, save

from .._io import atomic_write_bytes, read_json_object, sha256_file
from ..layers.adapters import check_gates_record, legacy_gate_renames, with_recorded_gates
from ..models import create_model, with_legacy_config
from .rundir import CHECKPOINT_FILE, CHECKPOINT_JSON, MODEL_FILE, RunDir, write_rotating

__all__ = ["save_checkpoint", "load_checkpoint", "has_checkpoint", "save_model", "load_model",
           "read_checkpoint_meta", "verify_checkpoint_file", "check_history", "check_model_config", "CHECKPOINT_JSON", "MODEL_FILE",
           "MAX_MODEL_PARAMETERS", "is_int", "is_number"]

# load_model refuses a file whose metadata describes a larger model (4 GB of float32): a model file is
# untrusted input, and its metadata must not make the loader allocate without bound.
MAX_MODEL_PARAMETERS = 1_000_000_000
FORMAT = "throughway-checkpoint-1"
MODEL_FORMAT = "throughway-model-1"


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def _optimizer_split(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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


def save_checkpoint(run_dir: str | os.PathLike[str], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
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
    return write_rotating(run_dir, CHECKPOINT_JSON, f"checkpoint-e{epoch:04d}.safetensors", save(_contiguous(tensors)),
                          {"format": FORMAT, "epoch": epoch, "optimizer": optim_rest, **extra}, CHECKPOINT_FILE)


def _field_error(path: Path, field: str, value: Any, accepted: str) -> ValueError:
    text = json.dumps(value, default=str)
    text = text if len(text) <= 80 else text[:80] + "…"
    return ValueError(f"{path}: field {field!r} is {text}; accepted: {accepted} (the file was edited or damaged; "
                      f"delete the run directory or choose another --out to start afresh)")


def is_int(value: Any) -> TypeGuard[int]:
    """Whether a value read from JSON is an integer (True and False are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


# The numbers of a history record (`History`): each a number or null; `k` a list of numbers or null.
_RECORD_NUMBERS = ("lr", "train_loss", "train_error_pct", "val_loss", "val_error_pct", "test_loss", "test_error_pct",
                   "k_mean", "epoch_time_s", "elapsed_s")


def is_number(value: Any) -> bool:
    """Whether a value read from JSON is a number (True and False are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_history(path: Path, field: str, history: Any, *, epochs: int | None = None, ended: bool = False) -> None:
    """Check a `History.to_dict()` read from field `field` of file `path`: 'epochs' a list of records
    numbered 1, 2, ... whose numbers (`_RECORD_NUMBERS`, `k`) are numbers or null, 'diverged' a bool and
    'diverged_at' null or an object. `epochs`: the number of records it must hold (a member still
    training); `ended=False`: it must not have diverged. ValueError naming `path` and the field otherwise."""
    records = history.get("epochs") if isinstance(history, dict) else None
    if not (isinstance(history, dict) and isinstance(records, list) and all(isinstance(r, dict) for r in records)
            and isinstance(history.get("diverged"), bool)
            and (history.get("diverged_at") is None or isinstance(history.get("diverged_at"), dict))
            and (ended or (history["diverged"] is False and history.get("diverged_at") is None))):
        raise _field_error(path, field, history, "an object with 'epochs' (list of objects), 'diverged' "
                                                 + ("(bool) and 'diverged_at' (null or an object)" if ended
                                                    else "false and 'diverged_at' null"))
    if epochs is not None and len(records) != epochs:
        raise _field_error(path, f"{field}.epochs", f"{len(records)} records",
                           f"one record per finished epoch ({epochs}, the field 'epoch')")
    for i, record in enumerate(records):
        k = record.get("k")
        if not (is_int(record.get("epoch")) and record["epoch"] == i + 1
                and all(record.get(key) is None or is_number(record[key]) for key in _RECORD_NUMBERS)
                and (k is None or (isinstance(k, list) and all(is_number(v) for v in k)))):
            raise _field_error(path, f"{field}.epochs[{i}]", record,
                               f"a record with epoch {i + 1}, numbers (or null) for {', '.join(_RECORD_NUMBERS)} "
                               f"and a list of numbers (or null) for k")


def read_checkpoint_meta(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """checkpoint.json of `run_dir`, validated: every field has the type and form `save_checkpoint`
    writes, and `file` names a checkpoint-eNNNN.safetensors inside `run_dir` (see `rundir.member_file`).

    Raises ValueError naming the file and the field otherwise. Reads nothing but checkpoint.json.
    """
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT_JSON
    meta = read_json_object(path, "a training checkpoint's description")
    if meta.get("format") != FORMAT:
        raise _field_error(path, "format", meta.get("format"), repr(FORMAT))
    epoch = meta.get("epoch")
    if not is_int(epoch) or epoch < 0:
        raise _field_error(path, "epoch", epoch, "an integer ≥ 0")
    RunDir(run_dir).checkpoint_file(meta.get("file"))
    sha = meta.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise _field_error(path, "sha256", sha, "64 lower-case hex digits")
    optimizer = meta.get("optimizer")
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("scalars"), dict)
            and isinstance(optimizer.get("param_groups"), list)
            and all(isinstance(g, dict) for g in optimizer["param_groups"])
            and all(isinstance(v, dict) for v in optimizer["scalars"].values())):
        raise _field_error(path, "optimizer", optimizer, "an object with 'scalars' (object of objects) and "
                                                         "'param_groups' (list of objects)")
    if "history" in meta:
        # A checkpoint is written only after a finished epoch, never after a divergence.
        check_history(path, "history", meta.get("history"), epochs=epoch)
    for key in ("config", "model"):
        if key in meta and not isinstance(meta[key], dict):
            raise _field_error(path, key, meta[key], "an object")
    if "elapsed_s" in meta and not (isinstance(meta["elapsed_s"], (int, float)) and not isinstance(meta["elapsed_s"], bool)):
        raise _field_error(path, "elapsed_s", meta["elapsed_s"], "a number of seconds")
    return meta


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable safetensors file ({exc}); the file is truncated or damaged") from exc


def verify_checkpoint_file(run_dir: str | os.PathLike[str], meta: dict[str, Any]) -> Path:
    """The checkpoint file that `meta` (a validated checkpoint.json) names, after checking that it
    exists and matches the recorded SHA-256; FileNotFoundError / ValueError naming the file otherwise."""
    run_dir = Path(run_dir)
    path = RunDir(run_dir).checkpoint_file(meta.get("file"))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: named by {run_dir / CHECKPOINT_JSON} but missing; the run cannot be resumed")
    if sha256_file(path) != meta["sha256"]:
        raise ValueError(f"{path}: checksum differs from {CHECKPOINT_JSON}; the checkpoint is damaged (truncated or edited)")
    return path


def load_checkpoint(run_dir: str | os.PathLike[str], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    generator: torch.Generator) -> dict[str, Any]:
    """Restore model, optimiser and RNG states from `run_dir`; return checkpoint.json's content.

    Raises ValueError naming the file when the safetensors file is missing or does not match the
    SHA-256 recorded in checkpoint.json.
    """
    run_dir = Path(run_dir)
    meta = read_checkpoint_meta(run_dir)
    path = verify_checkpoint_file(run_dir, meta)
    tensors = _load_tensors(path)
    model_state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        model.load_state_dict(model_state)
        # Optimizer.load_state_dict moves state to each parameter's device itself.
        optim_tensors = {k: v for k, v in tensors.items() if k.startswith("optim.")}
        optimizer.load_state_dict(_optimizer_join(optim_tensors, meta["optimizer"]))
        torch.set_rng_state(tensors["rng.torch"])
        generator.set_state(tensors["rng.generator"])
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as exc:
        raise ValueError(f"{path} with {run_dir / CHECKPOINT_JSON}: does not fit this run's model and optimiser "
                         f"({str(exc)[:300]}); the checkpoint belongs to another run or was edited") from exc
    cuda_states = [tensors[f"rng.cuda.{i}"] for i in range(torch.cuda.device_count()) if f"rng.cuda.{i}" in tensors]
    if cuda_states:
        torch.cuda.set_rng_state_all(cuda_states)
    return meta


# torch.compile wraps a model in an OptimizedModule whose state_dict keys carry this prefix.
_COMPILED_PREFIX = "_orig_mod."


def save_model(path: str | os.PathLike[str], model: torch.nn.Module) -> Path:
    """Write the weights and buffers of any nn.Module (its state_dict) to a safetensors file, atomically.

    The config is optional metadata: a model built by `create_model` carries `model.config`, which
    goes into the file so that `load_model(path)` rebuilds it alone; any other module is saved with
    its class name only (informational) and loads with `load_model(path, model=...)`. A
    `torch.compile`d model is saved as the model it wraps, so the file's keys are the plain ones.
    Returns the path written."""
    model = getattr(model, "_orig_mod", model)
    config = getattr(model, "config", None)
    metadata = {"format": MODEL_FORMAT, "class": f"{type(model).__module__}.{type(model).__qualname__}"}
    if isinstance(config, dict):  # the registry's config; another library's (a Hugging Face config) is not ours
        metadata["config"] = json.dumps(config)
    gates = getattr(model, "gates_added", None)
    if isinstance(gates, dict):  # add_gates after create_model: load_model adds them again before loading
        metadata["gates_added"] = json.dumps(gates)
    return atomic_write_bytes(path, save(_contiguous(model.state_dict()), metadata=metadata))


def check_model_config(config: Any, shapes: dict[str, tuple[int, ...]], source: str | os.PathLike[str],
                       gates: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check a model config ({"name": ..., **arguments}, read from file `source`) against the tensor
    `shapes` that should fill it, without allocating the model; return the config (legacy stem and layout added, `with_legacy_config`).

    The model is built on the meta device (no memory), after a cheap bound that keeps a file from
    making even that slow: every layer holds at least one tensor, so a `depth` above the file's
    tensor count is refused at once; `gates` (the file's checked `gates_added` record) adds the gates
    added after create_model. Refused too: more than MAX_MODEL_PARAMETERS parameters, unknown model
    names or arguments, and any missing, extra or differently shaped tensor. Raises ValueError naming
    `source`. `shapes` is renamed in place when the file names gates the way older files did.
    """
    if not (isinstance(config, dict) and isinstance(config.get("name"), str)):
        raise ValueError(f"{source}: metadata field 'config' is not an object with a model 'name'")
    config = with_legacy_config(dict(config))
    name = config.pop("name")
    depth = config.get("depth")
    if isinstance(depth, int) and not isinstance(depth, bool) and depth > max(len(shapes), 1):
        raise ValueError(f"{source}: config says depth={depth}, but the file holds only {len(shapes)} tensors "
                         f"(each layer has at least one); the metadata does not describe these weights")
    for key, value in config.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_MODEL_PARAMETERS:
            raise ValueError(f"{source}: config field {key!r} = {value} is beyond any model this toolkit builds")
    try:
        with torch.device("meta"):
            skeleton = with_recorded_gates(create_model(name, **config), gates)
    except (KeyError, TypeError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ValueError(f"{source}: metadata field 'config' does not describe a model ({message})") from exc
    count = sum(p.numel() for p in skeleton.parameters())
    if count > MAX_MODEL_PARAMETERS:
        raise ValueError(f"{source}: config describes {count:,} parameters; refused above "
                         f"{MAX_MODEL_PARAMETERS:,} (MAX_MODEL_PARAMETERS)")
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    for old, new in legacy_gate_renames(skeleton, shapes).items():
        shapes[new] = shapes.pop(old)
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    wrong = sorted(k for k in set(expected) & set(shapes) if tuple(shapes[k]) != expected[k])
    if missing or extra or wrong:
        details = "; ".join(part for part in (
            f"missing {missing[:3]}" if missing else "", f"unexpected {extra[:3]}" if extra else "",
            ", ".join(f"{k}: file {tuple(shapes[k])}, config {expected[k]}" for k in wrong[:3])) if part)
        raise ValueError(f"{source}: the tensors do not match the model its metadata describes ({details})")
    return {"name": name, **config}


def _load_into(path: Path, model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], compiled: bool,
               device: str | torch.device) -> torch.nn.Module:
    """Load the file's tensors into the caller's `model` after checking names and shapes against it."""
    target = getattr(model, "_orig_mod", model)
    renames = legacy_gate_renames(target, shapes)
    for old, new in renames.items():
        shapes[new] = shapes.pop(old)
    expected = {k: tuple(v.shape) for k, v in target.state_dict().items()}
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    wrong = sorted(k for k in set(expected) & set(shapes) if shapes[k] != expected[k])
    if missing or extra or wrong:
        details = "; ".join(part for part in (
            f"missing in the file {missing[:3]}" if missing else "", f"not in the model {extra[:3]}" if extra else "",
            ", ".join(f"{k}: file {shapes[k]}, model {expected[k]}" for k in wrong[:3])) if part)
        raise ValueError(f"{path}: the tensors do not fit the {type(target).__name__} given as model= ({details}); "
                         f"build the module the file was saved from")
    state = _load_tensors(path)
    if compiled:
        state = {key[len(_COMPILED_PREFIX):]: value for key, value in state.items()}
    state_renames = legacy_gate_renames(target, state)
    state = {state_renames.get(key, key): value for key, value in state.items()}
    # load_state_dict casts silently: an integer tensor where a float belongs is the file's fault, said so.
    tensors = target.state_dict()
    retyped = sorted(k for k, v in state.items() if k in tensors and v.dtype != tensors[k].dtype)
    if retyped and all(state[k].is_floating_point() and tensors[k].is_floating_point() for k in retyped):
        # A good file and a module converted to another floating dtype (model.double()): the module's fault,
        # not the file's.
        first = retyped[0]
        raise ValueError(f"model: the {type(target).__name__} given as model= is {tensors[first].dtype} (tensor "
                         f"{first!r}; {len(retyped)} tensor(s) differ) but {path} holds {state[first].dtype}; "
                         f"accepted: a module of the file's dtype: load into it built in {state[first].dtype}, "
                         f"then convert it (model.to(dtype))")
    if retyped:
        raise ValueError(f"{path}: tensor {retyped[0]!r} is {state[retyped[0]].dtype}, the model's is "
                         f"{tensors[retyped[0]].dtype} ({len(retyped)} tensor(s) of another type); the file was edited "
                         f"or damaged")
    target.load_state_dict(state)
    return model.to(device).eval()


def load_model(path: str | os.PathLike[str], device: str | torch.device = "cpu", *,
               model: torch.nn.Module | None = None) -> torch.nn.Module:
    """The model saved by `save_model`, with its weights, on `device`, in eval mode.

    Without `model`, the file's config rebuilds it with `create_model` (a registry model). With
    `model` (a module the caller builds, e.g. `load_model(path, model=MyNet())`, as timm's
    `load_checkpoint(model, path)`), the file's tensors are loaded into it in place and it is
    returned: every tensor's name and shape must match its state_dict, checked before any tensor is
    read (ValueError naming the file and the tensors otherwise); a config in the file is ignored.
    A file saved without a config (a user's own module) needs `model` (ValueError saying so).

    The file is untrusted: its metadata is checked against its tensors' shapes before anything is
    allocated (`check_model_config`), and a truncated or damaged file raises ValueError naming it.
    Files whose keys carry torch.compile's `_orig_mod.` prefix (written by an older `save_model`
    from a compiled model) load too.
    """
    from safetensors import safe_open

    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: got {type(model).__name__} {str(model)[:40]!r}; accepted: the torch.nn.Module to "
                        f"load the file's tensors into (e.g. load_model(path, model=MyNet())), or None to rebuild a "
                        f"registry model from the file's config")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: model file not found")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
        compiled = bool(shapes) and all(key.startswith(_COMPILED_PREFIX) for key in shapes)
        if compiled:
            shapes = {key[len(_COMPILED_PREFIX):]: shape for key, shape in shapes.items()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable safetensors file ({exc}); the file is truncated or damaged") from exc
    if metadata.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path}: not a throughway model file (its metadata has no format {MODEL_FORMAT!r})")
    if model is not None:
        return _load_into(path, model, shapes, compiled, device)
    if "config" not in metadata:
        raise ValueError(f"{path}: holds no model config (saved from a {metadata.get('class', 'module')} not built "
                         f"by create_model); build that module and pass it: load_model(path, model=...)")
    try:
        config = json.loads(metadata["config"])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: metadata field 'config' is not valid JSON ({exc})") from exc
    except RecursionError:  # "[" * 100000: Python's parser gives up; the file's fault, not a crash
        raise ValueError(f"{path}: metadata field 'config' is JSON nested too deeply to read; the file was edited "
                         f"or damaged") from None
    gates = None
    if "gates_added" in metadata:
        try:
            gates = check_gates_record(json.loads(metadata["gates_added"]), str(path))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: metadata field 'gates_added' is not valid JSON ({exc})") from exc
    config = check_model_config(config, shapes, path, gates)
    name = config.pop("name")
    return _load_into(path, with_recorded_gates(create_model(name, **config), gates), shapes, compiled, device)
