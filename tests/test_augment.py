"""On-device augmentation (pad + crop + flip) and per-channel normalisation."""

from __future__ import annotations

import pytest
import torch

from throughway.data import DataSplits, Split
from throughway.data.augment import RandomCropFlip, channel_stats, normalize_splits


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
