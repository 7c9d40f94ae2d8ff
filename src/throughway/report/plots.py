"""Figures, drawn from results files only (never from live models), so they can be remade any time.

Shared by the figure modules: the architectures' colours and `save_figure` (report/figures.py:
png, svg or pdf, atomically). The MNIST depth study's figures are in report/depth_study_plots.py.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402,F401  (re-exported for the figure modules)

from .figures import save_figure  # noqa: E402  (re-exported: it used to live here)

__all__ = ["save_figure", "ARCH_COLORS", "plt"]

ARCH_COLORS = {"plain": "#d62728", "residual": "#1f77b4", "gated": "#2ca02c", "highway": "#9467bd"}
