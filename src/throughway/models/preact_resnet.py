"""Pre-activation ResNets for CIFAR (He et al. 2016) and their gated variants (gated-residual-v2 §3.2).

Depth 6n + 2: a 3×3 convolution to 16 channels (the `stem`), three stages of n pre-activation
blocks with 16, 32, 64 channels (the first block of stages 2 and 3 halves the resolution), then
BN-ReLU, global average pooling and a linear classifier (`forward_head`). The paper's "ResNet n=5"
is depth 32 (15 blocks, so the gated variant has exactly 15 parameters more); ResNet-110 is n=18.

`preact_shortcut_depth` (Demystifying ResNet §5.3.2, figure 9) varies the number of convolutions a
shortcut spans (1, 2, 3, 4) at a fixed number of convolutions, hence a fixed parameter count.

The container (`ConvNet`) and the init and head helpers live in `models.base`, shared with the
other convolutional families (re-exported here for code that imported them from this module).
"""

from __future__ import annotations

from torch import nn

from ..layers.conv import SHORTCUTS, PreActBlock, PreActUnit
from .base import ConvNet, check_positive_int, conv_init_, resnet_head
from .registry import register_model

__all__ = ["ConvNet", "conv_init_", "resnet_head", "check_positive_int", "preact_resnet", "preact_shortcut_depth"]


@register_model("preact_resnet", "pre-activation ResNet for CIFAR, depth 6n+2, optionally gated u = g(k)·f_r(x) + x (He et al. 2016; gated-residual-v2 §3.2)")
def preact_resnet(
    depth: int = 32,
    num_classes: int = 10,
    gated: bool = False,
    shortcut: str = "B",
    in_channels: int = 3,
    width: int = 16,
    k_init: float = 1.0,
    gate_function: str = "relu",
    bn_momentum: float = 0.1,
) -> ConvNet:
    """Pre-activation ResNet of `depth` = 6n + 2 layers (n blocks per stage, widths width·(1, 2, 4)).

    `shortcut` "B" projects with a 1×1 convolution where the shape changes, fed the pre-activated
    input BN-ReLU(x) as in He et al.'s reference code (resnet-pre-act.lua: "common BN, ReLU" before
    both paths of a unit that increases dimensions); "A" subsamples x and pads it with zero channels
    (no parameters). `gated` adds one scalar gate per block on the residual branch only, the
    shortcut stays ungated (n·3 parameters more).
    """
    check_positive_int("depth", depth, 8)
    check_positive_int("num_classes", num_classes, 2)
    check_positive_int("in_channels", in_channels)
    check_positive_int("width", width)
    if (depth - 2) % 6:
        raise ValueError(f"depth={depth}: a pre-activation ResNet has depth 6n + 2 (accepted: 8, 14, 20, 32, 56, 110, ...)")
    if shortcut not in SHORTCUTS:
        raise ValueError(f"shortcut={shortcut!r} is not known; accepted values: {list(SHORTCUTS)}")
    n = (depth - 2) // 6
    widths = [width, 2 * width, 4 * width]
    stem = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
    blocks: list[nn.Module] = []
    channels = width
    for stage, stage_width in enumerate(widths):
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            blocks.append(PreActBlock(channels, stage_width, stride, shortcut=shortcut, preact_shortcut=True,
                                      gated=gated, k_init=k_init, gate_function=gate_function,
                                      bn_momentum=bn_momentum))
            channels = stage_width
    return conv_init_(ConvNet(stem, blocks, resnet_head(channels, num_classes, bn_momentum)))  # type: ignore[return-value]


@register_model("preact_shortcut_depth", "pre-activation CIFAR ResNet whose shortcuts span 1..4 convolutions at a fixed parameter count (Demystifying ResNet fig. 9)")
def preact_shortcut_depth(
    depth: int = 26,
    shortcut_depth: int = 2,
    num_classes: int = 10,
    gated: bool = False,
    in_channels: int = 3,
    width: int = 16,
    bn_momentum: float = 0.1,
) -> ConvNet:
    """Pre-ResNet with `depth` = 3m + 2 layers (a stem conv, m 3×3 convolutions per stage, the
    classifier), grouped into units of `shortcut_depth` convolutions (m must be divisible by it).

    The parameter count depends on depth and width only, not on the shortcut depth: with m a
    multiple of 12 (depth 38, 74, 110, ...), shortcut depths 1, 2, 3 and 4 have identical counts.
    """
    check_positive_int("depth", depth, 5)
    check_positive_int("shortcut_depth", shortcut_depth)
    check_positive_int("num_classes", num_classes, 2)
    if (depth - 2) % 3:
        raise ValueError(f"depth={depth}: must be 3m + 2 (m convolutions per stage)")
    m = (depth - 2) // 3
    if m % shortcut_depth:
        raise ValueError(f"depth={depth}: the {m} convolutions per stage do not split into units of "
                         f"shortcut_depth={shortcut_depth}; pick depth = 3m + 2 with m divisible by it "
                         f"(m a multiple of 12 suits 1, 2, 3 and 4)")
    stem = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
    blocks: list[nn.Module] = []
    channels = width
    for stage, stage_width in enumerate([width, 2 * width, 4 * width]):
        for i in range(m // shortcut_depth):
            stride = 2 if stage > 0 and i == 0 else 1
            blocks.append(PreActUnit(channels, stage_width, stride, shortcut_depth=shortcut_depth, gated=gated,
                                     bn_momentum=bn_momentum))
            channels = stage_width
    return conv_init_(ConvNet(stem, blocks, resnet_head(channels, num_classes, bn_momentum)))  # type: ignore[return-value]
