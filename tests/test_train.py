"""fit, divergence, checkpoints and resume, results files."""

from __future__ import annotations

import json
import math

import pytest
import torch

from throughway.models import create_model
from throughway.train import (RunConfig, RunExistsError, evaluate, fit, get_recipe, load_model, read_results,
                              run_training)

from conftest import Crash


def test_fit_learns_the_fixture(fake_data):
    model = create_model("mlp_gated_residual", depth=2, width=32)
    history = fit(model, fake_data, get_recipe("gresnet-mnist", epochs=3, batch_size=64), progress=False)
    losses = [r["train_loss"] for r in history.epochs]
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.5
    assert history.epochs[-1]["test_error_pct"] < 30.0
    assert len(history.epochs[-1]["k"]) == 1 and not history.diverged


def test_evaluate_restores_the_mode_and_counts_errors(fake_data):
    model = create_model("mlp_plain", depth=2, width=16)
    model.train()
    loss, error = evaluate(model, fake_data.test)
    assert model.training and math.isfinite(loss) and 0.0 <= error <= 100.0


def test_divergence_ends_the_run_cleanly(fake_data):
    model = create_model("mlp_plain", depth=2, width=16, norm="none")
    # An absurd learning rate makes the loss overflow within the second epoch at the latest.
    recipe = get_recipe("highway-mnist", lr=1e12, momentum=0.9, epochs=5, batch_size=32)
    history = fit(model, fake_data, recipe, progress=False)
    assert history.diverged
    assert history.diverged_at["epoch"] <= 2
    assert len(history.epochs) == history.diverged_at["epoch"] - 1
    assert all(torch.isfinite(p).all() for p in model.parameters()), "model not restored to its last finite state"


def test_run_writes_results_and_model(tmp_path, fake_mnist_root):
    config = RunConfig(model="mlp_gated_residual", depth=4, epochs=2, model_kwargs={"width": 16})
    results = run_training(config, tmp_path / "run", progress=False)
    on_disk = read_results(tmp_path / "run")
    assert on_disk["final"] == json.loads(json.dumps(results["final"]))
    for key in ("config", "environment", "history", "final"):
        assert key in on_disk
    for key in ("torch_version", "device", "threads", "git_revision"):
        assert key in on_disk["environment"]
    record = on_disk["history"][-1]
    for key in ("epoch", "train_loss", "val_error_pct", "test_error_pct", "k"):
        assert key in record
    assert set(on_disk["final"]) >= {"test_error_pct", "diverged"}
    model = load_model(tmp_path / "run" / "model.safetensors")
    assert len(model.blocks) == 2 and [round(b.gate.k.item(), 6) for b in model.blocks] == \
        [round(k, 6) for k in record["k"]]
    with pytest.raises(RunExistsError, match="--resume"):
        run_training(config, tmp_path / "run", progress=False)
    assert run_training(config, tmp_path / "run", resume=True, progress=False)["final"] == on_disk["final"]



@pytest.mark.parametrize("model,recipe,kwargs", [
    ("mlp_gated_residual", "gresnet-mnist", {"width": 16}),
    ("mlp_highway", "highway-mnist", {"width": 16, "activation": "tanh"}),
])
def test_resume_ends_with_the_same_numbers(tmp_path, fake_mnist_root, model, recipe, kwargs):
    config = RunConfig(model=model, depth=4, recipe=recipe, epochs=4, seed=3, model_kwargs=kwargs)
    straight = run_training(config, tmp_path / "straight", progress=False)
    with pytest.raises(KeyboardInterrupt):
        run_training(config, tmp_path / "crashed", progress=False, callbacks=[Crash(after=2)])
    partial = read_results(tmp_path / "crashed")
    assert partial["final"] is None and len(partial["history"]) == 2
    resumed = run_training(config, tmp_path / "crashed", resume=True, progress=False)
    strip = lambda h: [{k: v for k, v in r.items() if not k.endswith("_s")} for r in h]  # noqa: E731
    assert strip(resumed["history"]) == strip(straight["history"])
    assert resumed["final"] == straight["final"]
    a = load_model(tmp_path / "straight" / "model.safetensors").state_dict()
    b = load_model(tmp_path / "crashed" / "model.safetensors").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_another_config(tmp_path, fake_mnist_root):
    config = RunConfig(model="mlp_plain", depth=2, epochs=1, model_kwargs={"width": 8})
    run_training(config, tmp_path / "run", progress=False)
    other = RunConfig(model="mlp_plain", depth=2, epochs=1, seed=5, model_kwargs={"width": 8})
    with pytest.raises(RunExistsError, match="seed"):
        run_training(other, tmp_path / "run", resume=True, progress=False)


def test_damaged_checkpoint_is_detected(tmp_path, fake_mnist_root):
    config = RunConfig(model="mlp_plain", depth=2, epochs=3, model_kwargs={"width": 8})
    with pytest.raises(KeyboardInterrupt):
        run_training(config, tmp_path / "run", progress=False, callbacks=[Crash(after=1)])
    checkpoint = next((tmp_path / "run").glob("checkpoint-e*.safetensors"))
    checkpoint.write_bytes(checkpoint.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(ValueError, match="checkpoint is damaged"):
        run_training(config, tmp_path / "run", resume=True, progress=False)


# -- the Python API checks what the command line checks -----------------------------------------------------

@pytest.mark.parametrize("config, named", [
    (RunConfig(model="mlp_plain", depth=2, epochs=1.5, model_kwargs={"width": 8}),  # type: ignore[arg-type]
     "epochs=1.5: must be a whole number ≥ 1"),
    (RunConfig(model="mlp_plain", depth=2, recipe="wrn-cifar", dataset="mnist",
               recipe_overrides={"milestone_factor": -0.1}, model_kwargs={"width": 8}),
     "milestone_factor=-0.1: must be a finite number > 0"),
])
def test_run_training_refuses_what_the_cli_refuses(tmp_path, no_data, config, named):
    with pytest.raises(ValueError, match=named):
        run_training(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
