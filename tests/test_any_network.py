"""Any residual network, not only ours: the block registry (layers.adapters), add_gates, lesion,
removal and pruning on torch's and Hugging Face transformers' real classes, and on faithful replicas
of torchvision's and timm's block classes (the same attribute names and forward; torchvision and
timm cannot be installed beside this torch, so their classes are matched by qualified name and the
replicas carry those names)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from throughway import add_gates, register_block
from throughway.analysis import (find_blocks, find_branches, gate_statistics, k_statistics, lesion, prune,
                                 removable_blocks, removal_curve, removal_order, unremovable_blocks)
from throughway.layers import ScalarGate, VectorGate, block_spec
from throughway.train import get_recipe, param_groups, parameter_groups

from conftest import TimmBasicBlock


def block_gates(model: nn.Module) -> dict:
    """Each branch's gate, from the one lister."""
    return {name: ref.gate for name, ref in find_branches(model).items()}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, atol=1e-6, rtol=1e-5)


# ---- torch's nn.TransformerEncoder ------------------------------------------------------------

class TokenNet(nn.Module):
    """A tiny sequence classifier over torch's encoder: (B, T, 8) -> (B, 3)."""

    def __init__(self, norm_first: bool, layers: int = 3) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True,
                                           norm_first=norm_first)
        self.embed = nn.Linear(8, 16)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


@pytest.mark.parametrize("norm_first", [True, False])
def test_torch_encoder_blocks_and_branches_are_named(norm_first):
    torch.manual_seed(0)
    net = TokenNet(norm_first)
    assert list(find_blocks(net)) == ["encoder.layers.0", "encoder.layers.1", "encoder.layers.2"]
    branches = find_branches(net)
    assert list(branches)[:2] == ["encoder.layers.0.attn", "encoder.layers.0.ff"]
    assert branches["encoder.layers.2.ff"].end == "encoder.layers.2.dropout2"
    assert all(ref.gate is None for ref in branches.values())


@pytest.mark.parametrize("norm_first", [True, False])
def test_relu_gates_at_k_1_leave_the_function_unchanged_and_train_lesion_and_prune(norm_first):
    torch.manual_seed(0)
    net = TokenNet(norm_first).eval()
    x = torch.randn(4, 5, 8)
    with torch.no_grad():
        before = net(x)
    add_gates(net, "relu")
    assert net.gates_added["branches"][0] == "encoder.layers.0.attn"
    with torch.no_grad():
        after = net(x)  # eval + no_grad: the fused encoder path must not skip the gates
    assert _same(before, after)
    gates = block_gates(net)
    assert len(gates) == 6 and all(isinstance(g, ScalarGate) for g in gates.values())
    # A closed ReLU gate is the lesion of its branch, in eval mode under no_grad too.
    with torch.no_grad():
        with lesion(net, "encoder.layers.1.ff"):
            lesioned = net(x)
        gates["encoder.layers.1.ff"].k.fill_(-0.5)
        closed = net(x)
        gates["encoder.layers.1.ff"].k.fill_(1.0)
    assert not _same(lesioned, before) and _same(lesioned, closed)
    stats = k_statistics(net)
    assert stats["num_blocks"] == 6 and stats["blocks"][3] == "encoder.layers.1.ff"
    # the gates train: k gets a gradient
    net.train()
    net(x).sum().backward()
    assert all(float(g.k.grad.abs()) > 0 for g in gates.values())
    # removal: every layer keeps the shape; greedy order from the gates
    assert removable_blocks(net) == list(find_blocks(net))
    gates["encoder.layers.2.attn"].k.data.fill_(0.1)
    gates["encoder.layers.2.ff"].k.data.fill_(0.2)
    assert removal_order(net, "greedy")[0] == 2
    net.eval()
    curve = removal_curve(net, removal_order(net, "greedy"), lambda m: float(m(x).detach().abs().mean()), max_removed=2)
    assert len(curve) == 3 and curve[0] == pytest.approx(float(net(x).detach().abs().mean()))
    pruned = prune(net, [2, 0])
    assert len(pruned.encoder.layers) == 1 and pruned(x).shape == (4, 3)
    assert len(net.encoder.layers) == 3  # the original is untouched


def test_lesion_of_a_torch_layer_closes_both_branches_and_restores():
    torch.manual_seed(0)
    net = TokenNet(True).eval()
    x = torch.randn(2, 4, 8)
    with torch.no_grad():
        before = net(x)
        with lesion(net, "encoder.layers.0"):  # a block name: both of its branches
            both = net(x)
        with lesion(net, "encoder.layers.0.attn"):
            one = net(x)
        after = net(x)
    assert torch.equal(before, after)
    assert not _same(both, before) and not _same(one, before) and not _same(both, one)


def test_layerscale_and_rezero_gates_on_tokens_scale_the_last_dimension():
    torch.manual_seed(0)
    net = TokenNet(True).eval()
    add_gates(net, "layerscale", k_init=0.5)
    gate = block_gates(net)["encoder.layers.0.ff"]
    assert isinstance(gate, VectorGate) and gate.k.shape == (16,)
    stats = gate_statistics(net)
    assert stats["g_size"] == [16] * 6 and stats["mean_g"] == pytest.approx(0.5)
    rezero = add_gates(TokenNet(True).eval(), "rezero")
    x = torch.randn(2, 4, 8)
    plain = rezero.encoder.layers[0]
    # α = 0 everywhere: every layer is the identity, so the encoder output is its input (then the final norm-free head)
    with torch.no_grad():
        assert _same(rezero.encoder(rezero.embed(x)), rezero.embed(x))
    assert isinstance(plain.branch_gates["attn"], ScalarGate)  # the gate under its own name
    assert "dropout1" in dict(plain.named_children())  # the layer's own modules keep theirs


def test_add_gates_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="kind='sigmoid'; accepted values"):
        add_gates(TokenNet(True), "sigmoid")
    with pytest.raises(ValueError, match="no residual branch"):
        add_gates(nn.Sequential(nn.Linear(3, 3)))
    net = add_gates(TokenNet(True))
    with pytest.raises(ValueError, match="'encoder.layers.0.attn' already has a gate"):
        add_gates(net)


# ---- Hugging Face transformers: GPT-2, LLaMA, BERT, ViT (small random configs, no weights) ----

def _transformers():
    """Hugging Face transformers, an optional dependency: the test that needs it is skipped without it (the
    torch-only tests of this file run either way)."""
    return pytest.importorskip("transformers")


def _gpt2():
    transformers = _transformers()
    config = transformers.GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=40, n_positions=16,
                                     attn_implementation="eager")
    return transformers.GPT2Model(config).eval(), torch.randint(0, 40, (2, 7))


def _llama():
    transformers = _transformers()
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=40, attn_implementation="eager")
    return transformers.LlamaModel(config).eval(), torch.randint(0, 40, (2, 7))


def _bert():
    transformers = _transformers()
    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
                                     vocab_size=40, attn_implementation="eager")
    return transformers.BertModel(config, add_pooling_layer=False).eval(), torch.randint(0, 40, (2, 7))


def _vit():
    transformers = _transformers()
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=3,
                                    num_attention_heads=2, intermediate_size=32, attn_implementation="eager")
    return transformers.ViTModel(config, add_pooling_layer=False).eval(), torch.randn(2, 1, 8, 8)


HF = {"gpt2": (_gpt2, "h"), "llama": (_llama, "layers"), "bert": (_bert, "encoder.layer"), "vit": (_vit, "layers")}


def _out(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).last_hidden_state


@pytest.mark.parametrize("name", sorted(HF))
def test_hugging_face_layers_are_found_gated_lesioned_and_pruned(name):
    torch.manual_seed(0)
    build, layers = HF[name]
    model, x = build()
    assert list(find_blocks(model)) == [f"{layers}.{i}" for i in range(3)]
    assert list(find_branches(model))[:2] == [f"{layers}.0.attn", f"{layers}.0.ff"]
    before = _out(model, x)
    add_gates(model, "relu")
    assert _same(_out(model, x), before)  # k = 1: the same function
    with lesion(model, f"{layers}.1.attn"):
        lesioned = _out(model, x)
    assert not _same(lesioned, before)
    assert torch.equal(_out(model, x), _out(model, x)) and _same(_out(model, x), before)
    # a closed ReLU gate equals the lesion
    gate = block_gates(model)[f"{layers}.1.attn"]
    with torch.no_grad():
        gate.k.fill_(0.0)
    assert _same(_out(model, x), lesioned)
    assert k_statistics(model)["num_dead"] == 1
    pruned = prune(model, [1])
    assert list(find_blocks(pruned)) == [f"{layers}.0", f"{layers}.1"]
    assert _out(pruned, x).shape == before.shape


def test_a_pruned_gpt2_saves_loads_and_has_fewer_layers(tmp_path):
    from throughway.train.checkpoint import load_model, save_model
    torch.manual_seed(0)
    model, x = _gpt2()
    transformers = _transformers()
    pruned = prune(model, [0, 2])
    save_model(tmp_path / "m.safetensors", pruned)
    fresh = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40,
                                                           n_positions=16, attn_implementation="eager")).eval()
    load_model(tmp_path / "m.safetensors", model=fresh)
    assert torch.equal(_out(fresh, x), _out(pruned, x))
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())


# ---- replicas of torchvision's and timm's blocks ------------------------------------------------

class TorchvisionBasicBlock(nn.Module):
    """Replica of torchvision.models.resnet.BasicBlock (same attributes, same forward)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


TorchvisionBasicBlock.__module__ = "torchvision.models.resnet"
TorchvisionBasicBlock.__qualname__ = "BasicBlock"




def _resnet(block: type[nn.Module]) -> nn.Module:
    """Two stages of two blocks, the second stage opening with a stride-2 projection (ResNet-18's shape)."""
    torch.manual_seed(0)
    down = nn.Sequential(nn.Conv2d(4, 8, 1, 2, bias=False), nn.BatchNorm2d(8))
    net = nn.Sequential()
    net.add_module("stem", nn.Conv2d(1, 4, 3, 1, 1))
    net.add_module("layer1", nn.Sequential(block(4, 4), block(4, 4)))
    net.add_module("layer2", nn.Sequential(block(4, 8, 2, down), block(8, 8)))
    net.add_module("pool", nn.AdaptiveAvgPool2d(1))
    net.add_module("flat", nn.Flatten())
    net.add_module("fc", nn.Linear(8, 3))
    return net.eval()


@pytest.mark.parametrize("block", [TorchvisionBasicBlock, TimmBasicBlock], ids=["torchvision", "timm"])
def test_resnet_replicas_removal_skips_the_projection_block_and_says_why(block):
    net = _resnet(block)
    x = torch.randn(2, 1, 8, 8)
    assert list(find_blocks(net)) == ["layer1.0", "layer1.1", "layer2.0", "layer2.1"]
    assert removable_blocks(net) == ["layer1.0", "layer1.1", "layer2.1"]
    assert "downsample is a Sequential" in unremovable_blocks(net)["layer2.0"]
    with torch.no_grad():
        before = net(x)
        with lesion(net, "layer1.0"):
            assert not _same(net(x), before)
    add_gates(net, "relu")
    with torch.no_grad():
        assert _same(net(x), before)
    for i, gate in enumerate(block_gates(net).values()):
        gate.k.data.fill_(1.0 + i)
    assert removal_order(net, "greedy") == [0, 1, 3]
    assert sorted(removal_order(net, "random", torch.Generator().manual_seed(0))) == [0, 1, 3]
    curve = removal_curve(net, removal_order(net, "greedy"), lambda m: float(m(x).detach().sum()))
    assert len(curve) == 4
    assert list(find_blocks(prune(net, ["layer2.1"]))) == ["layer1.0", "layer1.1", "layer2.0"]


def test_a_block_whose_forward_ignores_its_gate_attribute_makes_lesion_raise():
    # The silent wrong result: timm's blocks given branch/shortcut/gate attributes were found,
    # but their forward never calls the gate, so a "lesion" changed the output by exactly 0.0.
    class Attributed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.branch = nn.Linear(4, 4)
            self.shortcut = nn.Identity()
            self.gate = nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.branch(x)

    net = nn.Sequential(Attributed(), Attributed())
    with pytest.raises(RuntimeError, match=r"lesion of '0' changed nothing"):
        with lesion(net, 0):
            net(torch.randn(2, 4))


class LayerScale(nn.Module):
    """Replica of timm.layers.LayerScale: x * gamma."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class TimmViTBlock(nn.Module):
    """Replica of timm.models.vision_transformer.Block with init_values (LayerScale) set."""

    def __init__(self, dim: int = 8, init_values: float | None = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, dim)  # timm's Attention; a token-wise stand-in keeps the replica short
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


TimmViTBlock.__module__ = "timm.models.vision_transformer"
TimmViTBlock.__qualname__ = "Block"


def test_timm_vit_layerscale_is_a_gate_for_statistics_groups_and_removal():
    torch.manual_seed(0)
    vit = nn.Sequential(TimmViTBlock(), TimmViTBlock(), TimmViTBlock())
    stats = gate_statistics(vit)
    assert stats["blocks"][:2] == ["0.attn", "0.ff"] and stats["mean_abs_g"] == pytest.approx(1e-5)
    groups = {g["group"]: g for g in param_groups(vit, weight_decay=1e-4)}
    gammas = {id(m.gamma) for m in vit.modules() if isinstance(m, LayerScale)}
    assert gammas <= {id(p) for p in groups["no_decay"]["params"]}
    assert all("lr" not in g for g in groups.values())
    with pytest.raises(ValueError, match="already has a gate"):
        add_gates(vit)
    vit[1].ls1.gamma.data.fill_(0.0)
    vit[1].ls2.gamma.data.fill_(0.0)
    assert removal_order(vit, "greedy")[0] == 1
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        assert _same(prune(vit, [1])(x), vit(x))  # both of its gates closed: removing it changes nothing


def test_convnext_replica_gamma_is_its_gate():
    class ConvNeXtBlock(nn.Module):
        def __init__(self, dim: int = 4) -> None:
            super().__init__()
            self.conv_dw = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
            self.norm = nn.BatchNorm2d(dim)
            self.mlp = nn.Conv2d(dim, dim, 1)
            self.gamma = nn.Parameter(torch.full((dim,), 1e-6))
            self.shortcut = nn.Identity()
            self.drop_path = nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shortcut = x
            x = self.mlp(self.norm(self.conv_dw(x)))
            x = x.mul(self.gamma.reshape(1, -1, 1, 1))
            return self.drop_path(x) + self.shortcut(shortcut)

    ConvNeXtBlock.__module__ = "timm.models.convnext"
    ConvNeXtBlock.__qualname__ = "ConvNeXtBlock"
    net = nn.Sequential(ConvNeXtBlock(), ConvNeXtBlock())
    assert block_spec(net[0]) is not None
    assert gate_statistics(net)["g_size"] == [4, 4]
    assert {id(net[0].gamma), id(net[1].gamma)} <= {id(p) for p in param_groups(net, 0.1)[-1]["params"]}


def test_register_block_in_a_few_lines_and_its_errors():
    class MyBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = nn.Linear(4, 4)
            self.drop = nn.Dropout(0.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.drop(self.mlp(x))

    net = nn.Sequential(MyBlock(), MyBlock())
    assert find_blocks(net) == {}
    register_block(MyBlock, "drop")
    assert list(find_blocks(net)) == ["0", "1"]
    x = torch.randn(3, 4)
    add_gates(net)
    with torch.no_grad():
        with lesion(net, 1):
            assert _same(net(x), net[0](x))
    with pytest.raises(ValueError, match="branches"):
        register_block(MyBlock, {})
    with pytest.raises(ValueError, match="channel_dim=2"):
        register_block(MyBlock, "drop", channel_dim=2)
    with pytest.raises(TypeError, match="module_type"):
        register_block(3, "drop")  # type: ignore[arg-type]


# ---- parameter groups without a recipe ----------------------------------------------------------

def test_param_groups_puts_every_gate_in_the_undecayed_group_and_sets_no_lr():
    net = add_gates(TokenNet(True), "relu")
    groups = param_groups(net, weight_decay=1e-4)
    assert [g["group"] for g in groups] == ["decay", "no_decay"]
    assert all("lr" not in g for g in groups)
    ks = {id(m.k) for m in net.modules() if isinstance(m, ScalarGate)}
    assert len(ks) == 6 and ks <= {id(p) for p in groups[1]["params"]}
    assert groups[0]["weight_decay"] == 1e-4 and groups[1]["weight_decay"] == 0.0
    decayed = param_groups(net, weight_decay=1e-4, gate_decay=True)
    assert ks <= {id(p) for p in decayed[0]["params"]}
    with pytest.raises(ValueError, match="weight_decay=-1"):
        param_groups(net, weight_decay=-1)


def test_an_optimiser_over_a_recipes_groups_trains_at_the_lr_it_is_given():
    from throughway import create_model
    model = create_model("mlp_gated_residual", depth=4, width=8, in_features=5, num_classes=3)
    optimizer = torch.optim.SGD(parameter_groups(model, get_recipe("preact-cifar")), lr=0.05)
    assert {g["lr"] for g in optimizer.param_groups} == {0.05}


# ---- findings of the reliability round that live in the analyses ----------------------------------

def test_a_shared_block_is_refused_naming_both_uses():
    block = TorchvisionBasicBlock(4, 4)
    net = nn.Sequential(block, block)
    with pytest.raises(ValueError, match=r"block '1' is the same module as block '0'"):
        find_blocks(net)


def test_removal_refuses_a_nan_gate_a_negative_max_removed_and_a_metric_that_is_not_one_number():
    net = add_gates(_resnet(TorchvisionBasicBlock))
    gates = block_gates(net)
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(ValueError, match="max_removed=-1"):
        removal_curve(net, [0], lambda m: 1.0, max_removed=-1)
    with pytest.raises(TypeError, match=r"metric returned a tensor of shape \(2,\)"):
        removal_curve(net, [0], lambda m: torch.ones(2))
    with pytest.raises(TypeError, match="metric returned str"):
        removal_curve(net, [0], lambda m: "high")
    assert removal_curve(net, [0], lambda m: torch.tensor(0.5)) == [0.5, 0.5]
    gates["layer1.1"].k.data.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"gate of 'layer1.1' is \[nan\]"):
        removal_order(net, "greedy")
    del x


def test_add_gates_keeps_device_dtype_and_deepcopy_and_state_dict_work():
    net = TokenNet(True).double()
    add_gates(net)
    assert all(p.dtype == torch.float64 for p in net.parameters())
    clone = copy.deepcopy(net)
    assert clone.state_dict().keys() == net.state_dict().keys()
    assert "encoder.layers.0.branch_gates.attn.k" in net.state_dict()
    # the deep copy's hooks scale by the copy's own gates
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with torch.no_grad():
        clone.encoder.layers[0].branch_gates.attn.k.fill_(0.0)
        assert not torch.equal(clone.eval()(x), net.eval()(x))
        net.encoder.layers[0].branch_gates.attn.k.fill_(0.0)
        assert torch.equal(clone(x), net(x))


# ---- distances and callbacks on any model ---------------------------------------------------------

def test_identity_distance_callback_reads_the_blocks_of_a_users_transformer():
    from throughway.analysis.distance import IdentityDistance
    from throughway.train import fit

    torch.manual_seed(0)
    net = add_gates(TokenNet(True, layers=2), "relu")
    x, y = torch.randn(32, 4, 8), torch.randint(0, 3, (32,))
    callback = IdentityDistance()
    fit(net, (x, y), get_recipe("gresnet-mnist", epochs=2, batch_size=16), callbacks=[callback])
    assert len(callback.records) == 3 and callback.kinds == ["gated", "gated"]
    # relu gates at k ≈ 1 on both branches: the paper's target is Σ max(k, 0)² ≈ 2 per layer
    assert callback.records[0]["identity_sq"] == pytest.approx(4.0)
    assert callback.records[-1]["travelled_sq"] > 0


def test_sdi_takes_a_layer_type_and_says_so_briefly():
    from throughway.analysis.sdi import sdi
    with pytest.raises(TypeError) as info:
        sdi(TokenNet(True), 16)  # type: ignore[arg-type]
    assert "layer type" in str(info.value) and len(str(info.value)) < 400
