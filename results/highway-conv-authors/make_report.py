"""Collect the issue-17 CPU runs of the authors' MNIST recipe into this folder and write table.md.

    python results/highway-conv-authors/make_report.py RUNS_DIR   (RUNS_DIR holds w16-s0/, w32-s0/)

Copies each run's results.json (not its checkpoints) and writes table.md from the copies and
cost.json only, so the table can be remade without training.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNS = ("w16-s0", "w32-s0")
# highway paper Table 1, test accuracy (%) best (mean ± std) of 5 runs, as test error (%).
PAPER = {16: "0.57 (0.60 ± 0.03)", 32: "0.45 (0.46 ± 0.02)"}
# Issue 17's text: the toolkit's earlier recipe (now highway-conv-mnist-ours, layout mnist-10-ours), 40 epochs,
# seeds 0-4, one H100. Quoted from the issue; no results file of these runs is in this repository.
ISSUE_OLD_RECIPE = {16: "0.64 (0.84 ± 0.16)", 32: "0.72 (0.80 ± 0.11)"}
# The authors' log of their width-32 run (flukeskywalker/highway-networks examples/highways/mnist-10layers/
# sample.log): test accuracy after each 600 iterations (one epoch), lines 1345, 1350, 1355, as test error (%);
# first and last timestamps 18:58:13 (line 1) and 21:03:05 (line 2844): 2 h 5 min for 180,000 iterations.
AUTHORS_LOG_TEST_ERROR = {1: 100 - 95.88, 2: 100 - 97.22, 3: 100 - 97.40}
AUTHORS_LOG_HOURS = (21 * 3600 + 3 * 60 + 5 - (18 * 3600 + 58 * 60 + 13)) / 3600


def _collect(runs_dir: str | None) -> dict[str, dict[str, Any]]:
    out = {}
    for name in RUNS:
        if runs_dir is not None and (Path(runs_dir) / name / "results.json").is_file():
            (HERE / name).mkdir(exist_ok=True)
            shutil.copyfile(Path(runs_dir) / name / "results.json", HERE / name / "results.json")
        copy = HERE / name / "results.json"
        if copy.is_file():
            out[name] = json.loads(copy.read_text())
    return out


def main() -> None:
    """Copy the runs, write table.md."""
    runs = _collect(sys.argv[1] if len(sys.argv) > 1 else None)
    cost = json.loads((HERE / "cost.json").read_text())
    per_width = {r["width"]: r for r in cost["widths"]}
    lines = ["# The authors' MNIST recipe (highway-conv-mnist, arch mnist-10) on this CPU", "",
             "First epochs of the 300-epoch schedule, seed 0, 60,000 training images (not reproductions: "
             "the schedule's first lr step is at epoch 100).", "",
             "| width | parameters | epochs done / planned | lr | train loss | train error (%) | test error (%) | "
             "the authors' log, width 32: test error (%) | wall s/epoch (shared cores) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for result in runs.values():
        width = result["model"]["config"]["width"]
        for h in result["history"]:
            lines.append(f"| {width} | {result['model']['parameters']:,} | {h['epoch']} / {result['recipe']['epochs']} | "
                         f"{h['lr']:g} | {h['train_loss']:.4f} | {h['train_error_pct']:.2f} | {h['test_error_pct']:.2f} | "
                         f"{AUTHORS_LOG_TEST_ERROR[h['epoch']]:.2f} | {h['epoch_time_s']:.0f} |")
    lines += ["", f"Cost on one dedicated core (cost.json: CPU time of {cost['steps_timed']} steps of batch 100 and "
              f"of 2,000 evaluated images, {cost['threads']} thread):", "",
              "| width | s per step | s per epoch | h per 300-epoch run | h for 5 runs |", "|---|---|---|---|---|"]
    for width, r in sorted(per_width.items()):
        lines.append(f"| {width} | {r['step_s']:.3f} | {r['epoch_s']:.0f} | {r['run_h']:.1f} | {5 * r['run_h']:.0f} |")
    lines += ["", f"5 runs × 300 epochs × widths 16 and 32: {cost['total_h_one_core']:.0f} hours on one core of this "
              f"machine ({cost['total_h_one_core'] / 24:.1f} days; the two cores are shared). GPU time: not measured "
              f"(no GPU in this session); the authors' log shows {AUTHORS_LOG_HOURS:.2f} h for their 300-epoch width-32 "
              f"run on their GPU of 2015, which would make {10 * AUTHORS_LOG_HOURS:.0f} h for the 10 runs if width 16 "
              "took as long (an upper bound on that hardware).", "",
              "Test error (%), best (mean ± std) over 5 runs:", "",
              "| width | paper, Table 1 | the authors' recipe here (5 runs × 300 epochs) | the earlier recipe "
              "(highway-conv-mnist-ours, 40 epochs; issue 17's H100 numbers, no results file here) |",
              "|---|---|---|---|"]
    for width in (16, 32):
        lines.append(f"| {width} | {PAPER[width]} | pending (needs a GPU) | {ISSUE_OLD_RECIPE[width]} |")
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    print((HERE / "table.md").read_text())


if __name__ == "__main__":
    main()
