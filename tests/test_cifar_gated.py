"""`throughway reproduce cifar-gated`: its runs, its message without data, its table from results files."""

from __future__ import annotations

import argparse

import pytest
import torch

from throughway.cli import main
from throughway.data import DataSplits, Split
from throughway.experiments import cifar_gated
from throughway.train import run_training


def test_without_a_data_directory_it_says_what_it_needs(capsys):
    assert main(["reproduce", "cifar-gated"]) == 2
    err = capsys.readouterr().err
    assert "--data-dir" in err and "cifar-10-batches-py" in err


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
