"""A newcomer's typos and near misses at the command line: the closest accepted value is suggested
(difflib), an unknown option is refused with the sub-command's own usage, a run's results.json stands for
its folder, and `report` on a single run names the command that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from throughway.cli import main
from throughway.cli.parser import did_you_mean

REFERENCE_RUN = Path(__file__).resolve().parents[1] / "results" / "reference-run"


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv,suggested", [
    (["train", "--model", "mlp_gated_residual", "--depth", "2", "--recipe", "gresnet_mnist"], "gresnet-mnist"),
    (["train", "--model", "mlp_gated_residual", "--depth", "2", "--dataset", "fashion_mnist"], "fashion-mnist"),
    (["reproduce", "mnist_depth"], "mnist-depth"),
    (["analyze", "gate", "runs/x"], "gates"),
])
def test_a_typo_gets_the_closest_accepted_value(argv, suggested, capsys):
    err = _refused(argv, capsys)
    assert f"did you mean {suggested!r}?" in err, err
    assert "accepted values" in err or "choose from" in err  # the whole list is still given


def test_a_value_far_from_every_accepted_one_gets_no_suggestion(capsys):
    err = _refused(["reproduce", "xyzzy"], capsys)
    assert "invalid choice: 'xyzzy'" in err and "did you mean" not in err
    assert did_you_mean("zzz", ["mnist", "cifar10"]) == ""


def test_an_unknown_option_prints_the_sub_commands_usage(capsys):
    err = _refused(["train", "--epcohs", "1", "--model", "mlp_plain", "--depth", "2"], capsys)
    assert err.startswith("usage: throughway train") and "unrecognized arguments: --epcohs 1" in err
    assert "did you mean '--epochs'?" in err
    err = _refused(["reproduce", "gate-family", "--quik"], capsys)
    assert err.startswith("usage: throughway reproduce gate-family") and "did you mean '--quick'?" in err


def test_analyze_accepts_a_runs_results_json_for_its_folder(tmp_path, capsys):
    assert main(["analyze", "gates", str(REFERENCE_RUN / "results.json"), "--out", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "gates.json").read_text())["num_blocks"] > 0
    err = _refused(["analyze", "gates", str(REFERENCE_RUN / "COMMAND.txt")], capsys)
    assert "is a file: pass the run directory" in err


def test_report_on_a_single_run_names_analyze_gates(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text((REFERENCE_RUN / "results.json").read_text())
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "single run" in err and f"throughway analyze gates {run}" in err
