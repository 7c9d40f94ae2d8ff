"""`throughway analyze ...` on tiny run directories trained on the fake MNIST fixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from throughway.cli import main
from throughway.models import create_model
from throughway.train import RunConfig, run_training, save_model


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
