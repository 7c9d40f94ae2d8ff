"""The command line as a user expects it (issue 22): --quick on every experiment, one name for one idea
across commands, every option's default in --help, --version, and a top-level help that lists every
command."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
from typing import Iterator

import pytest

import throughway
from throughway.cli import build_parser, main
from throughway.experiments import EXPERIMENTS, get_experiment
from throughway.study.options import config_from_args


def _commands(parser: argparse.ArgumentParser, prog: str = "throughway") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prog} {name}")


def _visible_options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if action.option_strings and action.help != argparse.SUPPRESS and not isinstance(
                action, (argparse._HelpAction, argparse._VersionAction)):
            yield action


def _config(experiment: str, *argv: str):
    if experiment == "cifar-gated":  # it refuses to build a config without a CIFAR folder (none is read here)
        argv = (*argv, "--data-dir", "/nonexistent/cifar")
    args = build_parser().parse_args(["reproduce", experiment, *argv])
    module = get_experiment(experiment)
    if hasattr(module, "config_from_args"):
        return module.config_from_args(args)
    return config_from_args(module.Config, args, device=args.device, data_dir=args.data_dir)


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
def test_every_experiment_has_a_quick_variant_smaller_than_its_default(experiment):
    quick, full = _config(experiment, "--quick"), _config(experiment)
    changed = {f.name for f in dataclasses.fields(full) if getattr(quick, f.name) != getattr(full, f.name)}
    assert changed, f"{experiment} --quick changes nothing"


def test_one_name_for_one_idea_across_the_experiments():
    seen: dict[str, set[str]] = {}
    for name, parser in _commands(build_parser()):
        if name.startswith("throughway reproduce "):
            for action in _visible_options(parser):
                for option in action.option_strings:
                    seen.setdefault(option, set()).add(name)
    for old in ("--runs", "--subset", "--relu-subset", "--layers", "--mc"):
        assert old not in seen, f"{old} is shown by {seen[old]}: one idea has one name"
    assert {"--seeds", "--limit", "--depths", "--mc-samples"} <= set(seen)


@pytest.mark.parametrize("experiment", ["mnist-depth", "hessian-dynamics", "hessian-init", "shortcut-lr", "cifar-gated"])
def test_seeds_is_a_count_everywhere(experiment):
    config = _config(experiment, "--seeds", "2")
    value = {"hessian-init": "runs"}.get(experiment, "seeds")
    assert getattr(config, value) in (2, (0, 1)), (experiment, getattr(config, value))


def test_old_spellings_still_parse_and_say_what_to_write(capsys):
    assert _config("hessian-init", "--runs", "3").runs == 3
    assert "--runs is deprecated; use --seeds" in capsys.readouterr().err
    assert _config("highway-depth", "--layers", "10", "20").layers == (10, 20)
    assert _config("shortcut-lr", "--subset", "100").subset == 100
    assert _config("weight-norms", "--relu-subset", "100").relu_subset == 100
    assert _config("hessian-dynamics", "--seeds", "0", "1", "2").seeds == (0, 1, 2)  # the recorded list form
    args = build_parser().parse_args(["sdi", "--mc", "7"])
    assert args.mc_samples == 7 and "use --mc-samples" in capsys.readouterr().err


def test_a_seed_count_below_one_is_refused_with_exit_2(capsys):
    assert main(["reproduce", "hessian-dynamics", "--seeds", "0", "--out", "/nonexistent/never-written"]) == 2
    assert "--seeds 0" in capsys.readouterr().err


def test_every_option_shows_its_default_in_help():
    missing = []
    for prog, parser in _commands(build_parser()):
        for action in _visible_options(parser):
            switch = action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction)
            if action.required or switch:
                continue
            if "default" not in (action.help or ""):
                missing.append(f"{prog} {action.option_strings[0]}")
    assert missing == []


def test_every_seed_option_has_help():
    for prog, parser in _commands(build_parser()):
        for action in _visible_options(parser):
            if "--seed" in action.option_strings:
                assert action.help and "seed" in action.help, prog


def test_version_and_top_level_help_list_every_command():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--version"])
    assert stop.value.code == 0 and out.getvalue().strip() == f"throughway {throughway.__version__}" or \
        out.getvalue().startswith("throughway ")
    text = build_parser().format_help()
    for name, _ in _commands(build_parser()):
        parts = name.split()
        if len(parts) == 2:  # every top-level command appears as `throughway NAME` in the summary
            assert f"    throughway {parts[1]}" in text, parts[1]
    for name in ("gates", "prune", "highway", "lesion", "bn-stats", "redraw"):
        assert name in text.split("positional arguments")[0], name


# --------------------------------------------------------------------------------------------
# A study's progress, its compile default and the arithmetic of --estimate

def test_estimate_adds_set_up_fixed_costs_and_epochs_as_it_says(fake_mnist_root, monkeypatch):
    from throughway.study import stacking
    from throughway.train.loop import epoch_starts

    monkeypatch.setattr(stacking, "time_batch", lambda *a, **k: stacking.BatchTiming(0.01, 1e-5, 0.5))
    monkeypatch.setattr(stacking, "batch_overhead_s", lambda *a, **k: 2.0)  # larger than the 0.5 timed: it wins
    monkeypatch.setattr(stacking, "worker_start_s", lambda: 3.0)
    monkeypatch.setattr(stacking, "contention", lambda batch, jobs, *a: 1.0 if jobs == 1 else 1.5)
    study = get_experiment("highway-depth")
    config = dataclasses.replace(study.QUICK, layers=(3,), trials=4, epochs=2, limit=300)
    specs = study.specs(config)
    # measure_all: every measurement, as a study of more than SHORT_STUDY_S gets it
    one, two = stacking.project_batches(specs, jobs=1, measure_all=True), stacking.project_batches(specs, jobs=2, measure_all=True)
    steps = len(epoch_starts(one["train_images"], 100))  # highway-mnist: batch 100
    for row in one["batches"]:
        assert row["setup_s"] == 2.0 and not row["compiled"]
        assert row["epoch_s"] == pytest.approx(0.01 * steps + 1e-5 * one["eval_images"])
        assert row["total_s"] == pytest.approx(2.0 + 2 * row["epoch_s"])
    totals = [r["total_s"] for r in one["batches"]]
    assert 3.0 <= one["fixed_s"] < 3.0 + 5  # one process start, one (fast, fake) data load
    assert one["wall_s"] == pytest.approx(one["fixed_s"] + sum(totals))
    if len(totals) > 1:  # two workers: each starts and loads the data too, they slow each other, batches overlap
        assert two["fixed_s"] >= 6.0 and two["contention"] == 1.5
        for row, alone in zip(two["batches"], one["batches"]):
            assert row["epoch_s"] == pytest.approx(1.5 * alone["epoch_s"])
        assert two["wall_s"] == pytest.approx(two["fixed_s"] + stacking.makespan([r["total_s"] for r in two["batches"]], 2))
    text = stacking.projection_markdown("t", one, [])
    assert "s for all epochs" in text and "set-up" in text and text.strip().splitlines()[-1].startswith("serial sum")


def test_estimate_of_a_short_study_skips_the_costly_measurements(fake_mnist_root, monkeypatch):
    # `reproduce gate-family --quick --estimate` took 65 s to project a 34 s study: a study whose timed
    # steps project under SHORT_STUDY_S is projected without contention, one-epoch runs or a process start.
    from throughway.study import stacking

    def refuse(*a, **k):
        raise AssertionError("measured for a short study")

    monkeypatch.setattr(stacking, "time_batch", lambda *a, **k: stacking.BatchTiming(0.01, 1e-5, 0.5))
    for name in ("batch_overhead_s", "worker_start_s", "contention"):
        monkeypatch.setattr(stacking, name, refuse)
    specs = get_experiment("gate-family").specs(dataclasses.replace(get_experiment("gate-family").QUICK, limit=300))
    two = stacking.project_batches(specs, jobs=2)
    assert two["measured_all"] is False and two["contention"] == 1.0
    assert all(row["setup_s"] == 0.5 for row in two["batches"])  # time_batch's own set-up
    assert two["fixed_s"] > 0  # this process's age stands in for a worker's start
    assert two["serial_s"] < stacking.SHORT_STUDY_S + two["fixed_s"]
    text = stacking.projection_markdown("t", two, [])
    assert "short study" in text and text.strip().splitlines()[-1].startswith("serial sum")
    # a long study measures everything
    monkeypatch.setattr(stacking, "time_batch", lambda *a, **k: stacking.BatchTiming(10.0, 1e-5, 0.5))
    with pytest.raises(AssertionError, match="measured for a short study"):
        stacking.project_batches(specs, jobs=2)


def test_batch_seconds_is_set_up_plus_epochs():
    from throughway.study.stacking import BatchTiming, batch_seconds

    seconds = batch_seconds(BatchTiming(step_s=0.02, eval_s=1e-4, setup_s=100.0), epochs=3, steps_per_epoch=390,
                            eval_samples=20_000)
    assert seconds["epoch_s"] == pytest.approx(0.02 * 390 + 2.0)
    assert seconds["total_s"] == pytest.approx(100.0 + 3 * seconds["epoch_s"])


def test_full_runs_compile_by_default_and_quick_runs_and_tests_do_not():
    from throughway.study.stacking import COMPILE_MIN_STEPS, compiles, group_specs
    from throughway.train.loop import epoch_starts

    study = get_experiment("mnist-depth")
    full, quick = _config("mnist-depth"), _config("mnist-depth", "--quick")
    assert full.compile is None and quick.compile is False and _config("mnist-depth", "--no-compile").compile is False
    batch = group_specs(study.specs(dataclasses.replace(full, depths=(2,))))[0]
    steps = 100 * len(epoch_starts(60_000, 128))  # the full study: 100 epochs of 60,000 images, batch 128
    assert steps >= COMPILE_MIN_STEPS and compiles(batch, None, 60_000)
    assert not compiles(batch, None, 600)  # a test's fake data: 5 steps an epoch
    assert compiles(batch, True, 600) and not compiles(batch, False, 60_000)
    quick_batch = group_specs(study.specs(dataclasses.replace(quick, depths=(2,))))[0]
    assert not compiles(quick_batch, quick.compile, 50_000)


def test_a_study_shows_one_progress_line_per_batch_with_an_eta_and_nothing_when_quiet():
    from throughway.study.stacking import StudyProgress

    stream = io.StringIO()  # not a terminal: one line per finished batch, tqdm's format
    bar = StudyProgress(10, "study: runs", stream=stream)
    bar.advance(3, "batch d=2 done")
    bar.advance(7, "batch d=10 done")
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "3/10" in lines[0] and "10/10" in lines[1] and "batch d=2 done" in lines[0]
    assert "left" in lines[0]  # the time left, measured on the first batch
    quiet = io.StringIO()
    bar = StudyProgress(10, enabled=False, stream=quiet)
    bar.advance(10)
    bar.close()
    assert quiet.getvalue() == ""


def test_a_studys_time_left_is_measured_by_work_not_by_counting_runs(monkeypatch):
    """A study trains its deepest runs first: after a batch of 6 depth-100 runs (600 units of work in 60 s),
    34 runs of 20 units each are left, 68 s at the measured pace; counting runs would say 340 s."""
    from types import SimpleNamespace

    from throughway.study import stacking

    clock = [0.0]
    monkeypatch.setattr(stacking, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    stream = io.StringIO()
    bar = stacking.StudyProgress(40, "study: runs", stream=stream, total_work=6 * 100 + 34 * 20)
    assert bar.remaining_s() is None  # nothing measured yet: no estimate
    clock[0] = 60.0
    bar.advance(6, "batch d=100 done", work=600)
    assert bar.remaining_s() == pytest.approx(68.0)
    assert "01:08 left" in stream.getvalue()
    # a resumed study: runs finished before count as done, neither as work nor as time
    resumed = io.StringIO()
    bar = stacking.StudyProgress(40, "study: runs", stream=resumed, total_work=34 * 20, done_before=6)
    clock[0] = 70.0
    bar.advance(4, "batch d=50 done", work=80)
    assert "10/40" in resumed.getvalue() and bar.remaining_s() == pytest.approx(10.0 * 600 / 80)


def test_the_work_of_a_run_grows_with_its_depth_and_epochs():
    from throughway.study.stacking import run_work
    from throughway.train import RunConfig

    shallow, deep = (RunConfig(model="mlp_gated_residual", depth=d, recipe="gresnet-mnist") for d in (2, 100))
    assert run_work(deep) > 6 * run_work(shallow)  # 304,810 parameters against 45,061
    assert run_work(dataclasses.replace(shallow, recipe_overrides={"epochs": 2})) * 50 == pytest.approx(run_work(shallow))


def test_contention_is_one_for_a_single_worker():
    from throughway.study.stacking import contention

    assert contention([], 1, 2, (784,), 10) == 1.0  # nothing is measured for one worker
