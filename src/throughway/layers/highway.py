"""Highway layers: y = H(x)·T(x) + x·(1 − T(x)) (highway paper eq. 3).

`HighwayLayer` is generic in H and T (dense or convolutional); `dense_highway_layer` builds the
fully connected one of the paper's section 3.1, H = activation(W_H x + b_H), T = σ(W_T x + b_T).
"""

from __future__ import annotations

import torch
from torch import nn

from .dense import make_activation
from .gates import TransformGate

__all__ = ["HighwayLayer", "dense_highway_layer"]


class HighwayLayer(nn.Module):
    """y = H(x)·T(x) + x·(1 − T(x)) with `branch` = H, `gate` = T, `shortcut` = identity.

    T(x) = 0 gives y = x and T(x) = 1 gives y = H(x) (highway paper eq. 4).
    """

    def __init__(self, branch: nn.Module, gate: TransformGate) -> None:
        super().__init__()
        self.branch = branch
        self.gate = gate
        self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.gate(x)
        return self.branch(x) * t + self.shortcut(x) * (1.0 - t)


def dense_highway_layer(features: int, activation: str = "relu", gate_bias: float = -2.0) -> HighwayLayer:
    """A fully connected highway layer of `features` blocks with H's `activation` ("relu" or "tanh")
    and transform-gate bias initialised to `gate_bias` (the paper searches −1 to −10)."""
    if activation not in ("relu", "tanh"):
        raise ValueError(f"activation={activation!r}; accepted values for H: ['relu', 'tanh']")
    branch = nn.Sequential(nn.Linear(features, features), make_activation(activation))
    return HighwayLayer(branch, TransformGate(features, bias_init=gate_bias))
