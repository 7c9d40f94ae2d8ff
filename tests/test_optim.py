"""train.optim: one update rule (SGD, Adam, NAdam) for one model and for (N, P) stacks of models."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

from throughway import create_model
from throughway.train import build_optimizer, get_recipe
from throughway.train.stacked import StackedModels, StackedOptimizer, StackedStep

KINDS = [
    ("highway-mnist", {"momentum": 0.9, "weight_decay": 1e-3}),   # SGD with momentum and L2 decay
    ("highway-mnist", {"nesterov": True}),                         # SGD, Nesterov
    ("gresnet-mnist", {"optimizer": "adam", "weight_decay": 1e-3}),  # Adam
    ("gresnet-mnist", {}),                                         # NAdam (the MNIST studies')
]


@pytest.mark.parametrize("recipe_name,overrides", KINDS)
def test_one_model_and_a_stack_of_it_take_the_same_steps(recipe_name, overrides):
    # The same model, the same batches: `fit`'s path (a Linear per layer, FlatOptimizer over flat
    # groups) and `train_stacked`'s (baddbmm over a stack of one, StackedOptimizer over its (1, P)
    # matrix) run one update rule (train.optim.update_rows). In float64 the two forwards differ by
    # ~1e-16 rounding; biases feeding a BatchNorm have a mathematically zero gradient, i.e. rounding
    # noise, which Adam/NAdam turn into steps of ~1e-10 in float64 (measured), so the parameters are
    # compared to 1e-9 absolute, six orders of magnitude under one step of lr 0.002. (In float32 the
    # same noise is ~1e-9, comparable to eps, and those biases wander by lr-sized steps: that, not
    # the update rule, is why tests/test_batched.py compares float32 training at a looser tolerance.)
    recipe = get_recipe(recipe_name, **overrides)
    torch.manual_seed(0)
    model = create_model("mlp_gated_residual", depth=4, width=8).double()
    stack = StackedModels([copy.deepcopy(model)])
    step = StackedStep(stack, StackedOptimizer(stack, [recipe]))
    optimizer = build_optimizer(model, recipe)
    generator = torch.Generator().manual_seed(1)
    for _ in range(6):
        x = torch.rand(16, 784, generator=generator, dtype=torch.float64)
        y = torch.randint(0, 10, (16,), generator=generator)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        stacked_loss, _ = step(x.unsqueeze(0), y.unsqueeze(0))  # at the recipe's lr, the optimiser's initial rate
        assert float(stacked_loss[0]) == pytest.approx(float(loss.detach()), rel=1e-12, abs=1e-12)
    stacked = stack.state_dict_of(0)
    compared = 0
    for name, value in model.named_parameters():
        assert torch.allclose(stacked[name].to(value.dtype), value.detach(), rtol=1e-9, atol=1e-9), name
        compared += 1
    assert compared == len(list(model.parameters())) > 10


def test_torchs_lr_schedulers_attach_to_the_recipes_optimizer():
    model = create_model("mlp_plain", depth=2, width=8)
    optimizer = build_optimizer(model, get_recipe("gresnet-mnist"))
    assert isinstance(optimizer, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    model(torch.rand(4, 784)).sum().backward()
    optimizer.step()
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == [0.001] * len(optimizer.param_groups)


def test_an_optimiser_the_rule_does_not_know_is_refused_with_the_accepted_values():
    from throughway.train import FlatOptimizer
    with pytest.raises(ValueError, match="sgd.*adam.*nadam"):
        FlatOptimizer(torch.optim.RMSprop, [{"params": [torch.zeros(2, requires_grad=True)]}], lr=0.1)
    with pytest.raises(ValueError, match="options \\['amsgrad'\\] not known"):
        FlatOptimizer("adam", [{"params": [torch.zeros(2, requires_grad=True)]}], lr=0.1, amsgrad=True)


def test_a_stacks_optimiser_is_a_torch_optimiser_with_one_rate_per_model():
    # issue 21: the members of a stack see a torch.optim.Optimizer as `state.optimizer`, like `fit`'s.
    # Its one group's "lr" is an (N, 1) column: a row's rate moves that model alone, and dropping
    # models (a diverged member leaves the stack) keeps the others' rates and state, row by row.
    recipe = get_recipe("gresnet-mnist")
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(create_model("mlp_gated_residual", depth=2, width=8, in_features=4, num_classes=3))
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 16, 4, generator=generator), torch.randint(0, 3, (3, 16), generator=generator)

    def stepped(lrs):
        stack = StackedModels(copy.deepcopy(models))
        optimizer = StackedOptimizer(stack, [recipe.replace(lr=lr) for lr in lrs])
        StackedStep(stack, optimizer)(x, y)
        return stack, optimizer

    stack, optimizer = stepped([0.002, 0.01, 0.002])
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert optimizer.param_groups[0]["lr"].view(-1).tolist() == pytest.approx([0.002, 0.01, 0.002])
    assert optimizer.param_groups[0]["params"] == [stack.flat]
    assert set(optimizer.state_dict()["state"][0]) == {"step", "mu_product", "exp_avg", "exp_avg_sq"}
    same, _ = stepped([0.002, 0.002, 0.002])
    assert torch.equal(stack.flat[0], same.flat[0]) and torch.equal(stack.flat[2], same.flat[2])
    assert not torch.equal(stack.flat[1], same.flat[1])
    kept_m = optimizer.state[stack.flat]["exp_avg"][[0, 1]].clone()
    stack.select([0, 1])
    optimizer.select([0, 1])
    assert optimizer.param_groups[0]["params"] == [stack.flat] and len(optimizer.state) == 1
    assert optimizer.param_groups[0]["lr"].view(-1).tolist() == pytest.approx([0.002, 0.01])
    assert torch.equal(optimizer.state[stack.flat]["exp_avg"], kept_m)
    StackedStep(stack, optimizer)(x[:2], y[:2])
    assert optimizer.step_count == 2
