"""study.options: a frozen dataclass field is the command-line option (issue 15)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

import pytest

from throughway.experiments import EXPERIMENTS, mnist_depth
from throughway.study.options import add_options, config_from_args, option, quick_config

from conftest import run_cli


@dataclass(frozen=True)
class Example:
    depths: tuple[int, ...] = option((2, 10), "depths", quick=(2,), minimum=0)
    archs: tuple[str, ...] = option(("a", "b"), "architectures", choices=("a", "b", "c"))
    lr: float = option(0.1, "learning rate")
    seeds: int = option(5, "seeds", quick=1, minimum=1)
    full: bool = option(False, "use everything")
    limit: int | None = option(None, "first N samples")
    hidden: str = option("x", "not on the command line", cli=False)
    device: str = "cpu"


def _parse(*argv):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(parser, Example)
    return config_from_args(Example, parser.parse_args(list(argv)), device="meta")


def test_defaults_quick_and_explicit_values():
    assert _parse() == Example(device="meta")
    assert _parse("--quick") == Example(depths=(2,), seeds=1, device="meta")
    assert quick_config(Example) == Example(depths=(2,), seeds=1)
    got = _parse("--quick", "--seeds", "3", "--depths", "4", "6", "--archs", "c", "--lr", "0.5", "--full",
                 "--limit", "7")
    assert got == Example(depths=(4, 6), archs=("c",), lr=0.5, seeds=3, full=True, limit=7, device="meta")
    assert isinstance(got.depths, tuple)  # frozen and JSON-stable, as the defaults
    assert _parse("--no-full").full is False


@pytest.mark.parametrize("argv", [["--archs", "z"], ["--seeds", "0"], ["--lr", "nan"], ["--lr", "inf"],
                                  ["--seeds", "two"], ["--hidden", "y"]])
def test_bad_values_are_refused(argv, capsys):
    parser = argparse.ArgumentParser(prog="x")
    add_options(parser, Example)
    with pytest.raises(SystemExit) as raised:
        parser.parse_args(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err or "unrecognized" in err


def test_help_shows_default_and_quick_value():
    parser = argparse.ArgumentParser()
    add_options(parser, Example)
    text = parser.format_help()
    # the quick value is shown as a user types it (was "(2,)", the tuple's repr)
    assert "(default 2 10; --quick: 2)" in text and "--hidden" not in text


def test_mnist_depth_declares_each_option_once():
    # The quick variant and the recorded config come from the one declaration.
    assert (mnist_depth.QUICK.epochs, mnist_depth.QUICK.seeds, mnist_depth.QUICK.quick) == (2, 2, True)
    parser = argparse.ArgumentParser()
    mnist_depth.add_arguments(parser)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data-dir")
    config = config_from_args(mnist_depth.Config, parser.parse_args(["--stem", "dense", "--depths", "2", "4"]))
    assert asdict(config)["stem"] == "dense" and config.depths == (2, 4) and config.seeds == 5
    assert "mnist-depth" in EXPERIMENTS


def test_every_studys_seed_count_is_bounded_on_the_command_line_and_in_a_stored_config(capsys):
    from throughway.cli import main
    from throughway.study.options import MAX_SEEDS, check_stored_config

    too_many = str(MAX_SEEDS + 1)
    for name, flag in [("mnist-depth", "--seeds"), ("gate-family", "--seeds"), ("hessian-init", "--seeds"),
                       ("hessian-dynamics", "--seeds"), ("highway-depth", "--trials"), ("cifar-gated", "--seeds")]:
        try:  # argparse exits 2 itself; a count field (hessian-dynamics) is refused by main: exit 2 too
            code = main(["reproduce", name, flag, too_many, "--out", "/nonexistent/never-written"])
        except SystemExit as exc:
            code = exc.code
        assert code == 2 and too_many in capsys.readouterr().err, name
    check_stored_config(mnist_depth.Config, {"seeds": MAX_SEEDS, "depths": [2, 10]}, "summary.json")
    with pytest.raises(ValueError, match=r"summary.json: field 'config.seeds' is 1001; accepted: at most 1000"):
        check_stored_config(mnist_depth.Config, {"seeds": MAX_SEEDS + 1}, "summary.json")
    with pytest.raises(ValueError, match=r"field 'config.limit' is nan; accepted: an integer"):
        check_stored_config(mnist_depth.Config, {"limit": float("nan")}, "summary.json")
    check_stored_config(mnist_depth.Config, {"limit": None, "unknown": 10 ** 9}, "summary.json")  # optional; not an option


# -- a study's lists hold distinct values ---------------------------------------------------------------

GATED_STUDY = ["reproduce", "mnist-depth", "--quick", "--archs", "gated", "--epochs", "1", "--limit", "64", "--width",
               "8", "--jobs", "1", "--quiet"]


@pytest.mark.parametrize("argv, named", [
    (GATED_STUDY + ["--depths", "2", "2"], "--depths 2 2: lists 2 more than once; accepted: distinct values"),
    (["reproduce", "hessian-dynamics", "--seeds", "3", "3"],
     "--seeds 3 3: lists 3 more than once; accepted: distinct values"),
    (["reproduce", "shortcut-lr", "--networks", "xavier", "orthogonal", "xavier"],
     "--networks xavier orthogonal xavier: lists xavier more than once"),
])
def test_a_study_list_with_a_repeated_value_is_refused_before_anything_runs(tmp_path, capsys, argv, named):
    code, err = run_cli(capsys, argv + ["--out", str(tmp_path / "study")])
    assert code == 2
    assert named in err
    assert not (tmp_path / "study").exists()
