"""Lesioning one layer and physically removing blocks.

* `lesion(model, index)` (highway paper section 4.2, figure 4): a context manager that closes the
  gate of block `index`, so the block copies its input: all transform gates of a highway layer set
  to T = 0 (y = x); a gated residual block's g(k) set to 0 (u = shortcut(x), the effect of k = 0
  with g = ReLU); an augmented layer's g(k) set to 0; an ungated residual block's branch dropped.
  It swaps the block's `gate` module for a closed one and puts the original module object back on
  exit, so no parameter or buffer is ever written and the model is restored bit for bit.
* `prune(model, blocks)` (gated-residual-v2 section 3.1, figure 5 right): a new, physically smaller
  model of the same family without the given blocks, built by `create_model` from an updated
  `model.config`, so it saves and loads like any other model. Supported: the fully connected
  families (PRUNABLE_MODELS), whose blocks all map width to width; a CIFAR ResNet's config cannot
  express stages of unequal length, and its stage-opening blocks change the shape.
* `removal_order` and `removal_curve`: greedy-by-k and random orders and the metric after each
  removal.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence, cast

import torch
from torch import nn

from ..layers import HighwayLayer, PreActBlock, PreActUnit, ResidualBlock, TransformGate
from ..layers.gated import AugmentedLayer
from ..models import create_model
from .gates import block_scalar_gates

__all__ = ["ClosedGate", "lesion", "prune", "check_prunable", "layers_per_block", "removal_order", "removal_curve",
           "STRATEGIES", "PRUNABLE_MODELS"]

STRATEGIES = ("greedy", "random")
# Registry names whose blocks are interchangeable (every block maps width to width) and whose
# config rebuilds any number of them through `depth`.
PRUNABLE_MODELS = ("mlp_gated_residual", "mlp_residual", "mlp_augmented", "mlp_highway", "mlp_plain", "mlp_rezero",
                   "mlp_layerscale")


class ClosedGate(nn.Module):
    """A gate that is shut: `forward` returns zeros shaped like its input (T(x) = 0 for a transform
    gate, g(k)·h = 0 for a scalar gate) and `value()` returns g = 0 (what `AugmentedLayer` reads).

    Holds the gate it replaces as `closed` (not registered as a submodule, so state_dict keys and
    parameters() are unchanged while it is in place)."""

    def __init__(self, closed: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "closed", closed)

    def value(self) -> torch.Tensor:
        """g = 0: the closed gate's value, as a 0-d tensor."""
        reference = next(iter(cast(nn.Module, self.closed).parameters()), None)
        if reference is None:
            return torch.zeros(())
        return torch.zeros((), dtype=reference.dtype, device=reference.device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(h)


def _lesionable(model: nn.Module, index: int) -> nn.Module:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no `blocks` ModuleList to lesion")
    if not isinstance(index, int) or isinstance(index, bool) or not -len(blocks) <= index < len(blocks):
        raise IndexError(f"block index={index!r}: accepted values 0 .. {len(blocks) - 1}")
    block = blocks[index]
    if isinstance(block, HighwayLayer):
        if not isinstance(block.gate, TransformGate):
            raise ValueError(f"block {index} is already lesioned (its gate is {type(block.gate).__name__})")
    elif isinstance(block, (ResidualBlock, PreActBlock, PreActUnit, AugmentedLayer)):
        if isinstance(block.gate, ClosedGate):
            raise ValueError(f"block {index} is already lesioned")
    else:
        raise ValueError(f"block {index} is a {type(block).__name__}; only highway layers, residual blocks "
                         f"(gated or not, dense or convolutional) and augmented layers have a shortcut to fall "
                         f"back on when lesioned")
    return block


@contextlib.contextmanager
def lesion(model: nn.Module, index: int) -> Iterator[nn.Module]:
    """Within the `with` block, block `index` of `model` copies its input (see the module docstring).

    Highway layer: T(x) = 0, so y = H(x)·0 + x·1 = x exactly (highway paper §4.2: "manually setting
    all the transform gates of a layer to 0 forcing it to simply copy its inputs"). Gated residual
    block: g(k) = 0, so u = 0·f_r(x) + shortcut(x), which is x for the identity shortcut of every
    fully connected block (a CIFAR stage's first block keeps its projection). Yields the model. On
    exit, also after an exception, the original gate module is put back; outputs before and after
    are bit-identical because lesioning writes no tensor of the model. (Forward passes made inside
    the `with` block in training mode update BatchNorm running statistics, as any forward pass
    would: evaluate in eval mode.)
    """
    block = _lesionable(model, index)
    original = block.gate
    block.gate = ClosedGate(cast(nn.Module, original))
    try:
        yield model
    finally:
        block.gate = original


def layers_per_block(model: nn.Module) -> int:
    """How many of the paper's layers d one block holds: `model.config["depth"]` / len(blocks)
    (2 for the residual MLPs, whose blocks hold two Dot-BN-ReLU layers; 1 for plain, augmented and
    highway MLPs)."""
    config = getattr(model, "config", None)
    blocks = getattr(model, "blocks", None)
    if not isinstance(config, dict) or "depth" not in config:
        raise ValueError("this model carries no model.config with a 'depth'; build it with create_model")
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        raise ValueError("this model has no blocks")
    depth = int(config["depth"])
    if depth % len(blocks):
        raise ValueError(f"config depth {depth} is not a multiple of the {len(blocks)} blocks; cannot prune")
    return depth // len(blocks)


def check_prunable(model: nn.Module) -> str:
    """The registry name of `model` when `prune` can remove its blocks; otherwise a ValueError that
    names the model and the supported ones (PRUNABLE_MODELS)."""
    config = getattr(model, "config", None)
    name = config.get("name") if isinstance(config, dict) else None
    if name is None:
        raise ValueError("prune needs a model built by create_model (it carries model.config with its name)")
    if name not in PRUNABLE_MODELS:
        raise ValueError(f"model {name!r} cannot be pruned: physical removal is supported for "
                         f"{list(PRUNABLE_MODELS)}, whose blocks all keep the width and whose depth rebuilds "
                         f"any number of them (a CIFAR ResNet's stages change shape and must stay equal)")
    return name


def prune(model: nn.Module, blocks: Sequence[int]) -> nn.Module:
    """A new model of the same family without the blocks whose indices are in `blocks`.

    Supported for the registry names in PRUNABLE_MODELS (mlp_gated_residual, mlp_residual,
    mlp_augmented, mlp_highway, mlp_plain); other models raise a ValueError naming them.

    The result is built by `create_model(name, **config)` with `depth` reduced by
    `layers_per_block(model)` per removed block, and receives the original's weights and buffers
    (the kept blocks renumbered in their original order; stem and head unchanged), its device, dtype
    and train/eval mode. `model.config` of the result is an ordinary config, so `save_model` /
    `load_model` round-trip it as a normal checkpoint; the original model is not modified.

    With removed blocks that were exact identities (k ≤ 0 with g = ReLU), the output equals the
    original's (gated-residual-v2 §2.2: such layers "can be removed without affecting performance").
    """
    check_prunable(model)
    # A meta-device model has shapes but no weights to carry over; without this the failed copy read as
    # "blocks are not interchangeable" (issue 25, finding 16).
    if any(t.is_meta for t in model.state_dict().values()):
        raise ValueError(f"model {cast(dict, model.config).get('name')!r} is on the meta device (it has shapes but no "
                         f"weights); prune needs a model with its weights, e.g. from load_model")
    config = dict(cast(dict, model.config))
    per_block = layers_per_block(model)
    count = len(cast(nn.ModuleList, model.blocks))
    removed = set()
    for index in blocks:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
            raise IndexError(f"block index={index!r} to remove: accepted values 0 .. {count - 1}")
        if index in removed:
            raise ValueError(f"block {index} is listed twice in the blocks to remove")
        removed.add(index)
    kept = [i for i in range(count) if i not in removed]
    new_index = {old: new for new, old in enumerate(kept)}

    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("blocks."):
            _, old, rest = key.split(".", 2)
            if int(old) not in new_index:
                continue
            key = f"blocks.{new_index[int(old)]}.{rest}"
        state[key] = value
    name = config.pop("name")
    config["depth"] = len(kept) * per_block
    reference = next(model.parameters())
    pruned = create_model(name, **config)
    try:
        pruned.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"model {name!r}: its blocks are not interchangeable, so a model rebuilt with depth "
                         f"{config['depth']} does not match the kept blocks ({exc})") from exc
    pruned.to(device=reference.device, dtype=reference.dtype)
    pruned.train(model.training)
    return pruned


def removal_order(model: nn.Module, strategy: str, generator: torch.Generator | None = None) -> list[int]:
    """The order in which blocks are removed: "greedy" = ascending k, ties by block index
    (gated-residual-v2 §3.1: "blocks with the smallest k are removed first"); "random" = a random
    permutation drawn from `generator`. Greedy needs scalar gates (ValueError otherwise)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; accepted values: {list(STRATEGIES)}")
    count = len(cast(nn.ModuleList, model.blocks))
    if strategy == "greedy":
        ks = [float(g.k.detach().cpu()) for g in block_scalar_gates(model)]
        return sorted(range(count), key=lambda i: (ks[i], i))
    return torch.randperm(count, generator=generator).tolist()


def removal_curve(model: nn.Module, order: Sequence[int], metric: Callable[[nn.Module], float],
                  max_removed: int | None = None) -> list[float]:
    """`metric` of the model with the first r blocks of `order` physically removed (via `prune`),
    for r = 0, 1, ..., max_removed (default: all blocks). Element r is the value after r removals."""
    count = len(cast(nn.ModuleList, model.blocks))
    limit = count if max_removed is None else min(max_removed, count)
    values = []
    for removed in range(limit + 1):
        values.append(float(metric(prune(model, list(order[:removed])) if removed else model)))
    return values
