"""The block types of other libraries that the toolkit knows, registered by class (torch's) or by fully
qualified class name (the other libraries', so that none of them is imported here).

Each entry says where every residual branch ends (the module whose output is added to the
shortcut), the gate the architecture carries or has a slot for, the projection shortcut, and the
Linear / convolution / BatchNorm whose output is the branch (where `fold_gates` multiplies a gate
in). `layers.blocks.check_blocks` verifies an entry on a real model and example input; the
entries below were checked so on the real classes (scripts/check_real_blocks.py, its output under
results/real-blocks/).
"""

from __future__ import annotations

from typing import cast

from torch import nn

from .blocks import register_block

__all__: list[str] = []


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
register_block("transformers.models.llama.modeling_llama.LlamaDecoderLayer", {"attn": "self_attn", "ff": "mlp"},
               channel_dim=-1, fold={"attn": "self_attn.o_proj", "ff": "mlp.down_proj"})
# BERT is post-norm: LayerNorm(x + dropout(dense(h))) inside its output modules; a closed branch gives LayerNorm(x)
register_block("transformers.models.bert.modeling_bert.BertLayer",
               {"attn": "attention.output.dropout", "cross": "crossattention.output.dropout", "ff": "output.dropout"},
               optional=("cross",), channel_dim=-1, identity_when_closed=False,
               fold={"attn": "attention.output.dense", "cross": "crossattention.output.dense", "ff": "output.dense"})
# transformers 5: both branches pass one `dropout` module, so each ends at its own module before it
# (attention, mlp); transformers 4.x ended the feed-forward branch in output.dropout
register_block("transformers.models.vit.modeling_vit.ViTLayer", {"attn": "attention", "ff": ("mlp", "output.dropout")},
               channel_dim=-1, fold={"attn": "attention.o_proj", "ff": "mlp.fc2"})

# ---- torchvision ----------------------------------------------------------------------------------
# ResNet blocks: out = bn2(conv2(...)); out += downsample(x) or x; relu
register_block("torchvision.models.resnet.BasicBlock", "bn2", shortcut="downsample", fold="bn2")
register_block("torchvision.models.resnet.Bottleneck", "bn3", shortcut="downsample", fold="bn3")

# ---- timm -----------------------------------------------------------------------------------------
# ResNet blocks: the branch ends in drop_path, else se, else the last BatchNorm (None where absent); the
# fold into the BatchNorm holds when there is no squeeze-excitation between it and the end
register_block("timm.models.resnet.BasicBlock", ("drop_path", "se", "bn2"), shortcut="downsample", fold="bn2")
register_block("timm.models.resnet.Bottleneck", ("drop_path", "se", "bn3"), shortcut="downsample", fold="bn3")
# ViT block: x + drop_path1(ls1(attn(norm1(x)))); ls1/ls2 are LayerScale (gamma) or an empty nn.Identity slot
register_block("timm.models.vision_transformer.Block", {"attn": "drop_path1", "ff": "drop_path2"},
               gates={"attn": "ls1", "ff": "ls2"}, channel_dim=-1, fold={"attn": "attn.proj", "ff": "mlp.fc2"})
# ConvNeXt block: drop_path(x * gamma) + shortcut(x); gamma is a parameter or None
register_block("timm.models.convnext.ConvNeXtBlock", "drop_path", gates="gamma", shortcut="shortcut",
               fold="mlp.fc2")
