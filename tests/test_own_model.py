"""A researcher's own nn.Module in every gate analysis, in lesion / prune / removal curves and in
save / load (issue 22 items 2 and 6, issue 24's analysis item): the README's MyNet keeps its gated
blocks in an nn.Sequential, not in a `blocks` ModuleList, and was refused by all of these."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from throughway.analysis import (find_blocks, gate_statistics, k_statistics, lesion, model_family, prune,
                                 removal_curve, removal_order)
from throughway.layers import PlainBlock, ResidualBlock, ScalarGate, dense_unit
from throughway.train import load_model, save_model


def block_scalar_gates(model):
    """The scalar gate of every branch, from the one lister."""
    from throughway.layers import find_branches
    return [ref.gate for ref in find_branches(model).values()]


class MyNet(nn.Module):
    """The README's own model: a stem, two gated residual blocks in an nn.Sequential, a head."""

    def __init__(self, features: int = 20, width: int = 32, classes: int = 3, blocks: int = 2) -> None:
        super().__init__()
        self.stem = dense_unit(features, width)
        self.blocks = nn.Sequential(*[
            ResidualBlock(nn.Sequential(dense_unit(width, width), dense_unit(width, width)), gated=True)
            for _ in range(blocks)])
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class VectorGate(nn.Module):
    """A stand-in for LayerScale's gate (Touvron et al. 2021): g = diag(λ), one λ per channel."""

    def __init__(self, width: int, init: float = 0.1) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((width,), init))

    def value(self) -> torch.Tensor:
        return self.scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.scale * h


def _my_net(ks: list[float], function: str = "relu", seed: int = 0) -> MyNet:
    torch.manual_seed(seed)
    model = MyNet(blocks=len(ks))
    for block, k in zip(model.blocks, ks):
        block.gate = ScalarGate(k, function)
    with torch.no_grad():  # BatchNorm statistics that are not the defaults
        for _ in range(3):
            model(torch.randn(16, 20))
    return model.eval()


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_blocks_are_found_in_a_sequential_and_named():
    model = _my_net([1.0, 1.0, 1.0])
    assert list(find_blocks(model)) == ["blocks.0", "blocks.1", "blocks.2"]
    assert model_family(model) == "gated"


def test_blocks_are_found_in_stages_and_attributes():
    class Staged(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stages = nn.ModuleList([nn.Sequential(ResidualBlock(nn.Linear(4, 4), gated=True)),
                                         nn.Sequential(ResidualBlock(nn.Linear(4, 4), gated=True),
                                                       ResidualBlock(nn.Linear(4, 4), gated=True))])
            self.last = ResidualBlock(nn.Linear(4, 4), gated=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for stage in self.stages:
                x = stage(x)
            return self.last(x)

    model = Staged()
    assert list(find_blocks(model)) == ["stages.0.0", "stages.1.0", "stages.1.1", "last"]
    x = torch.randn(3, 4)
    smaller = prune(model, ["stages.1.0", "last"])
    assert list(find_blocks(smaller)) == ["stages.0.0", "stages.1.0"]  # renumbered; `last` is an Identity now
    assert isinstance(smaller.last, nn.Identity) and smaller(x).shape == (3, 4)
    assert torch.equal(smaller.stages[1][0].branch.weight, model.stages[1][1].branch.weight)


def test_k_statistics_of_my_net():
    stats = k_statistics(_my_net([0.5, -0.25, 1.5, 0.0]))
    assert stats["blocks"] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert stats["k"] == pytest.approx([0.5, -0.25, 1.5, 0.0])
    assert stats["g_k"] == pytest.approx([0.5, 0.0, 1.5, 0.0])
    assert stats["dead_blocks"] == [1, 3] and stats["negative_blocks"] == [] and stats["num_blocks"] == 4


def test_a_negative_rezero_alpha_is_negative_not_dead():
    # ReZero (Bachlechner et al. 2020): g = α, identity function, α starts at 0.
    stats = k_statistics(_my_net([0.0, -0.3, 0.2], function="identity"))
    assert stats["dead_blocks"] == [0]  # exactly 0: the block is an exact identity
    assert stats["negative_blocks"] == [1] and stats["num_dead"] == 1
    general = gate_statistics(_my_net([0.0, -0.3, 0.2], function="identity"))
    assert general["dead_blocks"] == [0] and general["negative_blocks"] == [1]
    assert general["g_abs_mean"] == pytest.approx([0.0, 0.3, 0.2])


def _vector_gated(scales: list[list[float]]) -> MyNet:
    model = MyNet(width=2, blocks=len(scales))
    for block, scale in zip(model.blocks, scales):
        block.gate = VectorGate(2)
        with torch.no_grad():
            block.gate.scale.copy_(torch.tensor(scale))
    return model.eval()


def test_vector_gates_statistics_order_and_lesion():
    model = _vector_gated([[0.5, -0.5], [0.0, 0.0], [-0.1, -0.3], [0.05, 0.1]])
    assert model_family(model) == "gated"
    stats = gate_statistics(model)
    assert stats["g_abs_mean"] == pytest.approx([0.5, 0.0, 0.2, 0.075])
    assert stats["g_mean"] == pytest.approx([0.0, 0.0, -0.2, 0.075])
    assert stats["g_size"] == [2, 2, 2, 2]
    assert stats["dead_blocks"] == [1] and stats["negative_blocks"] == [2]  # mixed signs are neither
    assert removal_order(model, "greedy") == [1, 3, 2, 0]  # ascending mean |λ|
    with pytest.raises(ValueError, match="block 'blocks.0' .*no scalar gate k.*vector: use gate_statistics"):
        k_statistics(model)
    x = torch.randn(5, 20)
    before = model(x)
    with lesion(model, 0):
        h = torch.randn(5, 2)
        assert torch.equal(model.blocks[0](h), h)  # g = 0: u = x
    assert torch.equal(model(x), before)


def test_lesion_from_the_package_is_the_context_manager():
    model = _my_net([0.7, 1.3])
    x = torch.randn(6, 20)
    before = model(x)
    with lesion(model, 0) as lesioned:
        assert lesioned is model
        during = model(x)
    with lesion(model, "blocks.1"):
        h = torch.randn(4, 32)
        assert torch.equal(model.blocks[1](h), h)
    assert not torch.equal(during, before) and torch.equal(model(x), before)
    closed = _my_net([0.0, 1.3])
    closed.load_state_dict({k: v for k, v in model.state_dict().items() if not k.endswith("gate.k")}, strict=False)
    assert torch.equal(during, closed(x))  # lesioning block 0 = setting its k to 0


def test_lesion_and_prune_name_what_is_not_a_block():
    model = _my_net([1.0, 1.0])
    with pytest.raises(ValueError, match=r"module 'head' \(Linear\) is not a block"):
        with lesion(model, "head"):
            pass
    with pytest.raises(IndexError, match=r"block=2: accepted values are positions 0 \.\. 1 .*'blocks.0'"):
        prune(model, [2])
    with pytest.raises(IndexError, match="'blocks.7'"):
        prune(model, ["blocks.7"])
    with pytest.raises(ValueError, match="'blocks.1' is listed twice"):
        prune(model, [1, "blocks.1"])


def test_prune_my_net_removes_dead_blocks_exactly_and_is_smaller():
    model = _my_net([0.8, -0.3, 1.1, 0.0])
    x = torch.randn(8, 20)
    pruned = prune(model, ["blocks.1", 3])  # g(k) = 0: exact identities; a name and a position
    assert type(pruned) is MyNet and len(pruned.blocks) == 2 and len(model.blocks) == 4
    assert torch.equal(pruned(x), model(x))
    assert _parameters(pruned) == _parameters(model) - 2 * _parameters(model.blocks[0])
    assert [float(g.k.detach()) for g in block_scalar_gates(pruned)] == pytest.approx([0.8, 1.1])
    assert not pruned.training and next(pruned.parameters()).dtype == torch.float32
    # Physically smaller: the pruned net runs 2 blocks' layers, not 4 (the speed benchmark,
    # benchmarks/prune_speed.py, measures what this buys).
    calls: list[str] = []
    for module in pruned.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(lambda *_: calls.append("linear"))
    pruned(x)
    assert len(calls) == 1 + 2 * 2 + 1  # stem, two layers per kept block, head


def test_prune_names_a_block_whose_shapes_differ():
    class Widening(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(
                ResidualBlock(nn.Linear(4, 4), gated=True),
                ResidualBlock(nn.Linear(4, 8), gated=True, shortcut=nn.Linear(4, 8)),
                PlainBlock(nn.Linear(8, 8)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks(x)

    model = Widening()
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"block 'blocks.1' \(ResidualBlock\) maps \(3, 4\) to \(3, 8\)"):
        prune(model, [1], example_input=x)
    with pytest.raises(ValueError, match="block 'blocks.1' .*no identity shortcut.*example_input"):
        prune(model, [1])
    assert prune(model, ["blocks.2"], example_input=x)(x).shape == (3, 8)  # a plain layer 8 -> 8
    assert prune(model, [0])(x).shape == (3, 8)


def test_removal_curve_of_my_net():
    model = _my_net([0.5, -1.0, 1.5, 0.0, 0.2])
    order = removal_order(model, "greedy")
    assert order == [1, 3, 4, 0, 2]  # ascending |g(k)|; the closed ReLU gates by k
    x = torch.randn(7, 20)
    reference = model(x)
    same = removal_curve(model, order, lambda m: float(torch.equal(m(x), reference)))
    assert same[:3] == [1.0, 1.0, 1.0] and same[3] == 0.0  # the two dead blocks change nothing
    assert removal_curve(model, order, lambda m: float(len(m.blocks)), max_removed=3) == [5.0, 4.0, 3.0, 2.0]


def test_save_load_round_trip_of_my_net(tmp_path: Path):
    model = _my_net([0.9, -0.2, 1.2])
    x = torch.randn(9, 20)
    path = save_model(tmp_path / "mynet.safetensors", model)
    with pytest.raises(ValueError, match=r"mynet\.safetensors: holds no model config.*MyNet.*model=\.\.\."):
        load_model(path)
    loaded = load_model(path, model=MyNet(blocks=3))
    assert isinstance(loaded, MyNet) and not loaded.training
    assert torch.equal(loaded(x), model(x))  # bit-identical
    with pytest.raises(ValueError, match=r"mynet\.safetensors: the tensors do not fit the MyNet.*blocks\.2"):
        load_model(path, model=MyNet(blocks=2))
    with pytest.raises(ValueError, match=r"head\.weight: file \(3, 32\), model \(5, 32\)"):
        load_model(path, model=MyNet(blocks=3, classes=5))


def test_a_pruned_own_model_saves_and_loads(tmp_path: Path):
    model = _my_net([0.9, 0.0, 1.2])
    x = torch.randn(4, 20)
    pruned = prune(model, [1])
    path = save_model(tmp_path / "pruned.safetensors", pruned)
    assert torch.equal(load_model(path, model=MyNet(blocks=2))(x), model(x))


def test_a_registry_model_loads_into_a_given_module_too(tmp_path: Path):
    from throughway.models import create_model

    model = create_model("mlp_gated_residual", depth=4, width=8).eval()
    path = save_model(tmp_path / "m.safetensors", model)
    into = create_model("mlp_gated_residual", depth=4, width=8)
    assert load_model(path, model=into) is into
    x = torch.rand(2, 1, 28, 28)
    assert torch.equal(into(x), model(x)) and torch.equal(load_model(path)(x), model(x))


def test_highway_analyses_of_an_own_sequential():
    from throughway.analysis.gates import transform_gate_biases, transform_gate_statistics
    from throughway.layers import dense_highway_layer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), *[dense_highway_layer(4, gate_bias=-float(i)) for i in range(3)],
                          nn.Linear(4, 3)).eval()
    assert list(find_blocks(model)) == ["1", "2", "3"] and model_family(model) == "highway"
    assert transform_gate_biases(model)[:, 0].tolist() == [0.0, -1.0, -2.0]
    x, y = torch.randn(12, 5), torch.arange(12) % 3
    assert transform_gate_statistics(model, x, y, num_classes=3).mean.shape == (3, 4)
    with lesion(model, "2"):
        h = torch.randn(2, 4)
        assert torch.equal(model[2](h), h)  # T = 0: the layer copies its input
    assert len(prune(model, ["2"])) == 4


def test_gate_statistics_of_the_registry_layerscale_and_rezero_nets():
    from throughway.models import create_model

    layerscale = create_model("mlp_layerscale", depth=6, width=8)
    with torch.no_grad():
        layerscale.blocks[2].gate.k.fill_(-0.5)
    stats = gate_statistics(layerscale)
    assert stats["g_size"] == [8, 8, 8] and stats["negative_blocks"] == [2] and stats["dead_blocks"] == []
    assert stats["g_abs_mean"] == pytest.approx([0.1, 0.1, 0.5])  # CaiT's ε = 0.1 up to depth 18
    assert removal_order(layerscale, "greedy") == [0, 1, 2]
    rezero = gate_statistics(create_model("mlp_rezero", depth=6, width=8))
    assert rezero["dead_blocks"] == [0, 1, 2]  # α = 0 at initialisation: every block an exact identity
