"""The `throughway analyze ...` command: what a finished run learned, read from its run directory.

Not to be confused with `throughway.analysis`, the library of analyses of a model (gates, removal,
Hessian, SDI) that these commands apply to a run's saved model and data:

* `analyze`: `analyze gates|highway|lesion RUN_DIR` and `analyze redraw DIR` (prune's entry too);
* `prune`: `analyze prune RUN_DIR`, residual blocks removed one at a time;
* `bn_stats`: `analyze bn-stats RUN_DIR ... --out DIR`, BatchNorm statistics re-estimated;
* `run_files`: what they share: loading a finished run (or its latest checkpoint) and its data, the
  header of every result file, the output folder.

The command line (`cli.commands.cmd_analyze`) parses the options and calls these functions.
"""

from __future__ import annotations

from .analyze import analyze_gates, analyze_highway, analyze_lesion, analyze_prune, redraw
from .bn_stats import analyze_bn_stats

__all__ = ["analyze_gates", "analyze_highway", "analyze_lesion", "analyze_prune", "redraw", "analyze_bn_stats"]
