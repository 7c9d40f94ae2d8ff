"""Causal language models through the toolkit: the models (gpt, hf_gpt2), the loss that owns the shift, fit_lm
(per-step schedule, clipping, bits per character, deterministic evaluation, divergence), a run directory on a
text data set (checkpoints, resume bit for bit), the config's rules, and the block registry on both models."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch.nn import functional as F

from throughway.analysis.blocks import find_blocks, find_branches
from throughway.analysis.removal import lesion
from throughway.data import TextSplits
from throughway.data.text import save_text_cache, to_text_splits
from throughway.layers import add_gates
from throughway.models import create_model
from throughway.train import (RunConfig, causal_lm_loss, evaluate_lm, fit_lm, get_recipe, learning_rate_at_step,
                              load_model, read_results, run_training)
from throughway.train.config import check_config

from conftest import Crash

PATTERN = "to be, or not to be: that is the question.\n"
TEXTS = {"train": PATTERN * 12, "val": PATTERN * 3, "test": "that is the question: to be, or not to be.\n" * 3}
SMALL = {"depth": 2, "width": 16, "heads": 2, "context": 12}


def small_recipe(**changes):
    base = {"epochs": 3, "steps_per_epoch": 8, "batch_size": 8, "warmup_steps": 4, "lr": 1e-2, "min_lr": 1e-3}
    return get_recipe("nanogpt-char", **{**base, **changes})


@pytest.fixture
def text() -> TextSplits:
    return to_text_splits("toy", TEXTS)


def gpt(text: TextSplits, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("gpt", vocab_size=text.vocab_size, **{**SMALL, **kwargs})


# ---------------------------------------------------------------------------------------------------------
# The loss owns the shift


def test_the_loss_scores_position_t_against_token_t_plus_one():
    torch.manual_seed(0)
    logits, block = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 6))
    expected = F.cross_entropy(logits.reshape(-1, 7), block[:, 1:].reshape(-1))
    assert torch.equal(causal_lm_loss(logits, block), expected)
    assert causal_lm_loss(logits, block, reduction="sum").item() == pytest.approx(expected.item() * 15, rel=1e-6)


def test_targets_shifted_by_the_caller_are_refused_naming_the_shift():
    logits = torch.randn(3, 5, 7)
    with pytest.raises(ValueError, match=r"block: shape \(3, 5\) .* T \+ 1 = 6 tokens .* the toolkit shifts"):
        causal_lm_loss(logits, torch.randint(0, 7, (3, 5)))
    with pytest.raises(ValueError, match=r"accepted: integer token ids"):
        causal_lm_loss(logits, torch.rand(3, 6))


def test_the_toolkits_loss_is_hugging_faces_own_on_the_unshifted_block():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=11,
                                                                 n_positions=16)).eval()
    block = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        theirs = model(input_ids=block, labels=block).loss  # Hugging Face shifts the labels inside
        ours = causal_lm_loss(model(input_ids=block[:, :-1]).logits, block)
        # the mistake fit_lm cannot make: targets shifted before they reach a model that shifts again
        wrong = model(input_ids=block[:, :-1], labels=block[:, 1:]).loss
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5)
    assert abs(wrong.item() - ours.item()) > 1e-3


# ---------------------------------------------------------------------------------------------------------
# The models


def test_gpt_is_causal_and_initialised_as_nanogpt():
    torch.manual_seed(0)
    model = create_model("gpt", depth=4, width=64, heads=4, context=16, vocab_size=50).eval()
    x = torch.randint(0, 50, (2, 16))
    changed = x.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 50
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.equal(a[:, 10:], b[:, 10:])
    assert model.token.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].linear1.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].self_attn.in_proj_weight.std().item() == pytest.approx(0.02, rel=0.05)
    scaled = 0.02 / math.sqrt(2 * 4)  # GPT-2's residual projections
    assert model.blocks[0].linear2.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert model.blocks[0].self_attn.out_proj.weight.std().item() == pytest.approx(scaled, rel=0.1)
    assert model.blocks[0].linear1.bias.abs().max().item() == 0.0
    with pytest.raises(ValueError, match=r"T ≤ 16"):
        model(torch.randint(0, 50, (2, 17)))


def test_hf_gpt2_without_transformers_names_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install transformers"):
        create_model("hf_gpt2", depth=1, width=8, heads=2, context=8, vocab_size=5)


@pytest.mark.parametrize("name, prefix", [("gpt", "blocks"), ("hf_gpt2", "lm.transformer.h")])
def test_the_block_registry_finds_gates_and_lesions_both_models(name, prefix):
    if name == "hf_gpt2":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = create_model(name, depth=3, width=16, heads=2, context=8, vocab_size=11).eval()
    x = torch.randint(0, 11, (2, 8))
    assert list(find_blocks(model)) == [f"{prefix}.{i}" for i in range(3)]
    assert list(find_branches(model)) == [f"{prefix}.{i}.{b}" for i in range(3) for b in ("attn", "ff")]
    with torch.no_grad():
        before = model(x)
        with lesion(model, f"{prefix}.1.ff"):
            lesioned = model(x)
        assert not torch.allclose(lesioned, before) and torch.equal(model(x), before)
        add_gates(model, "relu")  # k = 1: the same function
        assert torch.allclose(model(x), before, atol=1e-6)
    gated = create_model(name, depth=3, width=16, heads=2, context=8, vocab_size=11, gate="relu")
    assert len([n for n, _ in gated.named_parameters() if n.endswith(".k")]) == 6


# ---------------------------------------------------------------------------------------------------------
# fit_lm


class Steps:
    """Records each step's learning rate, loss and the global gradient norm after clipping."""

    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.norms: list[float] = []
        self.losses: list[float] = []

    def on_step_end(self, state, step, loss):
        self.lrs.append(state.optimizer.param_groups[0]["lr"])
        grads = [p.grad for p in state.model.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        self.losses.append(loss)


def test_fit_lm_learns_sets_the_rate_every_step_and_records_bits_per_character(text):
    recipe = small_recipe()
    steps = Steps()
    history = fit_lm(gpt(text), text, recipe, [steps], progress=False)
    assert len(history.epochs) == 3 and len(steps.lrs) == 24
    assert steps.lrs == pytest.approx([learning_rate_at_step(recipe, s, 24) for s in range(24)])
    first, last = history.epochs[0], history.epochs[-1]
    assert last["train_loss"] < first["train_loss"] - 0.5 and last["val_loss"] < first["val_loss"]
    for record in history.epochs:
        for split in ("train", "val", "test"):
            assert record[f"{split}_bpc"] == pytest.approx(record[f"{split}_loss"] / math.log(2))
        assert record["lr"] == steps.lrs[(record["epoch"] - 1) * 8]  # the rate of the epoch's first step
        assert 0 <= record["val_error_pct"] <= 100


def test_gradients_are_clipped_to_the_recipes_norm(text):
    clipped, free = Steps(), Steps()
    fit_lm(gpt(text), text, small_recipe(epochs=1, grad_clip=0.05), [clipped], progress=False)
    fit_lm(gpt(text), text, small_recipe(epochs=1, grad_clip=0.0), [free], progress=False)
    assert max(clipped.norms) <= 0.05 * (1 + 1e-5)
    assert max(free.norms) > 0.1


def test_evaluation_is_the_same_number_every_time_on_fixed_blocks(text):
    model = gpt(text)
    loss, error = evaluate_lm(model, text.val, 12)
    assert evaluate_lm(model, text.val, 12) == (loss, error)
    assert evaluate_lm(model, text.val, 12, batch_size=1) == pytest.approx((loss, error), rel=1e-6)
    subset = evaluate_lm(model, text.val, 12, blocks=3)
    assert subset == evaluate_lm(model, text.val, 12, blocks=3) and subset != (loss, error)
    history = fit_lm(model, text, small_recipe(epochs=1, lr=1e-12, min_lr=0.0), eval_blocks=3, progress=False)
    assert history.epochs[0]["val_loss"] == pytest.approx(subset[0], rel=1e-5)


def test_a_hugging_face_model_is_given_inputs_only(text):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=12,
                                                                 vocab_size=text.vocab_size))
    calls = []
    original = model.forward

    def spy(*args, **kwargs):
        calls.append((args, sorted(kwargs)))
        return original(*args, **kwargs)

    model.forward = spy
    history = fit_lm(model, text, small_recipe(epochs=1), progress=False)  # context: the config's n_positions
    assert calls and all(len(args) == 1 and not kwargs for args, kwargs in calls)  # never labels
    assert all(args[0].shape[1] == 12 for args, _ in calls)
    assert math.isfinite(history.epochs[0]["val_bpc"])


class LastPosition(torch.nn.Module):
    """A model that returns only the last position's logits (B, V): not next-token logits for every position."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)[:, -1]


def test_bad_model_output_and_arguments_are_refused_before_the_first_step(text):
    wrong_vocab = create_model("gpt", vocab_size=text.vocab_size - 1, **SMALL)
    with pytest.raises(ValueError, match=rf"built for vocab_size={text.vocab_size - 1}.* vocab_size={text.vocab_size}"):
        fit_lm(wrong_vocab, text, small_recipe(epochs=1), progress=False)
    model = LastPosition(gpt(text))
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"model's output: logits of shape \(8, \d+\) .* for 8 blocks of 12 tokens"):
        fit_lm(model, text, small_recipe(epochs=1), context=12, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no step was taken
    with pytest.raises(ValueError, match=r"context=13: accepted: an integer from 1 to the model's context \(12\)"):
        fit_lm(gpt(text), text, small_recipe(), context=13, progress=False)
    with pytest.raises(TypeError, match=r"data: got tuple; accepted: TextSplits"):
        fit_lm(gpt(text), (text.train, text.train), small_recipe(), progress=False)
    with pytest.raises(ValueError, match=r"augment='crop-flip' applies to images"):
        fit_lm(gpt(text), text, small_recipe(augment="crop-flip"), progress=False)


def test_fit_lm_under_several_ranks_is_refused_not_trained_apart(text, monkeypatch):
    from throughway.train import distributed

    monkeypatch.setattr(distributed, "rank_and_world", lambda: (0, 2))
    with pytest.raises(ValueError, match=r"not data-parallel"):
        fit_lm(gpt(text), text, small_recipe(), progress=False)


class Poison:
    """Makes a weight NaN after step `at`: the next step's loss is not finite."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, state, step, loss):
        if step == self.at:
            with torch.no_grad():
                state.model.head.weight[0, 0] = float("nan")


def test_a_diverged_language_model_goes_back_to_its_last_evaluated_weights(text):
    model = gpt(text)
    saved = {}

    class Keep:
        def on_epoch_end(self, state, record):
            saved.update({k: v.clone() for k, v in state.model.state_dict().items()})

    history = fit_lm(model, text, small_recipe(), [Keep(), Poison(at=11)], progress=False)
    assert history.diverged and history.diverged_at == {"epoch": 2, "step": 3, "loss": "nan"}
    assert len(history.epochs) == 1
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())


# ---------------------------------------------------------------------------------------------------------
# A run directory on a text data set


@pytest.fixture
def text_root(tmp_path, monkeypatch):
    root = tmp_path / "data"
    save_text_cache(root / "shakespeare-char", "shakespeare-char", TEXTS, {"train": ("toy",)}, "test fixture")
    monkeypatch.setenv("THROUGHWAY_DATA", str(root))
    return root


def lm_config(**changes) -> RunConfig:
    base = dict(model="gpt", depth=2, dataset="shakespeare-char", recipe="nanogpt-char", epochs=3, eval_blocks=2,
                model_kwargs={"width": 16, "heads": 2, "context": 12, "dropout": 0.1},
                recipe_overrides={"steps_per_epoch": 4, "batch_size": 4, "warmup_steps": 2})
    return RunConfig(**{**base, **changes})


def _without_times(history):
    return [{k: v for k, v in r.items() if k not in ("epoch_time_s", "elapsed_s")} for r in history]


def test_a_language_model_run_resumes_bit_for_bit(text_root, tmp_path):
    config = lm_config()
    whole = run_training(config, tmp_path / "whole", progress=False)
    with pytest.raises(KeyboardInterrupt):
        run_training(config, tmp_path / "cut", progress=False, callbacks=[Crash(after=1)])
    assert read_results(tmp_path / "cut")["final"] is None
    resumed = run_training(config, tmp_path / "cut", resume=True, progress=False)
    assert _without_times(resumed["history"]) == _without_times(whole["history"])
    assert whole["final"]["val_bpc"] == whole["history"][-1]["val_bpc"] and whole["final"]["epochs_completed"] == 3
    assert whole["data"]["vocab_size"] == to_text_splits("x", TEXTS).vocab_size and whole["data"]["train"] == len(TEXTS["train"])
    a, b = load_model(tmp_path / "whole" / "model.safetensors"), load_model(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert a.config["vocab_size"] == whole["data"]["vocab_size"]  # taken from the data


def test_a_text_runs_config_is_checked_before_any_data(text_root):
    with pytest.raises(ValueError, match=r"a text data set trains a causal language model; accepted: .*gpt, hf_gpt2"):
        check_config(lm_config(model="mlp_residual", model_kwargs={}))
    with pytest.raises(ValueError, match=r"model='gpt' is a causal language model; accepted datasets: \['shakespeare-char'\]"):
        check_config(lm_config(dataset="mnist"))
    with pytest.raises(ValueError, match=r"grad_clip is a setting of the language-model path"):
        check_config(RunConfig(model="mlp_residual", depth=2, recipe="nanogpt-char"))
    check_config(RunConfig(model="mlp_residual", depth=2, recipe="vit-mnist"))  # fit sets a per-step schedule too
    with pytest.raises(ValueError, match=r"eval_blocks is a setting of the language-model path"):
        check_config(RunConfig(model="mlp_residual", depth=2, eval_blocks=3))
    with pytest.raises(ValueError, match=r"eval_blocks=0"):
        check_config(lm_config(eval_blocks=0))
    with pytest.raises(ValueError, match=r"model_kwargs.vocab_size=7 does not match dataset 'shakespeare-char'"):
        check_config(lm_config(model_kwargs={**lm_config().model_kwargs, "vocab_size": 7}))
