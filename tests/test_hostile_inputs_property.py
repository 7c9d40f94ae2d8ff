"""Issue 13, property-based: random edits of checkpoint.json, results.json and the data manifest.

Whatever a field of these files is replaced with, `throughway train --resume` either finishes the
run (exit 0, results final) or refuses with exit 2 and a one-line message, never a traceback; a
file outside the run directory is never touched; a refused run's files are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from throughway.cli import main
from throughway.data.sources import save_cache
from throughway.train import RunConfig, run_training

from conftest import make_arrays

ARGS = ["train", "--model", "mlp_plain", "--depth", "2", "--width", "8", "--epochs", "2", "--limit", "64", "--quiet"]
CONFIG = RunConfig(model="mlp_plain", depth=2, epochs=2, limit=64, model_kwargs={"width": 8})
TARGETS = {"checkpoint.json": "run", "results.json": "run", "manifest.json": "data/mnist"}


class _Crash:
    def on_epoch_end(self, state, record):
        raise KeyboardInterrupt  # after epoch 1 is checkpointed


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A folder with a data cache (data/) and a run interrupted after epoch 1 of 2 (run/)."""
    root = tmp_path_factory.mktemp("hostile")
    save_cache(root / "data" / "mnist", make_arrays(n_train=128, n_val=64, n_test=64), "test fixture")
    config = RunConfig(**{**CONFIG.__dict__, "data_dir": str(root / "data")})
    with pytest.raises(KeyboardInterrupt):
        run_training(config, root / "run", progress=False, callbacks=[_Crash()])
    return root


def _victim(root: Path) -> str:
    return str(root / "VICTIM.txt")


values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True) | st.text(max_size=12)
    | st.sampled_from(["../VICTIM.txt", "/etc/passwd", "checkpoint-e0001.safetensors", "checkpoint-e0009.safetensors",
                       "mnist", "throughway-checkpoint-1", "0" * 64]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _fields(content: Any) -> list[tuple[str, ...]]:
    """Paths of the top-level fields and of the fields one level down."""
    paths = []
    if isinstance(content, dict):
        for key, value in content.items():
            paths.append((key,))
            if isinstance(value, dict):
                paths += [(key, sub) for sub in value]
    return paths


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(target=st.sampled_from(sorted(TARGETS)), choice=st.integers(0, 10**6), value=values,
       drop=st.booleans())
def test_random_edits_keep_the_three_promises(base, capsys, monkeypatch, target, choice, value, drop):
    # A rebuilt data cache would fetch MNIST: refuse that here, it is an error like any other.
    monkeypatch.setattr("throughway.data.sources._pip_download_wheel",
                        lambda downloads: (_ for _ in ()).throw(RuntimeError("no download in this test")))
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        shutil.copytree(base / "run", work / "run")
        shutil.copytree(base / "data", work / "data")
        victim = work / "VICTIM.txt"
        victim.write_text("must survive\n")
        path = work / TARGETS[target] / target
        content = json.loads(path.read_text())
        fields = _fields(content)
        field = fields[choice % len(fields)]
        holder = content
        for key in field[:-1]:
            holder = holder[key]
        if isinstance(value, str) and value == "../VICTIM.txt" and target != "checkpoint.json":
            value = str(victim)
        if drop:
            del holder[field[-1]]
        else:
            holder[field[-1]] = value
        path.write_text(json.dumps(content))
        before = _snapshot(work / "run")
        capsys.readouterr()
        code = main(ARGS + ["--out", str(work / "run"), "--data-dir", str(work / "data"), "--resume"])
        err = capsys.readouterr().err
        assert code in (0, 2), (field, value, err)
        assert victim.read_text() == "must survive\n", (field, value)
        if code == 2:
            assert err.startswith("throughway: error: ") and "Traceback" not in err, err
            assert _snapshot(work / "run") == before, (field, value, err)
        else:
            results = json.loads((work / "run" / "results.json").read_text())
            assert results["final"] is not None, (field, value)
    finally:
        shutil.rmtree(work, ignore_errors=True)
