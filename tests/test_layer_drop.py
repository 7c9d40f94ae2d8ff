"""Learned layer dropping in a language model: the pressure that closes gates, the exact removal of a
closed layer, and the layer-drop study end to end on a toy corpus (training, the analysis of every
run in its worker, the summary's paired tests, resume)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from throughway.analysis import prune
from throughway.data.text import save_text_cache, to_text_splits
from throughway.layers import ScalarGate, find_branches
from throughway.models import create_model
from throughway.train import fit_lm, get_recipe

PATTERN = "to be, or not to be: that is the question.\n"
TEXTS = {"train": PATTERN * 40, "val": PATTERN * 8, "test": "that is the question: to be, or not to be.\n" * 8}


def test_a_layer_whose_relu_gates_are_closed_is_removed_with_the_output_unchanged():
    torch.manual_seed(0)
    model = create_model("gpt", depth=4, width=16, heads=2, context=12, vocab_size=20, gate="relu").eval()
    with torch.no_grad():
        for ref in find_branches(model).values():
            if ref.block == "blocks.2":
                ref.gate.k.fill_(-0.3)  # relu(k) = 0 on both branches: the layer is an exact identity
    ids = torch.randint(0, 20, (3, 12))
    pruned = prune(model, ["blocks.2"])
    assert len(pruned.blocks) == 3
    with torch.no_grad():
        assert torch.allclose(pruned(ids), model(ids), atol=1e-6, rtol=0)
        ref = find_branches(model)["blocks.1.ff"]
        ref.gate.k.fill_(0.5)  # an open gate: removing its layer does change the function
        assert not torch.allclose(prune(model, ["blocks.1"])(ids), model(ids), atol=1e-4)


def test_the_pressure_closes_relu_gates_and_a_closed_gate_stays_closed():
    text = to_text_splits("toy", TEXTS)
    torch.manual_seed(0)
    model = create_model("gpt", depth=2, width=16, heads=2, context=12, vocab_size=text.vocab_size, gate="relu")
    recipe = get_recipe("nanogpt-char", epochs=2, steps_per_epoch=30, batch_size=4, warmup_steps=0, lr=0.05,
                        min_lr=0.05, schedule="constant", gate_penalty=5.0)
    history = fit_lm(model, text, recipe, context=12, eval_blocks=2, progress=False)
    ks = history.last()["k"]
    assert len(ks) == 4 and min(ks) <= 0.0  # at least one gate driven shut
    closed = [ref.gate for ref in find_branches(model).values() if float(ref.gate.k.detach()) <= 0.0]
    before = [float(g.k.detach()) for g in closed]
    fit_lm(model, text, recipe.replace(epochs=1), context=12, eval_blocks=2, progress=False)
    assert [float(g.k.detach()) for g in closed] == before  # no gradient reaches a closed relu gate from either term
    ungated = create_model("gpt", depth=2, width=16, heads=2, context=12, vocab_size=text.vocab_size)
    with pytest.raises(ValueError, match="gate_penalty=5.0 presses on the gates"):
        fit_lm(ungated, text, recipe, context=12, eval_blocks=2, progress=False)
    with pytest.raises(ValueError, match="gate_penalty=-1"):
        recipe.replace(gate_penalty=-1.0)


def test_the_families_start_from_the_same_weights_and_differ_only_in_their_gates():
    from throughway.experiments import layer_drop

    states = {}
    for family, (gate, _) in layer_drop.FAMILIES.items():
        torch.manual_seed(3)
        model = create_model("gpt", depth=2, width=16, heads=2, context=12, vocab_size=20, gate=gate)
        states[family] = {k: v for k, v in model.state_dict().items() if "branch_gates" not in k}
    base = states["prenorm"]
    for family, state in states.items():
        assert state.keys() == base.keys() and all(torch.equal(state[k], base[k]) for k in base), family


@pytest.fixture
def toy_root(tmp_path, monkeypatch):
    root = tmp_path / "data"
    save_text_cache(root / "shakespeare-char", "shakespeare-char", TEXTS, {"train": ("toy",)}, "test fixture")
    monkeypatch.setenv("THROUGHWAY_DATA", str(root))
    return root


@pytest.mark.slow
def test_the_layer_drop_study_trains_analyses_and_compares_every_criterion(toy_root, tmp_path):
    from throughway._io import read_json
    from throughway.experiments import layer_drop

    config = dataclasses.replace(layer_drop.QUICK, layers=4, width=16, heads=2, context=12, batch_size=4, steps=8,
                                 eval_every=4, seeds=3, eval_blocks=4, calibration_blocks=4, heal_steps=2,
                                 limit=None, pressure=0.5)
    out = tmp_path / "study"
    summary = layer_drop.run(config, out, progress=False)
    assert set(layer_drop.families_of(summary)) == set(layer_drop.FAMILIES)
    run = read_json(out / "runs" / "gated-s1" / layer_drop.DROPPING_FILE)
    assert set(run["curves"]) == set(layer_drop.CRITERIA)
    # element n: the loss with n layers removed, n = 0 .. 4 (deepest never removes the last layer)
    assert all(len(curve) == 5 for name, curve in run["curves"].items() if name != "deepest")
    assert len(run["curves"]["deepest"]) == 4
    assert run["curves"]["angular"][0] == run["curves"]["gate"][0] == run["val_loss"]
    assert run["random_seeds"] != read_json(out / "runs" / "gated-s2" / layer_drop.DROPPING_FILE)["random_seeds"]
    assert set(run["healing"]) == {"1", "2"} and set(run["healing"]["2"]) == set(layer_drop.CRITERIA)
    assert "healing" not in read_json(out / "runs" / "rezero-s0" / layer_drop.DROPPING_FILE)
    rows = summary["comparisons"]
    assert {r["family"] for r in rows} == set(layer_drop.GATED) and {r["n"] for r in rows} == {1, 2}
    assert all(len(r["seeds"]) == 3 and r["p_corrected"] is not None for r in rows if r["test"]["p_value"] is not None)
    assert summary["pressure"]["seeds"] == [0, 1, 2]
    for name in ("table.md", "findings.md", "layer_drop.png"):
        assert (out / name).is_file(), name
    assert "Holm" in (out / "table.md").read_text()
    # resumed: nothing is trained or analysed again
    stamp = (out / "runs" / "gated-s1" / layer_drop.DROPPING_FILE).stat().st_mtime_ns
    layer_drop.run(config, out, resume=True, progress=False)
    assert (out / "runs" / "gated-s1" / layer_drop.DROPPING_FILE).stat().st_mtime_ns == stamp


def test_the_study_refuses_options_that_do_not_fit():
    from throughway.experiments import layer_drop

    with pytest.raises(ValueError, match="steps=10 is not a multiple of eval_every=4"):
        dataclasses.replace(layer_drop.QUICK, steps=10, eval_every=4)
    with pytest.raises(ValueError, match="width=30 is not divisible by heads=4"):
        dataclasses.replace(layer_drop.QUICK, width=30, heads=4)
    assert ScalarGate  # the gates the study reads are the toolkit's


def test_the_gates_learning_rate_multiple_reaches_only_the_gates():
    from throughway.train.optim import build_optimizer
    from throughway.train.recipes import parameter_groups

    model = create_model("gpt", depth=2, width=16, heads=2, context=12, vocab_size=20, gate="relu")
    recipe = get_recipe("nanogpt-char", gate_lr_mult=10.0)
    gates = {id(ref.gate.k) for ref in find_branches(model).values()}
    groups = parameter_groups(model, recipe)
    holding = [g for g in groups if {id(p) for p in g["params"]} & gates]
    assert len(holding) == 1 and {id(p) for p in holding[0]["params"]} == gates and holding[0]["lr_mult"] == 10.0
    assert all(g["lr_mult"] == 1.0 for g in groups if g is not holding[0])
    lrs = sorted(g["lr"] for g in build_optimizer(model, recipe).param_groups)
    assert lrs[-1] == pytest.approx(10 * recipe.lr) and lrs[0] == pytest.approx(recipe.lr)
    with pytest.raises(ValueError, match="gate_lr_mult=0"):
        recipe.replace(gate_lr_mult=0.0)
