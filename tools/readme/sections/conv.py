"""Renderer of docs/reproductions/cifar.md: the convolutional runs' table (results/conv/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from throughway.report.tables import table_header

from .common import _json


def _conv_table(root: Path) -> str:
    def final(run: str) -> dict[str, Any]:
        return _json(root, f"conv/{run}/results.json")["final"]

    long, short = final("highway-conv-mnist-w16-e20"), final("highway-conv-mnist-w16")
    plain, gated = final("preact14-w8-gated-false"), final("preact14-w8-gated-true")
    return "\n".join([
        *table_header(["run", "epochs", "test error (%)", "paper"]),
        f"| 10-layer conv highway net, width 16, MNIST (`mnist-10-ours`, `highway-conv-mnist-ours`: our layout and "
        f"schedule; the recipe was called `highway-conv-mnist` then) | "
        f"{long['epochs_completed']} | {long['test_error_pct']:.2f} | 0.57 (best of 5 runs; 0.60 ± 0.03 mean) |",
        f"| the same, a separate {short['epochs_completed']}-epoch run (the schedule follows the epoch count) | "
        f"{short['epochs_completed']} | {short['test_error_pct']:.2f} | |",
        f"| pre-activation ResNet-14 (width 8), Fashion-MNIST, ungated (`preact-cifar`) | {plain['epochs_completed']} | "
        f"{plain['test_error_pct']:.2f} | — (not in the papers) |",
        f"| the same, gated | {gated['epochs_completed']} | {gated['test_error_pct']:.2f} (mean k "
        f"{gated['k_mean']:.2f}) | — |",
    ])
