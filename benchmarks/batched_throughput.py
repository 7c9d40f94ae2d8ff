"""Aggregate training throughput of N batched models against the same N trained one after another.

    python benchmarks/batched_throughput.py [--threads 2] [--models 32 8] [--depth 20] [--samples 3072]
                                            [--rounds 3] [--compile] [--skip-design] [--skip-profile]

Measured in one run on this machine (issue 5), on random data of MNIST's shape held in memory
(throughput does not depend on the values), every model a depth-20 gated residual MLP (width 50,
BatchNorm; the gresnet-mnist recipe: NAdam, batch 128):

* sequential: the N models trained one after another, each by `throughway.train.fit` (the ordinary
  loop: one epoch over `--samples` images, then its evaluation on a 100-image test split);
* batched: the same N models as one `StackedModels`, one epoch of `throughway.train.stacked.train_epoch`
  (the inner loop of `train_stacked`: per-model permutation, gather, forward, backward, optimiser);
* throughput = samples per second summed over the models; the headline is batched / sequential for
  N = 32 (target ≥ 10×) and N = 8. The contenders are timed in interleaved rounds and summarised by
  their median round, so that a change of load hits all alike;
* `--compile`: the largest N again with torch.compile over the forward + loss and the optimiser
  (StackedStep(compile=True)); compilation is paid in a warm-up outside the timing and reported;
* where the time of one batched step goes: the phases (gather, forward + loss, backward, optimiser)
  and the operators (torch.profiler, self CPU time per step);
* the fp32 matrix-product ceiling of the machine (a large square `torch.mm`, at the start and at the
  end) and the fraction of it that the batched step's matrix products reach;
* the design measurements: stacked batched products against torch.func.vmap over functional_call
  (forward + backward), and the flat (N, P) NAdam step against torch's multi-tensor (foreach) NAdam
  over the models' parameter tensors.

Run it on a quiet machine: the load average is printed at the start and the end. `--depth 2
--models 4 2 --samples 512 --rounds 1` checks that it works in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

import torch
from torch.nn import functional as F

from throughway.data import DataSplits, Split
from throughway.models import create_model
from throughway.train import fit, get_recipe
from throughway.train.loop import epoch_starts
from throughway.train.stacked import StackedModels, StackedOptimizer, StackedStep, backward, train_epoch

MODEL, WIDTH, FEATURES, CLASSES = "mlp_gated_residual", 50, 784, 10
RECIPE = get_recipe("gresnet-mnist")
BATCH = RECIPE.batch_size


def build(n: int, depth: int) -> list[torch.nn.Module]:
    """n models of one shape, model i initialised from seed i (as a run with seed i)."""
    out = []
    for seed in range(n):
        torch.manual_seed(seed)
        out.append(create_model(MODEL, depth=depth, width=WIDTH))
    return out


def random_data(samples: int) -> DataSplits:
    """MNIST-shaped random data, in memory, with a 100-image test split for fit's evaluation."""
    g = torch.Generator().manual_seed(0)
    train = Split(torch.rand(samples, FEATURES, generator=g), torch.randint(0, CLASSES, (samples,), generator=g))
    test = Split(torch.rand(100, FEATURES, generator=g), torch.randint(0, CLASSES, (100,), generator=g))
    return DataSplits("random", CLASSES, train, None, test)


def sequential_epochs(models: list[torch.nn.Module], data: DataSplits) -> Callable[[], list[float]]:
    """A function that trains each model for one epoch by `fit`, one after another, and returns the
    seconds each took."""
    recipe = RECIPE.replace(epochs=1)

    def run() -> list[float]:
        times = []
        for seed, model in enumerate(models):
            start = time.perf_counter()
            fit(model, data, recipe, seed=seed, progress=False)
            times.append(time.perf_counter() - start)
        return times

    return run


def batched_epoch(n: int, depth: int, data: DataSplits, compile: bool = False) -> tuple[StackedStep, Callable[[], float]]:
    """The batched step of n models and a function that trains one epoch of them, as
    `train_stacked` does (a permutation per model from its own generator), and returns its seconds."""
    stack = StackedModels(build(n, depth))
    step = StackedStep(stack, StackedOptimizer(stack, [RECIPE] * n, compile=compile), compile=compile)
    generators = [torch.Generator().manual_seed(seed) for seed in range(n)]
    samples = len(data.train)

    def run() -> float:
        start = time.perf_counter()
        orders = torch.stack([torch.randperm(samples, generator=g) for g in generators])
        totals = train_epoch(step, data.train.x, data.train.y, orders, BATCH)
        float(totals.loss_sum.sum())  # as train_stacked, which reads the totals at the epoch's end
        return time.perf_counter() - start

    return step, run


def matmul_ceiling(size: int = 2048, repeats: int = 10) -> float:
    """GFLOP/s of a large fp32 square matrix product."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size ** 3 * repeats / (time.perf_counter() - start) / 1e9


def step_flops(n: int, depth: int) -> float:
    """Matrix-product FLOPs of one training step of n models: forward 2·B·in·out per Linear, backward
    the same for the weight gradient and, except for the first layer, again for the input gradient."""
    linears = [(FEATURES, WIDTH, False)] + [(WIDTH, WIDTH, True)] * depth + [(WIDTH, CLASSES, True)]
    return n * sum(2 * BATCH * i * o * (3 if grad_in else 2) for i, o, grad_in in linears)


def _batch(n: int, data: DataSplits, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    index = torch.randint(0, len(data.train), (n, BATCH), generator=g)
    return data.train.x[index], data.train.y[index]


def phases(step: StackedStep, data: DataSplits, steps: int) -> dict[str, float]:
    """Mean seconds per step of each phase of the eager batched step."""
    n = step.stack.n
    out = {"gather": 0.0, "forward + loss": 0.0, "backward": 0.0, "optimiser": 0.0}
    for i in range(steps + 2):
        t0 = time.perf_counter()
        x, y = _batch(n, data, i)
        t1 = time.perf_counter()
        losses, _ = step._forward_loss(x, y)
        t2 = time.perf_counter()
        step.stack.grad.zero_()
        backward(losses.sum())
        t3 = time.perf_counter()
        step.optimizer.step()
        t4 = time.perf_counter()
        if i >= 2:  # two warm-up steps
            for key, (a, b) in zip(out, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
                out[key] += (b - a) / steps
    return out


def profile_table(step: StackedStep, data: DataSplits, steps: int = 5) -> str:
    """torch.profiler's operator table of `steps` eager batched steps, times divided per step."""
    from torch.profiler import ProfilerActivity, profile

    n = step.stack.n
    batches = [_batch(n, data, i) for i in range(steps)]
    step(*batches[0])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x, y in batches:
            step(x, y)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:16]
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    lines = [f"  {'operator':<42} {'self ms/step':>12} {'share':>7} {'calls/step':>10}"]
    for e in rows:
        lines.append(f"  {e.key[:42]:<42} {e.self_cpu_time_total / 1e3 / steps:>12.2f} "
                     f"{100 * e.self_cpu_time_total / total:>6.1f}% {e.count / steps:>10.0f}")
    lines.append(f"  {'total (profiled, with overhead)':<42} {total / 1e3 / steps:>12.2f}")
    return "\n".join(lines)


def time_vmap_vs_bmm(n: int, depth: int, steps: int) -> tuple[float, float]:
    """Forward + backward seconds per step: torch.func.vmap over functional_call, and stacked products."""
    from torch.func import functional_call, grad, replace_all_batch_norm_modules_, stack_module_state, vmap

    models = build(n, depth)
    for m in models:
        replace_all_batch_norm_modules_(m)  # vmap cannot update running statistics in place
    params, buffers = stack_module_state(models)
    base = models[0]
    g = torch.Generator().manual_seed(1)
    xb = torch.randn(n, BATCH, FEATURES, generator=g)
    yb = torch.randint(0, CLASSES, (n, BATCH), generator=g)

    def loss_fn(p: Any, b: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

    vgrad = vmap(grad(loss_fn))
    stack = StackedModels(build(n, depth))  # with BatchNorm running statistics, as training keeps them

    def run_vmap() -> None:
        vgrad(params, buffers, xb, yb)

    def run_stacked() -> None:
        logits = stack.forward_logits(xb, training=True)
        stack.grad.zero_()
        backward(F.cross_entropy(logits, yb, reduction="none").mean(1).sum())

    out = []
    for fn in (run_vmap, run_stacked):
        for _ in range(2):
            fn()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        out.append((time.perf_counter() - start) / steps)
    return out[0], out[1]


def time_optimizers(n: int, depth: int, steps: int) -> tuple[float, float]:
    """Seconds per NAdam step for n models: torch.optim.NAdam(foreach=True) over every model's
    parameters (one multi-tensor optimiser, n·P tensors), and StackedOptimizer over the flat matrix."""
    models = build(n, depth)
    params = [p for m in models for p in m.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    torch_opt = torch.optim.NAdam(params, lr=RECIPE.lr, momentum_decay=RECIPE.momentum_decay, foreach=True)
    stack = StackedModels(models)
    stack.grad.normal_()
    ours = StackedOptimizer(stack, [RECIPE] * n)
    out = []
    for fn in (torch_opt.step, ours.step):
        for _ in range(2):
            fn()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        out.append((time.perf_counter() - start) / steps)
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2, this machine's cores)")
    parser.add_argument("--models", type=int, nargs="+", default=[32, 8], help="values of N (default 32 8)")
    parser.add_argument("--depth", type=int, default=20, help="middle layers d of the gated residual MLP (default 20)")
    parser.add_argument("--samples", type=int, default=3072, help="training images per epoch (default 3072: 24 steps)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    parser.add_argument("--compile", action="store_true",
                        help="also time the largest N with torch.compile (minutes of compilation, paid before timing)")
    parser.add_argument("--skip-design", action="store_true", help="skip the vmap and foreach comparisons")
    parser.add_argument("--skip-profile", action="store_true", help="skip the phase and operator profile")
    args = parser.parse_args()
    if any(n < 1 for n in args.models) or args.depth < 0 or args.depth % 2 or args.samples < 2 * BATCH:
        parser.error("--models must be ≥ 1, --depth even and ≥ 0, --samples ≥ 256")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, cpu_count {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    ceiling = matmul_ceiling()
    print(f"fp32 matmul ceiling (2048² mm): {ceiling:.1f} GFLOP/s")

    data = random_data(args.samples)
    sizes = sorted(set(args.models), reverse=True)
    biggest = sizes[0]
    sequential = sequential_epochs(build(biggest, args.depth), data)
    contenders: dict[str, Callable[[], float]] = {}
    steps: dict[str, StackedStep] = {}
    for n in sizes:
        steps[f"N={n}"], contenders[f"N={n}"] = batched_epoch(n, args.depth, data)
    if args.compile:
        key = f"N={biggest} compiled"
        steps[key], contenders[key] = batched_epoch(biggest, args.depth, data, compile=True)
        start = time.perf_counter()
        contenders[key]()  # compilation happens in this first epoch, outside the timing
        print(f"torch.compile of the N={biggest} batched step (forward + loss + backward, optimiser): "
              f"first epoch incl. compilation {time.perf_counter() - start:.0f} s")
    fit(build(1, args.depth)[0], data, RECIPE.replace(epochs=1), progress=False)  # warm-up
    for run in contenders.values():
        run()  # warm-up

    seq_times: list[list[float]] = []
    timings: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        seq_times.append(sequential())
        for key, run in contenders.items():
            timings[key].append(run())
    steps_per_epoch = len(epoch_starts(args.samples, BATCH))
    print(f"timing: {args.rounds} interleaved round(s), each one epoch of {args.samples} images "
          f"({steps_per_epoch} steps of {BATCH}) per contender; median round")
    results = {}
    for n in sizes:
        seq = statistics.median(sum(t[:n]) for t in seq_times)
        seq_throughput = n * args.samples / seq
        print(f"\nN={n}, depth-{args.depth} gated residual MLPs, width {WIDTH}:")
        print(f"  sequential, fit one model after another: {seq:.2f} s for {n} epochs, "
              f"{seq_throughput:.0f} samples/s ({1e3 * seq / n / steps_per_epoch:.2f} ms per model-step)")
        for key in [k for k in contenders if k == f"N={n}" or k == f"N={n} compiled"]:
            t = statistics.median(timings[key])
            throughput = n * args.samples / t
            gflops = step_flops(n, args.depth) * steps_per_epoch / t / 1e9
            spread = max(timings[key]) / min(timings[key])
            print(f"  batched{' + torch.compile' if 'compiled' in key else ''}: {t:.2f} s for the epoch of all {n}, "
                  f"{throughput:.0f} samples/s, {1e3 * t / steps_per_epoch:.1f} ms per step; "
                  f"matmul {gflops:.1f} GFLOP/s = {100 * gflops / ceiling:.1f}% of the ceiling; spread {spread:.2f}")
            print(f"  RATIO {key}{'' if 'compiled' in key else ' eager'}: {throughput / seq_throughput:.2f}x "
                  f"the ordinary loop{' (target >= 10x)' if n == 32 else ''}")
            results[key] = throughput / seq_throughput

    if not args.skip_profile:
        step = steps[f"N={biggest}"]
        parts = phases(step, data, 8)
        total = sum(parts.values())
        print(f"\nwhere one eager batched step of N={biggest} goes ({1e3 * total:.1f} ms, mean of 8 steps): "
              + ", ".join(f"{k} {1e3 * v:.1f} ms ({100 * v / total:.0f}%)" for k, v in parts.items()))
        print(f"profile of the eager N={biggest} step (self CPU time per step, by operator):")
        print(profile_table(step, data))
    if not args.skip_design:
        t_vmap, t_stacked = time_vmap_vs_bmm(biggest, args.depth, 5)
        print(f"\ndesign, N={biggest} depth {args.depth} forward + backward: vmap(functional_call) "
              f"{t_vmap * 1e3:.1f} ms, stacked batched products {t_stacked * 1e3:.1f} ms ({t_vmap / t_stacked:.2f}x)")
        t_foreach, t_flat = time_optimizers(biggest, args.depth, 5)
        print(f"design, N={biggest} NAdam step: torch foreach over the models' tensors {t_foreach * 1e3:.1f} ms, "
              f"flat batched matrix {t_flat * 1e3:.1f} ms ({t_foreach / t_flat:.2f}x)")
    print(f"\nfp32 matmul ceiling again at the end: {matmul_ceiling():.1f} GFLOP/s; "
          f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
