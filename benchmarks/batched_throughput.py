"""Aggregate training throughput of N batched models against the same N trained one after another.

Measured in one run on this machine (issue 5):

* N = 32 and N = 8 depth-20 gated residual MLPs (width 50, BatchNorm, the gresnet-mnist recipe:
  NAdam, batch 128): samples per second summed over the models, for `throughway.train.batched`
  (StackedModels + BatchedOptimizer, the inner loop of `train_batched`) and for the ordinary loop of
  `fit` (forward, cross-entropy, backward, torch.optim.NAdam step) on one model. The sequential
  figure times steps of one model and extrapolates: N models one after another take N times as
  long, so their aggregate throughput equals one model's. The contenders are timed in interleaved
  rounds and summarised by their median round, because the machine is shared.
* the design measurements: stacked `baddbmm` against `torch.func.vmap` over `functional_call`
  (forward + backward, N = 32, depth 20; vmap's models have BatchNorm without running statistics,
  since vmap cannot update them in place), and the flat batched NAdam against torch's multi-tensor
  (foreach) NAdam over the 32 models' parameter tensors;
* where the time of one batched step goes (torch.profiler, self CPU time by operator);
* the fp32 matrix-product ceiling of the machine (a large square `torch.mm`) and the fraction of it
  that the batched step reaches (FLOPs of its matrix products / step time).

Usage: python benchmarks/batched_throughput.py [--threads 2] [--steps 40] [--rounds 5] [--compile]
The data are random tensors of MNIST's shape (throughput does not depend on their values).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
from torch.nn import functional as F

from throughway.models import create_model
from throughway.train import get_recipe
from throughway.train.batched import BatchedOptimizer, StackedModels, backward
from throughway.train.recipes import build_optimizer

WIDTH, DEPTH, BATCH, FEATURES, CLASSES = 50, 20, 128, 784, 10


def build(n: int, model: str = "mlp_gated_residual") -> list[torch.nn.Module]:
    out = []
    for seed in range(n):
        torch.manual_seed(seed)
        out.append(create_model(model, depth=DEPTH, width=WIDTH))
    return out


def sequential_step_fn(x: torch.Tensor, y: torch.Tensor):
    """One step of one model by fit's inner loop (forward, loss, float(loss), zero_grad, backward, NAdam step)."""
    model = build(1)[0]
    model.train()
    opt = build_optimizer(model, get_recipe("gresnet-mnist"))

    def step(i: int) -> None:
        xb, yb = x[i % len(x)], y[i % len(y)]
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        float(loss.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        int((logits.detach().argmax(1) != yb).sum())

    return step


def timed(step, steps: int, start_index: int = 0) -> float:
    """Seconds per step over `steps` calls."""
    start = time.perf_counter()
    for i in range(start_index, start_index + steps):
        step(i)
    return (time.perf_counter() - start) / steps


def batched_step_fn(n: int, x: torch.Tensor, y: torch.Tensor, compile: bool = False):
    stack = StackedModels(build(n))
    recipe = get_recipe("gresnet-mnist")
    opt = BatchedOptimizer(stack, [recipe] * n, compile=compile)
    lr = torch.full((n, 1), recipe.lr)
    loss_sum = torch.zeros(n, dtype=torch.float64)
    wrong = torch.zeros(n, dtype=torch.long)

    def forward_loss(xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = stack.forward(xb, training=True)
        losses = F.cross_entropy(logits.reshape(-1, CLASSES), yb.reshape(-1), reduction="none").view(n, -1).mean(1)
        return logits, losses

    fl = torch.compile(forward_loss) if compile else forward_loss

    def step(i: int) -> None:
        xb = xs[i % len(xs)]
        yb = ys[i % len(ys)]
        logits, losses = fl(xb, yb)
        stack.grad.zero_()
        backward(losses.sum())
        opt.step(lr)
        with torch.no_grad():
            nonlocal loss_sum, wrong
            loss_sum += losses.detach().double() * BATCH
            wrong += (logits.detach().argmax(2) != yb).sum(1)

    # Each model its own batch, as in training (a gather from the data per model).
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, BATCH, FEATURES, generator=g) for _ in range(4)]
    ys = [torch.randint(0, CLASSES, (n, BATCH), generator=g) for _ in range(4)]
    return stack, step


def time_vmap_vs_bmm(n: int, steps: int) -> tuple[float, float]:
    """Forward + backward seconds per step: torch.func.vmap over functional_call, and stacked bmm."""
    from torch.func import functional_call, grad, replace_all_batch_norm_modules_, stack_module_state, vmap

    models = build(n)
    for m in models:
        replace_all_batch_norm_modules_(m)  # vmap cannot update running statistics in place
    params, buffers = stack_module_state(models)
    base = models[0]
    g = torch.Generator().manual_seed(1)
    xb = torch.randn(n, BATCH, FEATURES, generator=g)
    yb = torch.randint(0, CLASSES, (n, BATCH), generator=g)

    def loss_fn(p, b, x, y):
        return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

    vgrad = vmap(grad(loss_fn))

    def run_vmap() -> None:
        vgrad(params, buffers, xb, yb)

    stack = StackedModels(build(n))  # with BatchNorm running statistics, as training keeps them

    def run_bmm() -> None:
        logits = stack.forward(xb, training=True)
        loss = F.cross_entropy(logits.reshape(-1, CLASSES), yb.reshape(-1), reduction="none").view(n, -1).mean(1)
        stack.grad.zero_()
        backward(loss.sum())

    out = []
    for fn in (run_vmap, run_bmm):
        for _ in range(3):
            fn()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        out.append((time.perf_counter() - start) / steps)
    return out[0], out[1]


def time_optimizers(n: int, steps: int) -> tuple[float, float]:
    """Seconds per NAdam step for n models: torch.optim.NAdam(foreach=True) over every model's
    parameters (one multi-tensor optimiser, n·P tensors), and BatchedOptimizer over the flat matrix."""
    models = build(n)
    params = [p for m in models for p in m.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    torch_opt = torch.optim.NAdam(params, lr=0.002, momentum_decay=0.004, foreach=True)
    stack = StackedModels(models)
    stack.grad.normal_()
    ours = BatchedOptimizer(stack, [get_recipe("gresnet-mnist")] * n)
    lr = torch.full((n, 1), 0.002)
    out = []
    for fn in (torch_opt.step, lambda: ours.step(lr)):
        for _ in range(3):
            fn()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        out.append((time.perf_counter() - start) / steps)
    return out[0], out[1]


def matmul_ceiling(size: int = 2048, repeats: int = 10) -> float:
    """GFLOP/s of a large fp32 square matrix product."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size ** 3 * repeats / (time.perf_counter() - start) / 1e9


def step_flops(n: int) -> float:
    """Matrix-product FLOPs of one training step of n models: forward 2·B·in·out per Linear, backward
    the same for the weight gradient and (except the first layer) the same again for the input gradient."""
    linears = [(FEATURES, WIDTH, False)] + [(WIDTH, WIDTH, True)] * DEPTH + [(WIDTH, CLASSES, True)]
    per_model = sum(2 * BATCH * i * o * (3 if grad_in else 2) for i, o, grad_in in linears)
    return per_model * n


def profile_step(n: int, x: torch.Tensor, y: torch.Tensor) -> str:
    from torch.profiler import ProfilerActivity, profile

    _, step = batched_step_fn(n, x, y)
    for i in range(3):
        step(i)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(5):
            step(i)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per contender (all rounds)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--compile", action="store_true",
                        help="also time N=32 with torch.compile of the batched forward and optimiser (minutes of compilation)")
    parser.add_argument("--skip-profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, cpu_count {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, BATCH, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (8, BATCH), generator=g)

    ceiling = matmul_ceiling()
    print(f"fp32 matmul ceiling (2048² mm): {ceiling:.1f} GFLOP/s")
    # The machine is shared: the contenders are timed in interleaved rounds (each round: one block of
    # steps of each), and each is summarised by its median round, so a load change hits all alike.
    steps = {"seq": sequential_step_fn(x, y)}
    for n in (32, 8):
        steps[n] = batched_step_fn(n, x, y)[1]
    if args.compile:
        start = time.perf_counter()
        steps["32c"] = batched_step_fn(32, x, y, compile=True)[1]
        for i in range(3):
            steps["32c"](i)  # compilation happens here
        print(f"torch.compile of the N=32 batched forward and optimiser: {time.perf_counter() - start:.0f} s to compile")
    for step in steps.values():
        for i in range(3):
            step(i)  # warm-up
    per_round = max(1, args.steps // args.rounds)
    samples: dict[Any, list[float]] = {k: [] for k in steps}
    for r in range(args.rounds):
        for key, step in steps.items():
            samples[key].append(timed(step, per_round, r * per_round))
    med = {k: statistics.median(v) for k, v in samples.items()}
    t_one = med["seq"]
    seq_throughput = BATCH / t_one
    print(f"timing: {args.rounds} interleaved rounds of {per_round} steps each, median round; "
          f"spread (max/min round) seq {max(samples['seq']) / min(samples['seq']):.2f}")
    print(f"ordinary loop, one depth-{DEPTH} gated residual model: {t_one * 1e3:.2f} ms/step, "
          f"{seq_throughput:.0f} samples/s (N models one after another: the same aggregate)")
    for key in [k for k in steps if k != "seq"]:
        n = 32 if key == "32c" else key
        t_n = med[key]
        throughput = n * BATCH / t_n
        gflops = step_flops(n) / t_n / 1e9
        label = "N=32 + torch.compile(forward, optimiser)" if key == "32c" else f"N={n:>2}"
        print(f"batched {label}: {t_n * 1e3:.2f} ms/step, {throughput:.0f} samples/s summed over models, "
              f"{throughput / seq_throughput:.2f}x the ordinary loop; matmul {gflops:.1f} GFLOP/s "
              f"= {100 * gflops / ceiling:.1f}% of the ceiling; spread {max(samples[key]) / min(samples[key]):.2f}")
    t_vmap, t_bmm = time_vmap_vs_bmm(32, max(5, args.steps // 3))
    print(f"design, N=32 depth {DEPTH} forward+backward: vmap(functional_call) {t_vmap * 1e3:.1f} ms, "
          f"stacked baddbmm {t_bmm * 1e3:.1f} ms ({t_vmap / t_bmm:.2f}x)")
    t_foreach, t_flat = time_optimizers(32, max(5, args.steps // 3))
    print(f"design, N=32 NAdam step: torch foreach over the 32 models' tensors {t_foreach * 1e3:.1f} ms, "
          f"flat batched matrix {t_flat * 1e3:.1f} ms ({t_foreach / t_flat:.2f}x)")
    if not args.skip_profile:
        print("profile of 5 batched steps, N=32 (self CPU time by operator):")
        print(profile_step(32, x, y))
    print(f"fp32 matmul ceiling again at the end: {matmul_ceiling():.1f} GFLOP/s")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
