"""Convolutional highway networks (highway paper §2.1, §3.2, §3.3).

A net is a list of stages. The first stage, and every stage that changes the width, opens with a
plain 3×3 conv-ReLU (the paper's §2.1: "use a plain layer to change dimensionality"); then come highway layers
y = H(x)·T(x) + x·(1 − T(x)) with H, T convolutions of one receptive field and zero padding.
Every stage ends with 2×2 max pooling. The classifier is either the fully connected layer of the
paper's Table 1 and Table 2 nets, on the flattened last feature maps ("linear"), or, for the CIFAR
nets of Table 3 (§3.3.2, after Lin et al.), "a convolutional layer with a receptive field of size
one and a global average pooling layer" in its place ("conv-gap"). The replacement changes the
function class only because "linear" sees every position of the last maps: a linear layer after
global pooling would be the same map as the 1×1 convolution before it.

The paper gives layer counts and approximate parameter counts but not the layouts; the layouts
below are ours, chosen to match both (a layer is a conv layer or the classifier; counts with the
"linear" classifier):

* "mnist-10" (Table 1, 10 layers, width 16 → 39K, width 32 → 151K): plain conv 1→w, 8 highway
  3×3 layers, max pooling after layers 3, 6 and 9 (28 → 14 → 7 → 3), linear classifier on w·3·3
  features: 38,730 parameters at w = 16 and 151,178 at w = 32 (paper: 39K and 151K).
* "highway-a" (Table 2, after Fitnet A, 11 layers, ≈236K): widths 16 / 32 / 64 with 3 / 2 / 2
  highway layers, 32 → 16 → 8 → 4, linear classifier on 64·4·4: 232,458 parameters.
* "highway-b" (Table 2, after Fitnet B, 19 layers, ≈2.3M): widths 32 / 80 / 128 with 5 / 5 / 5
  highway layers: 2,281,914 parameters.
* "highway-c" (Table 2, 32 layers, ≈1.25M, alternating 3×3 and 1×1 receptive fields): widths
  32 / 64 / 80 with 9 / 10 / 9 highway layers: 1,218,810 parameters.

The transform-gate bias defaults to the paper's guideline for the depth (−1, −2, −3 for about 10,
20, 30 layers); weights default to He normal with zero biases (the gate bias is kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..layers import PlainBlock, init_weights_
from ..layers.conv import conv_highway_layer
from .preact_resnet import ConvNet, check_positive_int
from .registry import register_model

__all__ = ["HighwayArch", "HIGHWAY_ARCHS", "highway_conv", "CLASSIFIERS"]

CLASSIFIERS = ("linear", "conv-gap")


@dataclass(frozen=True)
class HighwayArch:
    """A layout: per stage (width, or None for the `width` argument; the highway layers' kernel
    sizes); `depth` counts layers as the paper does (conv layers and the classifier)."""

    stages: tuple[tuple[int | None, tuple[int, ...]], ...]
    depth: int
    gate_bias: float
    source: str


def _alternating(n: int) -> tuple[int, ...]:
    return tuple(3 if i % 2 == 0 else 1 for i in range(n))


HIGHWAY_ARCHS: dict[str, HighwayArch] = {
    "mnist-10": HighwayArch(stages=((None, (3, 3)), (None, (3, 3, 3)), (None, (3, 3, 3))), depth=10, gate_bias=-1.0,
                            source="highway §3.2 Table 1: 10-layer conv highway nets, width 16 / 32, 39K / 151K"),
    "highway-a": HighwayArch(stages=((16, (3, 3, 3)), (32, (3, 3)), (64, (3, 3))), depth=11, gate_bias=-1.0,
                             source="highway §3.3.1 Table 2: Highway A (Fitnet A), ≈236K"),
    "highway-b": HighwayArch(stages=((32, (3,) * 5), (80, (3,) * 5), (128, (3,) * 5)), depth=19, gate_bias=-2.0,
                             source="highway §3.3.1 Table 2: Highway B (Fitnet B), ≈2.3M"),
    "highway-c": HighwayArch(stages=((32, _alternating(9)), (64, _alternating(10)), (80, _alternating(9))),
                             depth=32, gate_bias=-3.0,
                             source="highway §3.3.1 Table 2: Highway C, 32 layers, 3×3 and 1×1 alternating, "
                                    "≈1.25M"),
}


@register_model("highway_conv", "convolutional highway net: plain conv per stage, highway conv layers y = H·T + x·(1−T), max pooling; the paper's MNIST / Fitnet-based / CIFAR layouts (highway §3.2, §3.3)")
def highway_conv(
    depth: int | None = None,
    arch: str = "mnist-10",
    width: int = 16,
    in_channels: int = 1,
    num_classes: int = 10,
    classifier: str = "linear",
    gate_bias: float | None = None,
    image_size: int = 28,
    init: str = "he_normal",
) -> ConvNet:
    """The highway layout `arch` (see HIGHWAY_ARCHS and the module docstring).

    `depth`, when given, must equal the layout's layer count (10, 11, 19, 32); `width` sets the
    width of "mnist-10" only. `classifier` "linear" (a fully connected layer on the flattened last
    maps, highway Tables 1 and 2) or "conv-gap" (1×1 convolution to the classes, then global
    average pooling: the CIFAR nets of Table 3, §3.3.2). `image_size` is the input side, which the
    flattened classifier needs. `gate_bias` overrides the layout's transform-gate bias (T's bias
    stays a trained parameter).
    """
    if arch not in HIGHWAY_ARCHS:
        raise ValueError(f"arch={arch!r} is not known; accepted values: {sorted(HIGHWAY_ARCHS)}")
    if classifier not in CLASSIFIERS:
        raise ValueError(f"classifier={classifier!r} is not known; accepted values: {list(CLASSIFIERS)}")
    spec = HIGHWAY_ARCHS[arch]
    if depth is not None and depth != spec.depth:
        raise ValueError(f"depth={depth}: layout {arch!r} has {spec.depth} layers; pass depth={spec.depth} or omit it")
    check_positive_int("width", width)
    check_positive_int("in_channels", in_channels)
    check_positive_int("num_classes", num_classes, 2)
    check_positive_int("image_size", image_size, 8)
    bias = spec.gate_bias if gate_bias is None else float(gate_bias)

    blocks: list[nn.Module] = []
    channels, size = in_channels, image_size
    for index, (stage_width, kernels) in enumerate(spec.stages):
        out = width if stage_width is None else stage_width
        if index == 0:
            stem = nn.Sequential(nn.Conv2d(channels, out, 3, padding=1), nn.ReLU())
        elif out != channels:
            blocks.append(PlainBlock(nn.Sequential(nn.Conv2d(channels, out, 3, padding=1), nn.ReLU())))
        channels = out
        blocks.extend(conv_highway_layer(channels, k, bias) for k in kernels)
        blocks.append(PlainBlock(nn.MaxPool2d(2)))
        size //= 2
    if classifier == "conv-gap":
        head: nn.Module = nn.Sequential(nn.Conv2d(channels, num_classes, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    else:
        head = nn.Sequential(nn.Flatten(), nn.Linear(channels * size * size, num_classes))
    return init_weights_(ConvNet(stem, blocks, head), init)  # type: ignore[return-value]
