"""Gates: the scalar gate g(k) of gated residual networks and the transform gate T(x) of highway layers.

* `ScalarGate` (gated-residual-v1 section 3, gated-residual-v2 section 2.2): one learnable scalar k
  per block and a fixed function g; `gate(h)` returns g(k)·h. With g = ReLU (the paper's choice),
  any k ≤ 0 closes the gate exactly, and k = 1 leaves the branch unchanged.
* `VectorGate` (LayerScale, Touvron et al. 2021 "Going deeper with image transformers" §3): one
  learnable value per channel, λ ∈ R^C, with g the identity by default; `gate(h)` returns diag(λ)·h.
* `TransformGate` (highway paper section 2.2): T(x) = σ(W_T x + b_T), with b_T initialised to a
  negative constant so that the layer starts out carrying its input.
"""

from __future__ import annotations

from typing import Callable, cast

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["GATE_FUNCTIONS", "ScalarGate", "VectorGate", "TransformGate", "cait_layerscale_init"]

# g(k): the papers use ReLU; identity and sigmoid are offered for ablations.
GATE_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "identity": lambda k: k,
    "sigmoid": torch.sigmoid,
}


class ScalarGate(nn.Module):
    """g(k) with one learnable scalar k (gated-residual-v2, u = g(k)·f_r(x) + x).

    Args:
        k_init: the initial value of k; the papers start at 1.
        function: g, one of "relu" (default, the paper's), "identity" or "sigmoid".

    `forward(h)` returns g(k)·h; `value()` returns g(k) as a 0-d tensor. The parameter is named
    `k` so that recipes can exclude it from weight decay by name (the paper's "k decay" is opt-in).
    """

    def __init__(self, k_init: float = 1.0, function: str = "relu") -> None:
        super().__init__()
        if function not in GATE_FUNCTIONS:
            raise ValueError(
                f"gate function={function!r} is not known; accepted values: {sorted(GATE_FUNCTIONS)}"
            )
        self.function = function
        self.k = nn.Parameter(torch.tensor(float(k_init)))

    def value(self) -> torch.Tensor:
        """Return g(k), a 0-d tensor on the parameter's device."""
        return GATE_FUNCTIONS[self.function](self.k)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.value() * h

    def extra_repr(self) -> str:
        # a model built on the meta device has no value to show; repr() must not fail on it
        k = "?" if self.k.is_meta else f"{self.k.item():.4g}"
        return f"function={self.function}, k={k}"


class VectorGate(nn.Module):
    """g(λ) with one learnable value per channel (LayerScale: u = x + diag(λ)·f(x), CaiT §3).

    Args:
        features: C, the number of channels (one λ each).
        k_init: the initial value of every λ (CaiT's ε; `cait_layerscale_init` gives it by depth).
        function: g, one of GATE_FUNCTIONS; LayerScale's is "identity" (the default).
        channel_dim: the dimension of h that holds the channels: 1 (the default: (B, C) and
            (B, C, H, W) alike) or -1 (tokens, (B, T, C)).

    The interface is ScalarGate's, so that analyses treat both alike: the parameter is named `k`
    (shape (C,)), `value()` returns g(k) as a (C,) tensor, and `forward(h)` scales channel c of h by
    g(k_c).
    """

    def __init__(self, features: int, k_init: float = 0.1, function: str = "identity", channel_dim: int = 1) -> None:
        super().__init__()
        if function not in GATE_FUNCTIONS:
            raise ValueError(
                f"gate function={function!r} is not known; accepted values: {sorted(GATE_FUNCTIONS)}"
            )
        if channel_dim not in (1, -1):
            raise ValueError(f"channel_dim={channel_dim!r}: accepted values 1 ((B, C, ...)) or -1 ((B, T, C))")
        self.function = function
        self.channel_dim = channel_dim
        self.k = nn.Parameter(torch.full((int(features),), float(k_init)))

    def value(self) -> torch.Tensor:
        """Return g(k), a (C,) tensor on the parameter's device."""
        return GATE_FUNCTIONS[self.function](self.k)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        g = self.value()
        if self.channel_dim == -1:
            return g * h
        return g.view(1, -1, *([1] * (h.dim() - 2))) * h

    def extra_repr(self) -> str:
        if self.k.is_meta:
            return f"function={self.function}, features={self.k.shape[0]}"
        return f"function={self.function}, features={self.k.shape[0]}, mean |k|={self.k.abs().mean().item():.4g}"


def cait_layerscale_init(depth: int) -> float:
    """LayerScale's initial λ (ε) for a network of `depth`: 0.1 up to depth 18, 1e-5 up to 24, 1e-6
    beyond (Touvron et al. 2021, "Going deeper with image transformers", §3: "we initialize λ to 0.1
    for depth up to 18, 10^-5 for depth 24 and 10^-6 for deeper networks").

    CaiT's depth counts transformer layers, each one residual block; the toolkit counts residual
    blocks in every network the same way (`add_gates`, mlp_layerscale: d/2 blocks of two Dot-BN-ReLU
    layers). The gate-family study keeps its recorded choice, ε by d (its page says so).
    """
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


class TransformGate(nn.Module):
    """The highway transform gate T(x) = σ(W_T x + b_T) (highway paper eq. 3 and section 2.2).

    Args:
        features: width of x (T has the same width, one gate per block).
        bias_init: the constant initial b_T; the paper uses negative values (−1 to −10) so that
            T ≈ 0 and the layer initially copies its input.
        linear: optional module computing W_T x + b_T (a convolution for conv highway layers); by
            default `nn.Linear(features, features)`.
    """

    def __init__(self, features: int, bias_init: float = -2.0, linear: nn.Module | None = None) -> None:
        super().__init__()
        self.linear = linear if linear is not None else nn.Linear(features, features)
        self.bias_init = float(bias_init)
        self.reset_bias()

    def reset_bias(self) -> None:
        """Set b_T to the constant `bias_init` (the highway paper's initialisation)."""
        with torch.no_grad():
            cast(torch.Tensor, self.linear.bias).fill_(self.bias_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x))

    def extra_repr(self) -> str:
        return f"bias_init={self.bias_init}"
