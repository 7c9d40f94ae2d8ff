"""Lesioning (exact restoration) and physical pruning (analysis.removal)."""

from __future__ import annotations

import pytest
import torch

from throughway.analysis.removal import check_prunable, lesion, prune, removal_curve, removal_order
from throughway.models import create_model
from throughway.train import load_model, save_model


def block_scalar_gates(model):
    """The scalar gate of every branch, from the one lister."""
    from throughway.layers import find_branches
    return [ref.gate for ref in find_branches(model).values()]


def _gated(ks: list[float]) -> torch.nn.Module:
    model = create_model("mlp_gated_residual", depth=2 * len(ks), width=6, in_features=5, num_classes=3)
    with torch.no_grad():
        for gate, k in zip(block_scalar_gates(model), ks):
            gate.k.fill_(k)
    # A few training-mode passes so BatchNorm running statistics are not the defaults.
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, 5))
    return model.eval()


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", ["mlp_gated_residual", "mlp_highway", "mlp_residual", "mlp_augmented"])
def test_lesion_restores_the_model_bit_identically(name):
    model = create_model(name, depth=4, width=6, in_features=5, num_classes=3).eval()
    x = torch.randn(9, 5)
    before, state = model(x), _state(model)
    with lesion(model, 1):
        during = model(x)
    after = model(x)
    assert torch.equal(before, after)
    assert not torch.equal(before, during)  # the lesion did change something
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert list(model.state_dict()) == list(state)


def test_lesion_restores_after_an_exception():
    model = create_model("mlp_highway", depth=3, width=4, in_features=5, num_classes=3).eval()
    x = torch.randn(4, 5)
    before = model(x)
    with pytest.raises(RuntimeError, match="boom"):
        with lesion(model, 0):
            raise RuntimeError("boom")
    assert torch.equal(model(x), before)


def test_lesioned_highway_layer_copies_its_input():
    model = create_model("mlp_highway", depth=3, width=4, in_features=5, num_classes=3).eval()
    h = torch.randn(7, 4)
    with lesion(model, 2):
        assert torch.equal(model.blocks[2](h), h)


def test_lesioned_gated_block_equals_k_zero():
    model = _gated([0.7, 1.3, 0.4])
    x = torch.randn(5, 5)
    with lesion(model, 1):
        lesioned = model(x)
    closed = _gated([0.7, 1.3, 0.4])
    closed.load_state_dict(model.state_dict())
    with torch.no_grad():
        block_scalar_gates(closed)[1].k.fill_(0.0)
    assert torch.equal(lesioned, closed(x))


def test_lesion_errors():
    plain = create_model("mlp_plain", depth=2, width=4, in_features=5, num_classes=3)
    with pytest.raises(ValueError, match="PlainBlock"):
        with lesion(plain, 0):
            pass
    model = _gated([1.0, 1.0])
    with pytest.raises(IndexError, match="0 .. 1"):
        with lesion(model, 2):
            pass
    with lesion(model, 0):
        with pytest.raises(ValueError, match="already lesioned"):
            with lesion(model, 0):
                pass


def test_prune_removes_identity_blocks_exactly(tmp_path):
    model = _gated([0.8, -0.3, 1.1, 0.0, 0.5])
    x = torch.randn(8, 5)
    pruned = prune(model, [1, 3])  # k ≤ 0: exact identities
    assert len(pruned.blocks) == 3 and pruned.config["depth"] == 6
    # Same family and registry name: only the depth of the config changes.
    assert {**pruned.config, "depth": 10} == model.config and type(pruned) is type(model)
    assert torch.equal(pruned(x), model(x))
    assert len(model.blocks) == 5  # the original is untouched
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())
    path = save_model(tmp_path / "pruned.safetensors", pruned)
    loaded = load_model(path)
    assert len(loaded.blocks) == 3 and torch.equal(loaded(x), model(x))


def test_prune_of_an_open_block_changes_the_output_and_keeps_order():
    model = _gated([0.8, 0.9, 1.1])
    pruned = prune(model, [0])
    assert [float(g.k.detach()) for g in block_scalar_gates(pruned)] == pytest.approx([0.9, 1.1])
    x = torch.randn(4, 5)
    assert not torch.equal(pruned(x), model(x))


@pytest.mark.parametrize("name,per_block", [("mlp_residual", 2), ("mlp_highway", 1), ("mlp_augmented", 1)])
def test_prune_other_families(name, per_block):
    model = create_model(name, depth=4 * per_block, width=5, in_features=5, num_classes=3)
    pruned = prune(model, [0, 2, 3])
    assert len(pruned.blocks) == 1 and pruned.config["depth"] == per_block and pruned.training
    everything = prune(model, [0, 1, 2, 3])
    assert len(everything.blocks) == 0 and everything(torch.randn(2, 5)).shape == (2, 3)


def test_prune_rejects_bad_indices():
    model = _gated([1.0, 1.0])
    with pytest.raises(IndexError, match="0 .. 1"):
        prune(model, [2])
    with pytest.raises(ValueError, match="twice"):
        prune(model, [0, 0])


def test_greedy_order_follows_k():
    model = _gated([0.4, -0.2, 1.5, 0.4, 0.1])
    assert removal_order(model, "greedy") == [1, 4, 0, 3, 2]  # ascending k, ties by index
    order = removal_order(model, "random", torch.Generator().manual_seed(3))
    assert sorted(order) == list(range(5))
    with pytest.raises(ValueError, match="block 'blocks.0' .*has no gate"):  # greedy orders by |g|
        removal_order(create_model("mlp_residual", depth=4, width=4, in_features=5, num_classes=3), "greedy")
    with pytest.raises(ValueError, match="accepted values"):
        removal_order(model, "smallest")


def test_removal_curve_counts_blocks():
    model = _gated([0.0, 1.0, -1.0])
    sizes = removal_curve(model, [2, 0, 1], lambda m: float(len(m.blocks)))
    assert sizes == [3.0, 2.0, 1.0, 0.0]
    x = torch.randn(6, 5)
    reference = model(x)
    same = removal_curve(model, [2, 0, 1], lambda m: float(torch.equal(m(x), reference)), max_removed=2)
    assert same == [1.0, 1.0, 1.0]  # removing the two k ≤ 0 blocks changes nothing


def test_lesion_of_a_convolutional_gated_block_restores_and_closes_the_gate():
    model = create_model("preact_resnet", depth=8, width=4, gated=True, num_classes=3).eval()
    x = torch.randn(2, 3, 8, 8)
    before = model(x)
    block = model.blocks[0]  # identity shortcut: g(k) = 0 makes it copy its input
    with lesion(model, 0):
        h = torch.randn(2, 4, 8, 8)
        assert torch.equal(block(h), h)
        assert not torch.equal(model(x), before)
    assert torch.equal(model(x), before)


def test_prune_plain_layers():
    model = create_model("mlp_plain", depth=3, width=5, in_features=5, num_classes=3).eval()
    pruned = prune(model, [1])
    assert len(pruned.blocks) == 2 and pruned.config["name"] == "mlp_plain"
    # The kept layers are the original's first and third, in order.
    assert torch.equal(pruned.blocks[1].branch[0].weight, model.blocks[2].branch[0].weight)


def test_prune_removes_closed_augmented_layers_exactly():
    model = create_model("mlp_augmented", depth=4, width=5, in_features=5, num_classes=3).eval()
    with torch.no_grad():
        block_scalar_gates(model)[2].k.fill_(-0.5)  # g(k) = 0: u = 0·f(x) + 1·x = x
    x = torch.randn(6, 5)
    assert torch.equal(prune(model, [2])(x), model(x))


def test_prune_of_a_convolutional_net_removes_identity_blocks_and_names_a_projection():
    # preact_resnet depth 8: blocks.1 and blocks.2 open stages 2 and 3 with a projection shortcut.
    model = create_model("preact_resnet", depth=8, width=4, gated=True, num_classes=3).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        model.blocks[0].gate.k.fill_(-1.0)  # a closed ReLU gate: blocks.0 is an exact identity
    pruned = prune(model, ["blocks.0"])
    assert len(pruned.blocks) == 2 and torch.equal(pruned(x), model(x))
    assert not hasattr(pruned, "config")  # the registry config describes the unpruned net
    with pytest.raises(ValueError, match="block 'blocks.1' .*no identity shortcut.*example_input"):
        prune(model, [1])
    with pytest.raises(ValueError, match=r"block 'blocks.1' \(PreActBlock\) maps \(2, 4, 8, 8\) to \(2, 8, 4, 4\)"):
        prune(model, [1], example_input=x)
    with pytest.raises(ValueError, match="has no blocks"):
        prune(torch.nn.Sequential(), [0])


def test_analyze_prune_still_needs_a_model_rebuilt_by_config():
    # `analyze prune` removes blocks in every order, so it keeps to PRUNABLE_MODELS.
    model = create_model("preact_resnet", depth=8, width=4, gated=True, num_classes=3)
    with pytest.raises(ValueError, match="model 'preact_resnet' cannot be pruned in every order.*mlp_gated_residual"):
        check_prunable(model)
    assert check_prunable(_gated([1.0])) == "mlp_gated_residual"


# -- prune is part of the analysis package and names a model it cannot prune ------------------------------

def test_prune_names_a_meta_device_model():
    from throughway.analysis.removal import prune

    with torch.device("meta"):
        model = create_model("mlp_gated_residual", depth=4, width=8)
    with pytest.raises(ValueError, match=r"\('mlp_gated_residual'\) is on the meta device .*prune needs a model with its weights"):
        prune(model, [0])


def test_prune_is_importable_from_the_analysis_package() -> None:
    from throughway.analysis import lesion, prune

    model = create_model("mlp_gated_residual", depth=6, width=8)
    smaller = prune(model, [0])
    assert len(smaller.blocks) == len(model.blocks) - 1
    with lesion(model, 1):
        pass


# -- one analysis call walks the block tree once ----------------------------------------------------------

@pytest.fixture
def tree_walks(monkeypatch):
    """How many times the module tree is walked for blocks: calls of `layers.blocks.iter_blocks`, wherever
    a module of the package holds it."""
    import sys

    from throughway.layers import blocks as layer_blocks

    original, walks = layer_blocks.iter_blocks, []

    def counted(model):
        walks.append(model)
        return original(model)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("throughway") and getattr(module, "iter_blocks", None) is original:
            monkeypatch.setattr(module, "iter_blocks", counted)
    return walks


def test_one_removal_call_walks_the_block_tree_once(tree_walks):
    # Each analysis call finds the blocks once and asks every question of what it found (it walked them 5
    # times for one greedy order, and 21 times for a curve of 10 removals).
    model = _gated([0.5 * i for i in range(10)])
    tree_walks.clear()  # building it set the gates through find_branches
    order = removal_order(model, "greedy")
    assert len(tree_walks) == 1
    removal_order(model, "random", torch.Generator().manual_seed(0))
    assert len(tree_walks) == 2
    curve = removal_curve(model, order, lambda m: float(len(m.blocks)))
    assert curve == [10.0 - r for r in range(11)] and len(tree_walks) == 3
    # A user's own module (no registry config): the blocks are taken out of a copy, still after one walk.
    own = torch.nn.Sequential(*list(model.blocks))
    removal_curve(own, [0, 1, 2], lambda m: float(len(m)))
    assert len(tree_walks) == 4
    # The next call walks again: a model changed in between is seen as it is.
    smaller = prune(model, [0, 1])
    assert removal_order(smaller, "greedy") == list(range(8)) and len(tree_walks) == 6
