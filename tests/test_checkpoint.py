"""What a run saves and reads back (train.checkpoint, train.run): checkpoints and their rotation, the model
file and its metadata, a finished run's files rebuilt or named; every file read back is untrusted input:
exit 2 (or ValueError) naming the file and the field, nothing outside the run directory changed or deleted,
no finished work lost."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from throughway._io import sha256_file
from throughway.cli import main
from throughway.models import LEGACY_MNIST_ARCH, create_model, with_legacy_config
from throughway.train import RunConfig, load_model, read_results, run_training, save_model
from throughway.train.checkpoint import MAX_MODEL_PARAMETERS, read_checkpoint_meta, save_checkpoint
from throughway.train.rundir import CHECKPOINT_FILE, RunDir, write_rotating

from conftest import Crash, PLAIN_ARGS, file_hashes, file_tree, interrupted_run, run_cli, sha256_of




def _model_file(path: Path, **changes) -> Path:
    model = create_model("mlp_plain", depth=2, width=8)
    save_model(path, model)
    tensors = load_file(str(path))
    config = {**model.config, **changes}
    save_file(tensors, str(path), metadata={"format": "throughway-model-1", "config": json.dumps(config)})
    return path


GATED_TRAIN = ["train", "--model", "mlp_gated_residual", "--depth", "2", "--width", "8", "--epochs", "2", "--limit",
               "64", "--quiet"]


NESTED = "[" * 100000 + "]" * 100000


REPO = Path(__file__).resolve().parents[1]


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("target", ["relative", "absolute"])
def test_checkpoint_json_naming_a_file_outside_is_refused(tmp_path, fake_mnist_root, capsys, victim, resume, target):
    out = interrupted_run(tmp_path / "run")
    (out / "results.json").unlink()  # the case of the report: nothing but the checkpoint left
    meta = json.loads((out / "checkpoint.json").read_text())
    meta["file"] = "../VICTIM.txt" if target == "relative" else str(victim)
    meta["sha256"] = sha256_file(victim)
    (out / "checkpoint.json").write_text(json.dumps(meta))
    before, victim_hash = file_hashes(out), sha256_of(victim)
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(out)] + (["--resume"] if resume else []))
    assert code == 2
    assert "checkpoint.json" in err and ("'file'" in err if resume else "--resume" in err)
    assert sha256_of(victim) == victim_hash and file_hashes(out) == before


def test_save_checkpoint_never_deletes_what_a_tampered_json_names(tmp_path, victim):
    model = create_model("mlp_plain", depth=2, width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator()
    run = tmp_path / "run"
    save_checkpoint(run, model=model, optimizer=optimizer, generator=generator, epoch=1, extra={})
    meta = json.loads((run / "checkpoint.json").read_text())
    meta["file"] = "../VICTIM.txt"
    (run / "checkpoint.json").write_text(json.dumps(meta))
    save_checkpoint(run, model=model, optimizer=optimizer, generator=generator, epoch=2, extra={})
    assert victim.read_text() == "must survive\n"
    assert json.loads((run / "checkpoint.json").read_text())["file"] == "checkpoint-e0002.safetensors"


@pytest.mark.parametrize("old_name, deleted", [("checkpoint-e0001.safetensors", True), ("../VICTIM.txt", False),
                                               ("checkpoint-e0001.safetensors/../../VICTIM.txt", False), (17, False)])
def test_write_rotating_deletes_only_the_previous_checkpoint_it_wrote(tmp_path, victim, old_name, deleted):
    # The one write sequence of checkpoint.json and batch.json: new file, then JSON, then the old file.
    run = tmp_path / "run"
    write_rotating(run, "state.json", "checkpoint-e0001.safetensors", b"one", {"epoch": 1}, CHECKPOINT_FILE)
    meta = json.loads((run / "state.json").read_text())
    assert meta == {"epoch": 1, "file": "checkpoint-e0001.safetensors", "sha256": hashlib.sha256(b"one").hexdigest()}
    (run / "state.json").write_text(json.dumps({**meta, "file": old_name}))
    write_rotating(run, "state.json", "checkpoint-e0002.safetensors", b"two", {"epoch": 2}, CHECKPOINT_FILE)
    assert json.loads((run / "state.json").read_text())["file"] == "checkpoint-e0002.safetensors"
    assert (run / "checkpoint-e0002.safetensors").read_bytes() == b"two"
    assert (run / "checkpoint-e0001.safetensors").exists() is not deleted
    assert victim.read_text() == "must survive\n"


@pytest.mark.parametrize("resume", [False, True])
def test_checkpoint_files_without_checkpoint_json_are_not_overwritten(tmp_path, fake_mnist_root, capsys, resume):
    out = interrupted_run(tmp_path / "run")
    (out / "checkpoint.json").unlink()
    (out / "results.json").unlink()
    before = file_hashes(out)
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(out)] + (["--resume"] if resume else []))
    assert code == 2 and "checkpoint-e0001.safetensors" in err
    assert file_hashes(out) == before


def test_resume_without_results_json_checks_the_config(tmp_path, fake_mnist_root, capsys):
    out = interrupted_run(tmp_path / "run")
    (out / "results.json").unlink()
    before = file_hashes(out)
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(out), "--resume", "--seed", "7"])
    assert code == 2 and "seed: 0 → 7" in err
    assert file_hashes(out) == before
    code, _ = run_cli(capsys, PLAIN_ARGS + ["--out", str(out), "--resume"])
    assert code == 0
    results = read_results(out)
    assert results["final"]["epochs_completed"] == 2 and [r["epoch"] for r in results["history"]] == [1, 2]


def test_truncated_checkpoint_is_an_error_naming_it(tmp_path, fake_mnist_root, capsys):
    out = interrupted_run(tmp_path / "run")
    checkpoint = out / "checkpoint-e0001.safetensors"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    code, err = run_cli(capsys, PLAIN_ARGS + ["--out", str(out), "--resume"])
    assert code == 2 and str(checkpoint) in err and "damaged" in err
    assert checkpoint.stat().st_size == 100


def test_load_model_refuses_a_huge_depth_before_building(tmp_path):
    path = _model_file(tmp_path / "model.safetensors", depth=50_000)
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"depth=50000.*only \d+ tensors"):
        load_model(path)
    assert time.perf_counter() - started < 5.0


def test_load_model_bounds_the_parameter_count(tmp_path):
    path = _model_file(tmp_path / "model.safetensors", width=10**6)
    with pytest.raises(ValueError, match=f"{MAX_MODEL_PARAMETERS:,}"):
        load_model(path)


def test_load_model_compares_metadata_with_the_tensor_shapes(tmp_path):
    path = _model_file(tmp_path / "model.safetensors", width=9)
    with pytest.raises(ValueError, match=r"model\.safetensors: the tensors do not match"):
        load_model(path)


def test_truncated_model_file_is_an_error_naming_it(tmp_path, capsys):
    path = _model_file(tmp_path / "model.safetensors")
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
        load_model(path)


def test_a_checkpoint_history_record_of_wrong_types_is_refused(tmp_path, fake_mnist_root, capsys):

    out = tmp_path / "run"
    config = RunConfig(model="mlp_gated_residual", depth=2, epochs=2, model_kwargs={"width": 8})
    with pytest.raises(KeyboardInterrupt):
        run_training(config, out, progress=False, callbacks=[Crash(after=1)])
    meta = json.loads((out / "checkpoint.json").read_text())
    meta["history"]["epochs"][0]["k"] = "abc"
    (out / "checkpoint.json").write_text(json.dumps(meta))
    code = main(["train", "--model", "mlp_gated_residual", "--depth", "2", "--width", "8", "--epochs", "2", "--quiet",
                 "--resume", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"throughway: error: {out / 'checkpoint.json'}: field 'history.epochs[0]' is ")
    assert "a list of numbers (or null) for k" in err


def test_checkpoints_past_epoch_9999_are_valid_and_rotate(tmp_path, sentinel_tree):
    model = create_model("mlp_plain", depth=1, width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator()
    before = file_tree(sentinel_tree)
    for epoch in (9999, 10000, 10001):
        save_checkpoint(tmp_path, model=model, optimizer=optimizer, generator=generator, epoch=epoch, extra={})
    assert read_checkpoint_meta(tmp_path)["file"] == "checkpoint-e10001.safetensors"
    assert sorted(p.name for p in tmp_path.glob("checkpoint-e*")) == ["checkpoint-e10001.safetensors"]
    assert [p.name for p in RunDir(tmp_path).checkpoint_files()] == ["checkpoint-e10001.safetensors"]
    assert file_tree(sentinel_tree) == before


@pytest.mark.parametrize("damage", ["missing", "truncated", "fifo"])
def test_a_finished_runs_lost_model_file_is_rebuilt_from_its_final_checkpoint(work, capsys, damage):
    run = work / "finished"
    model = run / "model.safetensors"
    original = {k: v.clone() for k, v in load_file(str(model)).items()}  # not the file's memory map
    if damage == "missing":
        model.unlink()
    elif damage == "truncated":
        model.write_bytes(model.read_bytes()[:100])
    else:
        model.unlink()
        os.mkfifo(model)
    code, err = run_cli(capsys, GATED_TRAIN[:-1] + ["--out", str(run), "--resume"])
    assert code == 0, err
    assert f"{model}: " in err and "rebuilt from checkpoint-e0002.safetensors (epoch 2)" in err
    rebuilt = load_file(str(model))
    assert sorted(rebuilt) == sorted(original) and all(torch.equal(rebuilt[k], original[k]) for k in original)
    recorded = json.loads((run / "results.json").read_text())["model"]["config"]
    assert {k: load_model(model).config[k] for k in recorded} == recorded


def test_a_finished_run_without_model_or_checkpoint_is_an_error_naming_the_file(work, capsys):
    run = work / "finished"
    for name in ("model.safetensors", "checkpoint.json", "checkpoint-e0002.safetensors"):
        (run / name).unlink()
    before = file_tree(run)
    code, err = run_cli(capsys, GATED_TRAIN + ["--out", str(run), "--resume"])
    assert code == 2
    assert f"{run / 'model.safetensors'}: is missing, but {run / 'results.json'} says the run finished" in err
    assert file_tree(run) == before


@pytest.mark.parametrize("key, value", [("bn_eps", 1e30), ("bn_momentum", float("inf")), ("k_init", float("nan"))])
def test_load_model_refuses_metadata_out_of_range(tmp_path, key, value):
    from safetensors.torch import save_file

    model = create_model("mlp_gated_residual", depth=2, width=8)
    path = tmp_path / "model.safetensors"
    config = {**model.config, key: value}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"format": "throughway-model-1", "config": json.dumps(config)})
    with pytest.raises(ValueError, match=rf"{path}: metadata field 'config' does not describe a model .*{key}="):
        load_model(path)


def test_load_model_refuses_integer_tensors_where_floats_belong(tmp_path):
    model = create_model("mlp_gated_residual", depth=2, width=8)
    path = save_model(tmp_path / "model.safetensors", model)
    tensors = load_file(str(path))
    metadata = {"format": "throughway-model-1", "config": json.dumps(model.config)}
    tensors = {k: v.to(torch.int32) if v.is_floating_point() else v.clone() for k, v in tensors.items()}
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(ValueError, match=rf"{path}: tensor '.*' is torch.int32, the model's is torch.float32"):
        load_model(path)


def test_a_model_file_with_deeply_nested_config_is_named(finished_train_run, tmp_path):
    tensors = load_file(str(finished_train_run / "model.safetensors"))
    from safetensors import safe_open

    with safe_open(str(finished_train_run / "model.safetensors"), framework="pt") as handle:
        metadata = dict(handle.metadata())
    path = tmp_path / "nested.safetensors"
    save_file(tensors, str(path), metadata={**metadata, "config": NESTED})
    with pytest.raises(ValueError) as info:
        load_model(path)
    assert str(path) in str(info.value) and "'config'" in str(info.value) and "nested too deeply" in str(info.value)


def test_a_module_of_another_dtype_is_named_not_the_good_file(tmp_path):
    path = save_model(tmp_path / "m.safetensors", nn.Linear(5, 3))
    with pytest.raises(ValueError) as info:
        load_model(path, model=nn.Linear(5, 3).double())
    message = str(info.value)
    assert message.startswith("model: the Linear given as model= is torch.float64") and "torch.float32" in message
    assert "edited or damaged" not in message
    assert load_model(path, model=nn.Linear(5, 3)).weight.dtype == torch.float32


def test_a_model_argument_that_is_no_module_is_named(tmp_path):
    path = save_model(tmp_path / "m.safetensors", nn.Linear(5, 3))
    with pytest.raises(TypeError, match="model: got str 'mlp'; accepted: the torch.nn.Module"):
        load_model(path, model="mlp")


def test_save_model_of_a_compiled_model_loads(tmp_path: Path) -> None:
    model = create_model("mlp_gated_residual", depth=4, width=8).eval()
    compiled = torch.compile(model)
    path = save_model(tmp_path / "model.safetensors", compiled)
    from safetensors.torch import load_file

    assert not any(key.startswith("_orig_mod.") for key in load_file(str(path)))
    x = torch.rand(3, 1, 28, 28)
    assert torch.equal(load_model(path)(x), model(x))


def test_load_model_accepts_a_file_with_compiled_keys(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    model = create_model("mlp_residual", depth=4, width=8).eval()
    path = save_model(tmp_path / "model.safetensors", model)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    save_file({f"_orig_mod.{k}": v for k, v in load_file(str(path)).items()}, str(path), metadata=metadata)
    x = torch.rand(3, 1, 28, 28)
    assert torch.equal(load_model(path)(x), model(x))


def test_old_mnist_10_files_load_as_our_layout(tmp_path):
    # results/conv/highway-conv-mnist-w16 was trained with the toolkit's earlier "mnist-10" layout.
    saved = json.loads((REPO / "results/conv/highway-conv-mnist-w16/results.json").read_text())["model"]
    config = with_legacy_config(saved["config"])
    assert config["arch"] == LEGACY_MNIST_ARCH
    name = config.pop("name")
    assert _count(create_model(name, **config)) == saved["parameters"]
    # A model file written then (no `dropout` in its config) loads into the same layout with its weights.
    model = create_model("highway_conv", arch=LEGACY_MNIST_ARCH, width=4)
    model.config = {k: v for k, v in model.config.items() if k != "dropout"} | {"arch": "mnist-10"}
    save_model(tmp_path / "old.safetensors", model)
    loaded = load_model(tmp_path / "old.safetensors")
    assert loaded.config["arch"] == LEGACY_MNIST_ARCH
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(loaded(x), model.eval()(x))
    # Files written now keep their layout.
    assert with_legacy_config(create_model("highway_conv", width=4).config)["arch"] == "mnist-10"
