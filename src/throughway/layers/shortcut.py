"""The residual unit of an n-shortcut network (Demystifying ResNet, definitions 1 and 2, figure 1).

A unit holds n square linear layers without biases, W_1 … W_n, on its transformation path and an
identity shortcut: x ↦ x + W_n ⋯ W_2 W_1 x. Element-wise activations may sit on the
transformation path only: σ_pre before W_1, σ_mid between two weights, σ_post after W_n. Without
a shortcut (`shortcut=False`) the same unit is a slice of a plain network, with the activations at
the same positions, which is how the paper compares plain and shortcut networks (appendix B).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from .dense import make_activation

__all__ = ["ACTIVATION_POSITIONS", "ShortcutUnit"]

ACTIVATION_POSITIONS = ("pre", "mid", "post")


class ShortcutUnit(nn.Module):
    """One residual unit of an n-shortcut network: u = x + f(x), f = [σ_post] W_n [σ_mid] ⋯ W_1 [σ_pre].

    Args:
        width: d, the size of every (square, bias-free) weight matrix.
        layers: n ≥ 1, the number of weight matrices on the transformation path.
        activation: None (a linear unit) or an activation name ("relu", "tanh").
        positions: where the activation sits, any subset of ("pre", "mid", "post").
        shortcut: True for x + f(x); False for the plain f(x) (shortcut attribute then None).

    Block contract (docs/design.md): `branch` is the transformation path (an nn.Sequential whose
    Linear layers are the W_i in order), `shortcut` is nn.Identity() or None, `gate` nn.Identity().
    """

    def __init__(self, width: int, layers: int, activation: str | None = None,
                 positions: tuple[str, ...] | list[str] = ("mid",), shortcut: bool = True) -> None:
        super().__init__()
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"width={width!r}: must be a positive integer")
        if not isinstance(layers, int) or layers < 1:
            raise ValueError(f"layers={layers!r}: must be a positive integer (the shortcut depth n)")
        bad = sorted(set(positions) - set(ACTIVATION_POSITIONS))
        if bad:
            raise ValueError(f"positions: {bad} not known; accepted values: {list(ACTIVATION_POSITIONS)}")
        self.width, self.layers = width, layers
        self.activation = activation
        self.positions = tuple(p for p in ACTIVATION_POSITIONS if p in positions) if activation else ()
        path: list[nn.Module] = []
        if "pre" in self.positions:
            path.append(make_activation(cast(str, activation)))
        for i in range(layers):
            path.append(nn.Linear(width, width, bias=False))
            if i < layers - 1 and "mid" in self.positions:
                path.append(make_activation(cast(str, activation)))
        if "post" in self.positions:
            path.append(make_activation(cast(str, activation)))
        self.branch = nn.Sequential(*path)
        self.shortcut = nn.Identity() if shortcut else None
        self.gate = nn.Identity()

    def weights(self) -> list[torch.Tensor]:
        """The weight matrices W_1 … W_n in the order the input meets them."""
        return [m.weight for m in self.branch if isinstance(m, nn.Linear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch(x)
        return out + self.shortcut(x) if self.shortcut is not None else out

    def extra_repr(self) -> str:
        return (f"width={self.width}, layers={self.layers}, activation={self.activation}, "
                f"positions={self.positions}, shortcut={self.shortcut is not None}")
