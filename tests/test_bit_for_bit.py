"""A committed run re-runs bit for bit from what its results.json records (issue 23).

results/reference-run is a small real run (gated residual MLP, d = 4, the first 2,000 MNIST images of
each split, 2 epochs, 1 thread; its COMMAND.txt has the command). The test trains it again from its
recorded config with its recorded thread count and asserts that every number of every epoch, and
every weight of the saved model, is identical. Bit-for-bit equality holds only in the recorded
environment, so the test is skipped, with the difference named, where the torch version, the CPU
model, the instruction set torch dispatches to (`cpu_capability`) or the data set (its recorded SHA-256s) differ, or where the real MNIST is not cached here
(the tests never download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from throughway._io import environment_info
from throughway.data.cache import data_root
from throughway.data.loader import array_checksums
from throughway.data.sources import load_arrays
from throughway.train import RunConfig, run_training

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference-run"
TIMES = {"epoch_time_s", "elapsed_s"}   # wall clock: the only recorded numbers that may differ


def test_the_reference_run_records_what_a_rerun_needs():
    environment = json.loads((REFERENCE / "results.json").read_text())["environment"]
    assert environment["threads"] == 1 and environment["cpu_model"] and environment["torch_version"]
    assert set(environment["data_sha256"]) == {"train_x", "train_y", "val_x", "val_y", "test_x", "test_y"}
    assert not environment["git_revision"].endswith("-dirty")


def test_the_reference_run_reruns_bit_for_bit(tmp_path):
    recorded = json.loads((REFERENCE / "results.json").read_text())
    then, now = recorded["environment"], environment_info()
    for key in ("torch_version", "cpu_model", "cpu_capability"):
        if then.get(key) != now[key]:
            pytest.skip(f"recorded {key} {then[key]!r}, here {now[key]!r}: bit-for-bit equality is not expected")
    if not (data_root() / "mnist" / "manifest.json").is_file():
        pytest.skip(f"the real MNIST is not cached in {data_root()} (`throughway data mnist` fetches it)")
    if array_checksums(load_arrays("mnist")) != then["data_sha256"]:
        pytest.skip("the cached MNIST differs from the recorded data set (its SHA-256s)")

    previous = torch.get_num_threads()
    torch.set_num_threads(then["threads"])
    try:
        again = run_training(RunConfig(**recorded["config"]), tmp_path / "again", progress=False)
    finally:
        torch.set_num_threads(previous)
    assert len(again["history"]) == len(recorded["history"]) == recorded["config"]["epochs"]
    for ours, theirs in zip(again["history"], recorded["history"]):
        assert {k: v for k, v in ours.items() if k not in TIMES} == {k: v for k, v in theirs.items() if k not in TIMES}
    assert again["final"] == recorded["final"]
    weights, committed = load_file(tmp_path / "again" / "model.safetensors"), load_file(REFERENCE / "model.safetensors")
    assert weights.keys() == committed.keys()
    assert all(torch.equal(weights[k], committed[k]) for k in committed)


def test_train_takes_threads_and_records_it_with_the_cpu_and_the_datas_checksums(tmp_path, fake_mnist_root,
                                                                                  monkeypatch):
    from throughway.cli import main
    from throughway.study.workers import THREADS_ENV, worker_threads

    monkeypatch.setenv(THREADS_ENV, "")    # unset for worker_threads; restored (removed) after the test
    previous = torch.get_num_threads()
    try:
        assert main(["train", "--model", "mlp_plain", "--depth", "2", "--epochs", "1", "--limit", "200",
                     "--threads", "1", "--quiet", "--out", str(tmp_path / "run")]) == 0
        environment = json.loads((tmp_path / "run" / "results.json").read_text())["environment"]
        assert environment["threads"] == 1 and environment["cpu_model"] == environment_info()["cpu_model"]
        assert environment["data_sha256"] == array_checksums(load_arrays("mnist"))   # the fixture's arrays
        # A study's workers take the same count, whatever --jobs would give them.
        assert worker_threads(jobs=2) == 1 and worker_threads(jobs=1) == 1
    finally:
        torch.set_num_threads(previous)
    monkeypatch.setenv(THREADS_ENV, "two")
    with pytest.raises(ValueError, match=THREADS_ENV):
        worker_threads(jobs=2)
    with pytest.raises(SystemExit) as exit_status:
        main(["train", "--model", "mlp_plain", "--depth", "2", "--threads", "0", "--out", str(tmp_path / "x")])
    assert exit_status.value.code == 2
