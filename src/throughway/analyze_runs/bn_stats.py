"""`throughway analyze bn-stats RUN_DIR ... --out DIR`: could BatchNorm's momentum explain a gap?

For each finished run: its test error with the running statistics it trained (PyTorch's momentum
0.1 by default), and with every BatchNorm layer's running mean and variance re-estimated exactly over
its training split (`analysis.batchnorm.reestimate_bn_statistics`: the limit of momentum → 0, which
Keras's 0.99 approaches; training itself never uses the running statistics). Runs are grouped by
model and depth; per group the mean ± std over the runs (seeds) of both errors and a paired t-test
of re-estimated − running (`report.stats`). For the MNIST MLPs gated-residual-v2 Table 1's error is
printed beside them. Writes OUT/bn_stats.json and OUT/bn_stats.txt.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from .._io import atomic_write_json, environment_info
from ..analysis.batchnorm import reestimate_bn_statistics
from ..data import DataSplits
from ..report.stats import format_mean_std, mean_std, paired_t_test
from ..report.tables import table_header, table_row
from ..train import evaluate
from .run_files import finish_text, load_run_data, load_run, refuse_linked_output
from ..study.papers import PAPER_TEST_ERROR
from ..study.command import command_line

__all__ = ["analyze_bn_stats", "BN_STATS_FILE"]

BN_STATS_FILE = "bn_stats.json"
_ARCH = {"mlp_plain": "plain", "mlp_residual": "residual", "mlp_gated_residual": "gated"}


def _mean_std(values: Sequence[float]) -> dict[str, float | None]:
    summary = mean_std(values)  # the one seeds' summary; bn_stats.json keeps only its mean and std
    return {"mean": summary["mean"], "std": summary["std"]}


def analyze_bn_stats(run_dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
                     batch_size: int = 128, seed: int = 0, device: str = "cpu",
                     data_dir: str | None = None) -> tuple[dict[str, Any], str]:
    """Test error of each finished run in `run_dirs` with its own BatchNorm running statistics and
    with statistics re-estimated over its training split (batches of `batch_size` in an order drawn
    from `seed`); per (model, depth) group mean ± std over the runs and the paired t-test of
    re-estimated − running. Writes OUT/bn_stats.json and bn_stats.txt; returns (result, text).

    Raises ValueError for an empty `run_dirs`, a run listed twice, or a model without BatchNorm;
    FileNotFoundError / ValueError from `load_run` name an unfinished or damaged run directory, and all
    runs are loaded and checked before any data is read.
    """
    if not run_dirs:
        raise ValueError("analyze bn-stats: give at least one run directory")
    refuse_linked_output(Path(out), "--out")  # before any run is read
    resolved = [Path(d).resolve() for d in run_dirs]
    if len(set(resolved)) != len(resolved):
        raise ValueError("analyze bn-stats: a run directory is listed twice; list each run once")
    loaded = [(Path(d), *load_run(d, device)) for d in run_dirs]  # every run checked before data is read
    _check_poolable([(run_dir, results) for run_dir, results, _ in loaded])
    data_cache: dict[tuple[Any, ...], DataSplits] = {}
    runs: list[dict[str, Any]] = []
    for run_dir, results, model in loaded:
        config = results["config"]
        key = (config["dataset"], config["train_on_full"], config["limit"])
        if key not in data_cache:
            data_cache[key] = load_run_data(results, device, data_dir)
        data = data_cache[key]
        if data.test is None:
            raise ValueError(f"{run_dir}: its dataset has no test split to evaluate")
        running = evaluate(model, data.test)[1]
        layers = reestimate_bn_statistics(model, data.train.x, batch_size=batch_size,
                                          generator=torch.Generator().manual_seed(seed))
        if layers == 0:
            raise ValueError(f"{run_dir}: its model has no BatchNorm layer with running statistics; "
                             f"bn-stats needs one")
        name = str(getattr(model, "config", {}).get("name"))
        runs.append({"run_dir": str(run_dir), "model": name, "depth": int(config["depth"]),
                     "seed": config.get("seed"), "bn_layers": layers,
                     "test_error_pct_recorded": (results.get("final") or {}).get("test_error_pct"),
                     "test_error_pct_running": running, "test_error_pct_reestimated": evaluate(model, data.test)[1]})
    groups = []
    for model_name, depth in sorted({(r["model"], r["depth"]) for r in runs}, key=lambda g: (g[1], g[0])):
        members = [r for r in runs if (r["model"], r["depth"]) == (model_name, depth)]
        before = [r["test_error_pct_running"] for r in members]
        after = [r["test_error_pct_reestimated"] for r in members]
        arch = _ARCH.get(model_name)
        groups.append({"model": model_name, "depth": depth, "n": len(members),
                       "running": _mean_std(before), "reestimated": _mean_std(after),
                       "test": paired_t_test(after, before).to_dict(),
                       "paper_test_error_pct": PAPER_TEST_ERROR[arch].get(depth) if arch else None})
    result = {"command": command_line(), "environment": environment_info(device), "batch_size": batch_size,
              "seed": seed, "runs": runs, "groups": groups,
              "method": "running mean/variance of every BatchNorm layer replaced by the exact average over the "
                        "training split's batches (momentum -> 0), weights unchanged"}
    out_dir = Path(out)
    atomic_write_json(out_dir / BN_STATS_FILE, result)
    return result, finish_text(out_dir, "bn_stats", _text(result, out_dir))


# What may differ between the runs pooled into one row: the seed (they are the row's samples) and how
# the run was executed, which changes no number's meaning.
_POOLED_FREELY = {"seed", "device", "data_dir", "amp", "channels_last", "compile", "eval_batch_size"}


def _check_poolable(loaded: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """ValueError naming two runs and the fields when runs of one row (same model and depth) differ
    in anything but the seed and execution options (width, recipe, epochs, dataset, model
    arguments, ...): their errors are not samples of one quantity, so a mean and a t-test over them
    would mean nothing."""
    first: dict[tuple[Any, Any], tuple[Path, dict[str, Any]]] = {}
    for run_dir, results in loaded:
        config = {k: v for k, v in results["config"].items() if k not in _POOLED_FREELY}
        config["model.config"] = (results.get("model") or {}).get("config")
        row = (config.get("model"), config.get("depth"))
        if row not in first:
            first[row] = (run_dir, config)
            continue
        other_dir, other = first[row]
        differing = sorted(k for k in set(config) | set(other) if config.get(k) != other.get(k))
        if differing:
            raise ValueError(f"analyze bn-stats: {run_dir / 'results.json'} and {other_dir / 'results.json'} would share "
                             f"the row {row[0]} d = {row[1]}, but their fields {', '.join(f'config.{k}' if k != 'model.config' else k for k in differing)} "
                             f"differ; a row pools seeds of one setting only: analyse the settings separately")


def _text(result: dict[str, Any], out_dir: Path) -> list[str]:
    lines = ["Test error (%) with the running BatchNorm statistics of training beside statistics re-estimated over "
             "the training split (momentum -> 0); mean ± std over the runs; paired t-test of re-estimated − running",
             *table_header(["model", "d", "n", "paper (Table 1)", "running", "re-estimated", "difference", "p"])]
    for g in result["groups"]:
        test = g["test"]
        paper = g["paper_test_error_pct"]
        diff = f"{test['mean_difference']:+.3f}" if test["mean_difference"] is not None else "—"
        p = f"{test['p_value']:.3f}" if test["p_value"] is not None else "—"
        lines.append(table_row([g["model"], g["depth"], g["n"], f"{paper:.2f}" if paper is not None else "—",
                                format_mean_std(g["running"]), format_mean_std(g["reestimated"]), diff, p]))
    lines.append(f"results: {out_dir / BN_STATS_FILE}")
    return lines
