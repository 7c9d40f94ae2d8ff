"""The blocks of any residual network: a registry of block types that tells the analyses how each
computes u = shortcut(x) + g·branch(x), and `add_gates`, the paper's gate put into any of them.

The toolkit's own blocks (ResidualBlock, PreActBlock, AugmentedLayer, HighwayLayer, ...) follow the
block contract of docs/design.md (attributes `branch`, `shortcut`, `gate`). Other libraries' blocks
do not, so a `BlockSpec` describes them from the outside, as PEFT's target modules and timm's
feature hooks do, without changing their code:

* `branches`: where each residual branch ends, as the path (inside the block) of the module whose
  output is added to the shortcut: a transformer layer has two ("attn", "ff"), a ResNet block one
  (named ""). A path may list candidates, the first that names a module wins (timm's ResNet blocks
  end in `drop_path`, else `se`, else `bn2`). The module may return a tuple (Hugging Face attention
  modules return (output, weights)): the branch is its first element.
* `gates`: the gate a branch already carries, if the architecture has one (timm's LayerScale
  `ls1`, ConvNeXt's `gamma`): a module with `value()`, a module holding a `gamma` vector, or a
  parameter.
* `shortcut`: the attribute that holds a projection shortcut (torchvision's `downsample`), None
  when the shortcut is always the identity. A block whose projection is set changes the shape and
  cannot be removed.

Blocks are named by qualified name, and branches by qualified name plus branch name
("encoder.layers.3.ff"); a single-branch block's branch has the block's name.

Built-in entries, matched by class (the class itself for torch's, the fully qualified class name
for the other libraries', so that neither library is imported here): torch's
`nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer` (both `norm_first` settings),
Hugging Face transformers' `GPT2Block`, `LlamaDecoderLayer`, `BertLayer` and `ViTLayer`,
torchvision's and timm's ResNet `BasicBlock` / `Bottleneck`, timm's ViT `Block` and ConvNeXt's
`ConvNeXtBlock`. `register_block` adds another in a few lines.

`add_gates(model, kind)` inserts a gate at the end of every residual branch it finds, by wrapping
the branch's last module in a `GatedOutput` (gated-residual-v2 §2's u = g(k)·f_r(x) + x on any
residual network; ReZero's α; LayerScale's λ). With kind="relu" and k = 1 the model computes the
same function as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence, cast

import torch
from torch import nn

from .conv import PreActBlock, PreActUnit
from .dense import PlainBlock, ResidualBlock
from .gated import AugmentedLayer
from .gates import ScalarGate, VectorGate, cait_layerscale_init
from .highway import HighwayLayer

__all__ = ["BlockSpec", "register_block", "block_spec", "registered_blocks", "NATIVE_BLOCK_TYPES", "GatedOutput",
           "ParameterGate", "BranchRef", "iter_blocks", "block_branches", "gate_parameters", "add_gates",
           "GATE_KINDS"]

# The package's own block types; a user's own block is found when it follows the block contract.
NATIVE_BLOCK_TYPES: tuple[type[nn.Module], ...] = (HighwayLayer, AugmentedLayer, ResidualBlock, PreActBlock,
                                                   PreActUnit, PlainBlock)

End = str | tuple[str, ...]


@dataclass(frozen=True)
class BlockSpec:
    """How one block type computes u = shortcut(x) + g·branch(x) (see the module docstring).

    branches: branch name → path of the module whose output ends that branch (or candidate paths,
    the first that names a module wins); "" names the only branch of a single-branch block.
    gates: branch name → path of the gate the architecture already has (a module with `value()`, a
    module with a `gamma` parameter such as timm's LayerScale, or a parameter such as ConvNeXt's
    `gamma`); a path that holds None or nn.Identity means no gate.
    optional: branches that may be absent (GPT-2's cross-attention): left out when no module ends them.
    shortcut: the attribute holding a projection shortcut (None or nn.Identity there: identity).
    channel_dim: the dimension of the branch output that holds the channels a vector gate scales
    (1 for images (B, C, H, W), -1 for tokens (B, T, C)).
    width: the number of channels of the branch output, for a vector gate; None infers it from the
    block's last normalisation layer.
    prepare: called on the block before a gate is inserted or a lesion hook placed (torch's
    encoder layer turns off its fused inference path, which would skip both).
    """

    branches: Mapping[str, End]
    gates: Mapping[str, str] = field(default_factory=dict)
    optional: frozenset[str] = frozenset()
    shortcut: str | None = None
    channel_dim: int = 1
    width: Callable[[nn.Module], int] | None = None
    prepare: Callable[[nn.Module], None] | None = None


_BY_TYPE: dict[type, BlockSpec] = {}
_BY_NAME: dict[str, BlockSpec] = {}


def _check_path(path: object, what: str) -> None:
    if not isinstance(path, str) or not path or any(not part.isidentifier() and not part.isdigit()
                                                    for part in path.split(".")):
        raise ValueError(f"{what}={path!r}: expected a dotted attribute path inside the block, e.g. 'dropout1' or "
                         f"'attention.output.dropout'")


def register_block(module_type: type[nn.Module] | str, branches: Mapping[str, End] | End, *,
                   gates: Mapping[str, str] | str | None = None, optional: Sequence[str] = (),
                   shortcut: str | None = None, channel_dim: int = 1, width: Callable[[nn.Module], int] | None = None,
                   prepare: Callable[[nn.Module], None] | None = None) -> BlockSpec:
    """Tell the analyses how blocks of `module_type` compute u = shortcut(x) + g·branch(x).

    `module_type`: the class, or its fully qualified name ("timm.models.resnet.BasicBlock") to
    match a library's class without importing it. `branches`: the path of the module that ends the
    only branch ("bn2"), or a mapping branch name → path ({"attn": "dropout1", "ff": "dropout2"});
    a tuple of paths lists candidates. The other arguments are `BlockSpec`'s. A later registration of
    the same type replaces the earlier one. Returns the spec. Example (a block whose forward is
    `x + self.drop(self.mlp(x))`)::

        register_block(MyBlock, "drop")
        register_block("mylib.blocks.Layer", {"attn": "attn_out", "ff": "ff_out"}, channel_dim=-1)
    """
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
    gates = {"": gates} if isinstance(gates, str) else dict(gates or {})
    for name, path in gates.items():
        if name not in branches:
            raise ValueError(f"gates names branch {name!r}; the branches are {sorted(branches)}")
        _check_path(path, f"gates[{name!r}]")
    if shortcut is not None:
        _check_path(shortcut, "shortcut")
    unknown = set(optional) - set(branches)
    if unknown:
        raise ValueError(f"optional names {sorted(unknown)}, which are not branches ({sorted(branches)})")
    if channel_dim not in (1, -1):
        raise ValueError(f"channel_dim={channel_dim!r}: accepted values 1 (images, (B, C, H, W)) or -1 (tokens, "
                         f"(B, T, C))")
    spec = BlockSpec(dict(branches), gates, frozenset(optional), shortcut, channel_dim, width, prepare)
    if isinstance(module_type, str):
        if "." not in module_type:
            raise ValueError(f"module_type={module_type!r}: give the class or its fully qualified name, e.g. "
                             f"'timm.models.resnet.BasicBlock'")
        _BY_NAME[module_type] = spec
    elif isinstance(module_type, type) and issubclass(module_type, nn.Module):
        _BY_TYPE[module_type] = spec
    else:
        raise TypeError(f"module_type={module_type!r}: expected an nn.Module subclass or its qualified name")
    return spec


def block_spec(module: nn.Module) -> BlockSpec | None:
    """The registered spec of `module`'s class or of its nearest registered base class, None when
    there is none. Classes of other libraries match by fully qualified name."""
    for cls in type(module).__mro__:
        if cls in _BY_TYPE:
            return _BY_TYPE[cls]
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in _BY_NAME:
            return _BY_NAME[name]
    return None


def registered_blocks() -> list[str]:
    """The qualified names of every registered block class, sorted (for the docs and error messages)."""
    return sorted([f"{t.__module__}.{t.__qualname__}" for t in _BY_TYPE] + list(_BY_NAME))


def _follows_contract(module: nn.Module) -> bool:
    gate = getattr(module, "gate", None)
    return (isinstance(gate, nn.Module) and isinstance(getattr(module, "branch", None), nn.Module)
            and hasattr(module, "shortcut"))


def is_block(module: nn.Module) -> bool:
    """True for a registered block type, a native block type and any module following the block contract."""
    return block_spec(module) is not None or isinstance(module, NATIVE_BLOCK_TYPES) or _follows_contract(module)


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


class GatedOutput(nn.Module):
    """A branch's last module followed by a gate: forward returns g·module(...) (the first element
    scaled when the module returns a tuple, as Hugging Face attention modules do). A scalar g scales
    the whole output, a vector g the channels along `channel_dim`. What `add_gates` inserts; the
    wrapped module stays reachable as `module`, the gate as `gate`."""

    def __init__(self, module: nn.Module, gate: nn.Module, channel_dim: int = 1) -> None:
        super().__init__()
        self.module = module
        self.gate = gate
        self.channel_dim = channel_dim

    def _scale(self, h: torch.Tensor) -> torch.Tensor:
        g = cast(Callable[[], torch.Tensor], self.gate.value)()
        if g.dim() == 0:
            return g * h
        shape = [1] * h.dim()
        shape[self.channel_dim] = -1
        return g.view(shape) * h

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*args, **kwargs)
        if isinstance(out, tuple):
            return (self._scale(out[0]), *out[1:])
        return self._scale(out)


@dataclass(frozen=True)
class BranchRef:
    """One residual branch of a block: `name` ("encoder.layers.3.ff", or the block's name for a
    single-branch block), `block` (the block's qualified name), `end` (the qualified name of the
    module whose output ends the branch; None for the toolkit's contract blocks, which are closed
    through their `gate` attribute) and `gate` (an object with `value()`, or None when ungated)."""

    name: str
    block: str
    end: str | None
    gate: Any


def _resolve(root: nn.Module, path: str) -> Any:
    value: Any = root
    for part in path.split("."):
        value = getattr(value, part, None)  # a numbered child of a ModuleList is an attribute too
        if value is None:
            return None
    return value


def _end_path(block: nn.Module, end: End) -> str | None:
    for path in (end if isinstance(end, tuple) else (end,)):
        if isinstance(_resolve(block, path), nn.Module):
            return path
    return None


def _as_gate(found: Any) -> Any:
    if isinstance(found, nn.Identity) or found is None:
        return None
    if isinstance(found, nn.Module) and callable(getattr(found, "value", None)):
        return found
    if isinstance(found, nn.Module) and isinstance(getattr(found, "gamma", None), torch.Tensor):
        return ParameterGate(cast(torch.Tensor, found.gamma))  # timm's LayerScale: x * gamma
    if isinstance(found, torch.Tensor):
        return ParameterGate(found)
    return None


def _contract_gate(block: nn.Module) -> Any:
    gate = getattr(block, "gate", None)
    return gate if isinstance(gate, nn.Module) and callable(getattr(gate, "value", None)) else None


def block_branches(name: str, block: nn.Module) -> list[BranchRef]:
    """The residual branches of one block (see `BranchRef`), in the spec's order. A contract block
    (the toolkit's own) has one branch named like the block, closed through its `gate` attribute.
    ValueError naming the block and the path when a required branch's module is missing."""
    spec = block_spec(block)
    if spec is None:
        return [BranchRef(name, name, None, _contract_gate(block))]
    refs = []
    for branch, end in spec.branches.items():
        path = _end_path(block, end)
        full = f"{name}.{branch}" if branch and name else (branch or name)
        if path is None:
            if branch in spec.optional:
                continue
            raise ValueError(f"block {name!r} ({type(block).__name__}): no module at {end!r} ends branch "
                             f"{branch or '(the only one)'!r}; the registered spec does not fit this block")
        module = _resolve(block, path)
        end_name = f"{name}.{path}" if name else path
        gate: Any
        if isinstance(module, GatedOutput):
            gate = module.gate
        else:
            gate = _as_gate(_resolve(block, spec.gates[branch])) if branch in spec.gates else None
        refs.append(BranchRef(full, name, end_name, gate))
    return refs


def gate_parameters(model: nn.Module) -> list[torch.Tensor]:
    """Every gate parameter of `model`, found by type: the k of every ScalarGate and VectorGate
    (the toolkit's, and those `add_gates` inserted) and the gates registered block specs name
    (timm's LayerScale γ, ConvNeXt's γ). What `param_groups` keeps out of weight decay."""
    found: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, (ScalarGate, VectorGate)):
            for p in module.parameters():
                found[id(p)] = p
    for name, block in iter_blocks(model):
        for ref in block_branches(name, block):
            if isinstance(ref.gate, ParameterGate) and isinstance(ref.gate.k, nn.Parameter):
                found[id(ref.gate.k)] = ref.gate.k
    return list(found.values())


GATE_KINDS = ("relu", "rezero", "layerscale")


def _norm_width(block: nn.Module) -> int | None:
    width = None
    for module in block.modules():
        weight = getattr(module, "weight", None)
        if "norm" in type(module).__name__.lower() and isinstance(weight, torch.Tensor) and weight.dim() == 1:
            width = weight.shape[0]
    return width


def _new_gate(kind: str, k_init: float | None, block: nn.Module, spec: BlockSpec | None, depth: int,
              where: str) -> nn.Module:
    if kind == "relu":
        return ScalarGate(1.0 if k_init is None else k_init, "relu")
    if kind == "rezero":
        return ScalarGate(0.0 if k_init is None else k_init, "identity")
    width = spec.width(block) if spec is not None and spec.width is not None else _norm_width(block)
    if width is None:
        raise ValueError(f"add_gates(kind='layerscale'): cannot tell how many channels branch {where!r} outputs; "
                         f"register its block with width=... (register_block)")
    return VectorGate(width, cait_layerscale_init(depth) if k_init is None else k_init, "identity")


def add_gates(model: nn.Module, kind: str = "relu", *, k_init: float | None = None,
              depth: int | None = None) -> nn.Module:
    """Insert a gate at the end of every residual branch of `model`, in place, and return the model.

    kind: "relu" (gated-residual-v2: g(k) = ReLU(k), one scalar k per branch, k = 1 unless `k_init`
    says otherwise, so that the model computes the same function as before), "rezero" (ReZero's
    α, g the identity, α = 0 unless `k_init`), or "layerscale" (LayerScale's λ ∈ R^C, g the
    identity, λ = CaiT's ε for `depth` unless `k_init`; `depth` defaults to the number of blocks, as
    CaiT counts transformer layers). Registered blocks get a `GatedOutput` around their branch's
    last module; the toolkit's ungated residual blocks get the gate in their `gate` attribute.
    The model's `gates_added` attribute records what was done ({"kind", "k_init", "branches"}).

    ValueError naming the accepted values for an unknown kind, naming the model when it has no
    residual branch, and naming the branch when one already has a gate (the toolkit's gate, an
    earlier add_gates, timm's LayerScale): gates are not stacked.
    """
    if kind not in GATE_KINDS:
        raise ValueError(f"kind={kind!r}; accepted values: {list(GATE_KINDS)}")
    if k_init is not None and (isinstance(k_init, bool) or not isinstance(k_init, (int, float))):
        raise TypeError(f"k_init={k_init!r}: expected a number or None")
    blocks = [(name, block) for name, block in iter_blocks(model)
              if block_spec(block) is not None or getattr(block, "shortcut", None) is not None]
    blocks = [(n, b) for n, b in blocks if not isinstance(b, HighwayLayer)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no residual branch to gate: no registered block type "
                         f"({len(registered_blocks())} registered: throughway.layers.registered_blocks()) and no "
                         f"residual block of the toolkit; register its block type with register_block")
    depth = len(blocks) if depth is None else int(depth)
    plan: list[tuple[str, nn.Module, BranchRef, BlockSpec | None]] = []
    for name, block in blocks:
        spec = block_spec(block)
        for ref in block_branches(name, block):
            if ref.gate is not None or (spec is None and not isinstance(getattr(block, "gate", None), nn.Identity)):
                raise ValueError(f"branch {ref.name!r} already has a gate ({type(ref.gate).__name__}); add_gates "
                                 f"gates ungated residual branches only")
            plan.append((name, block, ref, spec))
    added = []
    for _name, block, ref, spec in plan:
        gate = _new_gate(kind, k_init, block, spec, depth, ref.name)
        reference = next(iter(block.parameters()), None)
        if reference is not None:
            gate.to(device=reference.device, dtype=reference.dtype)
        if spec is None:
            block.gate = gate
        else:
            if spec.prepare is not None:
                spec.prepare(block)
            assert ref.end is not None
            parent_name, _, key = ref.end.rpartition(".")
            parent = model.get_submodule(parent_name)
            parent._modules[key] = GatedOutput(parent._modules[key], gate, spec.channel_dim)  # type: ignore[arg-type]
        added.append(ref.name)
    record = {"kind": kind, "k_init": k_init, "branches": added}
    object.__setattr__(model, "gates_added", record)
    return model


# ---- built-in entries ---------------------------------------------------------------------------

def _torch_encoder_prepare(layer: nn.Module) -> None:
    # nn.TransformerEncoderLayer's fused inference path (eval mode, no grad) computes the layer in one
    # kernel from its weights and never calls dropout1/dropout2, so an inserted gate would be skipped
    # silently. The path requires activation_relu_or_gelu to be truthy; 0 turns it off (the layer's
    # own forward is unchanged otherwise).
    object.__setattr__(layer, "activation_relu_or_gelu", 0)


def _linear2_width(layer: nn.Module) -> int:
    return int(cast(nn.Linear, layer.linear2).out_features)


register_block(nn.TransformerEncoderLayer, {"attn": "dropout1", "ff": "dropout2"}, channel_dim=-1,
               width=_linear2_width, prepare=_torch_encoder_prepare)
register_block(nn.TransformerDecoderLayer, {"attn": "dropout1", "cross": "dropout2", "ff": "dropout3"},
               channel_dim=-1, width=_linear2_width)
# Hugging Face transformers (attention modules return (output, weights): the branch is the first element)
register_block("transformers.models.gpt2.modeling_gpt2.GPT2Block", {"attn": "attn", "cross": "crossattention",
                                                                    "ff": "mlp"},
               optional=("cross",), channel_dim=-1)
register_block("transformers.models.llama.modeling_llama.LlamaDecoderLayer", {"attn": "self_attn", "ff": "mlp"},
               channel_dim=-1)
# BERT is post-norm: LayerNorm(x + dropout(dense(h))) inside its output modules; a closed branch gives LayerNorm(x)
register_block("transformers.models.bert.modeling_bert.BertLayer",
               {"attn": "attention.output.dropout", "cross": "crossattention.output.dropout", "ff": "output.dropout"},
               optional=("cross",), channel_dim=-1)
# transformers 5 ends the feed-forward branch in `mlp`; 4.x in `output.dropout` (ViTOutput adds the shortcut)
register_block("transformers.models.vit.modeling_vit.ViTLayer", {"attn": "attention", "ff": ("mlp", "output.dropout")},
               channel_dim=-1)
# torchvision's ResNet blocks: out = bn2(conv2(...)); out += downsample(x) or x; relu
register_block("torchvision.models.resnet.BasicBlock", "bn2", shortcut="downsample")
register_block("torchvision.models.resnet.Bottleneck", "bn3", shortcut="downsample")
# timm's ResNet blocks: the branch ends in drop_path, else se, else the last BatchNorm (None where absent)
register_block("timm.models.resnet.BasicBlock", ("drop_path", "se", "bn2"), shortcut="downsample")
register_block("timm.models.resnet.Bottleneck", ("drop_path", "se", "bn3"), shortcut="downsample")
# timm's ViT block: x + drop_path1(ls1(attn(norm1(x)))); ls1/ls2 are LayerScale (gamma) or nn.Identity
register_block("timm.models.vision_transformer.Block", {"attn": "drop_path1", "ff": "drop_path2"},
               gates={"attn": "ls1", "ff": "ls2"}, channel_dim=-1)
# timm's ConvNeXt block: drop_path(x * gamma) + shortcut(x); gamma is a parameter or None
register_block("timm.models.convnext.ConvNeXtBlock", "drop_path", gates="gamma", shortcut="shortcut")
