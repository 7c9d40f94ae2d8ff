"""Gate semantics (gated-residual-v2 §2.2) and highway layers (highway eq. 3 and 4)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from throughway.layers import (HighwayLayer, ResidualBlock, ScalarGate, TransformGate, augment, dense_highway_layer,
                               dense_unit)


def _branch(width=16):
    return nn.Sequential(dense_unit(width, width), dense_unit(width, width))


@pytest.mark.parametrize("k", [0.0, -0.5, -3.0])
def test_gated_residual_block_with_k_at_most_zero_is_the_identity(k):
    block = ResidualBlock(_branch(), gated=True, k_init=k)
    x = torch.randn(32, 16)
    assert torch.equal(block(x), x)


def test_gated_residual_block_with_k_one_equals_ungated_block():
    gated = ResidualBlock(_branch(), gated=True, k_init=1.0)
    ungated = ResidualBlock(_branch(), gated=False)
    ungated.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    x = torch.randn(32, 16)
    assert torch.equal(gated(x), ungated(x))


def test_gate_scales_only_the_branch():
    block = ResidualBlock(_branch(), gated=True, k_init=2.5)
    x = torch.randn(32, 16)
    assert torch.allclose(block(x), 2.5 * block.branch(x) + x, atol=1e-6)


@pytest.mark.parametrize("k", [0.0, -1.0])
def test_augmented_layer_with_k_at_most_zero_is_the_identity(k):
    layer = augment(dense_unit(16, 16), k_init=k)
    x = torch.randn(8, 16)
    assert torch.equal(layer(x), x)


def test_augmented_layer_with_k_one_is_the_layer():
    inner = dense_unit(16, 16)
    layer = augment(inner, k_init=1.0)
    x = torch.randn(8, 16)
    assert torch.allclose(layer(x), inner(x))


def test_augmenting_a_residual_block_gives_the_gated_residual_block():
    # gated-residual-v2 §2.2: g(k)(f_r(x) + x) + (1 − g(k))x = g(k) f_r(x) + x
    residual = ResidualBlock(_branch(), gated=False)
    augmented = augment(residual, k_init=0.37)
    gated = ResidualBlock(_branch(), gated=True, k_init=0.37)
    gated.load_state_dict({**{f"branch.{k}": v for k, v in residual.branch.state_dict().items()},
                           "gate.k": torch.tensor(0.37)})
    x = torch.randn(32, 16)
    assert torch.allclose(augmented(x), gated(x), atol=1e-6)


def test_augment_refuses_a_shape_changing_layer():
    with pytest.raises(ValueError, match="shape-preserving"):
        augment(nn.Linear(4, 5))(torch.randn(2, 4))


@pytest.mark.parametrize("function,k,expected", [("relu", -2.0, 0.0), ("relu", 3.0, 3.0), ("identity", -2.0, -2.0),
                                                 ("sigmoid", 0.0, 0.5)])
def test_scalar_gate_functions(function, k, expected):
    gate = ScalarGate(k, function)
    assert gate.value().item() == pytest.approx(expected)
    assert torch.allclose(gate(torch.ones(3)), torch.full((3,), expected))


def test_scalar_gate_defaults_and_errors():
    gate = ScalarGate()
    assert gate.k.item() == 1.0 and gate.function == "relu"
    with pytest.raises(ValueError, match="accepted values"):
        ScalarGate(1.0, "softplus")


def test_highway_with_very_negative_gate_bias_passes_its_input_through():
    layer = dense_highway_layer(20, "tanh", gate_bias=-40.0)
    x = torch.randn(16, 20)
    assert torch.allclose(layer(x), x, atol=1e-6)


def test_highway_with_open_gates_is_h():
    layer = dense_highway_layer(20, "relu", gate_bias=40.0)
    with torch.no_grad():
        layer.gate.linear.weight.zero_()
    x = torch.randn(16, 20)
    assert torch.allclose(layer(x), layer.branch(x), atol=1e-6)


def test_highway_formula_and_gate_bias_init():
    layer = dense_highway_layer(10, "relu", gate_bias=-3.0)
    assert torch.all(layer.gate.linear.bias == -3.0)
    x = torch.randn(4, 10)
    t = torch.sigmoid(layer.gate.linear(x))
    assert torch.allclose(layer(x), layer.branch(x) * t + x * (1 - t), atol=1e-6)
    assert isinstance(layer, HighwayLayer) and isinstance(layer.gate, TransformGate)


def test_the_old_module_name_still_imports_with_a_deprecation_warning():
    import importlib
    import sys

    import throughway.layers.gated as gated

    sys.modules.pop("throughway.layers.augment", None)
    with pytest.warns(DeprecationWarning, match="renamed throughway.layers.gated"):
        old = importlib.import_module("throughway.layers.augment")
    assert old.AugmentedLayer is gated.AugmentedLayer and old.augment is gated.augment
