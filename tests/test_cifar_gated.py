"""`throughway reproduce cifar-gated`: its runs, its message without data, its table from results files."""

from __future__ import annotations

import argparse
import io
import pickle
import struct

import numpy as np
import torch

from throughway.cli import main
from throughway.data import DataSplits, Split, load_cifar10, to_splits
from throughway.experiments import cifar_gated
from throughway.train import run_training


def test_without_a_data_directory_it_says_what_it_needs(capsys):
    assert main(["reproduce", "cifar-gated"]) == 2
    err = capsys.readouterr().err
    assert "--data-dir" in err and "cifar-10-batches-py" in err
    # and which of the paper's numbers the study would put its own beside (v2 Table 3)
    assert "original 7.16, gated 6.67, gated-k-decay 7.04" in err and "gated 3.65" in err
    assert main(["reproduce", "cifar-gated", "--dataset", "cifar100"]) == 2
    assert "original 18.85, gated 18.27" in capsys.readouterr().err  # v2 Table 4


def test_a_data_directory_without_cifar_is_named_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["reproduce", "cifar-gated", "--data-dir", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "data_batch_1" in err and "test_batch" in err and "--data-dir" in err
    assert not out.exists()


class _Python2Pickler(pickle._Pickler):  # type: ignore[name-defined]
    """Writes str and bytes as Python 2 `str` opcodes and numpy's globals under their numpy 1 names,
    as cPickle did when the official CIFAR python batches were made."""

    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_python2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = save_python2_str
    dispatch[bytes] = save_python2_str

    def save_global(self, obj, name=None):
        module = obj.__module__.replace("numpy._core", "numpy.core")
        self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode())
        self.memoize(obj)


def _python2_batch(path, n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    entry = {"batch_label": f"batch {seed}", "labels": [int(v) for v in rng.integers(0, 10, n)],
             "data": rng.integers(0, 256, (n, 3072)).astype(np.uint8), "filenames": [f"img_{i}.png" for i in range(n)]}
    buffer = io.BytesIO()
    _Python2Pickler(buffer, protocol=2).dump(entry)
    path.write_bytes(buffer.getvalue())
    return entry


def test_cifar10_reader_reads_python2_pickles_like_the_official_batches(tmp_path):
    # The official files are Python 2 pickles: byte strings ≥ 128 in the pixel data only decode with latin1.
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = [_python2_batch(folder / f"data_batch_{i}", 1000 + 100 * i, i) for i in range(1, 6)]
    test = _python2_batch(folder / "test_batch", 300, 9)
    assert b"numpy.core.multiarray" in (folder / "test_batch").read_bytes()
    splits = load_cifar10(tmp_path, verify=False)
    train_x = np.concatenate([b["data"] for b in batches]).reshape(-1, 3, 32, 32)
    assert len(splits.train_y) + len(splits.val_y) == len(train_x) and len(splits.val_y) == 5000
    assert np.array_equal(np.concatenate([splits.train_x, splits.val_x]), train_x)  # validation: the last 5,000
    assert np.array_equal(splits.test_x, test["data"].reshape(-1, 3, 32, 32))
    assert np.array_equal(splits.test_y, np.array(test["labels"], np.uint8))
    data = to_splits(splits)
    assert data.train.x.shape[1:] == (3, 32, 32) and float(data.train.x.max()) <= 1.0


def test_specs_are_the_papers_three_variants_of_both_models():
    specs = {s.name: s.config for s in cifar_gated.specs(cifar_gated.Config(data_dir="x"))}
    assert len(specs) == 6
    wrn = specs["wrn-4-10-gated-k-decay-s0"]
    assert (wrn.model, wrn.depth, wrn.recipe) == ("wide_resnet", 28, "wrn-cifar")
    assert wrn.model_kwargs == {"widen_factor": 10, "dropout": 0.3, "gated": True}
    assert wrn.recipe_overrides == {"k_decay": True}
    resnet = specs["resnet-5-original-s0"]
    assert (resnet.model, resnet.depth, resnet.recipe, resnet.model_kwargs["gated"]) == \
        ("preact_resnet", 32, "preact-cifar", False)
    assert specs["resnet-5-gated-s0"].recipe_overrides == {}


def test_cifar100_defaults_to_the_wide_model_of_table_4():
    args = argparse.Namespace(data_dir="d", device="cpu", amp=False, channels_last=False, compile=False,
                              dataset="cifar100", epochs=None, seeds=None, limit=None, archs=None, variants=None)
    config = cifar_gated.config_from_args(args)
    assert config.archs == ("wrn-4-10",) and config.variants == ("original", "gated")


def test_table_puts_the_papers_numbers_beside_measured_ones(tmp_path, monkeypatch):
    # A tiny stand-in for resnet-5 so that one real run finishes in seconds on made-up images.
    monkeypatch.setitem(cifar_gated.ARCHITECTURES, "resnet-5", ("preact_resnet", {"depth": 8, "width": 4}, "preact-cifar"))
    config = cifar_gated.Config(archs=("resnet-5",), variants=("original", "gated"), epochs=1, data_dir="unused")
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(32, 3, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)
    data = DataSplits("cifar10", 10, Split(x, y), Split(x[:8], y[:8]), Split(x[:8], y[:8]))
    spec = next(s for s in cifar_gated.specs(config) if s.name == "resnet-5-gated-s0")
    result = run_training(spec.config, tmp_path / "runs" / spec.name, progress=False, data=data)
    summary = cifar_gated.summarize(config, tmp_path)
    from throughway._io import atomic_write_json

    atomic_write_json(tmp_path / "results.json", summary)
    table = cifar_gated.write_report(tmp_path)
    measured = f"{result['final']['test_error_pct']:.2f}"
    assert "| resnet-5 | 7.16 | not run | 6.67 | " + measured + " |" in table
    assert (tmp_path / "figure6_error_curves.png").stat().st_size > 0
    assert (tmp_path / "figure7_k_by_block.png").stat().st_size > 0
