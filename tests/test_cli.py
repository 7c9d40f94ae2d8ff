"""The command line on tiny data: list, train, reproduce mnist-depth, report, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from throughway.cli import main
from throughway.experiments.mnist_depth import PAPER_MEAN_K, PAPER_TEST_ERROR

from conftest import PLAIN_ARGS, run_cli, run_cli_out


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


# -- options the command line refuses before any data is read: exit 2 naming the option ----------------



def _replace(argv: list[str], option: list[str]) -> list[str]:
    out = list(argv)
    i = out.index(option[0])
    out[i + 1] = option[1]
    return out


GATED_TRAIN = ["train", "--model", "mlp_gated_residual", "--depth", "2", "--width", "8", "--epochs", "2", "--limit",
               "64", "--quiet"]


ONE_EPOCH_TRAIN = ["train", "--model", "mlp_gated_residual", "--depth", "2", "--width", "8", "--epochs", "1",
                   "--limit", "64", "--quiet"]


@pytest.mark.parametrize("extra,named", [
    (["--model-arg", "depth=5"], ["--model-arg 'depth=5'", "--depth"]),
    (["--model-arg", "width=5"], ["--model-arg 'width=5'", "--width"]),
    (["--momentum", "0.5"], ["--momentum", "--recipe gresnet-mnist", "nadam"]),
    (["--lr-decay", "0.9"], ["--lr-decay", "--recipe gresnet-mnist", "'constant'"]),
    (["--model-arg", "init_scale=NaN"], ["init_scale", "finite"]),
])
def test_conflicting_or_inapplicable_options_name_both(tmp_path, fake_mnist_root, capsys, no_data, extra, named):
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(tmp_path / "run")] + extra)
    assert code == 2
    assert all(part in err for part in named), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option,value", [("--k-init", "nan"), ("--lr", "inf"), ("--gate-bias", "-inf"),
                                          ("--weight-decay", "nan")])
def test_non_finite_numbers_are_refused(tmp_path, capsys, no_data, option, value):
    with pytest.raises(SystemExit) as exit_info:
        main(PLAIN_ARGS + ["--out", str(tmp_path / "run"), f"{option}={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert option in err and "finite" in err


@pytest.mark.parametrize("option,value,field", [("--lr", "1e308", "recipe_overrides.lr"),
                                                ("--model-arg", "k_init=1e39", "model_kwargs.k_init")])
def test_numbers_beyond_float32_are_refused_before_the_data(tmp_path, capsys, no_data, option, value, field):
    # finite in Python, but training runs in float32, where they overflow
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(tmp_path / "run"), option, value])
    assert code == 2 and field in err and "float32" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_device_cuda_without_cuda(tmp_path, capsys, no_data):
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(tmp_path / "run"), "--device", "cuda"])
    assert code == 2 and "--device 'cuda'" in err and "accepted here: cpu" in err
    assert not (tmp_path / "run").exists()


def test_unknown_device_is_refused(tmp_path, capsys, no_data):
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(tmp_path / "run"), "--device", "tpu9"])
    assert code == 2 and "--device 'tpu9'" in err and "accepted" in err


@pytest.mark.parametrize("inside", [False, True])
def test_out_that_is_a_file(tmp_path, capsys, no_data, inside):
    target = tmp_path / "a_file"
    target.write_text("not a directory")
    out = target / "run" if inside else target
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(out)])
    assert code == 2 and f"--out {out}" in err and "file" in err
    assert target.read_text() == "not a directory"


def test_num_classes_that_does_not_match_the_data(tmp_path, capsys, no_data):
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(tmp_path / "run"), "--model-arg", "num_classes=5"])
    assert code == 2 and "num_classes=5" in err and "'mnist'" in err and "10" in err


@pytest.mark.parametrize("option, message", [
    (["--depth", "100000000"], "depth=100000000 (--depth): accepted: an integer from 1 to 10000 (MAX_DEPTH)"),
    (["--width", "100000000"], "(--depth, --width, --model-arg) has 20,000,080,100,000,010 parameters; accepted: "
                               "at most 1,000,000,000"),
    (["--seed", str(10 ** 23)], f"seed={10 ** 23} (--seed): accepted: an integer from -2**63 to 2**64 - 1"),
])
def test_huge_numeric_options_are_refused_at_once(tmp_path, capsys, monkeypatch, option, message):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the data was read before the arguments were checked")

    monkeypatch.setattr("throughway.train.run.load_dataset", refuse)
    argv = ["train", "--model", "mlp_plain", "--depth", "2", "--width", "8", "--epochs", "1", "--quiet",
            "--out", str(tmp_path / "run")]
    code = main(_replace(argv, option) if option[0] in argv else [*argv, *option])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("throughway: error: ") and message in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argument, accepted", [
    ("bn_momentum=5", "bn_momentum=5 (--model-arg bn_momentum=..., model_kwargs.bn_momentum); accepted: a number from 0 to 1"),
    ("bn_momentum=-1", "bn_momentum=-1 (--model-arg"),
    ("bn_eps=-1", "bn_eps=-1 (--model-arg bn_eps=..., model_kwargs.bn_eps); accepted: a number above 0, at most 1"),
    ("bn_eps=1e30", "bn_eps=1e+30 (--model-arg"),
])
def test_batchnorm_constants_out_of_range_are_refused_before_the_data(tmp_path, capsys, no_data, argument, accepted):
    out = tmp_path / "out"
    code, err = run_cli(capsys, GATED_TRAIN + ["--model-arg", argument, "--out", str(out)])
    assert code == 2
    assert accepted in err
    assert not out.exists()


def test_a_batch_of_one_with_batchnorm_is_refused_before_the_data(tmp_path, capsys, no_data):
    out = tmp_path / "out"
    code, err = run_cli(capsys, GATED_TRAIN + ["--batch-size", "1", "--out", str(out)])
    assert code == 2
    assert "recipe_overrides.batch_size=1 (--batch-size): model 'mlp_gated_residual' has BatchNorm layers" in err
    assert not out.exists()


def test_train_resume_quiet_prints_nothing(work, capsys):
    code, err = run_cli(capsys, GATED_TRAIN + ["--out", str(work / "interrupted"), "--resume"])
    assert code == 0
    assert err == ""


def test_an_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli_out(capsys, ONE_EPOCH_TRAIN + ["--out", ""])
    assert code == 2 and "--out '': an empty path" in err
    assert list(tmp_path.iterdir()) == []


def test_a_dataset_without_its_files_leaves_no_out_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli_out(capsys, ONE_EPOCH_TRAIN + ["--dataset", "cifar10", "--out", str(out)])
    assert code == 2 and "needs --data-dir" in err
    assert not out.exists()
    code, _, err = run_cli_out(capsys, ONE_EPOCH_TRAIN + ["--dataset", "cifar10", "--data-dir", str(tmp_path), "--out", str(out)])
    assert code == 2 and "--data-dir" in err and "data_batch_1" in err
    assert not out.exists()


def test_quiet_prints_only_the_result_line_on_stdout_as_documented(finished_train_run, capsys, tmp_path):
    code, out, err = run_cli_out(capsys, ONE_EPOCH_TRAIN + ["--out", str(tmp_path / "again")])
    assert code == 0 and err == "" and out.startswith(f"{tmp_path / 'again'}: test error")
    docs = (Path(__file__).parents[1] / "docs" / "reliability.md").read_text()
    quiet = next(line for line in docs.splitlines() if "--quiet" in line)
    assert "stdout" in docs[docs.index(quiet):docs.index(quiet) + 400]
