"""Lesioning one block and physically removing blocks, on any model (the registry's or a user's own).

Blocks are found wherever they sit (`analysis.blocks.find_blocks`) and named by their
qualified name or by their position from 0 (see analysis.blocks). Each call finds them once
(`analysis.blocks.ModelBlocks`) and passes what it found down: a 10-step `removal_curve` walks the
module tree once, not once per question.

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

from ..layers.blocks import BranchRef, ClosedGate, close_branches
from ..models import create_model
from .blocks import PRUNABLE_MODELS, ModelBlocks, block_kind, identity_shortcut

__all__ = ["ClosedGate", "lesion", "prune", "check_prunable", "layers_per_block", "removal_order", "removal_curve",
           "removable_blocks", "unremovable_blocks", "one_number", "STRATEGIES", "PRUNABLE_MODELS"]

STRATEGIES = ("greedy", "random")
# PRUNABLE_MODELS (the registry models `prune` rebuilds by config) is declared beside `ModelBlocks.registry_name`,
# which reads it, in analysis/blocks.py, and importable from here as before.


def _check_lesionable(model: nn.Module, ref: BranchRef) -> None:
    block = model.get_submodule(ref.block)
    if block_kind(block) == "plain":
        raise ValueError(f"block {ref.name!r} is a {type(block).__name__} without a shortcut; only highway layers, "
                         f"residual blocks (gated or not, dense or convolutional), augmented layers and registered "
                         f"residual blocks have a shortcut to fall back on when lesioned")
    if ref.spec.close == "gate":
        slot = model.get_submodule(ref.block).get_submodule(ref.spec.gates[ref.key])
        if isinstance(slot, ClosedGate):
            raise ValueError(f"block {ref.name!r} is already lesioned (its gate is a ClosedGate)")


@contextlib.contextmanager
def lesion(model: nn.Module, block: int | str) -> Iterator[nn.Module]:
    """Within the `with` block, one residual branch of `model` (or every branch of one block)
    contributes nothing, so its block copies its input (see the module docstring).

    `block`: a branch's name ("encoder.layers.3.ff"), a block's qualified name ("blocks.3"; every
    branch of it) or a position in `find_branches(model)` from 0 (negative from the end); for the
    toolkit's models these are the blocks of `find_blocks`. Each branch is closed as its block's spec
    says (`layers.blocks.close_branches`). Highway layer: T(x) = 0, so y = H(x)·0 + x·1 = x exactly
    (highway paper §4.2: "manually setting all the transform gates of a layer to 0 forcing it to simply
    copy its inputs"). Gated residual block, scalar or vector gate: g = 0, so u = 0·f_r(x) +
    shortcut(x), which is x for an identity shortcut (a CIFAR stage's first block keeps its
    projection). A registered block of another library (a transformer layer, a torchvision or timm
    block): the module that ends the branch outputs zeros (a post-norm layer such as BERT's then gives
    LayerNorm(x), not x). Yields the model. The closing swaps modules, so a model that torch.compile
    compiled before the lesion sees it too (dynamo guards the module tree). On exit, also after an
    exception, the original modules are put back; outputs before and after are bit-identical because
    lesioning writes no tensor of the model. (Forward passes made inside the `with` block in training
    mode update BatchNorm running statistics, as any forward pass would: evaluate in eval mode.)

    A lesion never passes silently: every forward pass of `model` inside the `with` block checks that
    each closed branch was actually used, and raises RuntimeError naming the branch when it was not (a
    block whose forward never calls the `gate` attribute it carries, or a fused inference path that
    skips the branch's modules), since the output would then be unchanged. IndexError / ValueError
    naming the block when it does not exist, has no shortcut (a plain layer) or is already lesioned.
    """
    refs = ModelBlocks(model).resolve_branches(block)
    for ref in refs:
        _check_lesionable(model, ref)
    with close_branches(model, [ref.name for ref in refs]) as standins:
        def before(_module: nn.Module, _args: tuple) -> None:
            for standin in standins:
                object.__setattr__(standin, "used", False)

        def after(_module: nn.Module, _args: tuple, _out: Any) -> None:
            unused = [ref.name for ref, standin in zip(refs, standins) if not standin.used]
            if unused:
                what = "gate attribute" if refs[0].spec.close == "gate" else "last module"
                raise RuntimeError(f"lesion of {unused[0]!r} changed nothing: the forward pass never used the "
                                   f"branch's {what}, so the output equals the intact model's. Register the block "
                                   f"type with register_block (naming the module that ends the branch) instead of "
                                   f"giving it branch/shortcut/gate attributes its forward does not call")

        handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
        try:
            yield model
        finally:
            for handle in handles:
                handle.remove()


def layers_per_block(model: nn.Module) -> int:
    """How many of the paper's layers d one block of a registry model holds: `model.config["depth"]`
    / number of blocks (2 for the residual MLPs, whose blocks hold two Dot-BN-ReLU layers; 1 for
    plain, augmented and highway MLPs)."""
    return _layers_per_block(ModelBlocks(model))


def _layers_per_block(found: ModelBlocks) -> int:
    config, blocks = getattr(found.model, "config", None), found.blocks
    if not isinstance(config, dict) or "depth" not in config:
        raise ValueError("this model carries no model.config with a 'depth'; build it with create_model")
    if not blocks:
        raise ValueError("this model has no blocks")
    depth = int(config["depth"])
    if depth % len(blocks):
        raise ValueError(f"config depth {depth} is not a multiple of the {len(blocks)} blocks; cannot prune")
    return depth // len(blocks)


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
    if ModelBlocks(model).registry_name() is None:
        raise ValueError(f"model {name!r} cannot be pruned in every order: removal in any order is supported for "
                         f"{list(PRUNABLE_MODELS)}, whose blocks all keep the width and whose depth rebuilds "
                         f"any number of them (a CIFAR ResNet's stage-opening blocks change the shape)")
    return cast(str, name)


def _check_shapes(found: ModelBlocks, names: Sequence[str], example_input: torch.Tensor | None) -> None:
    """ValueError naming the first block of `names` whose output may not have its input's shape."""
    model, blocks = found.model, found.blocks
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
    _update_library_config(model, pruned, names)
    return pruned


# Per-layer lists of a Hugging Face config, one entry per decoder layer (Qwen2/3, Gemma 2/3, Mistral's
# sliding-window layouts in transformers 5): the removed layers' entries go with them.
_PER_LAYER_CONFIG_LISTS = ("layer_types",)


def _update_library_config(model: nn.Module, pruned: nn.Module, names: Sequence[str]) -> None:
    """A Hugging Face model keeps describing itself after its layers are removed: the config's layer
    count (num_hidden_layers, which GPT-2 maps to n_layer), its per-layer lists, and each kept layer's
    `layer_idx` (what the attention cache is indexed by), so that save_pretrained / from_pretrained
    rebuild the pruned model. Only the stack that holds num_hidden_layers layers is counted."""
    config = getattr(pruned, "config", None)
    if config is None or not callable(getattr(config, "to_dict", None)):
        return
    count = getattr(config, "num_hidden_layers", None)
    if not isinstance(count, int):
        return
    removed_by_parent: dict[str, set[str]] = {}
    for name in names:
        parent_name, _, key = name.rpartition(".")
        removed_by_parent.setdefault(parent_name, set()).add(key)
    stacks = [(parent_name, keys) for parent_name, keys in removed_by_parent.items()
              if isinstance(model.get_submodule(parent_name), nn.ModuleList)
              and len(cast(nn.ModuleList, model.get_submodule(parent_name))) == count]
    if len(stacks) != 1 or len(stacks) != len(removed_by_parent):
        raise ValueError(f"prune: cannot tell which of the removed blocks {list(names)[:4]} count in the config's "
                         f"num_hidden_layers={count}: the blocks must all come from the one layer list of that length")
    parent_name, keys = stacks[0]
    kept = [i for i in range(count) if str(i) not in keys]
    config.num_hidden_layers = len(kept)
    for attribute in _PER_LAYER_CONFIG_LISTS:
        values = getattr(config, attribute, None)
        if isinstance(values, (list, tuple)) and len(values) == count:
            setattr(config, attribute, type(values)(values[i] for i in kept))
    for new, layer in enumerate(cast(nn.ModuleList, pruned.get_submodule(parent_name))):
        old = kept[new]
        for module in layer.modules():
            if getattr(module, "layer_idx", None) == old:
                object.__setattr__(module, "layer_idx", new)


def _prune_by_config(model: nn.Module, name: str, names: Sequence[str], per_block: int) -> nn.Module:
    config = dict(cast(dict, model.config))
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
    # "blocks are not interchangeable".
    if any(t.is_meta for t in model.state_dict().values()):
        config = getattr(model, "config", None)
        name = config.get("name") if isinstance(config, dict) else type(config).__name__ if config is not None else None
        raise ValueError(f"model {type(model).__name__} ({name!r}) is on the meta device (it has shapes but no "
                         f"weights); prune needs a model with its weights, e.g. from load_model")
    found = ModelBlocks(model)
    names = found.resolve_all(blocks)
    registry_name = found.registry_name()
    if registry_name is None:
        _check_shapes(found, names, example_input)
    return _prune_checked(found, names, registry_name)


def _prune_checked(found: ModelBlocks, names: Sequence[str], registry_name: str | None) -> nn.Module:
    if registry_name is not None:
        return _prune_by_config(found.model, registry_name, names, _layers_per_block(found))
    return _remove_from_copy(found.model, names)


def unremovable_blocks(model: nn.Module, example_input: Any = None) -> dict[str, str]:
    """The blocks whose removal would not keep the function's shapes or its shortcut, keyed by
    qualified name, each with the reason: a projection or padding shortcut (a stride-2 or widening
    block: torchvision's and timm's `downsample`, ConvNeXt's `shortcut`, the toolkit's
    ZeroPadShortcut) changes the feature map; a plain layer, or a block whose shortcut this instance
    does not have (timm's InvertedResidual without `has_skip`), has no shortcut, so only
    `prune(..., example_input=...)` can tell. Empty for the registry's prunable MLPs
    (PRUNABLE_MODELS), whose blocks all keep the width. With `example_input` every block's spec is
    checked on it first (`layers.blocks.check_blocks`: ValueError naming the block and branch that
    fail)."""
    return ModelBlocks(model).unremovable(example_input)


def removable_blocks(model: nn.Module, example_input: Any = None) -> list[str]:
    """The qualified names of the blocks that can be removed with the shapes kept, in block order:
    every block with an identity shortcut (all blocks of the registry's prunable MLPs, the
    non-projection blocks of a CIFAR or torchvision ResNet, every layer of a transformer).
    `unremovable_blocks` says why each other block is not (and checks the specs on `example_input`
    when given). The orders of `removal_order` are drawn from these."""
    return ModelBlocks(model).removable(example_input)


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
    found = ModelBlocks(model)
    positions = {name: i for i, name in enumerate(found.blocks)}
    names = found.removable()
    if strategy == "greedy":
        keys = {positions[name]: found.gate_size(name) for name in names}
        return sorted(keys, key=lambda i: (*keys[i], i))
    removable = [positions[name] for name in names]
    return [removable[i] for i in torch.randperm(len(removable), generator=generator).tolist()]


def one_number(value: Any, what: str, wanted: str) -> float:
    """`value`, what a caller's function returned (a metric, a loss_fn), as a float when it is one number: a
    float, an int or a one-element tensor. TypeError "`what` returned ...; `wanted`" otherwise (`wanted`
    says what the caller needs)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{what} returned a tensor of shape {tuple(value.shape)}; {wanted}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} returned {type(value).__name__} {value!r:.60}; {wanted}")
    return float(value)


_ONE_NUMBER_PER_MODEL = ("removal_curve needs one number per model (a float or a one-element tensor), e.g. the test "
                         "accuracy")


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
    found = ModelBlocks(model)
    names = found.resolve_all(order)
    registry_name = found.registry_name()
    if registry_name is None:
        _check_shapes(found, names, example_input)
    limit = len(names) if max_removed is None else min(max_removed, len(names))
    values = []
    for removed in range(limit + 1):
        pruned = _prune_checked(found, names[:removed], registry_name) if removed else model
        values.append(one_number(metric(pruned), "metric", _ONE_NUMBER_PER_MODEL))
    return values
