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
  (`normalize`). Learning-rate steps only set each group's lr: momentum buffers are kept.
* highway-conv-mnist / highway-conv-cifar (highway §3.2, §3.3.2): the solvers the highway authors
  released (flukeskywalker/highway-networks, examples/highways/*/..._solver.prototxt), every value
  with its file and line in the recipe's notes, Caffe's per-parameter lr_mult / decay_mult as
  `param_rules`, and the authors' data: highway-conv-cifar's GCN + mean image, pad-8 crops and
  mirroring (data.augment quotes the lines), and both on every training image (FULL_TRAINING_SET,
  the default of `throughway train`); highway-conv-mnist-ours / highway-conv-cifar-ours: the toolkit's earlier recipes,
  our values where the paper states none.

* vit-mnist (ours): a small vision transformer on MNIST as the field trains one: AdamW (lr 1e-3, weight
  decay 0.05 on weights only), 400 warm-up steps and cosine decay to 1e-5 per step, batch 128, trained
  by `fit` (the image path sets a per-step schedule at every step too).

* nanogpt-char (nanoGPT, Karpathy 2022, config/train_shakespeare_char.py and train.py): the
  character-level Shakespeare recipe of a small GPT, trained by the language-model path (train.lm):
  AdamW (lr 1e-3, β 0.9 / 0.99, weight decay 0.1), linear warm-up over 100 steps and cosine decay
  to 1e-4 per step (`learning_rate_at_step`), gradient clipping at norm 1.0, batch 64, 5,000 steps as
  20 epochs of 250 steps (an epoch is the steps between two evaluations: `steps_per_epoch`).

k (every parameter named `...k`, the scalar gates) is never weight-decayed unless the recipe sets
`k_decay=True` (gated-residual-v2 §3.2, "k decay"). Biases and normalisation parameters (dim < 2)
and embeddings (the weights of every nn.Embedding, minGPT's rule) are not decayed either.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from ..data.augment import AUGMENTATIONS as _AUGMENT_PADDING
from ..layers.blocks import gate_parameters
from ..data.augment import NORMALIZATIONS

__all__ = ["Recipe", "RECIPES", "FULL_TRAINING_SET", "STEP_SCHEDULES", "get_recipe", "list_recipes",
           "parameter_groups", "param_groups", "no_weight_decay_names", "learning_rate_at", "learning_rate_at_step",
           "embedding_parameters"]

OPTIMIZERS = ("nadam", "sgd", "adam", "adamw")
SCHEDULES = ("constant", "exponential", "multistep", "warmup-cosine")
# Schedules set per optimiser step (`learning_rate_at_step`), not per epoch: the language-model path's.
STEP_SCHEDULES = ("warmup-cosine",)
# Per-batch training augmentation ("crop-flip": pad 4, random crop, horizontal flip p = 0.5; "crop-flip-8":
# pad 8) and the normalisation applied once to every split with training-split statistics (per-channel,
# or GCN + mean image), or Caffe's pixels/256 scaling: data.augment defines them.
AUGMENTATIONS = tuple(_AUGMENT_PADDING)


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
    param_rules: tuple[tuple[str, float, float], ...] = ()
    # The language-model path (train.lm): linear warm-up steps and the floor of the cosine decay
    # ("warmup-cosine"), the largest global gradient norm (0: no clipping), and the steps an epoch holds
    # (None: one pass over the training data).
    warmup_steps: int = 0
    min_lr: float = 0.0
    grad_clip: float = 0.0
    steps_per_epoch: int | None = None
    # λ of an L1 pressure on the gates, λ·Σ_branches mean|g|, added to the training loss of the language-
    # model path (ours: learned layer dropping; a relu gate it closes stays closed, its gradient is 0).
    gate_penalty: float = 0.0
    # The gates' learning rate as a multiple of the recipe's (ours; 1: the recipe's own). An Adam-type step
    # moves a parameter by about lr per step whatever its gradient, so a gate that the pressure should close
    # from k = 1 within a short run needs a larger rate.
    gate_lr_mult: float = 1.0
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
        # Counts are whole numbers, and every rate a finite number in its range (epochs=1.5,
        # weight_decay=nan and a negative milestone_factor were once accepted through the Python API).
        for name in ("batch_size", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name}={value!r}: must be a whole number ≥ 1")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum={self.momentum!r}: must be in [0, 1)")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay={self.weight_decay!r}: must be a finite number ≥ 0")
        if not (math.isfinite(self.milestone_factor) and self.milestone_factor > 0):
            raise ValueError(f"milestone_factor={self.milestone_factor!r}: must be a finite number > 0 (the factor "
                             f"the learning rate is multiplied by at each milestone)")
        if not (math.isfinite(self.eps) and self.eps > 0 and len(self.betas) == 2
                and all(math.isfinite(b) and 0.0 <= b < 1.0 for b in self.betas)):
            raise ValueError(f"eps={self.eps!r}, betas={self.betas!r}: eps must be a finite number > 0, each beta in [0, 1)")
        if not 0.0 < self.lr_decay <= 1.0:
            raise ValueError(f"lr_decay={self.lr_decay!r}: must be in (0, 1]")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"augment={self.augment!r}; accepted values: {list(AUGMENTATIONS)}")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize={self.normalize!r}; accepted values: {list(NORMALIZATIONS)}")
        if any(not 0.0 < m < 1.0 for m in self.milestones):
            raise ValueError(f"milestones={self.milestones!r}: fractions of the epochs, each in (0, 1)")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps!r}: must be a whole number ≥ 0")
        if not (isinstance(self.min_lr, (int, float)) and math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"min_lr={self.min_lr!r}: the floor of the cosine decay; must be a number from 0 to lr "
                             f"({self.lr})")
        if not (isinstance(self.grad_clip, (int, float)) and math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ValueError(f"grad_clip={self.grad_clip!r}: the largest global gradient norm; must be a finite "
                             f"number ≥ 0 (0: no clipping)")
        if not (isinstance(self.gate_penalty, (int, float)) and not isinstance(self.gate_penalty, bool)
                and math.isfinite(self.gate_penalty) and self.gate_penalty >= 0):
            raise ValueError(f"gate_penalty={self.gate_penalty!r}: the weight of the L1 pressure on the gates; must be "
                             f"a finite number ≥ 0 (0: none)")
        if not (isinstance(self.gate_lr_mult, (int, float)) and not isinstance(self.gate_lr_mult, bool)
                and math.isfinite(self.gate_lr_mult) and self.gate_lr_mult > 0):
            raise ValueError(f"gate_lr_mult={self.gate_lr_mult!r}: the gates' learning rate over the recipe's; must be "
                             f"a finite number > 0 (1: the recipe's own)")
        if self.steps_per_epoch is not None and (isinstance(self.steps_per_epoch, bool)
                                                 or not isinstance(self.steps_per_epoch, int) or self.steps_per_epoch < 1):
            raise ValueError(f"steps_per_epoch={self.steps_per_epoch!r}: must be a whole number ≥ 1, or None (one "
                             f"pass over the training data)")
        for rule in self.param_rules:
            if (not isinstance(rule, (tuple, list)) or len(rule) != 3 or not isinstance(rule[0], str)
                    or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in rule[1:])):
                raise ValueError(f"param_rules: {rule!r} is not (parameter-name pattern, lr_mult ≥ 0, decay_mult ≥ 0)")

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


_AUTHORS = "flukeskywalker/highway-networks examples/highways/"
_MNIST_SOLVER = _AUTHORS + "mnist-10layers/mnist_solver.prototxt"
_MNIST_NET = _AUTHORS + "mnist-10layers/mnist_network.prototxt"
_CIFAR_SOLVER = _AUTHORS + "{0}-19layers/{0}_solver.prototxt"
_CIFAR_NET = _AUTHORS + "{0}-19layers/{0}_network.prototxt"
# Caffe's lr_mult / decay_mult in the highway authors' nets: biases (of convolutions, of H and of the
# transform gates T, of the classifier) lr ×2 and no decay; the classifier's weight decay ×10; other
# weights ×1 / ×1. Names as highway_conv builds its authors' layouts (head.classifier = the "ip2" layer).
_CAFFE_MULTS: tuple[tuple[str, float, float], ...] = (("head.classifier.weight", 1.0, 10.0), ("*.bias", 2.0, 0.0))

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
        name="highway-conv-cifar", optimizer="sgd", lr=0.025, momentum=0.9, nesterov=True, weight_decay=0.001,
        epochs=400, batch_size=100, schedule="multistep", milestones=(0.5, 0.75, 0.875), milestone_factor=0.1,
        augment="crop-flip-8", normalize="gcn-mean-image", param_rules=_CAFFE_MULTS,
        source="highway §3.3.2 Table 3, the authors' solver: " + _CIFAR_SOLVER.format("cifar10")
               + " (the cifar100 one differs only in its paths and random seed)",
        notes=(f"{_CIFAR_SOLVER.format('cifar10')} lines 13-15: solver_type NESTEROV, base_lr 0.025, momentum 0.9",
               "lines 18-22: lr_policy multistep, gamma 0.1, stepvalue 100000, 150000, 175000; line 23: weight_decay "
               "0.001; line 29: max_iter 200000",
               "epochs: 50,000 training images (the commented test-on-train pass, lines 4-5: test_iter 500 × batch "
               "100; test_interval 500, line 10), so 500 iterations an epoch: 400 epochs, steps after epochs 200, "
               "300, 350 (milestones 0.5, 0.75, 0.875)",
               f"{_CIFAR_NET.format('cifar10')} line 9: batch_size 100; lr_mult / decay_mult: every weight 1 / 1, "
               "every bias 2 / 0 (e.g. lines 71-78, 104-119), the classifier's weight decay_mult 10 (lines 792-795): "
               "param_rules",
               "data: flukeskywalker/highway-networks README.md line 18, 'CIFAR-10/100 were global contrast "
               f"normalized and padded with 8 pixels each side'; {_CIFAR_NET.format('cifar10')} lines 8-16: "
               "source cifar10_full_train_leveldb_padded, mean_file paddedmean.binaryproto, mirror 1, crop_size "
               "32; lines 25-31 and 44-50: the unpadded sets with mean.binaryproto, mirror 0: normalize "
               "gcn-mean-image (GCN per image, the training set's mean image subtracted) and augment "
               "crop-flip-8 (zero padding by 8, random 32×32 crops, mirroring; data.augment); the GCN formula "
               "and the padding value are ours",
               "all 50,000 training images (full_train): `throughway train` trains this recipe on the full "
               "training set unless told --no-train-on-full (FULL_TRAINING_SET)",
               "ours as an option: --augment crop-flip --normalize mean --no-train-on-full (pad 4, per-channel "
               "means, 45,000 images: this recipe's data before it followed the authors' files)",
               "model: highway_conv arch cifar10-19 / cifar100-19 (the authors' nets)"),
    ),
    "highway-conv-cifar-ours": Recipe(
        name="highway-conv-cifar-ours", optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4,
        epochs=200, batch_size=128, schedule="multistep", milestones=(0.5, 0.75), milestone_factor=0.1,
        augment="crop-flip", normalize="mean-std",
        source="highway §3: SGD with momentum, lr λ decayed by γ on a fixed schedule, small translations and "
               "mirroring, contrast normalisation (our values; the recipe called highway-conv-cifar before the "
               "authors' solver was read)",
        notes=("λ, γ, the schedule, weight decay, batch and epochs are not stated in the paper; these values are ours",
               "per-channel mean/std normalisation stands in for the paper's global contrast normalisation"),
    ),
    "highway-conv-mnist": Recipe(
        name="highway-conv-mnist", optimizer="sgd", lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.001,
        epochs=300, batch_size=100, schedule="multistep", milestones=(1 / 3, 2 / 3), milestone_factor=0.1,
        normalize="pixels/256", param_rules=_CAFFE_MULTS,
        source="highway §3.2 Table 1, the authors' solver: " + _MNIST_SOLVER,
        notes=(f"{_MNIST_SOLVER} line 13: solver_type NESTEROV; line 14: base_lr 0.01; line 15: momentum 0.9",
               "lines 18-21: lr_policy multistep, gamma 0.1, stepvalue 60000 and 120000; line 22: weight_decay "
               "0.001; line 28: max_iter 180000",
               "epochs: 60,000 training images (the commented test-on-train pass, lines 4-5: test_iter 600 × batch "
               "100, reading mnist_train_lmdb; test_interval 600, line 10), so 600 iterations an epoch: 300 "
               "epochs, steps after epochs 100 and 200 (milestones 1/3, 2/3); `throughway train` trains this recipe "
               "on all 60,000 unless told --no-train-on-full (FULL_TRAINING_SET)",
               f"{_MNIST_NET} line 9: batch_size 100; lr_mult / decay_mult: every weight 1 / 1, every bias 2 / 0 "
               "(lines 67-74, 99-114 and each highway layer), the classifier's weight decay_mult 10 (lines 465-468): "
               "param_rules",
               "data: line 13, scale 0.00390625 (pixels / 256), no mean file, no mirroring or crops: "
               "normalize pixels/256",
               "Caffe's Nesterov step (src/caffe/solver.cpp lines 592-630: weight decay added to the gradient, "
               "then v = m·v + lr·g, step (1 + m)·v_new − m·v) applies the learning rate inside the momentum "
               "buffer, torch's SGD(nesterov=True) outside it: "
               "the updates are equal while the learning rate is constant and differ only in the steps right "
               "after each of the two learning-rate drops",
               "model: highway_conv arch mnist-10 (the authors' net; width 32 in the file, 16 and 32 in Table 1)"),
    ),
    "nanogpt-char": Recipe(
        name="nanogpt-char", optimizer="adamw", lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1,
        epochs=20, steps_per_epoch=250, batch_size=64, schedule="warmup-cosine", warmup_steps=100, min_lr=1e-4,
        grad_clip=1.0,
        source="nanoGPT (Karpathy 2022) config/train_shakespeare_char.py: batch 64, lr 1e-3, max_iters 5000, "
               "min_lr 1e-4, beta2 0.99, warmup_iters 100, eval_interval 250; train.py: AdamW, weight decay 0.1, "
               "beta1 0.9, grad_clip 1.0, get_lr (linear warm-up, cosine decay to min_lr)",
        notes=("an epoch is 250 steps, nanoGPT's eval_interval: 20 epochs are its 5,000 iterations",
               "weight decay skips embeddings, norms, biases and gates (minGPT's rule and the toolkit's k rule); "
               "nanoGPT decays every tensor of dim ≥ 2, its embeddings included",
               "the model's arguments are the model's (nanoGPT's baby GPT: gpt depth 6, width 384, heads 6, context "
               "256, dropout 0.2)"),
    ),
    "vit-mnist": Recipe(
        name="vit-mnist", optimizer="adamw", lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05,
        epochs=20, batch_size=128, schedule="warmup-cosine", warmup_steps=400, min_lr=1e-5,
        source="ours: a small vision transformer trained from scratch as the field trains one (AdamW with decoupled "
               "weight decay, linear warm-up and cosine decay per step; DeiT, Touvron et al. 2021, and timm's "
               "defaults), at a size that fits the MNIST studies on 2 CPU cores",
        notes=("every value is ours; weight decay 0.05 is DeiT's, on weights only: gates, norms, biases, embeddings "
               "and the model's no_weight_decay() names are not decayed (param_groups' rule)",
               "warm-up: 400 steps, about one epoch of the 50,000 MNIST training images at batch 128; then cosine "
               "decay to 1e-5 at the last step of the run (learning_rate_at_step), so the last epoch's weights are "
               "the trained net",
               "no gradient clipping, dropout, label smoothing or augmentation: the image path (fit) has none of them "
               "here, and MNIST needs none to reach a few per cent"),
    ),
    "highway-conv-mnist-ours": Recipe(
        name="highway-conv-mnist-ours", optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=0.0,
        epochs=40, batch_size=128, schedule="multistep", milestones=(0.5, 0.75), milestone_factor=0.1,
        normalize="mean-std",
        source="highway §3.2 / §3: 10-layer conv highway nets on MNIST, SGD with momentum, step schedule (our "
               "values; the recipe called highway-conv-mnist before the authors' solver was read)",
        notes=("every value is ours: the paper states none for the MNIST conv nets; no augmentation; "
               "mean/std normalisation with training-split statistics",),
    ),
}


# The recipes whose authors trained on every training image (no validation split): `throughway train`
# sets --train-on-full by default for them. Recipe name -> the line that says so.
FULL_TRAINING_SET: dict[str, str] = {
    "highway-conv-cifar": f"{_CIFAR_NET.format('cifar10')} line 8: the TRAIN source is "
                          "cifar10_full_train_leveldb_padded; the solver's test-on-train pass, "
                          f"{_CIFAR_SOLVER.format('cifar10')} lines 4-5: test_iter 500 × batch 100 = 50,000",
    "highway-conv-mnist": f"{_MNIST_NET} line 8: the TRAIN source is mnist_train_lmdb; the solver's "
                          f"test-on-train pass, {_MNIST_SOLVER} lines 4-5: test_iter 600 × batch 100 = 60,000",
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


def _gate_ids(model: nn.Module) -> set[int]:
    # The gates of every residual branch (layers.blocks.find_branches: the toolkit's k and λ, the gates
    # add_gates inserted, timm's LayerScale γ, ConvNeXt's γ); one list for every rule that needs them.
    return {id(p) for p in gate_parameters(model)}


def embedding_parameters(model: nn.Module) -> list[torch.Tensor]:
    """The weight of every nn.Embedding of `model` (token and position embeddings, Hugging Face's wte and
    wpe, and a head tied to one of them): what the parameter groups keep out of weight decay."""
    found: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            found[id(module.weight)] = module.weight
    return list(found.values())


def _undecayed_weights(model: nn.Module) -> set[int]:
    # Tensors of dim ≥ 2 that are never decayed: embeddings (minGPT's rule; a lookup table is not a map
    # whose norm weight decay should bound).
    return {id(p) for p in embedding_parameters(model)}


def no_weight_decay_names(model: nn.Module, no_weight_decay_list: Sequence[str] = ()) -> list[str]:
    """The parameter-name patterns kept out of weight decay by the model itself: what `no_weight_decay()`
    returns on the model and on any submodule that defines it (timm's ViT: cls_token, pos_embed; Swin's
    relative position bias tables), each prefixed with the submodule's qualified name, plus
    `no_weight_decay_list`. Shell-style wildcards match (fnmatch, as timm matches them)."""
    if isinstance(no_weight_decay_list, str) or not isinstance(no_weight_decay_list, (list, tuple, set, frozenset)):
        raise TypeError(f"no_weight_decay_list={no_weight_decay_list!r}: expected a list of parameter names or "
                        f"patterns, e.g. ['pos_embed', '*.relative_position_bias_table']")
    patterns = [str(p) for p in no_weight_decay_list]
    for prefix, module in model.named_modules():
        method = getattr(module, "no_weight_decay", None)
        if callable(method):
            names = method()
            patterns.extend(f"{prefix}.{n}" if prefix else str(n) for n in names)
    return patterns


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def param_groups(model: nn.Module, weight_decay: float = 0.0, *, gate_decay: bool = False,
                 no_weight_decay_list: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Two parameter groups for any torch optimiser, without a recipe: {"params", "weight_decay",
    "group": "decay"} for the weights (dim ≥ 2) and "no_decay" for biases, norms, embeddings (every
    nn.Embedding's weight: `embedding_parameters`), every gate (`layers.gate_parameters`: the toolkit's
    k and λ, the gates `add_gates` inserted, timm's LayerScale γ, ConvNeXt's γ), so the paper's rule
    "no weight decay on k" holds on any network (gate_decay=True decays the gates too:
    gated-residual-v2's "k decay"), and the parameters the model names in its own `no_weight_decay()`
    or that `no_weight_decay_list` names (`no_weight_decay_names`: timm's rule).
    Never sets "lr": the optimiser's own lr applies, e.g.
    `torch.optim.SGD(param_groups(model, weight_decay=5e-4), lr=0.1, momentum=0.9)`. Empty groups
    are dropped; parameters that do not require grad are left out. ValueError for a negative or
    non-finite weight_decay."""
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not math.isfinite(weight_decay) \
            or weight_decay < 0:
        raise ValueError(f"weight_decay={weight_decay!r}: expected a finite number >= 0")
    gates, embeddings = _gate_ids(model), _undecayed_weights(model)
    excluded = no_weight_decay_names(model, no_weight_decay_list)
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in gates:
            decayed = gate_decay
        else:
            decayed = param.dim() >= 2 and id(param) not in embeddings and not _matches(name, excluded)
        (decay if decayed else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": float(weight_decay), "group": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "group": "no_decay"}]
    return [g for g in groups if g["params"]]


def _rule_for(name: str, rules: tuple[tuple[str, float, float], ...]) -> tuple[float, float] | None:
    for pattern, lr_mult, decay_mult in rules:
        if fnmatch.fnmatchcase(name, pattern):
            return float(lr_mult), float(decay_mult)
    return None


def parameter_groups(model: nn.Module, recipe: Recipe) -> list[dict[str, Any]]:
    """Split parameters into decayed (weights, dim ≥ 2) and undecayed (biases, norms, embeddings, and k
    unless `recipe.k_decay`): `param_groups`' rule. Groups that would be empty are dropped; order
    follows `named_parameters`.

    `recipe.param_rules` are Caffe's per-parameter `lr_mult` / `decay_mult` (caffe.proto ParamSpec):
    each (pattern, lr_mult, decay_mult) matches parameter names with shell-style wildcards
    (fnmatch), the first match wins, and a matched parameter gets learning rate lr·lr_mult and
    weight decay weight_decay·decay_mult. Unmatched parameters, and k always (the k_decay contract),
    follow the rule above with lr_mult 1. Gates, and the names the model lists in `no_weight_decay()`,
    are found as in `param_groups`. Each group
    carries "lr_mult" (the training loop sets its lr to the schedule's lr × lr_mult),
    "weight_decay", and a "group" name: "decay", "no_decay", or "lr×a decay×b" for a rule's
    multipliers. No group sets "lr", so a torch optimiser built over these groups trains at the lr
    it is given (`build_optimizer` sets the recipe's)."""
    buckets: dict[tuple[float, float], list[nn.Parameter]] = {}
    gates, embeddings = _gate_ids(model), _undecayed_weights(model)
    excluded = no_weight_decay_names(model)
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in gates:
            key = (float(recipe.gate_lr_mult), 1.0 if recipe.k_decay else 0.0)
        else:
            decayed = param.dim() >= 2 and id(param) not in embeddings and not _matches(name, excluded)
            key = _rule_for(name, recipe.param_rules) or (1.0, 1.0 if decayed else 0.0)
        buckets.setdefault(key, []).append(param)
    groups = []
    for (lr_mult, decay_mult), params in sorted(buckets.items(), key=lambda kv: (kv[0] != (1.0, 1.0), kv[0] != (1.0, 0.0), kv[0])):
        if (lr_mult, decay_mult) == (1.0, 1.0):
            label = "decay"
        elif (lr_mult, decay_mult) == (1.0, 0.0):
            label = "no_decay"
        else:
            label = f"lr×{lr_mult:g} decay×{decay_mult:g}"
        groups.append({"params": params, "weight_decay": recipe.weight_decay * decay_mult, "lr_mult": lr_mult,
                       "group": label})
    return groups


def learning_rate_at(recipe: Recipe, epoch: int) -> float:
    """The learning rate during 0-based `epoch`: constant, lr·decay^epoch, or multiplied by
    `milestone_factor` at each milestone (a fraction of the epochs). A pure function of the epoch,
    so a resumed run follows the same schedule. ValueError for a schedule set per step
    (STEP_SCHEDULES: `learning_rate_at_step`), which an epoch's one rate would misstate."""
    if recipe.schedule in STEP_SCHEDULES:
        raise ValueError(f"recipe {recipe.name!r}: schedule={recipe.schedule!r} sets the learning rate at every step "
                         f"(learning_rate_at_step), which one rate per epoch would misstate; fit and fit_lm (run_training) "
                         f"set it per step, a stack (train_stacked) cannot; accepted here: "
                         f"{[s for s in SCHEDULES if s not in STEP_SCHEDULES]}")
    if recipe.schedule == "constant":
        return recipe.lr
    if recipe.schedule == "exponential":
        return recipe.lr * recipe.lr_decay ** epoch
    passed = sum(1 for m in recipe.milestones if epoch >= round(m * recipe.epochs))
    return recipe.lr * recipe.milestone_factor ** passed


def learning_rate_at_step(recipe: Recipe, step: int, total_steps: int) -> float:
    """The learning rate of 0-based optimiser step `step` of `total_steps`.

    "warmup-cosine" (nanoGPT's train.py `get_lr`): lr·(step + 1)/(warmup_steps + 1) for the first
    `warmup_steps` steps, then cosine decay from lr to `min_lr` over the remaining steps,
    min_lr + ½(1 + cos(π·(step − warmup_steps)/(total_steps − warmup_steps)))·(lr − min_lr), and
    `min_lr` from `total_steps` on. Other schedules are per epoch: `learning_rate_at` of the epoch
    that holds the step, with `recipe.steps_per_epoch` steps an epoch (ValueError without it). A
    pure function of the step, so a resumed run follows the same schedule."""
    if recipe.schedule not in STEP_SCHEDULES:
        if recipe.steps_per_epoch is None:
            raise ValueError(f"recipe {recipe.name!r}: schedule={recipe.schedule!r} is set per epoch; without "
                             f"steps_per_epoch the epoch of step {step} is not known")
        return learning_rate_at(recipe, step // recipe.steps_per_epoch)
    warmup = recipe.warmup_steps
    if step < warmup:
        return recipe.lr * (step + 1) / (warmup + 1)
    if step >= total_steps or total_steps <= warmup:
        return recipe.min_lr
    ratio = (step - warmup) / (total_steps - warmup)
    return recipe.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (recipe.lr - recipe.min_lr)
