"""Training throughput of a WRN-16-4 step on this CPU: the toolkit's loop against a plain PyTorch loop.

    python benchmarks/wrn_step_throughput.py [--steps 10] [--batch 128] [--threads N] [--loss-read {step,lagged}]

Both sides train the same WRN-16-4 (2.7M parameters, no dropout, same initial weights) with the
same optimiser (the wrn-cifar recipe's SGD, Nesterov 0.9, weight decay 5e-4 on the weights, built
by train.build_optimizer), the same batch size (the recipes' 128), on the same random CIFAR-sized
images held in memory, with the same augmentation semantics (zero-pad 4, random 32×32 crop,
horizontal flip with probability 0.5, a fresh draw per image per step):

* toolkit: `throughway.train.fit` with the data resident as one tensor, batches drawn by index and
  augmented on the device in one gather (data.augment.RandomCropFlip), reading each step's loss as
  `--loss-read` says (fit's `loss_read`: "step", the default, or "lagged", which pays on a GPU only);
* baseline: the straightforward PyTorch loop: a Dataset whose __getitem__ pads, crops and flips one
  image at a time, a DataLoader (shuffle, no workers, default collate), forward, loss, backward, step.
  It reads from the same in-memory tensor (no file decoding), so it is the baseline at its fastest.

Each side runs one warm-up step, then `--steps` timed steps that include fetching and augmenting
their batches; the script prints images per second for both and their ratio (toolkit / baseline)
in one run. On a 2-core CPU the convolutions dominate, so expect a ratio near 1: the toolkit's
gain is the per-image Python work it removes, which matters when a GPU makes the step fast.
Time it on a quiet machine: the load average is printed beside the result.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from throughway.data import DataSplits, Split
from throughway.data.augment import RandomCropFlip
from throughway.models import create_model
from throughway.train import build_optimizer, fit, get_recipe


class PerImageCifar(Dataset):
    """The usual per-image augmentation: pad 4, random crop, random flip, one image per call."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = F.pad(self.x[i], (4, 4, 4, 4))
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = image[:, top:top + 32, left:left + 32]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return image, self.y[i]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("wide_resnet", depth=16, widen_factor=4, dropout=0.0, num_classes=10)


def toolkit(x: torch.Tensor, y: torch.Tensor, batch: int, steps: int, loss_read: str = "step") -> float:
    """Images per second of `steps` steps of fit() with `loss_read` (after one warm-up epoch of one step)."""
    recipe = get_recipe("wrn-cifar", epochs=1, batch_size=batch)
    tiny = Split(x[:2], y[:2])  # evaluation is not what is measured: a 2-image split keeps it negligible
    warm = DataSplits("bench", 10, Split(x[:batch], y[:batch]), None, tiny)
    net = model()
    fit(net, warm, recipe, progress=False, train_transform=RandomCropFlip(), loss_read=loss_read)
    data = DataSplits("bench", 10, Split(x[:batch * steps], y[:batch * steps]), None, tiny)
    history = fit(net, data, recipe, progress=False, train_transform=RandomCropFlip(), loss_read=loss_read)
    return batch * steps / history.epochs[0]["epoch_time_s"]


def baseline(x: torch.Tensor, y: torch.Tensor, batch: int, steps: int) -> float:
    """Images per second of `steps` steps of a plain DataLoader loop (after one warm-up step); the
    clock runs from the end of the warm-up step, so it covers every timed batch's loading too."""
    net = model().train()
    optimizer = build_optimizer(net, get_recipe("wrn-cifar", batch_size=batch))
    loader = DataLoader(PerImageCifar(x[:batch * (steps + 1)], y[:batch * (steps + 1)]), batch_size=batch,
                        shuffle=True, num_workers=0, drop_last=True)
    started, trained = 0.0, 0
    for i, (images, labels) in enumerate(loader):
        loss = F.cross_entropy(net(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i == 0:
            started = time.perf_counter()
        else:
            trained += len(labels)
    if trained != batch * steps:
        raise RuntimeError(f"baseline trained {trained} images, expected {batch * steps}")
    return trained / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--loss-read", choices=("step", "lagged"), default="step",
                        help="when the toolkit's fit reads each step's loss (fit's loss_read)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    n = args.batch * (args.steps + 1)
    x = torch.rand(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    ours = toolkit(x, y, args.batch, args.steps, args.loss_read)
    theirs = baseline(x, y, args.batch, args.steps)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"WRN-16-4 training step, batch {args.batch}, {args.steps} timed steps, {args.threads} threads, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} (shared machine)")
    print(f"toolkit loop (resident tensors, batched on-device augmentation, loss_read={args.loss_read}): "
          f"{ours:.1f} images/s")
    print(f"plain PyTorch loop (DataLoader, per-image augmentation):         {theirs:.1f} images/s")
    print(f"ratio toolkit / plain: {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
