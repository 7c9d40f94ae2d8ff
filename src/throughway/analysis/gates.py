"""What the gates learned: scalar-gate k per block, and highway transform-gate statistics.

* Gated residual networks (gated-residual-v2 section 3.1, Table 2, figures 5 left and 7): one
  scalar k per block; `k_statistics` gives k by block, the mean k, and the "dead" gates (k ≤ 0
  with g = ReLU, an exact identity whose gradient with respect to k is 0, so the gate never reopens).
* Highway networks (highway paper section 4, figures 2 and 3): transform-gate biases per layer ×
  block, the mean gate output T(x) over a dataset, T(x) and the layer outputs y for one sample,
  and the mean T(x) of one class minus the mean over all samples.

Everything here reads a live model and returns plain tensors / dicts; writing files and drawing
figures is the job of experiments/ and report/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ..layers import HighwayLayer, PlainBlock, PreActBlock, PreActUnit, ResidualBlock, ScalarGate, TransformGate
from ..layers.gated import AugmentedLayer

__all__ = [
    "FAMILIES",
    "model_family",
    "block_scalar_gates",
    "k_statistics",
    "projection_blocks",
    "transform_gate_biases",
    "HighwayGateStats",
    "transform_gate_statistics",
    "highway_sample_activations",
    "highway_layer_change",
]

# What `model_family` can answer, from the blocks' own types.
FAMILIES = ("gated", "residual", "augmented", "highway", "plain")


def _blocks(model: nn.Module) -> nn.ModuleList:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no `blocks` ModuleList; the gate analyses need one (docs/design.md)")
    return blocks


# Residual blocks of every family, fully connected and convolutional: u = gate(f_r(x)) + shortcut(x).
_RESIDUAL_BLOCKS = (ResidualBlock, PreActBlock, PreActUnit)


def model_family(model: nn.Module) -> str:
    """The family of `model`, read from its blocks: "gated" (residual blocks with a scalar gate,
    fully connected or convolutional: mlp_gated_residual, gated preact_resnet / wide_resnet),
    "residual" (the same blocks ungated), "augmented" (layers wrapped by `augment`), "highway"
    (highway layers) or "plain". Raises ValueError for a model without blocks or with mixed kinds
    (e.g. highway_conv, whose stages interleave plain convolutions, pooling and highway layers)."""
    kinds = set()
    for block in _blocks(model):
        if isinstance(block, HighwayLayer):
            kinds.add("highway")
        elif isinstance(block, AugmentedLayer):
            kinds.add("augmented")
        elif isinstance(block, _RESIDUAL_BLOCKS):
            kinds.add("gated" if isinstance(block.gate, ScalarGate) else "residual")
        elif isinstance(block, PlainBlock):
            kinds.add("plain")
        else:
            raise ValueError(f"block of type {type(block).__name__} is not one the analyses know; "
                             f"known: HighwayLayer, AugmentedLayer, ResidualBlock, PreActBlock, PreActUnit, PlainBlock")
    if not kinds:
        raise ValueError("the model has no blocks (depth 0): nothing to analyse")
    if len(kinds) > 1:
        raise ValueError(f"the model mixes block kinds {sorted(kinds)}; the analyses need one family")
    return kinds.pop()


def block_scalar_gates(model: nn.Module) -> list[ScalarGate]:
    """The scalar gate of every block, in block order. Raises ValueError when some block has none
    (an ungated residual, plain or highway net has no k)."""
    gates = []
    for index, block in enumerate(_blocks(model)):
        gate = getattr(block, "gate", None)
        if not isinstance(gate, ScalarGate):
            raise ValueError(f"block {index} ({type(block).__name__}) has no scalar gate k; "
                             f"k statistics need a gated residual or augmented model")
        gates.append(gate)
    return gates


def k_statistics(model: nn.Module) -> dict[str, Any]:
    """Per-block k, g(k), mean k and dead gates of a scalar-gated model.

    Returns {"k": [k per block, block 0 first], "g_k": [g(k)], "k_mean", "k_min", "k_max",
    "gate_function", "dead_blocks": [indices with g(k) = 0 and no gradient: k ≤ 0 for ReLU],
    "num_dead", "num_blocks"}. gated-residual-v2 Table 2 reports the mean k (0.67 at d = 100) and
    figure 5 left the k of each block (indexed from 1 there, from 0 here).
    """
    gates = block_scalar_gates(model)
    ks = [float(g.k.detach().cpu()) for g in gates]
    gk = [float(g.value().detach().cpu()) for g in gates]
    functions = sorted({g.function for g in gates})
    # Only ReLU has a flat zero region: sigmoid never reaches 0 and identity passes gradient through.
    dead = [i for i, (g, k) in enumerate(zip(gates, ks)) if g.function == "relu" and k <= 0.0]
    return {
        "k": ks,
        "g_k": gk,
        "k_mean": sum(ks) / len(ks),
        "k_min": min(ks),
        "k_max": max(ks),
        "gate_function": functions[0] if len(functions) == 1 else functions,
        "dead_blocks": dead,
        "num_dead": len(dead),
        "num_blocks": len(ks),
    }


def projection_blocks(model: nn.Module) -> list[int]:
    """Indices of the blocks whose shortcut is not the identity (a projection or zero padding: the
    blocks that change the feature-map shape, the first of each stage of a CIFAR ResNet). In
    gated-residual-v2 figure 7 (Wide Gated ResNet on CIFAR) the lowest k sit at exactly these blocks.
    Empty for the fully connected families."""
    return [i for i, block in enumerate(_blocks(model))
            if not isinstance(getattr(block, "shortcut", None), (nn.Identity, type(None)))]


def _highway_gates(model: nn.Module) -> list[TransformGate]:
    if model_family(model) != "highway":
        raise ValueError(f"transform-gate statistics need a highway model; this one is {model_family(model)!r}")
    return [cast(TransformGate, block.gate) for block in _blocks(model)]


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
    works for any model whose `blocks` are highway layers, whatever its stem and head."""
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

    for block in _blocks(model):
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
