"""Gate statistics (analysis.gates) on hand-built models whose gates are known."""

from __future__ import annotations

import pytest
import torch

from throughway.analysis.gates import (
    highway_layer_change,
    highway_sample_activations,
    k_statistics,
    model_family,
    projection_blocks,
    transform_gate_biases,
    transform_gate_statistics,
)
from throughway.models import create_model


def block_scalar_gates(model):
    """The scalar gate of every branch, from the one lister."""
    from throughway.layers import find_branches
    return [ref.gate for ref in find_branches(model).values()]


def _gated(ks: list[float], function: str = "relu") -> torch.nn.Module:
    model = create_model("mlp_gated_residual", depth=2 * len(ks), width=6, in_features=5, num_classes=3,
                         gate_function=function).eval()
    with torch.no_grad():
        for gate, k in zip(block_scalar_gates(model), ks):
            gate.k.fill_(k)
    return model


def _highway_with_known_gates(layers: int = 3, width: int = 4) -> torch.nn.Module:
    """W_T = 0, so T(x) = σ(b_T) for every input: the gate statistics are known in closed form."""
    model = create_model("mlp_highway", depth=layers, width=width, in_features=5, num_classes=3,
                         activation="tanh").eval()
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            block.gate.linear.weight.zero_()
            block.gate.linear.bias.copy_(torch.arange(width, dtype=torch.float32) - layer)
    return model


def test_k_statistics_of_known_gates():
    stats = k_statistics(_gated([0.5, -0.25, 1.5, 0.0]))
    assert stats["k"] == pytest.approx([0.5, -0.25, 1.5, 0.0])
    assert stats["g_k"] == pytest.approx([0.5, 0.0, 1.5, 0.0])
    assert stats["k_mean"] == pytest.approx(0.4375)
    assert (stats["k_min"], stats["k_max"]) == pytest.approx((-0.25, 1.5))
    assert stats["dead_blocks"] == [1, 3] and stats["num_dead"] == 2 and stats["num_blocks"] == 4


def test_only_relu_gates_die():
    # sigmoid(k) > 0 for every k: a negative k still passes gradient, so no gate is "dead".
    assert k_statistics(_gated([-1.0, 2.0], function="sigmoid"))["num_dead"] == 0


def test_k_statistics_refuses_ungated_models():
    model = create_model("mlp_residual", depth=4, width=6, in_features=5, num_classes=3)
    with pytest.raises(ValueError, match="no scalar gate"):
        k_statistics(model)


@pytest.mark.parametrize("name,family", [("mlp_gated_residual", "gated"), ("mlp_residual", "residual"),
                                         ("mlp_highway", "highway"), ("mlp_plain", "plain"),
                                         ("mlp_augmented", "augmented")])
def test_model_family(name, family):
    assert model_family(create_model(name, depth=2, width=4, in_features=5, num_classes=3)) == family


def test_transform_gate_statistics_of_constant_gates():
    model = _highway_with_known_gates()
    expected = torch.sigmoid(torch.arange(4.0) - torch.arange(3.0).unsqueeze(1))  # (layers, blocks)
    assert torch.allclose(transform_gate_biases(model), torch.arange(4.0) - torch.arange(3.0).unsqueeze(1))
    x, y = torch.randn(11, 5), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0])
    stats = transform_gate_statistics(model, x, y, num_classes=3, batch_size=4)  # several batches
    assert torch.allclose(stats.mean, expected, atol=1e-6)
    assert stats.counts.tolist() == [5, 3, 3]
    # Gates that ignore the input route every class alike: class mean − overall mean is 0.
    assert torch.allclose(stats.class_difference(2), torch.zeros(3, 4), atol=1e-6)
    gates, outputs = highway_sample_activations(model, x[0])
    assert torch.allclose(gates, expected, atol=1e-6)
    assert outputs.shape == (3, 4)


def test_class_difference_sees_input_dependent_gates():
    model = _highway_with_known_gates(layers=1, width=2)
    with torch.no_grad():
        model.stem[0].weight.zero_()
        model.stem[0].bias.zero_()
        model.stem[0].weight[0, 0] = 1.0  # stem output h = (tanh(x_0), 0)
        model.blocks[0].gate.linear.weight[0, 0] = 10.0  # T_0 ≈ 1 when x_0 > 0, ≈ 0 when x_0 < 0
        model.blocks[0].gate.linear.bias.zero_()
    x = torch.zeros(4, 5)
    x[:2, 0], x[2:, 0] = 3.0, -3.0
    y = torch.tensor([0, 0, 1, 1])
    stats = transform_gate_statistics(model, x, y, num_classes=2)
    t_high = torch.sigmoid(10 * torch.tanh(torch.tensor(3.0)))
    t_low = torch.sigmoid(-10 * torch.tanh(torch.tensor(3.0)))
    assert stats.class_difference(0)[0, 0] == pytest.approx(float((t_high - t_low) / 2), abs=1e-5)
    assert stats.class_difference(1)[0, 0] == pytest.approx(float((t_low - t_high) / 2), abs=1e-5)
    assert stats.class_difference(0)[0, 1] == pytest.approx(0.0, abs=1e-6)  # block 1 ignores the input


def test_layer_change_is_zero_for_closed_gates():
    model = _highway_with_known_gates(layers=2, width=3)
    with torch.no_grad():
        model.blocks[1].gate.linear.bias.fill_(-100.0)  # T = 0 to float precision: y = x
    change = highway_layer_change(model, torch.randn(6, 5))
    assert change[0] > 0 and change[1] == pytest.approx(0.0, abs=1e-12)


def test_highway_statistics_refuse_other_families():
    with pytest.raises(ValueError, match="highway"):
        transform_gate_biases(_gated([1.0]))


def _conv_gated(name: str, **kwargs) -> torch.nn.Module:
    model = create_model(name, gated=True, num_classes=3, **kwargs).eval()
    with torch.no_grad():
        for i, gate in enumerate(block_scalar_gates(model)):
            gate.k.fill_(0.5 - i)  # known k: 0.5, -0.5, -1.5
    return model


@pytest.mark.parametrize("name,kwargs,projections", [("preact_resnet", {"depth": 8, "width": 4}, [1, 2]),
                                                     ("wide_resnet", {"depth": 10, "widen_factor": 1, "dropout": 0.0},
                                                      [1, 2])])
def test_gates_of_convolutional_gated_nets(name, kwargs, projections):
    # gated-residual-v2 figure 7 is k by block of a Wide Gated ResNet: the same statistics must work there.
    model = _conv_gated(name, **kwargs)
    assert model_family(model) == "gated"
    stats = k_statistics(model)
    assert stats["k"] == pytest.approx([0.5, -0.5, -1.5]) and stats["dead_blocks"] == [1, 2]
    assert projection_blocks(model) == projections  # the first block of stages 2 and 3 changes the shape
    assert model_family(create_model(name, num_classes=3, **kwargs)) == "residual"


def test_projection_blocks_of_fully_connected_nets_is_empty():
    assert projection_blocks(_gated([1.0, 1.0])) == []


def test_model_family_refuses_mixed_blocks():
    # highway_conv interleaves plain convolutions, pooling and highway layers: no single family.
    model = create_model("highway_conv", num_classes=3)
    with pytest.raises(ValueError, match="mixes block kinds"):
        model_family(model)
