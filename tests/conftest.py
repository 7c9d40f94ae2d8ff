"""Shared fixtures: small, learnable fake datasets written in the toolkit's own cache format; finished and
interrupted runs to damage; what a test of untrusted input checks (the command's exit status and message, the
files outside a run directory unchanged)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

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


# -- untrusted input: a command's exit status and message, the files outside a run directory -----------------

def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    """`throughway ARGV` in this process: (exit status, what it wrote on stderr)."""
    from throughway.cli import main

    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


def run_cli_out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """`throughway ARGV` in this process: (exit status, stdout, stderr)."""
    from throughway.cli import main

    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_hashes(folder: Path) -> dict[str, str]:
    """The files directly in `folder`, name → SHA-256."""
    return {p.name: sha256_of(p) for p in folder.iterdir() if p.is_file()}


def file_tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path → SHA-256), links included as their target's name."""
    tree = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            tree[str(path.relative_to(folder))] = "link:" + os.readlink(path)
        elif path.is_file():
            tree[str(path.relative_to(folder))] = sha256_of(path)
    return tree


def edit_results(run: Path, change: Any) -> None:
    """Apply `change` to the dict of `run`/results.json and write it back."""
    results = json.loads((run / "results.json").read_text())
    change(results)
    (run / "results.json").write_text(json.dumps(results))


def assert_exit_0_or_2(code: int, err: str, what: Any) -> None:
    """A command given damaged input finishes (0) or refuses with exit 2 and a one-line message, never a traceback."""
    assert code in (0, 2), (what, err)
    if code == 2:
        assert err.startswith("throughway: error: ") and "Traceback" not in err, (what, err)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside every run directory that must survive unchanged."""
    path = tmp_path / "VICTIM.txt"
    path.write_text("must survive\n")
    return path


@pytest.fixture
def sentinel_tree(tmp_path: Path) -> Path:
    """A folder outside every run directory, with files that must survive unchanged."""
    folder = tmp_path / "sentinel"
    (folder / "sub").mkdir(parents=True)
    (folder / "VICTIM.txt").write_text("must survive\n")
    (folder / "sub" / "gates.json").write_text('{"mine": true}\n')
    (folder / "metrics.csv").write_text("my,own,numbers\n")
    return folder


@pytest.fixture
def no_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the data fails the test: the case must be refused before."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the data was read before the arguments were checked")

    monkeypatch.setattr("throughway.train.run.load_dataset", refuse)


_GATED_CONFIG = {"model": "mlp_gated_residual", "depth": 2, "epochs": 2, "limit": 64, "model_kwargs": {"width": 8}}


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/: a fake MNIST cache; finished/: a finished gated run (depth 2, width 8, 2 epochs, 64 samples);
    interrupted/: the same run stopped after epoch 1. Read only: `work` copies it."""
    from throughway.train import RunConfig, run_training

    root = tmp_path_factory.mktemp("trained-runs")
    arrays = make_arrays(n_train=128, n_val=64, n_test=64)
    save_cache(root / "data" / "mnist", arrays, "test fixture")
    data = to_splits(arrays)
    config = RunConfig(**_GATED_CONFIG)
    run_training(config, root / "finished", progress=False, data=data)
    with pytest.raises(KeyboardInterrupt):
        run_training(config, root / "interrupted", progress=False, data=data, callbacks=[Crash(after=1)])
    return root


@pytest.fixture
def work(trained_runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of `trained_runs` in this test's folder, with $THROUGHWAY_DATA pointing at its data cache."""
    for name in ("data", "finished", "interrupted"):
        shutil.copytree(trained_runs / name, tmp_path / name, symlinks=True)
    monkeypatch.setenv("THROUGHWAY_DATA", str(tmp_path / "data"))
    return tmp_path


ONE_EPOCH_TRAIN_ARGS = ["train", "--model", "mlp_gated_residual", "--depth", "2", "--width", "8", "--epochs", "1",
                        "--limit", "64", "--quiet"]


@pytest.fixture
def finished_train_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A finished `train` run in tmp_path/run (one epoch, 64 samples), on a fake MNIST cache."""
    from throughway.cli import main

    save_cache(tmp_path / "data" / "mnist", make_arrays(n_train=128, n_val=64, n_test=64), "test fixture")
    monkeypatch.setenv("THROUGHWAY_DATA", str(tmp_path / "data"))
    assert main(ONE_EPOCH_TRAIN_ARGS + ["--out", str(tmp_path / "run")]) == 0
    return tmp_path / "run"


ONE_EPOCH_STUDY = ["reproduce", "mnist-depth", "--quick", "--depths", "2", "--archs", "gated", "--epochs", "1",
                   "--limit", "64", "--width", "8", "--jobs", "1", "--quiet"]


@pytest.fixture(scope="module")
def finished_run_and_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/: a fake MNIST cache; run/: a finished gated run; study/: a finished mnist-depth study (read only)."""
    from throughway.cli import main
    from throughway.train import RunConfig, run_training

    root = tmp_path_factory.mktemp("run-and-study")
    save_cache(root / "data" / "mnist", make_arrays(n_train=128, n_val=64, n_test=64), "test fixture")
    config = RunConfig(model="mlp_gated_residual", depth=2, epochs=1, limit=64, model_kwargs={"width": 8},
                       data_dir=str(root / "data"))
    run_training(config, root / "run", progress=False)
    assert main(ONE_EPOCH_STUDY + ["--out", str(root / "study"), "--data-dir", str(root / "data")]) == 0
    return root


# What a field of a file read back may be replaced with (property tests of untrusted input).
HOSTILE_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True) | st.text(max_size=12)
    | st.sampled_from(["../VICTIM.txt", "/etc/passwd", "checkpoint-e0001.safetensors", "checkpoint-e0009.safetensors",
                       "mnist", "throughway-checkpoint-1", "0" * 64]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
HOSTILE_CONFIG_VALUES = HOSTILE_VALUES | st.sampled_from(["fashion-mnist", "cifar10", "../elsewhere", "no", "true", 2**63,
                                                          -1, 0, 1.5])


def edited_fields(content: Any) -> list[tuple[str, ...]]:
    """Paths of the top-level fields and of the fields one level down."""
    paths = []
    if isinstance(content, dict):
        for key, value in content.items():
            paths.append((key,))
            if isinstance(value, dict):
                paths += [(key, sub) for sub in value]
    return paths


# One small run every run-folder test starts from: the CLI's arguments and the same run as a RunConfig.
PLAIN_ARGS = ["train", "--model", "mlp_plain", "--depth", "2", "--width", "8", "--epochs", "2", "--quiet"]


def plain_config() -> Any:
    """PLAIN_ARGS as a RunConfig (built on call: conftest imports nothing of throughway.train at load)."""
    from throughway.train import RunConfig
    return RunConfig(model="mlp_plain", depth=2, epochs=2, model_kwargs={"width": 8})


def interrupted_run(out: Path, config: Any = None) -> Path:
    """`config` (default `plain_config()`) trained into `out` and interrupted after its first epoch (Crash)."""
    from throughway.train import run_training
    with pytest.raises(KeyboardInterrupt):
        run_training(config or plain_config(), out, progress=False, callbacks=[Crash(after=1)])
    return out


class TimmBasicBlock(torch.nn.Module):
    """Replica of timm.models.resnet.BasicBlock (se and drop_path None, as timm builds them by default)."""

    def __init__(self, inplanes: int = 4, planes: int | None = None, stride: int = 1,
                 downsample: torch.nn.Module | None = None) -> None:
        planes = inplanes if planes is None else planes
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(planes)
        self.drop_block = torch.nn.Identity()
        self.act1 = torch.nn.ReLU(inplace=True)
        self.aa = torch.nn.Identity()
        self.conv2 = torch.nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(planes)
        self.se = None
        self.act2 = torch.nn.ReLU(inplace=True)
        self.downsample = downsample
        self.drop_path = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.aa(self.act1(self.drop_block(self.bn1(self.conv1(x)))))
        x = self.bn2(self.conv2(x))
        if self.se is not None:
            x = self.se(x)
        if self.drop_path is not None:
            x = self.drop_path(x)
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        x += shortcut
        return self.act2(x)


TimmBasicBlock.__module__ = "timm.models.resnet"
TimmBasicBlock.__qualname__ = "BasicBlock"
