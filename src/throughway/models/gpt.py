"""Causal language models over token ids: a small GPT of torch's own layers, and Hugging Face's GPT-2.

Both map token ids (B, T) to next-token logits (B, T, vocab_size), with T at most `context`; neither
takes targets, so the training path (train.lm) gives them the inputs of a block and computes the
loss itself from the logits and the unshifted block (a Hugging Face model given `labels` shifts them
inside; here it is never given any).

* `gpt` (nanoGPT's model, Karpathy 2022, built from torch's layers): a token and a learned position
  embedding (both nn.Embedding), dropout, `depth` pre-norm `nn.TransformerEncoderLayer` blocks
  (norm_first=True, GELU, feed-forward width 4·width, biases, the causal mask; the layer's fused
  inference path off, so eval mode computes what training does) in `model.blocks`,
  a final LayerNorm and a linear head without bias (not tied to the token embedding). nanoGPT's
  initialisation (model.py `_init_weights`): every linear weight and embedding N(0, 0.02²), biases 0,
  the two projections into the residual stream (attention's `out_proj`, the feed-forward `linear2`)
  N(0, (0.02/√(2·depth))²) (GPT-2's scaled residual init).
* `hf_gpt2`: transformers' `GPT2LMHeadModel` built from a `GPT2Config` (random initialisation, no
  weights downloaded; GPT-2 ties its head to the token embedding), held as `model.lm`; `model.blocks`
  is its `transformer.h`. transformers is an optional dependency: without it an ImportError says
  `pip install transformers`.

`gate` puts a gate at the end of every residual branch (attention and feed-forward) through
`layers.add_gates`, as vit_patch does: "none", "relu" (gated-residual-v2's relu(k), k = 1), "rezero"
(α = 0) or "layerscale" (λ = CaiT's ε for `depth` layers).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..layers import GATE_KINDS, add_gates, block_spec
from .base import check_positive_int
from .registry import register_model

__all__ = ["GPT", "HFGPT2", "LM_GATES", "TRANSFORMERS_MISSING"]

LM_GATES = ("none", *GATE_KINDS)
TRANSFORMERS_MISSING = ("model 'hf_gpt2' needs Hugging Face transformers, which is not installed: pip install "
                        "transformers (or pip install 'throughway[dev]'); the model 'gpt' (torch's own layers) needs nothing "
                        "more")


def _check_arguments(depth: int, width: int, heads: int, context: int, vocab_size: int, dropout: float,
                     gate: str) -> None:
    for name, value in (("depth", depth), ("width", width), ("heads", heads), ("context", context),
                        ("vocab_size", vocab_size)):
        check_positive_int(name, value)
    if width % heads:
        raise ValueError(f"width={width} is not divisible by heads={heads}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout={dropout!r}: accepted: a number in [0, 1)")
    if gate not in LM_GATES:
        raise ValueError(f"gate={gate!r}; accepted values: {list(LM_GATES)}")


def _check_tokens(idx: torch.Tensor, context: int) -> None:
    if idx.dim() != 2 or idx.is_floating_point() or idx.shape[1] > context:
        raise ValueError(f"input: token ids of shape (batch, T ≤ {context}) with an integer dtype expected; got "
                         f"{tuple(idx.shape)} {idx.dtype}")


class GPT(nn.Module):
    """Token + position embedding → `blocks` (nn.TransformerEncoderLayer, pre-norm, causal) → LayerNorm → linear head."""

    def __init__(self, depth: int, width: int, heads: int, context: int, vocab_size: int, dropout: float) -> None:
        super().__init__()
        self.context = context
        self.token = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=dropout, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self._init_weights(depth)
        # torch's fused inference path (eval mode, no grad) computes a layer in one kernel, skipping the
        # modules a gate or a lesion hooks, and rounds differently: the registry's own `prepare` turns it
        # off here, so evaluation computes what training computes, before and after any analysis.
        for block in self.blocks:
            spec = block_spec(block)
            if spec is not None and spec.prepare is not None:
                spec.prepare(block)

    def _init_weights(self, depth: int) -> None:
        """nanoGPT's initialisation (see the module docstring)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                bias = getattr(module, "bias", None)
                if isinstance(bias, torch.Tensor):
                    nn.init.zeros_(bias)
        residual_std = 0.02 / math.sqrt(2 * depth)
        for block in self.blocks:
            assert isinstance(block, nn.TransformerEncoderLayer)
            attention = block.self_attn
            nn.init.normal_(attention.in_proj_weight, mean=0.0, std=0.02)  # a parameter, not an nn.Linear
            nn.init.zeros_(attention.in_proj_bias)
            nn.init.normal_(attention.out_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.linear2.weight, mean=0.0, std=residual_std)

    def forward_features(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) to the last block's output (B, T, width), each position attending to itself
        and the positions before it."""
        _check_tokens(idx, self.context)
        steps = idx.shape[1]
        positions = torch.arange(steps, device=idx.device)
        h = self.drop(self.token(idx) + self.position(positions))  # (B, T, width)
        # The additive causal mask; is_causal=True lets attention use its causal kernel with it.
        mask = torch.triu(torch.full((steps, steps), float("-inf"), device=idx.device, dtype=h.dtype), diagonal=1)
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
        return h

    def forward_head(self, h: torch.Tensor) -> torch.Tensor:
        """Features (B, T, width) to next-token logits (B, T, vocab_size): final LayerNorm, linear head."""
        return self.head(self.norm(h))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(idx))


class HFGPT2(nn.Module):
    """Hugging Face's GPT2LMHeadModel as a model of the registry: token ids (B, T) → logits (B, T, vocab_size)."""

    def __init__(self, depth: int, width: int, heads: int, context: int, vocab_size: int, dropout: float) -> None:
        super().__init__()
        try:
            import transformers
        except ImportError as exc:
            raise ImportError(TRANSFORMERS_MISSING) from exc
        self.context = context
        config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=context, n_embd=width, n_layer=depth,
                                         n_head=heads, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                         use_cache=False, bos_token_id=None, eos_token_id=None)
        self.lm = transformers.GPT2LMHeadModel(config)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer layers (GPT2Block), `lm.transformer.h` (a view: state_dict names them there)."""
        return self.lm.transformer.h

    def forward_features(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) to the transformer's output (B, T, width), after GPT-2's final LayerNorm ln_f."""
        _check_tokens(idx, self.context)
        return self.lm.transformer(input_ids=idx, use_cache=False).last_hidden_state

    def forward_head(self, h: torch.Tensor) -> torch.Tensor:
        """Features (B, T, width) to logits (B, T, vocab_size): GPT-2's head."""
        return self.lm.lm_head(h)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(idx))


def _gated(model: nn.Module, gate: str) -> Any:
    if gate != "none":
        add_gates(model, gate)
    return model


@register_model("gpt", "small GPT of torch's own layers (nanoGPT's): token + position embedding, pre-norm causal "
                       "nn.TransformerEncoderLayer blocks, final LayerNorm, linear head; gate none / relu / rezero / "
                       "layerscale on both branches of every layer")
def gpt(depth: int = 6, width: int = 128, heads: int = 4, context: int = 128, vocab_size: int = 85,
        dropout: float = 0.0, gate: str = "none") -> GPT:
    """`depth` causal pre-norm transformer layers of `width` channels and `heads` heads over at most
    `context` tokens of a `vocab_size`-symbol vocabulary, gated as `gate` says (module docstring).
    The default vocabulary is shakespeare-char's (85 ids). ValueError naming the argument otherwise."""
    _check_arguments(depth, width, heads, context, vocab_size, dropout, gate)
    return _gated(GPT(depth, width, heads, context, vocab_size, float(dropout)), gate)


@register_model("hf_gpt2", "Hugging Face transformers' GPT-2 (GPT2LMHeadModel from a GPT2Config, random weights; "
                           "needs transformers), gate none / relu / rezero / layerscale on both branches of every layer")
def hf_gpt2(depth: int = 6, width: int = 128, heads: int = 4, context: int = 128, vocab_size: int = 85,
            dropout: float = 0.0, gate: str = "none") -> HFGPT2:
    """GPT-2 (Radford et al. 2019) with `depth` layers (n_layer), `width` (n_embd), `heads` (n_head),
    `context` positions (n_positions) and `vocab_size` tokens, dropout `dropout` everywhere, built by
    transformers from a GPT2Config with its own initialisation; gated as `gate` says. ImportError naming
    `pip install transformers` when transformers is missing; ValueError naming the argument otherwise."""
    _check_arguments(depth, width, heads, context, vocab_size, dropout, gate)
    return _gated(HFGPT2(depth, width, heads, context, vocab_size, float(dropout)), gate)
