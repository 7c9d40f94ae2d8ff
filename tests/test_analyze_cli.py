"""`throughway analyze ...` on tiny run directories trained on the fake MNIST fixture."""

from __future__ import annotations

import json

import pytest

from throughway.cli import main
from throughway.train import RunConfig, run_training


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
    out_gated = tmp_path / "gated-analysis"
    assert main(["analyze", "prune", gated, "--orders", "2", "--out", str(out_gated), "--quiet",
                 "--compare", str(out_res)]) == 0
    result = json.loads((out_gated / "prune.json").read_text())
    # Greedy follows k, and the curve starts at the full model's accuracy.
    assert result["greedy"]["order"] == sorted(range(3), key=lambda i: (gates["k"][i], i))
    assert result["greedy"]["accuracy_pct"][0] == pytest.approx(result["full_accuracy_pct"])
    assert (out_gated / "prune_accuracy.png").is_file()
    assert "paper:" in capsys.readouterr().out

    assert main(["analyze", "lesion", gated, "--out", str(tmp_path / "lesion-gated"), "--quiet"]) == 0
    lesion = json.loads((tmp_path / "lesion-gated" / "lesion.json").read_text())
    assert len(lesion["lesioned_error_pct"]) == 3 and lesion["num_samples"] == 600


def test_analyze_highway_and_lesion(fake_mnist_root, tmp_path, capsys):
    run = _train(tmp_path, "highway", "mlp_highway", 3, activation="tanh", gate_bias=-2.0)
    assert main(["analyze", "highway", run, "--classes", "1", "4"]) == 0
    result = json.loads((tmp_path / "highway" / "analysis" / "highway.json").read_text())
    assert len(result["biases"]) == 3 and len(result["biases"][0]) == 8
    assert set(result["class_differences"]) == {"1", "4"}
    for name in ("highway_gate_maps.png", "highway_class_routing.png"):
        assert (tmp_path / "highway" / "analysis" / name).stat().st_size > 1000
    assert main(["analyze", "lesion", run, "--quiet"]) == 0
    lesion = json.loads((tmp_path / "highway" / "analysis" / "lesion.json").read_text())
    assert len(lesion["lesioned_error_pct"]) == 3 and lesion["split"] == "train"
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
    assert "model.safetensors: not found" in capsys.readouterr().err
