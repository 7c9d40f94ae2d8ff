"""Issue 14's "broken today" items: the package exports prune, repr() works on the meta device,
compiled models save and load, redraw keeps the compared curves, and analyze gates says when a run
differs from the paper's setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from throughway.cli import main
from throughway.models import create_model
from throughway.train import load_model, save_model


def test_prune_is_importable_from_the_analysis_package() -> None:
    from throughway.analysis import lesion, prune

    model = create_model("mlp_gated_residual", depth=6, width=8)
    smaller = prune(model, [0])
    assert len(smaller.blocks) == len(model.blocks) - 1
    with lesion(model, 1):
        pass


@pytest.mark.parametrize("name,kwargs", [("mlp_gated_residual", {"depth": 4, "width": 8}),
                                         ("mlp_augmented", {"depth": 4, "width": 8}),
                                         ("preact_resnet", {"depth": 8, "width": 4, "gated": True})])
def test_repr_of_a_model_on_the_meta_device(name: str, kwargs: dict) -> None:
    with torch.device("meta"):
        model = create_model(name, **kwargs)
    text = repr(model)
    assert "ScalarGate(function=relu, k=?)" in text
    assert "k=1" in repr(create_model(name, **kwargs))


def test_save_model_of_a_compiled_model_loads(tmp_path: Path) -> None:
    model = create_model("mlp_gated_residual", depth=4, width=8).eval()
    compiled = torch.compile(model)
    path = save_model(tmp_path / "model.safetensors", compiled)
    from safetensors.torch import load_file

    assert not any(key.startswith("_orig_mod.") for key in load_file(str(path)))
    x = torch.rand(3, 1, 28, 28)
    assert torch.equal(load_model(path)(x), model(x))


def test_load_model_accepts_a_file_with_compiled_keys(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    model = create_model("mlp_residual", depth=4, width=8).eval()
    path = save_model(tmp_path / "model.safetensors", model)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    save_file({f"_orig_mod.{k}": v for k, v in load_file(str(path)).items()}, str(path), metadata=metadata)
    x = torch.rand(3, 1, 28, 28)
    assert torch.equal(load_model(path)(x), model(x))


def _prune_result(family: str, accuracy: list[float]) -> dict:
    return {"family": family, "depth": 4, "dataset": "mnist", "num_blocks": 2, "layers_per_block": 2,
            "full_accuracy_pct": accuracy[0], "random": {"orders": [[0, 1]], "mean": accuracy, "std": [0.0] * 3}}


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
