"""Finding the blocks of any model: gated, residual, augmented, highway and plain blocks by type,
anywhere in the module tree, named by their qualified names.

The analyses (gate statistics, lesioning, pruning, removal curves) work on a researcher's own
`nn.Module` as they do on the registry's models: like PEFT's `target_modules` and timm's feature
hooks, they walk `model.named_modules()` and pick out the modules that are blocks, so the blocks may
sit in a `blocks` ModuleList, an `nn.Sequential`, several stages, or plain attributes.

A block is a module whose type is registered (`layers.blocks.register_block`: the toolkit's own
block types are registered like any other library's; torch's and Hugging Face transformer layers,
torchvision's and timm's blocks are built in, `layers.known_blocks`), one a registered rule
recognises, or one that follows the block contract of docs/design.md (attributes `branch`,
`shortcut` and `gate`, with `shortcut` None for a plain layer).
A block has one residual branch or several (a transformer layer's attention and feed-forward
branches); `find_branches` lists them, named "encoder.layers.3.ff". The search does not descend into a block: a block inside another block's branch belongs to
that block. Blocks are reported by their qualified name (`model.get_submodule(name)` returns the
block; for the registry's models, "blocks.3" is `model.blocks[3]`), in module order.

**One walk per call.** An analysis call finds the blocks once (`ModelBlocks`: one walk of the module
tree) and asks every question of that call (which blocks, which can be removed, their gates, the names
given) of it; the next call walks the model again, so a model changed in between is seen as it is.

**Naming a block.** Every function that takes a block accepts either its qualified name (a str)
or its position in `find_blocks(model)` counted from 0, as Python indexes (an int). `lesion` and
the gate statistics work per branch: a branch name, a block name (all its branches) or a position
in `find_branches(model)` (negative from the end); for the toolkit's models, whose blocks have one
branch each, the two orders coincide. The command line prints qualified names.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence, cast

import torch
from torch import nn

from ..layers.blocks import (BranchRef, block_branches, block_spec, check_blocks, find_branches, has_shortcut,
                             identity_shortcut, is_block, iter_blocks, registered_blocks)
from ..layers.gates import ScalarGate

__all__ = ["FAMILIES", "PRUNABLE_MODELS", "ModelBlocks", "find_blocks", "find_branches", "no_blocks_error", "block_kind", "block_gate",
           "gate_value", "gate_magnitude", "resolve_block", "resolve_blocks", "resolve_branches", "identity_shortcut"]

# What `block_kind` and `gates.model_family` answer.
FAMILIES = ("gated", "residual", "augmented", "highway", "plain")
# Registry names whose blocks are interchangeable (every block maps width to width) and whose
# config rebuilds any number of them through `depth`: `analysis.removal.prune` keeps them registry models.
PRUNABLE_MODELS = ("mlp_gated_residual", "mlp_residual", "mlp_augmented", "mlp_highway", "mlp_plain", "mlp_rezero",
                   "mlp_layerscale")


def _layer_stacks(model: nn.Module) -> list[str]:
    """"name (N x Class)" for each ModuleList / Sequential of 2 or more children of one class: what a model
    without registered blocks probably keeps its layers in."""
    stacks = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) >= 2:
            kinds = {type(child) for child in module}
            if len(kinds) == 1:
                cls = next(iter(kinds))
                stacks.append(f"{name or '(the model)'} ({len(module)} x {cls.__module__}.{cls.__qualname__})")
    return stacks


def find_blocks(model: nn.Module, example_input: Any = None) -> dict[str, nn.Module]:
    """Every block of `model`, in module order, keyed by qualified name ("blocks.0", "stages.1.2",
    "encoder.layers.3", ...): every module whose type is registered (the toolkit's own blocks, torch's
    and Hugging Face transformer layers, torchvision's and timm's blocks: `layers.known_blocks`) or
    recognised by a registered rule, and modules following the block contract.

    `model` itself counts as a block when it is one (its name is then ""). With `example_input`, every
    block's spec is checked on it first (`layers.blocks.check_blocks`: ValueError naming the block and
    the branch that fail). A model without any block gets an empty dict and one warning that names
    `register_block` and the module lists that look like layer stacks. ValueError naming both names
    when one block module is reachable under two names (weight sharing)."""
    blocks = dict(iter_blocks(model))
    if not blocks:
        stacks = _layer_stacks(model)
        warnings.warn(f"{type(model).__name__} has no block the toolkit knows (none of "
                      f"{len(registered_blocks())} registered types or rules); register its block type with "
                      f"throughway.register_block (docs/guide.md, 'Your own architecture')"
                      + (f"; layer stacks seen: {', '.join(stacks[:3])}" if stacks else ""), stacklevel=2)
    elif example_input is not None:
        check_blocks(model, example_input)
    return blocks


def no_blocks_error(model: nn.Module) -> ValueError:
    """The error every analysis raises for a model without blocks, naming the model, the module lists that
    look like layer stacks and how to register its block type."""
    stacks = _layer_stacks(model)
    return ValueError(f"{type(model).__name__} has no blocks (no registered block type or rule, and no module with "
                      f"the attributes branch, shortcut and gate): nothing to analyse; register its block type with "
                      f"throughway.layers.register_block (docs/guide.md, 'Your own architecture')"
                      + (f"; layer stacks seen: {', '.join(stacks[:3])}" if stacks else ""))


def block_gate(block: nn.Module) -> Any:
    """The gate of `block` whose `value()` gives g, read from its branches (`find_branches`): a
    `ScalarGate` (0-d g), a vector gate (g of shape (C,), LayerScale's diag(λ)), timm's LayerScale γ,
    a gate `add_gates` inserted; None for an ungated block and for highway layers, whose transform
    gate T(x) depends on x. For a block with several branches: the first branch's gate when every
    branch has one, else None (`find_branches` gives each branch's own)."""
    gates = [ref.gate for ref in block_branches("", block)]
    return gates[0] if gates and all(g is not None for g in gates) else None


def block_kind(block: nn.Module) -> str:
    """The family of one block (one of FAMILIES), from its spec: "highway" and "augmented" (the spec's
    kind), "plain" (no shortcut: `has_shortcut`), "gated" (a residual block whose every branch has a
    gate with a value: u = g·f_r(x) + shortcut(x), scalar or vector g) or "residual" (the same
    ungated). ValueError naming the type for a module that is not a block."""
    spec = block_spec(block)
    if spec is None or not is_block(block):
        raise ValueError(f"a {type(block).__name__} is not a block: register its type with "
                         f"throughway.layers.register_block, or give it the attributes branch, shortcut and gate "
                         f"(docs/design.md)")
    if spec.kind in ("highway", "augmented"):
        return spec.kind
    if not has_shortcut(block):
        return "plain"
    return "gated" if block_gate(block) is not None else "residual"


def gate_value(gate: Any) -> torch.Tensor:
    """g of a gate with a `value()` method (see `block_gate`), detached, on the CPU, in float64: a 0-d
    tensor for a scalar gate, (C,) for a vector gate."""
    value = cast(Callable[[], torch.Tensor], gate.value)
    return value().detach().double().cpu()


def gate_magnitude(gate: Any) -> float:
    """|g| of a gate, the size by which removal orders blocks: |g(k)| for a scalar gate, the mean
    |λ| over channels for a vector gate (ReZero's α may be negative, LayerScale's λ a vector)."""
    return float(gate_value(gate).abs().mean())


def _positions_error(blocks: dict[str, nn.Module], given: object) -> IndexError:
    shown = list(blocks)[:4] + (["..."] if len(blocks) > 4 else [])
    return IndexError(f"block={given!r}: accepted values are positions 0 .. {len(blocks) - 1} (counted from 0 "
                      f"in find_blocks order) or qualified names {shown}")


class ModelBlocks:
    """The blocks of one model, found by one walk of its module tree (`layers.blocks.iter_blocks`, in module
    order, keyed by qualified name), and their branches, read from those blocks without another walk.

    One analysis call makes one and asks every question of it (the names and positions given, which
    blocks can be removed, their gates), so the call walks the tree once. It belongs to that call and
    is never kept beyond it: a model changed afterwards (a block added or removed, a gate inserted) is
    walked afresh by the next call."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.blocks: dict[str, nn.Module] = dict(iter_blocks(model))
        self._branches: dict[str, BranchRef] | None = None

    @property
    def branches(self) -> dict[str, BranchRef]:
        """Every residual branch, as `find_branches` lists them (read from the blocks found, once)."""
        if self._branches is None:
            self._branches = {ref.name: ref for name, block in self.blocks.items()
                              for ref in block_branches(name, block)}
        return self._branches

    def resolve(self, block: int | str, *, negative: bool = False) -> tuple[str, nn.Module]:
        """`resolve_block` on these blocks."""
        blocks = self.blocks
        if not blocks:
            raise no_blocks_error(self.model)
        if isinstance(block, str):
            if block in blocks:
                return block, blocks[block]
            try:
                module = self.model.get_submodule(block)
            except AttributeError:
                raise _positions_error(blocks, block) from None
            raise ValueError(f"module {block!r} ({type(module).__name__}) is not a block; the blocks are {list(blocks)}")
        if isinstance(block, bool) or not isinstance(block, int):
            raise _positions_error(blocks, block)
        low = -len(blocks) if negative else 0
        if not low <= block < len(blocks):
            raise _positions_error(blocks, block)
        name = list(blocks)[block]
        return name, blocks[name]

    def resolve_all(self, blocks: Sequence[int | str]) -> list[str]:
        """`resolve_blocks` on these blocks."""
        if isinstance(blocks, (str, int, torch.Tensor)):
            raise TypeError(f"blocks={blocks!r}: expected a list of positions or qualified names, e.g. [0, 2] or "
                            f"['blocks.0']")
        names: list[str] = []
        for block in blocks:
            name, _ = self.resolve(block)
            if name in names:
                raise ValueError(f"block {name!r} is listed twice in the blocks to remove")
            names.append(name)
        return names

    def resolve_branches(self, which: int | str) -> list[BranchRef]:
        """`resolve_branches` on these blocks' branches."""
        branches = self.branches
        if not branches:
            raise no_blocks_error(self.model)
        if isinstance(which, str):
            if which in branches:
                return [branches[which]]
            of_block = [ref for ref in branches.values() if ref.block == which]
            if of_block:
                return of_block
            try:
                module: nn.Module | None = self.model.get_submodule(which)
            except AttributeError:
                module = None
            if module is not None:
                raise ValueError(f"module {which!r} ({type(module).__name__}) is not a block; the branches are "
                                 f"{list(branches)[:8]}")
            shown = list(branches)[:4] + (["..."] if len(branches) > 4 else [])
            raise IndexError(f"block={which!r} is neither a branch nor a block of this model; accepted values are "
                             f"branch or block names {shown} or positions 0 .. {len(branches) - 1}")
        if isinstance(which, bool) or not isinstance(which, int) or not -len(branches) <= which < len(branches):
            raise IndexError(f"block={which!r}: accepted values are positions 0 .. {len(branches) - 1} (from 0 in "
                             f"find_branches order; {-len(branches)} .. -1 from the end) or branch or block names")
        return [list(branches.values())[which]]

    # Which blocks can be removed and how big their gates are: the questions `analysis.removal` asks of the
    # blocks it found, answered here from that one walk, so a removal reads the blocks in one visit.

    def registry_name(self) -> str | None:
        """The registry name when `prune` rebuilds the model from its config: a model of PRUNABLE_MODELS
        whose blocks are exactly `model.blocks`."""
        config = getattr(self.model, "config", None)
        name = config.get("name") if isinstance(config, dict) else None
        blocks = getattr(self.model, "blocks", None)
        if name not in PRUNABLE_MODELS or not isinstance(blocks, nn.ModuleList):
            return None
        return cast(str, name) if list(self.blocks) == [f"blocks.{i}" for i in range(len(blocks))] else None

    def unremovable(self, example_input: Any = None) -> dict[str, str]:
        """`analysis.removal.unremovable_blocks` on these blocks."""
        blocks = self.blocks
        if not blocks:
            raise no_blocks_error(self.model)
        if example_input is not None:
            check_blocks(self.model, example_input)
        if self.registry_name() is not None:
            return {}
        reasons = {}
        for name, block in blocks.items():
            if block_kind(block) == "plain":
                reasons[name] = (f"{type(block).__name__} has no shortcut (in this instance); whether its output "
                                 f"keeps its input's shape is checked by prune(..., example_input=...)")
            elif not identity_shortcut(block):
                spec = block_spec(block)
                where = spec.shortcut if spec is not None and spec.shortcut else "shortcut"
                reasons[name] = (f"its {where} is a {type(getattr(block, where, None)).__name__}, not the identity: "
                                 f"the block changes the feature map's shape (a stride-2 or projection block)")
        return reasons

    def removable(self, example_input: Any = None) -> list[str]:
        """`analysis.removal.removable_blocks` on these blocks."""
        excluded = self.unremovable(example_input)
        return [name for name in self.blocks if name not in excluded]

    def gate_size(self, name: str) -> tuple[float, float]:
        """The size by which `analysis.removal.removal_order` ranks block `name`: (its largest branch gate |g|
        (`gate_magnitude`), the largest k of its scalar gates or 0.0 when a branch has another gate).
        ValueError naming the branch without a gate with a value, or with a gate that is not finite."""
        # A block's size is its largest branch gate |g| (ours: a transformer layer stays while either of
        # its branches is open); among equal sizes (closed ReLU gates: g = 0) the smaller k first, as the
        # paper orders by k.
        refs = [ref for ref in self.branches.values() if ref.block == name]
        if not refs or any(ref.gate is None for ref in refs):
            ungated = next((ref.name for ref in refs if ref.gate is None), name)
            raise ValueError(f"block {ungated!r} has no gate with a value; the greedy order needs a gated branch in "
                             f"every removable block (throughway.add_gates puts one in)")
        sizes = []
        for ref in refs:
            value = gate_value(ref.gate)
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"the gate of {ref.name!r} is {value.flatten()[:4].tolist()} (not finite): the "
                                 f"greedy order cannot rank it; the model diverged")
            sizes.append(float(value.abs().mean()))  # gate_magnitude, of the value just read (the gate read once)
        ks = [float(ref.gate.k.detach().cpu()) for ref in refs if isinstance(ref.gate, ScalarGate)]
        return max(sizes), (max(ks) if len(ks) == len(refs) else 0.0)


def resolve_block(model: nn.Module, block: int | str, *, negative: bool = False) -> tuple[str, nn.Module]:
    """(qualified name, block) for `block`, a position in `find_blocks(model)` (from 0; from the end
    when negative=True allows it) or a qualified name. IndexError naming the accepted values,
    ValueError when the model has no blocks or the name is a module that is not a block."""
    return ModelBlocks(model).resolve(block, negative=negative)


def resolve_blocks(model: nn.Module, blocks: Sequence[int | str]) -> list[str]:
    """The qualified names of `blocks` (positions from 0 or qualified names, see `resolve_block`), in
    the order given. ValueError when one block is named twice."""
    return ModelBlocks(model).resolve_all(blocks)


def resolve_branches(model: nn.Module, which: int | str) -> list[BranchRef]:
    """The branches `which` names: a branch's name ("encoder.layers.3.ff"), a block's qualified name
    (all of its branches: both of a transformer layer's), or a position in `find_branches(model)`
    from 0 (negative from the end). For the toolkit's models, whose blocks have one branch each,
    positions and names are those of `find_blocks`. IndexError naming the accepted values,
    ValueError when the model has no blocks."""
    return ModelBlocks(model).resolve_branches(which)
