"""The papers' recipes as written, and the k-decay rule."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from throughway.models import create_model
from throughway.train import (RunConfig, build_optimizer, get_recipe, learning_rate_at, learning_rate_at_step,
                              param_groups, parameter_groups)
from throughway.train.stack import train_stacked
from throughway.train.loop import set_learning_rate


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


# -- a recipe's counts and rates; the highway authors' solvers (flukeskywalker/highway-networks, read by hand:
# file and line in the comments) -------------------------------------------------------------------------

@pytest.mark.parametrize("change, named", [
    ({"weight_decay": float("nan")}, "weight_decay=nan: must be a finite number ≥ 0"),
    ({"milestone_factor": -0.5}, "milestone_factor=-0.5"),
    ({"epochs": 2.5}, "epochs=2.5: must be a whole number"),
    ({"batch_size": 1.5}, "batch_size=1.5: must be a whole number"),
])
def test_recipes_refuse_fractional_counts_and_non_finite_rates(change, named):
    from throughway.train.recipes import get_recipe

    with pytest.raises(ValueError, match=named):
        get_recipe("gresnet-mnist", **change)


def test_mnist_recipe_is_the_solvers():
    r = get_recipe("highway-conv-mnist")
    # mnist-10layers/mnist_solver.prototxt: 13 NESTEROV, 14 base_lr, 15 momentum, 18-21 multistep gamma 0.1 at
    # 60000 and 120000, 22 weight_decay, 28 max_iter; mnist_network.prototxt 9 batch_size, 13 scale 1/256.
    base_lr, momentum, gamma, steps, weight_decay, max_iter, batch = 0.01, 0.9, 0.1, (60_000, 120_000), 0.001, 180_000, 100
    images = 600 * batch  # test-on-train: test_iter 600 (solver line 5) × batch 100 covers the training set once
    per_epoch = images // batch
    assert (r.optimizer, r.nesterov, r.lr, r.momentum, r.weight_decay, r.batch_size) == \
        ("sgd", True, base_lr, momentum, weight_decay, batch)
    assert r.epochs == max_iter // per_epoch == 300
    assert [learning_rate_at(r, e) for e in (0, steps[0] // per_epoch - 1, steps[0] // per_epoch,
                                             steps[1] // per_epoch - 1, steps[1] // per_epoch, r.epochs - 1)] == \
        pytest.approx([base_lr, base_lr, base_lr * gamma, base_lr * gamma, base_lr * gamma ** 2, base_lr * gamma ** 2])
    assert r.normalize == "pixels/256" and r.augment == "none"
    assert all("line" in note for note in r.notes[:4])  # every value carries its file line


def test_cifar_recipe_is_the_solvers():
    r = get_recipe("highway-conv-cifar")
    # cifar10-19layers/cifar10_solver.prototxt: 13-15 NESTEROV, base_lr 0.025, momentum 0.9; 18-22 multistep
    # gamma 0.1 at 100000, 150000, 175000; 23 weight_decay 0.001; 29 max_iter 200000; test-on-train
    # test_iter 500 (line 5) × batch 100 (network line 9) = 50,000 training images.
    per_epoch = 500
    assert (r.nesterov, r.lr, r.momentum, r.weight_decay, r.batch_size, r.epochs) == \
        (True, 0.025, 0.9, 0.001, 100, 200_000 // per_epoch)
    drops = [e for e in range(1, r.epochs) if learning_rate_at(r, e) < learning_rate_at(r, e - 1)]
    assert drops == [s // per_epoch for s in (100_000, 150_000, 175_000)]
    # The authors' data (tests/test_augment.py): pad 8, GCN + mean image.
    assert (r.augment, r.normalize) == ("crop-flip-8", "gcn-mean-image")


def test_authors_recipes_give_caffes_multipliers():
    model = create_model("highway_conv", arch="mnist-10", width=4)
    recipe = get_recipe("highway-conv-mnist")
    by_param = {}
    for group in parameter_groups(model, recipe):
        for p in group["params"]:
            by_param[id(p)] = (recipe.lr * group["lr_mult"], group["weight_decay"])  # the loop sets lr = lr × lr_mult
    for name, p in model.named_parameters():
        if name.endswith(".bias"):  # every bias: lr_mult 2, decay_mult 0
            assert by_param[id(p)] == (2 * recipe.lr, 0.0), name
        elif name == "head.classifier.weight":  # ip2 weight: decay_mult 10
            assert by_param[id(p)] == (recipe.lr, 10 * recipe.weight_decay), name
        else:
            assert by_param[id(p)] == (recipe.lr, recipe.weight_decay), name


def test_param_rules_first_match_wins_and_k_keeps_its_contract():
    model = create_model("mlp_gated_residual", depth=2, width=4, in_features=6)
    recipe = get_recipe("gresnet-mnist").replace(
        weight_decay=0.1, param_rules=(("blocks.0.*", 3.0, 0.5), ("*", 1.0, 0.0), ("*k", 5.0, 5.0)))
    groups = parameter_groups(model, recipe)
    where = {id(p): g for g in groups for p in g["params"]}
    for name, p in model.named_parameters():
        g = where[id(p)]
        if name.endswith("k"):  # k: never decayed without k_decay, whatever the rules say
            assert (g["lr_mult"], g["weight_decay"]) == (1.0, 0.0), name
        elif name.startswith("blocks.0."):
            assert (g["lr_mult"], g["weight_decay"]) == (3.0, pytest.approx(0.05)), name
        else:
            assert (g["lr_mult"], g["weight_decay"]) == (1.0, 0.0), name
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_lr_mult_scales_the_sgd_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    recipe = get_recipe("highway-conv-mnist").replace(weight_decay=0.0, momentum=0.0, nesterov=False,
                                                      param_rules=(("*.bias", 2.0, 0.0),))
    optimizer = build_optimizer(model, recipe)
    set_learning_rate(optimizer, 0.5)  # what the loop does each epoch
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(4, 3)).square().sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    optimizer.step()
    weight, bias = (b - p.detach() for b, p in zip(before, model.parameters()))
    assert torch.allclose(weight, 0.5 * grads[0]) and torch.allclose(bias, 1.0 * grads[1])


@pytest.mark.parametrize("rule", [("*.bias", -1.0, 0.0), ("*.bias", 2.0), (3, 1.0, 1.0)])
def test_bad_param_rules_name_the_field(rule):
    with pytest.raises(ValueError, match="param_rules"):
        get_recipe("highway-conv-mnist").replace(param_rules=(rule,))


def test_batched_training_refuses_param_rules(tmp_path, fake_mnist_root):
    from throughway.data import load_dataset

    rules = {"param_rules": (("*.bias", 2.0, 0.0),)}
    configs = [RunConfig(model="mlp_plain", depth=2, recipe="highway-mnist", epochs=1, seed=s,
                         model_kwargs={"width": 4}, recipe_overrides=rules) for s in (0, 1)]
    with pytest.raises(ValueError, match="param_rules"):  # its flat optimiser has no per-parameter multipliers
        train_stacked(configs, [tmp_path / "a", tmp_path / "b"], data=load_dataset("mnist"), progress=False)
