"""The papers' reported numbers that more than one part of the toolkit prints beside ours.

Each constant names its paper, table and unit. The experiments that reproduce a table import it
from here, and so does the `analyze` command, which compares one run with the same table.
"""

from __future__ import annotations

__all__ = ["PAPER_TEST_ERROR", "PAPER_MEAN_K"]

# gated-residual-v2 Table 1 (= v1 Table 2): MNIST test error (%) of the fully connected nets by d.
PAPER_TEST_ERROR: dict[str, dict[int, float]] = {
    "plain": {2: 2.29, 10: 2.22, 20: 2.21, 50: 60.37, 100: 90.20},
    "residual": {2: 2.20, 10: 1.64, 20: 1.61, 50: 1.62, 100: 1.50},
    "gated": {2: 2.17, 10: 1.60, 20: 1.57, 50: 1.48, 100: 1.26},
}
# gated-residual-v2 Table 2 (= v1 Table 3): mean k of the gated residual nets by d.
PAPER_MEAN_K: dict[int, float] = {2: 5.58, 10: 2.54, 20: 1.73, 50: 1.04, 100: 0.67}
