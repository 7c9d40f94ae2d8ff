"""Issue 24: the ReZero, LayerScale and normalisation-free blocks, and `reproduce gate-family`."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from throughway.analysis.removal import lesion, prune, removal_curve, removal_order
from throughway.cli import main
from throughway.layers import GATE_FUNCTIONS, ScalarGate, VectorGate, cait_layerscale_init
from throughway.models import create_model
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
    model = create_model("mlp_layerscale", depth=20, width=8)
    assert model.config["k_init"] == 1e-5 and model.config["gate_function"] == "identity"
    gate = model.blocks[0].gate
    assert isinstance(gate, VectorGate) and gate.value().shape == (8,)
    assert torch.equal(gate.value(), torch.full((8,), 1e-5))
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


def test_gate_family_quick_study(tmp_path, fake_mnist_root):
    from throughway.experiments import get_experiment

    study = get_experiment("gate-family")
    assert study.QUICK.depths == (2, 10) and study.QUICK.seeds == 2 and study.QUICK.epochs == 2
    config = dataclasses.replace(study.QUICK, depths=(4, 2), epochs=1, limit=300)
    # shallowest first, whatever order the depths were given in
    assert [s.config.depth for s in study.specs(config)][0] == 2
    summary = study.run(config, tmp_path / "gf", progress=False)
    assert [c["depth"] for c in summary["cells"][:len(config.families)]] == [2] * len(config.families)
    for cell in summary["cells"]:
        assert cell["test_error_pct"]["n"] == 2, cell["family"]
        assert cell["val_error_pct"]["n"] == 2  # 10,000-style held-out split by default
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    assert by[("rezero", 2)]["per_seed"][0]["negative_gates"] is not None
    assert by[("gated", 2)]["per_seed"][0]["dead_gates"] is not None
    assert by[("layerscale", 2)]["k_mean"]["n"] == 0  # vector gates are not scalar k's
    run = read_results(tmp_path / "gf" / "runs" / "rezero-nf-d4-s1")
    assert run["config"]["model"] == "mlp_rezero" and run["config"]["model_kwargs"]["norm"] == "none"
    assert run["environment"]["batched"]["models"] == 2
    ls = load_model(tmp_path / "gf" / "runs" / "layerscale-d4-s0" / "model.safetensors")
    assert ls.config["k_init"] == 0.1
    others = {row["b"] for row in summary["comparisons"]}
    assert others == set(config.families) - {"gated"}
    assert "pending" not in (tmp_path / "gf" / "table.md").read_text()


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


def test_reproduce_gate_family_quick_from_the_command_line(tmp_path, fake_mnist_root):
    out = tmp_path / "quick"
    assert main(["reproduce", "gate-family", "--quick", "--out", str(out), "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["quick"] is True and results["config"]["depths"] == [2, 10]
    states = {r["state"] for c in results["cells"] for r in c["runs"]}
    assert states == {"finished"}
    assert len(results["cells"]) == 2 * 7 and all(c["test_error_pct"]["n"] == 2 for c in results["cells"])
    # a finished study is only re-reported when run again
    assert main(["reproduce", "gate-family", "--quick", "--out", str(out), "--quiet"]) == 0
