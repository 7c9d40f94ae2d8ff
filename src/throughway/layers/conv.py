"""Convolutional blocks: pre-activation residual blocks (He et al. 2016), wide residual blocks
(Zagoruyko & Komodakis 2016), their gated variants, and convolutional highway layers.

Every block exposes `branch`, `shortcut` and `gate` (docs/design.md). For the residual blocks

    u = g(k)·branch(preact(x)) + shortcut(x')

where preact is BN-ReLU, branch is conv3×3-BN-ReLU-[dropout]-conv3×3, x' is x itself or, for a
projection shortcut fed the pre-activated input, preact(x). The gate (gated-residual-v2 §2.2) sits
on the residual branch only: a projection shortcut stays ungated, so with g = ReLU any k ≤ 0
reduces the block to its shortcut (the identity when the shapes match). An ungated block has
`gate = nn.Identity()` and computes exactly branch(preact(x)) + shortcut(x').

Convolutional highway layers (highway paper §2.1) reuse `HighwayLayer` and `TransformGate`:
H = ReLU(conv(x)) and T = σ(conv(x)) with the same receptive field and zero padding, so the block
state and the transform gate keep the input's size.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .gates import ScalarGate, TransformGate
from .highway import HighwayLayer

__all__ = ["SHORTCUTS", "ZeroPadShortcut", "PreActBlock", "WideBlock", "PreActUnit", "conv_highway_layer", "conv3x3"]

# "A": parameter-free zero-padding shortcut; "B": 1×1 projection where the shape changes (He et al. 2016).
SHORTCUTS = ("A", "B")


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """3×3 convolution with zero padding 1 and no bias (BatchNorm follows, a bias would be redundant)."""
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class ZeroPadShortcut(nn.Module):
    """Option A shortcut: subsample by `stride`, then append zero channels up to `out_channels`.

    No parameters (He et al. 2015's option A, used by the CIFAR ResNet-110 of 1.7M parameters).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        if out_channels < in_channels:
            raise ValueError(f"zero-padding shortcut cannot shrink channels ({in_channels} → {out_channels})")
        self.extra, self.stride = out_channels - in_channels, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, H, W) → (N, C + extra, H/s, W/s)
        if self.stride > 1:
            x = x[:, :, ::self.stride, ::self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra)) if self.extra else x


class PreActBlock(nn.Module):
    """Pre-activation basic block BN-ReLU-conv3×3-BN-ReLU-conv3×3 (He et al. 2016, "Identity
    mappings in deep residual networks"), optionally gated: u = g(k)·f_r(x) + shortcut(x).

    Args:
        in_channels: channels of x.
        out_channels: channels of u; with `stride`, the block's shape change.
        stride: stride of the first convolution.
        shortcut: "B" (1×1 projection where the shape changes, the default) or "A" (zero padding).
        dropout: dropout probability between the two convolutions (0 disables it; WRN uses 0.3).
        preact_shortcut: feed a 1×1 projection shortcut the pre-activated input BN-ReLU(x), as the
            reference codes of WRN and of He et al. 2016 do; otherwise the raw x. Identity and
            zero-padding shortcuts always carry the raw x (the clean shortcut path).
        gated: one ScalarGate on the residual branch (gated-residual-v2 §2.2).
        k_init: the gate's initial k.
        gate_function: the gate's g ("relu", "identity" or "sigmoid").
        bn_momentum: PyTorch's convention; the papers' "momentum 0.9" is PyTorch's 0.1.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, *, shortcut: str = "B",
                 dropout: float = 0.0, preact_shortcut: bool = False, gated: bool = False, k_init: float = 1.0,
                 gate_function: str = "relu", bn_momentum: float = 0.1) -> None:
        super().__init__()
        if shortcut not in SHORTCUTS:
            raise ValueError(f"shortcut={shortcut!r} is not known; accepted values: {list(SHORTCUTS)}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout!r}: must be in [0, 1)")
        self.preact = nn.Sequential(nn.BatchNorm2d(in_channels, momentum=bn_momentum), nn.ReLU(inplace=False))
        self.branch = nn.Sequential(
            conv3x3(in_channels, out_channels, stride),
            nn.BatchNorm2d(out_channels, momentum=bn_momentum),
            nn.ReLU(inplace=False),
            nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
            conv3x3(out_channels, out_channels),
        )
        self.projection = in_channels != out_channels or stride != 1
        if not self.projection:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "B":
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)
        else:
            self.shortcut = ZeroPadShortcut(in_channels, out_channels, stride)
        # Only a parametrised projection is fed the pre-activated input; identity and zero padding carry x.
        self.preact_shortcut = bool(preact_shortcut and self.projection and shortcut == "B")
        self.gate = ScalarGate(k_init, gate_function) if gated else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.preact(x)
        residual = self.gate(self.branch(a))
        return residual + self.shortcut(a if self.preact_shortcut else x)


class WideBlock(PreActBlock):
    """Wide residual block (WRN, Zagoruyko & Komodakis 2016): a PreActBlock with dropout between the
    convolutions and the 1×1 projection shortcut fed the pre-activated input; optionally gated."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, *, dropout: float = 0.0,
                 gated: bool = False, k_init: float = 1.0, gate_function: str = "relu",
                 bn_momentum: float = 0.1) -> None:
        super().__init__(in_channels, out_channels, stride, shortcut="B", dropout=dropout, preact_shortcut=True,
                         gated=gated, k_init=k_init, gate_function=gate_function, bn_momentum=bn_momentum)


class PreActUnit(nn.Module):
    """A pre-activation residual unit whose shortcut spans `shortcut_depth` convolutions:
    u = g(k)·[BN-ReLU-conv3×3]^n(x) + shortcut(x) (Demystifying ResNet figure 9: shortcut depth n = 1..4).

    n = 2 is He et al.'s basic block. The first convolution carries the stride; where the shape
    changes the shortcut is a 1×1 projection of the raw input (the unit is ungated on the shortcut).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, *, shortcut_depth: int = 2,
                 gated: bool = False, k_init: float = 1.0, gate_function: str = "relu",
                 bn_momentum: float = 0.1) -> None:
        super().__init__()
        if not isinstance(shortcut_depth, int) or shortcut_depth < 1:
            raise ValueError(f"shortcut_depth={shortcut_depth!r}: must be an integer ≥ 1")
        layers: list[nn.Module] = []
        for i in range(shortcut_depth):
            cin = in_channels if i == 0 else out_channels
            layers += [nn.BatchNorm2d(cin, momentum=bn_momentum), nn.ReLU(),
                       conv3x3(cin, out_channels, stride if i == 0 else 1)]
        self.branch = nn.Sequential(*layers)
        projection = in_channels != out_channels or stride != 1
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False) if projection \
            else nn.Identity()
        self.gate = ScalarGate(k_init, gate_function) if gated else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.branch(x)) + self.shortcut(x)


def conv_highway_layer(channels: int, kernel_size: int = 3, gate_bias: float = -1.0) -> HighwayLayer:
    """Convolutional highway layer y = H(x)·T(x) + x·(1 − T(x)) (highway paper §2.1, eq. 3).

    H = ReLU(conv_k×k(x)) (the paper's conv highway nets use rectified linear H, §3) and
    T = σ(conv_k×k(x) + b_T) with the same receptive field; zero padding keeps the size (odd k only).
    `gate_bias` is T's initial bias (the paper suggests −1, −2, −3 for depths ≈ 10, 20, 30).
    """
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size={kernel_size!r}: must be a positive odd integer (zero padding keeps the size)")
    padding = kernel_size // 2
    branch = nn.Sequential(nn.Conv2d(channels, channels, kernel_size, padding=padding), nn.ReLU())
    gate = TransformGate(channels, bias_init=gate_bias,
                         linear=nn.Conv2d(channels, channels, kernel_size, padding=padding))
    return HighwayLayer(branch, gate)
