"""FlatOptimizer: the one update rule (train.optim) on one flat vector per group gives torch's own updates.

The comparisons with torch.optim run in float64. The rule fuses NAdam's two divisions into one and
Adam's division into a multiply (train.optim), which differs from torch by float32 rounding (an ulp
per step); biases feeding a BatchNorm have a gradient that is mathematically zero, so in float32
their gradient is rounding noise that NAdam/Adam normalise to lr-sized steps of random sign, and
any rounding difference sends them elsewhere. In float64 that noise is ~1e-17, far under eps: those
biases wander by ~1e-10 in both, every other parameter agrees with torch's to 1e-15 (measured after
20 steps), so the tests allow 1e-9 absolute, six orders of magnitude under one step of lr 0.002."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

from throughway import create_model
from throughway.train import FlatOptimizer, build_optimizer, get_recipe, parameter_groups

CASES = [
    ("mlp_gated_residual", "gresnet-mnist", {}),                                      # NAdam, BatchNorm, k
    ("mlp_gated_residual", "gresnet-mnist", {"weight_decay": 1e-3, "k_decay": True}),  # two groups decayed
    ("mlp_highway", "highway-mnist", {"weight_decay": 1e-3}),                          # SGD + momentum
    ("mlp_plain", "highway-mnist", {"nesterov": True}),                                # SGD + Nesterov
    ("mlp_residual", "gresnet-mnist", {"optimizer": "adam"}),                          # Adam
    ("mlp_residual", "gresnet-mnist", {"optimizer": "adamw", "weight_decay": 0.1}),    # AdamW, decoupled decay
]


def _torch_optimizer(model, recipe):
    groups = parameter_groups(model, recipe)
    if recipe.optimizer == "nadam":
        return torch.optim.NAdam(groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps,
                                 momentum_decay=recipe.momentum_decay)
    if recipe.optimizer == "adam":
        return torch.optim.Adam(groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps)
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps)
    return torch.optim.SGD(groups, lr=recipe.lr, momentum=recipe.momentum, nesterov=recipe.nesterov)


def _train(model, optimizer, steps, lr_at=None):
    torch.manual_seed(1)
    for step in range(steps):
        x, y = torch.rand(32, 784, dtype=next(model.parameters()).dtype), torch.randint(0, 10, (32,))
        if lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("name,recipe_name,overrides", CASES)
def test_flat_updates_equal_torchs_per_tensor_updates(name, recipe_name, overrides):
    recipe = get_recipe(recipe_name, **overrides)
    torch.manual_seed(0)
    flat_model = create_model(name, depth=4, width=12).double()
    torch_model = copy.deepcopy(flat_model)
    flat = build_optimizer(flat_model, recipe)
    reference = _torch_optimizer(torch_model, recipe)
    assert flat.kind == recipe.optimizer and isinstance(flat, torch.optim.Optimizer)
    lr_at = lambda step: recipe.lr * (0.5 if step >= 10 else 1.0)  # noqa: E731 - a learning-rate step midway
    _train(flat_model, flat, 20, lr_at)
    _train(torch_model, reference, 20, lr_at)
    for (pname, a), b in zip(flat_model.named_parameters(), torch_model.parameters()):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-9), pname
    # The per-parameter state is torch's, seen through views of the flat buffers.
    p, q = next(flat_model.parameters()), next(torch_model.parameters())
    for key, value in reference.state[q].items():
        mine = flat.state_of(p)[key]
        assert torch.allclose(torch.as_tensor(mine, dtype=torch.float64), torch.as_tensor(value, dtype=torch.float64),
                              rtol=1e-6, atol=1e-8), key


def test_state_dict_round_trip_continues_identically():
    recipe = get_recipe("gresnet-mnist")
    torch.manual_seed(0)
    model = create_model("mlp_gated_residual", depth=4, width=12)
    optimizer = build_optimizer(model, recipe)
    _train(model, optimizer, 5)
    twin = copy.deepcopy(model)
    restored = build_optimizer(twin, recipe)
    restored.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    _train(model, optimizer, 5)
    _train(twin, restored, 5)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))


def test_parameters_changed_between_steps_are_read_again():
    # A checkpoint load or a divergence restore changes the model's tensors: the next step starts there.
    recipe = get_recipe("highway-mnist", momentum=0.0)
    model = create_model("mlp_plain", depth=2, width=8)
    optimizer = build_optimizer(model, recipe)
    _train(model, optimizer, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.25)
    loss = F.cross_entropy(model(torch.rand(4, 784)), torch.tensor([0, 1, 2, 3]))
    optimizer.zero_grad()
    loss.backward()
    expected = [(p - recipe.lr * p.grad).detach().clone() for p in model.parameters()]
    optimizer.step()
    assert all(torch.allclose(p, e) for p, e in zip(model.parameters(), expected))


def test_bad_state_and_groups_are_refused_clearly():
    model = create_model("mlp_plain", depth=2, width=8)
    optimizer = build_optimizer(model, get_recipe("gresnet-mnist"))
    per_tensor = torch.optim.NAdam(model.parameters(), lr=0.002)
    with pytest.raises(ValueError, match="one flat vector per group"):
        optimizer.load_state_dict(per_tensor.state_dict())
    with pytest.raises(ValueError, match="empty"):
        FlatOptimizer(torch.optim.SGD, [{"params": []}], lr=0.1)
    with pytest.raises(ValueError, match="mixes dtypes"):
        FlatOptimizer(torch.optim.SGD, [{"params": [torch.zeros(2, requires_grad=True),
                                                    torch.zeros(2, dtype=torch.float64, requires_grad=True)]}], lr=0.1)
    with pytest.raises(KeyError):
        optimizer.state_of(torch.zeros(1))


@pytest.mark.parametrize("recipe_name,overrides", [("gresnet-mnist", {}), ("highway-mnist", {"weight_decay": 1e-3})])
def test_a_per_tensor_torch_state_is_flattened_on_load(recipe_name, overrides):
    # Checkpoints of earlier versions hold torch's per-tensor state: they resume to the same numbers.
    recipe = get_recipe(recipe_name, **overrides)
    torch.manual_seed(0)
    model = create_model("mlp_gated_residual", depth=4, width=12).double()   # 0-d k beside 1-d and 2-d tensors
    reference_model = copy.deepcopy(model)
    reference = _torch_optimizer(reference_model, recipe)
    _train(reference_model, reference, 5)
    model.load_state_dict(reference_model.state_dict())
    flat = build_optimizer(model, recipe)
    flat.load_state_dict(copy.deepcopy(reference.state_dict()))
    _train(reference_model, reference, 5)
    _train(model, flat, 5)
    for a, b in zip(model.parameters(), reference_model.parameters()):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-9)
