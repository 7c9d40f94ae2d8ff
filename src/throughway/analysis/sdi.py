"""Squared Distance to Identity (gated-residual-v1 section 2, appendix 7): SDI matrices M, B and TSDI.

SDI(W) = M = E[(W − Ŵ)²] and SDI(b) = B = E[(b − b̂)²] (eqs 1, 2), element-wise, where (Ŵ, b̂)
are the parameters that make the layer an identity map and the expectation is over the random
initialisation; TSDI = Σ M + Σ B (eq 3). For one element with mean μ and variance σ²,
E[(w − ŵ)²] = σ² + (μ − ŵ)² (appendix eqs 15-19; eq 15 as printed reads σ² + (μ² − 1)², a typo
for σ² + (μ − 1)², which agrees with it only when μ = 0).

Layers (n units, or n channels with a k×k kernel for convolutions):

* "classical" u = ReLU(Wx + b): Ŵ = I (for a convolution, the identity kernel: 1 at the centre
  tap of channel i → i), b̂ = 0 (section 2.1);
* "highway": the transform gate's W_t, b_t, degenerate at Ŵ_t = 0, b̂_t = c (a negative target,
  g = σ(c) ≈ 0) (section 2.2);
* "residual" u = ReLU(Wx + b) + x: Ŵ = 0, b̂ = 0 (section 2.3);
* "gated" u = g(k)·f(x) + (1 − g(k))·x or g(k)·f_r(x) + x: only k, k̂ = 0, SDI(k) = E[k²] (section 3).

Initialisations are given by their per-element moments (`InitMoments`); `named_init` gives the
moments of the toolkit's own schemes (throughway.layers.init: He, Glorot, PyTorch's default
Linear/Conv init, all with zero biases except PyTorch's default, whose bias is uniform
±1/√fan_in) and of the paper's convention (He weights *and* He-variance biases, 2/n, which is
what the paper's eqs 4-14 compute with even though section 2.2 fixes the gate bias).
`monte_carlo_sdi` samples the real initialisers of the toolkit's layers to check the formulas.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, cast

import torch
from torch import nn

from ..layers import INIT_SCHEMES, ScalarGate, TransformGate, init_weights_

__all__ = ["LAYERS", "NAMED_INITS", "InitMoments", "named_init", "SDIResult", "sdi", "monte_carlo_sdi",
           "paper_tsdi", "sigmoid"]

LAYERS = ("classical", "highway", "residual", "gated")
# the toolkit's schemes plus "paper_he": He weights with He-variance biases (the paper's eqs 4-14)
NAMED_INITS = tuple(INIT_SCHEMES) + ("paper_he",)


@dataclass(frozen=True)
class InitMoments:
    """Per-element mean and variance of the initial weights and biases (the paper's μ, σ², μ_b, σ_b²)."""

    weight_mean: float = 0.0
    weight_var: float = 0.0
    bias_mean: float = 0.0
    bias_var: float = 0.0


def named_init(name: str, fan_in: int, fan_out: int | None = None, *, bias: float | None = None) -> InitMoments:
    """The moments of init scheme `name` (one of NAMED_INITS) for a layer with these fans.

    He (normal or uniform): Var W = 2/fan_in; Glorot (normal or uniform): 2/(fan_in + fan_out);
    "torch_default": W and b uniform on ±1/√fan_in, so Var = 1/(3·fan_in) for both. The toolkit's
    `init_weights_` zeroes biases for every scheme but "torch_default"; "paper_he" gives biases the
    He variance 2/fan_in. `bias`, when given, replaces the bias by that constant (a transform gate's
    b_T: mean `bias`, variance 0).
    """
    if name not in NAMED_INITS:
        raise ValueError(f"init={name!r} is not known; accepted values: {list(NAMED_INITS)}")
    if fan_in < 1:
        raise ValueError(f"fan_in={fan_in}: must be ≥ 1")
    fan_out = fan_in if fan_out is None else fan_out
    if name in ("he_normal", "he_uniform"):
        moments = InitMoments(weight_var=2.0 / fan_in)
    elif name in ("glorot_uniform", "glorot_normal"):
        moments = InitMoments(weight_var=2.0 / (fan_in + fan_out))
    elif name == "torch_default":
        moments = InitMoments(weight_var=1.0 / (3 * fan_in), bias_var=1.0 / (3 * fan_in))
    else:  # paper_he
        moments = InitMoments(weight_var=2.0 / fan_in, bias_var=2.0 / fan_in)
    if bias is not None:
        # A constant bias has no variance, except in the paper's convention, whose eqs 10-11 keep
        # the He variance 2/n around the gate bias's mean.
        moments = replace(moments, bias_mean=float(bias), bias_var=moments.bias_var if name == "paper_he" else 0.0)
    return moments


@dataclass(frozen=True)
class SDIResult:
    """M (weight-shaped), B (bias-shaped) and TSDI = ΣM + ΣB of one layer, with what produced them."""

    layer: str
    width: int
    kernel_size: int | None
    init: InitMoments
    target: float | None
    M: torch.Tensor
    B: torch.Tensor

    @property
    def tsdi(self) -> float:
        """TSDI = the sum of M and B over every entry (gated-residual-v1 eq. 5)."""
        return float(self.M.sum() + self.B.sum())

    def m_diagonal(self) -> float:
        """M at an identity position (i = j, centre tap), e.g. 2/n + 1 for a classical He layer (eq 4)."""
        return float(self.M.reshape(self.width, self.width, -1)[0, 0, self._centre()]) if self.M.ndim > 0 and self.M.numel() > 1 else float(self.M)

    def m_off_diagonal(self) -> float:
        """M at a position whose identity value is 0 (i ≠ j)."""
        if self.M.numel() <= 1:
            return float(self.M)
        return float(self.M.reshape(self.width, self.width, -1)[0, min(1, self.width - 1), self._centre()]) \
            if self.width > 1 else float("nan")

    def b_value(self) -> float:
        """The per-entry bias term B (the same for every bias)."""
        return float(self.B.reshape(-1)[0]) if self.B.numel() else 0.0

    def _centre(self) -> int:
        k = self.kernel_size or 1
        return (k // 2) * k + k // 2

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-able dict."""
        return {"layer": self.layer, "width": self.width, "kernel_size": self.kernel_size, "init": asdict(self.init),
                "target": self.target, "M_identity_position": self.m_diagonal(),
                "M_other_position": self.m_off_diagonal(), "B": self.b_value(), "tsdi": self.tsdi}


def _identity_weight(layer: str, n: int, kernel_size: int | None) -> torch.Tensor:
    shape = (n, n) if kernel_size is None else (n, n, kernel_size, kernel_size)
    target = torch.zeros(shape, dtype=torch.float64)
    if layer == "classical":
        if kernel_size is None:
            target += torch.eye(n, dtype=torch.float64)
        else:
            if kernel_size % 2 == 0:
                raise ValueError(f"kernel_size={kernel_size}: a classical conv layer has an identity kernel only for odd sizes")
            c = kernel_size // 2
            target[torch.arange(n), torch.arange(n), c, c] = 1.0
    return target


def _check_layer(layer: object) -> None:
    """ValueError / TypeError naming the accepted layer types, short whatever `layer` is (a model's
    repr would run to thousands of characters)."""
    if not isinstance(layer, str):
        raise TypeError(f"layer: expected a layer type, one of {list(LAYERS)}, not a {type(layer).__name__}: SDI is "
                        f"the paper's formula for a layer type at initialisation; for a model's blocks use "
                        f"analysis.distance.block_identity_distance or the IdentityDistance callback")
    if layer not in LAYERS:
        raise ValueError(f"layer={layer[:40]!r} is not known; accepted values: {list(LAYERS)}")


def sdi(layer: str, width: int, init: InitMoments | str = "he_normal", *, kernel_size: int | None = None,
        target: float = -4.0, gate_bias: float | None = None, k_init: float = 1.0, k_var: float = 0.0) -> SDIResult:
    """Analytic M, B and TSDI of a layer type `layer` (one of LAYERS, a string: the paper's formula for
    a kind of layer, not a measurement of a model) of `width` units (channels).

    `init`: InitMoments, or a name from NAMED_INITS (fans from width and kernel size). For
    "highway", `init` describes the transform gate's W_t and b_t, `gate_bias` fixes the mean of b_t
    (the toolkit's TransformGate constant; with a named init it defaults to the paper's −4, with
    variance 0 except under "paper_he", see `named_init`), and `target` is c. For
    "gated", M is the scalar SDI(k) = Var k + (E k)² with k = `k_init` ± `k_var`, and B is empty.
    """
    _check_layer(layer)
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width={width!r}: must be a positive integer")
    if kernel_size is not None and kernel_size < 1:
        raise ValueError(f"kernel_size={kernel_size}: must be ≥ 1")
    # A non-finite number would print a table of nan instead of an error naming the argument.
    for name, value in (("target", target), ("gate_bias", gate_bias), ("k_init", k_init), ("k_var", k_var)):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ValueError(f"{name}={value!r} (--{name.replace('_', '-')}): accepted: a finite number")
    if k_var < 0:
        raise ValueError(f"k_var={k_var!r}: accepted: a variance ≥ 0")
    if layer == "gated":
        m = torch.tensor(k_var + k_init ** 2, dtype=torch.float64)
        return SDIResult(layer, width, kernel_size, InitMoments(k_init, k_var), None, m, torch.zeros(0, dtype=torch.float64))
    fan_in = width * (kernel_size or 1) ** 2
    if layer == "highway" and isinstance(init, str) and gate_bias is None:
        gate_bias = -4.0  # section 2.2: b_t initialised at −4
    if isinstance(init, str):
        moments = named_init(init, fan_in, fan_in, bias=gate_bias if layer == "highway" else None)
    else:
        moments = init if (layer != "highway" or gate_bias is None) else replace(init, bias_mean=gate_bias, bias_var=0.0)
    w_hat = _identity_weight(layer, width, kernel_size)
    b_hat = target if layer == "highway" else 0.0
    m = moments.weight_var + (moments.weight_mean - w_hat) ** 2
    b = torch.full((width,), moments.bias_var + (moments.bias_mean - b_hat) ** 2, dtype=torch.float64)
    return SDIResult(layer, width, kernel_size, moments, target if layer == "highway" else None, m, b)


def paper_tsdi(layer: str, n: int, c: float = -4.0) -> float:
    """TSDI exactly as the paper prints it: eq 6 (3n + 2), eq 11 ((2 + (4 + c)²)n + 2), eq 14 (2n + 2),
    section 3 (k_init² = 1). These use He weights and a bias variance 2/n (see the module docstring)."""
    if layer == "classical":
        return 3 * n + 2
    if layer == "highway":
        return (2 + (4 + c) ** 2) * n + 2
    if layer == "residual":
        return 2 * n + 2
    if layer == "gated":
        return 1.0
    _check_layer(layer)
    raise AssertionError("unreachable: every layer type is handled above")


def sigmoid(c: float) -> float:
    """g(c) = 1/(1 + e^(−c)), the highway gate's value at bias c with W_t x = 0 (Table 1's g(·))."""
    return 1.0 / (1.0 + math.exp(-c))


def _sample_parameters(layer: str, width: int, scheme: str, kernel_size: int | None, gate_bias: float,
                       k_init: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw of (weight, bias) from the toolkit's real layer and initialiser."""
    if layer == "gated":
        gate = ScalarGate(k_init)
        return gate.k.detach().reshape(1).double(), torch.zeros(0, dtype=torch.float64)
    if kernel_size is None:
        module: nn.Module = nn.Linear(width, width)
    else:
        module = nn.Conv2d(width, width, kernel_size, padding=kernel_size // 2)
    if layer == "highway":
        transform = TransformGate(width, bias_init=gate_bias, linear=module)
        init_weights_(transform, scheme)  # restores the constant gate bias, as in every toolkit model
    elif scheme != "torch_default":
        init_weights_(module, scheme)
    weight, bias = cast(torch.Tensor, module.weight), cast(torch.Tensor, module.bias)
    return weight.detach().double(), bias.detach().double()


def monte_carlo_sdi(layer: str, width: int, scheme: str = "he_normal", *, samples: int = 1000,
                    kernel_size: int | None = None, target: float = -4.0, gate_bias: float = -4.0,
                    k_init: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """Estimate M, B and TSDI by sampling the toolkit's real initialisers `samples` times.

    `scheme` is one of the toolkit's INIT_SCHEMES ("torch_default" = nn.Linear / nn.Conv2d's own
    reset_parameters). Returns {"M": mean of (W − Ŵ)², "B": mean of (b − b̂)², "tsdi": mean of the
    per-draw totals, "tsdi_stderr": its standard error}; compare with `sdi(layer, width, scheme,
    gate_bias=...)`, which should agree within a few standard errors.
    """
    _check_layer(layer)
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"scheme={scheme!r} is not known; accepted values: {list(INIT_SCHEMES)}")
    if samples < 2:
        raise ValueError(f"samples={samples}: need at least 2 draws for a standard error")
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        w_hat = _identity_weight(layer, width, kernel_size) if layer != "gated" else torch.zeros(1, dtype=torch.float64)
        b_hat = target if layer == "highway" else 0.0
        m_sum: torch.Tensor | None = None
        b_sum: torch.Tensor | None = None
        totals: list[float] = []
        for _ in range(samples):
            w, b = _sample_parameters(layer, width, scheme, kernel_size, gate_bias, k_init)
            dm, db = (w - w_hat) ** 2, (b - b_hat) ** 2
            m_sum = dm if m_sum is None else m_sum + dm
            b_sum = db if b_sum is None else b_sum + db
            totals.append(float(dm.sum() + db.sum()))
    finally:
        torch.random.set_rng_state(state)
    t = torch.tensor(totals, dtype=torch.float64)
    assert m_sum is not None and b_sum is not None  # samples ≥ 2
    return {"M": m_sum / samples, "B": b_sum / samples, "tsdi": float(t.mean()),
            "tsdi_stderr": float(t.std() / math.sqrt(samples)), "samples": samples}
