"""Shared fixtures: small, learnable fake datasets written in the toolkit's own cache format."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from throughway.data import ArraySplits, to_splits
from throughway.data.sources import save_cache

# The repository's own tooling (tools/, e.g. the docs renderer `tools.readme`) is imported from the
# checkout, however pytest was started.
_REPOSITORY = str(Path(__file__).resolve().parents[1])
if _REPOSITORY not in sys.path:
    sys.path.insert(0, _REPOSITORY)


def make_arrays(n_train: int = 600, n_val: int = 200, n_test: int = 200, seed: int = 0,
                name: str = "mnist", shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10) -> ArraySplits:
    """uint8 images whose class is written as a bright horizontal band (so a net can learn it), plus noise."""
    rng = np.random.default_rng(seed)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, num_classes, n).astype(np.uint8)
        x = rng.integers(0, 60, (n, *shape)).astype(np.uint8)
        band = shape[1] // num_classes
        for i, label in enumerate(y):
            x[i, :, label * band:(label + 1) * band, :] = 250
        return x, y

    (tx, ty), (vx, vy), (sx, sy) = split(n_train), split(n_val), split(n_test)
    return ArraySplits(name, num_classes, tx, ty, vx, vy, sx, sy)


@pytest.fixture
def fake_arrays() -> ArraySplits:
    return make_arrays()


@pytest.fixture
def fake_data(fake_arrays: ArraySplits):
    return to_splits(fake_arrays)


@pytest.fixture
def fake_mnist_root(tmp_path, monkeypatch, fake_arrays):
    """A data root holding a fake, valid MNIST cache; $THROUGHWAY_DATA points at it."""
    root = tmp_path / "data"
    save_cache(root / "mnist", fake_arrays, "test fixture")
    monkeypatch.setenv("THROUGHWAY_DATA", str(root))
    return root


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


class Crash:
    """A training callback that interrupts training once epoch `after` is checkpointed, as a kill would."""

    def __init__(self, after: int) -> None:
        self.after = after

    def on_epoch_end(self, state, record):
        if state.epoch == self.after:
            raise KeyboardInterrupt
