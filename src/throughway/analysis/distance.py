"""Distance travelled from initialisation versus distance to the nearest identity configuration.

gated-residual-v1 (section 2) assumes that the squared distance between a layer's initial
parameters and those of an identity layer (SDI) is "a credible surrogate" for the length of the
path the optimiser travels. `IdentityDistance` is a training callback (for `throughway.train.fit`)
that measures both during training, per middle block of the model, after every epoch:

* travelled: ‖θ_t − θ_0‖² over the block's parameters, and the path length Σ_e ‖θ_e − θ_(e−1)‖
  (epoch-level chords, a lower bound on the true path length);
* identity (the paper's target, `block_identity_distance`): the squared distance from θ_t to the
  identity configuration the paper's SDI measures: for a gated block (ScalarGate with g = ReLU)
  max(k, 0)² — only k has to move (section 3); for a residual block the squared norm of all the
  branch's linear weights and biases (Ŵ = 0, b̂ = 0, section 2.3); for a plain block ‖W − I‖² + ‖b‖²
  of its linear layer (section 2.1; rectangular W uses the rectangular identity). BatchNorm
  parameters are left out (the paper's layers have none) but counted in the travelled distance.
* nearest identity (`nearest_identity_distance`): the squared distance to the nearest of the
  configurations that silence the block's residual branch unit by unit, or close its gate. A
  residual branch ending in `Linear [BatchNorm] [ReLU]` outputs 0 for every input when, for each
  output unit j, the normalised pre-activation vanishes (row W_j = 0, or γ_j = 0 under BatchNorm)
  and the constant left over is 0 (β_j, or b_j without BatchNorm; ≤ 0 is enough before a ReLU):
  Σ_j min(‖W_j‖², γ_j²) + max(β_j, 0)². This is usually far below the paper's target, which zeroes
  every layer of the branch. BatchNorm is taken in training mode (batch statistics), as during
  `fit`. Routes that depend on the data (e.g. a bias so negative that a ReLU never opens) are not
  searched, so this is an upper bound on the true nearest distance. Plain blocks have no nearest
  value (None): with BatchNorm their identity configuration depends on the batch statistics.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ..layers import ScalarGate
from ..layers.blocks import BranchRef, block_branches, block_spec, has_shortcut, iter_blocks
from .blocks import block_kind

__all__ = ["block_identity_distance", "nearest_identity_distance", "IdentityDistance"]


_Weighted = nn.Linear | nn.Conv1d | nn.Conv2d


def _linear_layers(module: nn.Module) -> list[_Weighted]:
    return [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]


_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, _NORMS) or "norm" in type(module).__name__.lower()


def _branch_parameters(block: nn.Module, refs: list[BranchRef]) -> list[torch.Tensor]:
    """The parameters an identity configuration sets to zero: every parameter of the block outside its
    normalisation layers, its gates (and gate slots: a highway layer's T) and its projection shortcut.
    For the toolkit's blocks these are the weights and biases of the branch's Linear / convolution
    layers (section 2.3: Ŵ = 0, b̂ = 0); for a library's block, every weight of its branches."""
    spec = block_spec(block)
    skip: set[int] = set()
    excluded: list[Any] = [ref.gate for ref in refs if isinstance(ref.gate, nn.Module)]
    if spec is not None:
        excluded += [block.get_submodule(path) for path in spec.gates.values()
                     if isinstance(getattr(block, path.split(".")[0], None), nn.Module)
                     and _resolves_to_module(block, path)]
        if spec.shortcut is not None and isinstance(getattr(block, spec.shortcut, None), nn.Module):
            excluded.append(block.get_submodule(spec.shortcut))
    for module in block.modules():
        if _is_norm(module):
            skip.update(id(p) for p in module.parameters())
    for module in excluded:
        skip.update(id(p) for p in cast(nn.Module, module).parameters())
    for ref in refs:
        if ref.gate is not None and not isinstance(ref.gate, nn.Module):
            skip.update(id(p) for p in ref.gate.parameters())  # a library's γ parameter
    return [p for p in block.parameters() if id(p) not in skip]


def _resolves_to_module(block: nn.Module, path: str) -> bool:
    try:
        return isinstance(block.get_submodule(path), nn.Module)
    except AttributeError:
        return False


def _gate_route(gate: Any) -> float | None:
    """The squared distance that closes one scalar gate: max(k, 0)² for g = ReLU (only k has to move,
    section 3), k² for an identity gate (ReZero's α); None otherwise (a sigmoid gate only approaches 0)."""
    if isinstance(gate, ScalarGate) and gate.function == "relu":
        return float(torch.clamp(gate.k.detach().double(), min=0.0) ** 2)
    if isinstance(gate, ScalarGate) and gate.function == "identity":
        return float(gate.k.detach().double() ** 2)
    return None


def block_identity_distance(block: nn.Module) -> tuple[str, float]:
    """(kind, squared distance to the paper's identity configuration) of one block, read from its
    branches (`find_branches`) the same way for the toolkit's blocks and every library's: the
    distance the paper's SDI measures at initialisation (gated-residual-v1 sections 2.1, 2.3, 3).

    "gated" when every branch has a scalar gate: Σ over branches of max(k, 0)² (g = ReLU: only k has to
    move) or k² (another g, ReZero's α); "residual" for a block with a shortcut otherwise: the squared
    norm of the parameters its branches would zero (`_branch_parameters`: Ŵ = 0, b̂ = 0); "plain" for a
    block without one: ‖W − I‖² + ‖b‖² over its Linear / convolution layers (section 2.1; a rectangular
    W uses the rectangular identity, a kernel the centre tap)."""
    refs = block_branches("", block)
    with torch.no_grad():
        if refs and all(isinstance(ref.gate, ScalarGate) for ref in refs):
            return "gated", sum(_gate_route(ref.gate) or float(ref.gate.k.detach().double() ** 2) for ref in refs)
        if has_shortcut(block):
            return "residual", sum(float(p.detach().double().pow(2).sum()) for p in _branch_parameters(block, refs))
        total = 0.0
        for layer in _linear_layers(getattr(block, "branch", block)):
            w = layer.weight.double()
            eye = torch.zeros_like(w)
            n = min(w.shape[0], w.shape[1])
            centre = tuple(k // 2 for k in w.shape[2:])  # identity kernel: 1 at the centre tap of channel i → i
            eye[(torch.arange(n), torch.arange(n)) + centre] = 1.0
            total += float((w - eye).pow(2).sum())
            if layer.bias is not None:
                total += float(layer.bias.double().pow(2).sum())
        return "plain", total


_TRANSPARENT = (nn.Dropout, nn.Identity)


def _silencing_distance(branch: nn.Module) -> float | None:
    """Σ_j min(‖W_j‖², γ_j²) + (β_j or b_j)² [clipped at 0 before a ReLU] for a branch whose leaf
    modules end with `Linear/Conv [BatchNorm] [ReLU]` (dropout ignored); None for any other ending."""
    leaves = [m for m in branch.modules() if not list(m.children())]
    last = max((i for i, m in enumerate(leaves) if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))), default=None)
    if last is None:
        return None
    norm, relu = None, False
    for module in leaves[last + 1:]:
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and norm is None and not relu:
            norm = module
        elif isinstance(module, nn.ReLU) and not relu:
            relu = True
        elif not isinstance(module, _TRANSPARENT):
            return None
    layer = cast(_Weighted, leaves[last])
    rows = layer.weight.detach().double().flatten(1).pow(2).sum(dim=1)  # ‖W_j‖² per output unit
    if norm is not None and norm.affine:
        silence = torch.minimum(rows, norm.weight.detach().double() ** 2)
        constant = norm.bias.detach().double()
    else:
        silence = rows
        constant = (layer.bias.detach().double() if layer.bias is not None else torch.zeros_like(rows)) \
            if norm is None else torch.zeros_like(rows)
    if relu:
        constant = constant.clamp(min=0.0)
    return float(silence.sum() + constant.pow(2).sum())


def _branch_route(block: nn.Module, ref: BranchRef) -> float | None:
    """The squared distance that silences one branch unit by unit: through the contract's `branch`
    module, or through the Linear / convolution / BatchNorm the spec's `fold` path names (the module
    whose output is the branch)."""
    if ref.spec.fold.get(ref.key):
        module = block.get_submodule(ref.spec.fold[ref.key])
        return _silencing_distance(nn.Sequential(module)) if not _is_norm(module) else \
            float(sum(p.detach().double().pow(2).sum() for p in module.parameters()))
    branch = getattr(block, "branch", None)
    return _silencing_distance(branch) if isinstance(branch, nn.Module) and len(block_branches("", block)) == 1 \
        else None


def nearest_identity_distance(block: nn.Module) -> float | None:
    """Squared distance to the nearest identity configuration that silences each branch of the block
    unit by unit or closes its gate (see the module docstring): Σ over branches of the smaller route;
    None for a block without a shortcut, a highway or augmented layer, or a branch with neither route
    (its ending is not `Linear/Conv [BatchNorm] [ReLU]` and it has no exact-zero gate)."""
    if not has_shortcut(block) or block_kind(block) in ("highway", "augmented", "plain"):
        return None
    total = 0.0
    with torch.no_grad():
        for ref in block_branches("", block):
            routes = [r for r in (_branch_route(block, ref), _gate_route(ref.gate)) if r is not None]
            if not routes:
                return None
            total += min(routes)
    return total


def _block_vectors(model: nn.Module) -> list[torch.Tensor]:
    return [torch.cat([p.detach().double().reshape(-1) for p in block.parameters()])
            if any(True for _ in block.parameters()) else torch.zeros(0, dtype=torch.float64)
            for block in _blocks_of(model)]


def _blocks_of(model: nn.Module) -> list[nn.Module]:
    blocks = [block for _, block in iter_blocks(model)]
    if not blocks:
        raise ValueError(f"IdentityDistance: {type(model).__name__} has no blocks (the toolkit's blocks, modules with "
                         f"branch/shortcut/gate attributes, or registered block types: register_block)")
    return blocks


class IdentityDistance:
    """Training callback: per-epoch travelled distance and distance to identity of every block of the
    model, found wherever it sits (`analysis.blocks.find_blocks`: the toolkit's blocks and every
    registered block type, so a user's transformer or torchvision ResNet too).

    After `fit`, `records` holds one dict per epoch (epoch 0 = initialisation) with the totals over
    blocks (`travelled_sq`, `path_length`, `identity_sq`, `nearest_identity_sq`, None when a block
    has no nearest value) and the per-block lists (`block_travelled_sq`, `block_identity_sq`,
    `block_nearest_identity_sq`). The model is only read.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._start: list[torch.Tensor] = []
        self._previous: list[torch.Tensor] = []
        self._path = 0.0
        self.kinds: list[str] = []

    def _record(self, model: nn.Module, epoch: int) -> None:
        current = _block_vectors(model)
        if not self._start:
            self._start = [v.clone() for v in current]
            self._previous = [v.clone() for v in current]
        travelled = [float((c - s).pow(2).sum()) for c, s in zip(current, self._start)]
        self._path += sum(float((c - p).pow(2).sum()) for c, p in zip(current, self._previous)) ** 0.5
        self._previous = [v.clone() for v in current]
        blocks = _blocks_of(model)
        identity = [block_identity_distance(b) for b in blocks]
        nearest = [nearest_identity_distance(b) for b in blocks]
        self.kinds = [k for k, _ in identity]
        self.records.append({"epoch": epoch, "travelled_sq": sum(travelled), "path_length": self._path,
                             "identity_sq": sum(d for _, d in identity), "block_travelled_sq": travelled,
                             "block_identity_sq": [d for _, d in identity],
                             "nearest_identity_sq": None if any(d is None for d in nearest) else sum(nearest),
                             "block_nearest_identity_sq": nearest})

    def on_fit_start(self, state: Any) -> None:
        """Record the distances at initialisation (epoch 0)."""
        if not self.records:
            self._record(state.model, state.epoch)

    def on_epoch_end(self, state: Any, record: dict[str, Any]) -> None:
        """Record the distances after this epoch."""
        self._record(state.model, int(record["epoch"]))

    def on_fit_end(self, state: Any) -> None:
        """Nothing to add: every epoch is already recorded."""
        return None
