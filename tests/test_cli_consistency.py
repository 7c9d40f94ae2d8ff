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
