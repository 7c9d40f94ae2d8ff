"""A small vision transformer over image patches, built from torch's own `nn.TransformerEncoderLayer`,
for the 2017 gate in a transformer (`reproduce transformer-gates`).

Shape (ours; the papers have no transformer): the image (a flattened 28 × 28 MNIST image, or
(N, C, H, W)) is cut into `patch` × `patch` patches, each mapped to `width` channels by one linear
map (a strided convolution), plus a learned position embedding (the stem); `depth` pre-norm
encoder layers (norm_first=True, GELU, feed-forward width 2·width, no dropout) sit in `model.blocks`;
the head is LayerNorm, mean over tokens, and a linear classifier.

`gate` puts a gate at the end of every residual branch (two per layer: attention and feed-forward)
through `layers.add_gates`: "none" (the ungated pre-norm transformer), "relu" (gated-residual-v2's
u = x + relu(k)·f(x), k = 1), "rezero" (u = x + α·f(x), α = 0; ReZero's gate on the pre-norm
layer, which keeps its LayerNorm) or "layerscale" (u = x + diag(λ)·f(x), λ = CaiT's ε for `depth`
transformer layers, Touvron et al. 2021 §3).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..layers import add_gates
from .base import check_positive_int
from .registry import register_model

__all__ = ["VisionTransformer", "VIT_GATES"]

VIT_GATES = ("none", "relu", "rezero", "layerscale")


class VisionTransformer(nn.Module):
    """Patches → `blocks` (torch's nn.TransformerEncoderLayer, pre-norm) → LayerNorm, token mean, linear."""

    def __init__(self, depth: int, width: int, heads: int, patch: int, image_size: int, in_channels: int,
                 num_classes: int) -> None:
        super().__init__()
        self.image_size = image_size
        self.in_channels = in_channels
        self.stem = nn.Conv2d(in_channels, width, patch, stride=patch)
        tokens = (image_size // patch) ** 2
        self.position = nn.Parameter(torch.zeros(1, tokens, width))
        nn.init.trunc_normal_(self.position, std=0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def no_weight_decay(self) -> set[str]:
        """The parameters weight decay leaves alone (timm's rule, read by recipes.param_groups): the position
        embedding, a lookup table like nn.Embedding's weight."""
        return {"position"}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (N, C·H·W) or (N, C, H, W) to the last layer's tokens (N, T, width)."""
        if x.dim() == 2:
            x = x.view(x.shape[0], self.in_channels, self.image_size, self.image_size)
        h = self.stem(x).flatten(2).transpose(1, 2) + self.position  # (N, T, width)
        for block in self.blocks:
            h = block(h)
        return h

    def forward_head(self, h: torch.Tensor) -> torch.Tensor:
        """Tokens (N, T, width) to logits (N, classes): LayerNorm, mean over tokens, linear."""
        return self.head(self.norm(h).mean(dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@register_model("vit_patch", "small vision transformer over patches: torch's nn.TransformerEncoderLayer blocks "
                             "(pre-norm), gate none / relu (gated-residual-v2's relu(k), via add_gates) / rezero / "
                             "layerscale on both branches of every layer (ours: the 2017 gate in a transformer)")
def vit_patch(depth: int = 6, width: int = 32, heads: int = 4, patch: int = 7, gate: str = "none",
              in_features: int = 784, num_classes: int = 10) -> VisionTransformer:
    """`depth` encoder layers of `width` channels and `heads` heads over `patch` × `patch` patches of
    a square one-channel image of `in_features` pixels (MNIST: 784 = 28 × 28, 16 patches of 7 × 7),
    gated as `gate` says (see the module docstring). ValueError naming the argument for a gate not
    in VIT_GATES, a width not divisible by heads, or an image side not divisible by the patch."""
    for name, value in (("depth", depth), ("width", width), ("heads", heads), ("patch", patch),
                        ("in_features", in_features), ("num_classes", num_classes)):
        check_positive_int(name, value)
    if gate not in VIT_GATES:
        raise ValueError(f"gate={gate!r}; accepted values: {list(VIT_GATES)}")
    if width % heads:
        raise ValueError(f"width={width} is not divisible by heads={heads}")
    side = math.isqrt(in_features)
    if side * side != in_features or side % patch:
        raise ValueError(f"in_features={in_features}: vit_patch needs a square one-channel image whose side is a "
                         f"multiple of patch={patch} (MNIST: 784 = 28 x 28)")
    model = VisionTransformer(depth, width, heads, patch, side, 1, num_classes)
    if gate != "none":
        add_gates(model, gate)
    return model
