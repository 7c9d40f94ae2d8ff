"""The library block types the toolkit knows (layers.known_blocks): found, checked against the model
(check_blocks), gated exactly at init, lesioned, removed and pruned, on faithful replicas of timm's and
torchvision's classes (the same attribute names and forward, matched by qualified name: timm and
torchvision cannot be installed beside this torch) and on Hugging Face's real decoder layers from tiny
configs; and the wrong registrations that check_blocks refuses. scripts/check_real_blocks.py runs the
same steps on the real packages (results/real-blocks/)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from throughway import add_gates, register_block
from throughway.analysis import find_blocks, find_branches, lesion, prune, removable_blocks, unremovable_blocks
from throughway.layers import block_spec

from conftest import TimmBasicBlock
from throughway.layers import blocks as block_registry
from throughway.layers.adapters import fold_gates
from throughway.layers.blocks import check_blocks, has_shortcut
from throughway.layers.known_blocks import CLOSED_THROUGH, decoder_layout, hugging_face_decoder_rule


def _run(model: nn.Module, x: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.last_hidden_state


def _gates_lesion_prune(model: nn.Module, x: Any, lesioned: str, pruned: str) -> nn.Module:
    """The steps every known block must pass: add_gates at k = 1 leaves the outputs bit-identical; a lesion
    changes them and they are bit-identical after it; the pruned model runs with one block fewer."""
    before = _run(model, x)
    add_gates(model, "relu")
    assert torch.equal(_run(model, x), before)
    with lesion(model, lesioned):
        closed = _run(model, x)
    assert float((closed - before).abs().max()) > 1e-4 * float(before.abs().max())
    assert torch.equal(_run(model, x), before)
    smaller = prune(model, [pruned])
    assert len(find_blocks(smaller)) == len(find_blocks(model)) - 1
    assert _run(smaller, x).shape == before.shape
    return smaller


# ---- timm's InvertedResidual: a shortcut only when has_skip --------------------------------------

class BatchNormAct2d(nn.BatchNorm2d):
    """Replica of timm.layers.BatchNormAct2d: BatchNorm, then drop and act (nn.Identity when apply_act=False)."""

    def __init__(self, num_features: int, apply_act: bool = True) -> None:
        super().__init__(num_features)
        self.drop = nn.Identity()
        self.act = nn.ReLU(inplace=True) if apply_act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.drop(super().forward(x)))


class InvertedResidual(nn.Module):
    """Replica of timm.models._efficientnet_blocks.InvertedResidual (no s2d, aa or se, as EfficientNet-B0's
    first stages build it): the same attributes and forward."""

    def __init__(self, in_chs: int, out_chs: int, stride: int = 1, exp_ratio: float = 2.0,
                 noskip: bool = False) -> None:
        super().__init__()
        self.has_skip = (in_chs == out_chs and stride == 1) and not noskip
        self.conv_s2d = None
        self.bn_s2d = None
        mid_chs = int(in_chs * exp_ratio)
        self.conv_pw = nn.Conv2d(in_chs, mid_chs, 1, bias=False)
        self.bn1 = BatchNormAct2d(mid_chs)
        self.conv_dw = nn.Conv2d(mid_chs, mid_chs, 3, stride, 1, groups=mid_chs, bias=False)
        self.bn2 = BatchNormAct2d(mid_chs)
        self.aa = nn.Identity()
        self.se = nn.Identity()
        self.conv_pwl = nn.Conv2d(mid_chs, out_chs, 1, bias=False)
        self.bn3 = BatchNormAct2d(out_chs, apply_act=False)
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        if self.conv_s2d is not None:
            x = self.conv_s2d(x)
            x = self.bn_s2d(x)
        x = self.conv_pw(x)
        x = self.bn1(x)
        x = self.conv_dw(x)
        x = self.bn2(x)
        x = self.aa(x)
        x = self.se(x)
        x = self.conv_pwl(x)
        x = self.bn3(x)
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


InvertedResidual.__module__ = "timm.models._efficientnet_blocks"
InvertedResidual.__qualname__ = "InvertedResidual"


def _efficientnet() -> tuple[nn.Module, torch.Tensor]:
    """Blocks 0 and 2 have a skip; 1 widens with stride 2 and 3 is built with noskip: neither has one."""
    torch.manual_seed(0)
    net = nn.Sequential()
    net.add_module("stem", nn.Conv2d(1, 4, 3, 1, 1))
    net.add_module("blocks", nn.Sequential(InvertedResidual(4, 4), InvertedResidual(4, 8, stride=2),
                                           InvertedResidual(8, 8), InvertedResidual(8, 8, noskip=True)))
    net.add_module("pool", nn.AdaptiveAvgPool2d(1))
    net.add_module("flat", nn.Flatten())
    net.add_module("fc", nn.Linear(8, 3))
    return net.eval(), torch.randn(2, 1, 8, 8)


def test_an_inverted_residual_has_a_shortcut_only_when_it_has_skip():
    net, x = _efficientnet()
    assert list(find_blocks(net)) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert [has_shortcut(block) for block in net.blocks] == [True, False, True, False]
    result = check_blocks(net, x)
    assert result.checked == ("blocks.0", "blocks.2") and result.plain == ("blocks.1", "blocks.3")
    assert removable_blocks(net) == ["blocks.0", "blocks.2"]
    assert "has no shortcut" in unremovable_blocks(net)["blocks.1"]
    with pytest.raises(ValueError, match="without a shortcut"):
        with lesion(net, "blocks.1"):
            pass
    with pytest.raises(ValueError, match=r"maps \(2, 4, 8, 8\) to \(2, 8, 4, 4\)"):
        prune(net, ["blocks.1"], example_input=x)
    _gates_lesion_prune(net, x, "blocks.2", "blocks.0")
    assert net.gates_added["branches"] == ["blocks.0", "blocks.2"]  # the blocks without skip get no gate
    fold_gates(net, example_input=x)  # into bn3


def test_an_inverted_residual_registered_without_its_skip_test_is_refused():
    net, x = _efficientnet()
    name = "timm.models._efficientnet_blocks.InvertedResidual"
    with pytest.raises(ValueError, match="'blocks.1': its registered end was never called"):
        register_block(name, "drop_path", fold="bn3", check=(net, x))
    assert block_spec(net.blocks[1]).skip is not None  # the built-in entry is back


# ---- torchvision's Swin blocks: one stochastic_depth for both adds ---------------------------------

class StochasticDepth(nn.Module):
    """Replica of torchvision.ops.StochasticDepth: the identity in eval mode (and for p = 0)."""

    def __init__(self, p: float, mode: str) -> None:
        super().__init__()
        self.p, self.mode = p, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty([x.shape[0]] + [1] * (x.dim() - 1), dtype=x.dtype).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class WindowAttention(nn.Module):
    """Stand-in for torchvision's ShiftedWindowAttention with its `qkv` and `proj` (attention over all H·W
    tokens of one window: the spec reads the block, not how the attention partitions windows)."""

    def __init__(self, dim: int, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C)
        b, h, w, c = x.shape
        q, k, v = self.qkv(x.reshape(b, h * w, c)).reshape(b, h * w, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, h, w, c)
        return self.proj(out)


class SwinTransformerBlock(nn.Module):
    """Replica of torchvision.models.swin_transformer.SwinTransformerBlock: the same attributes and forward
    (mlp is torchvision.ops.MLP: Linear, GELU, Dropout, Linear, Dropout)."""

    def __init__(self, dim: int = 8, mlp_ratio: float = 2.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim)
        self.stochastic_depth = StochasticDepth(0.0, "row")
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim),
                                 nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.stochastic_depth(self.attn(self.norm1(x)))
        x = x + self.stochastic_depth(self.mlp(self.norm2(x)))
        return x


class SwinTransformerBlockV2(SwinTransformerBlock):
    """Replica of torchvision's SwinTransformerBlockV2: the norms follow attn and mlp."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.stochastic_depth(self.norm1(self.attn(x)))
        x = x + self.stochastic_depth(self.norm2(self.mlp(x)))
        return x


SwinTransformerBlock.__module__ = SwinTransformerBlockV2.__module__ = "torchvision.models.swin_transformer"
SwinTransformerBlock.__qualname__ = "SwinTransformerBlock"
SwinTransformerBlockV2.__qualname__ = "SwinTransformerBlockV2"


def _swin(block: type[nn.Module]) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Sequential(block(), block(), block()).eval()
    return net, torch.randn(2, 3, 3, 8)


@pytest.mark.parametrize("block, ends", [(SwinTransformerBlock, ["0.attn", "0.mlp"]),
                                         (SwinTransformerBlockV2, ["0.norm1", "0.norm2"])], ids=["v1", "v2"])
def test_torchvision_swin_branches_end_before_the_shared_stochastic_depth(block, ends):
    net, x = _swin(block)
    assert [ref.end for ref in find_branches(net).values()][:2] == ends
    assert len(check_blocks(net, x).checked) == 6
    assert removable_blocks(net) == ["0", "1", "2"]
    _gates_lesion_prune(net, x, "1.ff", "1")
    fold_gates(net, example_input=x)  # v1: attn.proj and mlp.3; v2: a scalar gate into the LayerNorm


def test_a_swin_registration_ending_both_branches_at_stochastic_depth_is_refused():
    net, x = _swin(SwinTransformerBlock)
    name = "torchvision.models.swin_transformer.SwinTransformerBlock"
    with pytest.raises(ValueError, match="branches 'attn' and 'ff' both end at module 'stochastic_depth'"):
        register_block(name, {"attn": "stochastic_depth", "ff": "stochastic_depth"}, channel_dim=-1, check=(net, x))
    assert find_branches(net)["0.attn"].end == "0.attn"


def test_a_swin_v2_registration_ending_before_its_norms_is_refused():
    net, x = _swin(SwinTransformerBlockV2)
    name = "torchvision.models.swin_transformer.SwinTransformerBlockV2"
    with pytest.raises(ValueError, match="'0.attn'.*does not halve the block's residual"):
        register_block(name, {"attn": "attn", "ff": "mlp"}, channel_dim=-1, check=(net, x))
    assert find_branches(net)["0.attn"].end == "0.norm1"


# ---- post-activation ResNet blocks: act(x + f(x)) --------------------------------------------------

BasicBlock = TimmBasicBlock  # timm.models.resnet.BasicBlock's replica, shared with test_any_network


def test_a_post_activation_block_is_left_unverified_and_checks_with_its_activation_replaced():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, 1, 1), BasicBlock(), BasicBlock()).eval()
    with torch.no_grad():  # trained-looking statistics: bn2 is then affine, not linear
        for bn in (m for m in net.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-1, 1)
            bn.bias.uniform_(-1, 1)
    x = torch.randn(2, 1, 6, 6)  # the stem has no ReLU: the blocks see negative inputs, act2(x) != x
    result = check_blocks(net, x)
    assert result.checked == () and set(result.unverified) == {"1", "2"}
    # With act2 the identity, the sum itself is the output: the registered end (bn2) is then verified.
    for block in (net[1], net[2]):
        (activation,) = CLOSED_THROUGH["timm.models.resnet.BasicBlock"]
        setattr(block, activation, nn.Identity())
    spec = block_spec(net[1])
    register_block(BasicBlock, "bn2", shortcut="downsample", check=(net, x))  # by class: wins over the name
    try:
        assert check_blocks(net, x).checked == ("1", "2")
        with pytest.raises(ValueError, match="does not return its input"):
            register_block(BasicBlock, "conv2", shortcut="downsample", check=(net, x))  # before bn2: wrong
    finally:
        block_registry.unregister_block(BasicBlock)
    assert block_spec(net[1]) is spec


# ---- Hugging Face decoder layers: the rule, on replicas (no transformers needed) --------------------

class RMSNorm(nn.Module):
    """LLaMA's / OLMo2's RMSNorm: weight · x / rms(x)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: (1 + weight) · x / rms(x), weight starting at 0."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return output * (1.0 + self.weight)


class Attention(nn.Module):
    """A decoder attention with q/k/v/o projections returning (output, weights), as Hugging Face's do."""

    def __init__(self, hidden_size: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden_size, hidden_size) for _ in range(4))

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, None]:
        b, t, c = hidden_states.shape
        q, k, v = (p(hidden_states).view(b, t, self.heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        return self.o_proj(out), None


class MLP(nn.Module):
    """LLaMA's gated MLP: down_proj(act(gate_proj(x)) · up_proj(x))."""

    def __init__(self, hidden_size: int = 8, intermediate: int = 16) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gemma2DecoderLayer(nn.Module):
    """Replica of transformers' Gemma2DecoderLayer: norms before and after each branch (the sandwich)."""

    def __init__(self, hidden_size: int = 8) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.self_attn = Attention(hidden_size)
        self.mlp = MLP(hidden_size)
        self.input_layernorm = GemmaRMSNorm(hidden_size)
        self.post_attention_layernorm = GemmaRMSNorm(hidden_size)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden_size)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden_size)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
        residual = hidden_states

        hidden_states = self.input_layernorm(hidden_states)

        # Self Attention
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states

        residual = hidden_states
        hidden_states = self.pre_feedforward_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        hidden_states = residual + hidden_states

        return hidden_states


class Olmo2DecoderLayer(nn.Module):
    """Replica of transformers' Olmo2DecoderLayer: a norm after each branch only."""

    def __init__(self, hidden_size: int = 8) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.self_attn = Attention(hidden_size)
        self.mlp = MLP(hidden_size)
        self.post_attention_layernorm = RMSNorm(hidden_size)
        self.post_feedforward_layernorm = RMSNorm(hidden_size)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states

        # Fully Connected
        residual = hidden_states
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class CohereDecoderLayer(nn.Module):
    """Replica of transformers' CohereDecoderLayer: attention and MLP in parallel, one norm, one add."""

    def __init__(self, hidden_size: int = 8) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.self_attn = Attention(hidden_size)
        self.mlp = MLP(hidden_size)
        self.input_layernorm = RMSNorm(hidden_size)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states_attention, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states_mlp = self.mlp(hidden_states)
        hidden_states = residual + hidden_states_attention + hidden_states_mlp
        return hidden_states


for _layer, _family in ((Gemma2DecoderLayer, "gemma2"), (Olmo2DecoderLayer, "olmo2"), (CohereDecoderLayer, "cohere")):
    _layer.__module__ = f"transformers.models.{_family}.modeling_{_family}"
del _layer, _family


class Decoder(nn.Module):
    """A tiny decoder model: embeddings, a stack of `layer`s, a final norm."""

    def __init__(self, layer: type[nn.Module], layers: int = 3) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(20, 8)
        self.layers = nn.ModuleList(layer() for _ in range(layers))
        self.norm = RMSNorm(8)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)


def _decoder(layer: type[nn.Module]) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = Decoder(layer).eval()
    with torch.no_grad():  # Gemma's norms start at weight 0 (a scale of 1): make them differ
        for module in net.modules():
            if isinstance(module, (GemmaRMSNorm, RMSNorm)):
                module.weight.uniform_(0.5, 1.5)
    return net, torch.randint(0, 20, (2, 5))


def test_the_decoder_rule_ends_a_sandwich_branch_at_its_norm():
    net, x = _decoder(Gemma2DecoderLayer)
    assert decoder_layout(Gemma2DecoderLayer) == (("self_attn", "post_attention_layernorm"),
                                                  ("mlp", "post_feedforward_layernorm"))
    branches = find_branches(net)
    assert [ref.end for ref in branches.values()][:2] == ["layers.0.post_attention_layernorm",
                                                         "layers.0.post_feedforward_layernorm"]
    assert branches["layers.0.attn"].spec.fold == {}  # (1 + weight)·x̂: a gate does not fold into the weight
    assert len(check_blocks(net, x).checked) == 6
    _gates_lesion_prune(net, x, "layers.1.attn", "layers.1")


def test_a_decoder_registered_at_self_attn_before_its_sandwich_norm_is_refused():
    net, x = _decoder(Gemma2DecoderLayer)
    with pytest.raises(ValueError, match="'layers.0.attn'.*does not halve the block's residual"):
        register_block(Gemma2DecoderLayer, {"attn": "self_attn", "ff": "mlp"}, channel_dim=-1, check=(net, x))
    assert find_branches(net)["layers.0.attn"].end == "layers.0.post_attention_layernorm"  # the rule again


def test_the_decoder_rule_folds_a_gate_into_a_post_norm_that_scales_by_its_weight():
    net, x = _decoder(Olmo2DecoderLayer)
    spec = find_branches(net)["layers.0.ff"].spec
    assert spec.branches == {"attn": "post_attention_layernorm", "ff": "post_feedforward_layernorm"}
    assert spec.fold == {"attn": "post_attention_layernorm", "ff": "post_feedforward_layernorm"}
    assert len(check_blocks(net, x).checked) == 6
    _gates_lesion_prune(net, x, "layers.2.ff", "layers.0")
    for gate in net.modules():
        if hasattr(gate, "k"):
            gate.k.data.fill_(0.7)
    gated = _run(net, x)
    fold_gates(net, example_input=x)
    assert torch.allclose(_run(net, x), gated, atol=1e-5)


def test_a_layer_whose_forward_is_not_the_common_layout_is_not_guessed_and_find_blocks_says_so():
    net, _ = _decoder(CohereDecoderLayer)  # x + attn(n(x)) + mlp(n(x)): a parallel layer
    assert decoder_layout(CohereDecoderLayer) is None
    with pytest.warns(UserWarning, match=r"register_block.*layers \(3 x transformers\.models\.cohere"):
        assert find_blocks(net) == {}


# ---- Hugging Face's real decoder layers, from tiny configs ----------------------------------------

_DECODER = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=40, attn_implementation="eager")
# family: (config, model, extra config, the ends of layer 0's branches, folds)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], tuple[str, str], dict[str, str]]] = {
    "mistral": ("MistralConfig", "MistralModel", {}, ("self_attn", "mlp"),
                {"attn": "self_attn.o_proj", "ff": "mlp.down_proj"}),
    "qwen2": ("Qwen2Config", "Qwen2Model", {}, ("self_attn", "mlp"), {"attn": "self_attn.o_proj", "ff": "mlp.down_proj"}),
    "qwen3": ("Qwen3Config", "Qwen3Model", {"head_dim": 8}, ("self_attn", "mlp"),
              {"attn": "self_attn.o_proj", "ff": "mlp.down_proj"}),
    "gemma2": ("Gemma2Config", "Gemma2Model", {"head_dim": 8}, ("post_attention_layernorm", "post_feedforward_layernorm"),
               {}),
    "phi3": ("Phi3Config", "Phi3Model", {"pad_token_id": 0, "eos_token_id": 2}, ("resid_attn_dropout", "resid_mlp_dropout"),
             {"attn": "self_attn.o_proj", "ff": "mlp.down_proj"}),
    "olmo2": ("Olmo2Config", "Olmo2Model", {"pad_token_id": 0, "eos_token_id": 2},
              ("post_attention_layernorm", "post_feedforward_layernorm"),
              {"attn": "post_attention_layernorm", "ff": "post_feedforward_layernorm"}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXModel", {"use_parallel_residual": True, "num_key_value_heads": None},
                 ("post_attention_dropout", "post_mlp_dropout"), {"attn": "attention.dense", "ff": "mlp.dense_4h_to_h"}),
    "gpt_neox_sequential": ("GPTNeoXConfig", "GPTNeoXModel", {"use_parallel_residual": False, "num_key_value_heads": None},
                            ("post_attention_dropout", "post_mlp_dropout"),
                            {"attn": "attention.dense", "ff": "mlp.dense_4h_to_h"}),
    "opt": ("OPTConfig", "OPTModel", {"ffn_dim": 32, "word_embed_proj_dim": 16, "max_position_embeddings": 16,
                                      "intermediate_size": None, "num_key_value_heads": None},
            ("self_attn", "fc2"), {"attn": "self_attn.out_proj", "ff": "fc2"}),
    "opt_post_norm": ("OPTConfig", "OPTModel", {"ffn_dim": 32, "word_embed_proj_dim": 16, "max_position_embeddings": 16,
                                                "do_layer_norm_before": False, "intermediate_size": None,
                                                "num_key_value_heads": None},
                      ("self_attn", "fc2"), {"attn": "self_attn.out_proj", "ff": "fc2"}),
}


def _hugging_face(family: str) -> tuple[nn.Module, torch.Tensor, str]:
    transformers = pytest.importorskip("transformers")
    config_name, model_name, extra, _, _ = FAMILIES[family]
    settings = {k: v for k, v in {**_DECODER, **extra}.items() if v is not None}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**settings)).eval()
    layers = "decoder.layers" if family.startswith("opt") else "layers"
    return model, torch.randint(1, 40, (2, 5)), layers


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hugging_face_decoder_layers_are_found_checked_gated_lesioned_and_pruned(family):
    model, x, layers = _hugging_face(family)
    ends, folds = FAMILIES[family][3], FAMILIES[family][4]
    assert list(find_blocks(model)) == [f"{layers}.0", f"{layers}.1"]
    branches = find_branches(model)
    assert (branches[f"{layers}.0.attn"].end, branches[f"{layers}.0.ff"].end) == tuple(
        f"{layers}.0.{end}" for end in ends)
    assert branches[f"{layers}.0.attn"].spec.fold == folds
    result = check_blocks(model, x)
    if family == "opt_post_norm":  # LayerNorm(x + f(x)): closing leaves LayerNorm(x), nothing to verify
        assert result.checked == () and "post-norm" in result.unverified[f"{layers}.0.attn"]
    else:
        assert len(result.checked) == 4
    assert removable_blocks(model) == [f"{layers}.0", f"{layers}.1"]
    pruned = _gates_lesion_prune(model, x, f"{layers}.1.attn", f"{layers}.0")
    assert pruned.config.num_hidden_layers == 1


def test_a_real_gemma2_registered_at_self_attn_is_refused_by_check_blocks():
    model, x, _ = _hugging_face("gemma2")
    name = "transformers.models.gemma2.modeling_gemma2.Gemma2DecoderLayer"
    with pytest.raises(ValueError, match="does not halve the block's residual"):
        register_block(name, {"attn": "self_attn", "ff": "mlp"}, channel_dim=-1, check=(model, x))
    assert find_branches(model)["layers.0.attn"].end == "layers.0.post_attention_layernorm"


def test_llama_registration_is_the_spec_the_decoder_rule_derives():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**_DECODER)
    layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(config, 0)
    registered, derived = block_spec(layer), hugging_face_decoder_rule(layer)
    assert derived is not None and registered is not derived
    assert (registered.branches, registered.fold, registered.channel_dim) == (derived.branches, derived.fold,
                                                                            derived.channel_dim)
    assert registered.width(layer) == derived.width(layer) == 16


def test_find_blocks_names_the_decoder_stack_when_the_rule_is_absent(monkeypatch):
    model, _, _ = _hugging_face("mistral")
    monkeypatch.delitem(block_registry._RULES, "hugging-face-decoder")
    with pytest.warns(UserWarning, match=r"layers \(2 x transformers\.models\.mistral\.modeling_mistral\."
                                         r"MistralDecoderLayer\)") as record:
        assert find_blocks(model) == {}
    assert len(record) == 1
