"""The one update rule of every trainer: SGD (momentum, Nesterov), Adam, AdamW and NAdam over rows of parameters.

Every path of the toolkit updates its parameters through `update_rows`, written once here (with
`update_rows_on_device`, the same rule with its step-dependent scalars kept on the device, for a step
captured as a CUDA graph: train.graphed; both read NAdam's momentum schedule from `nadam_momentum`):

* `FlatOptimizer` (`fit`, `throughway train`): a real `torch.optim.Optimizer` whose groups each hold
  one flat vector, the concatenation of the group's parameters (a model as one row);
* `StackedOptimizer` (train.stacked, beside the `StackedModels` it serves; `train_stacked`): the
  (N, P) parameter matrix of a stack, one row per model, with per-row learning rate, momentum and
  weight decay;
* `StackedGD` (train.full_batch, the Demystifying ResNet studies): plain gradient descent, which is
  SGD without momentum over the (R, P) rows of R shortcut networks.

The arithmetic is torch.optim's single-tensor implementation's (torch 2.x: `SGD`, `Adam`, `NAdam`
with L2 weight decay added to the gradient; `AdamW` with decoupled weight decay, p ← p·(1 − lr·wd)
before Adam's step, Loshchilov & Hutter 2019), so a row follows what torch's optimiser would do to
that model alone, up to floating-point rounding (NAdam's two `addcdiv` passes are fused into one;
tests/test_optim.py and tests/test_flat_optimizer.py state the tolerances). The state is kept
under torch's names ("step", "mu_product", "momentum_buffer", "exp_avg", "exp_avg_sq"), so a
`FlatOptimizer`'s state dict is the one torch's optimiser over the same flat vectors would write.

Why flat rows: the toolkit's deep, narrow networks have hundreds of small tensors (a d = 100,
width-50 MLP has 406), and torch's per-tensor kernels, not arithmetic, set the speed: NAdam took 44
of the 93 ms of a training step at d = 100 (batch 128, one thread). A handful of kernels over one
row per group (or one (N, P) matrix per stack) removes that overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .recipes import Recipe, parameter_groups

__all__ = ["KINDS", "Kernels", "EAGER", "compiled_kernels", "nadam_momentum", "update_rows", "update_rows_on_device",
           "closure_loss", "FlatOptimizer",
           "build_optimizer"]

KINDS = ("sgd", "adam", "nadam", "adamw")
_TORCH_CLASSES: dict[type, str] = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.NAdam: "nadam",
                                   torch.optim.AdamW: "adamw"}

# State that torch's NAdam / Adam / SGD keep per tensor but that is the same for every tensor stepped
# together (the step count, NAdam's product of momentum coefficients); every other entry is per element.
_PER_GROUP_STATE = frozenset({"step", "mu_product"})


# ----------------------------------------------------------------------------------------------
# The elementwise arithmetic, in place; per-step scalars arrive as tensors so that a compiled
# version (`compiled_kernels`) is not recompiled every step.
# ----------------------------------------------------------------------------------------------

def _sgd_math(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor | None, momentum: torch.Tensor | None,
              neg_lr: torch.Tensor, nesterov: bool) -> None:
    if buf is None or momentum is None:
        p.add_(g * neg_lr)  # no momentum: p − lr·g (a product, then the sum: full-batch GD's numbers)
        return
    buf.mul_(momentum).add_(g)  # the first step gives buf = g, as torch's clone does
    update = g.addcmul(buf, momentum) if nesterov else buf
    p.addcmul_(update, neg_lr)


def _adam_math(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, neg_step: torch.Tensor,
               bc2_sqrt: torch.Tensor, beta1: float, beta2: float, eps: float) -> None:
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (v.sqrt() / bc2_sqrt).add_(eps)
    p.addcmul_(m / denom, neg_step)


def _nadam_math(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, c_grad: torch.Tensor,
                c_avg: torch.Tensor, eps: torch.Tensor, beta1: float, beta2: float) -> None:
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = v.sqrt().add_(eps)
    # torch adds c_grad·g/denom and c_avg·m/denom in two passes; one division saves two passes over
    # the (N, P) matrices and differs only by rounding.
    p.addcdiv_(g.mul(c_grad).addcmul_(m, c_avg), denom)


@dataclass(frozen=True)
class Kernels:
    """The three optimisers' elementwise passes (eager, or fused by torch.compile)."""

    sgd: Callable[..., None]
    adam: Callable[..., None]
    nadam: Callable[..., None]


EAGER = Kernels(_sgd_math, _adam_math, _nadam_math)


def compiled_kernels() -> Kernels:
    """The kernels through torch.compile (dynamic shapes): each optimiser's elementwise passes fused into
    one loop, several times less memory traffic, for a compilation of about a minute."""
    def wrap(f: Callable[..., None]) -> Callable[..., None]:
        return torch.compile(f, dynamic=True)
    return Kernels(wrap(_sgd_math), wrap(_adam_math), wrap(_nadam_math))


# ----------------------------------------------------------------------------------------------
# The update rule
# ----------------------------------------------------------------------------------------------

def nadam_momentum(beta1: float, step: Any, momentum_decay: float) -> Any:
    """NAdam's momentum coefficient of step t (1-based), μ_t = β1·(1 − 0.5·0.96^(t·ψ)) with ψ the momentum
    decay (Dozat 2016, §3, as torch.optim.NAdam and Keras schedule it). `step` is a Python number (the
    result is one) or a tensor on the device (the result is a tensor, computed there)."""
    return beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))


def update_rows(kind: str, p: torch.Tensor, g: torch.Tensor, state: dict[str, Any], *, lr: torch.Tensor,
                momentum: torch.Tensor | None = None, weight_decay: float | torch.Tensor | None = None,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, momentum_decay: float = 4e-3,
                nesterov: bool = False, kernels: Kernels = EAGER) -> None:
    """One step of optimiser `kind` ("sgd", "adam", "nadam", "adamw") on `p` in place, from gradient `g`.

    `p` and `g` are one row (P,) or rows (N, P); `lr` and `momentum` are 0-d tensors or (N, 1) per
    row; `weight_decay` (L2, added to the gradient as torch's `weight_decay` does; for "adamw"
    decoupled, p ← p·(1 − lr·weight_decay) before the Adam step, as torch.optim.AdamW) is a float, a
    tensor broadcastable to `p`, or None. `state` holds the optimiser's state under torch's names and
    is filled on the first step: "step" (a float32 0-d tensor), NAdam's "mu_product" (float32, as
    torch keeps it), SGD's "momentum_buffer" (when `momentum` is given), Adam's and NAdam's "exp_avg"
    and "exp_avg_sq". SGD with `momentum=None` is plain gradient descent, p ← p − lr·g.
    """
    if kind not in KINDS:
        raise ValueError(f"optimizer: {kind!r} not known; accepted values: {list(KINDS)}")
    if kind == "adamw":  # decoupled: the weights shrink, the gradient and Adam's moments are left alone
        if isinstance(weight_decay, torch.Tensor) or weight_decay:
            p.mul_(1 - lr * weight_decay)
        kind = "adam"
    elif isinstance(weight_decay, torch.Tensor):
        g = g.addcmul(p, weight_decay)
    elif weight_decay:
        g = g.add(p, alpha=weight_decay)
    step_t = state.setdefault("step", torch.zeros((), dtype=torch.float32))
    step_t += 1
    step = float(step_t)
    if kind == "sgd":
        buf = None
        if momentum is not None:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = torch.zeros_like(p)
        kernels.sgd(p, g, buf, momentum, -lr, nesterov)
        return
    m = state.get("exp_avg")
    if m is None:
        m = state["exp_avg"] = torch.zeros_like(p)
    v = state.get("exp_avg_sq")
    if v is None:
        v = state["exp_avg_sq"] = torch.zeros_like(p)
    beta1, beta2 = betas
    if kind == "adam":
        neg_step = lr * (-1.0 / (1 - beta1 ** step))
        bc2_sqrt = torch.full((), math.sqrt(1 - beta2 ** step), dtype=p.dtype, device=p.device)
        kernels.adam(p, g, m, v, neg_step, bc2_sqrt, beta1, beta2, eps)
        return
    mu, mu_next = nadam_momentum(beta1, step, momentum_decay), nadam_momentum(beta1, step + 1, momentum_decay)
    mu_product_t = state.setdefault("mu_product", torch.ones((), dtype=torch.float32))
    mu_product_t *= mu
    mu_product = float(mu_product_t)
    mu_product_next = mu_product * mu_next
    # torch divides by √(v / bc2) + eps; dividing by √v + eps·√bc2 and scaling the coefficients by
    # √bc2 is the same quantity, without a division pass over the rows.
    bc2_root = math.sqrt(1 - beta2 ** step)
    c_grad = lr * (-(1.0 - mu) / (1.0 - mu_product) * bc2_root)
    c_avg = lr * (-mu_next / (1.0 - mu_product_next) * bc2_root)
    eps_t = torch.full((), eps * bc2_root, dtype=p.dtype, device=p.device)
    kernels.nadam(p, g, m, v, c_grad, c_avg, eps_t, beta1, beta2)


@torch.no_grad()
def update_rows_on_device(kind: str, p: torch.Tensor, g: torch.Tensor, state: dict[str, Any], *, lr: torch.Tensor,
                          momentum: torch.Tensor | None = None, weight_decay: torch.Tensor | float | None = None,
                          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, momentum_decay: float = 4e-3,
                          nesterov: bool = False, kernels: Kernels = EAGER) -> None:
    """`update_rows` ("sgd", "adam", "nadam") with its step-dependent scalars computed on the device, so that
    a step never waits for the host and can be captured in a CUDA graph (train.graphed). `state["step"]` (and
    NAdam's `state["mu_product"]`) are float32 0-d tensors on `p`'s device; the other arguments are
    update_rows's. The scalars are computed in float64 and rounded where update_rows rounds them, and the
    elementwise passes are the same kernels, so on the CPU the update is update_rows's bit for bit."""
    if isinstance(weight_decay, torch.Tensor):
        g = g.addcmul(p, weight_decay)
    elif weight_decay:
        g = g.add(p, alpha=weight_decay)
    step_t = state["step"]
    step_t.add_(1)
    if kind == "sgd":
        kernels.sgd(p, g, state.get("momentum_buffer"), momentum, -lr, nesterov)
        return
    m, v = state["exp_avg"], state["exp_avg_sq"]
    beta1, beta2 = betas
    step = step_t.double()
    bc2_root = torch.sqrt(1.0 - torch.pow(beta2, step))
    if kind == "adam":
        neg_step = lr * (-1.0 / (1.0 - torch.pow(beta1, step))).float()
        kernels.adam(p, g, m, v, neg_step, bc2_root.to(p.dtype), beta1, beta2, eps)
        return
    mu, mu_next = nadam_momentum(beta1, step, momentum_decay), nadam_momentum(beta1, step + 1.0, momentum_decay)
    mu_product_t = state["mu_product"]
    mu_product_t.mul_(mu.float())  # update_rows multiplies the float32 product by a Python float, rounded to float32
    mu_product = mu_product_t.double()
    c_grad = lr * (-(1.0 - mu) / (1.0 - mu_product) * bc2_root).float()
    c_avg = lr * (-mu_next / (1.0 - mu_product * mu_next) * bc2_root).float()
    kernels.nadam(p, g, m, v, c_grad, c_avg, (eps * bc2_root).to(p.dtype), beta1, beta2)


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """What torch's optimisers do with `step(closure)`: call it with gradients on, return its loss."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _kind_of(optimizer: type[torch.optim.Optimizer] | str) -> str:
    if isinstance(optimizer, str) and optimizer in KINDS:
        return optimizer
    if isinstance(optimizer, type) and optimizer in _TORCH_CLASSES:
        return _TORCH_CLASSES[optimizer]
    raise ValueError(f"optimizer: {optimizer!r} not supported; accepted: {list(KINDS)} or torch.optim.SGD, "
                     f"torch.optim.Adam, torch.optim.NAdam, torch.optim.AdamW (pass any other torch optimiser to "
                     f"fit(optimizer=...))")


# ----------------------------------------------------------------------------------------------
# One model: a torch.optim.Optimizer over one flat vector per parameter group
# ----------------------------------------------------------------------------------------------

class FlatOptimizer(torch.optim.Optimizer):
    """SGD, Adam, AdamW or NAdam (`update_rows`) on one flat vector per parameter group; a `torch.optim.Optimizer`.

    Args:
        optimizer: "sgd", "adam", "nadam" or "adamw", or the torch class of the same rule (torch.optim.SGD,
            torch.optim.Adam, torch.optim.NAdam, torch.optim.AdamW).
        groups: parameter groups as torch.optim takes them (dicts with "params" and per-group
            options such as "lr", "weight_decay"); every group's parameters must share one dtype
            and device.
        **defaults: the optimiser's options: lr, momentum, nesterov (SGD), betas, eps,
            momentum_decay (Adam, NAdam), weight_decay.

    Promises: a step gives each parameter the update torch's optimiser of that rule would give it on
    its own tensor, up to rounding, except that a parameter without a gradient in a step is treated
    as having a zero gradient, where torch.optim would skip it. As for any torch optimiser,
    `param_groups` holds the options (lr changes and torch's LR schedulers go through it; each group's
    only "params" entry is its flat vector) and `state_dict` / `load_state_dict` round-trip; a state
    dict of torch's own optimiser over the same groups of tensors (one state per tensor, as
    checkpoints of earlier throughway versions hold) is flattened on load. The model's parameters stay
    its own tensors, so anything may change them between steps (a checkpoint load, a divergence
    roll-back, DDP's broadcast): each step reads their current values. `state_of(p)` gives one
    parameter's view of the state.
    """

    def __init__(self, optimizer: type[torch.optim.Optimizer] | str, groups: Iterable[dict[str, Any]],
                 **defaults: Any) -> None:
        self.kind = _kind_of(optimizer)
        self._group_params: list[list[torch.Tensor]] = []
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
            flat_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [flat]})
        if not flat_groups:
            raise ValueError("the optimiser got no parameters")
        options = {"lr": 1e-3, "momentum": 0.0, "nesterov": False, "betas": (0.9, 0.999), "eps": 1e-8,
                   "momentum_decay": 4e-3, "weight_decay": 0.0}
        unknown = set(defaults) - set(options)
        if unknown:
            raise ValueError(f"FlatOptimizer: options {sorted(unknown)} not known; accepted: {sorted(options)}")
        super().__init__(flat_groups, {**options, **defaults})

    @property
    def _flats(self) -> list[torch.Tensor]:
        return [group["params"][0] for group in self.param_groups]

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
        """Gather parameters and gradients, update each flat vector (`update_rows`), copy the result back."""
        loss = closure_loss(closure)
        for params, group in zip(self._group_params, self.param_groups):
            flat = group["params"][0]
            # One C++ call each way (torch's flatten/unflatten helpers, as DDP uses): a Python loop
            # over the tensors would bring back the per-tensor overhead this class removes.
            flat.copy_(_flatten_dense_tensors(params))
            grad = _flatten_dense_tensors([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
            momentum = float(group.get("momentum", 0.0))
            # The step's scalars are filled on the device (torch.full): torch.tensor(x, device=cuda) copies
            # from pageable host memory and waits for the GPU to go idle, once per step.
            update_rows(self.kind, flat, grad, self.state[flat],
                        lr=torch.full((), float(group["lr"]), dtype=flat.dtype, device=flat.device),
                        momentum=torch.full((), momentum, dtype=flat.dtype, device=flat.device) if momentum else None,
                        weight_decay=float(group.get("weight_decay", 0.0)), betas=tuple(group["betas"]),
                        eps=float(group["eps"]), momentum_decay=float(group["momentum_decay"]),
                        nesterov=bool(group.get("nesterov", False)))
            torch._foreach_copy_(params, _unflatten_dense_tensors(flat, params))
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict written by `state_dict` of an optimiser over the same parameter groups,
        or by torch's optimiser of the same rule over the same groups of tensors (flattened)."""
        flats = self._flats
        saved = [len(g["params"]) for g in state_dict.get("param_groups", [])]
        if saved == [len(params) for params in self._group_params] and saved != [1] * len(flats):
            state_dict = self._flatten_per_tensor_state(state_dict)
            saved = [1] * len(flats)
        if saved != [1] * len(flats):
            raise ValueError(
                f"optimizer state has groups of {saved} parameter tensors; this FlatOptimizer keeps one flat "
                f"vector per group ({len(flats)} groups): the state was written by another optimiser "
                f"(a checkpoint of an older throughway, whose optimiser kept one state per tensor?)"
            )
        sizes = [flat.numel() for flat in flats]
        for index, entry in state_dict.get("state", {}).items():
            for key, value in entry.items():
                if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() != sizes[int(index)]:
                    raise ValueError(f"optimizer state {key!r} of group {index} has {value.numel()} values; "
                                     f"the group has {sizes[int(index)]} parameters")
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # a torch SGD's groups carry no betas, an Adam's no momentum
            for key, value in self.defaults.items():
                group.setdefault(key, value)

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
                    for key, value in self.state.get(flat, {}).items():
                        if isinstance(value, torch.Tensor) and value.shape == flat.shape:
                            out[key] = value[offset:offset + p.numel()].view(p.shape)
                        else:
                            out[key] = value
                    return out
                offset += p.numel()
        raise KeyError("this tensor is not one of the optimiser's parameters")

    def __repr__(self) -> str:
        sizes = ", ".join(str(f.numel()) for f in self._flats)
        return f"FlatOptimizer({self.kind}, groups of {sizes} values)"


def build_optimizer(model: nn.Module, recipe: Recipe) -> FlatOptimizer:
    """The recipe's optimiser (NAdam, Adam, AdamW or SGD) over `parameter_groups(model, recipe)`, as a
    `FlatOptimizer`: torch's update rule, without torch's per-tensor overhead, which dominated the
    step of the deep MLPs."""
    groups = [{**group, "lr": recipe.lr * group["lr_mult"]} for group in parameter_groups(model, recipe)]
    return FlatOptimizer(recipe.optimizer, groups, lr=recipe.lr, momentum=recipe.momentum, nesterov=recipe.nesterov,
                         betas=recipe.betas, eps=recipe.eps, momentum_decay=recipe.momentum_decay)
