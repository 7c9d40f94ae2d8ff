"""Analyses: distance to identity (`sdi`, `distance`), gate statistics (`gates`), lesioning and
physical pruning (`lesion`), the Hessian (`hessian`).

The most used functions are importable from here: `from throughway.analysis import prune`. The
context manager `lesion` and the function `sdi` share their submodules' names, so they are imported
from the submodules: `from throughway.analysis.lesion import lesion`,
`from throughway.analysis.sdi import sdi`.
"""

from .gates import k_statistics
from .lesion import check_prunable, prune, removal_curve, removal_order

__all__ = ["check_prunable", "k_statistics", "prune", "removal_curve", "removal_order"]
