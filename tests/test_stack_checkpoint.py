"""A stack's own checkpoint (train.stack: the state of models trained together) as untrusted input: its
folder never a link, its JSON and tensors checked against the stack, only its own files deleted."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from throughway.train import RunConfig
from throughway.train.stack import STATE_JSON, config_hash, train_stacked
from throughway.train.rundir import CHECKPOINT_FILE, RunDir

from conftest import Crash, file_hashes, sha256_of


STACK_CONFIGS = [RunConfig(model="mlp_gated_residual", depth=2, epochs=3, seed=s, model_kwargs={"width": 8}) for s in (0, 1)]


def _dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "study" / f"run-{i}" for i in range(len(STACK_CONFIGS))]


def _interrupted_batch(tmp_path: Path, data: Any) -> Path:
    """A batch interrupted after its first epoch; returns its state folder (the default one)."""
    dirs = _dirs(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        train_stacked(STACK_CONFIGS, dirs, progress=False, data=data, callbacks=[Crash(after=1)])
    state = dirs[0].parent / ".batched" / config_hash(STACK_CONFIGS, dirs)
    assert (state / STATE_JSON).is_file()
    return state


def _edit_json(state: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = json.loads((state / STATE_JSON).read_text())
    change(meta)
    (state / STATE_JSON).write_text(json.dumps(meta))


def _edit_tensors(state: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    meta = json.loads((state / STATE_JSON).read_text())
    path = state / meta["file"]
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))
    meta["sha256"] = sha256_of(path)
    (state / STATE_JSON).write_text(json.dumps(meta))


def _pop_flat(t: dict[str, torch.Tensor]) -> None:
    t.pop("flat")


def _shrink_flat(t: dict[str, torch.Tensor]) -> None:
    t["flat"] = t["flat"][:1].clone()  # would broadcast silently into the stack


def _bad_generator(t: dict[str, torch.Tensor]) -> None:
    t["generator.1"] = torch.zeros(3, dtype=torch.uint8)


def test_batched_training_locks_and_validates_its_state(tmp_path, fake_mnist_root, monkeypatch, victim):
    from throughway.train import stack as stack_module
    from throughway.train.rundir import RunLockedError

    configs = [RunConfig(model="mlp_plain", depth=2, epochs=2, seed=s, model_kwargs={"width": 8}) for s in (0, 1)]
    dirs = [tmp_path / "runs" / f"s{s}" for s in (0, 1)]
    state = tmp_path / "state"
    with RunDir(dirs[1]).locked():
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            stack_module.train_stacked(configs, dirs, progress=False, state_dir=state)
    assert not (dirs[0] / "results.json").exists()

    real = stack_module._evaluate
    calls = {"n": 0}

    def interrupt_after_epoch_1(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the validation split after epoch 2: epoch 1's state is saved
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(stack_module, "_evaluate", interrupt_after_epoch_1)
    with pytest.raises(KeyboardInterrupt):
        stack_module.train_stacked(configs, dirs, progress=False, state_dir=state)
    monkeypatch.setattr(stack_module, "_evaluate", real)
    meta = json.loads((state / "batch.json").read_text())
    meta["file"] = "../VICTIM.txt"
    (state / "batch.json").write_text(json.dumps(meta))
    stray = state / ".batch.json.abcd1234.tmp"
    stray.write_text("half")
    before = file_hashes(state)
    with pytest.raises(ValueError, match=r"batch\.json: field 'file' is '\.\./VICTIM\.txt'"):
        stack_module.train_stacked(configs, dirs, progress=False, state_dir=state, resume=True)
    assert victim.read_text() == "must survive\n"
    assert not stray.exists() and file_hashes(state) == {k: v for k, v in before.items() if k != stray.name}


def test_a_symlinked_batch_state_folder_is_refused_and_nothing_outside_is_deleted(tmp_path, fake_data):
    # Before the fix, a fresh batch wrote its state through the link and then emptied the target folder.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("must survive\n")
    dirs = _dirs(tmp_path)
    state = dirs[0].parent / ".batched" / config_hash(STACK_CONFIGS, dirs)
    state.parent.mkdir(parents=True)
    state.symlink_to(victim)
    with pytest.raises(ValueError, match=r"state folder is a symbolic link .*nothing was read, written or deleted"):
        train_stacked(STACK_CONFIGS, dirs, progress=False, data=fake_data)
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert (victim / "keep.txt").read_text() == "must survive\n"


def test_a_finished_batch_deletes_only_its_own_state_files(tmp_path, fake_data):
    state = tmp_path / "my-state"
    state.mkdir()
    (state / "notes.txt").write_text("mine\n")
    train_stacked(STACK_CONFIGS, _dirs(tmp_path), progress=False, data=fake_data, state_dir=state)
    assert sorted(p.name for p in state.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("edit, named", [
    (lambda m: m.update(active=[0, 5]), r"field 'active' is \[0, 5\]; accepted: distinct member indices"),
    (lambda m: m.update(active=[-1, 0]), r"field 'active' is \[-1, 0\]"),
    (lambda m: m.update(active=[0, 0]), r"field 'active' is \[0, 0\]"),
    (lambda m: m.update(active=[]), r"field 'active' is \[\]"),
    (lambda m: m.update(step_count=-3), r"'step_count' \(integers ≥ 0\)"),
    (lambda m: m.update(step_count=10 ** 30), r"fields 'epoch' \(1\) and 'step_count' \(10+\) do not fit this batch"),
    (lambda m: m.update(members=m["members"] * 2), r"field 'members' holds 4 entries; this batch has 2 models"),
    (lambda m: m["members"][0].update(history=[]), r"field 'members\[0\]\.history' is \[\]"),
    (lambda m: m["members"][0]["history"]["epochs"][0].update(train_loss="abc"),
     r"field 'members\[0\]\.history\.epochs\[0\]'"),
    (lambda m: m["members"][1]["history"].update(epochs=[]), r"field 'members\[1\]\.history\.epochs' is \"0 records\""),
    (lambda m: m["members"][0].update(elapsed_s="abc"), r"field 'members\[0\]' needs 'elapsed_s'"),
], ids=["active-out-of-range", "active-negative", "active-duplicate", "active-empty", "step-count-negative",
        "step-count-huge", "members-count", "history-type", "record-type", "history-length", "elapsed-type"])
def test_a_tampered_batch_json_is_refused_naming_the_field(tmp_path, fake_data, edit, named):
    state = _interrupted_batch(tmp_path, fake_data)
    _edit_json(state, edit)
    before = {p.name: sha256_of(p) for p in state.iterdir()}
    with pytest.raises(ValueError, match=rf"{STATE_JSON}: .*{named}"):
        train_stacked(STACK_CONFIGS, _dirs(tmp_path), progress=False, data=fake_data, resume=True)
    assert {p.name: sha256_of(p) for p in state.iterdir()} == before  # refused before anything was written


@pytest.mark.parametrize("edit, named", [
    (_pop_flat, r"missing \['flat'\]"),
    (_shrink_flat, r"flat: file \(1, \d+\), batch \(2, \d+\)"),
    (_bad_generator, r"generator\.1: file \(3,\), batch"),
], ids=["missing", "broadcastable-shape", "generator"])
def test_batch_tensors_that_do_not_fit_the_batch_are_refused(tmp_path, fake_data, edit, named):
    state = _interrupted_batch(tmp_path, fake_data)
    _edit_tensors(state, edit)
    with pytest.raises(ValueError, match=rf"batch-e0001\.safetensors with .*{STATE_JSON}: does not fit this batch "
                                         rf"\({named}"):
        train_stacked(STACK_CONFIGS, _dirs(tmp_path), progress=False, data=fake_data, resume=True)


def test_a_batched_member_folder_holding_metrics_csv_is_refused_without_resume(tmp_path, fake_data):
    from throughway.train import RunExistsError

    dirs = [tmp_path / "study" / f"run-{i}" for i in range(2)]
    dirs[1].mkdir(parents=True)
    (dirs[1] / "metrics.csv").write_text("my,own,numbers\n")
    configs = [RunConfig(model="mlp_gated_residual", depth=2, epochs=1, seed=s, model_kwargs={"width": 8}) for s in (0, 1)]
    with pytest.raises(RunExistsError, match=rf"{dirs[1]} already holds a run \(metrics.csv\); pass --resume"):
        train_stacked(configs, dirs, progress=False, data=fake_data)
    assert (dirs[1] / "metrics.csv").read_text() == "my,own,numbers\n"


def test_batch_states_past_epoch_9999_are_valid():
    from throughway.train.rundir import BATCH_FILE

    assert BATCH_FILE.fullmatch("batch-e12345.safetensors") and CHECKPOINT_FILE.fullmatch("checkpoint-e10000.safetensors")
    assert not CHECKPOINT_FILE.fullmatch("checkpoint-e999.safetensors")
