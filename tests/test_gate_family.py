"""Issue 24: the ReZero, LayerScale and normalisation-free blocks, and `reproduce gate-family`."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from throughway.analysis.removal import lesion, prune, removal_curve, removal_order
from throughway.cli import main
from throughway.layers import GATE_FUNCTIONS, ScalarGate, VectorGate, cait_layerscale_init
from throughway.models import create_model
from throughway.report.stats import mean_std
from throughway.train import load_model, read_results, save_model


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("depth, expected", [(2, 0.1), (18, 0.1), (20, 1e-5), (24, 1e-5), (26, 1e-6), (100, 1e-6)])
def test_cait_layerscale_init_by_depth(depth, expected):
    # CaiT §3: 0.1 up to depth 18, 1e-5 up to 24, 1e-6 beyond.
    assert cait_layerscale_init(depth) == expected


@pytest.mark.parametrize("norm", ["batch", "none"])
def test_parameter_counts_beside_the_residual_net(norm):
    depth, width = 10, 12
    kw = {"depth": depth, "width": width, "norm": norm}
    residual = _count(create_model("mlp_residual", **kw))
    blocks = depth // 2
    assert _count(create_model("mlp_gated_residual", **kw)) == residual + blocks
    assert _count(create_model("mlp_rezero", **kw)) == residual + blocks  # one α per block
    assert _count(create_model("mlp_layerscale", **kw)) == residual + blocks * width  # one λ per channel
    # without BatchNorm each of the 2·blocks branch layers loses its BN weight and bias (2·width each)
    if norm == "none":
        assert residual == _count(create_model("mlp_residual", depth=depth, width=width)) - 2 * blocks * 2 * width
        assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in create_model("mlp_rezero", **kw).modules())


def test_rezero_starts_as_the_identity_and_records_its_gate():
    model = create_model("mlp_rezero", depth=4, width=8)
    assert model.config["k_init"] == 0.0 and model.config["gate_function"] == "identity"
    for block in model.blocks:
        assert isinstance(block.gate, ScalarGate) and block.gate.value().shape == ()
        assert float(block.gate.value().detach()) == 0.0
        x = torch.randn(5, 8)
        block.eval()
        assert torch.equal(block(x), x)  # α = 0: u = x exactly
    # α is not clipped: a negative α scales the branch by a negative number (no dead zone)
    gate = model.blocks[0].gate
    with torch.no_grad():
        gate.k.fill_(-0.5)
    assert float(gate.value().detach()) == -0.5


def test_layerscale_gate_is_a_vector_with_cait_eps_recorded():
    # CaiT's ε counts residual blocks, as CaiT counts layers: d = 20 has 10 blocks (0.1), d = 40 has 20 (1e-5)
    assert create_model("mlp_layerscale", depth=20, width=8).config["k_init"] == 0.1
    model = create_model("mlp_layerscale", depth=40, width=8)
    assert model.config["k_init"] == 1e-5 and model.config["gate_function"] == "identity"
    gate = model.blocks[0].gate
    assert isinstance(gate, VectorGate) and gate.value().shape == (8,)
    assert torch.equal(gate.value(), torch.full((8,), 1e-5))
    # the gate-family study keeps its recorded protocol, ε by d
    from throughway.experiments.gate_family import family_kwargs
    assert family_kwargs("layerscale", 20)["k_init"] == 1e-5 and "k_init" not in family_kwargs("rezero", 20)
    # explicit ε wins over the depth rule
    assert create_model("mlp_layerscale", depth=20, width=8, k_init=0.3).config["k_init"] == 0.3
    # channel c of the branch is scaled by λ_c
    with torch.no_grad():
        gate.k.copy_(torch.arange(8.0))
    h = torch.ones(3, 8)
    assert torch.equal(gate(h), torch.arange(8.0).expand(3, 8))
    with pytest.raises(ValueError, match="accepted values"):
        VectorGate(8, 0.1, "softplus")
    assert set(GATE_FUNCTIONS) >= {"identity", "relu"}


@pytest.mark.parametrize("name, kwargs", [("mlp_rezero", {}), ("mlp_rezero", {"norm": "none"}),
                                          ("mlp_layerscale", {}), ("mlp_layerscale", {"norm": "none"}),
                                          ("mlp_gated_residual", {"norm": "none"}), ("mlp_residual", {"norm": "none"})])
def test_save_load_round_trip(tmp_path, name, kwargs):
    model = create_model(name, depth=4, width=8, **kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # gates away from their initial values too
    model.eval()
    path = save_model(tmp_path / "m.safetensors", model)
    loaded = load_model(path)
    loaded.eval()
    assert loaded.config == model.config
    x = torch.randn(6, 784)
    assert torch.equal(loaded(x), model(x))


@pytest.mark.parametrize("name", ["mlp_rezero", "mlp_layerscale"])
def test_lesion_and_prune_like_the_gated_net(name):
    model = create_model(name, depth=6, width=8, norm="none")
    with torch.no_grad():
        for block in model.blocks:
            block.gate.k.fill_(0.7)
        model.blocks[1].gate.k.zero_()  # a closed block: an exact identity
    model.eval()
    x = torch.randn(4, 784)
    before = model(x)
    # removing a block whose gate is 0 changes nothing
    pruned = prune(model, [1])
    assert len(pruned.blocks) == 2 and pruned.config["depth"] == 4
    assert torch.allclose(pruned(x), before, atol=1e-6)
    # lesioning an open block changes the output, and is undone on exit
    with lesion(model, 0):
        assert not torch.allclose(model(x), before)
    assert torch.equal(model(x), before)
    order = removal_order(model, "random", torch.Generator().manual_seed(0))
    curve = removal_curve(model, order, lambda m: float(m(x).detach().abs().mean()))
    assert len(curve) == 4


def test_greedy_removal_order_of_rezero_sorts_alpha():
    # smallest |α| first (issue 24): a negative α is an open gate, not a closed one
    model = create_model("mlp_rezero", depth=6, width=8)
    with torch.no_grad():
        for block, alpha in zip(model.blocks, (0.3, -0.2, 0.1)):
            block.gate.k.fill_(alpha)
    assert removal_order(model, "greedy") == [2, 1, 0]


@pytest.mark.slow
def test_gate_family_quick_study(gate_family_quick):
    # The session's `reproduce gate-family --quick` (conftest.py; trained once, read here and by
    # tests/test_results_regenerate.py): d = 2, 10, 2 seeds, every family.
    from throughway.experiments import get_experiment

    study = get_experiment("gate-family")
    assert study.QUICK.depths == (2, 10) and study.QUICK.seeds == 2 and study.QUICK.epochs == 2
    out, _ = gate_family_quick
    # shallowest first, whatever order the depths were given in (the runs and the summary's cells)
    backwards = dataclasses.replace(study.QUICK, depths=(10, 2))
    assert [s.config.depth for s in study.specs(backwards)][0] == 2
    summary = study.summarize(backwards, out)
    families = len(study.QUICK.families)
    assert [c["depth"] for c in summary["cells"][:families]] == [2] * families
    for cell in summary["cells"]:
        assert cell["test_error_pct"]["n"] == 2, cell["family"]
        assert cell["val_error_pct"]["n"] == 2  # 10,000-style held-out split by default
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    assert by[("rezero", 2)]["per_seed"][0]["negative_gates"] is not None
    assert by[("gated", 2)]["per_seed"][0]["dead_gates"] is not None
    assert by[("layerscale", 2)]["k_mean"]["n"] == 2  # fit records a LayerScale gate as its mean λ
    run = read_results(out / "runs" / "rezero-nf-d10-s1")
    assert run["config"]["model"] == "mlp_rezero" and run["config"]["model_kwargs"]["norm"] == "none"
    assert run["environment"]["batched"]["models"] == 2
    ls = load_model(out / "runs" / "layerscale-d10-s0" / "model.safetensors")
    assert ls.config["k_init"] == 0.1
    others = {row["b"] for row in summary["comparisons"]}
    assert others == set(study.QUICK.families) - {"gated"}
    assert "pending" not in (out / "table.md").read_text()


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusals
        return int(exc.code or 0)


def test_gate_family_refuses_bad_options(tmp_path, capsys):
    assert _exit_code(["reproduce", "gate-family", "--families", "highway", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "families" in err and "rezero-nf" in err  # names the option and the accepted values
    assert not (tmp_path / "x").exists()
    assert _exit_code(["reproduce", "gate-family", "--depths", "3", "--out", str(tmp_path / "y")]) == 2
    assert "depths" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()
    assert _exit_code(["reproduce", "gate-family", "--dataset", "cifar10", "--out", str(tmp_path / "z")]) == 2
    assert "fashion-mnist" in capsys.readouterr().err  # the accepted values
    assert not (tmp_path / "z").exists()


def test_gate_family_trains_every_run_on_the_dataset_it_is_given():
    from throughway.experiments import gate_family

    config = dataclasses.replace(gate_family.QUICK, dataset="fashion-mnist")
    assert {spec.config.dataset for spec in gate_family.specs(config)} == {"fashion-mnist"}
    assert {spec.config.dataset for spec in gate_family.specs(gate_family.QUICK)} == {"mnist"}


@pytest.mark.slow
def test_reproduce_gate_family_quick_from_the_command_line(gate_family_quick, tmp_path, fake_mnist_root):
    quick, _ = gate_family_quick  # `throughway reproduce gate-family --quick --jobs 2 --quiet` (conftest.py)
    results = json.loads((quick / "results.json").read_text())
    assert results["config"]["quick"] is True and results["config"]["depths"] == [2, 10]
    states = {r["state"] for c in results["cells"] for r in c["runs"]}
    assert states == {"finished"}
    assert len(results["cells"]) == 2 * 7 and all(c["test_error_pct"]["n"] == 2 for c in results["cells"])
    # a finished study is only re-reported when run again (on a copy: the session's folder is read only)
    out = tmp_path / "quick"
    shutil.copytree(quick, out)
    assert main(["reproduce", "gate-family", "--quick", "--out", str(out), "--quiet"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["cells"] == results["cells"]


# ---------------------------------------------------------------------------------------------------------
# Phase 2: the report (gate_family_report) and the analyses at initialisation (gate_family_init)

def _summary_with_errors(gated: list[float], other: list[float], third: list[float] | None = None) -> dict:
    def cell(family, errors):
        return {"family": family, "depth": 10, "per_seed": [{"seed": s, "test_error_pct": e}
                                                            for s, e in enumerate(errors)]}
    cells = [cell("gated", gated), cell("rezero", other)] + ([cell("layerscale", third)] if third else [])
    return {"config": {"depths": [10], "families": [c["family"] for c in cells]}, "cells": cells}


def test_gated_comparisons_need_three_pairs_and_a_holm_corrected_p_below_005():
    from throughway.experiments.gate_family_report import comparisons, comparisons_markdown

    # two pairs, however different: no verdict
    (row,) = comparisons(_summary_with_errors([1.0, 1.1], [3.0, 3.2]))
    assert row["verdict"] == "too few seeds" and row["seeds"] == [0, 1] and row["p_corrected"] is None
    # five pairs, gated lower by about 1 pp each time: significant
    (row,) = comparisons(_summary_with_errors([1.0, 1.1, 1.2, 0.9, 1.05], [2.0, 2.2, 2.1, 2.0, 2.0]))
    assert row["verdict"] == "gated better" and row["test"]["p_value"] < 0.05 and row["test"]["n"] == 5
    # five pairs with differences of both signs: no verdict
    summary = _summary_with_errors([1.0, 2.0, 1.0, 2.0, 1.5], [2.0, 1.0, 2.0, 1.0, 1.5])
    (row,) = comparisons(summary)
    assert row["verdict"] == "no difference detected" and row["test"]["p_value"] > 0.05
    text = comparisons_markdown(summary)
    assert "| 10 | rezero | 5 | +0.000 | [" in text and "no difference detected |" in text
    assert "| verdict (Holm) |" in text and "detectable at 80% power (pp)" in text


def test_a_gated_comparison_significant_only_before_holm_gets_no_verdict():
    from throughway.experiments.gate_family_report import comparisons, comparisons_markdown, findings_markdown

    gated, other = [1.82, 1.94, 1.98, 1.90, 1.90], [1.90, 1.95, 2.00, 1.93, 1.97]
    # both others about 0.04 pp above gated: p ≈ 0.039 each uncorrected, Holm over the 2: 0.079
    summary = _summary_with_errors(gated, other, list(other))
    rows = comparisons(summary)
    assert all(r["test"]["p_value"] < 0.05 <= r["p_corrected"] for r in rows), [r["test"]["p_value"] for r in rows]
    assert {r["verdict"] for r in rows} == {"no difference detected"}
    assert "gated better" not in comparisons_markdown(summary)
    summary["config"]["seeds"] = 5
    for cell in summary["cells"]:
        cell["test_error_pct"] = mean_std([r["test_error_pct"] for r in cell["per_seed"]])
    text = findings_markdown(summary)
    assert "gated better" not in text and "no difference detected after Holm, significant only uncorrected" in text
    assert "Holm's correction over the 2 paired tests of gated against each family: 0 of the 2 significant" in text


def test_gate_record_counts_dead_relu_gates_and_negative_identity_gates():
    from throughway.experiments.gate_family_report import gate_record

    gated = create_model("mlp_gated_residual", depth=6, width=4)
    rezero = create_model("mlp_rezero", depth=6, width=4)
    layerscale = create_model("mlp_layerscale", depth=4, width=4)
    with torch.no_grad():
        for block, k in zip(gated.blocks, (-0.1, 0.5, 0.0)):
            block.gate.k.fill_(k)
        for block, alpha in zip(rezero.blocks, (-0.3, 0.2, 0.4)):
            block.gate.k.fill_(alpha)
        layerscale.blocks[0].gate.k.copy_(torch.tensor([-0.1, 0.1, 0.2, 0.2]))
        layerscale.blocks[1].gate.k.copy_(torch.tensor([0.4, 0.4, -0.4, 0.4]))
    record = gate_record(gated, "relu")
    assert record["dead"] == 2 and record["negative"] is None  # k ≤ 0 closes a relu gate
    assert record["mean"] == pytest.approx(0.4 / 3) and record["count"] == 3
    record = gate_record(rezero, "identity")
    assert record["negative"] == 1 and record["dead"] is None  # a negative α is not a dead gate
    assert record["mean_abs"] == pytest.approx(0.3)
    record = gate_record(layerscale, "identity")
    assert record["vector"] and record["count"] == 8 and record["negative"] == 2
    assert record["per_block"] == pytest.approx([0.15, 0.4]) and record["mean"] == pytest.approx(0.275)  # mean |λ|


def test_removal_order_by_gate_magnitude_for_scalar_and_vector_gates():
    rezero = create_model("mlp_rezero", depth=6, width=4)
    layerscale = create_model("mlp_layerscale", depth=6, width=4)
    with torch.no_grad():
        for block, alpha in zip(rezero.blocks, (0.3, -0.5, 0.1)):
            block.gate.k.fill_(alpha)
        for block, lam in zip(layerscale.blocks, (0.2, 0.05, -0.1)):
            block.gate.k.fill_(lam)
    assert removal_order(rezero, "greedy") == [2, 0, 1]  # |α|: the large negative α goes last
    assert removal_order(layerscale, "greedy") == [1, 2, 0]  # mean |λ|


def test_removal_record_removes_closed_blocks_first_at_no_cost():
    from throughway.experiments.gate_family_report import removal_record

    model = create_model("mlp_rezero", depth=8, width=6, in_features=5, norm="none")
    with torch.no_grad():
        for block, alpha in zip(model.blocks, (0.9, 0.0, 0.8, 0.0)):
            block.gate.k.fill_(alpha)
    model.eval()
    x = torch.randn(64, 5)
    labels = model(x).argmax(dim=1)  # the full net is right on every sample

    def accuracy(m):
        return 100.0 * float((m(x).argmax(dim=1) == labels).double().mean())

    record = removal_record(model, accuracy, orders=2)
    assert record["greedy_order"][:2] == [1, 3] and record["half"] == 2
    assert record["greedy"][:3] == [100.0, 100.0, 100.0]  # the two α = 0 blocks are exact identities
    assert record["half_share_greedy"] == 1.0
    assert len(record["random"]) == 2 and all(len(c) == 5 for c in record["random"])
    # 4 blocks: the random baseline is the exact mean over all 6 pairs of blocks, not a sample of orders
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    exact = sum(accuracy(prune(model, list(pair))) for pair in pairs) / len(pairs) / 100.0
    assert record["half_random"] == "exact" and record["half_subsets"] == 6
    assert record["half_share_random"] == pytest.approx(exact)
    assert record["weights"] == "last epoch"
    sampled = removal_record(model, accuracy, orders=1, max_exact=5)  # more subsets than allowed: the orders' mean
    assert sampled["half_random"] == "orders" and sampled["half_share_random"] == pytest.approx(
        sampled["random"][0][2] / 100.0)


def test_every_net_draws_its_own_random_removal_orders():
    from throughway.experiments.gate_family_report import REMOVAL_SEED, removal_record, removal_seed

    names = [f"gated-d8-s{s}" for s in range(5)]
    seeds = [removal_seed(name) for name in names]
    assert len(set(seeds)) == 5 and removal_seed(names[0]) == removal_seed(names[0], REMOVAL_SEED)  # reproducible
    assert removal_seed(names[0], base=1) != seeds[0]
    model = create_model("mlp_gated_residual", depth=8, width=4, in_features=3)
    model.eval()
    x = torch.randn(16, 3)

    def metric(m):
        return float(m(x).detach().abs().mean())

    orders = [removal_record(model, metric, orders=2, seed=seed, max_exact=0) for seed in seeds[:2]]
    assert orders[0]["random_seed"] == seeds[0]
    # the same net under two nets' seeds: different permutations (every net drew the same three before)
    assert orders[0]["random"] != orders[1]["random"]
    assert orders[0] == removal_record(model, metric, orders=2, seed=seeds[0], max_exact=0)


def test_gate_family_report_on_the_quick_study(gate_family_quick, tmp_path, fake_mnist_root):
    from throughway.experiments import get_experiment
    from throughway.experiments.gate_family_report import comparisons, gate_values_markdown, removal_markdown, removal_seed

    study = get_experiment("gate-family")
    config = study.QUICK
    out = tmp_path / "gf"  # a copy of the session's quick study (conftest.py): the end re-reports into it
    shutil.copytree(gate_family_quick[0], out)
    summary = json.loads((out / "results.json").read_text())
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    # gates at the end come from the model files: LayerScale's |λ| too
    ls = by[("layerscale", 10)]["gates"]
    assert len(ls) == 2 and ls[0]["vector"] and ls[0]["count"] == 5 * config.width
    model = load_model(out / "runs" / "layerscale-d10-s0" / "model.safetensors")
    assert ls[0]["mean"] == pytest.approx(float(sum(b.gate.k.detach().abs().mean() for b in model.blocks) / 5))
    assert by[("residual", 10)]["gates"] == []  # ungated
    # the removal curves of every gated kind (d = 2 has one block: no half to remove, still a curve)
    removal = json.loads((out / "removal.json").read_text())
    gated = ("gated", "rezero", "layerscale", "gated-nf", "rezero-nf")
    assert set(removal) == {f"{f}-d{d}-s{s}" for f in gated for d in (2, 10) for s in (0, 1)}
    record = by[("rezero", 10)]["removal"][0]
    assert record["blocks"] == 5 and len(record["greedy"]) == 6 and len(record["random"]) == study.REMOVAL_ORDERS
    assert record["greedy"][0] == pytest.approx(100.0 - by[("rezero", 10)]["per_seed"][0]["test_error_pct"], abs=1e-6)
    # 2 seeds: every comparison says "too few seeds"
    assert {row["verdict"] for row in comparisons(summary)} == {"too few seeds"}
    assert record["random_seed"] == removal_seed("rezero-d10-s0") and record["half_random"] == "exact"
    # the curves: 2 epochs of train loss per run
    assert len(summary["curves"]["gated-d10-s1"]["train_loss"]) == 2
    table = (out / "table.md").read_text()
    for heading in ("Test error (%)", "Paired t-test", "Gates at the end", "Share of test accuracy kept"):
        assert heading in table
    assert (out / "train_loss.png").stat().st_size > 10_000 and (out / "removal.png").stat().st_size > 10_000
    # a depth with no finished run is rendered pending, in each table
    wider = study.summarize(dataclasses.replace(config, depths=(2, 10, 20)), out)
    assert "| 20 | pending | pending" in gate_values_markdown(wider)
    assert "| 20 | pending | pending | pending |" in removal_markdown(wider)
    assert "| 20 | pending |" in study.table_markdown(wider)
    comparisons = study.comparisons_markdown(wider)
    assert "| 20 |" not in comparisons and "d = 20: every family." in comparisons  # no test row without pairs
    # re-reporting from the run folders alone (no training) rebuilds the removal file and the tables
    (out / "removal.json").unlink()
    (out / "table.md").unlink()
    again = study.report_finished(out)
    assert json.loads((out / "removal.json").read_text()) == removal
    assert again["cells"] == summary["cells"] and (out / "table.md").read_text() == table


def test_gate_family_init_quick(tmp_path, fake_mnist_root):
    from throughway.experiments import get_experiment

    init = get_experiment("gate-family-init")
    config = init.Config(depths=(2, 4), seeds=2, width=6, hessian_width=3, samples=24)
    summary = init.run(config, tmp_path / "init", progress=False)
    by = {(p["family"], p["depth"]): p for p in summary["points"]}
    # distance to identity: k = 1 per gated block, α = 0, λ = 0.1 per channel (CaiT, d ≤ 18), branch weights
    assert by[("gated", 4)]["distance_to_identity"]["mean"] == pytest.approx(2.0)
    assert by[("rezero", 4)]["distance_to_identity"]["mean"] == 0.0
    assert by[("layerscale", 4)]["distance_to_identity"]["mean"] == pytest.approx(2 * 6 * 0.1 ** 2)
    assert by[("residual", 4)]["distance_to_identity"]["mean"] > 2.0
    cell = summary["cells"]["rezero-nf-d4-s1"]["hessian"]
    # α = 0: the branches' weights have no second derivative of their own, so many eigenvalues are 0
    assert cell["zero_fraction"] > 0.1 and cell["condition"] is None and cell["nonzero_condition"] > 1
    for point in summary["points"]:
        assert point["seeds"] == 2 and point["max_abs"]["n"] == 2
    table = (tmp_path / "init" / "table.md").read_text()
    assert "Condition number max|λ| / P10(|λ|)" in table and "Not the paper's measure" in table
    assert (tmp_path / "init" / "init_by_depth.png").stat().st_size > 10_000
    # resumable: a second run computes nothing new and keeps every cell
    again = init.run(config, tmp_path / "init", resume=True, progress=False)
    assert again["cells"] == summary["cells"]


def test_reproduce_gate_family_init_from_the_command_line(tmp_path, fake_mnist_root, capsys):
    out = tmp_path / "init"
    assert _exit_code(["reproduce", "gate-family-init", "--families", "highway", "--out", str(out)]) == 2
    assert "rezero-nf" in capsys.readouterr().err and not out.exists()
    assert main(["reproduce", "gate-family-init", "--quick", "--families", "gated", "rezero", "--out", str(out),
                 "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["depths"] == [2, 6] and len(results["cells"]) == 2 * 2 * 2


def test_removal_orders_are_compared_by_a_paired_test_over_seeds():
    from throughway.experiments.gate_family_report import removal_comparisons, removal_markdown

    def record(seed, greedy, random):
        return {"seed": seed, "half_share_greedy": greedy, "half_share_random": random}

    summary = {"config": {"depths": [2, 10, 20], "families": ["residual", "gated", "rezero"]}, "cells": [
        {"family": "gated", "depth": 10, "removal": [record(0, 0.99, 0.95), record(1, 0.98, 0.95), record(2, 0.99, 0.94)]},
        {"family": "rezero", "depth": 10, "removal": [record(0, 0.95, 0.96), record(1, 0.97, 0.96), record(2, 0.96, 0.96)]},
        {"family": "gated", "depth": 20, "removal": [record(0, 0.99, 0.95), record(1, 0.98, 0.95)]},
        {"family": "rezero", "depth": 20, "removal": []},
        *({"family": f, "depth": 2, "removal": [record(0, 1.0, 0.5)]} for f in ("gated", "rezero"))]}
    rows = removal_comparisons(summary)
    # d = 2 has one block (no half to remove), the residual net no gate, rezero at d = 20 no finished seed
    assert [(r["depth"], r["family"]) for r in rows] == [(10, "gated"), (10, "rezero"), (20, "gated")]
    gated, rezero, few = rows
    assert gated["kept_difference"] == pytest.approx(100 * (0.99 + 0.98 + 0.99 - 0.95 - 0.95 - 0.94) / 3)
    assert gated["verdict"] == "gate order better" and gated["test"]["p_value"] < 0.05
    assert gated["p_corrected"] == pytest.approx(2 * gated["test"]["p_value"])  # Holm over the 2 judged tests
    assert rezero["verdict"] == "no difference detected" and rezero["kept_difference"] == pytest.approx(0.0, abs=1e-9)
    assert few["verdict"] == "too few seeds" and few["seeds"] == [0, 1] and few["p_corrected"] is None
    text = removal_markdown(summary)
    test = gated["test"]
    assert (f"| 10 | gated | 3 | +{gated['kept_difference']:.2f} | [{-100 * test['ci_high']:+.2f}, "
            f"{-100 * test['ci_low']:+.2f}] | {test['p_value']:.2g} | {gated['p_corrected']:.2g} | "
            f"{100 * test['detectable']:.2f} | gate order better |") in text
    assert "| 20 | gated | 2 | +3.50 | — | — | — | — | too few seeds |" in text  # no p is read below 3 seeds
    # records without a seed of their own were drawn with the same permutations for every net: said so
    assert "the same permutations for every net of a depth" in text


def test_a_layerscale_run_that_left_its_eps_to_the_default_matches_the_spelled_out_spec():
    # The study spells out ε by d; its committed runs recorded only the width and were built with that ε.
    from throughway.train import RunConfig
    from throughway.train.config import config_differences

    spec = RunConfig(model="mlp_layerscale", depth=20, model_kwargs={"width": 50, "k_init": 1e-5})
    recorded = {"config": {"model": "mlp_layerscale", "depth": 20, "model_kwargs": {"width": 50}},
                "model": {"config": {"name": "mlp_layerscale", "depth": 20, "width": 50, "k_init": 1e-5}}}
    assert config_differences(recorded, spec, "x") == {}
    recorded["model"]["config"]["k_init"] = 0.1  # built with another ε: another run
    assert set(config_differences(recorded, spec, "x")) == {"model_kwargs"}


def _two_datasets() -> tuple[dict, dict]:
    """(reference, second): gate-family summaries of two datasets; the second ran d = 50 only, and not rezero:
    its gated nets lose to residual, and its gate order keeps no more than random removal."""
    def cell(family, depth, errors, removal=None):
        return {"family": family, "depth": depth, "removal": removal or [],
                "per_seed": [{"seed": s, "test_error_pct": e} for s, e in enumerate(errors)]}

    def record(seed, greedy, random):
        return {"seed": seed, "half_share_greedy": greedy, "half_share_random": random}

    kept = [record(0, 0.99, 0.95), record(1, 0.98, 0.95), record(2, 0.99, 0.94)]
    reference = {"config": {"depths": [10, 50], "families": ["gated", "residual", "rezero"]}, "cells": [
        cell("gated", 10, [1.0, 1.1, 1.2]), cell("residual", 10, [1.0, 1.1, 1.2]), cell("rezero", 10, [1.0, 1.1, 1.2]),
        cell("gated", 50, [1.0, 1.1, 1.2], kept), cell("residual", 50, [2.0, 2.2, 2.1]),
        cell("rezero", 50, [1.0, 1.2, 1.1], kept)]}
    second = {"config": {"depths": [50], "families": ["gated", "residual"]}, "cells": [
        cell("gated", 50, [3.0, 3.3, 3.1], [record(0, 0.95, 0.95), record(1, 0.96, 0.95), record(2, 0.95, 0.96)]),
        cell("residual", 50, [2.0, 2.2, 2.1])]}
    return reference, second


def test_the_verdicts_are_set_dataset_by_dataset_each_corrected_over_its_own_study():
    from throughway.experiments.gate_family_report import datasets_markdown

    reference, second = _two_datasets()
    text = datasets_markdown({"MNIST": reference, "Fashion-MNIST": second})
    rows = {line.split(" | ")[0].lstrip("| ") + " " + line.split(" | ")[1]: line for line in text.splitlines()
            if line.startswith("| error") or line.startswith("| removal")}
    assert set(rows) == {"error, gated − residual 50", "removal, gated: gate order − random (points kept) 50"}
    assert rows["error, gated − residual 50"].startswith("| error, gated − residual | 50 | gated better (")
    assert "| residual better (" in rows["error, gated − residual 50"] and rows["error, gated − residual 50"].endswith(
        "| differs |")
    removal = rows["removal, gated: gate order − random (points kept) 50"].split(" | ")
    assert removal[2].startswith("gate order better (95% CI [+")  # points kept: the lost share's interval flipped
    assert removal[3].startswith("no difference detected (95% CI [") and removal[4] == "differs |"
    # each dataset corrected over its own tests: the reference's 2 judged error tests (its d = 10 pairs are equal,
    # no spread, no p), the second's 1
    assert "MNIST 2 error and 2 removal tests, Fashion-MNIST 1 error and 1 removal tests" in text
    assert ("On Fashion-MNIST, 0 of 2 tests judged on both datasets give MNIST's verdict; 2 differ: error, gated − "
            "residual at d = 50: gated better on MNIST, residual better on Fashion-MNIST (Holm p = ") in text
    with pytest.raises(ValueError, match="two summaries"):
        datasets_markdown({"MNIST": reference})


def test_the_readme_names_the_verdicts_the_second_dataset_adds_and_counts_those_it_loses(monkeypatch, tmp_path):
    from tools.readme.sections import overview

    reference, second = _two_datasets()
    monkeypatch.setattr(overview, "second_dataset_summary", lambda root: second)
    words = overview.gate_family_second_dataset(tmp_path, reference)
    # on the reference gated has the lower error and its gate order keeps more than random; on the second dataset
    # residual has the lower error (a verdict it adds) and the removal test detects nothing (one it loses)
    assert words.startswith("Fashion-MNIST, d = 50: 0 of 2 judged tests give MNIST's verdict; there only: residual "
                            "better than gated in test error at d = 50 (Holm p = ")
    assert words.endswith("); 1 of MNIST's significant verdicts not detected there")
    monkeypatch.setattr(overview, "second_dataset_summary", lambda root: None)
    assert overview.gate_family_second_dataset(tmp_path, reference) == "Fashion-MNIST (d = 50, 100): pending"


@pytest.mark.parametrize("config, title", [({"dataset": "fashion-mnist"}, "Fashion-MNIST training loss"),
                                           ({}, "MNIST training loss")])  # a study from before --dataset: MNIST
def test_the_training_loss_figure_names_the_studys_data_set(monkeypatch, tmp_path, config, title):
    from throughway.report import gate_family_plots

    drawn = {}
    monkeypatch.setattr(gate_family_plots, "save_figure", lambda fig, path: drawn.setdefault("title", fig._suptitle))
    summary = {"config": {"depths": [10], "families": ["gated"], "seeds": 1, "epochs": 2, **config},
               "curves": {"gated-d10-s0": {"train_loss": [1.0, 0.5]}}}
    gate_family_plots.plot_training_curves(summary, tmp_path / "train_loss.png")
    assert drawn["title"].get_text().startswith(title)
