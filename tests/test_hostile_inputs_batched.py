"""Issue 13's promises on the paths the one-loop refactor touched: stacked training (`train_stacked`,
`throughway reproduce`), studies, `report`, `analyze redraw`, and `train`'s numeric options.

Each test asserts the exact outcome: exit 2 (or ValueError) with a message naming the file, field
or option; nothing outside the run directory changed or deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from throughway.cli import main
from throughway.train import RunConfig
from throughway.train.stack import STATE_JSON, config_hash, train_stacked
from conftest import Crash

CONFIGS = [RunConfig(model="mlp_gated_residual", depth=2, epochs=3, seed=s, model_kwargs={"width": 8}) for s in (0, 1)]
STUDY = ["reproduce", "mnist-depth", "--quick", "--depths", "2", "--archs", "gated", "--epochs", "2", "--limit", "64",
         "--width", "8", "--jobs", "1", "--quiet"]


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "study" / f"run-{i}" for i in range(len(CONFIGS))]


def _interrupted_batch(tmp_path: Path, data: Any) -> Path:
    """A batch interrupted after its first epoch; returns its state folder (the default one)."""
    dirs = _dirs(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        train_stacked(CONFIGS, dirs, progress=False, data=data, callbacks=[Crash(after=1)])
    state = dirs[0].parent / ".batched" / config_hash(CONFIGS, dirs)
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
    meta["sha256"] = _hash(path)
    (state / STATE_JSON).write_text(json.dumps(meta))


def test_a_symlinked_batch_state_folder_is_refused_and_nothing_outside_is_deleted(tmp_path, fake_data):
    # Before the fix, a fresh batch wrote its state through the link and then emptied the target folder.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("must survive\n")
    dirs = _dirs(tmp_path)
    state = dirs[0].parent / ".batched" / config_hash(CONFIGS, dirs)
    state.parent.mkdir(parents=True)
    state.symlink_to(victim)
    with pytest.raises(ValueError, match=r"state folder is a symbolic link .*nothing was read, written or deleted"):
        train_stacked(CONFIGS, dirs, progress=False, data=fake_data)
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert (victim / "keep.txt").read_text() == "must survive\n"


def test_a_finished_batch_deletes_only_its_own_state_files(tmp_path, fake_data):
    state = tmp_path / "my-state"
    state.mkdir()
    (state / "notes.txt").write_text("mine\n")
    train_stacked(CONFIGS, _dirs(tmp_path), progress=False, data=fake_data, state_dir=state)
    assert sorted(p.name for p in state.iterdir()) == ["notes.txt"]


def _pop_flat(t: dict[str, torch.Tensor]) -> None:
    t.pop("flat")


def _shrink_flat(t: dict[str, torch.Tensor]) -> None:
    t["flat"] = t["flat"][:1].clone()  # would broadcast silently into the stack


def _bad_generator(t: dict[str, torch.Tensor]) -> None:
    t["generator.1"] = torch.zeros(3, dtype=torch.uint8)


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
    before = {p.name: _hash(p) for p in state.iterdir()}
    with pytest.raises(ValueError, match=rf"{STATE_JSON}: .*{named}"):
        train_stacked(CONFIGS, _dirs(tmp_path), progress=False, data=fake_data, resume=True)
    assert {p.name: _hash(p) for p in state.iterdir()} == before  # refused before anything was written


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
        train_stacked(CONFIGS, _dirs(tmp_path), progress=False, data=fake_data, resume=True)


def test_a_study_whose_runs_fail_exits_2_naming_the_error(tmp_path, fake_mnist_root, capsys, monkeypatch):
    out = tmp_path / "study"
    calls = {"n": 0}
    import throughway.train.stack as stack
    evaluate = stack._evaluate

    def interrupt(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 2:  # epoch 1 evaluates val and test, then the interrupt
            raise KeyboardInterrupt
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(stack, "_evaluate", interrupt)
    assert main([*STUDY, "--out", str(out)]) == 130
    monkeypatch.setattr(stack, "_evaluate", evaluate)
    (state,) = (out / "runs" / ".batched").iterdir()
    _edit_json(state, lambda m: m.update(active=[0, 9]))
    capsys.readouterr()
    assert main([*STUDY, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("throughway: error: 2 run(s) of the study failed, e.g. gated-d2-s0: ValueError: ")
    assert f"{state / STATE_JSON}: field 'active' is [0, 9]" in err
    assert json.loads((out / "results.json").read_text())["errors"]


@pytest.mark.parametrize("option, named", [
    (["--depths", "0"], "run gated-d0-s0: depth=0 (--depth): accepted: an integer from 1 to 10000 (MAX_DEPTH)"),
    (["--depths", "100000000"], "run gated-d100000000-s0: depth=100000000 (--depth): accepted: an integer from 1 "
                                "to 10000 (MAX_DEPTH)"),
    (["--limit", "1"], "run gated-d2-s0: limit=1: must be at least 2 (BatchNorm needs two samples)"),
])
def test_a_study_option_every_run_would_refuse_is_an_error_before_anything_is_written(tmp_path, capsys, monkeypatch,
                                                                                      option, named):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the data was read before the study's options were checked")

    monkeypatch.setattr("throughway.study.runs.prepare_data", refuse)
    out = tmp_path / "study"
    assert main([*_replace(STUDY, option), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"throughway: error: {named}"
    assert not out.exists()


def _replace(argv: list[str], option: list[str]) -> list[str]:
    out = list(argv)
    i = out.index(option[0])
    out[i + 1] = option[1]
    return out


@pytest.mark.parametrize("option, message", [
    (["--depth", "100000000"], "depth=100000000 (--depth): accepted: an integer from 1 to 10000 (MAX_DEPTH)"),
    (["--width", "100000000"], "(--depth, --width, --model-arg) has 20,000,080,100,000,010 parameters; accepted: "
                               "at most 1,000,000,000"),
    (["--seed", str(10 ** 23)], f"seed={10 ** 23} (--seed): accepted: an integer from -2**63 to 2**64 - 1"),
])
def test_huge_numeric_options_are_refused_at_once(tmp_path, capsys, monkeypatch, option, message):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the data was read before the arguments were checked")

    monkeypatch.setattr("throughway.train.run.load_dataset", refuse)
    argv = ["train", "--model", "mlp_plain", "--depth", "2", "--width", "8", "--epochs", "1", "--quiet",
            "--out", str(tmp_path / "run")]
    code = main(_replace(argv, option) if option[0] in argv else [*argv, *option])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("throughway: error: ") and message in err, err
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_history_record_of_wrong_types_is_refused(tmp_path, fake_mnist_root, capsys):
    from throughway.train import run_training

    out = tmp_path / "run"
    config = RunConfig(model="mlp_gated_residual", depth=2, epochs=2, model_kwargs={"width": 8})
    with pytest.raises(KeyboardInterrupt):
        run_training(config, out, progress=False, callbacks=[Crash(after=1)])
    meta = json.loads((out / "checkpoint.json").read_text())
    meta["history"]["epochs"][0]["k"] = "abc"
    (out / "checkpoint.json").write_text(json.dumps(meta))
    code = main(["train", "--model", "mlp_gated_residual", "--depth", "2", "--width", "8", "--epochs", "2", "--quiet",
                 "--resume", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"throughway: error: {out / 'checkpoint.json'}: field 'history.epochs[0]' is ")
    assert "a list of numbers (or null) for k" in err


def test_report_on_a_tampered_summary_is_an_error_naming_the_file(tmp_path, capsys):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"experiment": "mnist-depth", "cells": "x"}))
    assert main(["report", str(folder)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"throughway: error: {folder / 'results.json'}: does not hold a mnist-depth summary as the study writes it "
        f"(field 'config' missing); the file was edited or damaged; rerun the study with --resume to rewrite it")


def test_analyze_redraw_of_a_tampered_prune_json_is_an_error_naming_the_folder(tmp_path, capsys):
    folder = tmp_path / "analysis"
    folder.mkdir()
    (folder / "prune.json").write_text("[]")
    assert main(["analyze", "redraw", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"throughway: error: {folder}: its analysis JSON files (or --compare's) do not hold what "
                          f"`analyze` writes (AttributeError: ")
    assert os.listdir(folder) == ["prune.json"]
