"""StudySummary: the running summary every study rewrites as its runs end."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from throughway.cli import main
from throughway.study.options import MAX_SEEDS, StudyOptions
from throughway.study.summary import StudySummary

from conftest import (HOSTILE_VALUES, ONE_EPOCH_STUDY, assert_exit_0_or_2, edit_results, edited_fields, file_tree,
                      run_cli)



@dataclasses.dataclass(frozen=True)
class Example(StudyOptions):
    """A study's config with nothing but the options every study shares (the device, the shard, ...)."""


CONFIG = Example()


def test_study_summary_records_errors_throttles_and_forces(tmp_path):
    calls = {"summarize": 0, "report": 0}

    def summarize(config, out):
        assert config is CONFIG and out == tmp_path  # the study's own function, called with its (config, out)
        calls["summarize"] += 1
        return {"cells": [calls["summarize"]]}

    def report(out):
        calls["report"] += 1

    path = tmp_path / "results.json"
    refresh = StudySummary(tmp_path, CONFIG, summarize, report, environment={"host": "test"}, min_interval_s=3600)
    first = refresh()
    assert first is not None and first["cells"] == [1] and first["errors"] == {}
    assert first["environment"] == {"host": "test"} and isinstance(first["command"], str)
    # Within the interval an unforced call only records its error: nothing is rewritten.
    assert refresh("run-a", "boom", force=False) is None
    assert calls == {"summarize": 1, "report": 1}
    assert json.loads(path.read_text())["errors"] == {}
    # The forced final call writes everything recorded so far.
    final = refresh()
    assert final["errors"] == {"run-a": "boom"} and final["cells"] == [2]
    assert json.loads(path.read_text())["errors"] == {"run-a": "boom"}
    assert calls == {"summarize": 2, "report": 2}


def test_study_summary_without_interval_writes_every_call(tmp_path):
    n = {"k": 0}

    def summarize(config, out):
        n["k"] += 1
        return {"k": n["k"]}

    refresh = StudySummary(tmp_path, CONFIG, summarize, lambda out: None, environment={}, min_interval_s=0)
    assert refresh("x", None, force=False)["k"] == 1
    assert refresh("y", "", force=False)["k"] == 2
    assert refresh.errors == {}  # a run that ended without error records nothing


def test_every_study_kind_refuses_other_settings_naming_each_field(tmp_path):
    # One check (study.folders.check_same_settings) for the run-folder studies (check_study_folder: an
    # existing folder, FileExistsError) and the piece-by-piece ones (stored_study: ValueError).
    from throughway.study.folders import check_study_folder, stored_study

    stored = {"epochs": 100, "depths": [2, 10], "device": "cpu", "seeds": 5}
    (tmp_path / "results.json").write_text(json.dumps({"config": stored, "cells": []}))
    assert check_study_folder(tmp_path, "gate-family", {**stored, "device": "cuda"}, resume=True)  # device aside
    with pytest.raises(FileExistsError, match=r"epochs: stored 100, now 2; seeds: stored 5, now 1"):
        check_study_folder(tmp_path, "gate-family", {**stored, "epochs": 2, "seeds": 1}, resume=True)

    @dataclasses.dataclass
    class Config:
        epochs: int = 100
        depths: tuple[int, ...] = (2, 10)

    assert stored_study(tmp_path, "gate-family", Config(), ["epochs", "depths"], resume=True)["config"] == stored
    with pytest.raises(ValueError, match=r"depths: stored \[2, 10\], now \[2\]"):
        stored_study(tmp_path, "gate-family", Config(depths=(2,)), ["epochs", "depths"], resume=True)


def test_a_throttled_summary_waits_four_times_its_last_write(tmp_path, monkeypatch):
    # On a loaded machine one rewrite (the figures) took about 10 s: a 10 s interval counted from its start
    # rewrote after every batch. The wait counts from the end of a write and is at least 4 times its cost.
    from throughway.study import summary

    clock = [100.0]
    monkeypatch.setattr(summary.time, "monotonic", lambda: clock[0])

    def slow_report(out):
        clock[0] += 10.0  # the write takes 10 s

    writes = []
    refresh = StudySummary(tmp_path, CONFIG, lambda config, out: writes.append(1) or {}, slow_report, environment={},
                           min_interval_s=10)
    refresh()
    clock[0] += 15.0  # past min_interval_s, within 4 x 10 s of the write's end
    assert refresh("a", None, force=False) is None and len(writes) == 1
    clock[0] += 30.0
    assert refresh("b", None, force=False) is not None and len(writes) == 2
    assert refresh() is not None and len(writes) == 3  # a forced call always writes


def test_a_study_writes_its_report_once_its_first_run_ends(tmp_path, monkeypatch):
    # Study.run: results.json at once (the folder shows the study), but no table or figures of a study with no
    # finished run; a study shorter than min_interval_s draws them once, at the end.
    from throughway.study import runner
    from throughway.study.runner import Study

    reports = []

    def train(specs, runs_dir, *, on_done, **kwargs):
        assert (tmp_path / "results.json").is_file() and reports == []
        on_done("run-a", None)
        on_done("run-b", None)

    monkeypatch.setattr(runner, "run_stacked", train)
    study = Study("example", Example, lambda config: [], lambda config, out: {"cells": []},
                  lambda out: reports.append(1), min_interval_s=3600)
    final = study.run(CONFIG, tmp_path)
    assert reports == [1] and final["errors"] == {}


# -- what `report` (and a rebuild from the runs) checks before it reads a run -------------------------------

def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@pytest.fixture
def small_study(tmp_path, mnist_depth_small):
    """A copy of the session's small mnist-depth study (conftest.mnist_depth_small)."""
    return Path(shutil.copytree(mnist_depth_small, tmp_path / "study", symlinks=True))


def test_report_refuses_a_run_folder_holding_another_run(small_study, capsys):
    runs = small_study / "runs"
    (runs / "gated-d2-s1").rename(runs / "swap")
    (runs / "plain-d2-s1").rename(runs / "gated-d2-s1")
    (runs / "swap").rename(runs / "plain-d2-s1")
    before = _files(small_study)
    assert main(["report", str(small_study)]) == 2
    err = capsys.readouterr().err
    assert f"{runs / 'plain-d2-s1'}: holds a run of another config than the study's run plain-d2-s1" in err
    assert "model: recorded 'mlp_gated_residual', the study's 'mlp_plain'" in err
    assert _files(small_study) == before  # no table, findings or best_epoch.md from the swapped runs


def test_report_checks_a_summarys_config_against_the_option_bounds_before_reading_a_run(small_study, capsys):
    path = small_study / "results.json"
    summary = json.loads(path.read_text())
    summary["config"]["seeds"] = 10 ** 7  # hand-edited: walking its run names took minutes
    path.write_text(json.dumps(summary))
    began = time.monotonic()
    assert main(["report", str(small_study)]) == 2
    assert time.monotonic() - began < 5
    assert f"{path}: field 'config.seeds' is 10000000; accepted: at most {MAX_SEEDS}" in capsys.readouterr().err
    for field, value, accepted in [("archs", ["plain", "plain"], "accepted: distinct values"),
                                   ("archs", ["nope"], "accepted values: ["), ("depths", "2", "accepted: a list"),
                                   ("epochs", 0, "accepted: at least 1"), ("seeds", True, "accepted: an integer")]:
        path.write_text(json.dumps({**summary, "config": {**summary["config"], "seeds": 2, field: value}}))
        assert main(["report", str(small_study)]) == 2
        assert f"field 'config.{field}'" in (err := capsys.readouterr().err) and accepted in err, err


@pytest.mark.parametrize("link", [".", "results.json", "runs", "runs/gated-d2-s0"])
def test_report_reads_and_writes_nothing_through_a_link(small_study, tmp_path, capsys, link):
    elsewhere = tmp_path / "elsewhere"
    target = small_study / link if link != "." else small_study
    shutil.move(str(target), str(elsewhere))
    target.symlink_to(elsewhere, target_is_directory=elsewhere.is_dir())
    before = _files(elsewhere)
    assert main(["report", str(small_study)]) == 2
    assert f"{target} is a symbolic link" in capsys.readouterr().err
    assert _files(elsewhere) == before


def test_a_rebuild_from_the_runs_checks_the_config_and_the_run_folders(small_study):
    from throughway.experiments import mnist_depth

    def rebuild():
        return mnist_depth.STUDY.rebuild(small_study)

    assert rebuild()["config"]["seeds"] == 2  # the study as it stands
    path = small_study / "runs" / "gated-d2-s0" / "results.json"
    results = json.loads(path.read_text())
    path.write_text(json.dumps({**results, "config": {**results["config"], "seed": 7}}))
    with pytest.raises(ValueError, match=r"gated-d2-s0: holds a run of another config .*\(seed: recorded 7, the study.s 0\)"):
        rebuild()


# -- a damaged summary or run is named with its field ---------------------------------------------

def _summary_fields(content: Any) -> list[tuple[Any, ...]]:
    """Top-level fields, fields one level down, and the fields of the first cell and its first run."""
    paths: list[tuple[Any, ...]] = list(edited_fields(content))
    cells = content.get("cells") if isinstance(content, dict) else None
    if isinstance(cells, list) and cells and isinstance(cells[0], dict):
        paths += [("cells", 0, key) for key in cells[0]]
        runs = cells[0].get("runs")
        if isinstance(runs, list) and runs and isinstance(runs[0], dict):
            paths += [("cells", 0, "runs", 0, key) for key in runs[0]]
    return paths


GATED_STUDY = ["reproduce", "mnist-depth", "--quick", "--archs", "gated", "--epochs", "1", "--limit", "64", "--width",
               "8", "--jobs", "1", "--quiet"]


def _study_with_run(tmp_path: Path, trained_runs: Path, change: Any) -> Path:
    out = tmp_path / "study"
    run = out / "runs" / "gated-d2-s0"
    shutil.copytree(trained_runs / "finished", run)
    edit_results(run, change)
    return out


def test_report_on_a_tampered_summary_is_an_error_naming_the_file(tmp_path, capsys):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"experiment": "mnist-depth", "cells": "x"}))
    assert main(["report", str(folder)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"throughway: error: {folder / 'results.json'}: does not hold a mnist-depth summary as the study writes it "
        f"(field 'config' missing); the file was edited or damaged; rerun the study with --resume to rewrite it")


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(command=st.sampled_from(["report", "resume"]), choice=st.integers(0, 10**6), value=HOSTILE_VALUES, drop=st.booleans(),
       whole=st.sampled_from([None, None, None, [], "text", 3, {}]))
@pytest.mark.slow
def test_random_summary_edits_keep_the_promises(finished_run_and_study, capsys, command, choice, value, drop, whole):
    """Whatever a study summary's field holds (or the whole file), `report DIR` and `reproduce ...
    --resume` exit 0 or 2 with a one-line message, never change a run's files (no finished work
    lost) and touch nothing outside the study folder."""
    work = Path(tempfile.mkdtemp(prefix="hostile-summary-"))
    try:
        shutil.copytree(finished_run_and_study / "study", work / "study")
        shutil.copytree(finished_run_and_study / "data", work / "data")
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
        runs = file_tree(work / "study" / "runs")
        outside = {k: v for k, v in file_tree(work).items() if not k.startswith("study/")}
        capsys.readouterr()
        argv = (["report", str(work / "study")] if command == "report" else
                ONE_EPOCH_STUDY + ["--out", str(work / "study"), "--data-dir", str(work / "data"), "--resume"])
        code = main(argv)
        err = capsys.readouterr().err
        assert_exit_0_or_2(code, err, (command, content if whole is not None else field, value))
        assert file_tree(work / "study" / "runs") == runs
        assert {k: v for k, v in file_tree(work).items() if not k.startswith("study/")} == outside
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("argv, name", [
    (GATED_STUDY + ["--depths", "2"], "mnist-depth"),
    (["reproduce", "hessian-init", "--depths", "2", "--resume"], "hessian-init"),
    (["reproduce", "gate-family", "--quick", "--resume"], "gate-family"),
])
def test_a_study_summary_that_is_not_an_object_is_named(tmp_path, capsys, argv, name):
    out = tmp_path / "study"
    out.mkdir()
    (out / "results.json").write_text("[]\n")
    code, err = run_cli(capsys, argv + ["--out", str(out)])
    assert code == 2
    assert f"{out / 'results.json'}: holds list []; expected a {name} study's summary (a JSON object)" in err
    # nothing written but the study lock's empty `.lock` (filelock's, kept: see test_15)
    assert sorted(p.name for p in out.iterdir()) == [".lock", "results.json"]
    assert (out / "results.json").read_text() == "[]\n"


@pytest.mark.parametrize("change, named", [
    (lambda r: r["history"][0].pop("epoch"), "field 'history[0].epoch' is None (missing)"),
    (lambda r: r["history"][0].update(train_loss=[1.0]), "field 'history[0].train_loss' is [1.0] (wrong type)"),
    (lambda r: r["history"][1].update(epoch="2"), "field 'history[1].epoch' is '2' (wrong type)"),
    (lambda r: r["history"][0].update(test_error_pct="1.5"), "field 'history[0].test_error_pct' is '1.5'"),
    (lambda r: r["final"].update(k=["a"]), "field 'final.k' is ['a']; accepted: null or a list of numbers"),
    (lambda r: r.update(history={"epochs": []}), "field 'history' must be a list of objects"),
])
def test_a_damaged_run_of_a_study_is_named_with_its_field(tmp_path, trained_runs, capsys, change, named):
    out = _study_with_run(tmp_path, trained_runs, change)
    run = out / "runs" / "gated-d2-s0"
    before = file_tree(run)
    # --epochs 2: the run copied in is the study's gated-d2-s0 but for its damage (its config is checked first)
    code, err = run_cli(capsys, GATED_STUDY + ["--depths", "2", "--epochs", "2", "--out", str(out), "--resume"])
    assert code == 2
    assert f"{run / 'results.json'}: {named}" in err
    assert file_tree(run) == before


def test_a_damaged_study_summary_is_named_with_its_field(tmp_path, capsys):
    out = tmp_path / "study"
    summary = {"experiment": "mnist-depth", "config": {}}
    out.mkdir()
    (out / "results.json").write_text(json.dumps(summary))
    code, err = run_cli(capsys, GATED_STUDY + ["--depths", "2", "--out", str(out), "--resume"])
    assert code == 2
    assert f"{out / 'results.json'}: field 'cells' is not a list of cells" in err
