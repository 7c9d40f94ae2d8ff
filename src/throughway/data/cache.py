"""The verified cache of a data set's uint8 arrays (`ArraySplits`) and the checks every source shares.

A cache folder holds one .npy file per array and a manifest with the SHA-256 of each, written last;
every load checks the manifest's fields, each file's checksum, dtype, shape and label range, and a
mismatch is an error that names the file (data.sources). The cache root is `--data-dir`, else
$THROUGHWAY_DATA, else $XDG_CACHE_HOME/throughway, else ~/.cache/throughway (`data_root`).
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .._io import atomic_write_bytes, atomic_write_json, read_json, sha256_file

__all__ = ["ArraySplits", "DATASET_SHAPES", "data_root", "save_cache"]

# One image's shape (C, H, W) and the number of classes of each data set: known before loading, so a
# run's arguments are checked against them before any download or decoding.
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "mnist": ((1, 28, 28), 10), "fashion-mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10), "cifar100": ((3, 32, 32), 100),
}



VALIDATION_SIZE = {"mnist": 10_000, "fashion-mnist": 10_000, "cifar10": 5_000, "cifar100": 5_000}



CACHE_FORMAT = 1



SPLIT_KEYS = ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y")



@dataclass(frozen=True)
class ArraySplits:
    """uint8 images (N, C, H, W) and uint8 labels (N,) for train, validation and test."""

    name: str
    num_classes: int
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        """The six arrays (train, validation, test images and labels) by name."""
        return {k: getattr(self, k) for k in SPLIT_KEYS}



def data_root(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: `data_dir` if given, else $THROUGHWAY_DATA, else $XDG_CACHE_HOME/throughway, else
    ~/.cache/throughway.

    XDG_CACHE_HOME is the XDG Base Directory specification's cache folder, which pip, torch and Hugging
    Face honour too; as the specification says, an empty or relative value is ignored (~/.cache is its
    default)."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get("THROUGHWAY_DATA")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "throughway"
    return Path.home() / ".cache" / "throughway"


def save_cache(folder: Path, splits: ArraySplits, source: str) -> None:
    """Write `splits` as a verified cache in `folder` (.npy files, then a manifest of their SHA-256)."""
    files = {}
    for key, array in splits.arrays().items():
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        data = buffer.getvalue()
        atomic_write_bytes(folder / f"{key}.npy", data)
        files[f"{key}.npy"] = hashlib.sha256(data).hexdigest()
    # The manifest is written last: a folder without one is an unfinished cache and is rebuilt.
    atomic_write_json(folder / "manifest.json", {
        "format": CACHE_FORMAT, "dataset": splits.name, "num_classes": splits.num_classes,
        "source": source, "files": files,
    })



def _load_cache(folder: Path, name: str) -> ArraySplits | None:
    # The cache is untrusted input: the manifest's fields are type-checked, every array's checksum,
    # dtype, shape and label range are checked on every load, not only when the cache is built.
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path}: holds {type(manifest).__name__}, expected a JSON object; "
                         f"delete {folder} to rebuild the {name} cache")
    if manifest.get("format") != CACHE_FORMAT or manifest.get("dataset") != name:
        return None
    files = manifest.get("files")
    if not (isinstance(files, dict) and all(isinstance(files.get(f"{k}.npy"), str) for k in SPLIT_KEYS)):
        raise ValueError(f"{manifest_path}: field 'files' must map each of {[f'{k}.npy' for k in SPLIT_KEYS]} to "
                         f"its SHA-256 (a string); delete {folder} to rebuild the {name} cache")
    num_classes = manifest.get("num_classes")
    expected_classes = DATASET_SHAPES[name][1] if name in DATASET_SHAPES else None
    if not (isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 2
            and (expected_classes is None or num_classes == expected_classes)):
        accepted = expected_classes if expected_classes is not None else "an integer ≥ 2"
        raise ValueError(f"{manifest_path}: field 'num_classes' is {num_classes!r}; accepted: {accepted}; "
                         f"delete {folder} to rebuild the {name} cache")
    arrays = {}
    for key in SPLIT_KEYS:
        path = folder / f"{key}.npy"
        expected = files[f"{key}.npy"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing from the {name} cache; delete {folder} to rebuild it")
        if sha256_file(path) != expected:
            raise ValueError(
                f"{path}: checksum does not match the cache manifest (the file was changed or damaged); "
                f"delete {folder} to rebuild the {name} cache"
            )
        try:
            arrays[key] = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise ValueError(f"{path}: not a readable .npy array ({exc}); delete {folder} to rebuild the {name} cache") from exc
    splits = ArraySplits(name=name, num_classes=num_classes, **arrays)
    try:
        validate_arrays(splits)
    except ValueError as exc:
        raise ValueError(f"{folder}: {exc}; delete {folder} to rebuild the {name} cache") from exc
    return splits



def cached_arrays(name: str, data_dir: str | os.PathLike[str] | None,
            build: Callable[[Path], tuple[ArraySplits, str]]) -> ArraySplits:
    folder = data_root(data_dir) / name
    cached = _load_cache(folder, name)
    if cached is not None:
        return cached
    splits, source = build(folder)
    validate_arrays(splits)
    save_cache(folder, splits, source)
    return splits



def validate_arrays(s: ArraySplits) -> None:
    shape = DATASET_SHAPES[s.name][0] if s.name in DATASET_SHAPES else None
    for prefix in ("train", "val", "test"):
        x, y = getattr(s, f"{prefix}_x"), getattr(s, f"{prefix}_y")
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
            raise ValueError(f"{s.name} {prefix}: expected numpy arrays")
        if x.dtype != np.uint8 or y.dtype != np.uint8 or x.ndim != 4 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"{s.name} {prefix}: malformed arrays {x.dtype}{x.shape} / {y.dtype}{y.shape}")
        if shape is not None and tuple(x.shape[1:]) != shape:
            raise ValueError(f"{s.name} {prefix}: images of shape {tuple(x.shape[1:])}, expected {shape}")
        if len(y) and int(y.max()) >= s.num_classes:
            raise ValueError(f"{s.name} {prefix}: label {int(y.max())} outside 0..{s.num_classes - 1}")



def split_validation(name: str, num_classes: int, x: np.ndarray, y: np.ndarray,
                      test_x: np.ndarray, test_y: np.ndarray) -> ArraySplits:
    # The last VALIDATION_SIZE training images are held out, as in the classic mnist.pkl.gz.
    n_val = VALIDATION_SIZE[name]
    return ArraySplits(name, num_classes, x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:], test_x, test_y)
