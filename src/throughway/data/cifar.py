"""CIFAR-10 and CIFAR-100 from the official python-version batches in a folder the user names
(they cannot be downloaded on this platform), each file checked against its official MD5 and read
with the numpy-only unpickler (data.sources re-exports these names).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .cache import ArraySplits, split_validation, validate_arrays
from .safe_pickle import safe_load

__all__ = ["load_cifar10", "load_cifar100", "missing_cifar_files"]

# MD5 of the official CIFAR python-version files (https://www.cs.toronto.edu/~kriz/cifar.html).
CIFAR10_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}



CIFAR100_MD5 = {"train": "16019d7e3df5f24257cddd939b257f8d", "test": "f0ef6b0ae62326f3e7ffdfab6717acfc"}



def _read_cifar_file(path: Path, md5: str | None, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: CIFAR batch not found")
    if md5 is not None:
        digest = hashlib.md5(path.read_bytes()).hexdigest()
        if digest != md5:
            raise ValueError(f"{path}: MD5 {digest} is not the official {md5}; the file is damaged or tampered with")
    try:
        with open(path, "rb") as handle:
            entry = safe_load(handle)
    except Exception as exc:  # noqa: BLE001 - any failure to parse is a damaged file
        raise ValueError(f"{path}: not a readable CIFAR python batch ({exc})") from exc
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: expected a dict in the CIFAR batch")
    entry = {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}
    if "data" not in entry or label_key not in entry:
        raise ValueError(f"{path}: CIFAR batch lacks 'data' or '{label_key}'")
    data = np.asarray(entry["data"])
    labels = np.asarray(entry[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise ValueError(f"{path}: malformed CIFAR batch, data {data.dtype}{data.shape}, labels {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.uint8)



def _cifar_dir(root: Path, folder_name: str) -> Path:
    return root / folder_name if (root / folder_name).is_dir() else root



CIFAR_LAYOUT = {"cifar10": ("cifar-10-batches-py", ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                                                    "data_batch_5", "test_batch")),
                "cifar100": ("cifar-100-python", ("train", "test"))}



def missing_cifar_files(name: str, source_dir: str | os.PathLike[str]) -> list[Path]:
    """The official python-version files of CIFAR `name` ("cifar10" or "cifar100") that `source_dir`
    (or its cifar-10-batches-py/ or cifar-100-python/) lacks; empty when all are there. Reads nothing."""
    if name not in CIFAR_LAYOUT:
        raise ValueError(f"dataset={name!r} is not CIFAR; accepted values: {sorted(CIFAR_LAYOUT)}")
    folder, files = CIFAR_LAYOUT[name]
    directory = _cifar_dir(Path(source_dir).expanduser(), folder)
    return [directory / f for f in files if not (directory / f).is_file()]



def load_cifar10(source_dir: str | os.PathLike[str], verify: bool = True) -> ArraySplits:
    """CIFAR-10 from the official python batches in `source_dir` (or its cifar-10-batches-py/).

    Train 45,000 / validation 5,000 (the last 5,000 of data_batch_5) / test 10,000 (`to_splits(...,
    train_on_full=True)` trains on all 50,000, as the highway authors did: recipes.FULL_TRAINING_SET). With `verify`
    each file must match its official MD5.
    """
    directory = _cifar_dir(Path(source_dir).expanduser(), "cifar-10-batches-py")
    parts = [_read_cifar_file(directory / f"data_batch_{i}", CIFAR10_MD5[f"data_batch_{i}"] if verify else None,
                              "labels") for i in range(1, 6)]
    test_x, test_y = _read_cifar_file(directory / "test_batch", CIFAR10_MD5["test_batch"] if verify else None, "labels")
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    splits = split_validation("cifar10", 10, x, y, test_x, test_y)
    validate_arrays(splits)
    return splits



def load_cifar100(source_dir: str | os.PathLike[str], verify: bool = True) -> ArraySplits:
    """CIFAR-100 (fine labels) from the official python files in `source_dir` (or its cifar-100-python/).

    Train 45,000 / validation 5,000 (the last 5,000 of train) / test 10,000 (all 50,000 with `train_on_full`).
    """
    directory = _cifar_dir(Path(source_dir).expanduser(), "cifar-100-python")
    x, y = _read_cifar_file(directory / "train", CIFAR100_MD5["train"] if verify else None, "fine_labels")
    test_x, test_y = _read_cifar_file(directory / "test", CIFAR100_MD5["test"] if verify else None, "fine_labels")
    splits = split_validation("cifar100", 100, x, y, test_x, test_y)
    validate_arrays(splits)
    return splits
