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
* `lanczos(...)`: extreme eigenvalues by Lanczos with full reorthogonalisation;
* `condition_number` (max |λ| over the 10th percentile of |λ|, the paper's appendix B measure),
  `plain_condition_number` (max |λ| / min |λ|), `index` (fraction of negative eigenvalues),
  `spectrum_summary`, `gradient_norm`.

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
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, cast

import torch
from torch import nn
from torch.func import functional_call, grad, jvp, vmap

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

    def loss_at(self, flat: torch.Tensor) -> torch.Tensor:
        """The loss at parameter vector `flat` (differentiable; used by torch.func)."""
        return self._loss_tuple(self._split(flat))

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


@dataclass(frozen=True)
class LanczosResult:
    """Extreme eigenvalues found by `lanczos`.

    `eigenvalues`: the k wanted Ritz values, ordered by the `which` criterion (largest first for
    "largest" and "magnitude", smallest first for "smallest"); `converged`: a bool per value
    (residual ≤ tol · max|Ritz value|); `residuals`: ‖H y − θ y‖ per Ritz pair; `steps`: Lanczos
    steps (= products with H) taken.
    """

    eigenvalues: torch.Tensor
    converged: torch.Tensor
    residuals: torch.Tensor
    steps: int

    @property
    def all_converged(self) -> bool:
        """True when every wanted Ritz value met the tolerance."""
        return bool(self.converged.all())


def _as_operator(operator: Any, size: int | None) -> tuple[Callable[[torch.Tensor], torch.Tensor], int, torch.dtype, torch.device]:
    if isinstance(operator, torch.Tensor):
        if operator.ndim != 2 or operator.shape[0] != operator.shape[1]:
            raise ValueError(f"lanczos: a matrix operator must be square; got {tuple(operator.shape)}")
        matrix = operator
        return (lambda v: matrix @ v), matrix.shape[0], matrix.dtype, matrix.device
    if hasattr(operator, "matvec") and hasattr(operator, "size"):
        return operator.matvec, int(operator.size), operator.dtype, operator.device
    if callable(operator):
        if size is None:
            raise ValueError("lanczos: pass size= when the operator is a plain function v -> H v")
        return operator, int(size), torch.float64, torch.device("cpu")
    raise TypeError("lanczos: operator must be a square tensor, an object with size/matvec, or a function")


_WHICH = ("largest", "smallest", "magnitude")


def lanczos(operator: Any, k: int = 1, *, which: str = "largest", max_steps: int | None = None,
            tol: float = 1e-8, seed: int = 0, size: int | None = None, check_every: int = 1) -> LanczosResult:
    """The k extreme eigenvalues of a symmetric operator by Lanczos with full reorthogonalisation.

    `operator`: a symmetric tensor, a `HessianOperator` (or anything with size, dtype, device and
    matvec), or a function v ↦ H v (then pass `size`). `which`: "largest" (algebraic), "smallest"
    or "magnitude" (largest |λ|). Every new Lanczos vector is orthogonalised twice against all
    previous ones, so no spurious copies of converged eigenvalues appear. Stops when the k wanted
    Ritz values have residual ≤ tol · max|θ|, or after `max_steps` (default min(P, 300)) steps. A
    Ritz value's own error is about residual² / gap (Parlett, *The Symmetric Eigenvalue Problem*,
    §11.7), so when only eigenvalues are wanted tol = 1e-6 already gives them to about 1e-12 relative
    (on the depth-96 benchmark network: 46 steps, 1.9e-12). `check_every` steps between
    convergence checks (each an eigh of the small tridiagonal matrix: microseconds). When
    the Krylov space becomes invariant (e.g. a zero operator) it restarts from a fresh random vector
    orthogonal to the previous ones, so extreme eigenvalues outside the first subspace are not missed.
    """
    if which not in _WHICH:
        raise ValueError(f"which={which!r} is not known; accepted values: {list(_WHICH)}")
    matvec, n, dtype, device = _as_operator(operator, size)
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: must be between 1 and the operator size {n}")
    steps_limit = min(n, max_steps if max_steps is not None else 300)
    steps_limit = max(steps_limit, k)
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def random_vector() -> torch.Tensor:
        return torch.randn(n, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)

    basis = torch.zeros(steps_limit, n, dtype=dtype, device=device)
    alphas: list[float] = []
    betas: list[float] = []  # betas[j] couples vector j and j+1
    q = random_vector()
    q /= q.norm()
    scale = 0.0
    result: LanczosResult | None = None
    for j in range(steps_limit):
        basis[j] = q
        w = matvec(q).to(dtype)
        alpha = float(q @ w)
        alphas.append(alpha)
        for _ in range(2):  # full reorthogonalisation, twice ("twice is enough")
            w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        beta = float(w.norm())
        scale = max(scale, abs(alpha), beta)
        breakdown = beta <= 1e-12 * max(scale, 1e-300)
        last = j == steps_limit - 1
        if (j + 1) % check_every == 0 or last or breakdown:
            result = _ritz(alphas, betas, beta if not breakdown else 0.0, k, which, tol, j + 1, dtype, device)
            if last or (result.all_converged and j + 1 >= k):
                # A converged set found before a breakdown may still miss eigenvalues outside the
                # first invariant subspace only when the start vector was orthogonal to them;
                # a random start makes that a probability-zero event.
                return result
        if last:
            break
        if breakdown:
            q = random_vector()
            for _ in range(2):
                q = q - basis[: j + 1].T @ (basis[: j + 1] @ q)
            if float(q.norm()) <= 1e-10:  # the basis already spans the whole space
                return _ritz(alphas, betas, 0.0, k, which, tol, j + 1, dtype, device)
            betas.append(0.0)
            q = q / q.norm()
        else:
            betas.append(beta)
            q = w / beta
    assert result is not None
    return result


def _ritz(alphas: list[float], betas: list[float], last_beta: float, k: int, which: str, tol: float,
          steps: int, dtype: torch.dtype, device: torch.device) -> LanczosResult:
    m = len(alphas)
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if m > 1:
        off = torch.tensor(betas[: m - 1], dtype=torch.float64)
        t += torch.diag(off, 1) + torch.diag(off, -1)
    theta, vectors = torch.linalg.eigh(t)
    residuals = (last_beta * vectors[-1, :]).abs()
    if which == "largest":
        order = torch.argsort(theta, descending=True)
    elif which == "smallest":
        order = torch.argsort(theta)
    else:
        order = torch.argsort(theta.abs(), descending=True)
    order = order[: min(k, m)]
    reference = float(theta.abs().max()) if m else 0.0
    converged = residuals[order] <= tol * max(reference, 1e-300)
    if steps < k:
        converged = torch.zeros(len(order), dtype=torch.bool)
    return LanczosResult(theta[order].to(dtype=dtype, device=device), converged.to(device),
                         residuals[order].to(dtype=dtype, device=device), steps)


def _abs_eigenvalues(eigenvalues: torch.Tensor) -> torch.Tensor:
    values = torch.as_tensor(eigenvalues, dtype=torch.float64).reshape(-1)
    if values.numel() == 0:
        raise ValueError("eigenvalues is empty")
    if not torch.isfinite(values).all():
        raise ValueError("eigenvalues contain NaN or infinity")
    return values.abs()


class SingularHessianWarning(UserWarning):
    """A Hessian is singular to tolerance: its plain condition number and index are undefined."""


def default_rtol(size: int) -> float:
    """The default relative tolerance for a spectrum of `size` eigenvalues: size · eps(float64)."""
    return max(1, int(size)) * torch.finfo(torch.float64).eps


def singular_to_tolerance(min_abs: float, max_abs: float, size: int, rtol: float | None = None) -> bool:
    """True when min |λ| ≤ rtol · max |λ| (rtol default `default_rtol(size)`), or the matrix is zero.

    Works from stored summaries (min |λ|, max |λ|, P) as well as from spectra.
    """
    tol = (default_rtol(size) if rtol is None else float(rtol)) * max_abs
    return max_abs == 0.0 or min_abs <= tol


def condition_number(eigenvalues: torch.Tensor, low_percentile: float = 10.0, rtol: float | None = None) -> float | None:
    """max |λ| / (the `low_percentile`-th percentile of |λ|): Demystifying ResNet appendix B.

    The paper uses the 10th percentile because min |λ| is very unstable. The percentile is linear
    interpolation between order statistics (numpy's default). Returns None when the ratio is
    undefined: a zero Hessian (max |λ| = 0) or a percentile within the tolerance rtol · max |λ|
    (rtol default P · eps, see the module docstring) — never NaN or infinity.
    Use `spectrum_summary` to tell the two apart.
    """
    if not 0.0 <= low_percentile <= 100.0:
        raise ValueError(f"low_percentile={low_percentile}: must be between 0 and 100")
    values = _abs_eigenvalues(eigenvalues)
    top = float(values.max())
    low = float(torch.quantile(values, low_percentile / 100.0))
    tol = (default_rtol(values.numel()) if rtol is None else float(rtol)) * top
    if top == 0.0 or low <= tol:
        return None
    return top / low


def plain_condition_number(eigenvalues: torch.Tensor, rtol: float | None = None) -> float | None:
    """max |λ| / min |λ|, or None when the Hessian is singular to tolerance (including zero)."""
    values = _abs_eigenvalues(eigenvalues)
    low, top = float(values.min()), float(values.max())
    return None if singular_to_tolerance(low, top, values.numel(), rtol) else top / low


def index(eigenvalues: torch.Tensor, tol: float = 0.0) -> float:
    """The fraction of eigenvalues below −tol (the index of a critical point; paper figure 6).

    A zero Hessian has index 0. `spectrum_summary` reports None instead for a Hessian that is
    singular to tolerance.
    """
    values = torch.as_tensor(eigenvalues, dtype=torch.float64).reshape(-1)
    if values.numel() == 0:
        raise ValueError("eigenvalues is empty")
    return float((values < -abs(tol)).double().mean())


@dataclass(frozen=True)
class SpectrumSummary:
    """What the paper's figures read off a Hessian spectrum (see `spectrum_summary`)."""

    size: int
    max_abs: float
    low_abs: float
    min_abs: float
    low_percentile: float
    condition: float | None
    plain_condition: float | None
    index: float | None
    zero: bool
    singular: bool
    rtol: float

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-able dict (None where undefined)."""
        return asdict(self)


def spectrum_summary(eigenvalues: torch.Tensor, low_percentile: float = 10.0, zero_tol: float = 0.0,
                     rtol: float | None = None, warn: bool = True) -> SpectrumSummary:
    """max |λ|, the low percentile of |λ|, min |λ|, both condition numbers, the index, whether the
    Hessian is zero (max |λ| ≤ zero_tol) and whether it is singular to tolerance (min |λ| ≤
    rtol · max |λ|, rtol default P · eps; see the module docstring).

    Undefined values are None: both condition numbers of a zero Hessian; the plain condition
    number and the index of a singular one (with a `SingularHessianWarning` when `warn`); the
    paper's condition number when its percentile is within the tolerance.
    """
    values = _abs_eigenvalues(eigenvalues)
    top = float(values.max())
    bottom = float(values.min())
    rtol = default_rtol(values.numel()) if rtol is None else float(rtol)
    zero = top <= zero_tol
    singular = zero or singular_to_tolerance(bottom, top, values.numel(), rtol)
    if singular and not zero and warn:
        warnings.warn(f"the Hessian is singular to tolerance (min |λ| = {bottom:.3g} ≤ {rtol:.2g} · max |λ| = "
                      f"{rtol * top:.3g}): its plain condition number and index are undefined",
                      SingularHessianWarning, stacklevel=2)
    return SpectrumSummary(
        size=int(values.numel()), max_abs=top,
        low_abs=float(torch.quantile(values, low_percentile / 100.0)), min_abs=bottom,
        low_percentile=low_percentile,
        condition=None if zero else condition_number(eigenvalues, low_percentile, rtol),
        plain_condition=None if singular else top / bottom,
        index=None if singular else index(eigenvalues), zero=zero, singular=singular, rtol=rtol)


def apply_tolerance(stored: dict[str, Any], prefix: str = "", rtol: float | None = None) -> dict[str, Any]:
    """A stored spectrum summary (the fields of `SpectrumSummary.to_dict()`, each name after `prefix`)
    with `singular` and `rtol` set from its min |λ|, max |λ| and size, and the undefined values
    None: the plain condition number and index of a singular Hessian, the paper's condition number
    when its percentile is within the tolerance. For results files written before the tolerance
    existed; returns a new dict."""
    out = dict(stored)
    size, top, bottom, low = (stored[prefix + k] for k in ("size", "max_abs", "min_abs", "low_abs"))
    rtol = default_rtol(size) if rtol is None else float(rtol)
    singular = bool(stored.get(prefix + "zero")) or singular_to_tolerance(bottom, top, size, rtol)
    out[prefix + "singular"] = singular
    out[prefix + "rtol"] = rtol
    if singular:
        out[prefix + "plain_condition"] = None
        out[prefix + "index"] = None
    if top == 0.0 or low <= rtol * top:
        out[prefix + "condition"] = None
    return out


def gradient_norm(model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, *,
                  dtype: torch.dtype = torch.float64) -> float:
    """‖∇ loss‖₂ over the trainable parameters, in `dtype`; the model is left unchanged (paper figure 6)."""
    value = float(HessianOperator(model, loss_fn, inputs, targets, dtype=dtype).gradient().norm())
    return value if math.isfinite(value) else float("nan")
