"""Lesioning one block and physically removing blocks, on any model (the registry's or a user's own).

Blocks are found by type wherever they sit (`analysis.blocks.find_blocks`) and named by their
qualified name or by their position from 0 (see analysis.blocks).

* `lesion(model, block)` (highway paper section 4.2, figure 4): a context manager that closes the
  gate of one block, so the block copies its input: all transform gates of a highway layer set
  to T = 0 (y = x); a gated residual block's g set to 0 (u = shortcut(x), the effect of k = 0
  with g = ReLU); an augmented layer's g(k) set to 0; an ungated residual block's branch dropped.
  It swaps the block's `gate` module for a closed one and puts the original module object back on
  exit, so no parameter or buffer is ever written and the model is restored bit for bit.
* `prune(model, blocks)` (gated-residual-v2 section 3.1, figure 5 right): a new, physically smaller
  model without the given blocks. A registry model whose blocks are interchangeable
  (PRUNABLE_MODELS) is rebuilt by `create_model` from an updated `model.config`, so it saves and
  loads like any other; any other model is copied and the blocks are taken out of their
  nn.Sequential / nn.ModuleList (an `nn.Identity` takes the place of a block held otherwise). A
  block can be removed when its output has its input's shape: an identity shortcut guarantees it,
  otherwise a forward pass on `example_input` checks it; a ValueError names the block that fails.
* `removal_order` and `removal_curve`: greedy (smallest |g| first) and random orders, and the
  metric after each removal.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Callable, Iterator, Sequence, cast

import torch
from torch import nn

from ..layers import ScalarGate, TransformGate
from ..models import create_model
from .blocks import block_kind, find_blocks, gate_magnitude, resolve_block, resolve_blocks
from .gates import block_gates

__all__ = ["ClosedGate", "lesion", "prune", "check_prunable", "layers_per_block", "removal_order", "removal_curve",
           "STRATEGIES", "PRUNABLE_MODELS"]

STRATEGIES = ("greedy", "random")
# Registry names whose blocks are interchangeable (every block maps width to width) and whose
# config rebuilds any number of them through `depth`: `prune` keeps them registry models.
PRUNABLE_MODELS = ("mlp_gated_residual", "mlp_residual", "mlp_augmented", "mlp_highway", "mlp_plain", "mlp_rezero",
                   "mlp_layerscale")


class ClosedGate(nn.Module):
    """A gate that is shut: `forward` returns zeros shaped like its input (T(x) = 0 for a transform
    gate, g·h = 0 for a scalar or vector gate) and `value()` returns g = 0 as a 0-d tensor (what
    `AugmentedLayer` reads; it broadcasts wherever a vector g would).

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


def _lesionable(model: nn.Module, block: int | str) -> nn.Module:
    name, module = resolve_block(model, block, negative=True)
    kind = block_kind(module)
    if kind == "plain":
        raise ValueError(f"block {name!r} is a {type(module).__name__} without a shortcut; only highway layers, "
                         f"residual blocks (gated or not, dense or convolutional) and augmented layers have a "
                         f"shortcut to fall back on when lesioned")
    if isinstance(module.gate, ClosedGate) or (kind == "highway" and not isinstance(module.gate, TransformGate)):
        raise ValueError(f"block {name!r} is already lesioned (its gate is {type(module.gate).__name__})")
    return module


@contextlib.contextmanager
def lesion(model: nn.Module, block: int | str) -> Iterator[nn.Module]:
    """Within the `with` block, one block of `model` copies its input (see the module docstring).

    `block`: the block's qualified name ("blocks.3") or its position in `find_blocks(model)`, from 0
    (negative from the end). Highway layer: T(x) = 0, so y = H(x)·0 + x·1 = x exactly (highway paper
    §4.2: "manually setting all the transform gates of a layer to 0 forcing it to simply copy its
    inputs"). Gated residual block, scalar or vector gate: g = 0, so u = 0·f_r(x) + shortcut(x), which
    is x for an identity shortcut (a CIFAR stage's first block keeps its projection). Yields the
    model. On exit, also after an exception, the original gate module is put back; outputs before
    and after are bit-identical because lesioning writes no tensor of the model. (Forward passes
    made inside the `with` block in training mode update BatchNorm running statistics, as any
    forward pass would: evaluate in eval mode.) IndexError / ValueError naming the block when it
    does not exist, has no shortcut (a plain layer) or is already lesioned.
    """
    module = _lesionable(model, block)
    original = module.gate
    module.gate = ClosedGate(cast(nn.Module, original))
    try:
        yield model
    finally:
        module.gate = original


def layers_per_block(model: nn.Module) -> int:
    """How many of the paper's layers d one block of a registry model holds: `model.config["depth"]`
    / number of blocks (2 for the residual MLPs, whose blocks hold two Dot-BN-ReLU layers; 1 for
    plain, augmented and highway MLPs)."""
    config = getattr(model, "config", None)
    blocks = find_blocks(model)
    if not isinstance(config, dict) or "depth" not in config:
        raise ValueError("this model carries no model.config with a 'depth'; build it with create_model")
    if not blocks:
        raise ValueError("this model has no blocks")
    depth = int(config["depth"])
    if depth % len(blocks):
        raise ValueError(f"config depth {depth} is not a multiple of the {len(blocks)} blocks; cannot prune")
    return depth // len(blocks)


def _registry_name(model: nn.Module) -> str | None:
    """The registry name when `prune` rebuilds `model` from its config: a model of PRUNABLE_MODELS
    whose blocks are exactly `model.blocks`."""
    config = getattr(model, "config", None)
    name = config.get("name") if isinstance(config, dict) else None
    blocks = getattr(model, "blocks", None)
    if name not in PRUNABLE_MODELS or not isinstance(blocks, nn.ModuleList):
        return None
    return cast(str, name) if list(find_blocks(model)) == [f"blocks.{i}" for i in range(len(blocks))] else None


def check_prunable(model: nn.Module) -> str:
    """The registry name of `model` when `prune` rebuilds it by config (PRUNABLE_MODELS: every block
    keeps the width and `depth` rebuilds any number of them), as `throughway analyze prune` needs to
    remove the blocks in any order; otherwise a ValueError that names the model and the supported
    ones. (`prune` itself removes the shape-preserving blocks of any model.)"""
    config = getattr(model, "config", None)
    name = config.get("name") if isinstance(config, dict) else None
    if name is None:
        raise ValueError("this model carries no model.config with its registry name (it was not built by "
                         "create_model)")
    if _registry_name(model) is None:
        raise ValueError(f"model {name!r} cannot be pruned in every order: removal in any order is supported for "
                         f"{list(PRUNABLE_MODELS)}, whose blocks all keep the width and whose depth rebuilds "
                         f"any number of them (a CIFAR ResNet's stage-opening blocks change the shape)")
    return cast(str, name)


def _check_shapes(model: nn.Module, names: Sequence[str], example_input: torch.Tensor | None) -> None:
    """ValueError naming the first block of `names` whose output may not have its input's shape."""
    blocks = find_blocks(model)
    unsure = [name for name in names if not isinstance(getattr(blocks[name], "shortcut", None), nn.Identity)]
    if not unsure:
        return  # u = ... + x: an identity shortcut makes the output x's shape
    if example_input is None:
        name = unsure[0]
        raise ValueError(f"block {name!r} ({type(blocks[name]).__name__}) has no identity shortcut, so its output "
                         f"may not have its input's shape; pass example_input= (a batch the model accepts) to "
                         f"check it by a forward pass")
    shapes: dict[str, tuple[torch.Size, torch.Size]] = {}

    def record(name: str) -> Callable[[nn.Module, tuple, torch.Tensor], None]:
        # A forward hook that returns something replaces the block's output: this one returns None.
        def hook(_module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            shapes.setdefault(name, (args[0].shape, out.shape))
        return hook

    handles = [blocks[name].register_forward_hook(record(name)) for name in unsure]
    was_training = model.training
    model.eval()  # no BatchNorm statistics change
    try:
        with torch.no_grad():
            model(example_input)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    for name in unsure:
        if name not in shapes:
            raise ValueError(f"block {name!r} did not run in the forward pass on example_input; cannot check its shapes")
        before, after = shapes[name]
        if before != after:
            raise ValueError(f"block {name!r} ({type(blocks[name]).__name__}) maps {tuple(before)} to {tuple(after)}; "
                             f"only blocks whose output has their input's shape can be removed")


def _remove_from_copy(model: nn.Module, names: Sequence[str]) -> nn.Module:
    """A deep copy of `model` without the blocks `names`: taken out of an nn.Sequential or
    nn.ModuleList (renumbered when numbered), replaced by nn.Identity anywhere else."""
    if "" in names:
        raise ValueError("the model itself is the block; removing it leaves nothing")
    pruned = copy.deepcopy(model)
    if isinstance(pruned.__dict__.get("config"), dict):
        # The registry config describes the unpruned model; the copy is saved without one (save_model).
        del pruned.__dict__["config"]
    by_parent: dict[str, list[str]] = {}
    for name in names:
        parent_name, _, key = name.rpartition(".")
        by_parent.setdefault(parent_name, []).append(key)
    for parent_name, keys in by_parent.items():
        parent = pruned.get_submodule(parent_name)
        if isinstance(parent, (nn.Sequential, nn.ModuleList)):
            kept = [(k, m) for k, m in parent._modules.items() if k not in keys]
            numbered = all(k.isdigit() for k, _ in parent._modules.items())
            parent._modules.clear()
            for position, (key, module) in enumerate(kept):
                parent._modules[str(position) if numbered else key] = module
        else:
            for key in keys:
                parent._modules[key] = nn.Identity()
    return pruned


def _prune_by_config(model: nn.Module, name: str, names: Sequence[str]) -> nn.Module:
    config = dict(cast(dict, model.config))
    per_block = layers_per_block(model)
    count = len(cast(nn.ModuleList, model.blocks))
    removed = {int(n.split(".")[1]) for n in names}
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
    config.pop("name")
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


def prune(model: nn.Module, blocks: Sequence[int | str], example_input: torch.Tensor | None = None) -> nn.Module:
    """A new, physically smaller model without `blocks`; the original is not modified.

    `blocks`: qualified names ("blocks.3") or positions in `find_blocks(model)` counted from 0, as the
    command line's qualified names and `removal_order` give them. Each must be removable: its output
    has its input's shape (an identity shortcut guarantees it; for other blocks, a plain layer or a
    projection, pass `example_input` and a forward pass in eval mode checks it; the blocks of
    PRUNABLE_MODELS all keep the width). ValueError naming the block otherwise, IndexError for a
    block that does not exist.

    A registry model of PRUNABLE_MODELS is rebuilt by `create_model(name, **config)` with `depth`
    reduced by `layers_per_block(model)` per removed block and receives the original's weights and
    buffers (the kept blocks renumbered in order; stem and head unchanged), device, dtype and
    train/eval mode; its `model.config` is an ordinary config, so `save_model` / `load_model`
    round-trip it. Any other model is deep-copied and the blocks are taken out of their
    nn.Sequential / nn.ModuleList (renumbered) or replaced by nn.Identity where a module holds them
    as attributes; a registry config it carried is dropped (it describes the unpruned model), so
    `load_model(path, model=...)` loads the saved copy into a module of the pruned shape.

    With removed blocks that were exact identities (g exactly 0: k ≤ 0 with g = ReLU), the output
    equals the original's (gated-residual-v2 §2.2: such layers "can be removed without affecting
    performance").
    """
    # A meta-device model has shapes but no weights to carry over; without this the failed copy read as
    # "blocks are not interchangeable" (issue 25, finding 16).
    if any(t.is_meta for t in model.state_dict().values()):
        raise ValueError(f"model {type(model).__name__} ({getattr(model, 'config', {}).get('name')!r}) is on the meta "
                         f"device (it has shapes but no weights); prune needs a model with its weights, e.g. from "
                         f"load_model")
    names = resolve_blocks(model, blocks)
    registry_name = _registry_name(model)
    if registry_name is None:
        _check_shapes(model, names, example_input)
    return _prune_checked(model, names, registry_name)


def _prune_checked(model: nn.Module, names: Sequence[str], registry_name: str | None) -> nn.Module:
    if registry_name is not None:
        return _prune_by_config(model, registry_name, names)
    return _remove_from_copy(model, names)


def _greedy_key(gate: nn.Module) -> tuple[float, float]:
    # Among gates of equal |g| (closed ReLU gates: g = 0), the smaller k first, as the paper orders by k.
    return gate_magnitude(gate), float(gate.k.detach().cpu()) if isinstance(gate, ScalarGate) else 0.0


def removal_order(model: nn.Module, strategy: str, generator: torch.Generator | None = None) -> list[int]:
    """The order in which blocks are removed, as positions in `find_blocks(model)` from 0: "greedy" =
    ascending |g| (|g(k)| of a scalar gate, the mean |λ| of a vector gate), ties by k for scalar
    gates, then by position (gated-residual-v2 §3.1: "blocks with the smallest k are removed first";
    for ReLU gates, where every k ≤ 0 gives g = 0, this is ascending k); "random" = a random
    permutation drawn from `generator`. Greedy needs a gate with a value in every block (ValueError
    naming the first block without one)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; accepted values: {list(STRATEGIES)}")
    if strategy == "greedy":
        keys = [_greedy_key(gate) for gate in block_gates(model).values()]
        return sorted(range(len(keys)), key=lambda i: (*keys[i], i))
    count = len(find_blocks(model))
    return torch.randperm(count, generator=generator).tolist()


def removal_curve(model: nn.Module, order: Sequence[int | str], metric: Callable[[nn.Module], float],
                  max_removed: int | None = None, example_input: torch.Tensor | None = None) -> list[float]:
    """`metric` of the model with the first r blocks of `order` physically removed (via `prune`,
    `example_input` passed on), for r = 0, 1, ..., max_removed (default: all of `order`). Element r
    is the value after r removals. The whole order is checked (names, duplicates, shapes) before the
    first metric is computed."""
    names = resolve_blocks(model, order)
    registry_name = _registry_name(model)
    if registry_name is None:
        _check_shapes(model, names, example_input)
    limit = len(names) if max_removed is None else min(max_removed, len(names))
    values = []
    for removed in range(limit + 1):
        values.append(float(metric(_prune_checked(model, names[:removed], registry_name) if removed else model)))
    return values
