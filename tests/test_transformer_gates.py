"""reproduce transformer-gates (ours: the 2017 gate in a transformer): the model, a tiny study end to
end on the fake MNIST, resume, and the report's statistics and words on a synthetic summary."""

from __future__ import annotations

import pytest
import torch

from throughway import create_model
from throughway.analysis import find_branches, k_statistics
from throughway.experiments import transformer_gates as tg
from throughway.report.stats import bonferroni, judge


@pytest.mark.parametrize("gate", ["none", "relu", "rezero", "layerscale"])
def test_vit_patch_gates_both_branches_of_every_layer(gate):
    model = create_model("vit_patch", depth=3, width=16, heads=2, gate=gate).eval()
    branches = find_branches(model)
    assert list(branches)[:2] == ["blocks.0.attn", "blocks.0.ff"] and len(branches) == 6
    assert all((ref.gate is None) == (gate == "none") for ref in branches.values())
    assert model(torch.rand(5, 784)).shape == (5, 10)


def test_vit_patch_relu_gate_at_k_1_is_the_ungated_net():
    torch.manual_seed(3)
    plain = create_model("vit_patch", depth=2, width=16, heads=2).eval()
    torch.manual_seed(3)
    gated = create_model("vit_patch", depth=2, width=16, heads=2, gate="relu").eval()
    x = torch.rand(4, 784)
    with torch.no_grad():
        assert torch.allclose(plain(x), gated(x), atol=1e-6)
    assert k_statistics(gated)["k"] == [1.0] * 4
    with pytest.raises(ValueError, match="gate='sigmoid'"):
        create_model("vit_patch", gate="sigmoid")
    with pytest.raises(ValueError, match="in_features=100"):
        create_model("vit_patch", in_features=100)


def test_tiny_study_end_to_end_and_resume(tmp_path, fake_mnist_root):
    config = tg.Config(depths=(4,), families=("prenorm", "gated", "layerscale"), seeds=1, epochs=1, width=8,
                       limit=64)
    out = tmp_path / "tg"
    summary = tg.run(config, out, jobs=1, progress=False)
    assert len(summary["cells"]) == 3 and all(c["test_error_pct"]["n"] == 1 for c in summary["cells"])
    gated4 = next(c for c in summary["cells"] if c["family"] == "gated" and c["depth"] == 4)
    assert gated4["gates"][0]["count"] == 8 and len(gated4["removal"]) == 1
    assert len(gated4["removal"][0]["greedy"]) == 5  # 0..4 layers removed
    assert (out / "findings.md").read_text().startswith("- 4 layers:")
    assert (out / "transformer_gates.png").stat().st_size > 0
    assert "too few seeds" in (out / "findings.md").read_text()
    again = tg.run(config, out, resume=True, jobs=1, progress=False)
    assert again["cells"][0]["per_seed"] == summary["cells"][0]["per_seed"]


def _synthetic(errors: dict[str, list[float]]) -> dict:
    cells = []
    for family, values in errors.items():
        per_seed = [{"seed": s, "test_error_pct": v, "last_epoch_test_error_pct": v} for s, v in enumerate(values)]
        cells.append({"family": family, "depth": 4, "test_error_pct": tg.mean_std(values),
                      "last_epoch_test_error_pct": tg.mean_std(values), "per_seed": per_seed, "gates": [],
                      "removal": []})
    return {"config": {"depths": [4], "families": list(errors), "seeds": len(next(iter(errors.values())))},
            "cells": cells}


def test_findings_give_intervals_and_verdicts_at_the_holm_corrected_p():
    base = [5.0, 5.2, 4.9, 5.1, 5.0]
    summary = _synthetic({"prenorm": [b + 1.0 + 0.01 * i for i, b in enumerate(base)], "gated": base,
                          "rezero": [b + 0.3 * (-1) ** i for i, b in enumerate(base)]})
    rows = judge([row for other in ("prenorm", "rezero") for row in tg.gated_comparisons(summary, other)])
    summary["comparisons"], summary["removal_tests"] = rows, []
    prenorm, rezero = rows
    assert prenorm["p_corrected"] == pytest.approx(2 * prenorm["test"]["p_value"]) and prenorm["verdict"] == "gated better"
    assert rezero["verdict"] == "no difference detected"
    text = tg.findings_markdown(summary)
    assert "lowest mean test error (validation-selected epoch) gated (5.04" in text
    assert "gated better (gated − prenorm -1.02 points, 95% CI [" in text and "Holm p = " in text
    assert "no difference detected against rezero (95% CI [" in text and "Bonferroni" not in text


def test_validation_selection_takes_the_earliest_of_tied_epochs():
    history = [{"val_error_pct": 3.0, "test_error_pct": 9.0}, {"val_error_pct": 2.0, "test_error_pct": 4.0},
               {"val_error_pct": 2.0, "test_error_pct": 1.0}]
    assert tg._selected(history) == {"test_error_pct": 4.0, "selected_epoch": 2, "val_error_pct": 2.0}
    assert bonferroni([0.01, 0.4]) == [0.02, 0.8]  # kept beside Holm, never larger: report.stats
