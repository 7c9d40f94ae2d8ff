"""tools/trace_calls.py (issue 33): the files a `throughway` command goes through, and the CLI's share."""

from __future__ import annotations

from pathlib import Path

import throughway
from tools.trace_calls import crossings, summarise, trace

PACKAGE = Path(throughway.__file__).resolve().parent


def test_summary_counts_moves_and_returns():
    summary = summarise(["a.py", "a.py", "b.py", "a.py", "c.py", "b.py"])
    assert summary["entered"] == ["a.py", "b.py", "a.py", "c.py", "b.py"]
    assert (summary["distinct"], summary["moves"], summary["returns"]) == (3, 4, 2)
    calls = [("a.py", 1, "f", False, ""), ("b.py", 1, "g", False, "a.py"), ("a.py", 5, "h", False, "a.py"),
             ("b.py", 9, "k", False, "a.py")]
    entering, back = crossings(calls)
    assert [c[2] for c in entering] == ["f", "g", "k"] and [c[2] for c in back] == ["k"]


def test_a_train_run_goes_through_the_command_line_once_and_no_study(tmp_path, fake_mnist_root, capsys):
    status, calls = trace(["train", "--model", "mlp_gated_residual", "--depth", "2", "--epochs", "1", "--width", "8",
                           "--limit", "64", "--out", str(tmp_path / "run"), "--quiet"], PACKAGE)
    assert status == 0
    files = [c[0] for c in calls]
    assert not [f for f in files if f.startswith(("experiments/", "study/", "report/"))], files
    outside = summarise([c[0] for c in calls if not c[3]])["entered"]  # fit's own calls left out
    for name in ("cli/__init__.py", "cli/parser.py", "cli/commands.py", "train/run.py"):
        assert name in outside
    for name in ("cli/__init__.py", "cli/parser.py", "cli/commands.py"):
        assert outside.count(name) == 1, outside
    # the config is checked in one place: check_config (train/config.py), called by run_training
    checks = [c for c in calls if c[2] in ("check_config", "check_device", "resolve_recipe")]
    assert [(c[2], c[4]) for c in checks] == [("check_config", "train/run.py"), ("check_device", "train/config.py"),
                                              ("resolve_recipe", "train/config.py")]
