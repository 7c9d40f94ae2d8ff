"""One representation of a block, for the toolkit's blocks and every library's: the block registry,
the one function that lists branches and their gates, closing a branch, and checking a spec
against the model.

A residual block computes u = shortcut(x) + g·branch(x) with one branch or several (a transformer
layer's attention and feed-forward branches). A `BlockSpec`, registered for the block's class, says
from the outside where each branch ends (the module whose output is added to the shortcut), where
its gate sits, how the branch is closed and what the shortcut is, as PEFT's target modules and
timm's feature hooks describe modules without changing their code. The toolkit's own block types
are registered exactly like another library's (bottom of this file); the attribute contract of
docs/design.md (`branch`, `shortcut`, `gate`) is one registration helper, `register_contract_block`,
and an unregistered module that follows it is read through the same spec.

Everything that asks about branches or gates reads `find_branches` (lesion, removal, prune, gate
statistics, distances, the k recorded by `fit` and by stacks, parameter groups, the Lightning and
Hugging Face callbacks), so they give one answer on one model.

A spec is trusted only as far as it was checked: `check_blocks(model, example_input)` runs the
model on an example and verifies, for every block with an identity shortcut, that closing every
branch returns the block's input and that scaling one branch by g scales the block's residual by g
(which catches a branch end placed before a normalisation, where a gate would have no effect), and
statically that no two branches end at one module.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence, cast

import torch
from torch import nn

from .conv import PreActBlock, PreActUnit
from .dense import PlainBlock, ResidualBlock
from .gated import AugmentedLayer
from .highway import HighwayLayer

__all__ = ["BlockSpec", "BranchRef", "ParameterGate", "ClosedGate", "BLOCK_KINDS", "CLOSE_RULES", "register_block",
           "register_contract_block", "register_rule", "unregister_block", "block_spec", "registered_blocks", "is_block",
           "iter_blocks", "block_branches", "find_branches", "has_shortcut", "identity_shortcut", "gate_parameters",
           "gate_k", "scalar_gate_values", "branch_gate_values", "close_branches", "scale_branches", "check_blocks", "SpecCheck",
           "call_model"]

End = str | tuple[str, ...]

# What a block is: "residual" (u = shortcut(x) + g·branch(x); gated when its branches carry gates),
# "augmented" (u = g·f(x) + (1 − g)·x, gated-residual-v1 §3), "highway" (y = H(x)·T(x) + x·(1 − T(x)),
# highway paper eq. 3) and "plain" (no shortcut at all).
BLOCK_KINDS = ("residual", "augmented", "highway", "plain")
# How a branch is closed: "end" makes the module that ends it output zeros; "gate" swaps the module in
# its gate slot for a ClosedGate, whose value and output are 0 (the highway paper's T = 0, the
# augmentation's g = 0, the toolkit's residual gate).
CLOSE_RULES = ("end", "gate")


@dataclass(frozen=True)
class BlockSpec:
    """How one block type computes its output from its shortcut and its branches.

    branches: branch name → path (inside the block) of the module whose output ends that branch, or a
    tuple of candidate paths (the first that names a module wins); "" names the only branch of a
    single-branch block.
    gates: branch name → path of the gate the architecture carries or has a slot for: a module with
    `value()`, a module holding a `gamma` vector (timm's LayerScale), a parameter (ConvNeXt's
    `gamma`), or nn.Identity / None (an empty slot: no gate yet; `add_gates` fills an nn.Identity slot).
    optional: branches that may be absent (GPT-2's cross-attention): left out when no module ends them.
    shortcut: the attribute holding a projection shortcut (None or nn.Identity there: the identity).
    channel_dim: the dimension of the branch output that holds the channels a vector gate scales
    (1 for images (B, C, H, W), -1 for tokens (B, T, C)).
    width: the number of channels of the branch output, for a vector gate; None infers it from the
    block's last normalisation layer.
    prepare: called on the block before a gate is inserted, a branch closed or the spec checked
    (torch's encoder layer turns off its fused inference path, which would skip both).
    close: how a branch is closed (CLOSE_RULES).
    kind: what the block is (BLOCK_KINDS).
    skip: a test of one block instance that says whether it has a shortcut at all (timm's
    InvertedResidual adds its input only when `has_skip`); None: always, unless kind is "plain".
    fold: branch name → path of the Linear / convolution whose output, up to modules that commute
    with a scale (dropout, drop-path, identity), is the branch output: where `fold_gates` multiplies
    the gate in.
    identity_when_closed: False for a post-norm block (BERT: LayerNorm(x + f(x))), whose closed
    branches leave LayerNorm(x), not x; the identity check is then skipped. A callable decides per
    instance (torch's encoder layer: `norm_first`).
    """

    branches: Mapping[str, End]
    gates: Mapping[str, str] = field(default_factory=dict)
    optional: frozenset[str] = frozenset()
    shortcut: str | None = None
    channel_dim: int = 1
    width: Callable[[nn.Module], int] | None = None
    prepare: Callable[[nn.Module], None] | None = None
    close: str = "end"
    kind: str = "residual"
    skip: Callable[[nn.Module], bool] | None = None
    fold: Mapping[str, str] = field(default_factory=dict)
    identity_when_closed: bool | Callable[[nn.Module], bool] = True


_BY_TYPE: dict[type, BlockSpec] = {}
_BY_NAME: dict[str, BlockSpec] = {}


def _check_path(path: object, what: str) -> None:
    if not isinstance(path, str) or not path or any(not part.isidentifier() and not part.isdigit()
                                                    for part in path.split(".")):
        raise ValueError(f"{what}={path!r}: expected a dotted attribute path inside the block, e.g. 'dropout1' or "
                         f"'attention.output.dropout'")


def _spec_from_arguments(branches: Mapping[str, End] | End, gates: Mapping[str, str] | str | None,
                         optional: Sequence[str], shortcut: str | None, channel_dim: int,
                         width: Callable[[nn.Module], int] | None, prepare: Callable[[nn.Module], None] | None,
                         close: str, kind: str, skip: Callable[[nn.Module], bool] | None,
                         fold: Mapping[str, str] | str | None,
                         identity_when_closed: bool | Callable[[nn.Module], bool]) -> BlockSpec:
    if isinstance(branches, (str, tuple)):
        branches = {"": branches}
    if not isinstance(branches, Mapping) or not branches:
        raise ValueError(f"branches={branches!r}: expected a path ('bn2') or a mapping branch name -> path")
    for name, end in branches.items():
        if not isinstance(name, str) or (name and not name.isidentifier()):
            raise ValueError(f"branch name {name!r}: expected an identifier such as 'attn' or 'ff' ('' for the only "
                             f"branch)")
        for path in (end if isinstance(end, tuple) else (end,)):
            _check_path(path, f"branches[{name!r}]")
    if "" in branches and len(branches) > 1:
        raise ValueError("branches: '' names the only branch of a block; name every branch of a multi-branch block")
    gate_paths = {"": gates} if isinstance(gates, str) else dict(gates or {})
    fold_paths = {"": fold} if isinstance(fold, str) else dict(fold or {})
    for what, paths in (("gates", gate_paths), ("fold", fold_paths)):
        for name, path in paths.items():
            if name not in branches:
                raise ValueError(f"{what} names branch {name!r}; the branches are {sorted(branches)}")
            _check_path(path, f"{what}[{name!r}]")
    if shortcut is not None:
        _check_path(shortcut, "shortcut")
    unknown = set(optional) - set(branches)
    if unknown:
        raise ValueError(f"optional names {sorted(unknown)}, which are not branches ({sorted(branches)})")
    if channel_dim not in (1, -1):
        raise ValueError(f"channel_dim={channel_dim!r}: accepted values 1 (images, (B, C, H, W)) or -1 (tokens, "
                         f"(B, T, C))")
    if close not in CLOSE_RULES:
        raise ValueError(f"close={close!r}; accepted values: {list(CLOSE_RULES)} ('end': the branch's last module "
                         f"outputs zeros; 'gate': the gate slot is swapped for a closed gate)")
    if close == "gate" and set(gate_paths) != set(branches):
        raise ValueError(f"close='gate' needs a gate path for every branch ({sorted(branches)}); gates names "
                         f"{sorted(gate_paths)}")
    if kind not in BLOCK_KINDS:
        raise ValueError(f"kind={kind!r}; accepted values: {list(BLOCK_KINDS)}")
    if skip is not None and not callable(skip):
        raise TypeError(f"skip={skip!r}: expected a callable block -> bool (whether this block adds its input)")
    if not callable(identity_when_closed):
        identity_when_closed = bool(identity_when_closed)
    return BlockSpec(dict(branches), gate_paths, frozenset(optional), shortcut, channel_dim, width, prepare, close,
                     kind, skip, fold_paths, identity_when_closed)


def register_block(module_type: type[nn.Module] | str, branches: Mapping[str, End] | End, *,
                   gates: Mapping[str, str] | str | None = None, optional: Sequence[str] = (),
                   shortcut: str | None = None, channel_dim: int = 1, width: Callable[[nn.Module], int] | None = None,
                   prepare: Callable[[nn.Module], None] | None = None, close: str = "end", kind: str = "residual",
                   skip: Callable[[nn.Module], bool] | None = None, fold: Mapping[str, str] | str | None = None,
                   identity_when_closed: bool | Callable[[nn.Module], bool] = True,
                   check: tuple[nn.Module, Any] | None = None) -> BlockSpec:
    """Tell the toolkit how blocks of `module_type` compute u = shortcut(x) + g·branch(x).

    `module_type`: the class, or its fully qualified name ("timm.models.resnet.BasicBlock") to
    match a library's class without importing it. `branches`: the path of the module that ends the
    only branch ("bn2"), or a mapping branch name → path ({"attn": "dropout1", "ff": "dropout2"});
    a tuple of paths lists candidates. The other arguments are `BlockSpec`'s. A later registration of
    the same type replaces the earlier one, and it takes effect at once: the analyses look the spec
    up at every call.

    `check=(model, example_input)` verifies the new spec on that model before keeping it
    (`check_blocks`); when the check fails the earlier registration (or none) is put back and the
    ValueError names the block and the branch. Returns the spec. Example (a block whose forward is
    `x + self.drop(self.mlp(x))`)::

        register_block(MyBlock, "drop", check=(model, torch.randn(2, 16)))
        register_block("mylib.blocks.Layer", {"attn": "attn_out", "ff": "ff_out"}, channel_dim=-1)
    """
    spec = _spec_from_arguments(branches, gates, optional, shortcut, channel_dim, width, prepare, close, kind, skip,
                                fold, identity_when_closed)
    if isinstance(module_type, str):
        if "." not in module_type:
            raise ValueError(f"module_type={module_type!r}: give the class or its fully qualified name, e.g. "
                             f"'timm.models.resnet.BasicBlock'")
        table: dict[Any, BlockSpec] = _BY_NAME
    elif isinstance(module_type, type) and issubclass(module_type, nn.Module):
        table = _BY_TYPE
    else:
        raise TypeError(f"module_type={module_type!r}: expected an nn.Module subclass or its qualified name")
    earlier = table.get(module_type)
    table[module_type] = spec
    if check is not None:
        if not (isinstance(check, tuple) and len(check) == 2 and isinstance(check[0], nn.Module)):
            _restore(table, module_type, earlier)
            raise TypeError(f"check={check!r:.80}: expected (model, example_input)")
        try:
            check_blocks(check[0], check[1])
        except Exception:
            _restore(table, module_type, earlier)
            raise
    return spec


def _restore(table: dict[Any, BlockSpec], key: Any, earlier: BlockSpec | None) -> None:
    if earlier is None:
        table.pop(key, None)
    else:
        table[key] = earlier


def unregister_block(module_type: type[nn.Module] | str) -> None:
    """Forget the registration of `module_type` (the class or its qualified name). KeyError naming it when
    there is none."""
    table: dict[Any, BlockSpec] = _BY_NAME if isinstance(module_type, str) else _BY_TYPE
    if module_type not in table:
        raise KeyError(f"module_type={module_type!r} is not registered; registered: {registered_blocks()}")
    del table[module_type]


# The attribute contract (docs/design.md): `branch` is the transformation, `gate` a gate module (or
# nn.Identity when ungated) that the forward applies to it, `shortcut` the identity, a projection, or
# None for a plain layer. The gate slot ends the branch, so a closed gate closes the branch.
_CONTRACT = BlockSpec({"": "gate"}, {"": "gate"}, shortcut="shortcut", close="gate",
                      skip=lambda block: getattr(block, "shortcut", None) is not None, fold={})


def register_contract_block(module_type: type[nn.Module]) -> BlockSpec:
    """Register a block type that follows the attribute contract of docs/design.md: attributes
    `branch`, `gate` (applied by its forward to the branch's output: u = gate(branch(x)) +
    shortcut(x)) and `shortcut` (None for a plain layer). A module that follows the contract is read
    this way even unregistered; registering says so explicitly. Returns the spec."""
    if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
        raise TypeError(f"module_type={module_type!r}: expected an nn.Module subclass")
    _BY_TYPE[module_type] = _CONTRACT
    return _CONTRACT


def _follows_contract(module: nn.Module) -> bool:
    gate = getattr(module, "gate", None)
    return (isinstance(gate, nn.Module) and isinstance(getattr(module, "branch", None), nn.Module)
            and hasattr(module, "shortcut"))


_RULES: dict[str, Callable[[nn.Module], BlockSpec | None]] = {}


def register_rule(name: str, rule: Callable[[nn.Module], BlockSpec | None]) -> None:
    """A spec for every module that `rule` recognises (it returns the spec, or None), for a layout many
    classes share (Hugging Face's decoder layers: `self_attn` + `mlp` between pre-norms) rather than one
    class. Rules are asked, in registration order, only for modules whose class has no registration;
    `name` identifies the rule (a later rule of the same name replaces it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name={name!r}: expected a non-empty string naming the rule")
    if not callable(rule):
        raise TypeError(f"rule={rule!r}: expected a callable module -> BlockSpec | None")
    _RULES[name] = rule


def block_spec(module: nn.Module) -> BlockSpec | None:
    """The spec of `module`: the registration of its class or of its nearest registered base class
    (other libraries' classes match by fully qualified name), else the first rule that recognises it
    (`register_rule`), else the contract spec when the module follows the attribute contract, else
    None (not a block)."""
    for cls in type(module).__mro__:
        if cls in _BY_TYPE:
            return _BY_TYPE[cls]
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in _BY_NAME:
            return _BY_NAME[name]
    for rule in _RULES.values():
        spec = rule(module)
        if spec is not None:
            return spec
    return _CONTRACT if _follows_contract(module) else None


def registered_blocks() -> list[str]:
    """The qualified names of every registered block class, sorted, then the names of the rules (for the
    docs and error messages)."""
    return sorted([f"{t.__module__}.{t.__qualname__}" for t in _BY_TYPE] + list(_BY_NAME)) + \
        [f"rule: {name}" for name in _RULES]


def is_block(module: nn.Module) -> bool:
    """True for a module of a registered type (the toolkit's own included) and for a module that follows
    the attribute contract."""
    return block_spec(module) is not None


def iter_blocks(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, block) of every block of `model`, in module order; the search does not
    descend into a block. ValueError naming both names when one block module is reachable under two
    names (a shared block: lesioning or removing it at one use would change the other)."""
    seen: dict[int, str] = {}
    inside: str | None = None
    for name, module in model.named_modules(remove_duplicate=False):
        if inside is not None and (inside == "" or name.startswith(inside + ".")):
            continue
        inside = None
        if is_block(module):
            if id(module) in seen:
                raise ValueError(f"block {name!r} is the same module as block {seen[id(module)]!r} (a shared block): "
                                 f"the analyses need every block to appear once; give each use its own module")
            seen[id(module)] = name
            inside = name
            yield name, module


def _spec(block: nn.Module) -> BlockSpec:
    spec = block_spec(block)
    if spec is None:
        raise ValueError(f"a {type(block).__name__} is not a block: register its type with "
                         f"throughway.layers.register_block ({len(registered_blocks())} types are registered)")
    return spec


def has_shortcut(block: nn.Module) -> bool:
    """Whether `block` adds its input to its output at all: False for a plain layer (kind "plain", a
    contract block whose `shortcut` is None) and for an instance the spec's `skip` test rejects (timm's
    InvertedResidual without `has_skip`)."""
    spec = _spec(block)
    if spec.kind == "plain":
        return False
    return bool(spec.skip(block)) if spec.skip is not None else True


def identity_shortcut(block: nn.Module) -> bool:
    """True when the block adds its input unchanged (so removing it keeps the shapes): it has a
    shortcut (`has_shortcut`) and its projection attribute (`BlockSpec.shortcut`, e.g. torchvision's
    `downsample`) is None or nn.Identity."""
    if not has_shortcut(block):
        return False
    spec = _spec(block)
    if spec.shortcut is None:
        return True
    projection = resolve_path(block, spec.shortcut)
    return projection is None or isinstance(projection, nn.Identity)


class ParameterGate:
    """A gate that is a parameter of another library's module (timm's LayerScale `gamma`, ConvNeXt's
    `gamma`), seen through the toolkit's gate interface: `value()` returns it and `k` is it."""

    def __init__(self, parameter: torch.Tensor) -> None:
        self.k = parameter

    def value(self) -> torch.Tensor:
        """g: the parameter itself (LayerScale's λ: u = x + diag(λ)·f(x))."""
        return self.k

    def parameters(self) -> Iterator[torch.Tensor]:
        """The one parameter, as nn.Module.parameters() would give it."""
        yield self.k


@dataclass(frozen=True)
class BranchRef:
    """One residual branch of a block.

    name: "encoder.layers.3.ff", or the block's name for a single-branch block; block: the block's
    qualified name; key: the branch's name inside its block ("ff", "" for the only one); end: the
    qualified name of the module whose output ends the branch; gate: an object with `value()` (a
    ScalarGate, VectorGate, a ParameterGate over timm's γ, a gate `add_gates` inserted), or None when
    the branch is ungated (or its gate has no value, as a highway layer's T(x)); gate_path: the
    qualified name of the gate module or parameter, None without one; spec: the block's spec.
    """

    name: str
    block: str
    key: str
    end: str
    gate: Any
    gate_path: str | None
    spec: BlockSpec


def resolve_path(root: nn.Module, path: str) -> Any:
    """The attribute at dotted `path` inside `root` (a module, a parameter, or None where a step is missing)."""
    value: Any = root
    for part in path.split("."):
        value = getattr(value, part, None)  # a numbered child of a ModuleList is an attribute too
        if value is None:
            return None
    return value


def _end_path(block: nn.Module, end: End) -> str | None:
    for path in (end if isinstance(end, tuple) else (end,)):
        if isinstance(resolve_path(block, path), nn.Module):
            return path
    return None


def _as_gate(found: Any) -> Any:
    if isinstance(found, nn.Identity) or found is None:
        return None
    if isinstance(found, ClosedGate):
        return _as_gate(found.closed)
    if isinstance(found, nn.Module) and callable(getattr(found, "value", None)):
        return found
    if isinstance(found, nn.Module) and isinstance(getattr(found, "gamma", None), torch.Tensor):
        return ParameterGate(cast(torch.Tensor, found.gamma))  # timm's LayerScale: x * gamma
    if isinstance(found, torch.Tensor):
        return ParameterGate(found)
    return None


# The attribute on a block under which `add_gates` keeps the gates it hooks onto branch ends (a
# ModuleDict keyed by branch name, "main" for a single-branch block): the block's own names stay unchanged.
ADDED_GATES = "branch_gates"


def gate_key(key: str) -> str:
    """The key of a branch's gate in its block's `branch_gates`: the branch's name, "main" for the only one."""
    return key or "main"


def qualified_name(block_name: str, path: str) -> str:
    """The qualified name of `path` inside the block named `block_name` ("" for the model itself)."""
    return f"{block_name}.{path}" if block_name else path


def block_branches(name: str, block: nn.Module) -> list[BranchRef]:
    """The residual branches of one block (see `BranchRef`), in the spec's order. ValueError naming
    the block and the path when a required branch's module is missing, and naming both branches when
    two end at one module (each branch must end at its own module, or closing one would close both)."""
    spec = _spec(block)
    refs: list[BranchRef] = []
    ends: dict[int, str] = {}
    added = block._modules.get(ADDED_GATES)
    for key, end in spec.branches.items():
        path = _end_path(block, end)
        full = f"{name}.{key}" if key and name else (key or name)
        if path is None:
            if key in spec.optional:
                continue
            raise ValueError(f"block {name!r} ({type(block).__name__}): no module at {end!r} ends branch "
                             f"{key or '(the only one)'!r}; the registered spec does not fit this block")
        module = resolve_path(block, path)
        if id(module) in ends:
            raise ValueError(f"block {name!r} ({type(block).__name__}): branches {ends[id(module)]!r} and "
                             f"{key!r} both end at module {path!r}; each branch must end at its own module (a "
                             f"gate or a lesion there would act on both). Register the block with the module "
                             f"each branch's output comes from before the shared one")
        ends[id(module)] = key
        gate: Any = None
        gate_path: str | None = None
        if isinstance(added, nn.ModuleDict) and gate_key(key) in added:
            gate = added[gate_key(key)]
            gate_path = qualified_name(name, f"{ADDED_GATES}.{gate_key(key)}")
        elif key in spec.gates:
            gate = _as_gate(resolve_path(block, spec.gates[key]))
            gate_path = qualified_name(name, spec.gates[key]) if gate is not None else None
            if isinstance(gate, ParameterGate) and not isinstance(resolve_path(block, spec.gates[key]), torch.Tensor):
                gate_path = qualified_name(name, spec.gates[key] + ".gamma")
        refs.append(BranchRef(full, name, key, qualified_name(name, path), gate, gate_path, spec))
    return refs


def find_branches(model: nn.Module) -> dict[str, BranchRef]:
    """Every residual branch of `model`, in module order, keyed by name: a single-branch block's
    branch has the block's name ("blocks.3", "layer1.0"), a transformer layer's are named by the
    layer's qualified name plus "attn" / "ff" ("encoder.layers.3.ff"). Each `BranchRef` says which
    block holds it, which module ends it and its gate (None when ungated). This is the one function
    that lists a model's branches and gates; everything else reads it."""
    return {ref.name: ref for name, block in iter_blocks(model) for ref in block_branches(name, block)}


def gate_parameters(model: nn.Module) -> list[torch.Tensor]:
    """Every gate parameter of `model` (the parameters of the gates `find_branches` lists: the
    toolkit's k and λ, the gates `add_gates` inserted, timm's LayerScale γ, ConvNeXt's γ), in branch
    order, each once. What `param_groups` keeps out of weight decay."""
    found: dict[int, torch.Tensor] = {}
    for ref in find_branches(model).values():
        if ref.gate is not None:
            for p in ref.gate.parameters():
                found.setdefault(id(p), p)
    return list(found.values())


def gate_k(gate: Any) -> float:
    """One number for a gate's parameter: k of a scalar gate (gated-residual-v2's k, ReZero's α), the
    mean over channels of a vector gate's λ (LayerScale) or of a library's γ; the mean of `value()` for
    a gate without a parameter `k`."""
    k = getattr(gate, "k", None)
    tensor = k if isinstance(k, torch.Tensor) else cast(Callable[[], torch.Tensor], gate.value)()
    return float(tensor.detach().double().mean().cpu())


def scalar_gate_values(model: nn.Module) -> list[float]:
    """k (not g(k)) of every branch whose gate is a scalar gate, in branch order, as Python floats."""
    from .gates import ScalarGate

    return [float(ref.gate.k.detach().cpu()) for ref in find_branches(model).values()
            if isinstance(ref.gate, ScalarGate)]


def branch_gate_values(model: nn.Module) -> list[float]:
    """`gate_k` of every gated branch of `model`, in branch order: what `fit` and the stacks record as
    "k" after each epoch ([] for a model without gated branches)."""
    return [gate_k(ref.gate) for ref in find_branches(model).values() if ref.gate is not None]


# ---- closing and scaling branches ---------------------------------------------------------------

class ClosedGate(nn.Module):
    """A gate that is shut: `forward` returns zeros shaped like its input (T(x) = 0 for a transform
    gate, g·h = 0 for a scalar or vector gate) and `value()` returns g = 0 as a 0-d tensor (what
    `AugmentedLayer` reads; it broadcasts wherever a vector g would).

    Holds the gate it replaces as `closed` (not registered as a submodule, so state_dict keys and
    parameters() are unchanged while it is in place)."""

    def __init__(self, closed: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "closed", closed)
        self.used = False  # set by forward() and value(): a lesion checks that the block really read its gate

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


class _ScaledOutput(nn.Module):
    """Stands in for a branch's last module (or its gate slot) while the branch is closed (factor 0)
    or scaled: calls the module it replaces (held unregistered, so the model's parameter names are
    unchanged meanwhile) and returns factor × its output (the first element of a tuple); `value()`
    scales a gate's value the same way. Swapping a module, unlike adding a hook, is seen by a model
    that torch.compile compiled earlier (dynamo guards the module tree, not the hooks)."""

    def __init__(self, replaced: nn.Module, factor: float) -> None:
        super().__init__()
        object.__setattr__(self, "replaced", replaced)
        self.factor = float(factor)
        self.used = False

    def _scale(self, h: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(h) if self.factor == 0.0 else h * self.factor

    def value(self) -> torch.Tensor:
        self.used = True
        inner = getattr(self.replaced, "value", None)
        if callable(inner):
            return self._scale(cast(torch.Tensor, inner()))
        reference = next(iter(cast(nn.Module, self.replaced).parameters()), None)
        return torch.full((), self.factor, dtype=reference.dtype if reference is not None else None,
                          device=reference.device if reference is not None else None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.used = True
        out = cast(nn.Module, self.replaced)(*args, **kwargs)
        if isinstance(out, tuple):
            return (self._scale(out[0]), *out[1:])
        return self._scale(out)


def _swap_target(model: nn.Module, ref: BranchRef) -> str:
    # close="gate": the gate slot; close="end": the branch's last module.
    if ref.spec.close == "gate":
        return qualified_name(ref.block, ref.spec.gates[ref.key])
    return ref.end


@contextlib.contextmanager
def scale_branches(model: nn.Module, factors: Mapping[str, float]) -> Iterator[list[nn.Module]]:
    """Within the `with` block, each branch named in `factors` (a key of `find_branches(model)`)
    contributes factor × its output (0 closes it: see `close_branches`), by swapping the module that
    ends it (or, for a spec with close="gate", the module in its gate slot) for a stand-in; the original
    modules are put back on exit, also after an exception, and no tensor of the model is written.
    Yields the stand-ins (each has `used`: whether a forward pass called it). KeyError naming the branch
    when one is not a branch of the model; ValueError when a closed gate slot is asked to scale (a
    highway layer's T and an augmentation's g are closed, not scaled)."""
    branches = find_branches(model)
    unknown = [name for name in factors if name not in branches]
    if unknown:
        raise KeyError(f"{unknown[0]!r} is not a branch of this model; the branches are {list(branches)[:8]}")
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    standins: list[nn.Module] = []
    try:
        for name, factor in factors.items():
            ref = branches[name]
            host = model.get_submodule(ref.block)
            if ref.spec.prepare is not None:
                ref.spec.prepare(host)
            target = _swap_target(model, ref)
            parent_name, _, key = target.rpartition(".")
            parent = model.get_submodule(parent_name)
            original = parent._modules[key]
            if original is None:
                raise ValueError(f"branch {name!r}: its gate slot {target!r} holds None; it cannot be closed there")
            if ref.spec.close == "gate" and factor == 0.0:
                standin: nn.Module = ClosedGate(original)
            elif ref.spec.close == "gate" and ref.spec.kind in ("highway", "augmented"):
                raise ValueError(f"branch {name!r} ({ref.spec.kind}): its gate can be closed (factor 0), not scaled "
                                 f"by {factor}")
            else:
                standin = _ScaledOutput(original, factor)
            parent._modules[key] = standin
            swapped.append((parent, key, original))
            standins.append(standin)
        yield standins
    finally:
        for parent, key, original in reversed(swapped):
            parent._modules[key] = original


def close_branches(model: nn.Module, names: Sequence[str]) -> contextlib.AbstractContextManager[list[nn.Module]]:
    """`scale_branches` with factor 0 for every branch in `names`: within the `with` block each
    contributes nothing (the highway paper's T = 0, the augmentation's g = 0, a residual branch's
    output zeroed), so a block whose every branch is closed computes its shortcut."""
    return scale_branches(model, {name: 0.0 for name in names})


# ---- checking a spec against the model ----------------------------------------------------------

def call_model(model: nn.Module, example_input: Any) -> Any:
    """model(example_input) for a tensor, model(**example_input) for a mapping of keyword arguments
    (a Hugging Face batch: input_ids, attention_mask) and model(*example_input) for a tuple or list."""
    if isinstance(example_input, Mapping):
        return model(**example_input)
    if isinstance(example_input, (tuple, list)):
        return model(*example_input)
    return model(example_input)


def _hidden(value: Any) -> torch.Tensor | None:
    # A block's output is a tensor or a tuple whose first element is the hidden state (Hugging Face).
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def _input_of(args: tuple, kwargs: dict[str, Any]) -> tuple[str | int, torch.Tensor] | None:
    if args and isinstance(args[0], torch.Tensor):
        return 0, args[0]
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return "hidden_states", kwargs["hidden_states"]
    return None


@dataclass(frozen=True)
class SpecCheck:
    """What `check_blocks` verified: `checked` (branches whose closing and scaling were verified on the
    example), `unverified` (branch → why not: its output was exactly zero on the example, as a timm
    ResNet's last BatchNorm starts, or its block is post-norm, highway or augmented), `plain` (blocks
    without a shortcut) and `projection` (blocks whose shortcut is not the identity)."""

    checked: tuple[str, ...]
    unverified: Mapping[str, str]
    plain: tuple[str, ...]
    projection: tuple[str, ...]


def _close(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return False, float("inf")
    scale = float(b.abs().max()) if b.numel() else 0.0
    difference = float((a - b).abs().max()) if a.numel() else 0.0
    return difference <= 1e-4 * max(scale, 1.0), difference


def check_blocks(model: nn.Module, example_input: Any, blocks: Sequence[str] | None = None) -> SpecCheck:
    """Check every block's spec (or those named in `blocks`) against `model` on `example_input` (a
    batch the model accepts: a tensor, a mapping of keyword arguments, or a tuple of arguments; see
    `call_model`), in eval mode without gradients, the model's mode restored.

    For each block with an identity shortcut (`identity_shortcut`) whose spec says closing leaves the
    identity: (1) with every branch closed the block returns its input, to float rounding; (2) for
    each branch, with the other branches closed, the block's output minus its input at branch scale
    0.5 is half of that at scale 1 (u = x + g·f(x)), which fails when the registered end sits before
    a normalisation or a nonlinearity of the branch; (3) every closed branch was used by the forward
    pass. Every block is fed the input it had in the intact model, so each is checked on its own. A
    block with a projection shortcut or without one is reported, not checked. Statically, no two
    branches of a block may end at one module (`block_branches`).

    Returns a `SpecCheck`. ValueError naming the block, its type and the branch (or all its branches
    for (1)) when a check fails, or naming the block when it did not run on the example.
    """
    find_branches(model)  # the static checks, for every block
    all_blocks = dict(iter_blocks(model))
    if blocks is None:
        chosen = list(all_blocks)
    else:
        missing = [b for b in blocks if b not in all_blocks]
        if missing:
            raise KeyError(f"{missing[0]!r} is not a block of this model; the blocks are {list(all_blocks)[:8]}")
        chosen = list(blocks)
    plain = tuple(n for n in chosen if not has_shortcut(all_blocks[n]))
    projection = tuple(n for n in chosen if n not in plain and not identity_shortcut(all_blocks[n]))
    unverified: dict[str, str] = {}
    targets: list[str] = []
    for name in chosen:
        if name in plain or name in projection:
            continue
        spec = _spec(all_blocks[name])
        refs = block_branches(name, all_blocks[name])
        identity = spec.identity_when_closed
        closes_to_identity = identity(all_blocks[name]) if callable(identity) else identity
        if spec.kind in ("highway", "augmented") or not closes_to_identity:
            why = ("a module acts after the add (a post-norm or post-activation block)" if not closes_to_identity
                   else f"{spec.kind} block")
            unverified.update({ref.name: f"{why}: closing it does not leave the identity" for ref in refs})
            continue
        if spec.prepare is not None:
            spec.prepare(all_blocks[name])
        targets.append(name)
    if not targets:
        return SpecCheck((), unverified, plain, projection)
    refs_of = {name: block_branches(name, all_blocks[name]) for name in targets}
    inputs: dict[str, tuple[str | int, torch.Tensor]] = {}
    outputs: dict[str, torch.Tensor] = {}
    replay = False

    def pre_hook(name: str) -> Callable[..., Any]:
        def hook(_module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
            if not replay:
                found = _input_of(args, kwargs)
                if found is not None:
                    inputs.setdefault(name, (found[0], found[1].detach().clone()))
                return None
            if name not in inputs:
                return None
            where, tensor = inputs[name]
            if where == 0:
                return (tensor, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": tensor}
        return hook

    def post_hook(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: tuple, out: Any) -> None:
            hidden = _hidden(out)
            if hidden is not None:
                outputs[name] = hidden.detach().clone()
        return hook

    def run(factors: Mapping[str, float]) -> tuple[dict[str, torch.Tensor], list[nn.Module]]:
        outputs.clear()
        with scale_branches(model, factors) as standins:
            call_model(model, example_input)
        return dict(outputs), standins

    handles = []
    was_training = model.training
    model.eval()
    try:
        for name in targets:
            handles.append(all_blocks[name].register_forward_pre_hook(pre_hook(name), with_kwargs=True))
            handles.append(all_blocks[name].register_forward_hook(post_hook(name)))
        with torch.no_grad():
            call_model(model, example_input)
            intact = dict(outputs)
            replay = True
            silent = [name for name in targets if name not in inputs or name not in intact]
            if silent:
                raise ValueError(f"block {silent[0]!r} ({type(all_blocks[silent[0]]).__name__}) did not run on the "
                                 f"example input (or its input is not a tensor): its spec cannot be checked")
            every = {ref.name: 0.0 for name in targets for ref in refs_of[name]}
            closed, standins = run(every)
            unused = [ref.name for (ref, s) in zip([r for n in targets for r in refs_of[n]], standins)
                      if not getattr(s, "used", True)]
            if unused:
                raise ValueError(f"branch {unused[0]!r}: its registered end was never called by the forward pass, "
                                 f"so closing it changes nothing; the spec names the wrong module")
            for name in targets:
                ok, difference = _close(closed[name], inputs[name][1])
                if not ok:
                    ends = {ref.key or "(the only one)": ref.end for ref in refs_of[name]}
                    raise ValueError(f"block {name!r} ({type(all_blocks[name]).__name__}): with every branch closed "
                                     f"it does not return its input (largest difference {difference:.3g}); the "
                                     f"branch ends {ends} do not end every residual branch, or the shortcut is not "
                                     f"the identity on this input")
            keys = sorted({ref.key for name in targets for ref in refs_of[name]})
            checked: list[str] = []
            for key in keys:
                others = {ref.name: 0.0 for name in targets for ref in refs_of[name] if ref.key != key}
                mine = [ref for name in targets for ref in refs_of[name] if ref.key == key]
                whole, _ = run(others)
                half, _ = run({**others, **{ref.name: 0.5 for ref in mine}})
                for ref in mine:
                    x = inputs[ref.block][1]
                    full = whole[ref.block].double() - x.double()
                    if float(full.abs().max()) == 0.0:
                        unverified[ref.name] = "its output is exactly zero on the example input"
                        continue
                    ok, difference = _close(half[ref.block].double() - x.double(), 0.5 * full)
                    if not ok:
                        raise ValueError(f"branch {ref.name!r} ({type(all_blocks[ref.block]).__name__}): scaling its "
                                         f"registered end {ref.end!r} by 0.5 does not halve the block's residual "
                                         f"(largest difference {difference:.3g}); the end sits before a "
                                         f"normalisation or a nonlinearity of the branch, where a gate would not "
                                         f"scale the branch: name the module whose output is added to the shortcut")
                    checked.append(ref.name)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return SpecCheck(tuple(checked), unverified, plain, projection)


# ---- the toolkit's own block types, registered like any other ----------------------------------

# u = gate(branch(x)) + shortcut(x): the gate slot ends the branch (nn.Identity when ungated)
for _residual in (ResidualBlock, PreActBlock, PreActUnit):
    register_block(_residual, "gate", gates="gate", shortcut="shortcut", close="gate")
register_block(PlainBlock, "branch", kind="plain")
# u = g·f(x) + (1 − g)·x: closed by g = 0, not by zeroing f(x) (gated-residual-v1 §3)
register_block(AugmentedLayer, "branch", gates="gate", shortcut="shortcut", close="gate", kind="augmented")
# y = H(x)·T(x) + x·(1 − T(x)): closed by T = 0 (highway paper §4.2); T(x) has no value of its own
register_block(HighwayLayer, "branch", gates="gate", shortcut="shortcut", close="gate", kind="highway")
del _residual
