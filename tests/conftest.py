"""Shared fixtures: small, learnable fake datasets written in the toolkit's own cache format."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

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


# The suite runs in worker processes (pytest-xdist: `-n auto` in pyproject.toml). Each worker trains on one
# thread, so two workers share 2 cores without oversubscribing them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked slow (more than about 8 s each) first, in their order, then the rest: the workers start
    on the long ones, and the short ones fill in at the end instead of one worker finishing a long test alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `build(folder)` once per test session whichever worker asks first: the
    others wait for it (a file lock) and share it. For fixtures that train for many seconds; what they
    return must be read back from the folder. A build that raises leaves no folder (the next asker tries
    again, and fails the same way)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # pytest-xdist gives each worker a folder in the session's
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            (folder / ".built").touch()
    return folder


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
    """The folder of the session's gate-family quick study and what its command printed (read only; made
    once per session, whichever worker asks first: `built_once`)."""
    import contextlib
    import io

    from throughway.cli import main

    def build(root: Path) -> None:
        save_cache(root / "data" / "mnist", make_arrays(), "test fixture")
        printed = io.StringIO()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as the recorded studies ran (OMP_NUM_THREADS=1; each worker takes 1 thread too)
        try:
            with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
                mp.setenv("THROUGHWAY_DATA", str(root / "data"))
                torch.manual_seed(0)
                code = main([*GATE_FAMILY_QUICK_ARGV, "--out", str(root / "quick")])
        finally:
            torch.set_num_threads(threads)
        assert code == 0, f"throughway {' '.join(GATE_FAMILY_QUICK_ARGV)} exited {code}"
        (root / "printed.txt").write_text(printed.getvalue())

    root = built_once(tmp_path_factory, "gate-family-quick", build)
    return root / "quick", (root / "printed.txt").read_text()


# A small mnist-depth study on the fake MNIST: one stacked batch, plain and gated nets of d = 2, two seeds,
# one epoch (about 2 s), made once per session (`built_once`) for the tests of what --merge and `report` check
# in a study folder; a test that changes files works on a copy (`shutil.copytree`).
MNIST_DEPTH_SMALL_ARGV = ("reproduce", "mnist-depth", "--quick", "--depths", "2", "--archs", "plain", "gated",
                          "--epochs", "1", "--limit", "200", "--width", "8", "--jobs", "1", "--quiet")


@pytest.fixture(scope="session")
def mnist_depth_small(tmp_path_factory) -> Path:
    """The folder of the session's small mnist-depth study (read only: copy it to change it)."""
    from throughway.cli import main

    def build(root: Path) -> None:
        save_cache(root / "data" / "mnist", make_arrays(), "test fixture")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("THROUGHWAY_DATA", str(root / "data"))
            code = main([*MNIST_DEPTH_SMALL_ARGV, "--out", str(root / "study")])
        assert code == 0, f"throughway {' '.join(MNIST_DEPTH_SMALL_ARGV)} exited {code}"

    return built_once(tmp_path_factory, "mnist-depth-small", build) / "study"
