"""Fully connected building blocks: the Dot-BN-ReLU unit and the plain, residual and gated residual blocks.

Every block exposes the stable attribute names that lesioning, pruning and gate statistics rely
on (docs/design.md): `branch` (the transformation), `shortcut` (identity, or None for a plain layer that
has none) and `gate` (a gate module, or `nn.Identity()` when ungated).
"""

from __future__ import annotations

import torch
from torch import nn

from .gates import ScalarGate

__all__ = ["ACTIVATIONS", "NORMS", "make_activation", "dense_unit", "PlainBlock", "ResidualBlock"]

ACTIVATIONS = ("relu", "tanh", "identity")
NORMS = ("batch", "none")


def make_activation(name: str) -> nn.Module:
    """Return the activation module called `name` (one of ACTIVATIONS)."""
    if name == "relu":
        return nn.ReLU()
    if name == "tanh":
        return nn.Tanh()
    if name == "identity":
        return nn.Identity()
    raise ValueError(f"activation={name!r} is not known; accepted values: {list(ACTIVATIONS)}")


def dense_unit(
    in_features: int,
    out_features: int,
    norm: str = "batch",
    activation: str = "relu",
    bn_momentum: float = 0.1,
    bn_eps: float = 1e-5,
) -> nn.Sequential:
    """One fully connected layer: Dot, then BatchNorm (unless norm="none"), then the activation.

    This is the gated-residual papers' "Dot-BN-ReLU" layer (gated-residual-v2 section 3.1);
    with norm="none" and activation="tanh"/"relu" it is the highway paper's plain layer.
    `bn_momentum` and `bn_eps` are BatchNorm's, in PyTorch's convention (defaults PyTorch's 0.1 and
    1e-5; Keras's defaults, momentum 0.99 and epsilon 1e-3, are bn_momentum=0.01, bn_eps=1e-3).
    """
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r} is not known; accepted values: {list(NORMS)}")
    layers: list[nn.Module] = [nn.Linear(in_features, out_features)]
    if norm == "batch":
        layers.append(nn.BatchNorm1d(out_features, eps=bn_eps, momentum=bn_momentum))
    layers.append(make_activation(activation))
    return nn.Sequential(*layers)


class PlainBlock(nn.Module):
    """A plain (classical) layer u = f(x): no shortcut, no gate. `shortcut` is None by contract."""

    def __init__(self, branch: nn.Module) -> None:
        super().__init__()
        self.branch = branch
        self.gate = nn.Identity()
        self.shortcut = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch(x)


class ResidualBlock(nn.Module):
    """u = g(k)·f_r(x) + x (gated) or u = f_r(x) + x (ungated).

    `gate` replaces the scalar gate with any gate module (a `VectorGate` for LayerScale,
    u = x + diag(λ)·f_r(x)); with it `gated`, `k_init` and `gate_function` are not used.

    gated-residual-v2 section 2.2: the gate sits on the residual branch only, so the shortcut
    carries x unchanged; with g = ReLU, k ≤ 0 makes the block an exact identity and k = 1 makes it
    the ungated block. The branch is any module mapping x to the shape of x (for the MNIST models,
    two Dot-BN-ReLU units).
    """

    def __init__(
        self,
        branch: nn.Module,
        gated: bool = False,
        k_init: float = 1.0,
        gate_function: str = "relu",
        shortcut: nn.Module | None = None,
        gate: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.branch = branch
        self.shortcut = shortcut if shortcut is not None else nn.Identity()
        if gate is not None:
            self.gate: nn.Module = gate
        else:
            self.gate = ScalarGate(k_init, gate_function) if gated else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.branch(x)) + self.shortcut(x)
