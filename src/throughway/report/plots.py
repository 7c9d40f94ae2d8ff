"""Figures, drawn from results files only (never from live models), so they can be remade any time.

Shared by the figure modules: the architectures' colours, and `subplots` and `save_figure`
(report/figures.py: a figure of its own, written as png, svg or pdf, atomically; the user's matplotlib
backend is never chosen or changed). The MNIST depth study's figures are in report/depth_study_plots.py.
"""

from __future__ import annotations


from .figures import save_figure, subplots  # re-exported: save_figure used to live here

__all__ = ["save_figure", "subplots", "ARCH_COLORS"]

ARCH_COLORS = {"plain": "#d62728", "residual": "#1f77b4", "gated": "#2ca02c", "highway": "#9467bd"}
