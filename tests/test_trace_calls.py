"""tools/trace_calls.py: the files a `throughway` command goes through, how often it goes straight back
(ping-pongs), and the CLI's share."""

from __future__ import annotations

from pathlib import Path

import throughway
from tools.trace_calls import crossings, pairs, ping_pongs, ping_pongs_by_call, summarise, trace

PACKAGE = Path(throughway.__file__).resolve().parent


def test_summary_counts_moves_and_returns():
    summary = summarise(["a.py", "a.py", "b.py", "a.py", "c.py", "b.py"])
    assert summary["entered"] == ["a.py", "b.py", "a.py", "c.py", "b.py"]
    assert (summary["distinct"], summary["moves"], summary["returns"]) == (3, 4, 2)
    calls = [("a.py", 1, "f", False, ""), ("b.py", 1, "g", False, "a.py"), ("a.py", 5, "h", False, "a.py"),
             ("b.py", 9, "k", False, "a.py")]
    entering, back = crossings(calls)
    assert [c[2] for c in entering] == ["f", "g", "k"] and [c[2] for c in back] == ["k"]


def test_a_ping_pong_is_a_return_straight_back():
    entered = ["a.py", "b.py", "a.py", "b.py", "c.py", "a.py", "c.py", "d.py"]
    # a → b → a, then b → a → b, then c → a → c; b → c → a is a move on, not back
    assert ping_pongs(entered) == [("a.py", "b.py"), ("b.py", "a.py"), ("c.py", "a.py")]
    assert pairs(ping_pongs(entered)) == {("a.py", "b.py"): 2, ("a.py", "c.py"): 1}
    assert summarise(["a.py", "a.py", "b.py", "a.py"])["ping_pongs"] == [("a.py", "b.py")]


def test_a_ping_pong_says_whether_a_call_joins_its_two_files():
    calls = [("r.py", 1, "build", False, ""), ("m.py", 1, "first", False, "r.py"),
             ("d.py", 1, "block", False, "m.py"), ("m.py", 9, "second", False, "r.py"),  # m → d → m: m calls d
             ("g.py", 1, "gate", False, "d.py"), ("m.py", 20, "third", False, "r.py"),  # m → g → m: neither calls
             ("r.py", 7, "check", False, "r.py"), ("m.py", 30, "fourth", False, "r.py")]  # m → r → m: r calls m
    assert ping_pongs_by_call(calls) == [("m.py", "d.py", True), ("m.py", "g.py", False), ("m.py", "r.py", True)]
    assert [(a, b) for a, b, _ in ping_pongs_by_call(calls)] == ping_pongs(summarise([c[0] for c in calls])["entered"])


def test_the_train_route_reads_one_way(tmp_path, fake_mnist_root, capsys):
    """`throughway train`'s route, from the command's start (the registrations made while the package is
    imported are every command's, not this one's): at most 5 ping-pongs outside the training loop (fit's
    inside is one entry into train/loop.py: a core read on its own) and at most 13 with it, the loop's
    calls to the distributed helpers, the schedule, the first step's checks, the optimiser and the gates
    counted too (tools/trace_calls.py's docstring; 7 and 22 before the route was reworked)."""
    status, calls = trace(["train", "--model", "mlp_gated_residual", "--depth", "2", "--epochs", "1", "--limit",
                           "200", "--out", str(tmp_path / "run"), "--quiet"], PACKAGE, after_import=True)
    assert status == 0
    outside = ping_pongs(summarise([c[0] for c in calls if not c[3]])["entered"])
    assert len(outside) <= 5, pairs(outside)
    whole = ping_pongs(summarise([c[0] for c in calls])["entered"])
    assert len(whole) <= 13, pairs(whole)
    # fit's checks are one entry into train/checks.py (the walk went back and forth 6 times between loop.py and
    # checks.py); the one return left is the first step's loss check
    assert pairs(whole).get(("train/checks.py", "train/loop.py"), 0) <= 1


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
