"""The optimiser of a `StackedModels`: SGD, NAdam or Adam over its flat (N, P) parameter matrix
with per-model learning rate, momentum and weight decay (issue 15: the stacked optimiser)."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .recipes import Recipe, parameter_groups
from .stacked import StackedModels

__all__ = ["BatchedOptimizer"]


# ----------------------------------------------------------------------------------------------
# The optimiser
# ----------------------------------------------------------------------------------------------

class BatchedOptimizer:
    """SGD (with momentum, optionally Nesterov), NAdam or Adam over the flat (N, P) parameter matrix,
    with per-model learning rate, momentum and weight decay; the arithmetic is torch.optim's
    single-tensor implementation's (torch 2.x), so each row follows what torch's optimiser would do
    to that model alone, up to floating-point rounding. `compile=True` runs the elementwise update
    through torch.compile."""

    def __init__(self, stack: StackedModels, recipes: Sequence[Recipe], compile: bool = False) -> None:
        first = recipes[0]
        if any(r.param_rules for r in recipes):
            raise ValueError("param_rules (per-parameter lr_mult / decay_mult) are not supported by batched "
                             "training; train these runs one at a time (throughway train)")
        # compile=True fuses each optimiser's elementwise passes into one loop (torch.compile, dynamic
        # shapes): several times less memory traffic, for a compilation of about a minute.
        wrap = (lambda f: torch.compile(f, dynamic=True)) if compile else (lambda f: f)
        self._sgd, self._adam, self._nadam = wrap(_sgd_math), wrap(_adam_math), wrap(_nadam_math)
        self.kind = first.optimizer
        self.betas, self.eps, self.momentum_decay, self.nesterov = first.betas, first.eps, first.momentum_decay, first.nesterov
        self.stack = stack
        device = stack.device
        self.momentum = torch.tensor([r.momentum for r in recipes], dtype=stack.flat.dtype, device=device).view(-1, 1)
        # Which entries are weight-decayed: the recipe's parameter groups, on the template.
        decayed = {id(p) for g in parameter_groups(stack.template, first) if g["group"] == "decay" for p in g["params"]}
        mask = torch.zeros(stack.size, dtype=stack.flat.dtype)
        for (name, p) in stack.template.named_parameters():
            if id(p) in decayed:
                o = stack.offsets[name]
                mask[o:o + p.numel()] = 1.0
        wd = torch.tensor([r.weight_decay for r in recipes], dtype=stack.flat.dtype).view(-1, 1)
        self.decay = (wd * mask.view(1, -1)).to(device) if bool((wd != 0).any()) else None
        self.step_count = 0
        self.mu_product = torch.ones((), dtype=torch.float32)
        self.buf = torch.zeros_like(stack.flat) if self.kind == "sgd" else None
        self.exp_avg = torch.zeros_like(stack.flat) if self.kind in ("nadam", "adam") else None
        self.exp_avg_sq = torch.zeros_like(stack.flat) if self.kind in ("nadam", "adam") else None

    def select(self, keep: Sequence[int]) -> None:
        """Keep the optimiser state of the models at positions `keep` (after `StackedModels.select`)."""
        index = torch.tensor(list(keep), dtype=torch.long, device=self.stack.device)
        self.momentum = self.momentum.index_select(0, index)
        if self.decay is not None:
            self.decay = self.decay.index_select(0, index)
        for name in ("buf", "exp_avg", "exp_avg_sq"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index).contiguous())

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The optimiser's state as named tensors (for the batch's safetensors checkpoint)."""
        out = {"mu_product": self.mu_product.clone()}
        for name in ("buf", "exp_avg", "exp_avg_sq"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], step_count: int) -> None:
        """Restore the state written by `state_tensors`."""
        self.step_count = step_count
        self.mu_product = tensors["mu_product"].clone()
        for name in ("buf", "exp_avg", "exp_avg_sq"):
            if getattr(self, name) is not None:
                getattr(self, name).copy_(tensors[name])

    @torch.no_grad()
    def step(self, lr: torch.Tensor) -> None:
        """One update with per-model learning rates `lr` (N, 1)."""
        p, g = self.stack.flat, self.stack.grad
        if self.decay is not None:
            g = g.addcmul(p, self.decay)  # L2 decay added to the gradient, as torch's weight_decay
        self.step_count += 1
        step = self.step_count
        device = p.device
        if self.kind == "sgd":
            self._sgd(p, g, self.buf, self.momentum, -lr, self.nesterov)
            return
        beta1, beta2 = self.betas
        if self.kind == "adam":
            neg_step = lr * (-1.0 / (1 - beta1 ** step))
            bc2_sqrt = torch.tensor(math.sqrt(1 - beta2 ** step), dtype=p.dtype, device=device)
            self._adam(p, g, self.exp_avg, self.exp_avg_sq, neg_step, bc2_sqrt, beta1, beta2, self.eps)
            return
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * self.momentum_decay)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * self.momentum_decay)))
        self.mu_product *= mu  # a float32 tensor, as torch keeps it
        mu_product = float(self.mu_product)
        mu_product_next = mu_product * mu_next
        # torch divides by √(v / bc2) + eps; dividing by √v + eps·√bc2 and scaling the coefficients by
        # √bc2 is the same quantity, without a division pass over the (N, P) matrix.
        bc2_root = math.sqrt(1 - beta2 ** step)
        c_grad = lr * (-(1.0 - mu) / (1.0 - mu_product) * bc2_root)
        c_avg = lr * (-mu_next / (1.0 - mu_product_next) * bc2_root)
        eps = torch.tensor(self.eps * bc2_root, dtype=p.dtype, device=device)
        self._nadam(p, g, self.exp_avg, self.exp_avg_sq, c_grad, c_avg, eps, beta1, beta2)


# The optimisers' elementwise arithmetic, in place, over (N, P) matrices; per-step scalars arrive as
# tensors so that a compiled version (BatchedOptimizer(compile=True)) is not recompiled every step.

def _sgd_math(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor, momentum: torch.Tensor, neg_lr: torch.Tensor,
              nesterov: bool) -> None:
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
