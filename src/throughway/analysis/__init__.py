"""Analyses: distance to identity (`sdi`, `distance`), gate statistics (`gates`), lesioning and
physical pruning (`removal`), the blocks of any model (`blocks`), the Hessian (`hessian`).

Every gate and removal analysis finds the blocks by type wherever they sit in the model
(`find_blocks`), so it works on a researcher's own nn.Module; blocks are named by qualified name
("blocks.3") or by position from 0.

The most used functions are importable from here, the context manager included:
`from throughway.analysis import k_statistics, lesion, prune` and then `with lesion(model, 0): ...`.
(The function `sdi` shares its submodule's name: `from throughway.analysis.sdi import sdi`.)
"""

from .blocks import find_blocks, find_branches
from .gates import gate_statistics, k_statistics, model_family
from .importance import angular_spans, block_influence, importance_order, span_removal_curve
from .removal import (check_prunable, lesion, prune, removable_blocks, removal_curve, removal_order,
                      unremovable_blocks)

__all__ = ["angular_spans", "block_influence", "check_prunable", "find_blocks", "find_branches", "gate_statistics",
           "importance_order", "k_statistics", "lesion", "model_family", "prune", "removable_blocks", "removal_curve",
           "removal_order", "span_removal_curve", "unremovable_blocks"]
