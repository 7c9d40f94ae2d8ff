"""StudySummary: the running summary every study rewrites as its runs end."""

from __future__ import annotations

import json

from throughway.study.runs import StudySummary


def test_study_summary_records_errors_throttles_and_forces(tmp_path):
    calls = {"summarize": 0, "report": 0}

    def summarize():
        calls["summarize"] += 1
        return {"cells": [calls["summarize"]]}

    def report():
        calls["report"] += 1

    path = tmp_path / "results.json"
    refresh = StudySummary(path, summarize, report, {"host": "test"}, min_interval_s=3600)
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

    def summarize():
        n["k"] += 1
        return {"k": n["k"]}

    refresh = StudySummary(tmp_path / "s.json", summarize, lambda: None, {})
    assert refresh("x", None, force=False)["k"] == 1
    assert refresh("y", "", force=False)["k"] == 2
    assert refresh.errors == {}  # a run that ended without error records nothing


def test_every_study_kind_refuses_other_settings_naming_each_field(tmp_path):
    # One check (study.runs.check_same_settings) for the run-folder studies (check_study_folder: an
    # existing folder, FileExistsError) and the piece-by-piece ones (stored_study: ValueError).
    import dataclasses

    import pytest

    from throughway.study.runs import check_study_folder, stored_study

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
    from throughway.study import runs

    clock = [100.0]
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])

    def slow_report():
        clock[0] += 10.0  # the write takes 10 s

    writes = []
    refresh = StudySummary(tmp_path / "s.json", lambda: writes.append(1) or {}, slow_report, {}, min_interval_s=10)
    refresh()
    clock[0] += 15.0  # past min_interval_s, within 4 x 10 s of the write's end
    assert refresh("a", None, force=False) is None and len(writes) == 1
    clock[0] += 30.0
    assert refresh("b", None, force=False) is not None and len(writes) == 2
    assert refresh() is not None and len(writes) == 3  # a forced call always writes


def test_a_study_writes_its_report_once_its_first_run_ends(tmp_path):
    # `around`: results.json at once (the folder shows the study), but no table or figures of a study with no
    # finished run; a study shorter than min_interval_s draws them once, at the end.
    reports = []
    refresh = StudySummary(tmp_path / "results.json", lambda: {"cells": []}, lambda: reports.append(1), {},
                           min_interval_s=3600)

    def train(on_done):
        assert (tmp_path / "results.json").is_file() and reports == []
        on_done("run-a", None)
        on_done("run-b", None)

    final = refresh.around(train, merge=False)
    assert reports == [1] and final["errors"] == {}
