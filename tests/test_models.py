"""Every registered model: forward shape, finite output, a gradient for every parameter; counts."""

from __future__ import annotations

import pytest
import torch

from throughway.layers import block_spec
from throughway.models import create_model, list_models

SMALL = {"depth": 4, "width": 12}
# Conv families have their own depth rules (6n+2, 6n+4, fixed layouts) and take 1-channel 28×28 input.
SMALL_BY_MODEL = {
    "preact_resnet": {"depth": 8, "width": 4, "in_channels": 1},
    "wide_resnet": {"depth": 10, "widen_factor": 1, "in_channels": 1},
    "highway_conv": {"width": 4, "in_channels": 1},
    "preact_shortcut_depth": {"depth": 14, "shortcut_depth": 2, "width": 4, "in_channels": 1},
    "shortcut_net": {"depth": 4, "width": 12, "in_features": 784, "num_classes": 10},
}


# Causal language models take token ids (8, 16) and return next-token logits (8, 16, vocab_size).
LANGUAGE_MODELS = {"gpt": {"depth": 2, "width": 16, "heads": 2, "context": 16, "vocab_size": 10},
                   "hf_gpt2": {"depth": 2, "width": 16, "heads": 2, "context": 16, "vocab_size": 10}}
SMALL_BY_MODEL.update(LANGUAGE_MODELS)


def _language_model_forward(name):
    if name == "hf_gpt2":
        pytest.importorskip("transformers")
    model = create_model(name, **LANGUAGE_MODELS[name])
    x = torch.randint(0, 10, (8, 16))
    out = model(x)
    assert out.shape == (8, 16, 10) and torch.isfinite(out).all()
    out.logsumexp(dim=-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"parameters without a finite gradient: {missing}"
    assert len(model.blocks) == 2
    assert model.forward_head(model.forward_features(x)).shape == (8, 16, 10)


@pytest.mark.parametrize("name", [m.name for m in list_models()])
def test_forward_shapes_and_gradients(name):
    if name in LANGUAGE_MODELS:
        _language_model_forward(name)
        return
    model = create_model(name, **SMALL_BY_MODEL.get(name, SMALL))
    x = torch.rand(8, 1, 28, 28)
    out = model(x)
    assert out.shape == (8, 10)
    assert torch.isfinite(out).all()
    out.logsumexp(dim=1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"parameters without a finite gradient: {missing}"
    assert len(model.blocks) > 0
    assert model.forward_head(model.forward_features(x)).shape == (8, 10)


@pytest.mark.parametrize("name", [m.name for m in list_models()])
def test_blocks_expose_contract_names(name):
    if name == "hf_gpt2":
        pytest.importorskip("transformers")
    model = create_model(name, **SMALL_BY_MODEL.get(name, SMALL))
    for block in model.blocks:
        # the toolkit's blocks carry the contract's names; vit_patch's are torch's encoder layers, which the
        # block registry describes from the outside (layers.adapters)
        assert (hasattr(block, "branch") and hasattr(block, "gate") and hasattr(block, "shortcut")) \
            or block_spec(block) is not None


def _count(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("depth", [2, 10, 100])
def test_gated_residual_has_exactly_d_over_2_more_parameters(depth):
    gated = create_model("mlp_gated_residual", depth=depth, width=50)
    plain_res = create_model("mlp_residual", depth=depth, width=50)
    assert len(gated.blocks) == depth // 2
    assert _count(gated) - _count(plain_res) == depth // 2


def test_augmented_has_one_k_per_layer():
    assert _count(create_model("mlp_augmented", depth=6)) - _count(create_model("mlp_plain", depth=6)) == 6


def test_highway_paper_thin_widths_have_about_5000_parameters_per_layer():
    # highway §3.1: 71 plain units vs 50 highway blocks, "≈ 5000" parameters per layer each.
    plain = _count(create_model("mlp_plain", depth=10, width=71, norm="none")) - \
        _count(create_model("mlp_plain", depth=9, width=71, norm="none"))
    highway = _count(create_model("mlp_highway", depth=10, width=50)) - _count(create_model("mlp_highway", depth=9, width=50))
    assert plain == 71 * 71 + 71 and highway == 2 * (50 * 50 + 50)
    assert abs(plain - highway) / highway < 0.01


def test_model_config_rebuilds_model():
    model = create_model("mlp_gated_residual", depth=4, width=20, k_init=0.5)
    config = dict(model.config)
    name = config.pop("name")
    again = create_model(name, **config)
    assert [p.shape for p in again.parameters()] == [p.shape for p in model.parameters()]
    assert again.blocks[0].gate.k.item() == 0.5


@pytest.mark.parametrize("name", ["mlp_residual", "mlp_gated_residual"])
def test_odd_depth_is_refused(name):
    with pytest.raises(ValueError, match="depth=3 must be even"):
        create_model(name, depth=3)


def test_unknown_model_and_argument_errors_name_the_choices():
    with pytest.raises(KeyError, match="registered models"):
        create_model("mlp_nonexistent")
    with pytest.raises(TypeError, match="accepted"):
        create_model("mlp_plain", depht=3)
    with pytest.raises(ValueError, match="activation"):
        create_model("mlp_plain", activation="gelu")


def test_default_init_is_glorot_uniform_with_zero_bias():
    model = create_model("mlp_plain", depth=2, width=50)
    linear = model.blocks[0].branch[0]
    bound = (6 / (50 + 50)) ** 0.5
    assert linear.weight.abs().max() <= bound
    assert linear.weight.abs().max() > 0.9 * bound
    assert torch.count_nonzero(linear.bias) == 0


# -- a model on the meta device -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,kwargs", [("mlp_gated_residual", {"depth": 4, "width": 8}),
                                         ("mlp_augmented", {"depth": 4, "width": 8}),
                                         ("preact_resnet", {"depth": 8, "width": 4, "gated": True})])
def test_repr_of_a_model_on_the_meta_device(name: str, kwargs: dict) -> None:
    with torch.device("meta"):
        model = create_model(name, **kwargs)
    text = repr(model)
    assert "ScalarGate(function=relu, k=?)" in text
    assert "k=1" in repr(create_model(name, **kwargs))
