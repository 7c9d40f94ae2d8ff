"""SDI / TSDI (gated-residual-v1 section 2 and appendix): analytic values, Monte Carlo, the CLI table."""

from __future__ import annotations

import pytest
import torch

from throughway.analysis.sdi import InitMoments, monte_carlo_sdi, named_init, paper_tsdi, sdi, sigmoid
from throughway.cli import main
from throughway.experiments.sdi_table import Config, compute, linear_form
from throughway.models import create_model


@pytest.mark.parametrize("n", [5, 50])
def test_classical_he_matches_eqs_4_to_6(n):
    result = sdi("classical", n, InitMoments(0.0, 2 / n, 0.0, 2 / n))
    assert result.m_diagonal() == pytest.approx(2 / n + 1)
    assert result.m_off_diagonal() == pytest.approx(2 / n)
    assert result.b_value() == pytest.approx(2 / n)
    assert result.tsdi == pytest.approx(3 * n + 2) == pytest.approx(paper_tsdi("classical", n))


def test_eq_15_uses_mu_minus_one_not_mu_squared_minus_one():
    result = sdi("classical", 3, InitMoments(0.5, 0.1, 0.0, 0.0))
    assert result.m_diagonal() == pytest.approx(0.1 + (0.5 - 1) ** 2)  # the paper's typo would give 0.1 + 0.5625
    assert result.m_off_diagonal() == pytest.approx(0.1 + 0.25)


@pytest.mark.parametrize("c, g, a", [(-4.0, 0.018, 2.0), (-4.5, 0.011, 2.25), (-5.0, 0.007, 3.0)])
def test_table_1_under_both_conventions(c, g, a):
    assert round(sigmoid(c), 3) == g
    assert linear_form("highway", "paper", -4.0, c) == pytest.approx((a, 2.0))   # the paper's (σ_b² = 2/n)
    assert linear_form("highway", "stated", -4.0, c) == pytest.approx((a, 0.0))  # σ_b² = 0 as section 2.2 states
    assert sdi("highway", 10, "paper_he", target=c).tsdi == pytest.approx(paper_tsdi("highway", 10, c))


def test_residual_and_gated():
    assert sdi("residual", 7, "paper_he").tsdi == pytest.approx(2 * 7 + 2)
    assert sdi("residual", 7, "he_normal").tsdi == pytest.approx(2 * 7)  # zero biases
    assert sdi("gated", 7, k_init=1.0).tsdi == pytest.approx(1.0)
    assert sdi("gated", 7, k_init=-0.5, k_var=0.2).tsdi == pytest.approx(0.45)


def test_named_inits_match_sampled_variances():
    torch.manual_seed(0)
    weights = torch.cat([torch.nn.Linear(40, 40).weight.detach().reshape(-1) for _ in range(20)])
    assert float(weights.var()) == pytest.approx(named_init("torch_default", 40).weight_var, rel=0.05)
    assert named_init("glorot_uniform", 40, 60).weight_var == pytest.approx(2 / 100)
    assert named_init("he_normal", 40).bias_var == 0.0
    with pytest.raises(ValueError, match="init='xavier'"):
        named_init("xavier", 4)
    with pytest.raises(ValueError, match="layer='dense'"):
        sdi("dense", 4)


@pytest.mark.parametrize("layer", ["classical", "highway", "residual", "gated"])
@pytest.mark.parametrize("scheme", ["he_normal", "glorot_uniform", "torch_default"])
def test_monte_carlo_of_real_initialisers_agrees_with_analytic(layer, scheme):
    analytic = sdi(layer, 12, scheme, gate_bias=-3.0, target=-4.0)
    mc = monte_carlo_sdi(layer, 12, scheme, samples=300, gate_bias=-3.0, target=-4.0, seed=1)
    if mc["tsdi_stderr"] == 0:
        assert mc["tsdi"] == pytest.approx(analytic.tsdi)
    else:
        assert abs(mc["tsdi"] - analytic.tsdi) < 4.5 * mc["tsdi_stderr"]
    # element-wise too: the mean M over the draws is close to the analytic M everywhere
    assert float((mc["M"] - analytic.M).abs().max()) < 0.5 * float(analytic.M.max()) + 1e-12


def test_conv_layer_identity_kernel():
    n, k = 4, 3
    result = sdi("classical", n, "he_normal", kernel_size=k)
    assert result.M.shape == (n, n, k, k)
    var = 2 / (n * k * k)
    assert result.tsdi == pytest.approx(n * n * k * k * var + n)
    mc = monte_carlo_sdi("classical", n, "he_normal", kernel_size=k, samples=300)
    assert abs(mc["tsdi"] - result.tsdi) < 4.5 * mc["tsdi_stderr"]
    with pytest.raises(ValueError, match="kernel_size=2"):
        sdi("classical", n, "he_normal", kernel_size=2)


def test_sdi_table_reproduces_paper_values_under_its_convention():
    summary = compute(Config(mc_width=8, mc_samples=50))
    for row in summary["table1"]:
        assert row["tsdi_ours_paper_convention"] == pytest.approx(row["tsdi_paper"])
    for row in summary["equations"]:
        assert row["tsdi_ours_paper_convention"] == pytest.approx(row["tsdi_paper"])


def test_cli_sdi_prints_the_table(capsys):
    assert main(["sdi", "--width", "10", "--init", "paper_he", "--layer", "classical", "highway", "--target", "-5"]) == 0
    out = capsys.readouterr().out
    assert "| classical | paper_he | 10 |" in out and "| 32 |" in out  # 3n + 2
    assert "| 32 |" in out.split("highway |")[1]  # (2 + 1)·10 + 2
    assert main(["sdi", "--init", "nope"]) == 2


def _silence_nearest(block):
    """Move a residual block to the configuration nearest_identity_distance measures; return the squared move."""
    linear, norm = block.branch[-1][0], block.branch[-1][1]
    before = torch.cat([p.detach().reshape(-1).clone() for p in block.parameters()])
    with torch.no_grad():
        rows = linear.weight.pow(2).sum(dim=1)
        use_gamma = norm.weight.pow(2) < rows
        norm.weight[use_gamma] = 0.0
        linear.weight[~use_gamma] = 0.0
        norm.bias.clamp_(max=0.0)
    after = torch.cat([p.detach().reshape(-1) for p in block.parameters()])
    return float((after - before).double().pow(2).sum())


def test_nearest_identity_distance_is_reached_by_a_real_identity_configuration():
    from throughway.analysis.distance import block_identity_distance, nearest_identity_distance

    torch.manual_seed(0)
    block = create_model("mlp_residual", depth=2, width=6).blocks[0].train()
    with torch.no_grad():  # make both routes (γ_j and W_j) and the β⁺ term matter
        block.branch[-1][1].weight[:3] = 0.1
        block.branch[-1][1].bias[0] = 0.7
        block.branch[-1][1].bias[1] = -0.3
    nearest = nearest_identity_distance(block)
    kind, paper = block_identity_distance(block)
    assert kind == "residual" and nearest < paper
    moved = _silence_nearest(block)
    assert moved == pytest.approx(nearest, rel=1e-6)
    x = torch.randn(16, 6)
    torch.testing.assert_close(block(x), x)  # the configuration is an identity map
    assert nearest_identity_distance(block) == pytest.approx(0.0, abs=1e-12)

    gated = create_model("mlp_gated_residual", depth=2, width=6).blocks[0]
    assert nearest_identity_distance(gated) == pytest.approx(1.0)  # k = 1: closing the gate is nearest
    with torch.no_grad():
        gated.gate.k.fill_(-0.5)
    assert nearest_identity_distance(gated) == 0.0
    assert nearest_identity_distance(create_model("mlp_plain", depth=2, width=6).blocks[0]) is None


def test_identity_distance_callback_records_both_distances():
    from throughway.analysis.distance import IdentityDistance, nearest_identity_distance

    torch.manual_seed(1)
    for arch, has_nearest in (("mlp_residual", True), ("mlp_plain", False)):
        model = create_model(arch, depth=4, width=5)
        callback = IdentityDistance()
        callback._record(model, 0)
        record = callback.records[0]
        assert record["travelled_sq"] == 0.0 and len(record["block_identity_sq"]) == len(model.blocks)
        if has_nearest:
            assert record["nearest_identity_sq"] == pytest.approx(sum(nearest_identity_distance(b) for b in model.blocks))
        else:
            assert record["nearest_identity_sq"] is None


def test_sdi_table_and_identity_distance_reproductions_write_their_reports(fake_mnist_root, tmp_path):
    from throughway.experiments import identity_distance, sdi_table

    sdi_table.run(Config(mc_width=6, mc_samples=20), tmp_path / "sdi", progress=False)
    table = (tmp_path / "sdi" / "table.md").read_text()
    assert "σ² + (μ − 1)²" in table and "2.25n + 2" in table and (tmp_path / "sdi" / "tsdi_vs_width.png").is_file()
    summary = identity_distance.run(identity_distance.Config(depth=2, width=8, epochs=1, limit=100,
                                                             data_dir=str(fake_mnist_root)),
                                    tmp_path / "distance", progress=False)
    relation = {run["arch"]: run["relation"] for run in summary["runs"]}
    assert relation["gated"]["identity_sq_at_init"] == pytest.approx(1.0)  # one block, k = 1
    assert relation["residual"]["nearest_identity_sq_at_init"] < relation["residual"]["identity_sq_at_init"]
    assert relation["plain"]["nearest_identity_sq_at_init"] is None
    assert all(r["travelled_sq_at_end"] > 0 for r in relation.values())
    assert "Measured:" in (tmp_path / "distance" / "table.md").read_text()


# -- non-finite numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("option, value", [("--gate-bias", "nan"), ("--target", "inf"), ("--k-init", "nan")])
def test_sdi_refuses_non_finite_numbers(capsys, option, value):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # refused by the option's own type, before anything is computed
        main(["sdi", option, value])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2
    assert f"argument {option}: {value}: must be a finite number" in err
    assert out == ""  # no table of nan


@pytest.mark.parametrize("argument", ["gate_bias", "target", "k_init"])
def test_the_sdi_function_refuses_non_finite_numbers(argument):
    from throughway.analysis.sdi import sdi

    layer = "gated" if argument == "k_init" else "highway"
    with pytest.raises(ValueError, match=rf"{argument}=nan \(--{argument.replace('_', '-')}\): accepted: a finite number"):
        sdi(layer, 8, **{argument: float("nan")})
