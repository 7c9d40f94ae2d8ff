"""The papers' recipes as written, and the k-decay rule."""

from __future__ import annotations

import pytest
import torch

from throughway.models import create_model
from throughway.train import (build_optimizer, get_recipe, learning_rate_at, learning_rate_at_step, param_groups,
                              parameter_groups)


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


@pytest.mark.parametrize("name", ["gpt", "hf_gpt2"])
def test_embeddings_norms_biases_and_gates_are_not_decayed_in_a_language_model(name):
    if name == "hf_gpt2":
        pytest.importorskip("transformers")
    model = create_model(name, depth=2, width=16, heads=2, context=8, vocab_size=11, gate="relu")
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    assert len(embeddings) == 2  # token and position
    gates = {id(p) for n, p in model.named_parameters() if n.endswith(".k")}
    assert len(gates) == 4  # attention and feed-forward of 2 layers
    for groups in (param_groups(model, 0.1), parameter_groups(model, get_recipe("nanogpt-char"))):
        by = {g["group"]: {id(p) for p in g["params"]} for g in groups}
        assert embeddings | gates <= by["no_decay"] and not (embeddings | gates) & by["decay"]
        decayed = [p for p in model.parameters() if id(p) in by["decay"]]
        assert decayed and all(p.dim() >= 2 for p in decayed)
        # every other matrix (attention, feed-forward, an untied head) is decayed
        assert {id(p) for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings} == by["decay"]


def test_warmup_cosine_is_nanogpts_per_step_schedule():
    recipe = get_recipe("nanogpt-char")  # lr 1e-3, 100 warm-up steps, floor 1e-4, 20 epochs of 250 steps
    total = recipe.epochs * recipe.steps_per_epoch
    assert total == 5000
    # nanoGPT train.py get_lr: learning_rate * (it + 1) / (warmup_iters + 1), then cosine to min_lr
    assert learning_rate_at_step(recipe, 0, total) == pytest.approx(1e-3 / 101)
    assert learning_rate_at_step(recipe, 99, total) == pytest.approx(1e-3 * 100 / 101)
    assert learning_rate_at_step(recipe, 100, total) == pytest.approx(1e-3)
    assert learning_rate_at_step(recipe, 2550, total) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert learning_rate_at_step(recipe, total, total) == 1e-4
    rates = [learning_rate_at_step(recipe, s, total) for s in range(100, total)]
    assert all(a >= b for a, b in zip(rates, rates[1:])) and min(rates) > 1e-4
    with pytest.raises(ValueError, match=r"sets the learning rate at every step"):
        learning_rate_at(recipe, 0)
    per_epoch = get_recipe("gresnet-mnist", steps_per_epoch=10)
    assert learning_rate_at_step(per_epoch, 25, 100) == learning_rate_at(per_epoch, 2)


def test_bad_language_model_recipe_values_are_refused_with_the_field_named():
    for field, value in (("warmup_steps", -1), ("min_lr", 1.0), ("grad_clip", float("nan")), ("steps_per_epoch", 0)):
        with pytest.raises(ValueError, match=field):
            get_recipe("nanogpt-char", **{field: value})
