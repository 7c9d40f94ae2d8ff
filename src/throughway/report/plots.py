"""Figures, drawn from results files only (never from live models), so they can be remade any time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402

from .._io import atomic_write_bytes  # noqa: E402

__all__ = ["save_figure", "ARCH_COLORS"]

ARCH_COLORS = {"plain": "#d62728", "residual": "#1f77b4", "gated": "#2ca02c", "highway": "#9467bd"}


def save_figure(fig: "plt.Figure", path: str | os.PathLike[str], dpi: int = 130) -> Path:
    """Save `fig` as PNG atomically and close it."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())
