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

Two kinds of layout. The authors' (highway §3: "Source code, hyperparameter search results and
related scripts are publicly available"): the Caffe nets they released in the GitHub repository
flukeskywalker/highway-networks, examples/highways/ (file and line for every value below; facts
carried over, no code):

* "mnist-10" (Table 1; mnist-10layers/mnist_network.prototxt, width 32 there, `width` here):
  dropout 0.2 on the input (lines 53-61); a plain 5×5 valid convolution 1→w + ReLU (62-93); highway
  3×3 layers in three stages of 2, 3, 3 (94-169, 191-304, 326-439), each stage followed by max
  pooling 3/2, 3/2, 2/2 (170-181, 305-316, 440-450) with Caffe's rounding up of pooled sizes
  (28 → 24 → 12 → 6 → 3; the log's "Top shape" lines, sample.log 511-609) and dropout 0.3, 0.4, 0.5
  (182-190, 317-325, 451-459); a fully connected classifier on w·3·3 features (460-483). Transform-gate
  bias −1 (126-129 and every highway layer). 144w² + 132w + 10 parameters: 38,986 at w = 16, 151,690
  at w = 32 (paper: 39K, 151K).
* "cifar10-19" / "cifar100-19" (Table 3; cifar10-19layers/cifar10_network.prototxt and the
  cifar100 one, which differs only in the classifier: cifar100_network.prototxt 800-806): dropout 0.2 on the input
  (57-65); plain 3×3 conv 3→32 + ReLU (66-98); 4 highway layers of 32 maps (99-250); max pool 2/2
  (251-261); dropout 0.2 (262-270); plain 3×3 conv 32→80 + ReLU (271-302); 5 highway layers of 80
  (303-492); max pool 2/2, dropout 0.2 (493-512); plain 3×3 conv 80→128 + ReLU (513-544); 5 highway
  layers of 128 (545-734); a 1×1 conv 128→100 + ReLU (735-766); 8×8 average pooling, i.e. global on
  32×32 inputs (767-777); dropout 0.2 (778-786); fully connected 100 → classes (787-810).
  Transform-gate bias −2. 19 layers (18 convolutions and the classifier); 2,256,838 parameters for
  CIFAR-10, 2,265,928 for CIFAR-100 (paper: ≈2.3M, Table 2's Highway B size).

Initialisation of the authors' layouts: their Caffe fork's "xavier" filler draws N(0, 2/fan_in)
(include/caffe/filler.hpp lines 150-155; the uniform Xavier is commented out there), which is
`he_normal`, the default here; zero biases ("constant"); the classifier N(0, 0.1²) on MNIST
(mnist_network.prototxt 475-478), N(0, 0.05²) on CIFAR-10 (cifar10_network.prototxt 802-805), "xavier"
on CIFAR-100; the CIFAR stem is "gaussian" with `value: 0.05` (cifar10_network.prototxt 84-87), a field
the Gaussian filler does not read (filler.hpp 73-74 reads mean and std), so its std is the default
1 (src/caffe/proto/caffe.proto line 48), which is what is used here.

Our layouts, for the paper's counts where it gives no layout (a layer is a conv layer or the
classifier; counts with the "linear" classifier):

* "mnist-10-ours" (the toolkit's "mnist-10" before the authors' files were read; results and models
  saved with arch "mnist-10" and no `dropout` argument load as this, see `with_legacy_layout`): plain
  3×3 conv 1→w, 8 highway 3×3 layers, 2×2 max pooling after layers 3, 6 and 9 (28 → 14 → 7 → 3),
  linear classifier on w·3·3 features, no dropout: 38,730 parameters at w = 16 and 151,178 at w = 32.
* "highway-a" (Table 2, after Fitnet A, 11 layers, ≈236K): widths 16 / 32 / 64 with 3 / 2 / 2
  highway layers, 32 → 16 → 8 → 4, linear classifier on 64·4·4: 232,458 parameters.
* "highway-b" (Table 2, after Fitnet B, 19 layers, ≈2.3M): widths 32 / 80 / 128 with 5 / 5 / 5
  highway layers: 2,281,914 parameters.
* "highway-c" (Table 2, 32 layers, ≈1.25M, alternating 3×3 and 1×1 receptive fields): widths
  32 / 64 / 80 with 9 / 10 / 9 highway layers: 1,218,810 parameters.

In our layouts the transform-gate bias is the paper's guideline for the depth (−1, −2, −3 for about
10, 20, 30 layers); weights default to He normal with zero biases (the gate bias is kept).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..layers import PlainBlock, init_weights_
from ..layers.conv import conv_highway_layer
from .preact_resnet import ConvNet, check_positive_int
from .registry import register_model

__all__ = ["HighwayArch", "HIGHWAY_ARCHS", "highway_conv", "CLASSIFIERS", "LEGACY_MNIST_ARCH", "with_legacy_layout"]

# "conv-gap-fc" is the authors' CIFAR head: 1×1 conv to `head_width` maps + ReLU, global average
# pooling, dropout, fully connected to the classes (cifar10_network.prototxt lines 735-810).
CLASSIFIERS = ("linear", "conv-gap", "conv-gap-fc")
LEGACY_MNIST_ARCH = "mnist-10-ours"


@dataclass(frozen=True)
class HighwayArch:
    """A layout: per stage (width, or None for the `width` argument; the highway layers' kernel
    sizes); `depth` counts layers as the paper does (conv layers and the classifier).

    The remaining fields describe the authors' released nets; their defaults are our layouts'
    conventions. `stem_kernel` / `stem_padding` (None: same padding); `pools` per stage (kernel,
    stride) or None for no pooling after that stage (default: 2/2 after every stage); `ceil_mode`
    rounds pooled sizes up as Caffe does; `dropout` is (input, after stage 1's pooling, ..., before
    the classifier), one rate per stage plus one, or () for none; `classifier` the head this layout
    is defined with (None: the `classifier` argument); `head_width` the maps of the "conv-gap-fc"
    head's 1×1 convolution; `stem_std` / `classifier_std` fixed Gaussian weight stds (None: `init`).
    """

    stages: tuple[tuple[int | None, tuple[int, ...]], ...]
    depth: int
    gate_bias: float
    source: str
    stem_kernel: int = 3
    stem_padding: int | None = None
    pools: tuple[tuple[int, int] | None, ...] | None = None
    ceil_mode: bool = False
    dropout: tuple[float, ...] = ()
    classifier: str | None = None
    head_width: int | None = None
    stem_std: float | None = None
    classifier_std: float | None = None


def _alternating(n: int) -> tuple[int, ...]:
    return tuple(3 if i % 2 == 0 else 1 for i in range(n))


_MNIST_FILE = "flukeskywalker/highway-networks examples/highways/mnist-10layers/mnist_network.prototxt"
_CIFAR_FILE = "flukeskywalker/highway-networks examples/highways/{0}-19layers/{0}_network.prototxt"

HIGHWAY_ARCHS: dict[str, HighwayArch] = {
    "mnist-10": HighwayArch(
        stages=((None, (3, 3)), (None, (3, 3, 3)), (None, (3, 3, 3))), depth=10, gate_bias=-1.0,
        stem_kernel=5, stem_padding=0, pools=((3, 2), (3, 2), (2, 2)), ceil_mode=True,
        dropout=(0.2, 0.3, 0.4, 0.5), classifier="linear", classifier_std=0.1,
        source=f"highway §3.2 Table 1, the authors' net: {_MNIST_FILE} (width 32 there)"),
    "cifar10-19": HighwayArch(
        stages=((32, (3,) * 4), (80, (3,) * 5), (128, (3,) * 5)), depth=19, gate_bias=-2.0,
        pools=((2, 2), (2, 2), None), ceil_mode=True, dropout=(0.2, 0.2, 0.2, 0.2), classifier="conv-gap-fc",
        head_width=100, stem_std=1.0, classifier_std=0.05,
        source="highway §3.3.2 Table 3 (CIFAR-10), the authors' net: " + _CIFAR_FILE.format("cifar10")),
    "cifar100-19": HighwayArch(
        stages=((32, (3,) * 4), (80, (3,) * 5), (128, (3,) * 5)), depth=19, gate_bias=-2.0,
        pools=((2, 2), (2, 2), None), ceil_mode=True, dropout=(0.2, 0.2, 0.2, 0.2), classifier="conv-gap-fc",
        head_width=100, stem_std=1.0,
        source="highway §3.3.2 Table 3 (CIFAR-100), the authors' net: " + _CIFAR_FILE.format("cifar100")),
    LEGACY_MNIST_ARCH: HighwayArch(
        stages=((None, (3, 3)), (None, (3, 3, 3)), (None, (3, 3, 3))), depth=10, gate_bias=-1.0,
        source="highway §3.2 Table 1: 10-layer conv highway nets, width 16 / 32, 39K / 151K (our layout)"),
    "highway-a": HighwayArch(stages=((16, (3, 3, 3)), (32, (3, 3)), (64, (3, 3))), depth=11, gate_bias=-1.0,
                             source="highway §3.3.1 Table 2: Highway A (Fitnet A), ≈236K"),
    "highway-b": HighwayArch(stages=((32, (3,) * 5), (80, (3,) * 5), (128, (3,) * 5)), depth=19, gate_bias=-2.0,
                             source="highway §3.3.1 Table 2: Highway B (Fitnet B), ≈2.3M"),
    "highway-c": HighwayArch(stages=((32, _alternating(9)), (64, _alternating(10)), (80, _alternating(9))),
                             depth=32, gate_bias=-3.0,
                             source="highway §3.3.1 Table 2: Highway C, 32 layers, 3×3 and 1×1 alternating, "
                                    "≈1.25M"),
}


def with_legacy_layout(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (a model.config, {"name": ..., **arguments}) with arch "mnist-10" renamed to
    LEGACY_MNIST_ARCH when it records no `dropout` argument: models and results saved before the
    authors' layout took the name "mnist-10" were built with our layout, and had no such argument."""
    if config.get("name") == "highway_conv" and "dropout" not in config and config.get("arch", "mnist-10") == "mnist-10":
        return {**config, "arch": LEGACY_MNIST_ARCH}
    return dict(config)


def _pooled(size: int, kernel: int, stride: int, ceil_mode: bool) -> int:
    # Caffe (pooling_layer.cpp) rounds up, as torch's ceil_mode does without padding.
    steps = (size - kernel) / stride
    return (math.ceil(steps) if ceil_mode else math.floor(steps)) + 1


@register_model("highway_conv", "convolutional highway net: plain conv per stage, highway conv layers y = H·T + x·(1−T), max pooling; the authors' released MNIST and CIFAR nets and our Fitnet-based layouts (highway §3.2, §3.3)")
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
    dropout: bool = True,
) -> ConvNet:
    """The highway layout `arch` (see HIGHWAY_ARCHS and the module docstring).

    `depth`, when given, must equal the layout's layer count (10, 11, 19, 32); `width` sets the
    width of "mnist-10" and "mnist-10-ours" only. `classifier` "linear" (a fully connected layer on
    the flattened last maps, highway Tables 1 and 2) or "conv-gap" (1×1 convolution to the classes,
    then global average pooling: the CIFAR nets of Table 3, §3.3.2) for our layouts; the authors'
    layouts have their own head and accept only it ("linear" for mnist-10, "conv-gap-fc" for the
    CIFAR nets, which is also taken when `classifier` is left at "linear"). `image_size` is the input
    side, which the flattened classifier needs. `gate_bias` overrides the layout's transform-gate
    bias (T's bias stays a trained parameter). `dropout=False` leaves out the layout's dropout
    layers (our layouts have none). The authors' layouts' fixed Gaussian stds (stem, classifier)
    are applied after `init`.
    """
    if arch not in HIGHWAY_ARCHS:
        raise ValueError(f"arch={arch!r} is not known; accepted values: {sorted(HIGHWAY_ARCHS)}")
    if classifier not in CLASSIFIERS:
        raise ValueError(f"classifier={classifier!r} is not known; accepted values: {list(CLASSIFIERS)}")
    spec = HIGHWAY_ARCHS[arch]
    if spec.classifier is not None:
        if classifier == "linear":
            classifier = spec.classifier
        if classifier != spec.classifier:
            raise ValueError(f"classifier={classifier!r}: layout {arch!r} is the authors' net, whose head is "
                             f"{spec.classifier!r}; accepted values: [{spec.classifier!r}]")
    elif classifier == "conv-gap-fc":
        raise ValueError(f"classifier='conv-gap-fc' is the authors' CIFAR head; for layout {arch!r} accepted "
                         f"values: ['linear', 'conv-gap']")
    if depth is not None and depth != spec.depth:
        raise ValueError(f"depth={depth}: layout {arch!r} has {spec.depth} layers; pass depth={spec.depth} or omit it")
    check_positive_int("width", width)
    check_positive_int("in_channels", in_channels)
    check_positive_int("num_classes", num_classes, 2)
    check_positive_int("image_size", image_size, 8)
    if not isinstance(dropout, bool):
        raise ValueError(f"dropout={dropout!r}: must be true or false")
    bias = spec.gate_bias if gate_bias is None else float(gate_bias)
    rates = spec.dropout if dropout and spec.dropout else (0.0,) * (len(spec.stages) + 1)
    pools = spec.pools or ((2, 2),) * len(spec.stages)

    def drop(rate: float) -> list[nn.Module]:
        return [nn.Dropout(rate)] if rate > 0 else []

    blocks: list[nn.Module] = []
    channels, size = in_channels, image_size
    stem_convs: list[nn.Conv2d] = []
    for index, (stage_width, kernels) in enumerate(spec.stages):
        out = width if stage_width is None else stage_width
        if index == 0:
            padding = spec.stem_kernel // 2 if spec.stem_padding is None else spec.stem_padding
            stem_convs.append(nn.Conv2d(channels, out, spec.stem_kernel, padding=padding))
            stem = nn.Sequential(*drop(rates[0]), stem_convs[0], nn.ReLU())
            size = size + 2 * padding - spec.stem_kernel + 1
        elif out != channels:
            blocks.append(PlainBlock(nn.Sequential(nn.Conv2d(channels, out, 3, padding=1), nn.ReLU())))
        channels = out
        blocks.extend(conv_highway_layer(channels, k, bias) for k in kernels)
        if pools[index] is not None:
            kernel, stride = pools[index]  # type: ignore[misc]
            size = _pooled(size, kernel, stride, spec.ceil_mode)
            if size < 1:
                raise ValueError(f"image_size={image_size}: too small for layout {arch!r} (its feature maps "
                                 f"vanish at stage {index + 1}); use the layout's input size")
            pool = nn.MaxPool2d(2) if spec.pools is None else nn.MaxPool2d(kernel, stride, ceil_mode=spec.ceil_mode)
            blocks.append(PlainBlock(pool))
        if index < len(spec.stages) - 1:
            blocks.extend(PlainBlock(d) for d in drop(rates[index + 1]))
    if classifier == "conv-gap":
        head: nn.Module = nn.Sequential(nn.Conv2d(channels, num_classes, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    elif classifier == "conv-gap-fc":
        assert spec.head_width is not None
        head = nn.Sequential(OrderedDict([
            ("conv", nn.Conv2d(channels, spec.head_width, 1)), ("relu", nn.ReLU()), ("pool", nn.AdaptiveAvgPool2d(1)),
            ("dropout", nn.Dropout(rates[-1]) if rates[-1] > 0 else nn.Identity()), ("flatten", nn.Flatten()),
            ("classifier", nn.Linear(spec.head_width, num_classes))]))
    elif spec.classifier is not None:
        head = nn.Sequential(OrderedDict([
            ("dropout", nn.Dropout(rates[-1]) if rates[-1] > 0 else nn.Identity()), ("flatten", nn.Flatten()),
            ("classifier", nn.Linear(channels * size * size, num_classes))]))
    else:
        head = nn.Sequential(nn.Flatten(), nn.Linear(channels * size * size, num_classes))
    model = init_weights_(ConvNet(stem, blocks, head), init)
    # Caffe "gaussian" fillers of the authors' nets (module docstring): zero-mean, fixed std, zero bias.
    fixed = [(stem_convs[0], spec.stem_std)]
    if spec.classifier is not None:
        fixed.append((head.classifier, spec.classifier_std))  # type: ignore[arg-type]
    for module, std in fixed:
        if std is not None:
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return model
