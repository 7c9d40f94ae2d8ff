"""The runs of a study (study.spec, study.workers, study.runner): every run's config checked before anything
is read or trained, a failed run reported while the others go on, no link followed into a study's runs,
quiet workers, and the command its results record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from throughway.cli import main
from throughway.data.sources import save_cache
from throughway.train import RunConfig
from throughway.train.stack import STATE_JSON

from conftest import file_tree, make_arrays, run_cli, run_cli_out


TINY_STUDY = ["reproduce", "mnist-depth", "--quick", "--depths", "2", "--archs", "gated", "--epochs", "2", "--limit",
              "64", "--width", "8", "--jobs", "1", "--quiet"]


def _edit_json(state: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = json.loads((state / STATE_JSON).read_text())
    change(meta)
    (state / STATE_JSON).write_text(json.dumps(meta))


def _replace(argv: list[str], option: list[str]) -> list[str]:
    out = list(argv)
    i = out.index(option[0])
    out[i + 1] = option[1]
    return out


GATED_CONFIG = RunConfig(model="mlp_gated_residual", depth=2, epochs=2, limit=64, model_kwargs={"width": 8})


GATED_STUDY = ["reproduce", "mnist-depth", "--quick", "--archs", "gated", "--epochs", "1", "--limit", "64", "--width",
               "8", "--jobs", "1", "--quiet"]


TWO_SEED_STUDY = ["reproduce", "mnist-depth", "--quick", "--archs", "gated", "--depths", "2", "--seeds", "2",
                  "--epochs", "1", "--limit", "64", "--width", "8", "--jobs", "1", "--quiet"]


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
    assert main([*TINY_STUDY, "--out", str(out)]) == 130
    monkeypatch.setattr(stack, "_evaluate", evaluate)
    (state,) = (out / "runs" / ".batched").iterdir()
    _edit_json(state, lambda m: m.update(active=[0, 9]))
    capsys.readouterr()
    assert main([*TINY_STUDY, "--out", str(out), "--resume"]) == 2
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

    monkeypatch.setattr("throughway.study.stacking.prepare_data", refuse)
    out = tmp_path / "study"
    assert main([*_replace(TINY_STUDY, option), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"throughway: error: {named}"
    assert not out.exists()


def test_check_specs_refuses_a_run_listed_twice():
    from throughway.study.spec import RunSpec, check_specs

    spec = RunSpec("gated-d2-s0", GATED_CONFIG)
    with pytest.raises(ValueError, match="runs gated-d2-s0: listed more than once"):
        check_specs([spec, spec])


def test_a_symlinked_run_folder_in_a_study_is_not_trained_into(tmp_path, capsys, sentinel_tree, fake_mnist_root):
    out = tmp_path / "study"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "gated-d2-s0").symlink_to(sentinel_tree / "sub")
    before = file_tree(sentinel_tree)
    code, err = run_cli(capsys, GATED_STUDY + ["--depths", "2", "--out", str(out), "--resume"])
    assert code == 2
    assert f"{out / 'runs' / 'gated-d2-s0'} is a symbolic link" in err
    assert file_tree(sentinel_tree) == before


def test_a_symlinked_runs_folder_of_a_study_is_refused(tmp_path, capsys, sentinel_tree):
    out = tmp_path / "study"
    out.mkdir()
    (out / "runs").symlink_to(sentinel_tree)
    before = file_tree(sentinel_tree)
    code, err = run_cli(capsys, GATED_STUDY + ["--depths", "2", "--out", str(out), "--resume"])
    assert code == 2
    assert f"--out {out}: {out / 'runs'} is a symbolic link" in err
    assert file_tree(sentinel_tree) == before


def test_quiet_prints_no_start_or_done_lines(tmp_path, capsys, monkeypatch):
    from throughway.study import workers
    from throughway.study.spec import RunSpec

    monkeypatch.setattr(workers, "run_training", lambda *a, **k: None)
    spec = RunSpec("gated-d2-s0", GATED_CONFIG)
    capsys.readouterr()
    assert workers._worker(spec, str(tmp_path), False, 1, False) == ("gated-d2-s0", None)
    assert capsys.readouterr().err == ""
    workers._worker(spec, str(tmp_path), False, 1, True)
    assert capsys.readouterr().err == "[gated-d2-s0] start\n[gated-d2-s0] done\n"


@pytest.mark.slow
def test_a_damaged_finished_run_fails_alone_and_the_advice_retrains_only_it(tmp_path, capsys, monkeypatch):
    save_cache(tmp_path / "data" / "mnist", make_arrays(n_train=128, n_val=64, n_test=64), "test fixture")
    monkeypatch.setenv("THROUGHWAY_DATA", str(tmp_path / "data"))
    out = tmp_path / "study"
    argv = TWO_SEED_STUDY + ["--out", str(out)]
    assert run_cli_out(capsys, argv)[0] == 0
    summary = json.loads((out / "results.json").read_text())
    # 14: the arguments main parsed, not pytest's sys.argv
    assert summary["command"] == "throughway " + " ".join(argv)
    damaged, intact = out / "runs" / "gated-d2-s0", out / "runs" / "gated-d2-s1"
    intact_model = (intact / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").unlink()
    code, _, err = run_cli_out(capsys, argv + ["--resume"])
    assert code == 2 and "1 run(s) of the study failed" in err
    errors = json.loads((out / "results.json").read_text())["errors"]
    assert list(errors) == ["gated-d2-s0"]
    assert f"delete the run's folder {damaged} and rerun the study with --resume" in errors["gated-d2-s0"]
    assert (intact / "model.safetensors").read_bytes() == intact_model
    shutil.rmtree(damaged)  # the advice
    assert run_cli_out(capsys, argv + ["--resume"])[0] == 0
    assert (damaged / "model.safetensors").is_file()
    assert (intact / "model.safetensors").read_bytes() == intact_model  # the intact run was not trained again
    assert json.loads((out / "results.json").read_text())["errors"] == {}


def test_command_line_is_the_parsed_arguments_inside_main_and_sys_argv_outside():
    from throughway.study.command import command_line, invoked_with

    with invoked_with(["reproduce", "sdi", "--out", "a b"]):
        assert command_line() == "throughway reproduce sdi --out 'a b'"
    assert "reproduce sdi" not in command_line()


def test_check_specs_checks_each_kind_of_a_shared_stack_before_any_trains():
    """Residual and gated nets share a stack (their stack key omits initial values such as k_init); a bad
    k_init on the gated run, listed after the residual one, is refused by the up-front check."""
    import dataclasses

    from throughway.study.spec import RunSpec, check_specs

    residual = dataclasses.replace(GATED_CONFIG, model="mlp_residual", model_kwargs={})
    gated = dataclasses.replace(GATED_CONFIG, model_kwargs={"k_init": float("inf")})
    with pytest.raises(ValueError, match="run gated-d2-s0: .*k_init"):
        check_specs([RunSpec("residual-d2-s0", residual), RunSpec("gated-d2-s0", gated)])
