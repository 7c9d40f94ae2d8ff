"""What every `throughway analyze` command shares: loading a finished run (or its latest
checkpoint) and its data, the family check, the header of every result file, the comparison with
the setting of gated-residual-v2 Tables 1 and 2, the output folder and its files (analyze_runs).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import torch
from safetensors.torch import load

from .._io import atomic_write_text, environment_info
from ..analysis.blocks import find_blocks
from ..analysis.gates import model_family
from ..data import DATASET_SHAPES, DataSplits, load_dataset
from ..models import create_model, model_entry, with_legacy_config
from ..train import RESULTS_FILE, load_model, read_results
from ..train.config import MAX_DEPTH
from ..train.checkpoint import CHECKPOINT_JSON, MODEL_FILE, check_model_config, is_int, read_checkpoint_meta
from ..study.papers import PAPER_MEAN_K
from ..study.command import command_line

__all__ = ["load_run", "GATES_FILE", "PRUNE_FILE", "HIGHWAY_FILE", "LESION_FILE"]

GATES_FILE, PRUNE_FILE, HIGHWAY_FILE, LESION_FILE = "gates.json", "prune.json", "highway.json", "lesion.json"



def run_config(model: torch.nn.Module) -> dict[str, Any]:
    return cast(dict, model.config)  # every registered model carries its config (create_model)



def run_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    return cast(torch.nn.ModuleList, model.blocks)



def refuse_linked_output(folder: Path, what: str) -> None:
    """ValueError naming `folder` when it is a symbolic link: an analysis written there would land wherever
    it points (the toolkit never writes, reads back or deletes through a link)."""
    if folder.is_symlink():
        raise ValueError(f"{folder}: is a symbolic link (to {os.readlink(folder)}; {what}); refused, nothing was "
                         f"written: give the real folder, or another --out")


def analysis_dir(run_dir: Path, out: str | os.PathLike[str] | None) -> Path:
    """`out`, or RUN_DIR/analysis, checked before anything is read: neither `out` nor the default folder
    inside the run is a symbolic link, nor is the run folder itself when the analysis goes inside it, since
    the analysis would then overwrite files wherever the link points. Creates nothing."""
    if out is not None:
        refuse_linked_output(Path(out), "--out")
        return Path(out)
    refuse_linked_output(run_dir, "the run folder, which the analysis would be written into")
    folder = run_dir / "analysis"
    refuse_linked_output(folder, "the run's analysis folder")
    return folder



# A run that is training may replace its checkpoint between two reads (finding 12).
_TRY_AGAIN = "the run may have just written a newer checkpoint: try again"


def _checkpoint_model(run_dir: Path, results: dict[str, Any],
                      device: str) -> tuple[torch.nn.Module, int, dict[str, Any] | None]:
    """The model weights of the run's latest checkpoint (checked against the SHA-256 that
    checkpoint.json records) in the model that results.json describes, the epoch they are from and
    that epoch's history record as checkpoint.json holds it.

    A run that is training rewrites its checkpoint every epoch (a new file, then checkpoint.json, then
    the old file deleted), so the file is read once, its bytes checked and loaded (never re-read),
    and the epoch's record is taken from the same checkpoint.json, not from results.json (which
    may still be one epoch behind). Every failure a concurrent write can cause
    says "try again"."""
    meta = read_checkpoint_meta(run_dir)  # validated: its file name cannot lead outside run_dir
    path = run_dir / meta["file"]
    try:
        payload = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: named by {run_dir / CHECKPOINT_JSON} but missing ({_TRY_AGAIN})") from None
    if hashlib.sha256(payload).hexdigest() != meta.get("sha256"):
        raise ValueError(f"{path}: checksum differs from {CHECKPOINT_JSON} ({_TRY_AGAIN})")
    config = with_legacy_config(dict((results.get("model") or {}).get("config") or {}))
    if "name" not in config:
        raise ValueError(f"{run_dir / RESULTS_FILE}: no model.config to rebuild the model from")
    prefix = "model."
    try:
        tensors = load(payload)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable safetensors file ({exc}); the file is damaged") from exc
    state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    # results.json is untrusted too: its model config must fit the checkpoint's tensors before anything is built.
    config = check_model_config(config, {k: tuple(v.shape) for k, v in state.items()}, run_dir / RESULTS_FILE)
    model = create_model(config.pop("name"), **config)
    model.load_state_dict(state)
    epoch = int(meta["epoch"])
    records = (meta.get("history") or {}).get("epochs") or []
    record = records[epoch - 1] if 0 < epoch <= len(records) else None
    return model.to(device).eval(), epoch, record




def load_run(run_dir: str | os.PathLike[str], device: str = "cpu",
             checkpoint: bool = False) -> tuple[dict[str, Any], torch.nn.Module]:
    """The run's results.json and its trained model (eval mode). Raises FileNotFoundError naming the
    missing file, and ValueError for a directory that is not a single training run.

    checkpoint=True analyses a run that has not finished: the model comes from its latest checkpoint,
    and the returned results' `final` is {"snapshot": True, "epochs_completed", "test_error_pct"} of
    that epoch (figures then say "after epoch N")."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: run directory not found")
    results = read_results(run_dir)
    if "config" not in results or "model" not in results.get("config", {}):
        raise ValueError(f"{run_dir / RESULTS_FILE}: not a single training run (no config.model); "
                         f"analyze needs the directory of one `throughway train` run")
    _check_run_config(results, run_dir / RESULTS_FILE)
    model_path = run_dir / MODEL_FILE
    if checkpoint:
        if not (run_dir / CHECKPOINT_JSON).is_file():
            raise FileNotFoundError(f"{run_dir / CHECKPOINT_JSON}: not found; --checkpoint needs a run that is "
                                    f"still training or was interrupted" +
                                    (" (this one has finished: drop --checkpoint)" if model_path.is_file() else ""))
        model, epoch, record = _checkpoint_model(run_dir, results, device)
        if record is None:  # a checkpoint.json of an older version, without its history
            record = next((r for r in results.get("history") or [] if r.get("epoch") == epoch), {})
        results = {**results, "final": {"snapshot": True, "epochs_completed": epoch,
                                        "test_error_pct": record.get("test_error_pct")}}
        return results, model
    if not model_path.is_file():
        hint = " (it has a checkpoint: add --checkpoint to analyse that)" if (run_dir / CHECKPOINT_JSON).is_file() else ""
        raise FileNotFoundError(f"{model_path}: not found; the run has not finished (model.safetensors is "
                                f"written when training ends){hint}")
    model = load_model(model_path, device=device)
    _check_model_matches(model, results, run_dir)
    return results, model


def _check_model_matches(model: torch.nn.Module, results: dict[str, Any], run_dir: Path) -> None:
    """ValueError naming both files when model.safetensors holds another model than results.json
    describes (its `model.config`, and `config.depth`): the analysis would otherwise report the
    weights of one model under the other's name."""
    built = with_legacy_config(dict(run_config(model)))
    recorded_model = (results.get("model") or {}).get("config")
    recorded = with_legacy_config(dict(recorded_model)) if isinstance(recorded_model, dict) else {}
    if isinstance(recorded.get("name"), str) and recorded["name"] == built.get("name"):
        # An argument added to the model after the run was recorded counts as its default value.
        defaults = {k: v for k, v in model_entry(recorded["name"]).parameters().items()
                    if v is not inspect.Parameter.empty}
        recorded = {**defaults, **recorded}
    depth = results["config"]["depth"]
    differing = [f"model.config.{k}: file {built.get(k)!r}, results {recorded.get(k)!r}"
                 for k in sorted(set(built) | set(recorded)) if recorded.get(k) != built.get(k)]
    if built.get("depth") != depth:
        differing.append(f"config.depth: file {built.get('depth')!r}, results {depth!r}")
    if differing:
        raise ValueError(f"{run_dir / MODEL_FILE}: holds another model than {run_dir / RESULTS_FILE} describes "
                         f"({'; '.join(differing)}); the files were mixed up or edited; nothing was written")



def load_run_data(results: dict[str, Any], device: str, data_dir: str | None) -> DataSplits:
    """The run's dataset as results.json's `config` describes it (dataset, train_on_full, limit, each
    checked by `load_run`), from `data_dir` (--data-dir), else $THROUGHWAY_DATA or the default cache.

    The data folder never comes from results.json: a run directory is untrusted, and its
    `config.data_dir` would choose where the toolkit downloads to and which labels it trusts
    (a hand-edited one could point the download at any folder)."""
    config = results["config"]
    return load_dataset(config["dataset"], data_dir, train_on_full=config["train_on_full"], device=device,
                        limit=config["limit"])


def _check_run_config(results: dict[str, Any], path: Path) -> None:
    """ValueError naming `path` and the field when a `config` field that analyze reads back (dataset,
    depth, train_on_full, limit, seed, epochs) has another type or value than `throughway train`
    writes; a missing train_on_full or limit (an older file) is set to its default in place."""
    config = results["config"]
    if not isinstance(config, dict):
        raise ValueError(f"{path}: field 'config' holds {type(config).__name__}; accepted: an object")
    config.setdefault("train_on_full", False)
    config.setdefault("limit", None)
    checks: dict[str, tuple[Callable[[Any], bool], str]] = {
        "dataset": (lambda v: isinstance(v, str) and v in DATASET_SHAPES, f"one of {sorted(DATASET_SHAPES)}"),
        "depth": (lambda v: is_int(v) and 1 <= v <= MAX_DEPTH, f"an integer from 1 to {MAX_DEPTH}"),
        "train_on_full": (lambda v: isinstance(v, bool), "true or false"),
        "limit": (lambda v: v is None or (is_int(v) and v >= 2), "null or an integer ≥ 2"),
        "seed": (lambda v: v is None or is_int(v), "an integer"),
        "epochs": (lambda v: v is None or (is_int(v) and v >= 1), "null or an integer ≥ 1"),
    }
    for field, (ok, accepted) in checks.items():
        if field in config and not ok(config[field]):
            raise ValueError(f"{path}: field 'config.{field}' is {config[field]!r}; accepted: {accepted} "
                             f"(the file was edited or damaged)")
    if "dataset" not in config or "depth" not in config:
        raise ValueError(f"{path}: field 'config' lacks 'dataset' or 'depth'; the file was edited or damaged")


def require_family(model: torch.nn.Module, run_dir: Path, accepted: Sequence[str], command: str) -> str:
    try:
        family = model_family(model)
    except ValueError as exc:
        raise ValueError(f"{run_dir}: `analyze {command}` needs a run of family {list(accepted)}; this run's "
                         f"model {getattr(model, 'config', {}).get('name')!r} is none of them: {exc}") from exc
    if family not in accepted:
        raise ValueError(f"{run_dir}: `analyze {command}` needs a run of family {list(accepted)}, "
                         f"but this run's model is {family!r}")
    return family



def analysis_header(run_dir: Path, results: dict[str, Any], family: str, model: torch.nn.Module) -> dict[str, Any]:
    config = results["config"]
    return {
        "run_dir": str(run_dir),
        "command": command_line(),
        "environment": environment_info(config.get("device")),
        "family": family,
        "model": model.config,
        "depth": config["depth"],
        "dataset": config["dataset"],
        "train_on_full": bool(config.get("train_on_full")),
        "run_final": results.get("final"),
    }



def finish_text(out_dir: Path, name: str, lines: list[str]) -> str:
    """The printout, also written to OUT/<name>.txt so the committed results keep it beside the JSON."""
    text = "\n".join(lines)
    atomic_write_text(out_dir / f"{name}.txt", text + "\n")
    return text



def block_names_of(model: torch.nn.Module, indices: Sequence[int]) -> str:
    """The qualified names of the blocks at `indices` (positions from 0, as the JSON files store
    them): the names `analysis.prune` and `analysis.lesion` take (analysis.blocks)."""
    names = list(find_blocks(model))
    return ", ".join(names[i] for i in indices) if indices else "none"



# The setting of gated-residual-v2 Tables 1 and 2 (§3.1): width 50, d = 2 .. 100, 100 epochs.
PAPER_TABLE_EPOCHS, PAPER_TABLE_WIDTH = 100, 50



def paper_setting_differences(results: dict[str, Any], model: torch.nn.Module) -> list[str]:
    """How the run differs from the setting of gated-residual-v2 Tables 1 and 2 (empty when it does not)."""
    config = results["config"]
    depth = int(config["depth"])
    epochs = (results.get("final") or {}).get("epochs_completed") or config.get("epochs")
    width = getattr(model, "config", {}).get("width")
    differences = []
    if depth not in PAPER_MEAN_K:
        differences.append(f"depth {depth} (the tables have d = {', '.join(map(str, sorted(PAPER_MEAN_K)))})")
    if epochs is not None and int(epochs) != PAPER_TABLE_EPOCHS:
        differences.append(f"{int(epochs)} epoch{'s' if int(epochs) != 1 else ''} "
                           f"(the paper trained {PAPER_TABLE_EPOCHS})")
    if width is not None and int(width) != PAPER_TABLE_WIDTH:
        differences.append(f"width {int(width)} (the paper's is {PAPER_TABLE_WIDTH})")
    return differences



def paper_caveat(differences: Sequence[str]) -> str:
    return ("  caveat: this run differs from the paper's setting: " + "; ".join(differences) +
            ", so the paper's number is a distant reference, not a target") if differences else ""
