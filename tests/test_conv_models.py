"""Convolutional models: shapes, gradients, gate semantics and the papers' parameter counts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from throughway.layers import ScalarGate, TransformGate, find_branches
from throughway.layers.conv import PreActBlock, WideBlock, ZeroPadShortcut, conv_highway_layer
from throughway.models import create_model


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def meta_count(name: str, **kwargs) -> int:
    with torch.device("meta"):
        return count(create_model(name, **kwargs))


# --- parameter counts against the published figures -------------------------------------------

def test_wrn_28_10_parameter_counts_match_the_published_figures():
    # Zagoruyko & Komodakis 2016 / gated-residual-v2 Table 4 ("36.5M").
    assert meta_count("wide_resnet", depth=28, widen_factor=10, dropout=0.3, num_classes=10, gated=False) == 36_479_194
    assert meta_count("wide_resnet", depth=28, widen_factor=10, dropout=0.3, num_classes=100, gated=False) == 36_536_884


def test_wrn_22_4_parameter_count():
    assert meta_count("wide_resnet", depth=22, widen_factor=4, dropout=0.3, num_classes=10) == 4_298_970


@pytest.mark.parametrize("name,kwargs,extra", [
    ("wide_resnet", {"depth": 28, "widen_factor": 10, "dropout": 0.3, "num_classes": 10}, 12),  # v2 Table 3
    ("wide_resnet", {"depth": 22, "widen_factor": 4, "dropout": 0.3, "num_classes": 10}, 9),    # v1 Table 4
    ("preact_resnet", {"depth": 32, "num_classes": 10, "shortcut": "B"}, 15),                  # ResNet n=5
])
def test_gated_variants_add_exactly_one_parameter_per_block(name, kwargs, extra):
    assert meta_count(name, gated=True, **kwargs) - meta_count(name, gated=False, **kwargs) == extra


@pytest.mark.parametrize("shortcut", ["A", "B"])
def test_resnet_110_has_about_1_7_million_parameters(shortcut):
    n = meta_count("preact_resnet", depth=110, num_classes=10, shortcut=shortcut)
    assert 1.69e6 < n < 1.75e6  # He et al.: "1.7M"


def test_highway_parameter_counts_are_near_the_papers():
    # highway Table 1 (39K / 151K) and Table 2 (Highway A ≈236K, B ≈2.3M, C ≈1.25M). Our layouts are pinned to
    # their exact counts and must round to (or lie within 3% of) the paper's (the authors' nets: the tests of their prototxts below).
    w16 = count(create_model("highway_conv", arch="mnist-10-ours", width=16))
    w32 = count(create_model("highway_conv", arch="mnist-10-ours", width=32))
    assert (w16, w32) == (38_730, 151_178) and (round(w16, -3), round(w32, -3)) == (39_000, 151_000)
    for arch, exact, paper in (("highway-a", 232_458, 236e3), ("highway-b", 2_281_914, 2.3e6),
                               ("highway-c", 1_218_810, 1.25e6)):
        n = meta_count("highway_conv", arch=arch, in_channels=3, image_size=32)
        assert n == exact and abs(n - paper) / paper < 0.03, (arch, n)


def _paper_layers(model: nn.Module) -> int:
    """Layers as the highway paper counts them: plain convolutions, highway layers (H and T together),
    and the classifier."""
    highway = [b for b in model.blocks if isinstance(b.gate, TransformGate)]
    plain_convs = [m for b in model.blocks if not isinstance(b.gate, TransformGate)
                   for m in b.modules() if isinstance(m, nn.Conv2d)]
    stem_convs = [m for m in model.stem.modules() if isinstance(m, nn.Conv2d)]
    # A 1×1 convolution before a fully connected classifier is a layer of its own (the authors' CIFAR head);
    # in the "conv-gap" head it is the classifier.
    head_convs = [m for m in model.head.modules() if isinstance(m, nn.Conv2d)] if isinstance(model.head[-1], nn.Linear) else []
    return len(stem_convs) + len(plain_convs) + len(highway) + len(head_convs) + 1


@pytest.mark.parametrize("arch,layers,kernels", [
    ("mnist-10", 10, {3}), ("mnist-10-ours", 10, {3}), ("highway-a", 11, {3}), ("highway-b", 19, {3}),
    ("highway-c", 32, {1, 3}), ("cifar10-19", 19, {3}), ("cifar100-19", 19, {3})])
def test_highway_layouts_have_the_papers_layer_counts(arch, layers, kernels):
    with torch.device("meta"):
        mnist = arch.startswith("mnist")
        model = create_model("highway_conv", arch=arch, in_channels=1 if mnist else 3, image_size=28 if mnist else 32,
                             depth=layers)
    assert _paper_layers(model) == layers
    used = {b.branch[0].kernel_size[0] for b in model.blocks if isinstance(b.gate, TransformGate)}
    assert used == kernels  # highway-c alternates 3×3 and 1×1 receptive fields (§3.3.1)


def test_cifar_variant_replaces_the_fully_connected_layer_by_1x1_conv_and_global_average_pooling():
    # highway §3.3.2: "replaced the fully connected layer ... with a convolutional layer with a
    # receptive field of size one and a global average pooling layer".
    kwargs = {"arch": "highway-b", "in_channels": 3, "image_size": 32, "num_classes": 100}
    fc = create_model("highway_conv", classifier="linear", **kwargs)
    gap = create_model("highway_conv", classifier="conv-gap", **kwargs)
    assert [type(m) for m in fc.head] == [nn.Flatten, nn.Linear] and fc.head[1].in_features == 128 * 4 * 4
    assert [type(m) for m in gap.head] == [nn.Conv2d, nn.AdaptiveAvgPool2d, nn.Flatten]
    assert gap.head[0].kernel_size == (1, 1) and gap.head[0].out_channels == 100
    assert count(fc) - count(gap) == (128 * 16 - 128) * 100  # the same body, a smaller classifier
    x = torch.randn(2, 3, 32, 32)
    assert gap(x).shape == fc(x).shape == (2, 100)
    # The class scores are the spatial mean of the 1×1 convolution's maps.
    maps = gap.head[0](gap.forward_features(x))
    assert torch.allclose(gap(x), maps.mean(dim=(2, 3)), atol=1e-6)


# --- shapes, gradients, contract -----------------------------------------------------------------

@pytest.mark.parametrize("name,kwargs,shape", [
    ("preact_resnet", {"depth": 8, "gated": True}, (2, 3, 32, 32)),
    ("preact_resnet", {"depth": 8, "shortcut": "A", "in_channels": 1}, (2, 1, 28, 28)),
    ("wide_resnet", {"depth": 10, "widen_factor": 1, "dropout": 0.3, "gated": True}, (2, 3, 32, 32)),
    ("highway_conv", {"arch": "mnist-10", "width": 4}, (2, 1, 28, 28)),
    ("highway_conv", {"arch": "highway-a", "in_channels": 3, "image_size": 32, "classifier": "conv-gap"},
     (2, 3, 32, 32)),
])
def test_forward_shape_and_every_parameter_gets_a_gradient(name, kwargs, shape):
    torch.manual_seed(0)
    model = create_model(name, num_classes=7, **kwargs)
    logits = model(torch.randn(*shape))
    assert logits.shape == (shape[0], 7) and torch.isfinite(logits).all()
    logits.square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    assert isinstance(model.blocks, nn.ModuleList)
    for block in model.blocks:
        assert hasattr(block, "branch") and hasattr(block, "shortcut") and hasattr(block, "gate")
    features = model.forward_features(torch.randn(*shape))
    assert model.forward_head(features).shape == (shape[0], 7)


def test_closed_gate_reduces_a_block_to_its_shortcut():
    torch.manual_seed(0)
    x = torch.randn(3, 8, 6, 6)
    same = PreActBlock(8, 8, gated=True).eval()
    same.gate.k.data.fill_(-0.5)  # g = ReLU: any k ≤ 0 closes the gate exactly
    assert torch.equal(same(x), x)
    down = WideBlock(8, 16, stride=2, gated=True).eval()
    down.gate.k.data.fill_(0.0)
    # The projection shortcut stays ungated and is fed the pre-activated input.
    assert torch.allclose(down(x), down.shortcut(down.preact(x)))
    down.gate.k.data.fill_(1.0)
    ungated = WideBlock(8, 16, stride=2, gated=False).eval()
    ungated.load_state_dict({k: v for k, v in down.state_dict().items() if not k.endswith("gate.k")})
    assert torch.allclose(down(x), ungated(x), atol=1e-6)  # k = 1 is the ungated block


@pytest.mark.parametrize("name,kwargs", [
    ("preact_resnet", {"depth": 8, "shortcut": "B"}),
    ("wide_resnet", {"depth": 10, "widen_factor": 2, "dropout": 0.0}),
])
def test_projection_shortcuts_take_the_preactivated_input_and_stay_ungated(name, kwargs):
    # He et al. 2016 and WRN reference codes: BN-ReLU once, then both the convolutions and the 1×1
    # projection; the gate multiplies the residual branch only.
    torch.manual_seed(0)
    model = create_model(name, gated=True, num_classes=10, **kwargs).eval()
    for block in model.blocks:  # non-trivial BatchNorm statistics, so preact(x) differs from ReLU(x)
        block.preact[0].running_mean.uniform_(-1, 1)
        block.preact[0].running_var.uniform_(0.5, 2)
    projections = [b for b in model.blocks if isinstance(b.shortcut, nn.Conv2d)]
    assert len(projections) == (2 if name == "preact_resnet" else 3)
    x = torch.randn(2, projections[-1].shortcut.in_channels, 8, 8)
    block = projections[-1]
    block.gate.k.data.fill_(0.0)
    assert torch.allclose(block(x), block.shortcut(block.preact(x)), atol=1e-6)
    assert not torch.allclose(block(x), block.shortcut(x), atol=1e-3)


def test_preact_block_feeds_raw_input_to_zero_padding_shortcut():
    block = PreActBlock(4, 8, stride=2, shortcut="A", gated=True).eval()
    block.gate.k.data.fill_(0.0)
    x = torch.randn(2, 4, 8, 8)
    out = block(x)
    assert torch.equal(out[:, :4], x[:, :, ::2, ::2]) and torch.equal(out[:, 4:], torch.zeros(2, 4, 4, 4))
    assert isinstance(block.shortcut, ZeroPadShortcut) and not list(block.shortcut.parameters())


def test_gated_models_have_one_scalar_gate_per_block_and_only_on_the_branch():
    model = create_model("preact_resnet", depth=14, gated=True)
    gates = [ref.gate for ref in find_branches(model).values() if ref.gate is not None]
    assert len(gates) == len(model.blocks) == 6
    assert all(isinstance(b.gate, ScalarGate) and b.gate.k.item() == 1.0 for b in model.blocks)
    assert all(isinstance(b.gate, nn.Identity) for b in create_model("preact_resnet", depth=14).blocks)


def test_conv_highway_layer_carries_input_when_gate_closed_and_keeps_size():
    layer = conv_highway_layer(5, kernel_size=3, gate_bias=-1.0)
    assert isinstance(layer.gate, TransformGate)
    assert layer.gate.linear.kernel_size == layer.branch[0].kernel_size == (3, 3)  # same receptive field
    assert torch.all(layer.gate.linear.bias == -1.0)
    x = torch.randn(2, 5, 7, 7)
    assert layer(x).shape == x.shape
    layer.gate.linear.bias.data.fill_(-1e4)
    assert torch.allclose(layer(x), x)  # T = 0: y = x (highway eq. 4)


def test_highway_gate_bias_survives_init_and_is_a_parameter():
    model = create_model("highway_conv", arch="mnist-10", width=4, gate_bias=-3.0)
    biases = [m.linear.bias for m in model.modules() if isinstance(m, TransformGate)]
    assert len(biases) == 8 and all(torch.all(b == -3.0) for b in biases)
    assert all(isinstance(b, nn.Parameter) and b.requires_grad for b in biases)


@pytest.mark.parametrize("name,kwargs,field", [
    ("preact_resnet", {"depth": 30}, "depth"),
    ("preact_resnet", {"depth": 8, "shortcut": "C"}, "shortcut"),
    ("wide_resnet", {"depth": 27}, "depth"),
    ("highway_conv", {"arch": "highway-z"}, "arch"),
    ("highway_conv", {"depth": 12}, "depth"),
    ("highway_conv", {"classifier": "mlp"}, "classifier"),
])
def test_bad_arguments_name_the_field(name, kwargs, field):
    with pytest.raises(ValueError, match=field):
        create_model(name, **kwargs)


def test_dropout_sits_between_the_convolutions_of_a_wide_block():
    block = WideBlock(4, 4, dropout=0.3)
    kinds = [type(m) for m in block.branch]
    assert kinds == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.Dropout, nn.Conv2d]
    assert block.branch[3].p == 0.3


def test_shortcut_depths_share_one_parameter_count():
    # Demystifying ResNet figure 9: shortcut depth 1..4 at a fixed parameter count (m = 12 per stage).
    counts = {n: count(create_model("preact_shortcut_depth", depth=38, shortcut_depth=n)) for n in (1, 2, 3, 4)}
    assert len(set(counts.values())) == 1
    models = {n: create_model("preact_shortcut_depth", depth=38, shortcut_depth=n) for n in (1, 2, 3, 4)}
    assert {n: len(m.blocks) for n, m in models.items()} == {1: 36, 2: 18, 3: 12, 4: 9}
    for n, model in models.items():  # every shortcut spans n convolutions
        assert {sum(isinstance(m, nn.Conv2d) for m in b.branch) for b in model.blocks} == {n}
    with torch.device("meta"):  # and at depth 110 (m = 36 per stage) as well
        deep = {count(create_model("preact_shortcut_depth", depth=110, shortcut_depth=n)) for n in (1, 2, 3, 4)}
    assert len(deep) == 1
    with pytest.raises(ValueError, match="shortcut_depth"):
        create_model("preact_shortcut_depth", depth=14, shortcut_depth=3)


# -- the highway authors' released Caffe nets (flukeskywalker/highway-networks, examples/highways/):
# every expected value read from those files by hand (file and line in the comments) --------------------

def layer_list(model: nn.Module) -> list[tuple]:
    """The model's layers in forward order, in the prototxt's terms."""
    out: list[tuple] = []

    def visit(module: nn.Module) -> None:
        if isinstance(module, nn.Dropout):
            out.append(("Dropout", module.p))
        elif isinstance(module, nn.Conv2d):
            out.append(("Convolution", module.in_channels, module.out_channels, module.kernel_size[0], module.padding[0]))
        elif isinstance(module, nn.ReLU):
            out.append(("ReLU",))
        elif isinstance(module, nn.MaxPool2d):
            out.append(("Pooling MAX", module.kernel_size, module.stride, module.ceil_mode))
        elif isinstance(module, nn.AdaptiveAvgPool2d):
            out.append(("Pooling AVE global",))
        elif isinstance(module, nn.Linear):
            out.append(("InnerProduct", module.in_features, module.out_features))
        elif isinstance(module, TransformGate):
            return
        elif hasattr(module, "gate") and isinstance(module.gate, TransformGate):
            conv = module.gate.linear
            out.append(("CuDNNHighway", conv.in_channels, conv.kernel_size[0], conv.padding[0],
                        float(module.gate.linear.bias[0].detach())))
            return
        for child in module.children():
            visit(child)

    visit(model)
    return out


def highway(channels: int, bias: float) -> tuple:
    return ("CuDNNHighway", channels, 3, 1, bias)  # kernel_size 3, pad 1, transform_bias_filler value


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_mnist_layout_is_the_prototxts_layer_list():
    model = create_model("highway_conv", arch="mnist-10", width=32)  # num_output 32 in the file
    expected = [  # mnist-10layers/mnist_network.prototxt
        ("Dropout", 0.2),                        # drop1, lines 53-61
        ("Convolution", 1, 32, 5, 0), ("ReLU",),  # s1-conv1 (kernel 5, pad 0), relu, lines 62-93
        highway(32, -1.0), highway(32, -1.0),    # s1-conv2, s1-conv3, lines 94-169
        ("Pooling MAX", 3, 2, True),             # pool1, lines 170-181 (Caffe rounds up)
        ("Dropout", 0.3),                        # drop2, lines 182-190
        *[highway(32, -1.0)] * 3,                # s2-conv1..3, lines 191-304
        ("Pooling MAX", 3, 2, True),             # pool2, lines 305-316
        ("Dropout", 0.4),                        # drop3, lines 317-325
        *[highway(32, -1.0)] * 3,                # s3-conv1..3, lines 326-439
        ("Pooling MAX", 2, 2, True),             # pool3, lines 440-450
        ("Dropout", 0.5),                        # drop4, lines 451-459
        ("InnerProduct", 32 * 3 * 3, 10),        # ip2, lines 460-483 (on 32·3·3 features, sample.log line 616)
    ]
    assert layer_list(model) == expected


@pytest.mark.parametrize("name,classes", [("cifar10-19", 10), ("cifar100-19", 100)])
def test_cifar_layouts_are_the_prototxts_layer_list(name, classes):
    model = create_model("highway_conv", arch=name, in_channels=3, image_size=32, num_classes=classes)
    expected = [  # cifar10-19layers/cifar10_network.prototxt (cifar100's differs in ip2 only)
        ("Dropout", 0.2),                                     # drop1, 57-65
        ("Convolution", 3, 32, 3, 1), ("ReLU",),              # conv1, relu1, 66-98
        *[highway(32, -2.0)] * 4,                             # conv2-conv5, 99-250
        ("Pooling MAX", 2, 2, True), ("Dropout", 0.2),        # pool1, drop2, 251-270
        ("Convolution", 32, 80, 3, 1), ("ReLU",),             # conv6, relu6, 271-302
        *[highway(80, -2.0)] * 5,                             # conv7-conv11, 303-492
        ("Pooling MAX", 2, 2, True), ("Dropout", 0.2),        # pool2, drop3, 493-512
        ("Convolution", 80, 128, 3, 1), ("ReLU",),            # conv12, relu12, 513-544
        *[highway(128, -2.0)] * 5,                            # conv13-conv17, 545-734
        ("Convolution", 128, 100, 1, 0), ("ReLU",),           # conv18 (1×1 to 100 maps), relu, 735-766
        ("Pooling AVE global",),                              # pool3: AVE 8/8 on 8×8 maps, 767-777
        ("Dropout", 0.2),                                     # drop4, 778-786
        ("InnerProduct", 100, classes),                       # ip2, 787-810
    ]
    assert layer_list(model) == expected


def test_parameter_counts_are_the_prototxts():
    # MNIST, width w: conv1 1·5·5·w + w = 26w; each highway layer two 3×3 convolutions (H and T) with
    # biases, 2·(9w² + w); eight of them; ip2 (9w)·10 + 10. Total 144w² + 132w + 10:
    #   w = 16: 36,864 + 2,112 + 10 = 38,986 (paper: 39K);  w = 32: 147,456 + 4,224 + 10 = 151,690 (paper: 151K).
    assert _count(create_model("highway_conv", arch="mnist-10", width=16)) == 38_986
    assert _count(create_model("highway_conv", arch="mnist-10", width=32)) == 151_690
    # CIFAR-10: conv1 3·9·32 + 32 = 896; 4 highway(32) 4·2·(9·32² + 32) = 73,984; conv6 32·9·80 + 80 = 23,120;
    # 5 highway(80) 5·2·(9·80² + 80) = 576,800; conv12 80·9·128 + 128 = 92,288; 5 highway(128)
    # 5·2·(9·128² + 128) = 1,475,840; conv18 128·100 + 100 = 12,900; ip2 100·10 + 10 = 1,010. Sum 2,256,838.
    # CIFAR-100: ip2 100·100 + 100 = 10,100 instead: 2,265,928 (paper: ≈2.3M).
    with torch.device("meta"):
        c10 = create_model("highway_conv", arch="cifar10-19", in_channels=3, image_size=32, num_classes=10)
        c100 = create_model("highway_conv", arch="cifar100-19", in_channels=3, image_size=32, num_classes=100)
    assert (_count(c10), _count(c100)) == (2_256_838, 2_265_928)


def test_feature_map_sizes_are_the_logs():
    # mnist-10layers/sample.log "Top shape" lines 511-609: 24 (5×5 valid), 12, 6, 3 (pooling rounds up).
    model = create_model("highway_conv", arch="mnist-10", width=4).eval()
    h, sizes = model.stem(torch.zeros(1, 1, 28, 28)), []
    sizes.append(h.shape[-1])
    for block in model.blocks:
        h = block(h)
        if isinstance(block.branch, nn.MaxPool2d):
            sizes.append(h.shape[-1])
    assert sizes == [24, 12, 6, 3]
    # cifar10 sample.log lines 838-1006: 32, 16, 8, then 100 maps of 8×8 before the average pooling.
    cifar = create_model("highway_conv", arch="cifar10-19", in_channels=3, image_size=32, width=4).eval()
    assert cifar.forward_features(torch.zeros(1, 3, 32, 32)).shape == (1, 128, 8, 8)
    assert cifar.head.conv(torch.zeros(1, 128, 8, 8)).shape == (1, 100, 8, 8)


def test_initialisation_follows_the_fillers():
    torch.manual_seed(0)
    model = create_model("highway_conv", arch="mnist-10", width=32)
    # The authors' "xavier" filler is N(0, 2 / fan_in) (include/caffe/filler.hpp lines 150-155).
    for block in model.blocks:
        if isinstance(getattr(block, "gate", None), TransformGate):
            for conv in (block.branch[0], block.gate.linear):
                assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (32 * 9)), rel=0.05)
            assert torch.all(block.branch[0].bias == 0) and torch.all(block.gate.linear.bias == -1.0)
    # ip2: gaussian std 0.1 (mnist_network.prototxt lines 475-478); 2,880 draws.
    assert model.head.classifier.weight.std().item() == pytest.approx(0.1, rel=0.05)
    cifar = create_model("highway_conv", arch="cifar10-19", in_channels=3, image_size=32)
    # conv1 "gaussian" with `value: 0.05`, which the Gaussian filler ignores: std 1 (caffe.proto line 48).
    assert cifar.stem[1].weight.std().item() == pytest.approx(1.0, rel=0.15)
    assert cifar.head.classifier.weight.std().item() == pytest.approx(0.05, rel=0.1)  # lines 802-805
    c100 = create_model("highway_conv", arch="cifar100-19", in_channels=3, image_size=32, num_classes=100)
    assert c100.head.classifier.weight.std().item() == pytest.approx(math.sqrt(2 / 100), rel=0.05)  # "xavier"


@pytest.mark.parametrize("kwargs,field", [
    ({"arch": "mnist-10", "classifier": "conv-gap"}, "classifier"),
    ({"arch": "highway-a", "classifier": "conv-gap-fc"}, "classifier"),
    ({"arch": "cifar10-19", "image_size": 4}, "image_size"),
    ({"arch": "cifar10-19", "depth": 18}, "depth"),
])
def test_bad_layout_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        create_model("highway_conv", **kwargs)


def test_dropout_false_removes_every_dropout_layer():
    model = create_model("highway_conv", arch="mnist-10", width=4, dropout=False)
    assert not [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert _count(model) == _count(create_model("highway_conv", arch="mnist-10", width=4))
