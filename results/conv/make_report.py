"""Collect the issue-6 real runs into this folder: results/conv/<run>/results.json, table.md, figures.

    python results/conv/make_report.py RUNS_DIR   (RUNS_DIR holds the run directories of COMMAND.txt)

Copies each run's results.json (not its checkpoints), then draws the figures from the copies only.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from throughway._io import atomic_write_text, read_json
from throughway.report.conv_plots import plot_error_curves, plot_k_by_block

HERE = Path(__file__).resolve().parent
RUNS = {
    "highway-conv-mnist-w16": "10-layer conv highway net, width 16, MNIST",
    "preact14-w8-gated-false": "pre-activation ResNet-14 (width 8), Fashion-MNIST, ungated",
    "preact14-w8-gated-true": "pre-activation ResNet-14 (width 8), Fashion-MNIST, gated",
}
# highway paper Table 1: 10-layer conv highway net, width 16: test accuracy 99.43% best (99.4 ± 0.03).
PAPER = {"highway-conv-mnist-w16": "0.57 (best of 5); 0.60 ± 0.03 (mean)"}


def main(runs_dir: str) -> None:
    results = {}
    for name in RUNS:
        source = Path(runs_dir) / name / "results.json"
        if source.is_file():
            (HERE / name).mkdir(exist_ok=True)
            shutil.copyfile(source, HERE / name / "results.json")
        copy = HERE / name / "results.json"
        if copy.is_file():
            results[name] = read_json(copy)
    lines = ["| run | parameters | epochs done / planned | val error (%) | test error (%) | paper test error (%) | mean k |",
             "|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        history = result["history"]
        last = history[-1] if history else {}
        planned = result["config"]["epochs"] or result["recipe"]["epochs"]
        k = f"{last['k_mean']:.3f}" if last.get("k_mean") is not None else "—"
        val = f"{last['val_error_pct']:.2f}" if last.get("val_error_pct") is not None else "—"
        test = f"{last['test_error_pct']:.2f}" if last else "—"
        lines.append(f"| {RUNS[name]} | {result['model']['parameters']:,} | {len(history)} / {planned} | {val} | "
                     f"{test} | {PAPER.get(name, '— (no published number)')} | {k} |")
    atomic_write_text(HERE / "table.md", "\n".join(lines) + "\n")
    mnist = {n: r for n, r in results.items() if n.startswith("highway")}
    fashion = {("gated" if n.endswith("true") else "ungated"): r for n, r in results.items() if n.startswith("preact")}
    plot_error_curves(mnist, HERE / "highway_conv_mnist_error.png", "10-layer conv highway net (width 16) on MNIST")
    plot_error_curves(fashion, HERE / "preact14_fashion_error.png", "pre-activation ResNet-14 on Fashion-MNIST")
    plot_k_by_block({"gated": fashion["gated"]} if "gated" in fashion else {}, HERE / "preact14_fashion_k.png",
                    "gated ResNet-14 on Fashion-MNIST: final k by block")
    print((HERE / "table.md").read_text())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/work/notes/runs-conv")
