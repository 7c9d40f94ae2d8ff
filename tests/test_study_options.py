"""study.options: a frozen dataclass field is the command-line option (issue 15)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

import pytest

from throughway.experiments import EXPERIMENTS, mnist_depth
from throughway.study.options import add_options, config_from_args, option, quick_config


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
    config = mnist_depth.config_from_args(parser.parse_args(["--stem", "dense", "--depths", "2", "4"]))
    assert asdict(config)["stem"] == "dense" and config.depths == (2, 4) and config.seeds == 5
    assert "mnist-depth" in EXPERIMENTS
