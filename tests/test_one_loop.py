"""Single and batched training share one loop (train.loop.run_loop; issue 15).

`run_training` (fit) and `train_stacked` with N = 1 write the same files with the same content: every
non-numeric field equal, every number equal to the stacked kernels' rounding (they compute the same
arithmetic with batched matrix products and a flat optimiser, so not bit for bit: see test_batched.py
for the tolerances per case). Interrupted the same way, both resume to exactly their uninterrupted
runs; a callback's stop request ends both after the same epoch.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from throughway.data import load_dataset
from throughway.train import RunConfig, run_training
from throughway.train import loop as loop_module
from throughway.train.stack import train_stacked

from conftest import Crash

# NAdam without BatchNorm (tight agreement between the two kernels, see test_batched.py).
CONFIG = RunConfig(model="mlp_highway", depth=2, recipe="gresnet-mnist", epochs=3, seed=1,
                   model_kwargs={"width": 8, "gate_bias": -1.0}, recipe_overrides={"batch_size": 100})
TIMING = {"epoch_time_s", "elapsed_s"}
RTOL, ATOL = 2e-4, 2e-5


def _fit(out, **kw):
    return run_training(CONFIG, out, progress=False, data=load_dataset("mnist"), **kw)


def _batched(out, **kw):
    return train_stacked([CONFIG], [out], progress=False, data=load_dataset("mnist"), **kw)[0]


def _same(a, b, where="results", numbers_exact=False):
    """Equal structure and non-numeric values; numbers equal (or within the kernels' rounding)."""
    if isinstance(a, dict):
        assert set(a) == set(b), (where, sorted(set(a) ^ set(b)))
        for k in a:
            if k not in TIMING:
                _same(a[k], b[k], f"{where}.{k}", numbers_exact)
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]", numbers_exact)
    elif isinstance(a, float) and isinstance(b, float) and not numbers_exact:
        assert math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL) or (math.isnan(a) and math.isnan(b)), (where, a, b)
    else:
        assert a == b, (where, a, b)


def _metrics(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _comparable(results):
    out = json.loads(json.dumps(results))
    out["environment"].pop("batched", None)
    return out


def test_fit_and_batched_n1_write_the_same_files(tmp_path, fake_mnist_root):
    single, batch = tmp_path / "single", tmp_path / "batched"
    _fit(single)
    _batched(batch)
    for name in ("results.json", "metrics.csv", "model.safetensors"):
        assert (single / name).is_file() and (batch / name).is_file(), name
    a = _comparable(json.loads((single / "results.json").read_text()))
    b = _comparable(json.loads((batch / "results.json").read_text()))
    _same(a, b)
    rows_a, rows_b = _metrics(single / "metrics.csv"), _metrics(batch / "metrics.csv")
    assert [list(r) for r in rows_a] == [list(r) for r in rows_b]  # the same columns in the same order
    for ra, rb in zip(rows_a, rows_b):
        for key in ra:
            if key not in TIMING and ra[key] != "":
                assert math.isclose(float(ra[key]), float(rb[key]), rel_tol=RTOL, abs_tol=ATOL), key


@pytest.mark.parametrize("path", ["fit", "batched"])
def test_both_paths_resume_the_same_way(tmp_path, fake_mnist_root, path):
    """One interruption (the same callback, after epoch 1), then --resume: the run ends exactly as an
    uninterrupted run of the same path, numbers bit for bit."""
    train = _fit if path == "fit" else _batched
    whole = train(tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "cut", callbacks=[Crash(after=1)])
    resumed = train(tmp_path / "cut", resume=True)
    assert len(resumed["history"]) == CONFIG.epochs
    _same(_comparable(whole), _comparable(resumed), numbers_exact=True)


class _StopAfter:
    def __init__(self, epoch):
        self.epoch, self.ended = epoch, []

    def on_epoch_end(self, state, record):
        if state.epoch == self.epoch:
            state.stop = True

    def on_fit_end(self, state):
        self.ended.append(state.epoch)


@pytest.mark.parametrize("path", ["fit", "batched"])
def test_a_stop_request_ends_both_paths_after_that_epoch(tmp_path, fake_mnist_root, path, monkeypatch):
    loops = []
    real = loop_module.run_loop

    def counting(engine, members, epochs, **kw):
        loops.append(type(engine).__name__)
        return real(engine, members, epochs, **kw)

    monkeypatch.setattr("throughway.train.loop.run_loop", counting)
    monkeypatch.setattr("throughway.train.stack.run_loop", counting)
    stop = _StopAfter(2)
    results = (_fit if path == "fit" else _batched)(tmp_path / "run", callbacks=[stop])
    assert loops == ["_ModuleEngine" if path == "fit" else "_StackEngine"]
    assert stop.ended == [2] and results["final"]["epochs_completed"] == 2
