"""n-shortcut networks (Demystifying ResNet section 3): linear or with activations, plain when n = 0.

`create_model("shortcut_net", depth=L, shortcut_depth=n, width=10, activation=None | "relu",
activation_position="mid", init="xavier" | "orthogonal" | "zero")` builds L square, bias-free
layers of size `width`, grouped into L/n residual units x ↦ x + W_n ⋯ W_1 x (`ShortcutUnit`). With
shortcut_depth=0 the same L layers form a plain network, grouped into units of `plain_unit` layers
without shortcuts, so that activations sit at the same positions as in the shortcut network they
are compared with (paper appendix B). The paper's networks have no biases and no separate input or
output layer: inputs are the 10 whitened principal components, outputs the 10 one-hot targets, so
`forward_head` is the identity and in/out size equals `width`.

Initialisations (paper section 5): "xavier" is Glorot's Gaussian, N(0, 2/(fan_in + fan_out));
"orthogonal" is Saxe et al.'s random orthogonal matrices; "zero" is the zero point plus a small
perturbation, Xavier Gaussian multiplied by `zero_scale` (the paper's constant was lost in the
converted text; 1e-4 by default, `zero_scale=0` gives the exact zero point of Theorem 2).
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.shortcut import ACTIVATION_POSITIONS, ShortcutUnit
from .base import MLP
from .registry import register_model

__all__ = ["ShortcutNet", "SHORTCUT_INITS", "init_shortcut_net_"]

SHORTCUT_INITS = ("xavier", "orthogonal", "zero")


class ShortcutNet(MLP):
    """A stack of `ShortcutUnit`s in `blocks`; `forward(x)` = forward_head(forward_features(x)).

    `stem` and `head` are nn.Identity() in the paper's networks; they are bias-free linear maps
    only when the model is built with in_features / num_classes different from the width.
    """

    def __init__(self, blocks: list[ShortcutUnit], stem: nn.Module | None = None, head: nn.Module | None = None) -> None:
        super().__init__(stem if stem is not None else nn.Identity(), list(blocks),
                         head if head is not None else nn.Identity())

    def weight_matrices(self) -> list[torch.Tensor]:
        """All L weight matrices in forward order."""
        return [w for block in self.blocks for w in block.weights()]  # type: ignore[operator]  # ShortcutUnits


def init_shortcut_net_(model: ShortcutNet, init: str = "xavier", zero_scale: float = 1e-4) -> ShortcutNet:
    """Initialise every weight of `model` in place with `init` (one of SHORTCUT_INITS); return it.

    Draws from torch's global generator, so seed it (torch.manual_seed) for reproducible inits.
    """
    if init not in SHORTCUT_INITS:
        raise ValueError(f"init={init!r} is not known; accepted values: {list(SHORTCUT_INITS)}")
    if not zero_scale >= 0:
        raise ValueError(f"zero_scale={zero_scale!r}: must be ≥ 0")
    with torch.no_grad():
        for w in model.weight_matrices():
            if init == "orthogonal":
                nn.init.orthogonal_(w)
            else:
                nn.init.xavier_normal_(w)
                if init == "zero":
                    w.mul_(zero_scale)
    return model


@register_model("shortcut_net", "n-shortcut network of L square bias-free layers, linear or with pre/mid/post activations; n=0 is plain (Demystifying ResNet §3)")
def shortcut_net(
    depth: int = 2,
    shortcut_depth: int = 2,
    width: int = 10,
    activation: str | None = None,
    activation_position: str | tuple[str, ...] = "mid",
    init: str = "xavier",
    zero_scale: float = 1e-4,
    plain_unit: int = 2,
    in_features: int | None = None,
    num_classes: int | None = None,
) -> ShortcutNet:
    """Build an n-shortcut network with L = `depth` layers (see the module docstring).

    `activation_position` is one of "pre", "mid", "post" or a tuple of them. `plain_unit` is the
    grouping of a plain network's layers (shortcut_depth=0) that decides where its activations sit.
    `in_features` / `num_classes` (default: the width, the paper's setting) add a bias-free linear
    stem / head, Xavier-initialised and not counted in `weight_matrices()`, for other data.
    """
    for field, value, low in (("depth", depth, 1), ("shortcut_depth", shortcut_depth, 0), ("width", width, 1),
                              ("plain_unit", plain_unit, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{field}={value!r}: must be an integer ≥ {low}")
    positions = (activation_position,) if isinstance(activation_position, str) else tuple(activation_position)
    bad = sorted(set(positions) - set(ACTIVATION_POSITIONS))
    if bad:
        raise ValueError(f"activation_position: {bad} not known; accepted values: {list(ACTIVATION_POSITIONS)}")
    group = shortcut_depth if shortcut_depth > 0 else plain_unit
    if depth % group:
        what = "shortcut_depth" if shortcut_depth > 0 else "plain_unit"
        raise ValueError(f"depth={depth} must be a multiple of {what}={group} (units of {group} layers)")
    blocks = [ShortcutUnit(width, group, activation, positions, shortcut=shortcut_depth > 0)
              for _ in range(depth // group)]
    stem = head = None
    for field, value in (("in_features", in_features), ("num_classes", num_classes)):  # type: ignore[assignment]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{field}={value!r}: must be a positive integer or None")
    if in_features is not None and in_features != width:
        stem = nn.Linear(in_features, width, bias=False)
        nn.init.xavier_normal_(stem.weight)
    if num_classes is not None and num_classes != width:
        head = nn.Linear(width, num_classes, bias=False)
        nn.init.xavier_normal_(head.weight)
    return init_shortcut_net_(ShortcutNet(blocks, stem, head), init, zero_scale)
