"""Issue 12: the first layer ("stem") of the MLP families, gated-residual-v2 §3.1."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save
from torch import nn

from throughway.models import LEGACY_STEM, MLP_FAMILIES, create_model, model_entry
from throughway.train import RunConfig, load_model, save_model
from throughway.train.config import RunExistsError, check_resumable

GATED_RESIDUAL_FAMILIES = ("mlp_plain", "mlp_residual", "mlp_gated_residual", "mlp_augmented")


@pytest.mark.parametrize("name", MLP_FAMILIES)
def test_linear_stem_is_one_linear_layer(name):
    model = create_model(name, depth=4, width=6, in_features=5, num_classes=3, stem="linear")
    assert type(model.stem) is nn.Linear  # a single Dot: no BatchNorm, no activation
    assert (model.stem.in_features, model.stem.out_features) == (5, 6)


@pytest.mark.parametrize("name", MLP_FAMILIES)
def test_dense_stem_is_dot_then_activation(name):
    model = create_model(name, depth=4, width=6, in_features=5, num_classes=3, stem="dense")
    kinds = [type(m).__name__ for m in model.stem]
    assert kinds[0] == "Linear" and kinds[-1] in ("ReLU", "Tanh") and len(kinds) in (2, 3)


def test_each_family_defaults_to_its_papers_stem():
    for name in GATED_RESIDUAL_FAMILIES:  # gated-residual-v2 §3.1: "a linear layer with 50 neurons"
        assert model_entry(name).parameters()["stem"] == "linear"
    assert model_entry("mlp_highway").parameters()["stem"] == "dense"  # highway §3.1: a plain first layer


def test_d100_gated_net_has_the_parameter_count_the_paper_implies():
    # gated-residual-v2 §3.1: a linear layer 784 -> 50, d = 100 Dot-BN-ReLU layers of 50 in 50 blocks
    # of two, one scalar k per block, a 50 -> 10 softmax layer.
    stem = 784 * 50 + 50
    middle = 100 * (50 * 50 + 50 + 2 * 50)  # weights, biases, BatchNorm scale and shift
    gates = 50
    head = 50 * 10 + 10
    model = create_model("mlp_gated_residual", depth=100)
    assert sum(p.numel() for p in model.parameters()) == stem + middle + gates + head == 304_810


def test_unknown_stem_names_the_accepted_values():
    with pytest.raises(ValueError, match="stem='conv'.*linear.*dense"):
        create_model("mlp_residual", depth=2, stem="conv")


def test_a_model_file_without_a_stem_loads_as_dense(tmp_path):
    model = create_model("mlp_gated_residual", depth=2, width=6, in_features=5, num_classes=3, stem="dense")
    config = {k: v for k, v in model.config.items() if k != "stem"}  # as files written before issue 12
    path = tmp_path / "old.safetensors"
    path.write_bytes(save({k: v.contiguous() for k, v in model.state_dict().items()},
                          metadata={"format": "throughway-model-1", "config": json.dumps(config)}))
    loaded = load_model(path)
    assert loaded.config["stem"] == LEGACY_STEM == "dense"
    x = torch.randn(4, 5)
    assert torch.equal(loaded(x), model.eval()(x))


def test_the_stem_is_recorded_in_saved_models(tmp_path):
    model = create_model("mlp_residual", depth=2, width=6, in_features=5, num_classes=3)
    loaded = load_model(save_model(tmp_path / "m.safetensors", model))
    assert loaded.config["stem"] == "linear" and type(loaded.stem) is nn.Linear


def test_resume_compares_the_stem_as_built():
    config = RunConfig(model="mlp_residual", depth=2, model_kwargs={"width": 8})
    old_run = {"config": config.to_dict(), "model": {"config": {"name": "mlp_residual", "width": 8}}}  # no stem: dense
    with pytest.raises(RunExistsError, match="model_kwargs"):
        check_resumable(old_run, config, None)  # type: ignore[arg-type]
    check_resumable(old_run, RunConfig(model="mlp_residual", depth=2, model_kwargs={"width": 8, "stem": "dense"}), None)  # type: ignore[arg-type]
    new_run = {"config": config.to_dict(), "model": {"config": {"name": "mlp_residual", "width": 8, "stem": "linear"}}}
    check_resumable(new_run, config, None)  # type: ignore[arg-type]
