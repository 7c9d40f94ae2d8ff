"""Shared fixtures: small, learnable fake datasets written in the toolkit's own cache format."""

from __future__ import annotations

import os
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


# The suite runs in worker processes (pytest-xdist: `-n auto --dist loadgroup` in pyproject.toml). Each worker
# trains on one thread, so two workers share 2 cores without oversubscribing them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# Fixtures that train for a minute are made once per worker that asks for them, so each one's tests share a
# group (one worker); a test module can name its own group with `pytestmark = pytest.mark.xdist_group(...)`.
_GROUP_BY_FIXTURE = {"gate_family_quick": "gate-family-quick", "analyses": "recorded-analyses"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            for fixture, group in _GROUP_BY_FIXTURE.items():
                if fixture in getattr(item, "fixturenames", ()):
                    item.add_marker(pytest.mark.xdist_group(group))
                    break


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


# The gate-family quick study, as `throughway reproduce gate-family --quick --jobs 2 --quiet` runs it on the fake
# MNIST (7 families x d = 2, 10 x 2 seeds, 2 epochs, with its removal curves and figures; two worker processes,
# the suite's one study trained by several workers): about a minute on 2 cores, so it is trained once per
# session. tests/test_gate_family.py checks what it trains and reports, tests/test_results_regenerate.py that
# it has the committed results/gate-family's structure (whatever --jobs); a test that changes files works on
# a copy (`shutil.copytree`).
GATE_FAMILY_QUICK_ARGV = ("reproduce", "gate-family", "--jobs", "2", "--quiet", "--quick")


@pytest.fixture(scope="session")
def gate_family_quick(tmp_path_factory) -> tuple[Path, str]:
    """The folder of the session's gate-family quick study and what its command printed (read only)."""
    import contextlib
    import io

    from throughway.cli import main

    root = tmp_path_factory.mktemp("gate-family-quick")
    save_cache(root / "data" / "mnist", make_arrays(), "test fixture")
    out, printed = root / "quick", io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the recorded studies ran (OMP_NUM_THREADS=1; each worker takes 1 thread too)
    try:
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
            mp.setenv("THROUGHWAY_DATA", str(root / "data"))
            torch.manual_seed(0)
            code = main([*GATE_FAMILY_QUICK_ARGV, "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, f"throughway {' '.join(GATE_FAMILY_QUICK_ARGV)} exited {code}"
    return out, printed.getvalue()
