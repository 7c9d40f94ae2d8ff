"""The papers' recipes as written, and the k-decay rule."""

from __future__ import annotations

import pytest
import torch

from throughway.models import create_model
from throughway.train import build_optimizer, get_recipe, learning_rate_at, parameter_groups


def test_gresnet_mnist_is_the_papers_recipe():
    # gated-residual-v2 §3.1: Nadam, lr 0.002, momentum (β1) 0.9, batch 128, 100 epochs, no decay.
    recipe = get_recipe("gresnet-mnist")
    assert (recipe.optimizer, recipe.lr, recipe.betas[0], recipe.batch_size, recipe.epochs) == ("nadam", 0.002, 0.9, 128, 100)
    assert recipe.schedule == "constant" and recipe.weight_decay == 0.0
    optimizer = build_optimizer(create_model("mlp_gated_residual", depth=2), recipe)
    assert optimizer.kind == "nadam" and isinstance(optimizer, torch.optim.Optimizer)
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.002 and group["betas"] == (0.9, 0.999) and group["momentum_decay"] == 0.004
    assert all(learning_rate_at(recipe, e) == 0.002 for e in (0, 50, 99))


def test_highway_mnist_is_sgd_with_momentum_and_exponential_decay():
    recipe = get_recipe("highway-mnist", lr=0.1, momentum=0.8, lr_decay=0.9)
    optimizer = build_optimizer(create_model("mlp_highway", depth=2), recipe)
    assert optimizer.kind == "sgd" and optimizer.param_groups[0]["momentum"] == 0.8
    assert learning_rate_at(recipe, 0) == 0.1
    assert learning_rate_at(recipe, 3) == pytest.approx(0.1 * 0.9 ** 3)


def test_k_is_never_weight_decayed_unless_asked():
    model = create_model("mlp_gated_residual", depth=4)
    ks = {id(block.gate.k) for block in model.blocks}
    recipe = get_recipe("gresnet-mnist", weight_decay=1e-4)
    groups = {g["group"]: g for g in parameter_groups(model, recipe)}
    assert ks <= {id(p) for p in groups["no_decay"]["params"]}
    assert not ks & {id(p) for p in groups["decay"]["params"]}
    assert all(p.dim() >= 2 for p in groups["decay"]["params"])
    with_k = {g["group"]: g for g in parameter_groups(model, recipe.replace(k_decay=True))}
    assert ks <= {id(p) for p in with_k["decay"]["params"]}
    assert with_k["decay"]["weight_decay"] == 1e-4


def test_multistep_schedule():
    recipe = get_recipe("gresnet-mnist").replace(schedule="multistep", lr=0.1, epochs=100, milestones=(0.5, 0.75),
                                                 milestone_factor=0.1)
    assert [learning_rate_at(recipe, e) for e in (0, 49, 50, 74, 75)] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001])


def test_bad_recipe_values_are_refused_with_the_field_named():
    with pytest.raises(KeyError, match="accepted values"):
        get_recipe("adamw-imagenet")
    with pytest.raises(ValueError, match="optimizer"):
        get_recipe("gresnet-mnist", optimizer="lbfgs")
    with pytest.raises(ValueError, match="lr="):
        get_recipe("gresnet-mnist", lr=-1.0)
    with pytest.raises(TypeError, match="no fields"):
        get_recipe("gresnet-mnist", learning_rate=0.1)
