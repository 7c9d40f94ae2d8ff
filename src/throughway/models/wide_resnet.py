"""Wide ResNets WRN-d-k (Zagoruyko & Komodakis 2016) and Wide Gated ResNets (gated-residual-v2 §3.2).

Depth 6n + 4: a 3×3 convolution to 16 channels, three stages of n wide blocks with 16k, 32k, 64k
channels (BN-ReLU-conv-BN-ReLU-dropout-conv, the 1×1 projection shortcut fed the pre-activated
input), BN-ReLU, global average pooling, linear. The gated paper's "Wide ResNet (4,10)" is n = 4,
k = 10, i.e. WRN-28-10 (36,479,194 parameters for 10 classes, 12 blocks, so the gated variant has
12 more); gated-residual-v1's "Wide ResNet (3,4)" is WRN-22-4 (4,298,970 parameters, 9 blocks).
"""

from __future__ import annotations

from torch import nn

from ..layers.conv import WideBlock
from .base import ConvNet, check_positive_int, conv_init_, resnet_head
from .registry import register_model

__all__ = ["wide_resnet"]


@register_model("wide_resnet", "wide ResNet WRN-d-k, depth 6n+4, dropout between convolutions, optionally gated (Zagoruyko & Komodakis 2016; gated-residual-v2 §3.2)")
def wide_resnet(
    depth: int = 28,
    widen_factor: int = 10,
    dropout: float = 0.3,
    num_classes: int = 10,
    gated: bool = False,
    in_channels: int = 3,
    k_init: float = 1.0,
    gate_function: str = "relu",
    bn_momentum: float = 0.1,
) -> ConvNet:
    """WRN-`depth`-`widen_factor` with dropout `dropout` between the convolutions of each block;
    `gated` adds one scalar gate per block (n·3 parameters more)."""
    check_positive_int("depth", depth, 10)
    check_positive_int("widen_factor", widen_factor)
    check_positive_int("num_classes", num_classes, 2)
    check_positive_int("in_channels", in_channels)
    if (depth - 4) % 6:
        raise ValueError(f"depth={depth}: a wide ResNet has depth 6n + 4 (accepted: 10, 16, 22, 28, 40, ...)")
    n = (depth - 4) // 6
    widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
    stem = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
    blocks: list[nn.Module] = []
    channels = 16
    for stage, width in enumerate(widths):
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            blocks.append(WideBlock(channels, width, stride, dropout=dropout, gated=gated, k_init=k_init,
                                    gate_function=gate_function, bn_momentum=bn_momentum))
            channels = width
    return conv_init_(ConvNet(stem, blocks, resnet_head(channels, num_classes, bn_momentum)))  # type: ignore[return-value]
