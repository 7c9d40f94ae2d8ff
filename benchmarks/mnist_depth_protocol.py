"""Projected wall time of the 5-seed MNIST depth protocol (gated-residual-v2 Table 1) on this machine.

    python benchmarks/mnist_depth_protocol.py [--seeds 5] [--depths 2 10 20 50 100] [--samples 6400]
                                              [--rounds 3] [--jobs 2]

The protocol: plain, residual and gated residual MLPs (width 50, the paper's linear first layer),
d in {2, 10, 20, 50, 100}, `--seeds` seeds each, 100 epochs of 60,000 images (batch 128, NAdam)
and one evaluation of the 10,000 test images per epoch. Both contenders are timed in the same run,
on random data of MNIST's shape held in memory, with `--jobs` single-thread worker processes'
thread setting (one thread each):

* baseline: one model at a time, each by `throughway.train.fit` (the ordinary loop), as
  `reproduce mnist-depth --seeds 1 --jobs 2` trains them: the per-model seconds per epoch of each
  (architecture, depth), scaled to 60,000 images, times the runs, handed to `--jobs` workers;
* batched: what `reproduce mnist-depth --seeds N` trains: per depth one batch of 3·N models (plain,
  residual and gated together, `train.stack`), one epoch of `train_epoch` on `--samples` images,
  scaled to 60,000 images, plus one evaluation pass; the depth batches handed to `--jobs` workers
  (`makespan`, deepest first, as run_stacked hands them).

Prints per depth the seconds per epoch of each, the projected hours of the whole protocol for each,
and the ratio baseline / batched. The rounds are interleaved and the median round kept, so that a
change of load hits both alike; the load average is printed at the start and the end: run it on a
quiet machine. `--depths 2 --seeds 2 --samples 640 --rounds 1` checks that it works in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from throughway.data import DataSplits, Split
from throughway.study.stacking import makespan
from throughway.models import create_model
from throughway.train import fit, get_recipe
from throughway.train.stacked import StackedModels, StackedOptimizer, StackedStep, train_epoch

ARCHS = {"plain": "mlp_plain", "residual": "mlp_residual", "gated": "mlp_gated_residual"}
RECIPE = get_recipe("gresnet-mnist")
TRAIN, TEST, EPOCHS = 60_000, 10_000, 100


def random_data(samples: int) -> DataSplits:
    """`samples` random MNIST-shaped training images and 100 test images (speed does not depend on values)."""
    g = torch.Generator().manual_seed(0)
    train = Split(torch.rand(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g))
    test = Split(torch.rand(100, 1, 28, 28, generator=g), torch.randint(0, 10, (100,), generator=g))
    return DataSplits("random", 10, train, None, test)


def fit_epoch_s(model_name: str, depth: int, data: DataSplits) -> tuple[float, float]:
    """Seconds of one `fit` training epoch of one model over `data`'s training images (the second of
    two, as fit records it), and its seconds per evaluated sample (one forward pass, evaluation mode)."""
    torch.manual_seed(0)
    model = create_model(model_name, depth=depth)
    history = fit(model, data, RECIPE.replace(epochs=2), progress=False)
    with torch.no_grad():
        model.eval()
        probe = torch.rand(2500, 784)
        model(probe)
        start = time.perf_counter()
        model(probe)
        eval_per_sample = (time.perf_counter() - start) / 2500
    return history.epochs[-1]["epoch_time_s"], eval_per_sample


def batched_epoch_s(depth: int, seeds: int, data: DataSplits, compile: bool = False) -> tuple[float, float, float]:
    """Seconds of one `train_epoch` of the mixed batch of 3·seeds models over `data`, seconds per
    evaluated sample of the batch (one forward pass in evaluation mode), and seconds spent compiling.
    `compile`: the step through torch.compile, compiled by two warm-up steps outside the epoch's
    timing (their time is the third value; 0.0 when eager)."""
    models = []
    for name in ARCHS.values():
        for seed in range(seeds):
            torch.manual_seed(seed)
            models.append(create_model(name, depth=depth))
    stack = StackedModels(models)
    step = StackedStep(stack, StackedOptimizer(stack, [RECIPE] * len(models), compile=compile), compile=compile)
    n = len(data.train)
    x, y = data.train.x.flatten(1), data.train.y
    orders = torch.stack([torch.randperm(n) for _ in models])
    compile_s = 0.0
    if compile:
        start = time.perf_counter()
        for _ in range(2):
            step(x[orders[:, :RECIPE.batch_size]], y[orders[:, :RECIPE.batch_size]])
        compile_s = time.perf_counter() - start
    start = time.perf_counter()
    train_epoch(step, x, y, orders, RECIPE.batch_size)
    train_s = time.perf_counter() - start
    with torch.no_grad():
        probe = torch.rand(2500, 784)
        stack.forward_logits(probe, training=False)
        start = time.perf_counter()
        stack.forward_logits(probe, training=False)
        eval_per_sample = (time.perf_counter() - start) / 2500
    return train_s, eval_per_sample, compile_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 10, 20, 50, 100])
    parser.add_argument("--samples", type=int, default=6400, help="training images per timed epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes of one thread each")
    parser.add_argument("--compile", action="store_true",
                        help="the batched contender through torch.compile (compilation outside the timing, printed per depth)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = random_data(args.samples)
    scale = TRAIN / args.samples
    print(f"load average at start: {os.getloadavg()[0]:.2f}; threads per worker: 1; workers: {args.jobs}; "
          f"timed on {args.samples} images, scaled to {TRAIN}; batched step "
          f"{'torch.compile' if args.compile else 'eager'}")
    fit_per_model: dict[int, float] = {}
    batch_epoch: dict[int, float] = {}
    compile_per_batch: dict[int, float] = {}
    print("| d | fit: s/epoch per model (mean of 3 archs) | batched: s/epoch per batch of "
          f"{3 * args.seeds} | per-model speed-up |")
    print("|---|---|---|---|")
    for depth in args.depths:
        fit_rounds, batch_rounds, compile_rounds = [], [], []
        for _ in range(args.rounds):  # interleaved: a change of load hits both
            per_arch = [fit_epoch_s(m, depth, data) for m in ARCHS.values()]
            fit_rounds.append(statistics.mean(train * scale + per * TEST for train, per in per_arch))
            train_s, eval_per, compile_s = batched_epoch_s(depth, args.seeds, data, args.compile)
            batch_rounds.append(train_s * scale + eval_per * TEST)
            compile_rounds.append(compile_s)
        fit_per_model[depth] = statistics.median(fit_rounds)
        batch_epoch[depth] = statistics.median(batch_rounds)
        compile_per_batch[depth] = compile_rounds[0]  # the first compilation of the process: a cold cache
        speedup = fit_per_model[depth] * 3 * args.seeds / batch_epoch[depth]
        print(f"| {depth} | {fit_per_model[depth]:.2f} | {batch_epoch[depth]:.2f} | {speedup:.2f}x |")
    baseline = makespan([fit_per_model[d] * EPOCHS for d in sorted(args.depths, reverse=True)
                         for _ in range(3 * args.seeds)], args.jobs)
    batched = makespan([batch_epoch[d] * EPOCHS for d in sorted(args.depths, reverse=True)], args.jobs)
    print()
    print(f"projected protocol ({3 * args.seeds * len(args.depths)} models x {EPOCHS} epochs, {args.jobs} workers): "
          f"one model at a time by fit {baseline / 3600:.2f} h; batched per depth {batched / 3600:.2f} h; "
          f"ratio {baseline / batched:.2f}x")
    if args.compile:
        print("compilation (not in the projection; first warm-up of each depth's batch): "
              + ", ".join(f"d = {d}: {compile_per_batch[d]:.0f} s" for d in args.depths)
              + f"; total {sum(compile_per_batch.values()) / 60:.1f} min")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
