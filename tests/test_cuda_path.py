"""The stacked trainer's CUDA path (issue 35): its device-independent parts on the CPU, the captured
epoch on a GPU (skipped without one)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from throughway.data import to_splits
from throughway.models import create_model
from throughway.train import RunConfig, get_recipe, read_results
from throughway.train import stack as stack_module
from throughway.train.stack import order_generator, train_stacked
from throughway.train.graphed import GraphedStep
from throughway.train.optim import update_rows_on_device
from throughway.train.optim import update_rows
from throughway.train.stacked import StackedModels, StackedOptimizer, StackedStep, train_epoch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _stack(device: str = "cpu", depth: int = 4, recipe: str = "gresnet-mnist", **overrides):
    """A mixed stack (plain, residual, gated; two seeds each) of width-8 MLPs and its optimiser."""
    models = []
    for name in ("mlp_plain", "mlp_residual", "mlp_gated_residual"):
        for seed in range(2):
            torch.manual_seed(seed)
            models.append(create_model(name, depth=depth, width=8, in_features=20, num_classes=4))
    stack = StackedModels(models, device=device)
    recipes = [get_recipe(recipe, **overrides).replace(lr=0.002 * (1 + i % 3)) for i in range(len(models))]
    optimizer = StackedOptimizer(stack, recipes)
    optimizer.param_groups[0]["lr"] = torch.tensor([r.lr for r in recipes], device=device).view(-1, 1)
    return stack, optimizer


def _data(n: int = 70, device: str = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g).to(device)
    y = torch.randint(0, 4, (n,), generator=g).to(device)
    orders = torch.stack([torch.randperm(n, generator=g) for _ in range(6)]).to(device)
    return x, y, orders


def _state(stack: StackedModels, optimizer: StackedOptimizer) -> dict[str, torch.Tensor]:
    out = {"flat": stack.flat.clone(), "steps": stack.steps.clone()}
    out.update({f"running.{k}": v.clone() for k, v in stack.running.items()})
    out.update({f"optim.{k}": v.clone() for k, v in optimizer.state_tensors().items()})
    out["optim.step"] = torch.tensor(float(optimizer.step_count))
    return out


# ----------------------------------------------------------------------------------------------
# On the CPU: the parts that do not need a GPU
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sgd", "adam", "nadam"])
def test_the_device_side_update_is_update_rows_bit_for_bit_on_the_cpu(kind):
    g = torch.Generator().manual_seed(1)
    p0 = torch.randn(3, 50, generator=g)
    lr = torch.tensor([[0.01], [0.002], [0.1]])
    momentum = torch.tensor([[0.9], [0.5], [0.0]])
    decay = torch.rand(3, 50, generator=g) * 1e-3
    host_p, device_p = p0.clone(), p0.clone()
    host_state: dict = {}
    device_state: dict = {"step": torch.zeros(()), "mu_product": torch.ones(()), "momentum_buffer": torch.zeros(3, 50),
                          "exp_avg": torch.zeros(3, 50), "exp_avg_sq": torch.zeros(3, 50)}
    for _ in range(25):
        grad = torch.randn(3, 50, generator=g)
        options = dict(lr=lr, momentum=momentum if kind == "sgd" else None, weight_decay=decay, nesterov=kind == "sgd")
        update_rows(kind, host_p, grad, host_state, **options)
        update_rows_on_device(kind, device_p, grad, device_state, **options)
    assert torch.equal(host_p, device_p)
    assert float(device_state["step"]) == float(host_state["step"]) == 25.0
    if kind == "nadam":
        assert torch.equal(device_state["mu_product"], host_state["mu_product"])


@pytest.mark.parametrize("recipe", ["gresnet-mnist", "highway-mnist"])  # NAdam; SGD with momentum
def test_the_static_epoch_equals_train_epoch_on_the_cpu(recipe):
    """GraphedStep's body (batch gathered from a device-side offset, device-side optimiser scalars and
    totals) trains the steps `train_epoch` trains: same weights, statistics, totals, optimiser state,
    over two epochs with a short last batch (70 = 4·16 + 6)."""
    x, y, orders = _data()
    eager_stack, eager_opt = _stack(recipe=recipe)
    static_stack, static_opt = _stack(recipe=recipe)
    eager = StackedStep(eager_stack, eager_opt)
    static = GraphedStep(static_stack, static_opt)
    assert not static.capture  # the CPU runs the body eagerly
    for epoch in range(2):
        a = train_epoch(eager, x, y, orders.roll(epoch, 1), 16)
        b = static.epoch(x, y, orders.roll(epoch, 1), 16)
        assert a.seen == b.seen == 70
        for name in ("loss_sum", "wrong", "bad_step", "bad_loss"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    want, have = _state(eager_stack, eager_opt), _state(static_stack, static_opt)
    assert want.keys() == have.keys()
    for name in want:
        assert torch.equal(want[name], have[name]), name


def test_a_diverging_member_is_reported_at_the_same_step_and_the_stack_can_shrink():
    x, y, orders = _data()
    x = x * 1e3
    stacks = [_stack(), _stack()]
    for _, opt in stacks:  # member 1 diverges: an enormous rate
        opt.param_groups[0]["lr"][1] = 1e12
    eager = StackedStep(*stacks[0])
    static = GraphedStep(*stacks[1])
    a = train_epoch(eager, x, y, orders, 16)
    b = static.epoch(x, y, orders, 16)
    assert torch.equal(a.bad_step, b.bad_step) and int(b.bad_step[1]) >= 0
    torch.testing.assert_close(a.bad_loss, b.bad_loss, rtol=0, atol=0, equal_nan=True)
    # The loop drops the member; the static buffers follow the smaller stack.
    for stack, opt in stacks:
        keep = [0, 2, 3, 4, 5]
        stack.select(keep)
        opt.select(keep)
    a = train_epoch(eager, x, y, orders[:5], 16)
    b = static.epoch(x, y, orders[:5], 16)
    assert b.loss_sum.shape == (5,) and torch.equal(a.loss_sum, b.loss_sum)
    assert torch.equal(stacks[0][0].flat, stacks[1][0].flat)


def test_the_trainer_through_the_static_body_writes_the_eager_trainers_files(tmp_path, fake_mnist_root, monkeypatch):
    """train_stacked with the GPU's engine (GraphedStep, run eagerly on the CPU), interrupted and
    resumed, gives the eager trainer's numbers exactly (the optimiser's step count and NAdam's product
    go back to the host at each epoch's end, so the batch checkpoint holds them)."""
    configs = [RunConfig(model="mlp_gated_residual", depth=2, recipe="gresnet-mnist", epochs=3, seed=s,
                         model_kwargs={"width": 8}, recipe_overrides={"lr": 0.002 * (s + 1), "batch_size": 64})
               for s in range(3)]
    eager_dirs = [tmp_path / f"eager-{s}" for s in range(3)]
    train_stacked(configs, eager_dirs, progress=False)

    monkeypatch.setattr(stack_module, "_use_graphs", lambda device, cuda_graph: cuda_graph)
    epochs_seen = []
    real_epoch = GraphedStep.epoch

    def epoch(self, *args):
        epochs_seen.append(self.stack.n)
        if len(epochs_seen) == 2:
            raise KeyboardInterrupt  # in the second epoch, after the first was checkpointed
        return real_epoch(self, *args)

    monkeypatch.setattr(GraphedStep, "epoch", epoch)
    dirs = [tmp_path / f"static-{s}" for s in range(3)]
    with pytest.raises(KeyboardInterrupt):
        train_stacked(configs, dirs, progress=False)
    assert len(read_results(dirs[0])["history"]) == 1
    train_stacked(configs, dirs, progress=False, resume=True)
    assert len(epochs_seen) == 4  # 1, the interrupted 2, then 2 and 3 after the resume
    for a, b in zip(dirs, eager_dirs):
        ra, rb = read_results(a), read_results(b)
        for key in ("train_loss", "train_error_pct", "test_loss", "val_loss", "k"):
            assert [r[key] for r in ra["history"]] == [r[key] for r in rb["history"]], key


def test_capture_needs_a_cuda_device():
    stack, opt = _stack()
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        GraphedStep(stack, opt, capture=True)


def test_order_generators_stay_on_the_cpu_off_a_gpu():
    assert order_generator(torch.device("cpu")).device == torch.device("cpu")
    g = order_generator(torch.device("cpu")).manual_seed(3)
    assert torch.equal(torch.randperm(50, generator=g, device=g.device),
                       torch.randperm(50, generator=torch.Generator().manual_seed(3)))


def test_uint8_data_is_normalised_on_the_device_to_the_same_numbers(fake_arrays):
    data = to_splits(fake_arrays, limit=50)
    want = torch.from_numpy(np.ascontiguousarray(fake_arrays.train_x[:50])).to(torch.float32) / 255.0
    assert data.train.x.dtype == torch.float32 and data.train.y.dtype == torch.int64
    assert torch.equal(data.train.x, want)
    assert torch.equal(data.test.y, torch.from_numpy(fake_arrays.test_y[:50].astype(np.int64)))


@pytest.mark.slow
def test_blocks_compile_once_and_train_what_the_eager_kernels_train():
    """compile="blocks" (the protocol's compiled step on a GPU): one compiled function serves every block of
    block 0's structure, so a deeper stack compiles no more graphs; under SGD the steps are the eager
    kernels' up to rounding (BatchNorm's statistics included)."""
    from torch._dynamo.utils import counters

    x, y, orders = _data(n=64)
    eager_stack, eager_opt = _stack(depth=6, recipe="highway-mnist")
    blocks_stack, blocks_opt = _stack(depth=6, recipe="highway-mnist")  # three residual blocks
    eager, blocks = StackedStep(eager_stack, eager_opt), GraphedStep(blocks_stack, blocks_opt, compile="blocks")
    torch._dynamo.reset()
    counters.clear()
    for epoch in range(2):
        a = train_epoch(eager, x, y, orders.roll(epoch, 1), 32)
        b = blocks.epoch(x, y, orders.roll(epoch, 1), 32)  # one batch size: one graph
        torch.testing.assert_close(b.loss_sum, a.loss_sum, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1  # not one per block (3), not none (blocks run eagerly)
    want, have = _state(eager_stack, eager_opt), _state(blocks_stack, blocks_opt)
    for name in want:
        torch.testing.assert_close(have[name], want[name], rtol=1e-4, atol=1e-5, msg=name)
    with pytest.raises(ValueError, match="compile='fast'"):
        GraphedStep(*_stack(depth=2), compile="fast")


@pytest.mark.slow
def test_every_stack_compiles_past_dynamos_recompile_limit(monkeypatch):
    """Dynamo keeps its graphs per code object and runs a function eagerly, silently, once it holds
    `recompile_limit` (8) of them: a study's ninth stack shape trained uncompiled. Each stack's step
    compiles a copy with a code object of its own (`stacked.own_code`), whole or per block. Dynamo's own
    "eager" backend stands in for inductor here: the limit is dynamo's, and tracing takes a fraction of a second."""
    from torch._dynamo.utils import counters

    from throughway.train.stacked import compiled_forward, own_code

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **options: real_compile(fn, backend="eager", **options))
    # the mechanism of 8, in two stacks (config.patch: monkeypatch's undo breaks dynamo's config module)
    with torch._dynamo.config.patch(recompile_limit=1):
        limit = torch._dynamo.config.recompile_limit
        x, y, orders = _data(n=32)
        torch._dynamo.reset()
        counters.clear()
        for depth in range(2, 2 * (limit + 2) + 1, 2):  # per block: limit + 1 stacks, each of its own depth
            GraphedStep(*_stack(depth=depth), compile="blocks").epoch(x, y, orders, 32)
        assert counters["stats"]["unique_graphs"] >= limit + 1  # each compiled (a graph break adds one)

        def shared(t):
            return t.sum()

        torch._dynamo.reset()
        counters.clear()
        stack = _stack(depth=2)[0]
        for n in range(1, limit + 3):  # whole: the step's function of limit + 2 stacks, each its own shape
            compiled_forward(stack, shared, True)(torch.ones(n))
        assert counters["stats"]["unique_graphs"] == limit + 2

        torch._dynamo.reset()
        counters.clear()
        for n in range(1, limit + 3):  # the failure guarded against: one shared code object stops at the limit
            torch.compile(shared, dynamic=False)(torch.ones(n))
        assert counters["stats"]["unique_graphs"] == limit
        assert own_code(shared).__code__ is not shared.__code__ and own_code(shared)(torch.ones(3)) == 3
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------
# On a GPU
# ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("recipe", ["gresnet-mnist", "highway-mnist"])
def test_the_captured_epoch_equals_the_eager_one_on_the_gpu(recipe):
    x, y, orders = _data(n=300, device="cuda")
    eager_stack, eager_opt = _stack("cuda", recipe=recipe)
    graph_stack, graph_opt = _stack("cuda", recipe=recipe)
    eager = StackedStep(eager_stack, eager_opt)
    graphed = GraphedStep(graph_stack, graph_opt)
    assert graphed.capture
    for epoch in range(3):
        a = train_epoch(eager, x, y, orders.roll(epoch, 1), 64)  # 300 = 4·64 + 44: two graphs
        b = graphed.epoch(x, y, orders.roll(epoch, 1), 64)
        torch.testing.assert_close(a.loss_sum, b.loss_sum, rtol=1e-5, atol=1e-6)
        assert torch.equal(a.bad_step, b.bad_step)
    assert graphed.captures == 2  # captured once per batch size, then replayed
    want, have = _state(eager_stack, eager_opt), _state(graph_stack, graph_opt)
    for name in want:
        torch.testing.assert_close(have[name].cpu(), want[name].cpu(), rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.gpu
@needs_cuda
def test_a_captured_epoch_does_not_synchronise_per_step():
    """The host waits for the device a fixed number of times per epoch, whatever its length."""
    def synchronisations(n: int) -> int:
        x, y, orders = _data(n=n, device="cuda")
        stack, opt = _stack("cuda")
        graphed = GraphedStep(stack, opt)
        graphed.epoch(x, y, orders, 32)  # captures
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                graphed.epoch(x, y, orders, 32)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return len(caught)

    assert synchronisations(32 * 40) == synchronisations(32 * 4)


@pytest.mark.gpu
@needs_cuda
def test_train_stacked_on_a_gpu_captures_and_rolls_back_a_diverged_member_as_the_eager_step_does(tmp_path,
                                                                                                   fake_mnist_root):
    """The whole trainer on a GPU, with and without graphs: the same member diverges in the same epoch,
    the others end with the same numbers (the same on-device data orders)."""
    configs = [RunConfig(model="mlp_plain", depth=2, recipe="highway-mnist", epochs=3, seed=s, device="cuda",
                         model_kwargs={"width": 8, "norm": "none"},
                         recipe_overrides={"lr": 1e12 if s == 1 else 0.05, "momentum": 0.9, "batch_size": 64})
               for s in range(3)]
    runs = {}
    for graphs in (True, False):
        dirs = [tmp_path / f"{graphs}-{s}" for s in range(3)]
        train_stacked(configs, dirs, progress=False, cuda_graph=graphs)
        runs[graphs] = [read_results(d) for d in dirs]
    assert [r["diverged"] for r in runs[True]] == [False, True, False]
    assert runs[True][1]["diverged_at"]["epoch"] == runs[False][1]["diverged_at"]["epoch"]
    assert runs[True][0]["environment"]["device"].startswith("cuda")
    for s in (0, 2):
        assert len(runs[True][s]["history"]) == 3
        for key in ("train_loss", "test_loss", "test_error_pct"):
            want = runs[False][s]["history"][-1][key]
            assert runs[True][s]["history"][-1][key] == pytest.approx(want, rel=1e-4, abs=1e-5), key


@pytest.mark.gpu
@needs_cuda
def test_a_compiled_step_is_captured_too():
    """compile=True (the studies' default for long batches): torch.compile's kernels inside the graph train
    the steps the same compiled body trains uncaptured, and what the eager kernels train to rounding.
    Last in the file: its compilations take the longest.

    The rule is SGD with momentum (highway-mnist), not NAdam: NAdam's per-coordinate normalisation turns
    the last-bit differences between compiled and eager kernels into whole steps on coordinates whose
    gradient is near zero (the first GPU window, results/device-check/h200-2026-11-26-a: 106 of 2286
    coordinates apart by up to 0.02 after two epochs, the loss sums equal to 1e-4)."""
    x, y, orders = _data(n=200, device="cuda")
    stacks = {name: _stack("cuda", depth=2, recipe="highway-mnist") for name in ("eager", "compiled", "captured")}
    steps = {"eager": StackedStep(*stacks["eager"]),
             "compiled": GraphedStep(*stacks["compiled"], compile=True, capture=False),
             "captured": GraphedStep(*stacks["captured"], compile=True)}
    for epoch in range(2):
        a = train_epoch(steps["eager"], x, y, orders.roll(epoch, 1), 64)
        b = steps["compiled"].epoch(x, y, orders.roll(epoch, 1), 64)
        c = steps["captured"].epoch(x, y, orders.roll(epoch, 1), 64)
        torch.testing.assert_close(c.loss_sum, b.loss_sum, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(c.loss_sum, a.loss_sum, rtol=1e-4, atol=1e-5)
    assert steps["captured"].captures == 2 and steps["compiled"].captures == 0
    torch.testing.assert_close(stacks["captured"][0].flat, stacks["compiled"][0].flat, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stacks["captured"][0].flat, stacks["eager"][0].flat, rtol=1e-3, atol=1e-4)
