"""The container every model family shares, stem → blocks → head, and helpers of several families.

DESIGN (docs/design.md): every model keeps its blocks in one `nn.ModuleList` called `blocks` and has
`forward_features` and `forward_head`; lesioning, pruning, gate statistics and state_dict keys
lean on these names. A family file defines its blocks and its registration, and builds one of the
containers below.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["StemBlocksHead", "MLP", "ConvNet", "check_positive_int", "conv_init_", "resnet_head"]


class StemBlocksHead(nn.Module):
    """stem → blocks → head; `forward` returns `forward_head(forward_features(x))`.

    `flatten_input`: fully connected families flatten (N, ...) inputs to (N, features) first.
    """

    flatten_input = False

    def __init__(self, stem: nn.Module, blocks: Sequence[nn.Module], head: nn.Module) -> None:
        super().__init__()
        self.stem = stem
        self.blocks = nn.ModuleList(blocks)
        self.head = head

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Map inputs through the stem and every block (the features that enter the head)."""
        h = self.stem(x.flatten(1) if self.flatten_input else x)
        for block in self.blocks:
            h = block(h)
        return h

    def forward_head(self, h: torch.Tensor) -> torch.Tensor:
        """Map the last block's output to the model's output (logits) through the head."""
        return self.head(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


class MLP(StemBlocksHead):
    """Fully connected stem → blocks → head on flattened inputs: features (N, width), logits (N, classes)."""

    flatten_input = True


class ConvNet(StemBlocksHead):
    """Convolutional stem → blocks → head: images (N, C, H, W) to the last block's feature maps
    (N, channels, H', W'), then the head's logits (for the ResNets: BN-ReLU, global average pooling, linear)."""


def check_positive_int(field: str, value: object, low: int = 1) -> None:
    """Raise a ValueError naming `field` unless `value` is an integer ≥ `low`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{field}={value!r}: must be an integer ≥ {low}")


def conv_init_(model: nn.Module) -> nn.Module:
    """He normal (fan_out) convolutions, zero biases, linear bias zero: the init of the ResNet and WRN
    reference implementations. BatchNorm keeps weight 1, bias 0; scalar gates keep k."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
    return model


def resnet_head(channels: int, num_classes: int, bn_momentum: float) -> nn.Sequential:
    """BN-ReLU (the last pre-activation), global average pooling, linear classifier."""
    return nn.Sequential(nn.BatchNorm2d(channels, momentum=bn_momentum), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(channels, num_classes))
