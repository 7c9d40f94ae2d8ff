"""The command line on tiny data: list, train, reproduce mnist-depth, report, errors."""

from __future__ import annotations

import json

import pytest

from throughway.cli import main
from throughway.experiments.mnist_depth import PAPER_MEAN_K, PAPER_TEST_ERROR


def test_list_prints_models_recipes_experiments_name_first(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = {line.split()[0]: line.split()[1] for line in lines}
    for model in ("mlp_plain", "mlp_residual", "mlp_gated_residual", "mlp_augmented", "mlp_highway"):
        assert names[model] == "model"
    assert names["gresnet-mnist"] == "recipe" and names["highway-mnist"] == "recipe"
    assert names["mnist-depth"] == "experiment"


def test_train_smoke(tmp_path, fake_mnist_root, capsys):
    out = tmp_path / "run"
    code = main(["train", "--model", "mlp_gated_residual", "--depth", "2", "--epochs", "1", "--width", "8",
                 "--out", str(out), "--quiet"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["model"] == "mlp_gated_residual" and len(results["history"]) == 1
    assert (out / "model.safetensors").is_file()
    assert "test error" in capsys.readouterr().out


@pytest.mark.slow
def test_reproduce_mnist_depth_smoke_and_report(tmp_path, fake_mnist_root, capsys):
    out = tmp_path / "study"
    args = ["reproduce", "mnist-depth", "--depths", "2", "4", "--epochs", "1", "--seeds", "2", "--out", str(out),
            "--jobs", "1", "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    # the paper's numbers are printed beside ours
    assert f"{PAPER_TEST_ERROR['gated'][2]:.2f}" in printed and f"{PAPER_MEAN_K[2]:.2f}" in printed
    summary = json.loads((out / "results.json").read_text())
    assert {(c["arch"], c["depth"]) for c in summary["cells"]} == {(a, d) for a in ("plain", "residual", "gated", "highway")
                                                                   for d in (2, 4)}
    assert all(c["test_error_pct"]["n"] == 2 for c in summary["cells"])
    # the paired gated − residual test over the two seeds, per depth
    assert [row["depth"] for row in summary["comparisons"]] == [2, 4]
    assert all(row["seeds"] == [0, 1] and row["test_error_pct"]["df"] == 1 for row in summary["comparisons"])
    assert "paired t-test" in printed
    assert (out / "figure4_train_loss.png").stat().st_size > 10_000
    assert (out / "figure5_k_by_block.png").stat().st_size > 10_000
    assert summary["command"].startswith("throughway ")
    # a finished study is re-reported, not retrained; `report` remakes table and figure from the file
    assert main(args) == 0
    (out / "table.md").unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "table.md").is_file()


def test_errors_are_clear_and_exit_2(tmp_path, fake_mnist_root, capsys):
    assert main(["train", "--model", "mlp_nope", "--depth", "2", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "registered models" in capsys.readouterr().err
    assert main(["train", "--model", "mlp_residual", "--depth", "3", "--out", str(tmp_path / "y"), "--quiet"]) == 2
    assert "must be even" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):
        main(["reproduce", "mnist-depth", "--archs", "transformer"])


def test_bad_input_is_one_line_and_exit_2_never_a_traceback(tmp_path, capsys):
    # raised on purpose by a check deep in the package (models.registry), not by the parser
    out = tmp_path / "run"
    assert main(["train", "--model", "mlp_gated_residual", "--depth", "2", "--model-arg", "bn_momentum=5",
                 "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("throughway: error: ") and "bn_momentum=5" in err and "accepted" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_bug_of_the_toolkit_shows_its_traceback_and_asks_for_a_report(monkeypatch, capsys):
    def typo(*args, **kwargs):
        record = {"test_error_pct": 1.0}
        return record["test_eror_pct"]  # what a typo in the package does: a KeyError no check meant

    monkeypatch.setattr("throughway.analysis.sdi.sdi", typo)
    assert main(["sdi", "--layer", "gated", "--width", "4"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and 'record["test_eror_pct"]' in err  # the file and line
    assert "KeyError: 'test_eror_pct'" in err and "throughway: error: test_eror_pct" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("throughway: internal error: this is a bug in throughway, not in your input")
    assert "issue tracker" in last or "http" in last  # where to report it
    assert "throughway sdi --layer gated --width 4" in last and "the traceback above" in last  # and what to send


def test_an_exception_is_input_only_when_a_check_of_the_toolkit_raised_it():
    from throughway.cli.errors import is_input_error, raised_on_purpose
    from throughway.models import create_model
    from throughway.train.callbacks import metrics_table

    def caught(call):
        try:
            call()
        except Exception as exc:  # noqa: BLE001
            return exc
        raise AssertionError("no exception")

    assert raised_on_purpose(caught(lambda: create_model("mlp_nope")))  # a check naming the accepted models
    assert not raised_on_purpose(caught(lambda: metrics_table([None])))  # Python's TypeError inside the package
    assert not raised_on_purpose(caught(lambda: {}["x"]))  # and outside it
    assert not raised_on_purpose(KeyError("never raised"))  # no traceback: nothing says where it began
    assert is_input_error(caught(lambda: open("/nonexistent/throughway"))) and is_input_error(MemoryError())


def test_mnist_depth_estimate_projects_one_mixed_batch_per_depth(fake_mnist_root, capsys):
    # Issue 16: plain, residual and gated nets of one depth and every seed are one batch.
    assert main(["reproduce", "mnist-depth", "--estimate", "--depths", "2", "4", "--seeds", "2", "--epochs", "3",
                 "--archs", "plain", "residual", "gated", "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "Projected cost of the mnist-depth study" in printed
    rows = [line for line in printed.splitlines() if line.startswith("| 4 |") or line.startswith("| 2 |")]
    assert len(rows) == 2 and all(row.split("|")[2].strip() == "6" for row in rows)
    assert "projected wall time with 1 worker(s)" in printed


def test_train_resolves_and_checks_its_config_once(tmp_path, fake_mnist_root, monkeypatch):
    # issue 21: one check of the config and one resolution of its recipe per run (the CLI's run and a
    # resumed finished run included), passed on rather than recomputed.
    import sys

    from throughway.train import config as config_module

    calls = {"check_config": 0, "resolve_recipe": 0, "check_device": 0}
    for name in calls:
        original = getattr(config_module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        # Every module that imported the function calls it through its own name: count them all.
        for module in [m for n, m in sys.modules.items() if n.startswith("throughway")]:
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counted)
    argv = ["train", "--model", "mlp_gated_residual", "--depth", "2", "--epochs", "1", "--width", "8",
            "--limit", "64", "--out", str(tmp_path / "run"), "--quiet"]
    assert main(argv) == 0
    assert calls == {"check_config": 1, "resolve_recipe": 1, "check_device": 1}  # the device: in check_config only
    assert main([*argv, "--resume"]) == 0  # finished: skipped, after the same single check
    assert calls == {"check_config": 2, "resolve_recipe": 2, "check_device": 2}


def test_train_help_imports_no_experiment():
    # issue 33: the parser of `train` is built without the experiments' code or the studies' configs.
    import subprocess
    import sys

    code = ("import sys\nfrom throughway.cli import main\ntry:\n    main(['train', '--help'])\n"
            "except SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "print(sorted(m for m in sys.modules if m.startswith(('throughway.experiments', 'throughway.study'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]
    assert "--model" in done.stdout


def test_throughway_help_lists_every_command_with_its_help(capsys):
    # the sub-commands not being run are built by name and help alone: --help is unchanged by it
    from throughway.cli.parser import COMMANDS, build_parser, command_of

    assert command_of(["--help"]) == "" and command_of(["train", "--help"]) == "train"
    assert build_parser("").format_help() == build_parser().format_help()
    for name, help in COMMANDS.items():
        assert name in build_parser("").format_help() and help[:30] in build_parser("").format_help()
