"""On-device data augmentation and normalisation for image data resident in device memory.

* `normalize_splits`: per-channel mean subtraction (pre-activation ResNets, gated-residual-v2 §3.2:
  "the only pre-processing consists of mean subtraction") or mean/std normalisation (Wide ResNets:
  "images are mean/std normalized"), with statistics from the training split only, applied to every
  split once; or "pixels/256": the raw pixel values divided by 256 instead of the loader's 255,
  Caffe's `scale: 0.00390625` of the highway authors' MNIST net (mnist_network.prototxt line 13).
* `RandomCropFlip`: the papers' "moderate data augmentation": pad 4 pixels with zeros, take a random
  32×32 crop, flip horizontally with probability 0.5 (gated-residual-v2 §3.2). It works on a whole
  batch on the batch's device in one gather: no DataLoader, no workers, no per-image Python.

Randomness comes from torch's default generator of the batch's device, which the training
checkpoints save and restore, so an interrupted augmented run resumes exactly.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .loader import DataSplits, Split

__all__ = ["NORMALIZATIONS", "channel_stats", "normalize_splits", "RandomCropFlip"]

NORMALIZATIONS = ("none", "mean", "mean-std", "pixels/256")


def channel_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation of images x (N, C, H, W), each of shape (C,), float64 sums."""
    if x.dim() != 4:
        raise ValueError(f"channel_stats needs images (N, C, H, W); got shape {tuple(x.shape)}")
    flat = x.transpose(0, 1).reshape(x.shape[1], -1).double()
    return flat.mean(dim=1).float(), flat.std(dim=1, unbiased=False).float()


def normalize_splits(data: DataSplits, mode: str) -> DataSplits:
    """Return new DataSplits with every split normalised by the training split's channel statistics.

    mode "mean" subtracts the per-channel mean, "mean-std" also divides by the per-channel std,
    "pixels/256" maps pixels p/255 (the loader's scaling) to p/256 with no statistics at all, "none"
    returns `data` unchanged. The test and validation splits never contribute statistics.
    """
    if mode not in NORMALIZATIONS:
        raise ValueError(f"normalize={mode!r} is not known; accepted values: {list(NORMALIZATIONS)}")
    if mode == "none":
        return data
    if mode == "pixels/256":
        # The loader divided uint8 pixels by 255; rounding recovers them exactly, and /256 is exact.
        def rescale(split: Split | None) -> Split | None:
            return None if split is None else Split(torch.round(split.x * 255.0) / 256.0, split.y)

        return DataSplits(name=data.name, num_classes=data.num_classes, train=rescale(data.train),  # type: ignore[arg-type]
                          val=rescale(data.val), test=rescale(data.test))  # type: ignore[arg-type]
    mean, std = channel_stats(data.train.x)
    shift = mean.view(1, -1, 1, 1)
    scale = std.clamp_min(1e-8).view(1, -1, 1, 1) if mode == "mean-std" else torch.ones_like(shift)

    def apply(split: Split | None) -> Split | None:
        return None if split is None else Split((split.x - shift) / scale, split.y)

    return DataSplits(name=data.name, num_classes=data.num_classes, train=apply(data.train),  # type: ignore[arg-type]
                      val=apply(data.val), test=apply(data.test))  # type: ignore[arg-type]


class RandomCropFlip:
    """Batch transform: zero-pad `padding` pixels, random crop back to the input size, horizontal flip
    with probability `flip_p` (gated-residual-v2 §3.2; He et al. 2016). Call it on x (N, C, H, W)."""

    def __init__(self, padding: int = 4, flip_p: float = 0.5) -> None:
        if not isinstance(padding, int) or padding < 0:
            raise ValueError(f"padding={padding!r}: must be an integer ≥ 0")
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"flip_p={flip_p!r}: must be in [0, 1]")
        self.padding, self.flip_p = padding, flip_p

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"RandomCropFlip needs images (N, C, H, W); got shape {tuple(x.shape)}")
        n, _, h, w = x.shape
        p, device = self.padding, x.device
        padded = F.pad(x, (p, p, p, p)) if p else x
        top = torch.randint(0, 2 * p + 1, (n,), device=device)
        left = torch.randint(0, 2 * p + 1, (n,), device=device)
        flip = torch.rand(n, device=device) < self.flip_p
        rows = top[:, None] + torch.arange(h, device=device)[None, :]                      # (N, H)
        cols_fwd = torch.arange(w, device=device)[None, :]
        # A flip reads the crop's columns right to left: one gather does crop and flip together.
        cols = left[:, None] + torch.where(flip[:, None], (w - 1) - cols_fwd, cols_fwd)     # (N, W)
        batch = torch.arange(n, device=device)[:, None, None, None]
        channel = torch.arange(x.shape[1], device=device)[None, :, None, None]
        return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]

    def __repr__(self) -> str:
        return f"RandomCropFlip(padding={self.padding}, flip_p={self.flip_p})"
