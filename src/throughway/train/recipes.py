"""The papers' training recipes, by name, with their optimisers, schedules and parameter groups.

* gresnet-mnist (gated-residual-v1 §4.1, gated-residual-v2 §3.1): "Adam with Nesterov momentum
  (Dozat) for a total of 100 epochs using mini-batches of size 128. No learning rate decay was used:
  we kept the learning rate and momentum fixed to 0.002 and 0.9". The paper ran Keras, whose Nadam
  (lr 0.002, β1 0.9, β2 0.999, ε 1e-8, schedule_decay 0.004) is exactly torch.optim.NAdam with
  momentum_decay 0.004 (Dozat's momentum schedule), which is used here.
* highway-mnist (highway paper §3.1): SGD with momentum and an exponentially decaying learning rate;
  the paper searched initial learning rate, momentum and decay factor at random, so they are
  arguments. The defaults (lr 0.01, momentum 0.9, decay 0.98 per epoch, batch 100, 100 epochs) are
  ours: the paper states none of them.

* preact-cifar / wrn-cifar (gated-residual-v2 §3.2): the CIFAR recipes of pre-activation and wide
  ResNets, with on-device pad-4 crops and flips (`augment`) and per-channel normalisation
  (`normalize`); highway-conv-cifar / highway-conv-mnist: the conv highway nets (values ours where
  the paper states none). Learning-rate steps only set each group's lr: momentum buffers are kept.

k (every parameter named `...k`, the scalar gates) is never weight-decayed unless the recipe sets
`k_decay=True` (gated-residual-v2 §3.2, "k decay"). Biases and BatchNorm parameters (dim < 2) are
not decayed either.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .flat import FlatOptimizer

__all__ = ["Recipe", "RECIPES", "get_recipe", "list_recipes", "parameter_groups", "build_optimizer",
           "learning_rate_at"]

OPTIMIZERS = ("nadam", "sgd", "adam")
SCHEDULES = ("constant", "exponential", "multistep")
# Per-batch training augmentation ("crop-flip": pad 4, random crop, horizontal flip p = 0.5) and the
# per-channel normalisation applied once to every split with training-split statistics (data.augment).
AUGMENTATIONS = ("none", "crop-flip")
NORMALIZATIONS = ("none", "mean", "mean-std")


@dataclass(frozen=True)
class Recipe:
    """Everything that defines how a model is trained. Frozen: derive variants with `replace`."""

    name: str
    optimizer: str
    lr: float
    epochs: int
    batch_size: int
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum_decay: float = 0.004
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    k_decay: bool = False
    schedule: str = "constant"
    lr_decay: float = 1.0
    milestones: tuple[float, ...] = ()
    milestone_factor: float = 0.1
    augment: str = "none"
    normalize: str = "none"
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r}; accepted values: {list(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}; accepted values: {list(SCHEDULES)}")
        for name in ("lr", "batch_size", "epochs"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r}: must be a positive number")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum={self.momentum!r}: must be in [0, 1)")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay!r}: must be ≥ 0")
        if not 0.0 < self.lr_decay <= 1.0:
            raise ValueError(f"lr_decay={self.lr_decay!r}: must be in (0, 1]")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"augment={self.augment!r}; accepted values: {list(AUGMENTATIONS)}")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize={self.normalize!r}; accepted values: {list(NORMALIZATIONS)}")
        if any(not 0.0 < m < 1.0 for m in self.milestones):
            raise ValueError(f"milestones={self.milestones!r}: fractions of the epochs, each in (0, 1)")

    def replace(self, **changes: Any) -> "Recipe":
        """A copy with `changes` applied (validated); unknown field names raise a TypeError."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"recipe {self.name!r} has no fields {unknown}; fields: {sorted(known)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a JSON-able dict (tuples as lists)."""
        return dataclasses.asdict(self)


RECIPES: dict[str, Recipe] = {
    "gresnet-mnist": Recipe(
        name="gresnet-mnist", optimizer="nadam", lr=0.002, betas=(0.9, 0.999), eps=1e-8, momentum_decay=0.004,
        epochs=100, batch_size=128, schedule="constant",
        source="gated-residual-v2 §3.1 / gated-residual-v1 §4.1: Nadam, lr 0.002, β1 0.9, batch 128, 100 epochs, no decay",
        notes=("β2 0.999, ε 1e-8 and momentum_decay 0.004 are Keras Nadam's defaults, which the paper's Keras code used",),
    ),
    "highway-mnist": Recipe(
        name="highway-mnist", optimizer="sgd", lr=0.01, momentum=0.9, epochs=100, batch_size=100,
        schedule="exponential", lr_decay=0.98,
        source="highway §3.1: SGD with momentum, exponentially decaying learning rate (lr, momentum, decay searched)",
        notes=("lr, momentum, lr_decay, batch size and epochs are not stated in the paper; the defaults are ours",),
    ),
    "preact-cifar": Recipe(
        name="preact-cifar", optimizer="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4,
        epochs=200, batch_size=128, schedule="multistep", milestones=(0.5, 0.75), milestone_factor=0.1,
        augment="crop-flip", normalize="mean",
        source="gated-residual-v2 §3.2: pre-activation ResNets, SGD Nesterov 0.9, lr 0.1 ÷10 at 50% and 75%, "
               "wd 1e-4, BN momentum 0.9, mean subtraction, pad 4 + crop + flip, batch 128",
        notes=("200 epochs: gated-residual-v1 §4.2 ('ResNets were trained for 200 epochs'); v2 does not say",
               "BN momentum 0.9 in the paper's (Torch/Keras) convention is PyTorch's momentum 0.1, the models' default",
               "--k-decay applies the same weight decay (1e-4) to k, the paper's 'k decay' column"),
    ),
    "wrn-cifar": Recipe(
        name="wrn-cifar", optimizer="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4,
        epochs=200, batch_size=128, schedule="multistep", milestones=(0.3, 0.6, 0.8), milestone_factor=0.2,
        augment="crop-flip", normalize="mean-std",
        source="gated-residual-v2 §3.2: Wide ResNets, lr 0.1 ×0.2 at 30%, 60%, 80%, wd 5e-4, mean/std "
               "normalisation, dropout 0.3 between convolutions, otherwise as preact-cifar",
        notes=("dropout is the model's argument (wide_resnet dropout=0.3)",
               "200 epochs as Zagoruyko & Komodakis 2016; gated-residual-v2 does not state the epochs",
               "--k-decay applies the same weight decay (5e-4) to k"),
    ),
    "highway-conv-cifar": Recipe(
        name="highway-conv-cifar", optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4,
        epochs=200, batch_size=128, schedule="multistep", milestones=(0.5, 0.75), milestone_factor=0.1,
        augment="crop-flip", normalize="mean-std",
        source="highway §3: SGD with momentum, lr λ decayed by γ on a fixed schedule, small translations and "
               "mirroring, contrast normalisation",
        notes=("λ, γ, the schedule, weight decay, batch and epochs are not stated in the paper; these values are ours",
               "per-channel mean/std normalisation stands in for the paper's global contrast normalisation"),
    ),
    "highway-conv-mnist": Recipe(
        name="highway-conv-mnist", optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=0.0,
        epochs=40, batch_size=128, schedule="multistep", milestones=(0.5, 0.75), milestone_factor=0.1,
        normalize="mean-std",
        source="highway §3.2 / §3: 10-layer conv highway nets on MNIST, SGD with momentum, step schedule",
        notes=("every value is ours: the paper states none for the MNIST conv nets; no augmentation; "
               "mean/std normalisation with training-split statistics",),
    ),
}


def list_recipes() -> list[Recipe]:
    """Every registered recipe, sorted by name."""
    return [RECIPES[n] for n in sorted(RECIPES)]


def get_recipe(name: str, **overrides: Any) -> Recipe:
    """The recipe `name` with `overrides` applied (e.g. `get_recipe("highway-mnist", lr=0.05)`)."""
    if name not in RECIPES:
        raise KeyError(f"recipe={name!r} is not known; accepted values: {sorted(RECIPES)}")
    recipe = RECIPES[name]
    return recipe.replace(**overrides) if overrides else recipe


def _is_gate_k(name: str) -> bool:
    return name == "k" or name.endswith(".k")


def parameter_groups(model: nn.Module, recipe: Recipe) -> list[dict[str, Any]]:
    """Split parameters into decayed (weights, dim ≥ 2) and undecayed (biases, norms, and k unless
    `recipe.k_decay`). Groups that would be empty are dropped; order follows `named_parameters`."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if _is_gate_k(name):
            (decay if recipe.k_decay else no_decay).append(param)
        elif param.dim() >= 2:
            decay.append(param)
        else:
            no_decay.append(param)
    groups = [{"params": decay, "weight_decay": recipe.weight_decay, "group": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "group": "no_decay"}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, recipe: Recipe) -> FlatOptimizer:
    """The recipe's optimiser over `parameter_groups(model, recipe)`: torch.optim's NAdam, Adam or
    SGD, run on one flat vector per group (`FlatOptimizer`: the same update, without torch's
    per-tensor overhead, which dominated the step of the deep MLPs); `.inner` is the torch optimiser."""
    groups = parameter_groups(model, recipe)
    if recipe.optimizer == "nadam":
        return FlatOptimizer(torch.optim.NAdam, groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps,
                             momentum_decay=recipe.momentum_decay)
    if recipe.optimizer == "adam":
        return FlatOptimizer(torch.optim.Adam, groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps)
    return FlatOptimizer(torch.optim.SGD, groups, lr=recipe.lr, momentum=recipe.momentum, nesterov=recipe.nesterov)


def learning_rate_at(recipe: Recipe, epoch: int) -> float:
    """The learning rate during 0-based `epoch`: constant, lr·decay^epoch, or multiplied by
    `milestone_factor` at each milestone (a fraction of the epochs). A pure function of the epoch,
    so a resumed run follows the same schedule."""
    if recipe.schedule == "constant":
        return recipe.lr
    if recipe.schedule == "exponential":
        return recipe.lr * recipe.lr_decay ** epoch
    passed = sum(1 for m in recipe.milestones if epoch >= round(m * recipe.epochs))
    return recipe.lr * recipe.milestone_factor ** passed
