"""The highway authors' CIFAR preprocessing (issue 23) on synthetic CIFAR-shaped data: GCN's formula,
the training mean image, the padding by 8, the crop range, and training on every training image.

flukeskywalker/highway-networks README.md line 18: "You can get preprocessed datasets (CIFAR-10/100
were global contrast normalized and padded with 8 pixels each side)"; cifar10_network.prototxt lines
8-16: source cifar10_full_train_leveldb_padded, mean_file paddedmean.binaryproto, mirror 1,
crop_size 32 (data.augment quotes them in full)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from throughway.data import DataSplits, Split, load_cifar10, to_splits
from throughway.data.augment import (AUGMENTATIONS, GCN_FLOOR, global_contrast_normalize, normalize_splits,
                                     train_transform)
from throughway.train import get_recipe
from throughway.train.recipes import FULL_TRAINING_SET


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


def test_the_authors_recipe_uses_their_data_and_cites_the_lines():
    r = get_recipe("highway-conv-cifar")
    assert (r.augment, r.normalize) == ("crop-flip-8", "gcn-mean-image")
    notes = " ".join(r.notes)
    assert "README.md line 18" in notes and "lines 8-16" in notes and "crop_size 32" in notes
    assert "full_train" in FULL_TRAINING_SET["highway-conv-cifar"] and "500 × batch 100 = 50,000" in \
        FULL_TRAINING_SET["highway-conv-cifar"]
    # Ours stays the other recipe's (and an override's): pad 4, per-channel statistics.
    assert get_recipe("highway-conv-cifar-ours").augment == "crop-flip"
    assert get_recipe("highway-conv-cifar", augment="crop-flip", normalize="mean").normalize == "mean"


def _write_cifar10(folder, per_batch):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {b"data": rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, per_batch)]}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=4))


def test_the_authors_recipes_train_on_every_training_image(tmp_path, monkeypatch):
    from throughway.cli import main

    # A CIFAR-shaped folder: 5 training batches of 1,200 (the official 10,000 each, scaled down).
    _write_cifar10(tmp_path / "cifar-10-batches-py", 1200)
    arrays = load_cifar10(tmp_path, verify=False)
    assert len(to_splits(arrays).train) == 6000 - 5000                  # ours: the last 5,000 held out
    full = to_splits(arrays, train_on_full=True)
    assert len(full.train) == 6000 and full.val is None                 # the authors': all five batches

    seen = {}
    monkeypatch.setattr("throughway.train.run_training", lambda config, out, **kw: seen.update(
        {out.name: config.train_on_full}) or {"final": None})
    base = ["train", "--model", "highway_conv", "--depth", "19", "--model-arg", "arch=cifar10-19", "--dataset",
            "cifar10", "--data-dir", str(tmp_path), "--quiet"]
    for name, extra in (("authors", ["--recipe", "highway-conv-cifar"]),
                        ("told-not-to", ["--recipe", "highway-conv-cifar", "--no-train-on-full"]),
                        ("ours", ["--recipe", "highway-conv-cifar-ours"])):
        assert main(base + extra + ["--out", str(tmp_path / name)]) == 0
    assert seen == {"authors": True, "told-not-to": False, "ours": False}
