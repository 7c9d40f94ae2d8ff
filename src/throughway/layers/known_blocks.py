"""The block types of other libraries that the toolkit knows, registered by class (torch's) or by fully
qualified class name (the other libraries', so that none of them is imported here).

Each entry says where every residual branch ends (the module whose output is added to the
shortcut), the gate the architecture carries or has a slot for, the projection shortcut, and the
Linear / convolution / normalisation whose output is the branch (where `fold_gates` multiplies a
gate in). `layers.blocks.check_blocks` verifies an entry on a real model and example input; every
entry below was checked so on the real classes (scripts/check_real_blocks.py, its output under
results/real-blocks/), and the tests check faithful replicas and tiny Hugging Face configs.

How the entries were chosen, read from each class's `forward`:

- A branch ends at the last module before the add. Where two adds pass one module (torchvision's
  Swin blocks: both go through one `stochastic_depth`), each branch ends at its own module before
  it; a stochastic-depth or dropout module commutes with a scale, so a gate there scales the branch.
- A normalisation applied to the branch's output before the add (Gemma2/Gemma3's and OLMo2's
  sandwich norms, torchvision's SwinV2 `norm1`) ends the branch: a gate before an RMSNorm or
  LayerNorm would be normalised away.
- A block with an activation after the add (torchvision's and timm's ResNets, RegNet, ResNetV2's
  non-pre-activation `Bottleneck`: act(x + f(x))) does not return x with its branch closed but
  act(x), which is x only for the non-negative inputs a ReLU network feeds it; nor does a post-norm
  layer (BERT, OPT-350m: norm(x + f(x))) or RegNet's PreBottleneck, whose shortcut is norm1(x). Their
  entries set `identity_when_closed=False`, so `check_blocks` reports them unverified rather than
  failing, and `CLOSED_THROUGH` names the modules a closed block still applies to its input, so that a
  check can replace them by the identity on a copy and verify the branch ends
  (scripts/check_real_blocks.py and the tests do).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Callable, Mapping, cast

from torch import nn

from .blocks import BlockSpec, register_block, register_rule

__all__ = ["CLOSED_THROUGH", "decoder_layout", "hugging_face_decoder_rule"]


def _torch_encoder_prepare(layer: nn.Module) -> None:
    # nn.TransformerEncoderLayer's fused inference path (eval mode, no grad) computes the layer in one
    # kernel from its weights and never calls dropout1/dropout2, so an inserted gate would be skipped
    # silently. The path requires activation_relu_or_gelu to be truthy; 0 turns it off (the layer's
    # own forward is unchanged otherwise).
    object.__setattr__(layer, "activation_relu_or_gelu", 0)


def _linear2_width(layer: nn.Module) -> int:
    return int(cast(nn.Linear, layer.linear2).out_features)


def _norm_first(layer: nn.Module) -> bool:
    # post-norm (norm_first=False): x = norm(x + f(x)); closed branches leave norm(x)
    return bool(getattr(layer, "norm_first", False))


def _out_features(path: str) -> Callable[[nn.Module], int]:
    """A `width` that reads the output width of the Linear at `path` inside the block."""
    def width(block: nn.Module) -> int:
        return int(cast(nn.Linear, block.get_submodule(path)).out_features)
    return width


def _hidden_size(layer: nn.Module) -> int:
    # Hugging Face decoder layers keep the model width as `hidden_size`; else the first norm's weight
    size = getattr(layer, "hidden_size", None)
    if isinstance(size, int):
        return size
    for module in layer.children():
        weight = getattr(module, "weight", None)
        if "norm" in type(module).__name__.lower() and weight is not None and weight.dim() == 1:
            return int(weight.shape[0])
    raise ValueError(f"{type(layer).__name__}: no hidden_size attribute and no normalisation with a weight to read the "
                     f"width from; register it with width=...")


# The blocks that do not close to the identity: qualified class name → the modules a closed block still
# applies to its input (an activation after the add, a norm of the sum or of the shortcut). With these
# the identity, the block is x + f(x) and check_blocks can verify its branch ends. torchvision's ResNet
# blocks call `relu` inside the branch too; OPT's norms are the post-norms only when do_layer_norm_before
# is False (otherwise they normalise the branch's input, and replacing them changes only the branch).
CLOSED_THROUGH: Mapping[str, tuple[str, ...]] = {
    "torchvision.models.resnet.BasicBlock": ("relu",),
    "torchvision.models.resnet.Bottleneck": ("relu",),
    "timm.models.resnet.BasicBlock": ("act2",),
    "timm.models.resnet.Bottleneck": ("act3",),
    "timm.models.regnet.Bottleneck": ("act3",),
    "timm.models.regnet.PreBottleneck": ("norm1",),
    "timm.models.resnetv2.Bottleneck": ("act3",),
    "transformers.models.bert.modeling_bert.BertLayer": ("attention.output.LayerNorm", "crossattention.output.LayerNorm",
                                                         "output.LayerNorm"),
    "transformers.models.opt.modeling_opt.OPTDecoderLayer": ("self_attn_layer_norm", "final_layer_norm"),
}


def _per_instance(name: str, choose: Callable[[nn.Module], BlockSpec]) -> None:
    """Register, through a rule, a class whose spec depends on the instance (a fold path that is right
    only for some of its configurations): `choose` gives the spec of each module whose class, or a base
    class, has the qualified name `name`."""
    def rule(module: nn.Module) -> BlockSpec | None:
        for cls in type(module).__mro__:
            if f"{cls.__module__}.{cls.__qualname__}" == name:
                return choose(module)
        return None
    register_rule(name, rule)


# ---- torch --------------------------------------------------------------------------------------
register_block(nn.TransformerEncoderLayer, {"attn": "dropout1", "ff": "dropout2"}, channel_dim=-1,
               width=_linear2_width, prepare=_torch_encoder_prepare,
               fold={"attn": "self_attn.out_proj", "ff": "linear2"}, identity_when_closed=_norm_first)
register_block(nn.TransformerDecoderLayer, {"attn": "dropout1", "cross": "dropout2", "ff": "dropout3"},
               channel_dim=-1, width=_linear2_width,
               fold={"attn": "self_attn.out_proj", "cross": "multihead_attn.out_proj", "ff": "linear2"},
               identity_when_closed=_norm_first)

# ---- Hugging Face transformers (attention modules return (output, weights): the branch is the first element)
register_block("transformers.models.gpt2.modeling_gpt2.GPT2Block", {"attn": "attn", "cross": "crossattention",
                                                                    "ff": "mlp"},
               optional=("cross",), channel_dim=-1,
               fold={"attn": "attn.c_proj", "cross": "crossattention.c_proj", "ff": "mlp.c_proj"})
# The common decoder layout's spec, as the rule below derives it from LlamaDecoderLayer.forward
# (input_layernorm, self_attn, add, post_attention_layernorm, mlp, add); registered by name too, so
# LLaMA is found without reading its source.
register_block("transformers.models.llama.modeling_llama.LlamaDecoderLayer", {"attn": "self_attn", "ff": "mlp"},
               channel_dim=-1, width=_hidden_size, fold={"attn": "self_attn.o_proj", "ff": "mlp.down_proj"})
# BERT is post-norm: LayerNorm(x + dropout(dense(h))) inside its output modules; a closed branch gives LayerNorm(x)
register_block("transformers.models.bert.modeling_bert.BertLayer",
               {"attn": "attention.output.dropout", "cross": "crossattention.output.dropout", "ff": "output.dropout"},
               optional=("cross",), channel_dim=-1, identity_when_closed=False,
               fold={"attn": "attention.output.dense", "cross": "crossattention.output.dense", "ff": "output.dense"})
# transformers 5: both branches pass one `dropout` module, so each ends at its own module before it
# (attention, mlp); transformers 4.x ended the feed-forward branch in output.dropout
register_block("transformers.models.vit.modeling_vit.ViTLayer", {"attn": "attention", "ff": ("mlp", "output.dropout")},
               channel_dim=-1, fold={"attn": "attention.o_proj", "ff": "mlp.fc2"})
# GPT-NeoX: attn = post_attention_dropout(attention(input_layernorm(x))), m = post_mlp_dropout(mlp(...)).
# With use_parallel_residual, one add x + attn + m (the mlp reads post_attention_layernorm(x)); without it,
# two adds (the mlp reads the norm of x + attn). Either way the layer is one block with two branches, each
# ending at its own dropout and each closed alone: closing attn of a parallel layer leaves x + m(x), closing
# both leaves x.
register_block("transformers.models.gpt_neox.modeling_gpt_neox.GPTNeoXLayer",
               {"attn": "post_attention_dropout", "ff": "post_mlp_dropout"}, channel_dim=-1,
               width=_out_features("attention.dense"),
               fold={"attn": "attention.dense", "ff": "mlp.dense_4h_to_h"})


def _opt_pre_norm(layer: nn.Module) -> bool:
    # do_layer_norm_before (OPT-125m, 1.3b, ...): pre-norm; False (OPT-350m): LayerNorm(x + f(x))
    return bool(getattr(layer, "do_layer_norm_before", True))


# OPT: x + dropout(self_attn(...)) and x + dropout(fc2(act(fc1(...)))), the dropouts functional: the
# branches end at self_attn and fc2.
register_block("transformers.models.opt.modeling_opt.OPTDecoderLayer", {"attn": "self_attn", "ff": "fc2"},
               channel_dim=-1, width=_out_features("fc2"), fold={"attn": "self_attn.out_proj", "ff": "fc2"},
               identity_when_closed=_opt_pre_norm)


# ---- Hugging Face decoder layers of the common layout, by a rule --------------------------------
#
# Mistral, Qwen2, Qwen3, Gemma, OLMo, Phi-3, Gemma2/3, OLMo2 and many others share one layout: a
# layer with children `self_attn` and `mlp`, each branch added to a `residual`, with norms before
# (pre-norm), after (OLMo2) or on both sides (Gemma2's sandwich) of the branch and, in Phi-3, a
# dropout of its own. Attribute names alone do not tell the layouts apart (Chameleon's Swin-norm layer
# applies `input_layernorm` to the attention's output), so the rule reads the class's forward once
# and accepts it only when its calls, in evaluation order, are exactly
#     [norm] self_attn [norm] [dropout] + residual   [norm] mlp [norm] [dropout] + residual
# with nothing else computed on the way but reshapes and products with a number or an attribute of
# the layer (Granite's residual_multiplier), which scale the branch linearly. Anything else (a parallel layer, a gate, a layer scale, control flow, an
# unknown call) is not recognised: find_blocks then warns that it found no block, rather than guess.

_RESHAPES = frozenset({"view", "reshape", "contiguous", "to", "size", "float", "type_as", "get"})
_HF_PREFIX = "transformers.models."


def _calls(node: ast.AST, out: list[str]) -> None:
    """The calls and adds of one expression in evaluation order: "name" for self.name(...), "+" for an
    add with the name `residual`; "?" for anything the layout does not allow."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "self"):
            _calls(func.value, out)  # a method of a tensor: its receiver first
        for arg in node.args:
            _calls(arg, out)
        for keyword in node.keywords:
            _calls(keyword.value, out)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            out.append(func.attr)
        elif isinstance(func, ast.Attribute) and func.attr in _RESHAPES:
            pass
        else:
            out.append("?")
    elif isinstance(node, ast.BinOp):
        _calls(node.left, out)
        _calls(node.right, out)
        names = {side.id for side in (node.left, node.right) if isinstance(side, ast.Name)}
        if isinstance(node.op, ast.Add):
            out.append("+" if "residual" in names else "?")
        elif isinstance(node.op, ast.Mult):
            constant = [side for side in (node.left, node.right) if isinstance(side, ast.Constant) or (
                isinstance(side, ast.Attribute) and isinstance(side.value, ast.Name) and side.value.id == "self")]
            if not constant:
                out.append("?")
        else:
            out.append("?")
    elif isinstance(node, (ast.Name, ast.Constant, ast.Attribute)):
        return
    elif isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            _calls(element, out)
    elif isinstance(node, ast.Subscript):
        _calls(node.value, out)
        _calls(node.slice, out)
    elif isinstance(node, ast.Starred):
        _calls(node.value, out)
    else:
        out.append("?")


def _forward_calls(cls: type[nn.Module]) -> list[str] | None:
    try:
        source = textwrap.dedent(inspect.getsource(cls.forward))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    function = tree.body[0]
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    out: list[str] = []
    for statement in function.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # docstring
        if isinstance(statement, ast.If) and _bookkeeping(statement):
            continue
        calls: list[str] = []
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            _calls(statement.value, calls)
        elif isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add):
            _calls(statement.value, calls)
            names = {n.id for n in (statement.target, statement.value) if isinstance(n, ast.Name)}
            calls.append("+" if "residual" in names else "?")
        elif isinstance(statement, ast.Return):
            if statement.value is not None:
                _calls(statement.value, calls)
        else:
            calls.append("?")
        if "+" in calls[:-1]:
            calls.append("?")  # something applied to the sum (a post-norm): not the layout
        out.extend(calls)
    return out


def _bookkeeping(statement: ast.If) -> bool:
    # transformers 4.x: `if output_attentions: outputs += (self_attn_weights,)`, which computes nothing
    touches = {"residual", "hidden_states"}
    for node in ast.walk(statement):
        if isinstance(node, ast.Call):
            return False
        if isinstance(node, ast.Name) and node.id in touches and isinstance(node.ctx, ast.Store):
            return False
    return isinstance(statement.test, ast.Name)


def _branch(calls: list[str], start: int, core: str) -> tuple[list[str], int] | None:
    """[norm] core [norm] [dropout] + from calls[start]: the modules from core to the add, and where
    the next branch starts; None when the calls differ."""
    i = start
    if i < len(calls) and "norm" in calls[i]:
        i += 1
    if i >= len(calls) or calls[i] != core:
        return None
    chain = [core]
    i += 1
    if i < len(calls) and "norm" in calls[i]:
        chain.append(calls[i])
        i += 1
    if i < len(calls) and "drop" in calls[i]:
        chain.append(calls[i])
        i += 1
    if i >= len(calls) or calls[i] != "+":
        return None
    return chain, i + 1


Layout = tuple[tuple[str, ...], tuple[str, ...]]
_LAYOUTS: dict[type[nn.Module], Layout | None] = {}


def decoder_layout(cls: type[nn.Module]) -> Layout | None:
    """The chains of modules (from `self_attn` / `mlp` to the add: a sandwich norm, a dropout) of the
    two branches of a Hugging Face decoder layer class of the common layout, read from its forward
    once (see above); None when its forward is not of that layout (or its source cannot be read)."""
    if cls not in _LAYOUTS:
        _LAYOUTS[cls] = _read_layout(cls)
    return _LAYOUTS[cls]


def _read_layout(cls: type[nn.Module]) -> Layout | None:
    calls = _forward_calls(cls)
    if calls is None:
        return None
    attn = _branch(calls, 0, "self_attn")
    if attn is None:
        return None
    ff = _branch(calls, attn[1], "mlp")
    if ff is None or ff[1] != len(calls):
        return None
    return tuple(attn[0]), tuple(ff[0])


def _scales_by_weight(norm: nn.Module) -> bool:
    """Whether a normalisation computes weight·x̂ (LLaMA's, OLMo2's RMSNorm, a LayerNorm), into whose
    weight a scalar gate folds, rather than (1 + weight)·x̂ (Gemma's), where it does not."""
    if isinstance(norm, (nn.LayerNorm, nn.RMSNorm)):
        return True
    try:
        source = inspect.getsource(type(norm).forward)
    except (OSError, TypeError):
        return False
    plain = source.replace(" ", "")
    times_weight = "self.weight*" in plain or "*self.weight" in plain
    one_plus_weight = "1.0+self.weight" in plain or "1+self.weight" in plain
    return times_weight and not one_plus_weight


_ATTENTION_OUTPUT = ("o_proj", "out_proj", "dense", "c_proj", "proj")
_MLP_OUTPUT = ("down_proj", "fc2", "c_proj", "dense_4h_to_h", "w2")


def _fold_path(layer: nn.Module, chain: tuple[str, ...], outputs: tuple[str, ...]) -> str | None:
    # The module a gate at the branch's end folds into: the last norm of the chain when there is one (a
    # sandwich norm: the gate scales its output), else the output projection of self_attn / mlp.
    norms = [name for name in chain[1:] if "norm" in name]
    if norms:
        return norms[-1] if _scales_by_weight(layer.get_submodule(norms[-1])) else None
    inner = layer.get_submodule(chain[0])
    for name in outputs:
        if isinstance(getattr(inner, name, None), nn.Linear):
            return f"{chain[0]}.{name}"
    return None


def _end(layer: nn.Module, chain: tuple[str, ...], other: tuple[str, ...]) -> str | None:
    # The last module of the chain, unless the other branch's chain ends at the same module (Emu3's one
    # `dropout` for both adds): then the module before it, a dropout commuting with the gate's scale.
    modules = [name for name in chain if isinstance(getattr(layer, name, None), nn.Module)]
    if len(modules) != len(chain):
        return None
    if chain[-1] == other[-1] and len(chain) > 1:
        return chain[-2]
    return chain[-1]


@functools.lru_cache(maxsize=256)
def _decoder_spec(attn: str, ff: str, fold: tuple[tuple[str, str], ...]) -> BlockSpec:
    return BlockSpec({"attn": attn, "ff": ff}, channel_dim=-1, width=_hidden_size, fold=dict(fold))


def hugging_face_decoder_rule(module: nn.Module) -> BlockSpec | None:
    """The spec of a Hugging Face decoder layer of the common layout (`decoder_layout`): branches "attn"
    and "ff" ending at the last module before each add (self_attn / mlp, a sandwich norm, Phi-3's
    resid dropouts), channels last, folds into the output projection (o_proj, down_proj, ...) or into a
    sandwich norm whose output is weight·x̂; None for any other module."""
    cls = type(module)
    if not cls.__module__.startswith(_HF_PREFIX):
        return None
    children = module._modules
    if not isinstance(children.get("self_attn"), nn.Module) or not isinstance(children.get("mlp"), nn.Module):
        return None
    layout = decoder_layout(cls)
    if layout is None:
        return None
    attn_chain, ff_chain = layout
    attn_end, ff_end = _end(module, attn_chain, ff_chain), _end(module, ff_chain, attn_chain)
    if attn_end is None or ff_end is None:
        return None
    fold = {"attn": _fold_path(module, attn_chain, _ATTENTION_OUTPUT), "ff": _fold_path(module, ff_chain, _MLP_OUTPUT)}
    return _decoder_spec(attn_end, ff_end, tuple((key, path) for key, path in fold.items() if path is not None))


register_rule("hugging-face-decoder", hugging_face_decoder_rule)

# ---- torchvision ----------------------------------------------------------------------------------
# ResNet blocks: out = bn2(conv2(...)); out += downsample(x) or x; relu (post-activation: see above)
register_block("torchvision.models.resnet.BasicBlock", "bn2", shortcut="downsample", fold="bn2",
               identity_when_closed=False)
register_block("torchvision.models.resnet.Bottleneck", "bn3", shortcut="downsample", fold="bn3",
               identity_when_closed=False)
# ViT: x = dropout(self_attention(ln_1(input))) + input; x + mlp(ln_2(x)); mlp is a Sequential
# (Linear, GELU, Dropout, Linear, Dropout)
register_block("torchvision.models.vision_transformer.EncoderBlock", {"attn": "dropout", "ff": "mlp"},
               channel_dim=-1, width=_out_features("mlp.3"),
               fold={"attn": "self_attention.out_proj", "ff": "mlp.3"})
# ConvNeXt: stochastic_depth(layer_scale * block(input)) + input; layer_scale is a (C, 1, 1) parameter,
# the block ends channels-last in Linear block.5, then permutes back
register_block("torchvision.models.convnext.CNBlock", "stochastic_depth", gates="layer_scale", fold="block.5")
# Swin: x + stochastic_depth(attn(norm1(x))), x + stochastic_depth(mlp(norm2(x))): one stochastic_depth
# module for both adds, so each branch ends at its own module before it. V2 normalises the branch's
# output (x + stochastic_depth(norm1(attn(x)))): the norms end the branches, and a gate folds into a
# LayerNorm's weight and bias.
register_block("torchvision.models.swin_transformer.SwinTransformerBlock", {"attn": "attn", "ff": "mlp"},
               channel_dim=-1, width=_out_features("mlp.3"), fold={"attn": "attn.proj", "ff": "mlp.3"})
register_block("torchvision.models.swin_transformer.SwinTransformerBlockV2", {"attn": "norm1", "ff": "norm2"},
               channel_dim=-1, width=_out_features("mlp.3"), fold={"attn": "norm1", "ff": "norm2"})

# ---- timm -----------------------------------------------------------------------------------------


def _timm_resnet(last_norm: str) -> Callable[[nn.Module], BlockSpec]:
    ends = ("drop_path", "se", last_norm)
    folded = BlockSpec({"": ends}, shortcut="downsample", fold={"": last_norm}, identity_when_closed=False)
    unfolded = BlockSpec({"": ends}, shortcut="downsample", identity_when_closed=False)

    def choose(block: nn.Module) -> BlockSpec:
        return folded if getattr(block, "se", None) is None else unfolded
    return choose


# ResNet blocks: the branch ends in drop_path, else se, else the last BatchNorm (None where absent); act2 /
# act3 after the add. A gate folds into the BatchNorm only without a squeeze-excitation (SE-ResNet: x·σ(...)
# of the BatchNorm's output, which a scale of the BatchNorm does not scale).
_per_instance("timm.models.resnet.BasicBlock", _timm_resnet("bn2"))
_per_instance("timm.models.resnet.Bottleneck", _timm_resnet("bn3"))
# ViT block: x + drop_path1(ls1(attn(norm1(x)))); ls1/ls2 are LayerScale (gamma) or an empty nn.Identity slot
register_block("timm.models.vision_transformer.Block", {"attn": "drop_path1", "ff": "drop_path2"},
               gates={"attn": "ls1", "ff": "ls2"}, channel_dim=-1, fold={"attn": "attn.proj", "ff": "mlp.fc2"})
# ConvNeXt block: drop_path(x * gamma) + shortcut(x); gamma is a parameter or None
register_block("timm.models.convnext.ConvNeXtBlock", "drop_path", gates="gamma", shortcut="shortcut",
               fold="mlp.fc2")
# Swin: x + drop_path1(_attn(norm1(x))), x + drop_path2(mlp(norm2(x))), tokens (B, H, W, C) channels last
register_block("timm.models.swin_transformer.SwinTransformerBlock", {"attn": "drop_path1", "ff": "drop_path2"},
               channel_dim=-1, width=_out_features("mlp.fc2"), fold={"attn": "attn.proj", "ff": "mlp.fc2"})


def _has_skip(block: nn.Module) -> bool:
    return bool(getattr(block, "has_skip", False))


# EfficientNet / MobileNet blocks: `if self.has_skip: x = self.drop_path(x) + shortcut`; without has_skip
# (a stride-2 or widening block, or noskip) the block has no shortcut at all. CondConvResidual, a subclass
# of InvertedResidual, computes the same way and shares the entry.
register_block("timm.models._efficientnet_blocks.InvertedResidual", "drop_path", skip=_has_skip, fold="bn3")
register_block("timm.models._efficientnet_blocks.EdgeResidual", "drop_path", skip=_has_skip, fold="bn2")
# EfficientNetV2's first stage: conv, bn1 with its activation, aa; no fold (the activation follows the norm)
register_block("timm.models._efficientnet_blocks.ConvBnAct", "drop_path", skip=_has_skip)


def _depthwise_separable(block: nn.Module) -> BlockSpec:
    # bn2 applies the point-wise activation when has_pw_act: then a gate does not fold into it
    return _DS_PW_ACT if getattr(block, "has_pw_act", False) else _DS


_DS = BlockSpec({"": "drop_path"}, skip=_has_skip, fold={"": "bn2"})
_DS_PW_ACT = BlockSpec({"": "drop_path"}, skip=_has_skip)
_per_instance("timm.models._efficientnet_blocks.DepthwiseSeparableConv", _depthwise_separable)


def _has_downsample(block: nn.Module) -> bool:
    return getattr(block, "downsample", None) is not None


def _linear_out(block: nn.Module) -> bool:
    return isinstance(getattr(block, "act3", None), nn.Identity)


# RegNet: `if self.downsample is not None: x = self.drop_path(x) + self.downsample(shortcut)`, then act3:
# downsample None means no shortcut, nn.Identity the identity, a ConvNormAct a projection
register_block("timm.models.regnet.Bottleneck", "drop_path", shortcut="downsample", skip=_has_downsample,
               fold="conv3.bn", identity_when_closed=_linear_out)
# PreBottleneck normalises first and adds the normalised input: x = norm1(x); drop_path(f(x)) + downsample(x), so a
# closed branch leaves norm1(x) (a BatchNorm with its activation), not the block's input
register_block("timm.models.regnet.PreBottleneck", "drop_path", shortcut="downsample", skip=_has_downsample,
               fold="conv3", identity_when_closed=False)


def _weight_standardised(conv: nn.Module) -> bool:
    # timm's StdConv2d / ScaledStdConv2d standardise their weight in forward: a scale folded into it is lost
    return "std" in type(conv).__name__.lower()


def _resnetv2(last_conv: str, post_activation: bool) -> Callable[[nn.Module], BlockSpec]:
    folded = BlockSpec({"": "drop_path"}, shortcut="downsample", fold={"": last_conv},
                       identity_when_closed=not post_activation)
    unfolded = BlockSpec({"": "drop_path"}, shortcut="downsample", identity_when_closed=not post_activation)

    def choose(block: nn.Module) -> BlockSpec:
        return unfolded if _weight_standardised(block.get_submodule(last_conv)) else folded
    return choose


# ResNetV2: pre-activation blocks return drop_path(conv(...)) + shortcut, downsample None meaning the
# identity; the non-pre-activation Bottleneck normalises (norm3) before drop_path and applies act3 after the
# add. BiT's weight-standardised convolutions take no fold (the Bottleneck folds into norm3 regardless).
_per_instance("timm.models.resnetv2.PreActBasic", _resnetv2("conv2", post_activation=False))
_per_instance("timm.models.resnetv2.PreActBottleneck", _resnetv2("conv3", post_activation=False))
register_block("timm.models.resnetv2.Bottleneck", "drop_path", shortcut="downsample", fold="norm3",
               identity_when_closed=False)
