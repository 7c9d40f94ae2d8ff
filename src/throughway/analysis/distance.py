"""Distance travelled from initialisation versus distance to the nearest identity configuration.

gated-residual-v1 (section 2) assumes that the squared distance between a layer's initial
parameters and those of an identity layer (SDI) is "a credible surrogate" for the length of the
path the optimiser travels. `IdentityDistance` is a training callback (for `throughway.train.fit`)
that measures both during training, per middle block of the model, after every epoch:

* travelled: ‖θ_t − θ_0‖² over the block's parameters, and the path length Σ_e ‖θ_e − θ_(e−1)‖
  (epoch-level chords, a lower bound on the true path length);
* identity: the squared distance from θ_t to the nearest configuration that makes the block an
  identity map, by the paper's definitions: for a gated block (ScalarGate with g = ReLU) max(k, 0)²
  — only k has to move (section 3); for a residual block the squared norm of the branch's linear
  weights and biases (Ŵ = 0, b̂ = 0, section 2.3); for a plain block ‖W − I‖² + ‖b‖² of its linear
  layer (section 2.1; rectangular W uses the rectangular identity). BatchNorm parameters are left
  out of the identity distance (the paper's layers have none) but counted in the travelled distance.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..layers import ScalarGate

__all__ = ["block_identity_distance", "IdentityDistance"]


def _linear_layers(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]


def block_identity_distance(block: nn.Module) -> tuple[str, float]:
    """(kind, squared distance to the nearest identity configuration) of one block (see the module docstring)."""
    gate = getattr(block, "gate", None)
    shortcut = getattr(block, "shortcut", None)
    branch = getattr(block, "branch", block)
    with torch.no_grad():
        if isinstance(gate, ScalarGate) and gate.function == "relu":
            return "gated", float(torch.clamp(gate.k, min=0.0) ** 2)
        if isinstance(gate, ScalarGate):
            return "gated", float(gate.k ** 2)
        total = 0.0
        if shortcut is not None:
            for layer in _linear_layers(branch):
                total += float(layer.weight.double().pow(2).sum())
                if layer.bias is not None:
                    total += float(layer.bias.double().pow(2).sum())
            return "residual", total
        for layer in _linear_layers(branch):
            w = layer.weight.double()
            eye = torch.zeros_like(w)
            n = min(w.shape[0], w.shape[1])
            centre = tuple(k // 2 for k in w.shape[2:])  # identity kernel: 1 at the centre tap of channel i → i
            eye[(torch.arange(n), torch.arange(n)) + centre] = 1.0
            total += float((w - eye).pow(2).sum())
            if layer.bias is not None:
                total += float(layer.bias.double().pow(2).sum())
        return "plain", total


def _block_vectors(model: nn.Module) -> list[torch.Tensor]:
    return [torch.cat([p.detach().double().reshape(-1) for p in block.parameters()])
            if any(True for _ in block.parameters()) else torch.zeros(0, dtype=torch.float64)
            for block in model.blocks]


class IdentityDistance:
    """Training callback: per-epoch travelled distance and distance to identity of `model.blocks`.

    After `fit`, `records` holds one dict per epoch (epoch 0 = initialisation) with the totals over
    blocks (`travelled_sq`, `path_length`, `identity_sq`) and the per-block lists
    (`block_travelled_sq`, `block_identity_sq`). The model is only read.
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
        identity = [block_identity_distance(b) for b in model.blocks]
        self.kinds = [k for k, _ in identity]
        self.records.append({"epoch": epoch, "travelled_sq": sum(travelled), "path_length": self._path,
                             "identity_sq": sum(d for _, d in identity), "block_travelled_sq": travelled,
                             "block_identity_sq": [d for _, d in identity]})

    def on_fit_start(self, state: Any) -> None:
        if not self.records:
            self._record(state.model, state.epoch)

    def on_epoch_end(self, state: Any, record: dict[str, Any]) -> None:
        self._record(state.model, int(record["epoch"]))

    def on_fit_end(self, state: Any) -> None:
        return None
