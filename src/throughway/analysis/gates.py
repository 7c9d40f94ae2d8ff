"""What the gates learned: scalar-gate k per block, any gate's value g, and highway transform-gate statistics.

* Gated residual networks (gated-residual-v2 section 3.1, Table 2, figures 5 left and 7): one
  scalar k per block; `k_statistics` gives k by block, the mean k, and the "dead" gates (g(k)
  exactly 0: k ≤ 0 with g = ReLU, an exact identity whose gradient with respect to k is 0, so the
  gate never reopens). `gate_statistics` gives g for any gate with a `value()`, scalar (k, ReZero's
  α) or vector (LayerScale's λ), with dead (g exactly 0) and negative gates counted apart.
* Highway networks (highway paper section 4, figures 2 and 3): transform-gate biases per layer ×
  block, the mean gate output T(x) over a dataset, T(x) and the layer outputs y for one sample,
  and the mean T(x) of one class minus the mean over all samples.

The blocks are found by type wherever they sit in the model (`analysis.blocks.find_blocks`), so
all of this works on a researcher's own nn.Module as on the registry's models.

Everything here reads a live model and returns plain tensors / dicts; writing files and drawing
figures is the job of experiments/ and report/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ..layers import ScalarGate, TransformGate
from ..layers.blocks import iter_blocks
from .blocks import FAMILIES, no_blocks_error, block_kind, find_branches, gate_value, identity_shortcut

__all__ = [
    "FAMILIES",
    "model_family",
    "k_statistics",
    "gate_statistics",
    "projection_blocks",
    "transform_gate_biases",
    "HighwayGateStats",
    "transform_gate_statistics",
    "highway_sample_activations",
    "highway_layer_change",
]


def _blocks(model: nn.Module) -> dict[str, nn.Module]:
    blocks = dict(iter_blocks(model))
    if not blocks:
        raise no_blocks_error(model)
    return blocks


def model_family(model: nn.Module) -> str:
    """The family of `model` (one of FAMILIES), read from the types of its blocks wherever they sit
    (`find_blocks`): "gated" (residual blocks with a gate that has a value, scalar or vector, fully
    connected or convolutional), "residual" (the same blocks ungated), "augmented" (layers wrapped by
    `augment`), "highway" (highway layers; highway_conv's plain convolutions between stages are not
    blocks) or "plain". Raises ValueError for a model without blocks or with blocks of several
    kinds, naming one block of each."""
    kinds: dict[str, str] = {}
    for name, block in _blocks(model).items():
        kinds.setdefault(block_kind(block), name)
    if len(kinds) > 1:
        raise ValueError(f"the model mixes block kinds {sorted(kinds)} (e.g. "
                         + ", ".join(f"{name!r}: {kind}" for kind, name in sorted(kinds.items()))
                         + "); the analyses need one family")
    return next(iter(kinds))


def _gated_branches(model: nn.Module, scalar: bool) -> dict[str, Any]:
    """The gate of every residual branch (`find_branches`), keyed by branch name, in order; ValueError
    naming the first branch without a gate with a value (or, with scalar=True, without a scalar k)."""
    _blocks(model)
    gates = {}
    for name, ref in find_branches(model).items():
        if ref.gate is None or (scalar and not isinstance(ref.gate, ScalarGate)):
            block = model.get_submodule(ref.block)
            if scalar:
                raise ValueError(f"block {name!r} ({type(block).__name__}) has no scalar gate k; k statistics need a "
                                 f"gated residual or augmented model"
                                 + (" (its gate is a vector: use gate_statistics)" if ref.gate is not None else ""))
            raise ValueError(f"branch {name!r} ({type(block).__name__}) has no gate with a value; gate statistics "
                             f"need gated branches (throughway.add_gates puts one in every residual branch)")
        gates[name] = ref.gate
    return gates


def _is_dead(g: torch.Tensor) -> bool:
    # g exactly 0 everywhere: the block is an exact identity (u = shortcut(x)), removable without change.
    return bool((g == 0).all())


def _is_negative(g: torch.Tensor) -> bool:
    # every entry below 0: the branch enters with its sign flipped (ReZero's α < 0); an open gate, not dead.
    return bool((g < 0).all())


def k_statistics(model: nn.Module) -> dict[str, Any]:
    """Per-block k, g(k), mean k, dead and negative gates of a scalar-gated model, wherever its blocks
    sit in the module tree.

    Returns {"blocks": [qualified names], "k": [k per block, block 0 first], "g_k": [g(k)], "k_mean",
    "k_min", "k_max", "gate_function", "dead_blocks": [positions (from 0) with g(k) exactly 0],
    "negative_blocks": [positions with g(k) < 0], "num_dead", "num_blocks"}. A dead gate makes its
    block an exact identity: k ≤ 0 with g = ReLU (then the gradient with respect to k is 0 too, so the
    gate never reopens), or an identity-function gate (ReZero) at exactly 0; a sigmoid gate is never
    dead. A negative g (ReZero's α < 0) is an open gate, counted in "negative_blocks".
    gated-residual-v2 Table 2 reports the mean k (0.67 at d = 100) and figure 5 left the k of each
    block (indexed from 1 there, from 0 here).
    """
    by_branch = _gated_branches(model, scalar=True)
    names = list(by_branch)
    gates = cast(list[ScalarGate], list(by_branch.values()))
    ks = [float(g.k.detach().cpu()) for g in gates]
    values = [g.value().detach().cpu() for g in gates]
    functions = sorted({g.function for g in gates})
    return {
        "blocks": names,
        "k": ks,
        "g_k": [float(v) for v in values],
        "k_mean": sum(ks) / len(ks),
        "k_min": min(ks),
        "k_max": max(ks),
        "gate_function": functions[0] if len(functions) == 1 else functions,
        "dead_blocks": [i for i, v in enumerate(values) if _is_dead(v)],
        "negative_blocks": [i for i, v in enumerate(values) if _is_negative(v)],
        "num_dead": sum(_is_dead(v) for v in values),
        "num_blocks": len(ks),
    }


def gate_statistics(model: nn.Module) -> dict[str, Any]:
    """The gate value g of every gated block, scalar or vector, wherever the blocks sit: the
    statistics that compare the 2017 gate with ReZero's α and LayerScale's λ (the gate-family study).

    Returns {"blocks": [qualified names], "g_mean": [mean g per block], "g_abs_mean": [mean |g|:
    |g(k)| for a scalar, mean |λ| for a vector], "g_size": [entries of g: 1 for a scalar, C for a
    vector], "mean_g", "mean_abs_g" (over blocks), "dead_blocks": [positions (from 0) where g is
    exactly 0 in every entry: the block is an exact identity], "negative_blocks": [positions where
    every entry of g is < 0: open, with the branch's sign flipped], "num_dead", "num_negative",
    "num_blocks"}. ValueError naming a block without a gate value.
    """
    gates = _gated_branches(model, scalar=False)
    values = [gate_value(gate) for gate in gates.values()]
    means = [float(v.mean()) for v in values]
    magnitudes = [float(v.abs().mean()) for v in values]
    dead = [i for i, v in enumerate(values) if _is_dead(v)]
    negative = [i for i, v in enumerate(values) if _is_negative(v)]
    return {
        "blocks": list(gates),
        "g_mean": means,
        "g_abs_mean": magnitudes,
        "g_size": [v.numel() for v in values],
        "mean_g": sum(means) / len(means),
        "mean_abs_g": sum(magnitudes) / len(magnitudes),
        "dead_blocks": dead,
        "negative_blocks": negative,
        "num_dead": len(dead),
        "num_negative": len(negative),
        "num_blocks": len(values),
    }


def projection_blocks(model: nn.Module) -> list[int]:
    """Positions (from 0, in `find_blocks` order) of the blocks whose shortcut is not the identity (a
    projection or zero padding: the blocks that change the feature-map shape, the first of each stage
    of a CIFAR ResNet). In gated-residual-v2 figure 7 (Wide Gated ResNet on CIFAR) the lowest k sit at
    exactly these blocks. Empty for the fully connected families."""
    return [i for i, block in enumerate(_blocks(model).values())
            if block_kind(block) != "plain" and not identity_shortcut(block)]


def _highway_gates(model: nn.Module) -> list[TransformGate]:
    family = model_family(model)
    if family != "highway":
        raise ValueError(f"transform-gate statistics need a highway model; this one is {family!r}")
    gates = {name: cast(TransformGate, block.gate) for name, block in _blocks(model).items()}
    shapes = {name: tuple(cast(torch.Tensor, gate.linear.bias).shape) for name, gate in gates.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"transform-gate maps stack highway layers of one width; this model's differ "
                         f"({', '.join(f'{n!r}: {s[0]}' for n, s in list(shapes.items())[:4])}, ...)")
    return list(gates.values())


def transform_gate_biases(model: nn.Module) -> torch.Tensor:
    """b_T of every highway layer as a (layers, blocks) float tensor on the CPU (highway figure 2, column 1)."""
    return torch.stack([cast(torch.Tensor, g.linear.bias).detach().float().cpu() for g in _highway_gates(model)])


@dataclass(frozen=True)
class HighwayGateStats:
    """Transform-gate outputs averaged over a dataset (highway figures 2 and 3).

    mean: (layers, blocks) mean of T(x) over all samples; class_means: (classes, layers, blocks)
    mean of T(x) over the samples of each class (NaN for a class without samples); counts: samples
    per class.
    """

    mean: torch.Tensor
    class_means: torch.Tensor
    counts: torch.Tensor

    def class_difference(self, label: int) -> torch.Tensor:
        """Mean T(x) over class `label` minus the mean over all samples (highway figure 3)."""
        if not 0 <= label < self.class_means.shape[0]:
            raise ValueError(f"class={label}: accepted values 0 .. {self.class_means.shape[0] - 1}")
        return self.class_means[label] - self.mean


def _trace_highway(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `model` on x and return (T(x), y) of every highway layer, each (N, layers, blocks).

    Forward hooks on each layer and its gate record them during an ordinary forward pass, so this
    works for any model whose blocks are highway layers, wherever they sit, whatever its stem and head."""
    t, _, out = _trace_highway_io(model, x)
    return t, out


def _trace_highway_io(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like `_trace_highway`, also returning each layer's input: (T(x), x_l, y_l), each (N, layers, blocks)."""
    gates: list[torch.Tensor] = []
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    handles = []

    # A forward hook that returns something replaces the module's output: these return None.
    def record_gate(_module: nn.Module, _args: tuple, out: torch.Tensor) -> None:
        gates.append(out.flatten(1))

    def record_layer(_module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        inputs.append(args[0].flatten(1))
        outputs.append(out.flatten(1))

    for block in _blocks(model).values():
        handles.append(cast(nn.Module, block.gate).register_forward_hook(record_gate))
        handles.append(block.register_forward_hook(record_layer))
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(gates, dim=1), torch.stack(inputs, dim=1), torch.stack(outputs, dim=1)


@torch.no_grad()
def transform_gate_statistics(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                              batch_size: int = 5000) -> HighwayGateStats:
    """Mean transform-gate output over all of (x, y), and per class, in eval mode (highway figure 2
    column 2 and figure 3). Accumulates in float64 batch by batch, so the whole training set fits."""
    _highway_gates(model)
    was_training = model.training
    model.eval()
    try:
        total: torch.Tensor | None = None
        per_class = torch.zeros(0, dtype=torch.float64)  # shaped at the first batch
        counts = torch.zeros(num_classes, dtype=torch.float64)
        for start in range(0, len(x), batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size].cpu()
            t, _ = _trace_highway(model, xb)
            t = t.double().cpu()
            if total is None:
                total = torch.zeros(t.shape[1:], dtype=torch.float64)
                per_class = torch.zeros((num_classes, *t.shape[1:]), dtype=torch.float64)
            total += t.sum(0)
            per_class.index_add_(0, yb, t)
            counts += torch.bincount(yb, minlength=num_classes).double()
        if total is None:
            raise ValueError("transform_gate_statistics needs at least one sample")
        mean = total / counts.sum()
        class_means = per_class / counts.view(-1, *([1] * (per_class.dim() - 1)))
        return HighwayGateStats(mean.float(), class_means.float(), counts.long())
    finally:
        model.train(was_training)


@torch.no_grad()
def highway_sample_activations(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """T(x) and the layer outputs y for ONE sample x (shape of one input, no batch dimension), each
    (layers, blocks), in eval mode (highway figure 2 columns 3 and 4)."""
    _highway_gates(model)
    was_training = model.training
    model.eval()
    try:
        t, out = _trace_highway(model, x.unsqueeze(0))
        return t[0].float().cpu(), out[0].float().cpu()
    finally:
        model.train(was_training)


@torch.no_grad()
def highway_layer_change(model: nn.Module, x: torch.Tensor, batch_size: int = 5000) -> torch.Tensor:
    """Mean |y_l − x_l| over samples and blocks for every highway layer l, a (layers,) tensor, in
    eval mode: how much each layer changes its input. The highway paper (§4, figure 2 column 4)
    observes that "most of the change in outputs happens in the early layers (≈ 15 for MNIST)"."""
    _highway_gates(model)
    was_training = model.training
    model.eval()
    try:
        total, n = None, 0
        for start in range(0, len(x), batch_size):
            _, inp, out = _trace_highway_io(model, x[start:start + batch_size])
            change = (out - inp).abs().double().mean(dim=2).sum(dim=0).cpu()
            total = change if total is None else total + change
            n += inp.shape[0]
        if total is None:
            raise ValueError("highway_layer_change needs at least one sample")
        return (total / n).float()
    finally:
        model.train(was_training)
