"""The Hessian of a loss with respect to a model's parameters: exact, as an operator, and its spectrum.

Demystifying ResNet studies the Hessian of the squared-error loss of n-shortcut networks: exactly
zero at the zero point for n ≥ 3, block diagonal with a depth-invariant condition number for
n = 2, and with a condition number that explodes with depth for n = 1 (Theorem 2); its figures
track the condition number and the index along training (figures 4, 5, 6). This module gives:

* `exact_hessian(model, loss_fn, inputs, targets)`: the P × P Hessian in float64, built block
  row by block row from Hessian-vector products with basis vectors, vectorised with torch.func
  (forward-over-reverse), the lower block triangle only (the rest is its transpose), so memory
  stays bounded for networks of about 10,000 parameters (see `benchmarks/hessian_speed.py`);
* `HessianOperator`: the same Hessian as an operator (size, dtype, device, matvec, matmat) for
  larger models, with the loss and gradient at the same point;
* `lanczos(...)`: extreme eigenvalues by Lanczos with full reorthogonalisation (analysis.lanczos);
* `condition_number` (max |λ| over the 10th percentile of |λ|, the paper's appendix B measure),
  `plain_condition_number` (max |λ| / min |λ|), `index` (fraction of negative eigenvalues),
  `spectrum_summary` (analysis.spectrum), `gradient_norm`.

This module computes the Hessian; every name of analysis.lanczos and analysis.spectrum is
importable from here too.

Parameters are those with requires_grad=True, flattened in `model.named_parameters()` order
(row-major within each tensor). The paper orders them column-major; a permutation changes no
eigenvalue. None of these functions changes the model: they work on float64 copies of its
parameters and buffers through torch.func.functional_call, never touch `.grad`,
`requires_grad` or the train/eval mode.

A zero Hessian is reported as such: its condition numbers are None (undefined), never NaN or
infinity, and `spectrum_summary(...).zero` is True.

Singular to tolerance. An eigenvalue with |λ| ≤ rtol · max|λ| is zero to the precision of the
computed spectrum, and its sign is rounding noise. The default `rtol` is P · eps(float64)
(P = the number of eigenvalues; the rank tolerance of numpy's `matrix_rank`), about 3.6e-13 for
P = 1,600; `default_rtol(P)` gives it. A Hessian whose smallest |λ| is within the tolerance is
*singular to tolerance* (ReLU nets with dead units are exactly singular; deep Xavier linear nets
are, to float64): its plain condition number and its index are undefined (None), because the
number and the signs of its zero eigenvalues are not determined, and `spectrum_summary` warns
(`SingularHessianWarning`). The paper's condition number max|λ| / P10(|λ|) is left out of the
10th percentile of |λ| on purpose, so it stays defined while that percentile exceeds the
tolerance, and is None when at least a tenth of the spectrum is zero to tolerance.
"""

from __future__ import annotations

import math
from typing import Callable, cast

import torch
from torch import nn
from torch.func import functional_call, grad, jvp, vmap

from .lanczos import LanczosResult, lanczos
from .spectrum import (SingularHessianWarning, SpectrumSummary, apply_tolerance, condition_number, default_rtol,
                       index, plain_condition_number, singular_to_tolerance, spectrum_summary)

__all__ = [
    "squared_error_loss",
    "HessianOperator",
    "exact_hessian",
    "LanczosResult",
    "lanczos",
    "condition_number",
    "default_rtol",
    "singular_to_tolerance",
    "apply_tolerance",
    "SingularHessianWarning",
    "plain_condition_number",
    "index",
    "SpectrumSummary",
    "spectrum_summary",
    "gradient_norm",
    "parameter_names",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def squared_error_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The paper's squared-error loss: mean over samples of ‖output − target‖² (no factor 1/2)."""
    return ((output - target) ** 2).sum(dim=-1).mean()


def parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters the Hessian is taken over (requires_grad=True), in their order."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


class HessianOperator:
    """The Hessian of `loss_fn(model(inputs), targets)` at the model's current parameters, as an operator.

    Attributes: `size` (P, the number of trainable parameters), `dtype` (float64 by default),
    `device`, `point` (the flat parameter vector). `matvec(v)` returns H v for a vector v of length
    P; `matmat(V)` returns H V for a P × k matrix, vectorising the products in chunks of
    `chunk_size` columns. `loss()` and `gradient()` evaluate at the same point. The model is not
    changed: the operator holds detached copies of its parameters and buffers in `dtype` (taken
    when the operator is built).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, *,
                 dtype: torch.dtype = torch.float64, device: str | torch.device | None = None) -> None:
        if not callable(loss_fn):
            raise TypeError("loss_fn must be a callable loss_fn(output, target) -> scalar tensor")
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else inputs.device
        names = parameter_names(model)
        if not names:
            raise ValueError("the model has no parameter with requires_grad=True; its Hessian is empty")
        params = dict(model.named_parameters())

        def convert(t: torch.Tensor) -> torch.Tensor:
            t = t.detach().to(self.device)
            return t.to(dtype) if t.is_floating_point() else t.clone()

        self._names = names
        # One tensor per parameter, never slices of one flat vector: the backward of a slice writes
        # a zero tensor of length P per parameter, which made every Hessian column cost O(L·P).
        self._params = tuple(convert(params[n]).clone() for n in names)
        self._shapes = [p.shape for p in self._params]
        self._numels = [p.numel() for p in self._params]
        self.size = int(sum(self._numels))
        # Frozen parameters and buffers travel as copies, so a BatchNorm in training mode updates
        # copies of its running statistics, never the model's.
        self._fixed = {n: convert(p) for n, p in model.named_parameters() if not p.requires_grad}
        self._fixed.update({n: convert(b).clone() for n, b in model.named_buffers()})
        # A BatchNorm in training mode normalises with the batch statistics and would update its
        # running statistics in place, which torch.func forbids; without running buffers it computes
        # the same output and updates nothing.
        for prefix, module in model.named_modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training and module.track_running_stats:
                for buffer in ("running_mean", "running_var", "num_batches_tracked"):
                    self._fixed[f"{prefix}.{buffer}" if prefix else buffer] = None  # type: ignore[assignment]
        self.point = torch.cat([p.reshape(-1) for p in self._params])
        self._inputs = convert(inputs)
        self._targets = convert(targets)
        self._model = model
        self._loss_fn = loss_fn
        self._graph: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]] | None = None

    def _split(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t.view(shape) for t, shape in zip(flat.split(self._numels), self._shapes))

    def _loss_of(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        output = functional_call(self._model, {**self._fixed, **params}, (self._inputs,))
        return self._loss_fn(output, self._targets)

    def _loss_tuple(self, params: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self._loss_of(dict(zip(self._names, params)))

    def loss(self) -> float:
        """The loss at the operator's point."""
        with torch.no_grad():
            return float(self._loss_tuple(self._params))

    def gradient(self) -> torch.Tensor:
        """The gradient (length P, `dtype`) at the operator's point."""
        return torch.cat([g.reshape(-1) for g in grad(self._loss_tuple)(self._params)]).detach()

    def _hvp(self, v: torch.Tensor) -> torch.Tensor:
        tangents = self._split(v)
        out = jvp(grad(self._loss_tuple), (self._params,), (tangents,))[1]
        return torch.cat([t.reshape(-1) for t in out])

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """H v for a vector v of length P (converted to the operator's dtype and device).

        The first call records the gradient's autograd graph (double backward); every call then
        costs one backward pass through it, with no forward pass: this is what Lanczos repeats.
        """
        v = torch.as_tensor(v, dtype=self.dtype, device=self.device)
        if v.shape != (self.size,):
            raise ValueError(f"matvec: v must have shape ({self.size},); got {tuple(v.shape)}")
        if self._graph is None:
            leaves = tuple(p.clone().requires_grad_(True) for p in self._params)
            with torch.enable_grad():
                grads: tuple[torch.Tensor | None, ...] = torch.autograd.grad(
                    self._loss_tuple(leaves), leaves, create_graph=True, allow_unused=True)
            self._graph = (leaves, grads)
        leaves, grads = self._graph
        # Parameters whose gradient is constant (the loss is at most linear in them) have no
        # second derivatives; they contribute zero rows and columns.
        live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        if not live:
            return torch.zeros_like(v)
        pieces = self._split(v)
        hv = torch.autograd.grad([cast(torch.Tensor, grads[i]) for i in live], leaves, grad_outputs=[pieces[i] for i in live],
                                 retain_graph=True, allow_unused=True)
        return torch.cat([torch.zeros(n, dtype=self.dtype, device=self.device) if h is None else h.detach().reshape(-1)
                          for h, n in zip(hv, self._numels)])

    def default_chunk_size(self) -> int:
        """Columns per vectorised block: about 256 MB of tangents, activations and result rows per block.

        On the depth-96 width-10 network (P = 9,600, 20 samples) blocks of 400 to 1,600 columns
        were timed; around 800 was fastest, and this rule gives 666 there.
        """
        per_column = 8 * (2 * self._inputs.numel() * max(1, len(self._names)) + self.size)
        return max(1, min(self.size, int(256e6 // per_column)))

    def matmat(self, vectors: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        """H V for a P × k matrix V, computed `chunk_size` columns at a time (vmap of H v)."""
        vectors = torch.as_tensor(vectors, dtype=self.dtype, device=self.device)
        if vectors.ndim != 2 or vectors.shape[0] != self.size:
            raise ValueError(f"matmat: V must have shape ({self.size}, k); got {tuple(vectors.shape)}")
        chunk = chunk_size or self.default_chunk_size()
        batched = vmap(self._hvp)
        blocks = [batched(vectors[:, s:s + chunk].T.contiguous()).T for s in range(0, vectors.shape[1], chunk)]
        return torch.cat(blocks, dim=1).detach()

    def __matmul__(self, other: torch.Tensor) -> torch.Tensor:
        return self.matvec(other) if other.ndim == 1 else self.matmat(other)

    def _column_groups(self, chunk: int) -> list[tuple[int, int]]:
        """Runs [a, b) of consecutive parameters holding at most `chunk` entries (or one parameter)."""
        groups, a = [], 0
        while a < len(self._numels):
            b, width = a + 1, self._numels[a]
            while b < len(self._numels) and width + self._numels[b] <= chunk:
                width += self._numels[b]
                b += 1
            groups.append((a, b))
            a = b
        return groups

    def hessian_rows(self, a: int, b: int) -> torch.Tensor:
        """H[rows of parameters a..b−1, columns of parameters a..] as a (width × (P − offset_a)) block.

        The columns of parameters a..b−1 are a vmapped forward-mode derivative (jvp over the
        basis vectors of those parameters only) of the gradient with respect to parameters a, a+1,
        …; parameters before a enter as constants. For a network whose parameters are used in
        registration order (every feed-forward stack) both the tangent forward pass and the
        backward pass then start at parameter a, so the lower block triangle costs about half of
        the whole, and no work is spent on rows that symmetry gives for free.
        """
        head = dict(zip(self._names[:a], self._params[:a]))
        tail_names = self._names[a:]
        group = self._params[a:b]
        rest = self._params[b:]

        def tail_loss(tail: tuple[torch.Tensor, ...]) -> torch.Tensor:
            return self._loss_of({**head, **dict(zip(tail_names, tail))})

        def tail_gradient(params: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            return grad(tail_loss)(params + rest)

        def column(tangents: tuple[torch.Tensor, ...]) -> torch.Tensor:
            out = jvp(tail_gradient, (group,), (tangents,))[1]
            return torch.cat([t.reshape(-1) for t in out])

        width = sum(self._numels[a:b])
        basis = torch.eye(width, dtype=self.dtype, device=self.device)
        tangents = tuple(t.reshape(width, *shape) for t, shape in
                         zip(basis.split(self._numels[a:b], dim=1), self._shapes[a:b]))
        return vmap(column)(tangents).detach()


def exact_hessian(model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, *,
                  dtype: torch.dtype = torch.float64, device: str | torch.device | None = None,
                  chunk_size: int | None = None) -> torch.Tensor:
    """The exact P × P Hessian of loss_fn(model(inputs), targets) w.r.t. the trainable parameters.

    Float64 by default and exactly symmetric. Built block row by block row
    (`HessianOperator.hessian_rows`): for each run of consecutive parameters holding at most
    `chunk_size` entries, vmapped forward-over-reverse products with their basis vectors give the
    rows of those parameters against themselves and every later parameter; the earlier ones follow
    by symmetry. Exact for any model (parameters before the run are held constant, which changes
    no derivative with respect to the others); for feed-forward stacks it costs about half of P
    full Hessian-vector products. Memory: the P × P result plus one block. The model is left
    unchanged. Demystifying ResNet appendix B computes the same matrix with Bishop's method.
    """
    op = HessianOperator(model, loss_fn, inputs, targets, dtype=dtype, device=device)
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size={chunk_size!r}: must be a positive integer or None")
    hessian = torch.empty(op.size, op.size, dtype=dtype, device=op.device)
    offsets = [0]
    for numel in op._numels:
        offsets.append(offsets[-1] + numel)
    for a, b in op._column_groups(chunk_size or op.default_chunk_size()):
        rows = op.hessian_rows(a, b)  # (width, P − offsets[a])
        lo, hi = offsets[a], offsets[b]
        width = hi - lo
        square = rows[:, :width]
        square = 0.5 * (square + square.T)  # the only block computed from both sides: average away rounding
        hessian[lo:hi, lo:hi] = square
        hessian[lo:hi, hi:] = rows[:, width:]
        hessian[hi:, lo:hi] = rows[:, width:].T
        del rows
    return hessian


def gradient_norm(model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, *,
                  dtype: torch.dtype = torch.float64) -> float:
    """‖∇ loss‖₂ over the trainable parameters, in `dtype`; the model is left unchanged (paper figure 6)."""
    value = float(HessianOperator(model, loss_fn, inputs, targets, dtype=dtype).gradient().norm())
    return value if math.isfinite(value) else float("nan")
