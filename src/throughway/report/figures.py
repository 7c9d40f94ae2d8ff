"""The one place figures are made and written: `subplots` and `save_figure`, and the file format; and what
every study's figures draw alike: the mean over seeds with its band (`mean_band`), one legend above the
panels (`figure_legend`).

Every plotting function of `throughway.report` draws on a figure from `subplots`: a
`matplotlib.figure.Figure` of its own, not one of pyplot's, so drawing a figure for a file neither
needs nor changes the user's matplotlib backend (importing throughway never calls `matplotlib.use`;
a notebook keeps its inline backend, a script its window, and no window opens for a file). It names
its output with a `.png` path and hands the figure to `save_figure`. Inside `with figure_format("svg"):`
(or "pdf") the same call writes the vector file instead, beside where the PNG would be (`x.png` ->
`x.svg`), so a command's `--format` reaches every figure without every plotting function taking a
format argument.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import math
import os
from pathlib import Path
from typing import Any, Iterator

from matplotlib.figure import Figure

from .._io import atomic_write_bytes

__all__ = ["FIGURE_FORMATS", "figure_format", "current_figure_format", "subplots", "save_figure", "mean_band",
           "figure_legend", "dataset_title"]

FIGURE_FORMATS = ("png", "svg", "pdf")

# How a figure names each data set (the toolkit's names are lower-case slugs: data.cache.DATASET_SHAPES).
_DATASET_TITLES = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}

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


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None,
             **kwargs: Any) -> tuple[Figure, Any]:
    """A new figure and its axes, as `matplotlib.pyplot.subplots(nrows, ncols, figsize=..., **kwargs)`
    returns them (`sharex`, `sharey`, `squeeze`, `subplot_kw`, `gridspec_kw`), on a `Figure` that pyplot
    does not manage: no backend is chosen or changed, and nothing needs closing after `save_figure`."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig: Figure, path: str | os.PathLike[str], dpi: int = 130, fmt: str | None = None) -> Path:
    """Write `fig` atomically and close it; return the path written.

    `fmt` (default: the current `figure_format`, "png" outside one) replaces the suffix of `path`,
    so `save_figure(fig, "a/b.png", fmt="pdf")` writes a/b.pdf. PNGs are rasterised at `dpi`; SVG
    and PDF are vector files. The file appears whole or not at all. A figure of `subplots` is written
    by matplotlib's file backends alone; one that pyplot made (a caller's own) is closed in pyplot too."""
    fmt = _checked(fmt if fmt is not None else _FORMAT.get())
    path = Path(path).with_suffix(f".{fmt}")
    buffer = io.BytesIO()
    # fixed metadata so that a redrawn vector figure is byte-identical to the last one
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt)
    fig.savefig(buffer, format=fmt, dpi=dpi, bbox_inches="tight", metadata=metadata)
    if fig.canvas.manager is not None:  # made by pyplot: release it there (a figure of `subplots` has none)
        import matplotlib.pyplot as plt

        plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())


def mean_band(curves: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Mean, minimum and maximum over curves (one per seed), epoch by epoch, over the curves that reach that
    epoch and are finite there: every figure's line (the mean over seeds) and its band (lowest to highest seed)."""
    length = max(len(c) for c in curves)
    mean, low, high = [], [], []
    for i in range(length):
        values = [c[i] for c in curves if i < len(c) and math.isfinite(c[i])]
        mean.append(sum(values) / len(values) if values else math.nan)
        low.append(min(values) if values else math.nan)
        high.append(max(values) if values else math.nan)
    return mean, low, high


def figure_legend(fig: Figure, axes: Any, ncol: int = 7) -> None:
    """One legend above the panels of `fig` for all of `axes`: each label once (its first word names the
    line: "gated (n=5)" in one panel and "gated (n=3)" in another are one entry), at most `ncol` a row."""
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label.split(" ")[0] not in [x.split(" ")[0] for x in labels]:
                handles.append(handle)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), ncol), bbox_to_anchor=(0.5, 1.04),
                   frameon=False, fontsize="small")


def dataset_title(name: str) -> str:
    """The data set `name` (a toolkit slug such as "fashion-mnist") as a figure's title writes it
    ("Fashion-MNIST"); a name it does not know is returned as given."""
    return _DATASET_TITLES.get(name, name)
