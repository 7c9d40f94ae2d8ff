"""Hugging Face transformers: a `TrainerCallback` that keeps every gate out of weight decay and logs it.

    from throughway import add_gates
    from throughway.integrations.transformers import GateTrainerCallback
    add_gates(model, "relu")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    GateTrainerCallback().attach(trainer)   # first, so the reporting integrations log the gates too

The Trainer puts every parameter that is not a bias or a LayerNorm weight into its weight-decayed
group, gates included (gated-residual-v2 §3.2 trains k without weight decay). At the start of
training the callback moves each gate (`layers.gate_parameters`: the gates `add_gates` inserted,
timm's LayerScale γ, ...) from a decayed group into the Trainer's own undecayed group with the same
settings, so the number of groups, and with it every learning-rate scheduler's per-group state, is
unchanged. It logs each gate's value (g(k), α; the mean |λ| of a vector gate) under
"gate/<branch name>" with the Trainer's own logs (`trainer.state.log_history`, and every reporting
integration that runs after it: `attach` puts it first) and keeps them in `history`.

To build the optimizer yourself instead: `Trainer(optimizers=(torch.optim.AdamW(
throughway.train.param_groups(model, weight_decay=0.01), lr=...), None))`.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("throughway.integrations.transformers needs Hugging Face transformers: pip install "
                      "transformers") from exc

from ..analysis.blocks import find_branches, gate_value
from ..layers.blocks import gate_parameters

__all__ = ["GateTrainerCallback", "move_gates_out_of_decay"]


def move_gates_out_of_decay(optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> int:
    """Move, in place, every gate of `module` that sits in a parameter group with weight_decay > 0 into
    a group of the same optimizer whose settings are equal but for weight_decay 0 (the undecayed group
    the Trainer and most recipes already have). The number of groups does not change, so a learning-rate
    scheduler built over the optimizer stays consistent. Returns the number of gates moved. ValueError
    naming the settings when a decayed group holding gates has no undecayed twin (build the optimizer
    over `throughway.train.param_groups` instead)."""
    gates = {id(p) for p in gate_parameters(module)}
    moved = 0
    groups = optimizer.param_groups
    for group in groups:
        if not group.get("weight_decay"):
            continue
        inside = [p for p in group["params"] if id(p) in gates]
        if not inside:
            continue
        settings = {k: v for k, v in group.items() if k not in ("params", "weight_decay")}
        twin = next((g for g in groups if not g.get("weight_decay") and
                     {k: v for k, v in g.items() if k not in ("params", "weight_decay")} == settings), None)
        if twin is None:
            raise ValueError(f"the optimizer has no undecayed parameter group with the decayed group's settings "
                             f"{sorted(settings)} to move {len(inside)} gate(s) into; build it over "
                             f"throughway.train.param_groups(model, weight_decay=...) and pass it as "
                             f"Trainer(optimizers=(optimizer, None))")
        group["params"] = [p for p in group["params"] if id(p) not in gates]
        twin["params"] = list(twin["params"]) + inside
        moved += len(inside)
    return moved


class GateTrainerCallback(TrainerCallback):
    """Keeps gates out of weight decay and logs them under a Hugging Face `Trainer` (see the module
    docstring). `decay_gates=True` leaves the groups as they are (gated-residual-v2's "k decay").
    `moved` is the number of gates moved at the start of training; `history` one dict per logging
    step: {"step", "gate/<branch>": value, ...}."""

    def __init__(self, decay_gates: bool = False, prefix: str = "gate/") -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix={prefix!r}: expected a string such as 'gate/'")
        self.decay_gates = bool(decay_gates)
        self.prefix = prefix
        self.moved = 0
        self.history: list[dict[str, float]] = []

    def attach(self, trainer: Any) -> "GateTrainerCallback":
        """Put this callback first among `trainer`'s callbacks (the Trainer appends a user's `callbacks=`
        after its reporting integrations, which would then log before the gates are added); return it."""
        handler = getattr(trainer, "callback_handler", None)
        if handler is None or not isinstance(getattr(handler, "callbacks", None), list):
            raise TypeError(f"trainer={type(trainer).__name__}: expected a transformers.Trainer")
        if self in handler.callbacks:
            handler.callbacks.remove(self)
        handler.callbacks.insert(0, self)
        return self

    def gate_values(self, model: torch.nn.Module) -> dict[str, float]:
        """{prefix + branch name: g} for every gated branch of `model` (the mean |λ| for a vector gate)."""
        values = {}
        for name, ref in find_branches(model).items():
            if ref.gate is not None:
                g = gate_value(ref.gate)
                values[self.prefix + name] = float(g) if g.numel() == 1 else float(g.abs().mean())
        return values

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None,
                       optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        """Move the gates out of the decayed groups before the first step."""
        if self.decay_gates or model is None or optimizer is None:
            return
        self.moved = move_gates_out_of_decay(optimizer, model)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        """Add every gate's value to the Trainer's logs (so the reporters after it see them), to the record the
        Trainer keeps of this log (state.log_history, appended before the callbacks run) and to `history`."""
        if model is None:
            return
        values = self.gate_values(model)
        if logs is not None:
            logs.update(values)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)
        self.history.append({"step": float(state.global_step), **values})
