"""Finding the blocks of any model: gated, residual, augmented, highway and plain blocks by type,
anywhere in the module tree, named by their qualified names.

The analyses (gate statistics, lesioning, pruning, removal curves) work on a researcher's own
`nn.Module` as they do on the registry's models: like PEFT's `target_modules` and timm's feature
hooks, they walk `model.named_modules()` and pick out the modules that are blocks, so the blocks may
sit in a `blocks` ModuleList, an `nn.Sequential`, several stages, or plain attributes.

A block is a module of one of `BLOCK_TYPES`, or any module that follows the block contract of
docs/design.md (attributes `branch`, `shortcut` and `gate`, with `shortcut` None for a plain
layer). The search does not descend into a block: a block inside another block's branch belongs to
that block. Blocks are reported by their qualified name (`model.get_submodule(name)` returns the
block; for the registry's models, "blocks.3" is `model.blocks[3]`), in module order.

**Naming a block.** Every function that takes a block accepts either its qualified name (a str)
or its position in `find_blocks(model)` counted from 0, as Python indexes (an int; negative
positions count from the end for `lesion`). The command line prints qualified names.
"""

from __future__ import annotations

from typing import Callable, Sequence, cast

import torch
from torch import nn

from ..layers import HighwayLayer, PlainBlock, PreActBlock, PreActUnit, ResidualBlock
from ..layers.gated import AugmentedLayer

__all__ = ["BLOCK_TYPES", "FAMILIES", "find_blocks", "block_kind", "block_gate", "gate_value", "gate_magnitude",
           "resolve_block", "resolve_blocks"]

# The package's block types; a user's own block is found when it follows the block contract.
BLOCK_TYPES: tuple[type[nn.Module], ...] = (HighwayLayer, AugmentedLayer, ResidualBlock, PreActBlock, PreActUnit,
                                            PlainBlock)
# What `block_kind` and `gates.model_family` answer.
FAMILIES = ("gated", "residual", "augmented", "highway", "plain")


def _follows_contract(module: nn.Module) -> bool:
    gate = getattr(module, "gate", None)
    return (isinstance(gate, nn.Module) and isinstance(getattr(module, "branch", None), nn.Module)
            and hasattr(module, "shortcut"))


def _is_block(module: nn.Module) -> bool:
    return isinstance(module, BLOCK_TYPES) or _follows_contract(module)


def find_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """Every block of `model`, in module order, keyed by qualified name ("blocks.0", "stages.1.2", ...).

    `model` itself counts as a block when it is one (its name is then ""). Empty when the model has
    no block; the functions that need blocks raise ValueError then."""
    found: dict[str, nn.Module] = {}
    inside: str | None = None  # the name of the block whose submodules are being skipped
    for name, module in model.named_modules():
        if inside is not None and (inside == "" or name.startswith(inside + ".")):
            continue
        inside = None
        if _is_block(module):
            found[name] = module
            inside = name
    return found


def block_gate(block: nn.Module) -> nn.Module | None:
    """The gate of `block` whose `value()` gives g: a `ScalarGate` (0-d g), a vector gate (g of
    shape (C,), LayerScale's diag(λ)) or any module with a `value()` method; None for an ungated
    block (`gate` is `nn.Identity`) and for highway layers, whose transform gate T(x) depends on x."""
    gate = getattr(block, "gate", None)
    return gate if isinstance(gate, nn.Module) and callable(getattr(gate, "value", None)) else None


def block_kind(block: nn.Module) -> str:
    """The family of one block (one of FAMILIES): "highway" (HighwayLayer), "augmented"
    (AugmentedLayer, u = g·f(x) + (1 − g)·x), "gated" (a residual block whose gate has a value:
    u = g·f_r(x) + shortcut(x), scalar or vector g), "residual" (the same ungated) or "plain" (no
    shortcut). ValueError naming the type for a module that is not a block."""
    if isinstance(block, HighwayLayer):
        return "highway"
    if isinstance(block, AugmentedLayer):
        return "augmented"
    if not _is_block(block):
        raise ValueError(f"a {type(block).__name__} is not a block: known are {[t.__name__ for t in BLOCK_TYPES]} "
                         f"and modules with the attributes branch, shortcut and gate (docs/design.md)")
    if isinstance(block, PlainBlock) or getattr(block, "shortcut", None) is None:
        return "plain"
    return "gated" if block_gate(block) is not None else "residual"


def gate_value(gate: nn.Module) -> torch.Tensor:
    """g of a gate with a `value()` method (see `block_gate`), detached, on the CPU, in float64: a 0-d
    tensor for a scalar gate, (C,) for a vector gate."""
    value = cast(Callable[[], torch.Tensor], gate.value)
    return value().detach().double().cpu()


def gate_magnitude(gate: nn.Module) -> float:
    """|g| of a gate, the size by which removal orders blocks: |g(k)| for a scalar gate, the mean
    |λ| over channels for a vector gate (ReZero's α may be negative, LayerScale's λ a vector)."""
    return float(gate_value(gate).abs().mean())


def _positions_error(blocks: dict[str, nn.Module], given: object) -> IndexError:
    shown = list(blocks)[:4] + (["..."] if len(blocks) > 4 else [])
    return IndexError(f"block={given!r}: accepted values are positions 0 .. {len(blocks) - 1} (counted from 0 "
                      f"in find_blocks order) or qualified names {shown}")


def resolve_block(model: nn.Module, block: int | str, *, negative: bool = False) -> tuple[str, nn.Module]:
    """(qualified name, block) for `block`, a position in `find_blocks(model)` (from 0; from the end
    when negative=True allows it) or a qualified name. IndexError naming the accepted values,
    ValueError when the model has no blocks or the name is a module that is not a block."""
    blocks = find_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no blocks (none of {[t.__name__ for t in BLOCK_TYPES]}, and no "
                         f"module with the attributes branch, shortcut and gate): nothing to analyse")
    if isinstance(block, str):
        if block in blocks:
            return block, blocks[block]
        try:
            module = model.get_submodule(block)
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


def resolve_blocks(model: nn.Module, blocks: Sequence[int | str]) -> list[str]:
    """The qualified names of `blocks` (positions from 0 or qualified names, see `resolve_block`), in
    the order given. ValueError when one block is named twice."""
    if isinstance(blocks, (str, int, torch.Tensor)):
        raise TypeError(f"blocks={blocks!r}: expected a list of positions or qualified names, e.g. [0, 2] or "
                        f"['blocks.0']")
    names: list[str] = []
    for block in blocks:
        name, _ = resolve_block(model, block)
        if name in names:
            raise ValueError(f"block {name!r} is listed twice in the blocks to remove")
        names.append(name)
    return names
