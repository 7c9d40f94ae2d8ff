"""gated-residual-v2 §3.2's CIFAR recipes, one test per value, each with the paper's sentence it
comes from (../shared/papers/gated-residual-v2-cifar.md, lines 169, 171 and 178)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from throughway.cli import main
from throughway.data import load_cifar10, to_splits
from throughway.experiments import cifar_gated
from throughway.models import create_model
from throughway.train import get_recipe
from throughway.train.recipes import FULL_TRAINING_SET, learning_rate_at

PREACT = "For pre-activation ResNets, as described in He et al. (2016), we follow the original implementation details."
WRN = "We follow the implementation from Zagoruyko & Komodakis (2016) for Wide ResNets."
SAME = "All other details are the same as for ResNets."


def _drops(recipe):
    """(epoch, factor) where the learning rate changes."""
    rates = [learning_rate_at(recipe, e) for e in range(recipe.epochs)]
    return [(e, round(rates[e] / rates[e - 1], 6)) for e in range(1, recipe.epochs) if rates[e] != rates[e - 1]]


CASES = [
    ("preact-cifar", "We set an initial learning rate of 0.1", lambda r: r.lr == 0.1),
    ("preact-cifar", "and decrease it by a factor of 10 after 50% and 75% epochs",
     lambda r: _drops(r) == [(r.epochs // 2, 0.1), (r.epochs * 3 // 4, 0.1)]),
    ("preact-cifar", "SGD with Nesterov momentum of 0.9 are used for optimization",
     lambda r: (r.optimizer, r.nesterov, r.momentum) == ("sgd", True, 0.9)),
    ("preact-cifar", "the only pre-processing consists of mean subtraction", lambda r: r.normalize == "mean"),
    ("preact-cifar", "Weight decay of 0.0001 is used for regularization", lambda r: r.weight_decay == 1e-4),
    ("wrn-cifar", "The learning rate is initialized as 0.1", lambda r: r.lr == 0.1),
    ("wrn-cifar", "and decreases by a factor of 5 after 30%, 60% and 80% epochs",
     lambda r: _drops(r) == [(round(r.epochs * f), 0.2) for f in (0.3, 0.6, 0.8)]),
    ("wrn-cifar", "Images are mean/std normalized", lambda r: r.normalize == "mean-std"),
    ("wrn-cifar", "and a weight decay of 0.0005 is used for regularization", lambda r: r.weight_decay == 5e-4),
    ("wrn-cifar", SAME + " (Nesterov momentum 0.9)", lambda r: (r.optimizer, r.nesterov, r.momentum) == ("sgd", True, 0.9)),
    # line 178, both architectures
    ("preact-cifar", "images are padded with 4 pixels, and we take random crops of size 32 × 32 during training. "
                     "Additionally, each image is horizontally flipped with 50% probability.",
     lambda r: r.augment == "crop-flip"),
    ("wrn-cifar", "images are padded with 4 pixels, and we take random crops ... horizontally flipped",
     lambda r: r.augment == "crop-flip"),
    ("preact-cifar", "We use batch size 128 for all experiments.", lambda r: r.batch_size == 128),
    ("wrn-cifar", "We use batch size 128 for all experiments.", lambda r: r.batch_size == 128),
]


@pytest.mark.parametrize(("name", "sentence", "holds"), CASES, ids=[f"{n}: {s[:40]}" for n, s, _ in CASES])
def test_recipe_value_is_the_papers(name, sentence, holds):
    assert holds(get_recipe(name)), f"{name} does not follow: {sentence!r}"


@pytest.mark.parametrize("model", ["preact_resnet", "wide_resnet"])
def test_batchnorm_momentum_0_9_is_pytorchs_0_1(model):
    # line 169: "Batch Normalization's momentum is set to 0.9." (Torch's running = 0.9·running + 0.1·batch;
    # PyTorch's momentum is the weight of the batch, 1 − 0.9). Wide ResNets: "All other details are the same".
    net = create_model(model, **({"depth": 10, "widen_factor": 1} if model == "wide_resnet" else {"depth": 20}), num_classes=10)
    momenta = {m.momentum for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)}
    assert momenta and all(m == pytest.approx(1 - 0.9) for m in momenta)


@pytest.mark.parametrize("arch", ["wrn-4-10", "wrn-3-4"])
def test_wide_resnets_drop_0_3_between_convolutions(arch):
    # line 171: "When dropout is specified, we apply 0.3 dropout (?) between convolutions."
    model, kwargs, recipe = cifar_gated.ARCHITECTURES[arch]
    assert (model, kwargs["dropout"], recipe) == ("wide_resnet", 0.3, "wrn-cifar")
    net = create_model(model, **{**kwargs, "depth": 10, "widen_factor": 1}, num_classes=10)
    assert {m.p for m in net.modules() if isinstance(m, torch.nn.Dropout)} == {0.3}


# -- the highway authors' CIFAR recipes --------------------------------------------------------------

def _write_cifar10(folder, per_batch):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {b"data": rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, per_batch)]}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=4))


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


def test_the_authors_recipes_train_on_every_training_image(tmp_path, monkeypatch):

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
