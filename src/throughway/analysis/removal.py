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
from typing import Any, Callable, Iterator, Sequence, cast

import torch
from torch import nn

from ..layers import ScalarGate, TransformGate
from ..models import create_model
from ..layers.adapters import BranchRef, block_spec
from .blocks import (no_blocks_error, block_kind, find_blocks, find_branches, gate_magnitude, gate_value,
                     identity_shortcut, resolve_blocks, resolve_branches)

__all__ = ["ClosedGate", "lesion", "prune", "check_prunable", "layers_per_block", "removal_order", "removal_curve",
           "removable_blocks", "unremovable_blocks", "STRATEGIES", "PRUNABLE_MODELS"]

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
        self.used = False  # set by forward() and value(): lesion checks that the block really read its gate

    def value(self) -> torch.Tensor:
        """g = 0: the closed gate's value, as a 0-d tensor."""
        self.used = True
        reference = next(iter(cast(nn.Module, self.closed).parameters()), None)
        if reference is None:
            return torch.zeros(())
        return torch.zeros((), dtype=reference.dtype, device=reference.device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.used = True
        return torch.zeros_like(h)


def _check_lesionable(model: nn.Module, ref: BranchRef) -> nn.Module:
    block = model.get_submodule(ref.block)
    kind = block_kind(block)
    if kind == "plain":
        raise ValueError(f"block {ref.name!r} is a {type(block).__name__} without a shortcut; only highway layers, "
                         f"residual blocks (gated or not, dense or convolutional), augmented layers and registered "
                         f"residual blocks have a shortcut to fall back on when lesioned")
    if ref.end is None:
        if isinstance(block.gate, ClosedGate) or (kind == "highway" and not isinstance(block.gate, TransformGate)):
            raise ValueError(f"block {ref.name!r} is already lesioned (its gate is {type(block.gate).__name__})")
    return block


def _zero_output(_module: nn.Module, _args: tuple, out: Any) -> Any:
    # A forward hook that returns a value replaces the module's output: the branch contributes 0.
    if isinstance(out, tuple):
        return (torch.zeros_like(out[0]), *out[1:])
    return torch.zeros_like(out)


class _Closed:
    """What lesion put in place for one branch, and whether the last forward pass used it."""

    def __init__(self, ref: BranchRef) -> None:
        self.ref = ref
        self.gate: ClosedGate | None = None
        self.called = False

    def used(self) -> bool:
        return self.gate.used if self.gate is not None else self.called

    def reset(self) -> None:
        self.called = False
        if self.gate is not None:
            self.gate.used = False


@contextlib.contextmanager
def lesion(model: nn.Module, block: int | str) -> Iterator[nn.Module]:
    """Within the `with` block, one residual branch of `model` (or every branch of one block)
    contributes nothing, so its block copies its input (see the module docstring).

    `block`: a branch's name ("encoder.layers.3.ff"), a block's qualified name ("blocks.3"; every
    branch of it) or a position in `find_branches(model)` from 0 (negative from the end); for the
    toolkit's models these are the blocks of `find_blocks`. Highway layer: T(x) = 0, so
    y = H(x)·0 + x·1 = x exactly (highway paper §4.2: "manually setting all the transform gates of
    a layer to 0 forcing it to simply copy its inputs"). Gated residual block, scalar or vector gate:
    g = 0, so u = 0·f_r(x) + shortcut(x), which is x for an identity shortcut (a CIFAR stage's first
    block keeps its projection). A registered block (a transformer layer, a torchvision or timm
    block): the module that ends the branch outputs zeros, through a forward hook (a post-norm layer
    such as BERT's then gives LayerNorm(x), not x). Yields the model. On exit, also after an
    exception, the original gate module is put back and the hooks removed; outputs before and after
    are bit-identical because lesioning writes no tensor of the model. (Forward passes made inside
    the `with` block in training mode update BatchNorm running statistics, as any forward pass
    would: evaluate in eval mode.)

    A lesion never passes silently: every forward pass of `model` inside the `with` block checks
    that each closed branch was actually used, and raises RuntimeError naming the branch when it was
    not (a block whose forward never calls the `gate` attribute it carries, or a fused inference
    path that skips the branch's modules), since the output would then be unchanged. IndexError /
    ValueError naming the block when it does not exist, has no shortcut (a plain layer) or is
    already lesioned.
    """
    refs = resolve_branches(model, block)
    closed = [_Closed(ref) for ref in refs]
    for item in closed:
        _check_lesionable(model, item.ref)
    handles: list[Any] = []
    swapped: list[tuple[nn.Module, nn.Module]] = []

    def called(item: _Closed) -> Callable[[nn.Module, tuple, Any], Any]:
        def hook(module: nn.Module, args: tuple, out: Any) -> Any:
            item.called = True
            return _zero_output(module, args, out)
        return hook

    def before(_module: nn.Module, _args: tuple) -> None:
        for item in closed:
            item.reset()

    def after(_module: nn.Module, _args: tuple, _out: Any) -> None:
        unused = [item.ref.name for item in closed if not item.used()]
        if unused:
            raise RuntimeError(f"lesion of {unused[0]!r} changed nothing: the forward pass never used the branch's "
                               f"{'gate attribute' if closed[0].ref.end is None else 'last module'}, so the output "
                               f"equals the intact model's. Register the block type with register_block (naming the "
                               f"module that ends the branch) instead of giving it branch/shortcut/gate attributes "
                               f"its forward does not call")

    try:
        for item in closed:
            host = model.get_submodule(item.ref.block)
            if item.ref.end is None:
                original = cast(nn.Module, host.gate)
                item.gate = ClosedGate(original)
                host.gate = item.gate
                swapped.append((host, original))
            else:
                spec = block_spec(host)
                if spec is not None and spec.prepare is not None:
                    spec.prepare(host)
                handles.append(model.get_submodule(item.ref.end).register_forward_hook(called(item)))
        handles.append(model.register_forward_pre_hook(before))
        handles.append(model.register_forward_hook(after))
        yield model
    finally:
        for handle in handles:
            handle.remove()
        for host, original in swapped:
            host.gate = original


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
    unsure = [name for name in names if not identity_shortcut(blocks[name])]
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


def unremovable_blocks(model: nn.Module) -> dict[str, str]:
    """The blocks whose removal would not keep the shapes, keyed by qualified name, each with the
    reason: a projection or padding shortcut (a stride-2 or widening block: torchvision's and timm's
    `downsample`, ConvNeXt's `shortcut`, the toolkit's ZeroPadShortcut) changes the feature map;
    a plain layer has no shortcut, so only `prune(..., example_input=...)` can tell. Empty for the
    registry's prunable MLPs (PRUNABLE_MODELS), whose blocks all keep the width."""
    blocks = find_blocks(model)
    if not blocks:
        raise no_blocks_error(model)
    if _registry_name(model) is not None:
        return {}
    reasons = {}
    for name, block in blocks.items():
        if block_kind(block) == "plain":
            reasons[name] = (f"{type(block).__name__} has no shortcut; whether its output keeps its input's shape is "
                             f"checked by prune(..., example_input=...)")
        elif not identity_shortcut(block):
            spec = block_spec(block)
            where = spec.shortcut if spec is not None and spec.shortcut else "shortcut"
            reasons[name] = (f"its {where} is a {type(getattr(block, where, None)).__name__}, not the identity: the "
                             f"block changes the feature map's shape (a stride-2 or projection block)")
    return reasons


def removable_blocks(model: nn.Module) -> list[str]:
    """The qualified names of the blocks that can be removed with the shapes kept, in block order:
    every block with an identity shortcut (all blocks of the registry's prunable MLPs, the
    non-projection blocks of a CIFAR or torchvision ResNet, every layer of a transformer).
    `unremovable_blocks` says why each other block is not. The orders of `removal_order` are drawn
    from these."""
    excluded = unremovable_blocks(model)
    return [name for name in find_blocks(model) if name not in excluded]


def _block_key(model: nn.Module, name: str, refs: list[BranchRef]) -> tuple[float, float]:
    # A block's size is its largest branch gate |g| (ours: a transformer layer stays while either of
    # its branches is open); among equal sizes (closed ReLU gates: g = 0) the smaller k first, as the
    # paper orders by k.
    if not refs or any(ref.gate is None for ref in refs):
        ungated = next((ref.name for ref in refs if ref.gate is None), name)
        raise ValueError(f"block {ungated!r} has no gate with a value; the greedy order needs a gated branch in every "
                         f"removable block (throughway.add_gates puts one in)")
    sizes = []
    for ref in refs:
        value = gate_value(ref.gate)
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"the gate of {ref.name!r} is {value.flatten()[:4].tolist()} (not finite): the greedy "
                             f"order cannot rank it; the model diverged")
        sizes.append(gate_magnitude(ref.gate))
    ks = [float(ref.gate.k.detach().cpu()) for ref in refs if isinstance(ref.gate, ScalarGate)]
    return max(sizes), (max(ks) if len(ks) == len(refs) else 0.0)


def removal_order(model: nn.Module, strategy: str, generator: torch.Generator | None = None) -> list[int]:
    """The order in which blocks are removed, as positions in `find_blocks(model)` from 0, drawn from
    `removable_blocks(model)` (a projection block is never in it): "greedy" = ascending |g| (|g(k)| of
    a scalar gate, the mean |λ| of a vector gate; for a block with several branches, such as a
    transformer layer, its largest branch |g|, our choice), ties by k for scalar gates, then by
    position (gated-residual-v2 §3.1: "blocks with the smallest k are removed first"; for ReLU
    gates, where every k ≤ 0 gives g = 0, this is ascending k); "random" = a random permutation of
    the removable blocks drawn from `generator`. Greedy needs a finite gate in every removable
    block (ValueError naming the first branch without one, or with a NaN gate)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; accepted values: {list(STRATEGIES)}")
    positions = {name: i for i, name in enumerate(find_blocks(model))}
    removable = [positions[name] for name in removable_blocks(model)]
    if strategy == "greedy":
        branches = list(find_branches(model).values())
        names = list(positions)
        keys = {i: _block_key(model, names[i], [r for r in branches if r.block == names[i]]) for i in removable}
        return sorted(removable, key=lambda i: (*keys[i], i))
    return [removable[i] for i in torch.randperm(len(removable), generator=generator).tolist()]


def _metric_value(metric: Callable[[nn.Module], float], model: nn.Module) -> float:
    value = metric(model)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"metric returned a tensor of shape {tuple(value.shape)}; removal_curve needs one number "
                            f"per model (a float or a one-element tensor), e.g. the test accuracy")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"metric returned {type(value).__name__} {value!r:.60}; removal_curve needs one number per "
                        f"model (a float or a one-element tensor)")
    return float(value)


def removal_curve(model: nn.Module, order: Sequence[int | str], metric: Callable[[nn.Module], float],
                  max_removed: int | None = None, example_input: torch.Tensor | None = None) -> list[float]:
    """`metric` of the model with the first r blocks of `order` physically removed (via `prune`,
    `example_input` passed on), for r = 0, 1, ..., max_removed (default: all of `order`). Element r
    is the value after r removals. The whole order is checked (names, duplicates, shapes,
    max_removed ≥ 0) before the first metric is computed; TypeError naming `metric` when it returns
    anything but one number."""
    if not callable(metric):
        raise TypeError(f"metric={metric!r}: expected a callable model -> number")
    if max_removed is not None and (isinstance(max_removed, bool) or not isinstance(max_removed, int)
                                    or max_removed < 0):
        raise ValueError(f"max_removed={max_removed!r}: expected None (all of the order) or an integer >= 0")
    names = resolve_blocks(model, order)
    registry_name = _registry_name(model)
    if registry_name is None:
        _check_shapes(model, names, example_input)
    limit = len(names) if max_removed is None else min(max_removed, len(names))
    values = []
    for removed in range(limit + 1):
        values.append(_metric_value(metric, _prune_checked(model, names[:removed], registry_name) if removed else model))
    return values
