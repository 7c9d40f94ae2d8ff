"""Lightning: a callback that logs every gate by qualified name and keeps gates out of weight decay.

    from throughway.integrations.lightning import GateCallback
    from throughway.train import param_groups

    class Net(lightning.LightningModule):
        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(param_groups(self, weight_decay=0.01), lr=1e-3)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, f)}

    trainer = lightning.Trainer(callbacks=[GateCallback()])

`GateCallback` works on any LightningModule whose network has gated residual branches: the
toolkit's own models, a user's network gated by `throughway.add_gates`, or another library's gates
that the block registry knows (timm's LayerScale γ). At the end of every training epoch it logs each
gate's value (g(k), α; the mean |λ| of a vector gate) under "gate/<branch name>" and appends them to
`history`. Gates are never weight-decayed (the paper's rule: no weight decay on k, gated-residual-v2
§3.2), in one of two ways:

* the way to prefer: `throughway.train.param_groups(module, weight_decay)` in `configure_optimizers`
  builds the optimiser's groups with the gates (and biases and norms) undecayed from the start, so
  every LR scheduler is built over the groups it will step, and the callback has nothing to split;
* otherwise, at the start of fit the callback splits every parameter group that decays weights into
  the same group without its gates and a group of the gates with weight_decay 0, keeping every other
  setting of the group (its lr included). Lightning has built the schedulers by then, so their
  per-group state (base_lrs, lr_lambdas, max_lrs, min_lrs, ...: `PER_GROUP_STATE`) is extended with
  the split, the gates' group taking its source group's entries: every torch scheduler then steps the
  gates' group as it steps the source (tests/test_lightning.py trains under each of torch's
  schedulers). A scheduler whose per-group state is not known (not one of torch's classes) is
  refused with a ValueError naming it, before anything is changed: use `param_groups`.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("throughway.integrations.lightning needs Lightning: pip install 'throughway[lightning]' "
                      "(or lightning>=2.2)") from exc

from ..analysis.blocks import find_branches, gate_value
from ..layers.blocks import gate_parameters

__all__ = ["GateCallback", "gate_aware_groups", "PER_GROUP_STATE"]

# What a torch LR scheduler keeps per parameter group, in the groups' order (torch.optim.lr_scheduler):
# a group split in two after the scheduler was built needs its entry repeated for the gates' group.
PER_GROUP_STATE = ("base_lrs", "_last_lr", "lr_lambdas", "min_lrs", "max_lrs", "base_momentums", "max_momentums")
# torch's schedulers, whose per-group state is PER_GROUP_STATE (SequentialLR and ChainedScheduler hold
# others, extended in turn).
_TORCH_SCHEDULERS = tuple(getattr(torch.optim.lr_scheduler, name) for name in (
    "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
    "PolynomialLR", "CosineAnnealingLR", "CyclicLR", "OneCycleLR", "CosineAnnealingWarmRestarts",
    "ReduceLROnPlateau", "SequentialLR", "ChainedScheduler"))


def _gate_parameters(module: torch.nn.Module) -> list[torch.Tensor]:
    """The gates of `module` (layers.blocks.gate_parameters: the one list of branches and their gates)."""
    return list(gate_parameters(module))


def _scheduler_tree(schedulers: Iterable[Any]) -> list[Any]:
    """`schedulers` and those a SequentialLR or ChainedScheduler holds, each once."""
    found: dict[int, Any] = {}
    pending = list(schedulers)
    while pending:
        scheduler = pending.pop(0)
        if id(scheduler) not in found:
            found[id(scheduler)] = scheduler
            pending.extend(getattr(scheduler, "_schedulers", None) or [])
    return list(found.values())


def gate_aware_groups(optimizer: torch.optim.Optimizer, module: torch.nn.Module,
                      schedulers: Sequence[Any] = ()) -> int:
    """Split, in place, every parameter group of `optimizer` with weight_decay > 0 that holds gates of
    `module` (`layers.gate_parameters`, from the one list of branches) into the group without its gates and
    a copy of the group holding only the gates with weight_decay 0. Call it before the first step
    (the optimiser's state is keyed by parameter, so nothing is lost, but a step already taken has
    decayed the gates); better still, build the optimiser over `throughway.train.param_groups`.

    `schedulers` are the LR schedulers already built over `optimizer` (those of another optimiser are
    left alone): their per-group state (`PER_GROUP_STATE`) is extended with the split, each new group
    taking its source group's entries, so that they step every group as before. ValueError naming a
    scheduler that is not one of torch's (its per-group state is unknown), raised before anything is
    changed. Returns the number of gate parameters moved."""
    gates = {id(p) for p in _gate_parameters(module)}
    groups: list[dict[str, Any]] = []
    sources: list[int] = []  # the original group of each new group
    moved = 0
    for index, group in enumerate(optimizer.param_groups):
        inside = [p for p in group["params"] if id(p) in gates]
        if not inside or not group.get("weight_decay"):
            groups.append(group)
            sources.append(index)
            continue
        rest = [p for p in group["params"] if id(p) not in gates]
        if rest:
            groups.append({**group, "params": rest})
            sources.append(index)
        groups.append({**group, "params": inside, "weight_decay": 0.0})
        sources.append(index)
        moved += len(inside)
    if not moved:
        return 0
    tree = [s for s in _scheduler_tree(schedulers) if getattr(s, "optimizer", optimizer) is optimizer]
    for scheduler in tree:
        if type(scheduler) not in _TORCH_SCHEDULERS:
            raise ValueError(f"scheduler {type(scheduler).__name__}: the gates' parameter groups would be split off "
                             f"after it was built over the optimizer, and its per-group state is not known here; "
                             f"refused, nothing was changed: build the optimizer over throughway.train.param_groups("
                             f"model, weight_decay) in configure_optimizers (the groups then exist before any scheduler "
                             f"sees the optimizer), or use GateCallback(decay_gates=True)")
    count = len(optimizer.param_groups)
    for scheduler in tree:
        for name in PER_GROUP_STATE:
            value = getattr(scheduler, name, None)
            if isinstance(value, list) and len(value) == count:
                setattr(scheduler, name, [value[i] for i in sources])
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
        """Make every optimiser's groups gate-aware (unless decay_gates), before the first step, with the
        LR schedulers Lightning built over them extended to the new groups (`gate_aware_groups`)."""
        if not self.decay_gates:
            schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
            self.moved = sum(gate_aware_groups(optimizer, pl_module, schedulers) for optimizer in trainer.optimizers)

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
