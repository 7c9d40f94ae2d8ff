"""reproduce transformer-gates (ours): which layers a trained ViT can lose. The model and its gates; the
vit-mnist recipe's per-step schedule; a small study end to end on the fake MNIST (training, the analysis
of every run in its worker on the weights the error table reports, random orders drawn per net, the
paired tests, resume); the report's statistics and words on a synthetic summary."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from throughway import create_model
from throughway._io import read_json
from throughway.analysis import find_branches, k_statistics
from throughway.experiments import transformer_gates as tg
from throughway.report.stats import judge, mean_std, paired_by_seed
from throughway.train import get_recipe, learning_rate_at_step, parameter_groups


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


def test_the_vit_recipe_warms_up_and_decays_per_step_and_decays_weights_only():
    recipe = get_recipe("vit-mnist")
    assert (recipe.optimizer, recipe.schedule, recipe.weight_decay) == ("adamw", "warmup-cosine", 0.05)
    total = 20 * 391  # 20 epochs of the 50,000 training images at batch 128
    rates = [learning_rate_at_step(recipe, s, total) for s in range(total)]
    assert rates[0] < rates[200] < rates[399] and rates[400] == pytest.approx(recipe.lr)
    assert all(a >= b for a, b in zip(rates[400:], rates[401:])) and rates[-1] < 1.01e-5
    model = create_model("vit_patch", depth=2, width=16, heads=2, gate="relu")
    groups = {g["group"]: {id(p) for p in g["params"]} for g in parameter_groups(model, recipe)}
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay = {names[i] for i in groups["no_decay"]}
    assert {"position", "blocks.0.branch_gates.attn.k", "blocks.1.norm2.weight", "head.bias"} <= no_decay
    assert all(names[i].endswith("weight") and "norm" not in names[i] for i in groups["decay"])


def test_the_study_refuses_options_that_do_not_fit():
    with pytest.raises(ValueError, match="width=30 is not divisible by heads=4"):
        dataclasses.replace(tg.QUICK, width=30, heads=4)
    with pytest.raises(ValueError, match="depths=\\(1,\\)"):
        dataclasses.replace(tg.QUICK, depths=(1,))
    assert tg.checkpoints(6) == [1, 3] and tg.checkpoints(8) == [2, 4] and tg.checkpoints(2) == [1]


def test_the_study_trains_analyses_every_run_on_its_last_epoch_and_compares_the_criteria(tmp_path, fake_mnist_root):
    config = dataclasses.replace(tg.QUICK, families=("prenorm", "gated"), depths=(4,), seeds=3, epochs=1, width=8,
                                 heads=2, limit=None, calibration_images=64)
    out = tmp_path / "transformer-gates"
    summary = tg.run(config, out, progress=False)
    gated = next(c for c in summary["cells"] if c["family"] == "gated")
    run = read_json(out / "runs" / "gated-L4-s1" / tg.ANALYSIS_FILE)
    results = read_json(out / "runs" / "gated-L4-s1" / "results.json")
    # the checkpoint the error table uses: the last epoch's weights, whose test accuracy the analysis measured
    assert run["weights"] == summary["weights"] == "last epoch"
    assert run["test_accuracy"] == pytest.approx(100.0 - results["final"]["test_error_pct"], abs=1e-9)
    assert gated["per_seed"][1]["test_error_pct"] == results["final"]["test_error_pct"]
    assert set(run["curves"]) == set(tg.CRITERIA) and run["layers"] == [f"blocks.{i}" for i in range(4)]
    # element n: the test accuracy with n layers removed; deepest never removes the last layer
    assert all(len(curve) == 5 for name, curve in run["curves"].items() if name != "deepest")
    assert len(run["curves"]["deepest"]) == 4 and run["orders"]["deepest"] == ["blocks.2", "blocks.1", "blocks.0"]
    assert all(curve[0] == run["test_accuracy"] for curve in run["curves"].values())
    # every subset of 4 layers at most 6 per n: the random baseline is exact, each subset evaluated once
    assert run["random_kind"] == ["exact"] * 5 and run["random_subsets"] == [1, 4, 6, 4, 1] and run["evaluations"] == 16
    assert run["calibration"]["split"] == "train" and run["calibration"]["images"] == 64
    assert "gate" not in read_json(out / "runs" / "prenorm-L4-s1" / tg.ANALYSIS_FILE)["orders"]
    # random orders drawn for each net from its own recorded seed
    other = read_json(out / "runs" / "gated-L4-s2" / tg.ANALYSIS_FILE)
    assert run["random_seeds"] == [tg.random_seed("gated-L4-s1", i) for i in range(3)]
    assert set(run["random_seeds"]).isdisjoint(other["random_seeds"]) and run["random_orders"] != other["random_orders"]
    # the paired tests: each criterion against the gate order at n = 1 and 2, Holm over the table
    rows = summary["criteria_tests"]
    assert {(r["n"], r["a"]) for r in rows} == {(n, c) for n in (1, 2) for c in tg.CRITERIA[1:]}
    row = next(r for r in rows if r["n"] == 2 and r["a"] == "random")
    seeds, test = paired_by_seed({e["seed"]: e["analysis"]["curves"]["random"][2] for e in gated["per_seed"]},
                                 {e["seed"]: e["analysis"]["curves"]["gate"][2] for e in gated["per_seed"]})
    assert row["seeds"] == seeds == [0, 1, 2] and row["test"]["mean_difference"] == pytest.approx(test.mean_difference)
    for name in ("table.md", "findings.md", "transformer_gates.png"):
        assert (out / name).is_file(), name
    assert "Holm" in (out / "table.md").read_text() and "gated, 4 layers:" in (out / "findings.md").read_text()
    # the docs page's blocks and the README row render from the new results (tools/readme)
    from tools.readme.sections.overview import _transformer_gates_row
    from tools.readme.sections.transformer_gates import (_transformer_gates_findings, _transformer_gates_orders,
                                                         _transformer_gates_table)

    assert _transformer_gates_findings(tmp_path) == (out / "findings.md").read_text()
    assert _transformer_gates_table(tmp_path) == tg.table_markdown(summary)
    assert _transformer_gates_orders(tmp_path).startswith("the gate order of the 4-layer gated nets removes first ")
    assert "4 layers, 3 seeds: ungated test error " in _transformer_gates_row(tmp_path)
    # resumed: nothing is trained or analysed again
    stamp = (out / "runs" / "gated-L4-s1" / tg.ANALYSIS_FILE).stat().st_mtime_ns
    again = tg.run(config, out, resume=True, progress=False)
    assert (out / "runs" / "gated-L4-s1" / tg.ANALYSIS_FILE).stat().st_mtime_ns == stamp
    assert again["criteria_tests"] == rows


def _synthetic(errors: dict[str, list[float]], gate_curves: list[list[float]] | None = None,
               other_curves: list[list[float]] | None = None) -> dict:
    cells = []
    for family, values in errors.items():
        per_seed = [{"seed": s, "test_error_pct": v} for s, v in enumerate(values)]
        if family == "gated" and gate_curves is not None and other_curves is not None:
            for entry, gate, other in zip(per_seed, gate_curves, other_curves):
                curves = {c: other for c in tg.CRITERIA}
                curves["gate"] = gate
                entry["analysis"] = {"curves": curves, "orders": {"gate": ["blocks.1", "blocks.0"]},
                                     "gates": {"per_branch": [0.9, 1.0, 1.1, 1.2], "mean": 1.05, "dead": 0,
                                               "count": 4}}
        cells.append({"family": family, "depth": 2, "test_error_pct": mean_std(values), "per_seed": per_seed,
                      "gates": [e["analysis"]["gates"] for e in per_seed if "analysis" in e]})
    return {"config": {"depths": [2], "families": list(errors), "seeds": len(next(iter(errors.values()))), "width": 8,
                       "epochs": 20, "limit": None},
            "cells": cells, "weights": tg.WEIGHTS, "reference": tg.REFERENCE, "parameters": {"2": 1234},
            "training_images": 50000}


def test_findings_give_intervals_and_verdicts_at_the_holm_corrected_p():
    base = [5.0, 5.2, 4.9, 5.1, 5.0]
    gate = [[98.0, 90.0 + i * 0.1, 10.0] for i in range(5)]
    other = [[98.0, 80.0 + i * 0.3, 10.0] for i in range(5)]
    summary = _synthetic({"prenorm": [b + 1.0 + 0.01 * i for i, b in enumerate(base)], "gated": base,
                          "rezero": [b + 0.3 * (-1) ** i for i, b in enumerate(base)]}, gate, other)
    summary["comparisons"] = judge([row for other in ("prenorm", "rezero") for row in tg.gated_comparisons(summary, other)])
    rows = []
    for criterion in tg.CRITERIA[1:]:
        seeds, test = paired_by_seed({s: other[s][1] for s in range(5)}, {s: gate[s][1] for s in range(5)})
        rows.append({"depth": 2, "family": "gated", "n": 1, "a": criterion, "b": "gate", "seeds": seeds,
                     "test": test.to_dict()})
    summary["criteria_tests"] = judge(rows, better="higher")
    prenorm, rezero = summary["comparisons"]
    assert prenorm["p_corrected"] == pytest.approx(2 * prenorm["test"]["p_value"]) and prenorm["verdict"] == "gated better"
    assert rezero["verdict"] == "no difference detected"
    assert all(r["verdict"] == "gate better" for r in summary["criteria_tests"])
    text = tg.findings_markdown(summary)
    assert "The ungated ViT (2 layers, width 8, 1,234 parameters, 20 epochs on 50,000 training images) reaches 6.06" in text
    assert "reports 0.5%: not a like-for-like comparison" in text
    assert "lowest mean test error gated (5.04" in text
    assert "gated better (gated − prenorm -1.02 points, 95% CI [" in text and "Holm p = " in text
    assert "no difference detected against rezero (95% CI [" in text and "Bonferroni" not in text
    assert "the gate order keeps more test accuracy than block_influence at n = 1 (-9.60 points, Holm p = " in text
    assert "Mean test accuracy (%) with 1 of 2 layers removed, highest mean first" in text
    table = tg.table_markdown(summary)
    assert "| 2 | gated | 1 | lesion | 5 | -9.60 |" in table
    assert tg.orders_prose(summary).startswith("the gate order of the 2-layer gated nets removes first blocks.1 in 5 of 5")


def test_a_criterion_that_removes_the_gates_layers_at_every_seed_is_said_to_match_it():
    gate = [[98.0, 90.0 + i, 10.0] for i in range(3)]
    summary = _synthetic({"gated": [5.0, 5.1, 5.2]}, gate, gate)
    summary["comparisons"] = []
    rows = []
    for criterion in tg.CRITERIA[1:]:
        seeds, test = paired_by_seed({s: gate[s][1] for s in range(3)}, {s: gate[s][1] for s in range(3)})
        rows.append({"depth": 2, "family": "gated", "n": 1, "a": criterion, "b": "gate", "seeds": seeds,
                     "test": test.to_dict()})
    summary["criteria_tests"] = judge(rows, better="higher")
    text = tg.findings_markdown(summary)
    assert "the gate order's test accuracy at every seed: block_influence at n = 1" in text
    assert "too few seeds" not in text and "Holm over the 0 tests" not in text
