"""`FlatOptimizer`: a torch optimiser run on one flat vector per parameter group.

torch.optim's CPU optimisers update every parameter tensor with kernels of its own. The toolkit's
deep, narrow networks have hundreds of small tensors (a d = 100, width-50 MLP has 406), so that
per-tensor overhead, not arithmetic, set the speed: NAdam took 44 of the 93 ms of a training step
at d = 100 (batch 128, one thread), more than the forward and backward passes. Here each group's
parameters and gradients are gathered into one flat vector, the wrapped torch optimiser (the same
class, hence the same update rule, hyperparameters and state) updates that vector with a handful
of kernels, and the result is copied back into the parameters.

The parameters stay the model's own tensors, so anything may still change them between steps
(loading a checkpoint, restoring weights after a divergence, DDP's broadcast): each step reads
their current values. Per-parameter state lives in flat buffers; `state_of(p)` gives one
parameter's view of it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["FlatOptimizer"]

# State that torch's NAdam / Adam / SGD keep per tensor but that is the same for every tensor stepped
# together (the step count, NAdam's product of momentum coefficients); every other entry is per element.
_PER_GROUP_STATE = frozenset({"step", "mu_product"})


class FlatOptimizer:
    """Run `optimizer_class` (e.g. torch.optim.NAdam) on one flat vector per parameter group.

    Args:
        optimizer_class: a torch.optim.Optimizer subclass.
        groups: parameter groups as torch.optim takes them (dicts with "params" and per-group
            options); every group's parameters must share one dtype and device.
        **defaults: the optimiser's options (lr, betas, momentum, ...).

    Promises: a step gives each parameter the update `optimizer_class` would give it on its own
    tensor (the same elementwise arithmetic, applied to the concatenation), except that a parameter
    without a gradient in a step is treated as having a zero gradient, where torch.optim would skip
    it. `param_groups` and `state` are the wrapped optimiser's (lr changes go through
    `param_groups`, as for any torch optimiser); `state_dict` / `load_state_dict` round-trip.
    """

    def __init__(self, optimizer_class: type[torch.optim.Optimizer], groups: Iterable[dict[str, Any]],
                 **defaults: Any) -> None:
        self._group_params: list[list[torch.Tensor]] = []
        self._flats: list[torch.Tensor] = []
        flat_groups = []
        for index, group in enumerate(groups):
            params = list(group["params"])
            if not params:
                raise ValueError(f"parameter group {index} is empty")
            dtypes, devices = {p.dtype for p in params}, {p.device for p in params}
            if len(dtypes) > 1 or len(devices) > 1:
                raise ValueError(f"parameter group {index} mixes dtypes {sorted(map(str, dtypes))} or devices "
                                 f"{sorted(map(str, devices))}; a flat group needs one of each")
            with torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1) for p in params])
            flat.requires_grad_(True)
            self._group_params.append(params)
            self._flats.append(flat)
            flat_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [flat]})
        if not flat_groups:
            raise ValueError("the optimiser got no parameters")
        self.inner = optimizer_class(flat_groups, **defaults)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimiser's groups (each holds its flat vector as its only "params")."""
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        """The wrapped optimiser's state, keyed by the flat vectors."""
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the model's parameters (and of the flat vectors)."""
        for params, flat in zip(self._group_params, self._flats):
            for p in params:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_().zero_()
            flat.grad = None

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Gather parameters and gradients, take the wrapped optimiser's step, copy the result back."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # One C++ call each way (torch's flatten/unflatten helpers, as DDP uses): a Python loop
        # over the tensors would bring back the per-tensor overhead this class removes.
        for params, flat in zip(self._group_params, self._flats):
            flat.copy_(_flatten_dense_tensors(params))
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat.grad = _flatten_dense_tensors(grads)
        self.inner.step()
        for params, flat in zip(self._group_params, self._flats):
            torch._foreach_copy_(params, _unflatten_dense_tensors(flat, params))
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimiser's state dict (flat state tensors, one "parameter" per group)."""
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict written by `state_dict` of an optimiser over the same parameter groups,
        or by the wrapped torch optimiser itself over the same groups of tensors (one state per
        tensor, as checkpoints of earlier throughway versions hold): that state is flattened."""
        saved = [len(g["params"]) for g in state_dict.get("param_groups", [])]
        if saved == [len(params) for params in self._group_params] and saved != [1] * len(self._flats):
            state_dict = self._flatten_per_tensor_state(state_dict)
            saved = [1] * len(self._flats)
        if saved != [1] * len(self._flats):
            raise ValueError(
                f"optimizer state has groups of {saved} parameter tensors; this FlatOptimizer keeps one flat "
                f"vector per group ({len(self._flats)} groups): the state was written by another optimiser "
                f"(a checkpoint of an older throughway, whose optimiser kept one state per tensor?)"
            )
        sizes = [flat.numel() for flat in self._flats]
        for index, entry in state_dict.get("state", {}).items():
            for key, value in entry.items():
                if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() != sizes[int(index)]:
                    raise ValueError(f"optimizer state {key!r} of group {index} has {value.numel()} values; "
                                     f"the group has {sizes[int(index)]} parameters")
        self.inner.load_state_dict(state_dict)

    def _flatten_per_tensor_state(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        # torch numbers a state dict's tensors 0, 1, ... across the groups in order.
        state = state_dict.get("state", {})
        flat_state: dict[int, dict[str, Any]] = {}
        flat_groups = []
        for g, (group, params) in enumerate(zip(state_dict["param_groups"], self._group_params)):
            entries = [state.get(i, state.get(str(i))) for i in group["params"]]
            flat_groups.append({**group, "params": [g]})
            if all(e is None for e in entries):
                continue
            if any(e is None for e in entries) or len({frozenset(e) for e in entries}) != 1:
                raise ValueError(f"optimizer state of group {g}: some tensors have state and others not, or "
                                 f"their keys differ; it cannot be flattened")
            merged: dict[str, Any] = {}
            for key in entries[0]:
                values = [e[key] for e in entries]
                if key not in _PER_GROUP_STATE:
                    if not all(isinstance(v, torch.Tensor) and v.shape == p.shape for v, p in zip(values, params)):
                        raise ValueError(f"optimizer state {key!r} of group {g} is not shaped like its tensors")
                    merged[key] = torch.cat([v.reshape(-1) for v in values])
                else:
                    # Per-group scalars (step, mu_product): a flat vector can hold only one value,
                    # which every tensor of a group shares when all of them were stepped together.
                    first = values[0]
                    if any(not torch.equal(torch.as_tensor(v), torch.as_tensor(first)) for v in values[1:]):
                        raise ValueError(f"optimizer state {key!r} of group {g} differs between tensors; "
                                         f"it cannot be flattened")
                    merged[key] = first
            flat_state[g] = merged
        return {"state": flat_state, "param_groups": flat_groups}

    def state_of(self, param: torch.Tensor) -> dict[str, Any]:
        """One parameter's state: views (shaped like `param`) into the flat buffers, and the
        group's scalars (step, ...). Raises KeyError for a tensor this optimiser does not hold."""
        for params, flat in zip(self._group_params, self._flats):
            offset = 0
            for p in params:
                if p is param:
                    out: dict[str, Any] = {}
                    for key, value in self.inner.state.get(flat, {}).items():
                        if isinstance(value, torch.Tensor) and value.shape == flat.shape:
                            out[key] = value[offset:offset + p.numel()].view(p.shape)
                        else:
                            out[key] = value
                    return out
                offset += p.numel()
        raise KeyError("this tensor is not one of the optimiser's parameters")

    def __repr__(self) -> str:
        sizes = ", ".join(str(f.numel()) for f in self._flats)
        return f"FlatOptimizer({type(self.inner).__name__}, groups of {sizes} values)"
