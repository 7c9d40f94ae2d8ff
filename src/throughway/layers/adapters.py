"""The paper's gate put into any residual network, and taken out again: `add_gates`, `fold_gates`,
`restore_gates`.

`add_gates(model, kind)` gives every residual branch that `find_branches` lists (the toolkit's
blocks and every registered library block) a gate: gated-residual-v2 §2's u = g(k)·f_r(x) + x on any
residual network, ReZero's α or LayerScale's λ. It never renames what it finds (as PEFT's
injection keeps the original weights under their own names): a branch whose block has an empty gate
slot the forward already calls (the toolkit's `gate`, timm's `ls1`) gets the gate there; any other
branch gets a forward hook on the module that ends it, and the gate itself lives under the block's
`branch_gates` ("layers.3.branch_gates.ff.k"). So a pretrained checkpoint loads into a gated model
(`load_state_dict(..., strict=False)` misses only the gates), and a gated model saved by its library
(`save_pretrained`) comes back with `restore_gates` after `from_pretrained`. `fold_gates` multiplies
each gate into the Linear or convolution that produces its branch and removes the gate, as PEFT's
merge does. With kind="relu" and k = 1 the gated model computes the same function as before.

What add_gates did travels with a saved model as its `gates_added` record (train.checkpoint's model file):
`check_gates_record` checks one read from a file, `with_recorded_gates` adds its gates again to the model
the file's config rebuilds, and `legacy_gate_renames` names the tensors of files saved before the gates
kept the original names.

The library block types the toolkit knows are registered in `layers.known_blocks`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Container, Mapping, Sequence, cast

import torch
from torch import nn

from . import known_blocks  # noqa: F401  (registers the library block types)
from .blocks import (ADDED_GATES, BlockSpec, BranchRef, gate_key, qualified_name, resolve_path, block_branches,
                     block_spec, call_model, check_blocks, find_branches, has_shortcut, iter_blocks,
                     registered_blocks)
from .gates import ScalarGate, VectorGate, cait_layerscale_init

__all__ = ["GATE_KINDS", "GateHook", "add_gates", "fold_gates", "restore_gates", "gated_branch_targets",
           "CONFIG_RECORD", "legacy_gate_keys", "legacy_gate_renames", "check_gates_record", "with_recorded_gates"]

GATE_KINDS = ("relu", "rezero", "layerscale")
# The attribute of a Hugging Face config under which add_gates records what it did, so that it travels
# with save_pretrained into config.json and restore_gates can redo it after from_pretrained.
CONFIG_RECORD = "throughway_gates"


class GateHook:
    """A forward hook that multiplies the output of a branch's last module by the gate's g (the first
    element of a tuple output, as Hugging Face attention modules return): a scalar g scales the whole
    output, a vector g the channels along `channel_dim`. An object rather than a closure, so that a
    deep copy of the model hooks its own copy of the gate."""

    def __init__(self, gate: nn.Module, channel_dim: int) -> None:
        self.gate = gate
        self.channel_dim = channel_dim

    def _scale(self, h: torch.Tensor) -> torch.Tensor:
        g = cast(Callable[[], torch.Tensor], self.gate.value)()
        if g.dim() == 0:
            return g * h
        shape = [1] * h.dim()
        shape[self.channel_dim] = -1
        return g.view(shape) * h

    def __call__(self, _module: nn.Module, _args: tuple, out: Any) -> Any:
        if isinstance(out, tuple):
            return (self._scale(out[0]), *out[1:])
        return self._scale(out)


def _norm_width(block: nn.Module) -> int | None:
    width = None
    for module in block.modules():
        weight = getattr(module, "weight", None)
        if "norm" in type(module).__name__.lower() and isinstance(weight, torch.Tensor) and weight.dim() == 1:
            width = weight.shape[0]
    return width


def _new_gate(kind: str, k_init: float | None, block: nn.Module, spec: BlockSpec, depth: int, where: str) -> nn.Module:
    if kind == "relu":
        return ScalarGate(1.0 if k_init is None else k_init, "relu")
    if kind == "rezero":
        return ScalarGate(0.0 if k_init is None else k_init, "identity")
    width = spec.width(block) if spec.width is not None else _norm_width(block)
    if width is None:
        raise ValueError(f"add_gates(kind='layerscale'): cannot tell how many channels branch {where!r} outputs; "
                         f"register its block with width=... (register_block)")
    return VectorGate(width, cait_layerscale_init(depth) if k_init is None else k_init, "identity", spec.channel_dim)


def _check_arguments(kind: str, k_init: float | None, depth: int | None) -> None:
    if kind not in GATE_KINDS:
        raise ValueError(f"kind={kind!r}; accepted values: {list(GATE_KINDS)}")
    if k_init is not None and (isinstance(k_init, bool) or not isinstance(k_init, (int, float))):
        raise TypeError(f"k_init={k_init!r}: expected a number or None")
    if k_init is not None and not math.isfinite(k_init):
        raise ValueError(f"k_init={k_init!r}: expected a finite number (or None for the kind's default)")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ValueError(f"depth={depth!r}: expected a whole number >= 1 (the network's residual blocks, as CaiT "
                         f"counts layers for LayerScale's ε), or None to count them")


def _gateable(model: nn.Module) -> list[BranchRef]:
    """The residual branches add_gates can gate: those of blocks with a shortcut whose spec is residual."""
    out = []
    for name, block in iter_blocks(model):
        spec = block_spec(block)
        if spec is not None and spec.kind == "residual" and has_shortcut(block):
            out.extend(block_branches(name, block))
    return out


def gated_branch_targets(refs: Sequence[BranchRef],
                         targets: Sequence[str] | Callable[[BranchRef], bool] | None) -> list[BranchRef]:
    """The branches of `refs` that `targets` selects (as PEFT's `target_modules`): None selects all; a
    sequence of strings selects each branch whose name, block name or key ("ff", "attn") equals one of
    them; a callable is asked of each `BranchRef`. ValueError naming a string that selects nothing,
    with the accepted values."""
    if targets is None:
        return list(refs)
    if callable(targets):
        return [ref for ref in refs if targets(ref)]
    if isinstance(targets, str) or not isinstance(targets, Sequence):
        raise TypeError(f"targets={targets!r}: expected a list of branch names, block names or branch keys "
                        f"(e.g. ['ff']), a callable BranchRef -> bool, or None")
    chosen: list[BranchRef] = []
    for target in targets:
        hits = [ref for ref in refs if target in (ref.name, ref.block, ref.key)]
        if not hits:
            keys = sorted({ref.key for ref in refs if ref.key})
            shown = [ref.name for ref in refs][:4]
            raise ValueError(f"targets: {target!r} names no residual branch; accepted values are branch names "
                             f"({shown}...), block names, or branch keys {keys}")
        chosen.extend(ref for ref in hits if ref not in chosen)
    return [ref for ref in refs if ref in chosen]


def _refresh_compiled() -> None:
    # A model compiled before the hooks existed keeps running its old graph: dynamo does not guard on
    # hooks (torch._dynamo.config.skip_nnmodule_hook_guards). Dropping dynamo's caches makes every compiled
    # wrapper trace again, with the gates, at its next call.
    import torch._dynamo

    if torch._dynamo.utils.counters["stats"]["unique_graphs"]:
        torch._dynamo.reset()


def _gates_home(model: nn.Module, ref: BranchRef) -> nn.ModuleDict:
    block = model.get_submodule(ref.block)
    home = block._modules.get(ADDED_GATES)
    if home is None:
        if hasattr(block, ADDED_GATES):
            raise ValueError(f"block {ref.block!r} ({type(block).__name__}) already has an attribute "
                             f"{ADDED_GATES!r}, where add_gates keeps the gates it adds")
        home = nn.ModuleDict()
        block.add_module(ADDED_GATES, home)
    return cast(nn.ModuleDict, home)


def _slot(model: nn.Module, ref: BranchRef) -> tuple[nn.Module, str] | None:
    """(parent, attribute) of the branch's empty gate slot, when its spec names one holding nn.Identity."""
    path = ref.spec.gates.get(ref.key)
    if path is None:
        return None
    block = model.get_submodule(ref.block)
    if not isinstance(resolve_path(block, path), nn.Identity):
        return None
    parent_path, _, attribute = path.rpartition(".")
    return (block.get_submodule(parent_path) if parent_path else block), attribute


def _hf_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    return config if config is not None and callable(getattr(config, "to_dict", None)) else None


def add_gates(model: nn.Module, kind: str = "relu", *, k_init: float | None = None, depth: int | None = None,
              targets: Sequence[str] | Callable[[BranchRef], bool] | None = None,
              example_input: Any = None) -> nn.Module:
    """Give every residual branch of `model` (or those `targets` selects) a gate, in place; return the model.

    kind: "relu" (gated-residual-v2: g(k) = ReLU(k), one scalar k per branch, k = 1 unless `k_init`
    says otherwise, so that the model computes the same function as before), "rezero" (ReZero's
    α, g the identity, α = 0 unless `k_init`), or "layerscale" (LayerScale's λ ∈ R^C, g the
    identity, λ = CaiT's ε for `depth` unless `k_init`). `depth` defaults to the number of residual
    blocks of the model, as CaiT counts transformer layers (one convention for every network: the
    toolkit's mlp_layerscale counts its blocks the same way). `targets`: see `gated_branch_targets`.

    Original parameter names never change: an empty gate slot the block's forward calls (an
    nn.Identity at the spec's gate path) receives the gate; otherwise a `GateHook` on the branch's
    last module applies it and the gate lives in the block's `branch_gates` ModuleDict. A model that
    torch.compile compiled earlier traces again at its next call. With `example_input`, the blocks'
    specs are checked on it first (`check_blocks`). The model's `gates_added` attribute records what
    was done ({"kind", "k_init", "depth", "branches"}); a Hugging Face model's config records it too
    (`CONFIG_RECORD`), so it travels with `save_pretrained`.

    ValueError naming the argument and the accepted values for an unknown kind, a k_init that is not
    finite or a depth that is not a whole number >= 1; naming the model when it has no residual
    branch; naming the branch when one already has a gate (the toolkit's gate, an earlier add_gates,
    timm's LayerScale): gates are not stacked.
    """
    _check_arguments(kind, k_init, depth)
    gateable = _gateable(model)
    if not gateable:
        raise ValueError(f"{type(model).__name__} has no residual branch to gate: no registered block type "
                         f"({len(registered_blocks())} registered: throughway.layers.registered_blocks()) with a "
                         f"shortcut; register its block type with register_block")
    chosen = gated_branch_targets(gateable, targets)
    for ref in chosen:
        if ref.gate is not None:
            raise ValueError(f"branch {ref.name!r} already has a gate ({type(ref.gate).__name__}); add_gates gates "
                             f"ungated residual branches only")
    if example_input is not None:
        check_blocks(model, example_input, sorted({ref.block for ref in chosen}, key=list(dict(iter_blocks(model))).index))
    depth = len({ref.block for ref in gateable}) if depth is None else depth
    hooked = False
    for ref in chosen:
        block = model.get_submodule(ref.block)
        gate = _new_gate(kind, k_init, block, ref.spec, depth, ref.name)
        reference = next(iter(block.parameters()), None)
        if reference is not None:
            gate.to(device=reference.device, dtype=reference.dtype)
        if ref.spec.prepare is not None:
            ref.spec.prepare(block)
        slot = _slot(model, ref)
        if slot is not None:
            setattr(slot[0], slot[1], gate)
            continue
        _gates_home(model, ref)[gate_key(ref.key)] = gate
        model.get_submodule(ref.end).register_forward_hook(GateHook(gate, ref.spec.channel_dim))
        hooked = True
    if hooked:
        _refresh_compiled()
    record = {"kind": kind, "k_init": k_init, "depth": depth, "branches": [ref.name for ref in chosen]}
    object.__setattr__(model, "gates_added", record)
    config = _hf_config(model)
    if config is not None:
        setattr(config, CONFIG_RECORD, record)
    return model


def _scale_weights(module: nn.Module, g: torch.Tensor, where: str) -> None:
    """weight and bias of a Linear, a convolution or Hugging Face's Conv1D (weight (in, out)) times g."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"fold_gates: {where} ({type(module).__name__}) has no weight to fold the gate into")
    if "StdConv" in type(module).__name__:
        # timm's weight-standardised convolutions normalise their weight at every call: a scale folded
        # into it would be undone, silently
        raise ValueError(f"fold_gates: {where} is a {type(module).__name__}, which standardises its weight at "
                         f"every call; a gate folded into it would be lost")
    bias = getattr(module, "bias", None)
    g = g.to(dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        if g.dim() == 0:
            weight.mul_(g)
        elif type(module).__name__ == "Conv1D":  # transformers' Conv1D: y = x @ W + b, W of shape (in, out)
            weight.mul_(g.view(1, -1))
        elif isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) or weight.dim() == 1:
            # output channels first; a norm's γ (BatchNorm, LayerNorm, RMSNorm: weight·x̂ + bias) is (C,)
            weight.mul_(g.view(-1, *([1] * (weight.dim() - 1))))
        else:
            raise ValueError(f"fold_gates: {where} is a {type(module).__name__}; a vector gate folds into a Linear, "
                             f"a convolution, a BatchNorm or transformers' Conv1D")
        if isinstance(bias, torch.Tensor):
            bias.mul_(g)


def _remove_gate(model: nn.Module, ref: BranchRef) -> Callable[[], None]:
    """Take an add_gates gate out of the model (its hook and its module, or the slot back to
    nn.Identity); return the call that puts it back."""
    block = model.get_submodule(ref.block)
    gate = cast(nn.Module, ref.gate)
    home = block._modules.get(ADDED_GATES)
    if isinstance(home, nn.ModuleDict) and gate_key(ref.key) in home:
        end = model.get_submodule(ref.end)
        for key, hook in list(end._forward_hooks.items()):
            if isinstance(hook, GateHook) and hook.gate is gate:
                del end._forward_hooks[key]
        del home[gate_key(ref.key)]
        if not len(home):
            del block._modules[ADDED_GATES]

        def put_back() -> None:
            _gates_home(model, ref)[gate_key(ref.key)] = gate
            end.register_forward_hook(GateHook(gate, ref.spec.channel_dim))
        return put_back
    path = ref.spec.gates[ref.key]
    parent_path, _, attribute = path.rpartition(".")
    parent = block.get_submodule(parent_path) if parent_path else block
    setattr(parent, attribute, nn.Identity())
    return lambda: setattr(parent, attribute, gate)


def fold_gates(model: nn.Module, targets: Sequence[str] | Callable[[BranchRef], bool] | None = None, *,
               example_input: Any = None) -> nn.Module:
    """Multiply each gate `add_gates` inserted (or those `targets` selects among them) into the Linear or
    convolution that produces its branch (the spec's `fold` path) and remove the gate, in place, as
    PEFT's merge does; return the model. The function is unchanged up to float rounding: the branch
    output g·(W h + b) becomes (g W) h + g b, and a relu gate's g = relu(k) is folded as its value.

    With `example_input`, the outputs before and after are compared and, if they differ beyond float
    rounding, the weights and the gates are put back and ValueError names the branches (the spec's
    fold path is wrong). ValueError naming the branch when a targeted branch has no gate from add_gates
    or its spec has no fold path (register_block(..., fold=...))."""
    record = getattr(model, "gates_added", None)
    added = set(record["branches"]) if isinstance(record, dict) else set()
    branches = [ref for ref in find_branches(model).values() if ref.name in added and ref.gate is not None]
    if not branches:
        raise ValueError(f"{type(model).__name__} has no gates that add_gates inserted; fold_gates folds those")
    chosen = gated_branch_targets(branches, targets)
    for ref in chosen:
        if ref.key not in ref.spec.fold:
            raise ValueError(f"branch {ref.name!r}: its block's spec names no Linear or convolution to fold the gate "
                             f"into; register the block with fold={{{ref.key!r}: 'path.to.last_linear'}}")
    before = None
    if example_input is not None:
        with torch.no_grad():
            before = _first_tensor(call_model(model, example_input))
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    undo: list[Callable[[], None]] = []

    def put_everything_back() -> None:
        with torch.no_grad():
            for tensor, copy in saved:
                tensor.copy_(copy)
        for put_back in reversed(undo):
            put_back()

    try:
        for ref in chosen:
            where = qualified_name(ref.block, ref.spec.fold[ref.key])
            target = model.get_submodule(where)
            for tensor in (getattr(target, "weight", None), getattr(target, "bias", None)):
                if isinstance(tensor, torch.Tensor):
                    saved.append((tensor, tensor.detach().clone()))
            g = cast(Callable[[], torch.Tensor], ref.gate.value)().detach()
            _scale_weights(target, g, where)
            undo.append(_remove_gate(model, ref))
    except Exception:
        put_everything_back()  # all or nothing: a branch that cannot fold leaves the model as it was
        raise
    if before is not None:
        with torch.no_grad():
            after = _first_tensor(call_model(model, example_input))
        difference = float((after.double() - before.double()).abs().max())
        if difference > 1e-4 * max(float(before.abs().max()), 1.0):
            put_everything_back()
            raise ValueError(f"fold_gates: folding changed the output by up to {difference:.3g}; the fold paths of "
                             f"{[ref.name for ref in chosen][:4]} do not produce their branches (weights and gates "
                             f"put back)")
    folded = {ref.name for ref in chosen}
    remaining = [name for name in cast(dict, record)["branches"] if name not in folded]
    if remaining:
        object.__setattr__(model, "gates_added", {**cast(dict, record), "branches": remaining})
    else:
        model.__dict__.pop("gates_added", None)
    config = _hf_config(model)
    if config is not None:
        if remaining:
            setattr(config, CONFIG_RECORD, model.gates_added)
        elif hasattr(config, CONFIG_RECORD):
            delattr(config, CONFIG_RECORD)
    _refresh_compiled()
    return model


def _first_tensor(out: Any) -> torch.Tensor:
    for candidate in (out, getattr(out, "last_hidden_state", None), getattr(out, "logits", None)):
        if isinstance(candidate, torch.Tensor):
            return candidate
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}; fold_gates compares a tensor output (or one with "
                    f".logits / .last_hidden_state)")


def _read_tensors(source: str | Path | Mapping[str, torch.Tensor], keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """The tensors `keys` from a state dict, a .safetensors file or a save_pretrained directory (one file
    or shards listed in model.safetensors.index.json). KeyError naming the file and the missing keys."""
    if isinstance(source, Mapping):
        missing = [k for k in keys if k not in source]
        if missing:
            raise KeyError(f"the state dict has no {missing[:4]}: it was not saved from a gated model")
        return {k: source[k] for k in keys}
    from safetensors import safe_open

    path = Path(source)
    files: dict[str, Path] = {}
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index}: weight_map is not a mapping")
            files = {k: path / str(weight_map[k]) for k in keys if k in weight_map}
        elif (path / "model.safetensors").is_file():
            files = {k: path / "model.safetensors" for k in keys}
        else:
            raise FileNotFoundError(f"{path} holds neither model.safetensors nor model.safetensors.index.json")
    elif path.is_file():
        files = {k: path for k in keys}
    else:
        raise FileNotFoundError(f"{path}: no such file or directory")
    out: dict[str, torch.Tensor] = {}
    for file in sorted(set(files.values())):
        if file.parent.resolve() != (path if path.is_dir() else path.parent).resolve():
            raise ValueError(f"{file}: a shard outside {path} (the index names a path elsewhere)")
        with safe_open(str(file), framework="pt") as handle:
            available = set(handle.keys())
            for key in [k for k, f in files.items() if f == file]:
                if key in available:
                    out[key] = handle.get_tensor(key)
    missing = [k for k in keys if k not in out]
    if missing:
        raise KeyError(f"{path}: no tensors {missing[:4]}; it was not saved from a model gated by add_gates")
    return out


def _saved_names(model: nn.Module, parameters: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """The name each gate parameter has in a file the model's library saved: its own name, or for a Hugging
    Face model the name its save_pretrained writes (transformers 5 converts some models' names on the way
    out: ViT's "layers.0" is saved as "encoder.layer.0"), read from the library's own conversion."""
    names = {key: key for key in parameters}
    if _hf_config(model) is None:
        return names
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4.x saves under the model's own names
        return names
    for key, parameter in parameters.items():
        converted = revert_weight_conversion(model, {key: parameter.detach()})  # type: ignore[arg-type]
        if len(converted) == 1:
            names[key] = next(iter(converted))
    return names


def restore_gates(model: nn.Module, source: str | Path | Mapping[str, torch.Tensor],
                  record: Mapping[str, Any] | None = None) -> nn.Module:
    """Re-add the gates a saved gated model had and load their values, in place; return the model.

    The one call after a library's own loading, e.g.::

        model = AutoModelForCausalLM.from_pretrained(path)   # the gates' tensors are skipped as unexpected
        restore_gates(model, path)                           # the same function as the model that was saved

    `source`: the save_pretrained directory (model.safetensors or its shards), a .safetensors file, or a
    state dict. `record`: what add_gates did ({"kind", "k_init", "depth", "branches"}); default: the one a
    Hugging Face config carries (`CONFIG_RECORD`, written into config.json by save_pretrained) or the
    model's `gates_added`. ValueError when there is no record; KeyError naming the file and the gate
    tensors it lacks."""
    if record is None:
        config = _hf_config(model)
        record = getattr(config, CONFIG_RECORD, None) if config is not None else None
    if not isinstance(record, Mapping) or "kind" not in record or "branches" not in record:
        raise ValueError(f"restore_gates: no record of the gates for {type(model).__name__}: pass record= (the "
                         f"gates_added of the saved model) or load a config saved after add_gates "
                         f"(config.{CONFIG_RECORD})")
    names = list(record["branches"])
    gated = {ref.name for ref in find_branches(model).values() if ref.gate is not None}
    if not set(names) <= gated:
        add_gates(model, str(record["kind"]), k_init=record.get("k_init"), depth=record.get("depth"), targets=names)
    keys: dict[str, nn.Parameter] = {}
    branches = find_branches(model)
    for name in names:
        ref = branches[name]
        gate = ref.gate
        for parameter_name, parameter in cast(nn.Module, gate).named_parameters():
            keys[f"{ref.gate_path}.{parameter_name}"] = parameter
    saved_names = _saved_names(model, keys)
    found = _read_tensors(source, list(saved_names.values()))
    tensors = {key: found[saved_names[key]] for key in keys}
    with torch.no_grad():
        for key, parameter in keys.items():
            saved = tensors[key]
            if saved.shape != parameter.shape:
                raise ValueError(f"{key}: saved shape {tuple(saved.shape)}, the gate's is {tuple(parameter.shape)}")
            parameter.copy_(saved)
    return model


def check_gates_record(record: Any, source: str) -> dict[str, Any]:
    """A `gates_added` record read from a file (untrusted), checked: {"kind": one of GATE_KINDS,
    "k_init": a finite number or None, "depth": a whole number >= 1 or None, "branches": a list of
    branch names}. ValueError naming `source` and the field otherwise."""
    if not isinstance(record, dict):
        raise ValueError(f"{source}: gates_added is not an object")
    kind, k_init, depth, branches = (record.get("kind"), record.get("k_init"), record.get("depth"),
                                     record.get("branches"))
    if not isinstance(branches, list) or not all(isinstance(b, str) for b in branches):
        raise ValueError(f"{source}: gates_added.branches is not a list of branch names")
    try:
        _check_arguments(cast(str, kind), k_init, depth)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: gates_added: {exc}") from None
    return {"kind": kind, "k_init": k_init, "depth": depth, "branches": branches}


def with_recorded_gates(model: nn.Module, record: dict[str, Any] | None) -> nn.Module:
    """`model` (just built by create_model) with the gates a file's `gates_added` record (`check_gates_record`)
    says add_gates added after create_model, in place; unchanged when there is no record or when the factory
    itself gated it (vit_patch(gate=...) records `gates_added` on the model it returns)."""
    if record is not None and getattr(model, "gates_added", None) is None:
        add_gates(model, record["kind"], k_init=record["k_init"], depth=record["depth"], targets=record["branches"])
    return model


def legacy_gate_keys(model: nn.Module) -> dict[str, str]:
    """Old name → new name of the tensors of a model gated by add_gates, for files saved before the
    gates kept the original names: the branch's last module was wrapped (its tensors under
    "<end>.module.", the gate under "<end>.gate."); the gate now lives under the block's `branch_gates`."""
    renames: dict[str, str] = {}
    for ref in find_branches(model).values():
        if ref.gate is None or ref.gate_path is None or f".{ADDED_GATES}." not in f".{ref.gate_path}.":
            continue
        for name, _ in cast(nn.Module, ref.gate).named_parameters():
            renames[f"{ref.end}.gate.{name}"] = f"{ref.gate_path}.{name}"
        for name in model.get_submodule(ref.end).state_dict():
            renames[f"{ref.end}.module.{name}"] = f"{ref.end}.{name}"
    return renames


def legacy_gate_renames(model: nn.Module, keys: Container[str]) -> dict[str, str]:
    """Old name → new name of the tensor names `keys` of a file saved from `model` before the gates kept the
    original names (`legacy_gate_keys`): the renames whose old name is among `keys`, when none of their new
    names is; {} when none apply (a file saved since)."""
    renames = {old: new for old, new in legacy_gate_keys(model).items() if old in keys}
    return renames if renames and all(new not in keys for new in renames.values()) else {}
