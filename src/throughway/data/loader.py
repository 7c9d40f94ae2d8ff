"""In-memory tensors for training: the whole dataset lives on the device, batches are index slices.

The uint8 arrays are moved to the device as they are and converted and scaled there, once
(`to_splits`): the airbench pattern of resident data, which on a GPU moves a quarter of the bytes.

No DataLoader and no workers (docs/design.md, "Speed on this platform"): for MNIST-sized data, indexing
a resident tensor with a random permutation is the fastest loader there is, on a CPU or a GPU.
"""

from __future__ import annotations

import os
import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np
import torch

from . import shakespeare
from .sources import ArraySplits, load_arrays
from .text import TextSplits

__all__ = ["Split", "DataSplits", "array_checksums", "load_dataset", "load_text_dataset", "to_splits", "TEXT_DATASETS"]

# The character-level text data sets and the size of each one's vocabulary (UNKNOWN included), known
# before the data is read so that a run's model is checked first (train.config).
TEXT_DATASETS: dict[str, int] = {shakespeare.NAME: shakespeare.VOCAB_SIZE}


@dataclass
class Split:
    """One split: inputs x (N, C, H, W) float32 and labels y (N,) int64, on one device."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass
class DataSplits:
    """Train, validation (None when training on the full training set) and test splits. `checksums`:
    the SHA-256 of each uint8 array of the data set they were made from (`array_checksums`; empty
    when made from tensors), which every run records in its environment."""

    name: str
    num_classes: int
    train: Split
    val: Split | None
    test: Split
    checksums: dict[str, str] = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one input (C, H, W), without the batch dimension."""
        return tuple(self.train.x.shape[1:])

    def summary(self) -> dict[str, Any]:
        """What a run records of its data (results.json's `data`): the data set's name and the number of
        images of each split (val: 0 when training on the full training set)."""
        return {"dataset": self.name, "train": len(self.train), "val": len(self.val) if self.val else 0,
                "test": len(self.test)}


def _split(x: np.ndarray, y: np.ndarray, scale: float, device: torch.device, limit: int | None) -> Split:
    if limit is not None:
        x, y = x[:limit], y[:limit]
    # The uint8 pixels travel to the device (a quarter of float32's bytes) and are normalised there, once;
    # on the CPU the numbers are those of converting first (the same conversion and division).
    xt = torch.from_numpy(np.ascontiguousarray(x)).to(device=device).to(torch.float32).div_(scale)
    yt = torch.from_numpy(np.ascontiguousarray(y)).to(device=device).to(torch.int64)
    return Split(xt, yt)


def array_checksums(arrays: ArraySplits) -> dict[str, str]:
    """{"train_x": SHA-256 hex, ...}: each of the six uint8 arrays' bytes (C order), the whole data set
    before any limit or scaling: equal checksums, equal data."""
    return {name: hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
            for name, array in arrays.arrays().items()}


def to_splits(arrays: ArraySplits, *, train_on_full: bool = False, device: str | torch.device = "cpu",
              scale: float = 255.0, limit: int | None = None) -> DataSplits:
    """Turn uint8 ArraySplits into float tensors divided by `scale` on `device`.

    `scale=255` is the gated residual paper's preprocessing ("we divided each pixel value by 255").
    `train_on_full` appends the validation split to the training split (the papers trained on all
    60,000 MNIST images) and leaves `val` None. `limit` keeps the first `limit` samples of each split
    (for smoke tests).
    """
    device = torch.device(device)
    if limit is not None and limit < 2:
        raise ValueError(f"limit={limit}: must be at least 2 (BatchNorm needs two samples)")
    if train_on_full:
        train_x = np.concatenate([arrays.train_x, arrays.val_x])
        train_y = np.concatenate([arrays.train_y, arrays.val_y])
        val = None
    else:
        train_x, train_y = arrays.train_x, arrays.train_y
        val = _split(arrays.val_x, arrays.val_y, scale, device, limit)
    return DataSplits(
        name=arrays.name,
        num_classes=arrays.num_classes,
        train=_split(train_x, train_y, scale, device, limit),
        val=val,
        test=_split(arrays.test_x, arrays.test_y, scale, device, limit),
        checksums=array_checksums(arrays),
    )


def load_text_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *,
                      device: str | torch.device = "cpu", limit: int | None = None) -> TextSplits:
    """Load the text data set `name` (one of TEXT_DATASETS: "shakespeare-char") as TextSplits (token ids)
    on `device`; `limit` keeps the first `limit` characters of each split (data.text, data.shakespeare)."""
    if name == shakespeare.NAME:
        return shakespeare.load_shakespeare(data_dir, device=device, limit=limit)
    raise ValueError(f"dataset={name!r} is not a text data set; accepted values: {sorted(TEXT_DATASETS)}")


# A literal text data set's name is typed as TextSplits; a name known only at run time as DataSplits, the
# image sets' type (the callers that may meet a text name check with isinstance, as train.run does).
@overload
def load_dataset(name: Literal["shakespeare-char"], data_dir: str | os.PathLike[str] | None = None, *,  # type: ignore[overload-overlap]
                 train_on_full: bool = False, device: str | torch.device = "cpu",
                 limit: int | None = None) -> TextSplits: ...


@overload
def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *, train_on_full: bool = False,
                 device: str | torch.device = "cpu", limit: int | None = None) -> DataSplits: ...


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *, train_on_full: bool = False,
                 device: str | torch.device = "cpu", limit: int | None = None) -> DataSplits | TextSplits:
    """Load dataset `name` on `device`: an image data set ("mnist", "fashion-mnist", "cifar10", "cifar100")
    as DataSplits, pixels divided by 255 (see `to_splits`); a text data set (TEXT_DATASETS:
    "shakespeare-char") as TextSplits of token ids (`load_text_dataset`; `limit` then counts
    characters, and `train_on_full` is refused: its splits are fixed sets of works)."""
    if name in TEXT_DATASETS:
        if train_on_full:
            raise ValueError(f"train_on_full=True with dataset={name!r}: a text data set's splits are fixed sets of "
                             f"whole works; accepted: False")
        return load_text_dataset(name, data_dir, device=device, limit=limit)
    return to_splits(load_arrays(name, data_dir), train_on_full=train_on_full, device=device, limit=limit)
