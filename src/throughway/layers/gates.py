"""Gates: the scalar gate g(k) of gated residual networks and the transform gate T(x) of highway layers.

* `ScalarGate` (gated-residual-v1 section 3, gated-residual-v2 section 2.2): one learnable scalar k
  per block and a fixed function g; `gate(h)` returns g(k)·h. With g = ReLU (the paper's choice),
  any k ≤ 0 closes the gate exactly, and k = 1 leaves the branch unchanged.
* `TransformGate` (highway paper section 2.2): T(x) = σ(W_T x + b_T), with b_T initialised to a
  negative constant so that the layer starts out carrying its input.
"""

from __future__ import annotations

from typing import Callable, cast

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["GATE_FUNCTIONS", "ScalarGate", "TransformGate", "scalar_gates", "scalar_gate_values"]

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


def scalar_gates(model: nn.Module) -> list[ScalarGate]:
    """Return the model's scalar gates in block order (every `ScalarGate` submodule, in module order)."""
    return [m for m in model.modules() if isinstance(m, ScalarGate)]


def scalar_gate_values(model: nn.Module) -> list[float]:
    """Return k (not g(k)) of every scalar gate in block order, as Python floats."""
    return [float(g.k.detach().cpu()) for g in scalar_gates(model)]
