"""Compilation time and step time of a stack compiled whole against compiled per block (`compile="blocks"`).

    python benchmarks/compile_blocks.py [--depths 10 40] [--seeds 1] [--samples 2048] [--threads 2]

A stack of plain, residual and gated residual MLPs (width 50, `--seeds` of each: the Table 1 protocol's
stack) trains one epoch of `--samples` random MNIST-shaped images (batch 128, NAdam) through
`train.graphed.GraphedStep` without capture (on the CPU; on a GPU scripts/device_check.sh times the
captured step), once with the whole forward and loss compiled (`compile=True`) and once with one
block compiled and reused by every block (`compile="blocks"`), each in a fresh process with an empty
inductor cache, so that neither finds compiled code of the other or of an earlier run. Per depth it prints the first epoch's seconds (compilation included),
a later epoch's seconds, and the ratios whole / blocks of both, measured in one run.
`--depths 2 --samples 256` checks that it works in about half a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def one(depth: int, mode: str, seeds: int, samples: int) -> dict[str, float]:
    """First and second epoch seconds of one stack, compiled as `mode` ("whole" or "blocks")."""
    import torch

    from throughway.models import create_model
    from throughway.train import get_recipe
    from throughway.train.graphed import GraphedStep
    from throughway.train.stacked import StackedModels, StackedOptimizer

    models = []
    for name in ("mlp_plain", "mlp_residual", "mlp_gated_residual"):
        for seed in range(seeds):
            torch.manual_seed(seed)
            models.append(create_model(name, depth=depth, width=50))
    stack = StackedModels(models)
    recipe = get_recipe("gresnet-mnist")
    optimizer = StackedOptimizer(stack, [recipe] * len(models))
    optimizer.param_groups[0]["lr"] = torch.full((len(models), 1), recipe.lr)
    step = GraphedStep(stack, optimizer, compile=True if mode == "whole" else "blocks", capture=False)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(samples, 784, generator=g), torch.randint(0, 10, (samples,), generator=g)
    times = []
    for _ in range(2):
        orders = torch.stack([torch.randperm(samples, generator=g) for _ in models])
        start = time.perf_counter()
        step.epoch(x, y, orders, 128).loss_sum.tolist()
        times.append(time.perf_counter() - start)
    return {"first_s": times[0], "epoch_s": times[1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", type=int, nargs="+", default=[10, 40])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--_one", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._one:
        import torch
        torch.set_num_threads(args.threads)
        print(json.dumps(one(int(args._one[0]), args._one[1], args.seeds, args.samples)))
        return
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for depth in args.depths:
        got = {}
        for mode in ("whole", "blocks"):
            with tempfile.TemporaryDirectory() as cache:  # cold: no compiled code on disk from an earlier run
                done = subprocess.run([sys.executable, __file__, "--_one", str(depth), mode, "--seeds", str(args.seeds),
                                       "--samples", str(args.samples), "--threads", str(args.threads)],
                                      capture_output=True, text=True, check=True,
                                      env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache,
                                           "TRITON_CACHE_DIR": os.path.join(cache, "triton")})
            got[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"d = {depth} {mode}: first epoch {got[mode]['first_s']:.1f} s (compilation included), "
                  f"epoch {got[mode]['epoch_s']:.3f} s", flush=True)
        print(f"RATIO d = {depth} first epoch whole / blocks: {got['whole']['first_s'] / got['blocks']['first_s']:.2f}x; "
              f"epoch whole / blocks: {got['whole']['epoch_s'] / got['blocks']['epoch_s']:.2f}x", flush=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
