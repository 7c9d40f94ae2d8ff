"""Lightning: a callback that logs every gate by qualified name and keeps gates out of weight decay.

    from throughway.integrations.lightning import GateCallback
    trainer = lightning.Trainer(callbacks=[GateCallback()])

`GateCallback` works on any LightningModule whose network has gated residual branches: the
toolkit's own models, a user's network gated by `throughway.add_gates`, or another library's gates
that the block registry knows (timm's LayerScale γ). At the start of fit it splits every optimiser
parameter group that decays weights into the same group without its gates and a group of the gates
with weight_decay 0 (the paper's rule: no weight decay on k, gated-residual-v2 §3.2), keeping every
other setting of the group (its lr included); at the end of every training epoch it logs each gate's
value (g(k), α; the mean |λ| of a vector gate) under "gate/<branch name>" and appends them to
`history`.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("throughway.integrations.lightning needs Lightning: pip install 'throughway[lightning]' "
                      "(or lightning>=2.2)") from exc

from ..analysis.blocks import find_branches, gate_value
from ..layers.blocks import gate_parameters

__all__ = ["GateCallback", "gate_aware_groups"]


def gate_aware_groups(optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> int:
    """Split, in place, every parameter group of `optimizer` with weight_decay > 0 that holds gates of
    `module` (found by type: `layers.adapters.gate_parameters`) into the group without its gates and
    a copy of the group holding only the gates with weight_decay 0. Call it before the first step
    (the optimiser's state is keyed by parameter, so nothing is lost, but a step already taken has
    decayed the gates). Returns the number of gate parameters moved."""
    gates = {id(p) for p in gate_parameters(module)}
    groups: list[dict[str, Any]] = []
    moved = 0
    for group in optimizer.param_groups:
        inside = [p for p in group["params"] if id(p) in gates]
        if not inside or not group.get("weight_decay"):
            groups.append(group)
            continue
        rest = [p for p in group["params"] if id(p) not in gates]
        if rest:
            groups.append({**group, "params": rest})
        groups.append({**group, "params": inside, "weight_decay": 0.0})
        moved += len(inside)
    optimizer.param_groups[:] = groups
    return moved


class GateCallback(pl.Callback):
    """Logs every gate by qualified name after each training epoch and keeps gates out of weight decay
    (see the module docstring). `decay_gates=True` leaves the groups as they are (gated-residual-v2's
    "k decay"). `history` holds one dict per epoch: {"epoch", "gate/<branch>": value, ...}."""

    def __init__(self, decay_gates: bool = False, prefix: str = "gate/") -> None:
        super().__init__()
        if not isinstance(prefix, str):
            raise TypeError(f"prefix={prefix!r}: expected a string such as 'gate/'")
        self.decay_gates = bool(decay_gates)
        self.prefix = prefix
        self.history: list[dict[str, float]] = []
        self.moved = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Make every optimiser's groups gate-aware (unless decay_gates), before the first step."""
        if not self.decay_gates:
            self.moved = sum(gate_aware_groups(optimizer, pl_module) for optimizer in trainer.optimizers)

    def gate_values(self, module: torch.nn.Module) -> dict[str, float]:
        """{prefix + branch name: g} for every gated residual branch of `module` (the mean |λ| for a vector gate)."""
        values = {}
        for name, ref in find_branches(module).items():
            if ref.gate is not None:
                g = gate_value(ref.gate)
                values[self.prefix + name] = float(g) if g.numel() == 1 else float(g.abs().mean())
        return values

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log each gate's value and append them to `history`."""
        values = self.gate_values(pl_module)
        if values:
            pl_module.log_dict(values, on_step=False, on_epoch=True)
        self.history.append({"epoch": float(trainer.current_epoch), **values})
