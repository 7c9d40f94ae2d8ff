"""The one place figures are written: `save_figure`, and the file format it writes.

Every plotting function of `throughway.report` names its output with a `.png` path and hands the
figure to `save_figure`. Inside `with figure_format("svg"):` (or "pdf") the same call writes the
vector file instead, beside where the PNG would be (`x.png` -> `x.svg`), so a command's
`--format` reaches every figure without every plotting function taking a format argument.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
from pathlib import Path
from typing import Iterator

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402

from .._io import atomic_write_bytes  # noqa: E402

__all__ = ["FIGURE_FORMATS", "figure_format", "current_figure_format", "save_figure"]

FIGURE_FORMATS = ("png", "svg", "pdf")

_FORMAT: contextvars.ContextVar[str] = contextvars.ContextVar("throughway_figure_format", default="png")


def _checked(fmt: str) -> str:
    if fmt not in FIGURE_FORMATS:
        raise ValueError(f"figure format={fmt!r} is not known; accepted values: {list(FIGURE_FORMATS)}")
    return fmt


@contextlib.contextmanager
def figure_format(fmt: str) -> Iterator[str]:
    """Within the block, `save_figure` writes `fmt` ("png", "svg" or "pdf"); the previous format
    comes back on exit. Raises ValueError naming the accepted values for any other `fmt`."""
    token = _FORMAT.set(_checked(fmt))
    try:
        yield fmt
    finally:
        _FORMAT.reset(token)


def current_figure_format() -> str:
    """The format `save_figure` writes now: "png" unless inside `figure_format(...)`."""
    return _FORMAT.get()


def save_figure(fig: "plt.Figure", path: str | os.PathLike[str], dpi: int = 130, fmt: str | None = None) -> Path:
    """Write `fig` atomically and close it; return the path written.

    `fmt` (default: the current `figure_format`, "png" outside one) replaces the suffix of `path`,
    so `save_figure(fig, "a/b.png", fmt="pdf")` writes a/b.pdf. PNGs are rasterised at `dpi`; SVG
    and PDF are vector files. The file appears whole or not at all."""
    fmt = _checked(fmt if fmt is not None else _FORMAT.get())
    path = Path(path).with_suffix(f".{fmt}")
    buffer = io.BytesIO()
    # fixed metadata so that a redrawn vector figure is byte-identical to the last one
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt)
    fig.savefig(buffer, format=fmt, dpi=dpi, bbox_inches="tight", metadata=metadata)
    plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())
