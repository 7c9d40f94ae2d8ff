"""Collect the issue-6 real runs into this folder: results/conv/<run>/results.json, table.md, figures.

    python results/conv/make_report.py RUNS_DIR   (RUNS_DIR holds the run directories of COMMAND.txt)

Copies each run's results.json (not its checkpoints), then writes the table and draws the figures
from the copies only, so they can be remade without retraining. Runs not (yet) in RUNS_DIR or here
are left out; an unfinished run shows how many epochs it has done.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from throughway._io import atomic_write_text, read_json
from throughway.report.conv_plots import plot_error_curves, plot_k_by_block

HERE = Path(__file__).resolve().parent
# Two separate runs (the recipe's schedule follows the number of epochs, so the 5-epoch run is not
# a prefix of the 20-epoch one).
HIGHWAY = {"highway-conv-mnist-w16-e20": "10-layer conv highway net, width 16, MNIST, 20 epochs",
           "highway-conv-mnist-w16": "10-layer conv highway net, width 16, MNIST, 5 epochs"}
# Fashion-MNIST: pre-activation ResNet-14 (width 8), ungated and gated, seed 0, 6 epochs. (The 12-epoch,
# 2-seed runs of COMMAND.txt did not finish on this machine and are not reported.)
PREACT = {"preact14-w8-gated-false": ("ungated", 0), "preact14-w8-gated-true": ("gated", 0)}
# highway paper Table 1: 10-layer conv highway net, width 16: test accuracy 99.43% best of 5 (99.4 ± 0.03).
PAPER = {name: "0.57 (best of 5); 0.60 ± 0.03 (mean of 5)" for name in HIGHWAY}


def _collect(runs_dir: str, names: list[str]) -> dict[str, dict[str, Any]]:
    results = {}
    for name in names:
        source = Path(runs_dir) / name / "results.json"
        if source.is_file():
            (HERE / name).mkdir(exist_ok=True)
            shutil.copyfile(source, HERE / name / "results.json")
        copy = HERE / name / "results.json"
        if copy.is_file():
            results[name] = read_json(copy)
    return results


def _row(label: str, result: dict[str, Any], paper: str) -> str:
    history = result["history"]
    last = history[-1] if history else {}
    planned = result["config"]["epochs"] or result["recipe"]["epochs"]
    k = f"{last['k_mean']:.3f}" if last.get("k_mean") is not None else "—"
    val = f"{last['val_error_pct']:.2f}" if last.get("val_error_pct") is not None else "—"
    test = f"{last['test_error_pct']:.2f}" if last else "—"
    hours = sum(h["epoch_time_s"] for h in history) / 3600
    return (f"| {label} | {result['model']['parameters']:,} | {len(history)} / {planned} | {hours:.1f} | {val} | "
            f"{test} | {paper} | {k} |")


def _mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} ({len(values)} seeds)"


def main(runs_dir: str) -> None:
    """Copy the runs' results.json files from `runs_dir`, write table.md and the three figures."""
    highway = _collect(runs_dir, list(HIGHWAY))
    preact = _collect(runs_dir, list(PREACT))
    lines = ["| run | parameters | epochs done / planned | training hours | val error (%) | test error (%) | "
             "paper test error (%) | mean k |", "|---|---|---|---|---|---|---|---|"]
    for name, result in highway.items():
        lines.append(_row(HIGHWAY[name], result, PAPER[name]))
    for name, result in preact.items():
        variant, seed = PREACT[name]
        lines.append(_row(f"pre-activation ResNet-14 (width 8), Fashion-MNIST, {variant}, seed {seed}", result,
                          "— (no published number)"))
    lines += ["", "Fashion-MNIST, finished runs only: test error (%) at the last epoch, mean ± sample std over "
              "seeds", "", "| model | test error (%) |", "|---|---|"]
    for variant in ("ungated", "gated"):
        finished = [r["final"]["test_error_pct"] for n, r in preact.items()
                    if PREACT[n][0] == variant and r.get("final") and not r["final"]["diverged"]]
        lines.append(f"| pre-activation ResNet-14 (width 8), {variant} | {_mean_std(finished)} |")
    atomic_write_text(HERE / "table.md", "\n".join(lines) + "\n")

    if highway:
        plot_error_curves({f"{len(r['history'])} epochs, seed 0": r for r in highway.values()},
                          HERE / "highway_conv_mnist_error.png", "10-layer conv highway net (width 16) on MNIST",
                          reference=(0.57, "paper: 0.57% test error (highway Table 1, best of 5)"))
    labelled = {f"{PREACT[n][0]}, seed {PREACT[n][1]}": r for n, r in preact.items()}
    epochs = max((len(r["history"]) for r in preact.values()), default=0)
    plot_error_curves(labelled, HERE / "preact14_fashion_error.png",
                      f"pre-activation ResNet-14 (width 8) on Fashion-MNIST, {epochs} epochs",
                      colors={label: "tab:blue" if label.startswith("ungated") else "tab:orange" for label in labelled})
    plot_k_by_block({label: r for label, r in labelled.items() if label.startswith("gated")},
                    HERE / "preact14_fashion_k.png", "gated ResNet-14 on Fashion-MNIST: k by block at the last epoch")
    print((HERE / "table.md").read_text())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python results/conv/make_report.py RUNS_DIR")
    main(sys.argv[1])
