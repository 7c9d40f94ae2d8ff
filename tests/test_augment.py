"""On-device augmentation (pad + crop + flip) and per-channel normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from throughway.data import DataSplits, Split
from throughway.data.augment import (AUGMENTATIONS, GCN_FLOOR, RandomCropFlip, channel_stats,
                                     global_contrast_normalize, normalize_splits, train_transform)


def images(n: int = 64, c: int = 3, size: int = 8) -> torch.Tensor:
    return torch.arange(n * c * size * size, dtype=torch.float32).reshape(n, c, size, size) + 1.0


def test_every_output_is_a_crop_of_the_padded_image_possibly_flipped():
    torch.manual_seed(0)
    x = images()
    out = RandomCropFlip(padding=4, flip_p=0.5)(x)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    offsets, flips = set(), 0
    for i in range(len(x)):
        found = None
        for top in range(9):
            for left in range(9):
                crop = padded[i, :, top:top + 8, left:left + 8]
                if torch.equal(out[i], crop):
                    found = (top, left, False)
                elif torch.equal(out[i], crop.flip(-1)):
                    found = (top, left, True)
        assert found is not None, f"sample {i} is not a (flipped) crop"
        offsets.add(found[:2])
        flips += found[2]
    assert len(offsets) > 10  # offsets vary across the batch
    assert 16 < flips < 48  # p = 0.5 on 64 samples (fails with probability < 1e-4)


def test_no_padding_no_flip_is_the_identity_and_always_flip_mirrors():
    x = images(4)
    assert torch.equal(RandomCropFlip(padding=0, flip_p=0.0)(x), x)
    assert torch.equal(RandomCropFlip(padding=0, flip_p=1.0)(x), x.flip(-1))


def test_augmentation_is_reproducible_from_the_global_seed():
    x = images(16)
    torch.manual_seed(3)
    a = RandomCropFlip()(x)
    torch.manual_seed(3)
    assert torch.equal(a, RandomCropFlip()(x))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="padding"):
        RandomCropFlip(padding=-1)
    with pytest.raises(ValueError, match="flip_p"):
        RandomCropFlip(flip_p=2.0)
    with pytest.raises(ValueError, match="normalize"):
        normalize_splits(_splits(), "zca")


def _splits() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    train = torch.rand(50, 3, 4, 4, generator=g) * torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)
    test = torch.rand(20, 3, 4, 4, generator=g) + 5.0
    y = torch.zeros(50, dtype=torch.int64)
    return DataSplits("toy", 10, Split(train, y), None, Split(test, torch.zeros(20, dtype=torch.int64)))


def test_normalisation_uses_training_statistics_only():
    data = _splits()
    mean, std = channel_stats(data.train.x)
    centred = normalize_splits(data, "mean")
    assert torch.allclose(channel_stats(centred.train.x)[0], torch.zeros(3), atol=1e-5)
    assert torch.allclose(centred.test.x, data.test.x - mean.view(1, 3, 1, 1))
    standard = normalize_splits(data, "mean-std")
    m, s = channel_stats(standard.train.x)
    assert torch.allclose(m, torch.zeros(3), atol=1e-5) and torch.allclose(s, torch.ones(3), atol=1e-5)
    assert torch.allclose(standard.test.x, (data.test.x - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1))
    assert normalize_splits(data, "none") is data


# -- the highway authors' CIFAR preprocessing (GCN, the mean image, crops) on synthetic CIFAR-shaped data ------

def _pixels(n: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, 3, 32, 32)).astype(np.float32) / 255)


def test_gcn_is_each_image_minus_its_mean_over_its_standard_deviation():
    x = _pixels(1).repeat(5, 1, 1, 1) * torch.arange(1, 6).view(5, 1, 1, 1) + 0.1  # one image, 5 contrasts
    out = global_contrast_normalize(x)
    for image, result in zip(x, out):
        values = image.double().flatten()
        expected = (values - values.mean()) / values.std(unbiased=False)   # over all pixels and channels
        assert torch.allclose(result.double().flatten(), expected, atol=1e-6)
    assert torch.allclose(out[0], out[4], atol=1e-5)       # contrast and brightness are normalised away
    flat = torch.full((1, 3, 32, 32), 0.5)
    assert torch.equal(global_contrast_normalize(flat), torch.zeros_like(flat))   # std below GCN_FLOOR
    assert GCN_FLOOR <= 1e-6


def test_gcn_mean_image_subtracts_the_training_sets_mean_image_from_every_split():
    train, test = _pixels(40, 1), _pixels(10, 2)
    labels = torch.zeros(40, dtype=torch.int64)
    data = DataSplits("cifar10", 10, Split(train, labels), None, Split(test, labels[:10]))
    out = normalize_splits(data, "gcn-mean-image")
    mean_image = global_contrast_normalize(train).double().mean(dim=0)           # (C, H, W), per pixel
    assert out.train.x.double().mean(dim=0).abs().max() < 1e-6
    assert torch.allclose(out.test.x, global_contrast_normalize(test) - mean_image.float(), atol=1e-6)
    # A per-channel mean would leave per-pixel structure: the mean image is per pixel and channel.
    assert mean_image.std(dim=(1, 2)).min() > 0


def test_subtracting_before_padding_is_caffes_padded_mean_image():
    # Caffe: pad every GCN image by 8 (zeros), subtract the mean of the padded set, crop. The padded
    # mean image is the unpadded one with a zero border, so pad(x - M) = pad(x) - mean(pad(x)).
    x = global_contrast_normalize(_pixels(20, 3))
    padded = F.pad(x, (8, 8, 8, 8))
    caffe = padded - padded.mean(dim=0, keepdim=True)
    ours = F.pad(x - x.mean(dim=0, keepdim=True), (8, 8, 8, 8))
    assert padded.shape[-2:] == (48, 48)
    assert torch.allclose(caffe, ours, atol=1e-6)


def test_crop_flip_8_takes_32_by_32_crops_at_every_offset_0_to_16():
    torch.manual_seed(0)
    transform = train_transform("crop-flip-8")
    assert transform is not None and transform.padding == 8 == AUGMENTATIONS["crop-flip-8"]
    x = torch.arange(1.0, 1.0 + 32 * 32).reshape(1, 1, 32, 32).repeat(400, 1, 1, 1)
    out = transform(x)
    assert out.shape == (400, 1, 32, 32)
    padded = F.pad(x[:1], (8, 8, 8, 8))[0, 0]                             # (48, 48)
    crops = padded.unfold(0, 32, 1).unfold(1, 32, 1)                      # (17, 17, 32, 32): every crop
    tops, lefts, flips = set(), set(), 0
    for image in out[:, 0]:
        straight = (crops == image).flatten(2).all(-1)                    # (17, 17)
        mirrored = (crops == image.flip(-1)).flatten(2).all(-1)
        found = (straight | mirrored).nonzero()
        assert len(found) == 1, "every output is exactly one (mirrored) crop of the padded image"
        tops.add(int(found[0, 0]))
        lefts.add(int(found[0, 1]))
        flips += int(mirrored.any())
    assert tops == lefts == set(range(17))       # 48 − 32 + 1 offsets each way, the ends included
    assert 150 < flips < 250                     # mirror: 1, with probability 0.5 (fails with p < 1e-4)
    assert train_transform("crop-flip").padding == 4 and train_transform("none") is None  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="accepted values"):
        train_transform("crop-flip-16")
