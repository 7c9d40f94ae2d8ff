"""The gated augmentation u = g(k)·f(x) + (1 − g(k))·x around any shape-preserving layer.

gated-residual-v1 section 3 ("a layer u = f(x, W) becomes u = g(k) f(x, W) + (1 − g(k)) x").
Applied to a residual block f(x) = f_r(x) + x it reduces to the gated residual block
u = g(k)·f_r(x) + x.
"""

from __future__ import annotations

import torch
from torch import nn

from .gates import ScalarGate

__all__ = ["AugmentedLayer", "augment"]


class AugmentedLayer(nn.Module):
    """u = g(k)·f(x) + (1 − g(k))·x with one scalar gate (attributes `branch`, `shortcut`, `gate`)."""

    def __init__(self, layer: nn.Module, k_init: float = 1.0, gate_function: str = "relu") -> None:
        super().__init__()
        self.branch = layer
        self.shortcut = nn.Identity()
        self.gate = ScalarGate(k_init, gate_function)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate.value()
        out = self.branch(x)
        if out.shape != x.shape:
            raise ValueError(
                f"augment() needs a shape-preserving layer: input {tuple(x.shape)}, output {tuple(out.shape)}"
            )
        return g * out + (1.0 - g) * self.shortcut(x)


def augment(layer: nn.Module, k_init: float = 1.0, gate_function: str = "relu") -> AugmentedLayer:
    """Wrap `layer` as u = g(k)·layer(x) + (1 − g(k))·x (gated-residual-v1 section 3).

    k = 1 reproduces the layer; with g = ReLU any k ≤ 0 gives the identity.
    """
    return AugmentedLayer(layer, k_init=k_init, gate_function=gate_function)
