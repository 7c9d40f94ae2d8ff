"""What every `throughway analyze` command shares: loading a finished run (or its latest
checkpoint) and its data, the family check, the header of every result file, the comparison with
the setting of gated-residual-v2 Tables 1 and 2, the output folder and its files (study.analyze).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import torch
from safetensors.torch import load_file

from .._io import atomic_write_text, environment_info, sha256_file
from ..analysis.blocks import find_blocks
from ..analysis.gates import model_family
from ..data import DataSplits, load_dataset
from ..models import create_model, with_legacy_config
from ..train import RESULTS_FILE, evaluate, load_model, read_results
from ..train.checkpoint import CHECKPOINT_JSON, MODEL_FILE, check_model_config, read_checkpoint_meta
from .papers import PAPER_MEAN_K
from .runs import command_line

__all__ = ["load_run", "GATES_FILE", "PRUNE_FILE", "HIGHWAY_FILE", "LESION_FILE"]

GATES_FILE, PRUNE_FILE, HIGHWAY_FILE, LESION_FILE = "gates.json", "prune.json", "highway.json", "lesion.json"



def _config(model: torch.nn.Module) -> dict[str, Any]:
    return cast(dict, model.config)  # every registered model carries its config (create_model)



def _blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    return cast(torch.nn.ModuleList, model.blocks)



def _out_dir(run_dir: Path, out: str | os.PathLike[str] | None) -> Path:
    return Path(out) if out is not None else run_dir / "analysis"



def _checkpoint_model(run_dir: Path, results: dict[str, Any], device: str) -> tuple[torch.nn.Module, int]:
    """The model weights of the run's latest checkpoint (checked against the SHA-256 that
    checkpoint.json records) in the model that results.json describes, and the epoch they are from."""
    meta = read_checkpoint_meta(run_dir)  # validated: its file name cannot lead outside run_dir
    path = run_dir / meta["file"]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: named by {run_dir / CHECKPOINT_JSON} but missing")
    if sha256_file(path) != meta.get("sha256"):
        raise ValueError(f"{path}: checksum differs from {CHECKPOINT_JSON} (the run may have just written a "
                         f"newer checkpoint: try again)")
    config = with_legacy_config(dict((results.get("model") or {}).get("config") or {}))
    if "name" not in config:
        raise ValueError(f"{run_dir / RESULTS_FILE}: no model.config to rebuild the model from")
    prefix = "model."
    state = {k[len(prefix):]: v for k, v in load_file(str(path)).items() if k.startswith(prefix)}
    # results.json is untrusted too: its model config must fit the checkpoint's tensors before anything is built.
    config = check_model_config(config, {k: tuple(v.shape) for k, v in state.items()}, run_dir / RESULTS_FILE)
    model = create_model(config.pop("name"), **config)
    model.load_state_dict(state)
    return model.to(device).eval(), int(meta["epoch"])



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
    model_path = run_dir / MODEL_FILE
    if checkpoint:
        if not (run_dir / CHECKPOINT_JSON).is_file():
            raise FileNotFoundError(f"{run_dir / CHECKPOINT_JSON}: not found; --checkpoint needs a run that is "
                                    f"still training or was interrupted" +
                                    (" (this one has finished: drop --checkpoint)" if model_path.is_file() else ""))
        model, epoch = _checkpoint_model(run_dir, results, device)
        history = results.get("history") or []
        record: dict[str, Any] = next((r for r in history if r.get("epoch") == epoch), {})
        results = {**results, "final": {"snapshot": True, "epochs_completed": epoch,
                                        "test_error_pct": record.get("test_error_pct")}}
        return results, model
    if not model_path.is_file():
        hint = " (it has a checkpoint: add --checkpoint to analyse that)" if (run_dir / CHECKPOINT_JSON).is_file() else ""
        raise FileNotFoundError(f"{model_path}: not found; the run has not finished (model.safetensors is "
                                f"written when training ends){hint}")
    return results, load_model(model_path, device=device)



def _load_data(results: dict[str, Any], device: str, data_dir: str | None) -> DataSplits:
    config = results["config"]
    return load_dataset(config["dataset"], data_dir if data_dir is not None else config.get("data_dir"),
                        train_on_full=bool(config.get("train_on_full")), device=device, limit=config.get("limit"))



def _require_family(model: torch.nn.Module, run_dir: Path, accepted: Sequence[str], command: str) -> str:
    try:
        family = model_family(model)
    except ValueError as exc:
        raise ValueError(f"{run_dir}: `analyze {command}` needs a run of family {list(accepted)}; this run's "
                         f"model {getattr(model, 'config', {}).get('name')!r} is none of them: {exc}") from exc
    if family not in accepted:
        raise ValueError(f"{run_dir}: `analyze {command}` needs a run of family {list(accepted)}, "
                         f"but this run's model is {family!r}")
    return family



def _header(run_dir: Path, results: dict[str, Any], family: str, model: torch.nn.Module) -> dict[str, Any]:
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



def _accuracy(split: Any) -> Callable[[torch.nn.Module], float]:
    return lambda m: 100.0 - evaluate(m, split)[1]



def _finish_text(out_dir: Path, name: str, lines: list[str]) -> str:
    """The printout, also written to OUT/<name>.txt so the committed results keep it beside the JSON."""
    text = "\n".join(lines)
    atomic_write_text(out_dir / f"{name}.txt", text + "\n")
    return text



def _block_names(model: torch.nn.Module, indices: Sequence[int]) -> str:
    """The qualified names of the blocks at `indices` (positions from 0, as the JSON files store
    them): the names `analysis.prune` and `analysis.lesion` take (analysis.blocks)."""
    names = list(find_blocks(model))
    return ", ".join(names[i] for i in indices) if indices else "none"



# The setting of gated-residual-v2 Tables 1 and 2 (§3.1): width 50, d = 2 .. 100, 100 epochs.
PAPER_TABLE_EPOCHS, PAPER_TABLE_WIDTH = 100, 50



def _paper_setting_differences(results: dict[str, Any], model: torch.nn.Module) -> list[str]:
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



def _paper_caveat(differences: Sequence[str]) -> str:
    return ("  caveat: this run differs from the paper's setting: " + "; ".join(differences) +
            ", so the paper's number is a distant reference, not a target") if differences else ""
