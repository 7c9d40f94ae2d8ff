"""Measure the CPU cost of the authors' MNIST recipe (highway-conv-mnist, arch mnist-10) per epoch and
project 5 runs × 300 epochs × widths 16 and 32 (issue 17).

    OMP_NUM_THREADS=1 python results/highway-conv-authors/measure_cost.py [--steps 30] [--device cpu]

Times training steps (batch 100, the recipe's optimiser with its Caffe multipliers) and evaluation
with the process's CPU time (time.process_time), not the wall clock: on a machine shared with other
jobs, one thread's CPU time is what a dedicated core would take. Writes cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from throughway.data import load_dataset
from throughway.data.augment import normalize_splits
from throughway.models import create_model
from throughway.train import build_optimizer, get_recipe
from throughway.train.loop import set_learning_rate

HERE = Path(__file__).resolve().parent


def measure(width: int, steps: int, device: str) -> dict[str, float]:
    """CPU seconds per training step and per evaluated image of the authors' net at `width`."""
    recipe = get_recipe("highway-conv-mnist")
    data = normalize_splits(load_dataset("mnist", train_on_full=True, device=device), recipe.normalize)
    torch.manual_seed(0)
    model = create_model("highway_conv", arch="mnist-10", width=width).to(device)
    optimizer = build_optimizer(model, recipe)
    set_learning_rate(optimizer, recipe.lr)
    x, y = data.train.x, data.train.y
    timer = time.process_time if device == "cpu" else time.perf_counter

    def step(i: int) -> None:
        index = slice(i * recipe.batch_size, (i + 1) * recipe.batch_size)
        loss = F.cross_entropy(model(x[index]), y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    model.train()
    for i in range(3):  # warm-up
        step(i)
    started = timer()
    for i in range(steps):
        step(3 + i)
    step_s = (timer() - started) / steps
    model.eval()
    with torch.no_grad():
        started = timer()
        for start in range(0, 2000, 500):
            model(data.test.x[start:start + 500])
        eval_s_per_image = (timer() - started) / 2000
    epoch_s = step_s * (len(data.train) // recipe.batch_size) + eval_s_per_image * len(data.test)
    return {"width": width, "train_images": len(data.train), "step_s": step_s, "eval_s_per_image": eval_s_per_image,
            "epoch_s": epoch_s, "epochs": recipe.epochs, "run_h": epoch_s * recipe.epochs / 3600}


def main() -> None:
    """Measure both widths, write cost.json, print the projection."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    rows = [measure(w, args.steps, args.device) for w in (16, 32)]
    total_h = 5 * sum(r["run_h"] for r in rows)
    out = {"threads": torch.get_num_threads(), "device": args.device, "steps_timed": args.steps, "widths": rows,
           "runs_per_width": 5, "total_h_one_core": total_h}
    (HERE / "cost.json").write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"width {r['width']}: {r['step_s'] * 1000:.0f} ms/step, {r['epoch_s']:.0f} s/epoch, "
              f"{r['run_h']:.1f} h per 300-epoch run")
    print(f"5 runs x 300 epochs x widths 16 and 32: {total_h:.0f} h on one core ({total_h / 24:.1f} days)")


if __name__ == "__main__":
    main()
