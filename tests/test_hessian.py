"""The exact Hessian, the Hessian-vector operator, Lanczos, condition numbers, and Theorem 2 of
Demystifying ResNet checked numerically at the zero point."""

from __future__ import annotations

import pytest
import torch

from throughway.analysis.hessian import (
    HessianOperator,
    condition_number,
    exact_hessian,
    gradient_norm,
    index,
    lanczos,
    plain_condition_number,
    SingularHessianWarning,
    default_rtol,
    singular_to_tolerance,
    spectrum_summary,
    squared_error_loss,
)
from throughway.models import create_model


def _data(n=12, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)


def test_exact_hessian_matches_closed_form_of_one_residual_layer():
    # loss = mean ‖(I + W)x − y‖²; ∂²/∂W_ij∂W_kl = 2 δ_ik mean(x_j x_l): H = 2 (I ⊗ Cxx), row-major vec(W)
    x, y = _data(d=4)
    torch.manual_seed(0)
    model = create_model("shortcut_net", depth=1, shortcut_depth=1, width=4)
    h = exact_hessian(model, squared_error_loss, x, y)
    cxx = x.T @ x / len(x)
    assert h.dtype == torch.float64 and h.shape == (16, 16)
    torch.testing.assert_close(h, 2 * torch.kron(torch.eye(4, dtype=torch.float64), cxx), rtol=1e-12, atol=1e-12)


def test_exact_hessian_matches_torch_func_hessian_on_a_relu_net():
    x, y = _data()
    torch.manual_seed(3)
    model = create_model("shortcut_net", depth=4, shortcut_depth=2, width=3, activation="relu", zero_scale=1.0)
    names = [n for n, _ in model.named_parameters()]
    flat = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])

    def f(v):
        params = {n: t.view(3, 3) for n, t in zip(names, v.split(9))}
        return squared_error_loss(torch.func.functional_call(model, params, (x,)), y)

    reference = torch.func.hessian(f)(flat)
    torch.testing.assert_close(exact_hessian(model, squared_error_loss, x, y, chunk_size=5), reference,
                               rtol=1e-10, atol=1e-10)


class _OutOfOrder(torch.nn.Module):
    """Parameters registered in the reverse of the order the forward pass uses them, with biases."""

    def __init__(self):
        super().__init__()
        self.last = torch.nn.Linear(4, 2)
        self.middle = torch.nn.Linear(3, 4)
        self.first = torch.nn.Linear(3, 3, bias=False)

    def forward(self, x):
        h = torch.tanh(self.first(x))
        return self.last(torch.tanh(self.middle(h) * h.sum(dim=1, keepdim=True)))


@pytest.mark.parametrize("chunk_size", [1, 7, 16, None])
def test_exact_hessian_is_exact_whatever_the_parameter_order(chunk_size):
    # exact_hessian computes, per run of parameters, their rows against the later parameters only
    # (the rest by symmetry); that must stay exact when "later" is not "later in the forward pass".
    x, y = _data(d=3)
    torch.manual_seed(4)
    model = _OutOfOrder().double()
    params = {n: p.detach() for n, p in model.named_parameters()}
    shapes = {n: p.shape for n, p in params.items()}
    flat = torch.cat([p.reshape(-1) for p in params.values()])

    def f(v):
        pieces = dict(zip(params, v.split([p.numel() for p in params.values()])))
        out = torch.func.functional_call(model, {n: t.view(shapes[n]) for n, t in pieces.items()}, (x,))
        return squared_error_loss(out, y[:, :2])

    reference = torch.func.hessian(f)(flat)
    h = exact_hessian(model, squared_error_loss, x, y[:, :2], chunk_size=chunk_size)
    torch.testing.assert_close(h, reference, rtol=1e-10, atol=1e-12)
    assert torch.equal(h, h.T)
    with pytest.raises(ValueError, match="chunk_size=0"):
        exact_hessian(model, squared_error_loss, x, y[:, :2], chunk_size=0)


def test_operator_matvec_and_matmat_agree_with_exact():
    x, y = _data()
    torch.manual_seed(1)
    model = create_model("shortcut_net", depth=4, shortcut_depth=0, width=3)
    h = exact_hessian(model, squared_error_loss, x, y)
    op = HessianOperator(model, squared_error_loss, x, y)
    assert (op.size, op.dtype, op.device.type) == (36, torch.float64, "cpu")
    v = torch.randn(36, dtype=torch.float64)
    torch.testing.assert_close(op.matvec(v), h @ v, rtol=1e-10, atol=1e-10)
    m = torch.randn(36, 5, dtype=torch.float64)
    torch.testing.assert_close(op.matmat(m, chunk_size=2), h @ m, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="shape"):
        op.matvec(torch.zeros(5))
    grad = torch.autograd.grad(squared_error_loss(model.double()(x), y), list(model.parameters()))
    assert gradient_norm(model, squared_error_loss, x, y) == pytest.approx(float(torch.cat([g.reshape(-1) for g in grad]).norm()))


def test_lanczos_on_random_symmetric_matrices():
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(80, 80, generator=g, dtype=torch.float64))
    values = torch.cat([torch.linspace(-3, 2, 77, dtype=torch.float64), torch.tensor([5.0, 7.0, -9.0], dtype=torch.float64)])
    a = q @ torch.diag(values) @ q.T
    exact = torch.linalg.eigvalsh(a)
    top = lanczos(a, k=2, which="largest")
    assert top.all_converged and top.steps < 80
    torch.testing.assert_close(top.eigenvalues, exact[-2:].flip(0), rtol=1e-8, atol=1e-8)
    low = lanczos(a, k=1, which="smallest")
    assert float(low.eigenvalues[0]) == pytest.approx(-9.0, abs=1e-8)
    mag = lanczos(lambda v: a @ v, k=1, which="magnitude", size=80)
    assert float(mag.eigenvalues[0]) == pytest.approx(-9.0, abs=1e-8)
    assert bool((top.residuals < 1e-6).all())
    with pytest.raises(ValueError, match="which="):
        lanczos(a, which="top")
    with pytest.raises(ValueError, match="size="):
        lanczos(lambda v: v)


def test_lanczos_on_a_real_hessian_and_on_zero():
    x, y = _data(d=4)
    torch.manual_seed(2)
    model = create_model("shortcut_net", depth=4, shortcut_depth=0, width=4, init="orthogonal")
    exact = torch.linalg.eigvalsh(exact_hessian(model, squared_error_loss, x, y))
    result = lanczos(HessianOperator(model, squared_error_loss, x, y), k=3)
    assert result.all_converged
    torch.testing.assert_close(result.eigenvalues, exact[-3:].flip(0), rtol=1e-7, atol=1e-9)
    zero = lanczos(torch.zeros(10, 10, dtype=torch.float64), k=1)
    assert float(zero.eigenvalues[0]) == 0.0 and zero.all_converged


def test_condition_number_and_index_edge_cases():
    values = torch.tensor([-2.0, 1.0, 0.5, 4.0, 0.25, 3.0, -1.0, 2.0, 1.5, 0.75])
    absolute = values.abs()
    low = float(torch.quantile(absolute, 0.1))
    assert condition_number(values) == pytest.approx(4.0 / low)
    assert plain_condition_number(values) == pytest.approx(16.0)
    assert index(values) == pytest.approx(0.2)
    zero = torch.zeros(20)
    assert condition_number(zero) is None and plain_condition_number(zero) is None and index(zero) == 0.0
    summary = spectrum_summary(zero)
    assert summary.zero and summary.condition is None and summary.plain_condition is None
    singular = torch.tensor([0.0] * 5 + [1.0] * 5)
    assert condition_number(singular) is None and plain_condition_number(singular) is None
    with pytest.warns(SingularHessianWarning):
        assert not spectrum_summary(singular).zero
    with pytest.raises(ValueError, match="NaN"):
        condition_number(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="low_percentile"):
        condition_number(values, low_percentile=120)


def test_singular_to_tolerance_on_constructed_matrices():
    # A symmetric 40 × 40 matrix with eigenvalues ±1..±10 (nonsingular), and the same with four
    # eigenvalues replaced by rounding-level values of both signs (rank 36: singular to tolerance).
    torch.manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(40, 40, dtype=torch.float64))
    spectrum = torch.cat([torch.linspace(1, 10, 20), -torch.linspace(1, 10, 20)]).double()
    nonsingular = q @ torch.diag(spectrum) @ q.T
    eig = torch.linalg.eigvalsh(nonsingular)
    assert default_rtol(40) == pytest.approx(40 * 2.220446049250313e-16)
    summary = spectrum_summary(eig)
    assert not summary.singular and summary.index == pytest.approx(0.5)
    assert summary.plain_condition == pytest.approx(10.0) and summary.condition is not None
    tiny = spectrum.clone()
    tiny[[0, 1, 20, 21]] = torch.tensor([1e-17, -3e-17, 2e-17, -1e-18], dtype=torch.float64)
    singular = torch.linalg.eigvalsh(q @ torch.diag(tiny) @ q.T)  # eigvalsh's own error ~1e-15
    assert float(singular.abs().min()) < 1e-13
    with pytest.warns(SingularHessianWarning, match="singular to tolerance"):
        summary = spectrum_summary(singular)
    assert summary.singular and not summary.zero
    assert summary.index is None and summary.plain_condition is None  # signs of the zeros are noise
    assert summary.condition is not None  # the P10 measure ignores the smallest tenth on purpose
    assert singular_to_tolerance(1e-14, 1.0, 100) and not singular_to_tolerance(1e-12, 1.0, 100)
    # at least a tenth of the spectrum zero to tolerance: the paper's measure is undefined too
    assert condition_number(torch.tensor([1e-18] * 5 + [1.0] * 35, dtype=torch.float64)) is None


def _assert_unchanged(model, x, y, frozen):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mode = model.training
    h = exact_hessian(model, squared_error_loss, x, y)
    lanczos(HessianOperator(model, squared_error_loss, x, y), k=1, max_steps=10)
    gradient_norm(model, squared_error_loss, x, y)
    assert h.shape[0] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert model.training == mode
    assert all(p.requires_grad == (n != frozen) for n, p in model.named_parameters())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # weights and BatchNorm running stats
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_model_is_left_unchanged():
    torch.manual_seed(0)
    model = create_model("shortcut_net", depth=4, shortcut_depth=2, width=3, activation="relu")
    model.train()
    frozen = "blocks.0.branch.0.weight"
    model.get_parameter(frozen).requires_grad_(False)  # a frozen parameter stays frozen and is left out
    last = model.get_parameter("blocks.1.branch.2.weight")
    last.grad = torch.ones_like(last)
    _assert_unchanged(model, torch.randn(8, 3), torch.randn(8, 3), frozen)
    assert torch.equal(last.grad, torch.ones_like(last))
    assert all(p.grad is None for p in model.parameters() if p is not last)
    # BatchNorm in eval mode: running statistics are read, never written. (Training-mode BatchNorm
    # is supported too, through batch statistics, but its first torch.func call costs ~20 s here.)
    bn_model = create_model("mlp_residual", depth=2, width=4, in_features=3, num_classes=3, stem="dense").eval()
    bn_model.stem[0].weight.requires_grad_(False)
    _assert_unchanged(bn_model, torch.randn(8, 3), torch.randn(8, 3), "stem.0.weight")
    assert not bn_model.training


# --- Theorem 2 (Demystifying ResNet) at the zero point --------------------------------------------

def _zero_hessian(depth, n, width=3, x=None, y=None):
    model = create_model("shortcut_net", depth=depth, shortcut_depth=n, width=width, init="zero", zero_scale=0.0)
    return model, exact_hessian(model, squared_error_loss, x, y)


@pytest.mark.parametrize("n, activation", [(3, None), (4, None), (3, "tanh")])
def test_theorem2_three_or_more_shortcut_zero_gradient_and_hessian(n, activation):
    x, y = _data()
    for depth in (n, 2 * n):
        model = create_model("shortcut_net", depth=depth, shortcut_depth=n, width=3, activation=activation,
                             activation_position=("pre", "mid", "post"), init="zero", zero_scale=0.0)
        h = exact_hessian(model, squared_error_loss, x, y)
        assert float(h.abs().max()) == 0.0
        assert gradient_norm(model, squared_error_loss, x, y) == 0.0
        summary = spectrum_summary(torch.linalg.eigvalsh(h))
        assert summary.zero and summary.condition is None and summary.plain_condition is None
        assert lanczos(HessianOperator(model, squared_error_loss, x, y), k=1).eigenvalues[0] == 0.0


@pytest.mark.parametrize("activation, positions", [(None, "mid"), ("tanh", ("pre", "mid", "post"))])
def test_theorem2_two_shortcut_block_diagonal_depth_invariant(activation, positions):
    # Theorem 2 holds for activations with σ(0) = 0 and a finite derivative at 0 (tanh; not ReLU,
    # whose derivative at 0 autograd takes as 0).
    x, y = _data()
    p = 9
    spectra, blocks = [], []
    for depth in (2, 4, 6):
        model = create_model("shortcut_net", depth=depth, shortcut_depth=2, width=3, activation=activation,
                             activation_position=positions, init="zero", zero_scale=0.0)
        h = exact_hessian(model, squared_error_loss, x, y)
        units = depth // 2
        first = h[:2 * p, :2 * p]
        for u in range(units):
            s = slice(2 * p * u, 2 * p * (u + 1))
            torch.testing.assert_close(h[s, s], first)  # identical blocks
            rest = h[s].clone()
            rest[:, s] = 0
            assert float(rest.abs().max()) == 0.0  # block diagonal
        assert float(first[:p, :p].abs().max()) == 0.0 and float(first[p:, p:].abs().max()) == 0.0
        a = first[:p, p:]
        torch.testing.assert_close(first[p:, :p], a.T)
        sv = torch.linalg.svdvals(a)
        eig = torch.linalg.eigvalsh(h)
        predicted = torch.sort(torch.cat([sv, -sv]).repeat(units)).values
        torch.testing.assert_close(eig, predicted, rtol=1e-10, atol=1e-10)
        assert gradient_norm(model, squared_error_loss, x, y) == 0.0
        spectra.append(condition_number(eig))
        blocks.append(a)
    assert spectra[0] is not None and max(spectra) - min(spectra) < 1e-9 * spectra[0]
    for a in blocks[1:]:
        torch.testing.assert_close(a, blocks[0])


def test_theorem2_one_shortcut_condition_number_grows_with_depth():
    x, y = _data()
    conditions = []
    p = 9
    for depth in (2, 4, 8, 16):
        _, h = _zero_hessian(depth, 1, x=x, y=y)
        conditions.append(condition_number(torch.linalg.eigvalsh(h)))
        # block Toeplitz: block (i, j) depends only on j − i (at zero, only on its sign)
        block = lambda i, j: h[p * i:p * (i + 1), p * j:p * (j + 1)]  # noqa: E731, B023 (used within the iteration)
        for i in range(depth):
            for j in range(depth):
                reference = block(0, 0) if i == j else (block(0, 1) if i < j else block(1, 0))
                torch.testing.assert_close(block(i, j), reference, rtol=1e-12, atol=1e-12)
        assert float(block(0, 1).abs().max()) > 0  # the units are coupled: not block diagonal
    assert all(c is not None for c in conditions)
    assert all(b > a * 1.2 for a, b in zip(conditions, conditions[1:])), conditions


def test_condensed_data_gives_the_same_hessian_for_linear_networks():
    # The reproductions compute linear networks' Hessians on the 20-sample set with the training
    # set's second moments (throughway.data.whiten.second_moment_dataset); that must be exact.
    from throughway.data.whiten import second_moment_dataset

    x, y = _data(n=300, d=4, seed=5)
    xs, ys = second_moment_dataset(x, y)
    assert len(xs) <= 8
    torch.manual_seed(6)
    model = create_model("shortcut_net", depth=4, shortcut_depth=2, width=4, zero_scale=0.5)
    full = exact_hessian(model, squared_error_loss, x, y)
    torch.testing.assert_close(exact_hessian(model, squared_error_loss, xs, ys), full, rtol=1e-9, atol=1e-11)
    assert gradient_norm(model, squared_error_loss, xs, ys) == pytest.approx(gradient_norm(model, squared_error_loss, x, y))
