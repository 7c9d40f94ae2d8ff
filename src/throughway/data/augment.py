"""On-device data augmentation and normalisation for image data resident in device memory.

* `normalize_splits`: per-channel mean subtraction (pre-activation ResNets, gated-residual-v2 §3.2:
  "the only pre-processing consists of mean subtraction") or mean/std normalisation (Wide ResNets:
  "images are mean/std normalized"), with statistics from the training split only, applied to every
  split once; or "pixels/256": the raw pixel values divided by 256 instead of the loader's 255,
  Caffe's `scale: 0.00390625` of the highway authors' MNIST net (mnist_network.prototxt line 13).
* "gcn-mean-image": the highway authors' CIFAR preprocessing (see `AUTHORS_CIFAR` below): global
  contrast normalisation of each image (`global_contrast_normalize`), then the training split's mean
  image subtracted from every split.
* `RandomCropFlip`: the papers' "moderate data augmentation": pad 4 pixels with zeros, take a random
  32×32 crop, flip horizontally with probability 0.5 (gated-residual-v2 §3.2); "crop-flip-8" pads 8,
  the highway authors' padding. It works on a whole batch on the batch's device in one gather: no
  DataLoader, no workers, no per-image Python. `train_transform` maps a recipe's `augment` to it.

The highway authors' CIFAR data, quoted (flukeskywalker/highway-networks):

* README.md line 18: "You can get preprocessed datasets (CIFAR-10/100 were global contrast normalized
  and padded with 8 pixels each side) at the links below."
* examples/highways/cifar10-19layers/cifar10_network.prototxt lines 2-18 (the TRAIN Data layer): line 8
  `source: ".../cifar10_full_train_leveldb_padded"`, line 9 `batch_size: 100`, lines 12-16
  `transform_param { mean_file: ".../paddedmean.binaryproto" mirror: 1 crop_size: 32 }`; lines 19-56
  (the TEST layers): the unpadded `cifar10_full_train_leveldb` (line 25) and `cifar10_test_leveldb`
  (line 44) with `mean_file: ".../mean.binaryproto"` (lines 30, 49) and `mirror: 0` (lines 31, 50), no
  crop. cifar100-19layers/cifar100_network.prototxt has the same lines with cifar100 paths.

So: GCN per image, pad 8 each side (32 → 48 pixels), subtract the mean image of the padded training
set, random 32×32 crop and mirror (Caffe's DataTransformer subtracts the mean at the source pixel,
then crops and mirrors); test images unpadded minus the unpadded training set's mean image; all
50,000 training images (`full_train`). With zero padding after GCN (the padding value is not stated:
ours) the padded mean image is the unpadded one padded with zeros, so subtracting the unpadded mean
image before padding gives the same numbers: "gcn-mean-image" once on every split, then crop-flip-8
per batch. The GCN formula is not in the authors' files; `global_contrast_normalize` is the standard
one (ours).

Randomness comes from torch's default generator of the batch's device, which the training
checkpoints save and restore, so an interrupted augmented run resumes exactly.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .loader import DataSplits, Split

__all__ = ["NORMALIZATIONS", "AUGMENTATIONS", "GCN_FLOOR", "channel_stats", "global_contrast_normalize",
           "normalize_splits", "RandomCropFlip", "train_transform"]

NORMALIZATIONS = ("none", "mean", "mean-std", "pixels/256", "gcn-mean-image")
# A recipe's per-batch training augmentation -> the zero padding of RandomCropFlip (None: no augmentation).
AUGMENTATIONS: dict[str, int | None] = {"none": None, "crop-flip": 4, "crop-flip-8": 8}
# The smallest standard deviation GCN divides by (ours): a constant image becomes zeros, not NaN.
GCN_FLOOR = 1e-8


def channel_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation of images x (N, C, H, W), each of shape (C,), float64 sums."""
    if x.dim() != 4:
        raise ValueError(f"channel_stats needs images (N, C, H, W); got shape {tuple(x.shape)}")
    flat = x.transpose(0, 1).reshape(x.shape[1], -1).double()
    return flat.mean(dim=1).float(), flat.std(dim=1, unbiased=False).float()


def global_contrast_normalize(x: torch.Tensor, floor: float = GCN_FLOOR) -> torch.Tensor:
    """Global contrast normalisation of images x (N, C, H, W) (ours: the highway authors name it, README
    line 18, without a formula): each image minus its mean over all pixels and channels, divided by
    its standard deviation over the same (population std), or by `floor` where that is smaller.
    Every output image has mean 0 and standard deviation 1 (0 for a constant image)."""
    if x.dim() != 4:
        raise ValueError(f"global_contrast_normalize needs images (N, C, H, W); got shape {tuple(x.shape)}")
    flat = x.reshape(x.shape[0], -1).double()
    centred = flat - flat.mean(dim=1, keepdim=True)
    std = centred.pow(2).mean(dim=1, keepdim=True).sqrt().clamp_min(floor)
    return (centred / std).to(x.dtype).reshape(x.shape)


def normalize_splits(data: DataSplits, mode: str) -> DataSplits:
    """Return new DataSplits with every split normalised by the training split's channel statistics.

    mode "mean" subtracts the per-channel mean, "mean-std" also divides by the per-channel std,
    "pixels/256" maps pixels p/255 (the loader's scaling) to p/256 with no statistics at all,
    "gcn-mean-image" contrast-normalises each image (`global_contrast_normalize`) and subtracts the
    training split's mean image (per pixel and channel: the highway authors' CIFAR data), "none"
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

        return DataSplits(name=data.name, num_classes=data.num_classes, checksums=data.checksums, train=rescale(data.train),  # type: ignore[arg-type]
                          val=rescale(data.val), test=rescale(data.test))  # type: ignore[arg-type]
    if mode == "gcn-mean-image":
        # The highway authors' CIFAR preprocessing (module docstring): GCN, then the training mean image.
        train_x = global_contrast_normalize(data.train.x)
        mean_image = train_x.double().mean(dim=0, keepdim=True).float()   # (1, C, H, W)

        def gcn_minus_mean(split: Split | None) -> Split | None:
            return None if split is None else Split(global_contrast_normalize(split.x) - mean_image, split.y)

        return DataSplits(name=data.name, num_classes=data.num_classes, checksums=data.checksums, train=Split(train_x - mean_image, data.train.y),
                          val=gcn_minus_mean(data.val), test=gcn_minus_mean(data.test))  # type: ignore[arg-type]
    mean, std = channel_stats(data.train.x)
    shift = mean.view(1, -1, 1, 1)
    scale = std.clamp_min(1e-8).view(1, -1, 1, 1) if mode == "mean-std" else torch.ones_like(shift)

    def apply(split: Split | None) -> Split | None:
        return None if split is None else Split((split.x - shift) / scale, split.y)

    return DataSplits(name=data.name, num_classes=data.num_classes, checksums=data.checksums, train=apply(data.train),  # type: ignore[arg-type]
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


def train_transform(augment: str) -> RandomCropFlip | None:
    """The per-batch training transform of a recipe's `augment` (AUGMENTATIONS): "crop-flip" pads 4
    (gated-residual-v2 §3.2), "crop-flip-8" pads 8 (the highway authors' padded CIFAR, README line
    18), both with random 32×32 crops and mirroring with probability 0.5; "none" gives None."""
    if augment not in AUGMENTATIONS:
        raise ValueError(f"augment={augment!r} is not known; accepted values: {list(AUGMENTATIONS)}")
    padding = AUGMENTATIONS[augment]
    return None if padding is None else RandomCropFlip(padding=padding, flip_p=0.5)
