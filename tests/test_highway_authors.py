"""The highway authors' released Caffe nets and solvers (flukeskywalker/highway-networks,
examples/highways/): layouts, parameter counts, initialisation, and recipes against the files.

Every expected value below was read from those files by hand (file and line in the comments); the
code under test was written from the same reading, so these tests pin the reading, and a change to a
layout or recipe that drifts from the files fails here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from throughway.data import DataSplits, Split
from throughway.data.augment import normalize_splits
from throughway.layers import TransformGate
from throughway.models import LEGACY_MNIST_ARCH, create_model, with_legacy_config
from throughway.train import build_optimizer, get_recipe, learning_rate_at, parameter_groups
from throughway.train.checkpoint import load_model, save_model
from throughway.train.loop import set_learning_rate

REPO = Path(__file__).resolve().parents[1]


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


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


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


def test_mnist_recipe_is_the_solvers():
    r = get_recipe("highway-conv-mnist")
    # mnist-10layers/mnist_solver.prototxt: 13 NESTEROV, 14 base_lr, 15 momentum, 18-21 multistep gamma 0.1 at
    # 60000 and 120000, 22 weight_decay, 28 max_iter; mnist_network.prototxt 9 batch_size, 13 scale 1/256.
    base_lr, momentum, gamma, steps, weight_decay, max_iter, batch = 0.01, 0.9, 0.1, (60_000, 120_000), 0.001, 180_000, 100
    images = 600 * batch  # test-on-train: test_iter 600 (solver line 5) × batch 100 covers the training set once
    per_epoch = images // batch
    assert (r.optimizer, r.nesterov, r.lr, r.momentum, r.weight_decay, r.batch_size) == \
        ("sgd", True, base_lr, momentum, weight_decay, batch)
    assert r.epochs == max_iter // per_epoch == 300
    assert [learning_rate_at(r, e) for e in (0, steps[0] // per_epoch - 1, steps[0] // per_epoch,
                                             steps[1] // per_epoch - 1, steps[1] // per_epoch, r.epochs - 1)] == \
        pytest.approx([base_lr, base_lr, base_lr * gamma, base_lr * gamma, base_lr * gamma ** 2, base_lr * gamma ** 2])
    assert r.normalize == "pixels/256" and r.augment == "none"
    assert all("line" in note for note in r.notes[:4])  # every value carries its file line


def test_cifar_recipe_is_the_solvers():
    r = get_recipe("highway-conv-cifar")
    # cifar10-19layers/cifar10_solver.prototxt: 13-15 NESTEROV, base_lr 0.025, momentum 0.9; 18-22 multistep
    # gamma 0.1 at 100000, 150000, 175000; 23 weight_decay 0.001; 29 max_iter 200000; test-on-train
    # test_iter 500 (line 5) × batch 100 (network line 9) = 50,000 training images.
    per_epoch = 500
    assert (r.nesterov, r.lr, r.momentum, r.weight_decay, r.batch_size, r.epochs) == \
        (True, 0.025, 0.9, 0.001, 100, 200_000 // per_epoch)
    drops = [e for e in range(1, r.epochs) if learning_rate_at(r, e) < learning_rate_at(r, e - 1)]
    assert drops == [s // per_epoch for s in (100_000, 150_000, 175_000)]
    # The authors' data (issue 23; tests/test_cifar_authors.py): pad 8, GCN + mean image.
    assert (r.augment, r.normalize) == ("crop-flip-8", "gcn-mean-image")


def test_authors_recipes_give_caffes_multipliers():
    model = create_model("highway_conv", arch="mnist-10", width=4)
    recipe = get_recipe("highway-conv-mnist")
    by_param = {}
    for group in parameter_groups(model, recipe):
        for p in group["params"]:
            by_param[id(p)] = (recipe.lr * group["lr_mult"], group["weight_decay"])  # the loop sets lr = lr × lr_mult
    for name, p in model.named_parameters():
        if name.endswith(".bias"):  # every bias: lr_mult 2, decay_mult 0
            assert by_param[id(p)] == (2 * recipe.lr, 0.0), name
        elif name == "head.classifier.weight":  # ip2 weight: decay_mult 10
            assert by_param[id(p)] == (recipe.lr, 10 * recipe.weight_decay), name
        else:
            assert by_param[id(p)] == (recipe.lr, recipe.weight_decay), name


def test_param_rules_first_match_wins_and_k_keeps_its_contract():
    model = create_model("mlp_gated_residual", depth=2, width=4, in_features=6)
    recipe = get_recipe("gresnet-mnist").replace(
        weight_decay=0.1, param_rules=(("blocks.0.*", 3.0, 0.5), ("*", 1.0, 0.0), ("*k", 5.0, 5.0)))
    groups = parameter_groups(model, recipe)
    where = {id(p): g for g in groups for p in g["params"]}
    for name, p in model.named_parameters():
        g = where[id(p)]
        if name.endswith("k"):  # k: never decayed without k_decay, whatever the rules say
            assert (g["lr_mult"], g["weight_decay"]) == (1.0, 0.0), name
        elif name.startswith("blocks.0."):
            assert (g["lr_mult"], g["weight_decay"]) == (3.0, pytest.approx(0.05)), name
        else:
            assert (g["lr_mult"], g["weight_decay"]) == (1.0, 0.0), name
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_lr_mult_scales_the_sgd_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    recipe = get_recipe("highway-conv-mnist").replace(weight_decay=0.0, momentum=0.0, nesterov=False,
                                                      param_rules=(("*.bias", 2.0, 0.0),))
    optimizer = build_optimizer(model, recipe)
    set_learning_rate(optimizer, 0.5)  # what the loop does each epoch
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(4, 3)).square().sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    optimizer.step()
    weight, bias = (b - p.detach() for b, p in zip(before, model.parameters()))
    assert torch.allclose(weight, 0.5 * grads[0]) and torch.allclose(bias, 1.0 * grads[1])


@pytest.mark.parametrize("rule", [("*.bias", -1.0, 0.0), ("*.bias", 2.0), (3, 1.0, 1.0)])
def test_bad_param_rules_name_the_field(rule):
    with pytest.raises(ValueError, match="param_rules"):
        get_recipe("highway-conv-mnist").replace(param_rules=(rule,))


def test_pixels_over_256_is_caffes_scaling():
    pixels = torch.arange(256, dtype=torch.float32).view(1, 1, 16, 16)
    split = Split(pixels / 255.0, torch.zeros(1, dtype=torch.int64))  # what the loader gives
    out = normalize_splits(DataSplits("mnist", 10, split, None, split), "pixels/256")
    assert torch.equal(out.train.x, pixels * 0.00390625) and out.val is None  # mnist_network.prototxt line 13


def test_old_mnist_10_files_load_as_our_layout(tmp_path):
    # results/conv/highway-conv-mnist-w16 was trained with the toolkit's earlier "mnist-10" layout.
    saved = json.loads((REPO / "results/conv/highway-conv-mnist-w16/results.json").read_text())["model"]
    config = with_legacy_config(saved["config"])
    assert config["arch"] == LEGACY_MNIST_ARCH
    name = config.pop("name")
    assert _count(create_model(name, **config)) == saved["parameters"]
    # A model file written then (no `dropout` in its config) loads into the same layout with its weights.
    model = create_model("highway_conv", arch=LEGACY_MNIST_ARCH, width=4)
    model.config = {k: v for k, v in model.config.items() if k != "dropout"} | {"arch": "mnist-10"}
    save_model(tmp_path / "old.safetensors", model)
    loaded = load_model(tmp_path / "old.safetensors")
    assert loaded.config["arch"] == LEGACY_MNIST_ARCH
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(loaded(x), model.eval()(x))
    # Files written now keep their layout.
    assert with_legacy_config(create_model("highway_conv", width=4).config)["arch"] == "mnist-10"


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


def test_highway_search_default_is_figure_1s_scale():
    from throughway.experiments import highway_depth as study

    config = study.Config()
    # highway §3.1: "a random search of 100 runs for both plain and highway networks", depths 10-100;
    # figure 1: 400 epochs on its x-axis; all 60,000 training images, none held out.
    assert (config.trials, config.epochs, config.layers) == (100, study.FIGURE1_EPOCHS, (10, 20, 50, 100))
    assert study.FIGURE1_EPOCHS == 400 and config.train_on_full and config.limit is None
    assert {s.config.epochs for s in study.specs(dataclasses.replace(config, layers=(10,), trials=2))} == {400}


def test_batched_training_refuses_param_rules(tmp_path, fake_mnist_root):
    from throughway.data import load_dataset
    from throughway.train import RunConfig
    from throughway.train.batched import train_batched

    rules = {"param_rules": (("*.bias", 2.0, 0.0),)}
    configs = [RunConfig(model="mlp_plain", depth=2, recipe="highway-mnist", epochs=1, seed=s,
                         model_kwargs={"width": 4}, recipe_overrides=rules) for s in (0, 1)]
    with pytest.raises(ValueError, match="param_rules"):  # its flat optimiser has no per-parameter multipliers
        train_batched(configs, [tmp_path / "a", tmp_path / "b"], data=load_dataset("mnist"), progress=False)
