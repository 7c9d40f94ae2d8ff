"""Issue 13: hostile files, wrong options and two processes at once.

Each test asserts the promises of `throughway train` (and `load_model`): exit 2 with a message naming
the file, field or option; no file outside the run directory changed (a sentinel's SHA-256); no
finished work lost. Every case is checked before the data is read where it can be (the data
loader is replaced by one that fails the test).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from throughway._io import sha256_file
from throughway.cli import main
from throughway.data import load_mnist
from throughway.data.sources import save_cache
from throughway.models import create_model
from throughway.train import RunConfig, load_model, read_results, run_training, save_model
from throughway.train.checkpoint import MAX_MODEL_PARAMETERS, save_checkpoint
from throughway.train.rundir import CHECKPOINT_FILE, LOCK_FILE, RunDir, write_rotating
from conftest import Crash

ARGS = ["train", "--model", "mlp_plain", "--depth", "2", "--width", "8", "--epochs", "2", "--quiet"]
CONFIG = RunConfig(model="mlp_plain", depth=2, epochs=2, model_kwargs={"width": 8})



def _interrupted_run(out: Path, config: RunConfig = CONFIG) -> Path:
    with pytest.raises(KeyboardInterrupt):
        run_training(config, out, progress=False, callbacks=[Crash(after=1)])
    return out


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: _hash(p) for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    path = tmp_path / "VICTIM.txt"
    path.write_text("must survive\n")
    return path


@pytest.fixture
def no_data(monkeypatch):
    """Reading the data fails the test: the case must be refused before."""
    def refuse(*args, **kwargs):
        raise AssertionError("the data was read before the arguments were checked")

    monkeypatch.setattr("throughway.train.run.load_dataset", refuse)


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


# -- security: a run directory is untrusted input ---------------------------------------------------

@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("target", ["relative", "absolute"])
def test_checkpoint_json_naming_a_file_outside_is_refused(tmp_path, fake_mnist_root, capsys, sentinel, resume, target):
    out = _interrupted_run(tmp_path / "run")
    (out / "results.json").unlink()  # the case of the report: nothing but the checkpoint left
    meta = json.loads((out / "checkpoint.json").read_text())
    meta["file"] = "../VICTIM.txt" if target == "relative" else str(sentinel)
    meta["sha256"] = sha256_file(sentinel)
    (out / "checkpoint.json").write_text(json.dumps(meta))
    before, victim = _snapshot(out), _hash(sentinel)
    code, err = _run(capsys, ARGS + ["--out", str(out)] + (["--resume"] if resume else []))
    assert code == 2
    assert "checkpoint.json" in err and ("'file'" in err if resume else "--resume" in err)
    assert _hash(sentinel) == victim and _snapshot(out) == before


def test_save_checkpoint_never_deletes_what_a_tampered_json_names(tmp_path, sentinel):
    model = create_model("mlp_plain", depth=2, width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator()
    run = tmp_path / "run"
    save_checkpoint(run, model=model, optimizer=optimizer, generator=generator, epoch=1, extra={})
    meta = json.loads((run / "checkpoint.json").read_text())
    meta["file"] = "../VICTIM.txt"
    (run / "checkpoint.json").write_text(json.dumps(meta))
    save_checkpoint(run, model=model, optimizer=optimizer, generator=generator, epoch=2, extra={})
    assert sentinel.read_text() == "must survive\n"
    assert json.loads((run / "checkpoint.json").read_text())["file"] == "checkpoint-e0002.safetensors"


@pytest.mark.parametrize("old_name, deleted", [("checkpoint-e0001.safetensors", True), ("../VICTIM.txt", False),
                                               ("checkpoint-e0001.safetensors/../../VICTIM.txt", False), (17, False)])
def test_write_rotating_deletes_only_the_previous_checkpoint_it_wrote(tmp_path, sentinel, old_name, deleted):
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
    assert sentinel.read_text() == "must survive\n"


@pytest.mark.parametrize("resume", [False, True])
def test_checkpoint_files_without_checkpoint_json_are_not_overwritten(tmp_path, fake_mnist_root, capsys, resume):
    out = _interrupted_run(tmp_path / "run")
    (out / "checkpoint.json").unlink()
    (out / "results.json").unlink()
    before = _snapshot(out)
    code, err = _run(capsys, ARGS + ["--out", str(out)] + (["--resume"] if resume else []))
    assert code == 2 and "checkpoint-e0001.safetensors" in err
    assert _snapshot(out) == before


def _model_file(path: Path, **changes) -> Path:
    model = create_model("mlp_plain", depth=2, width=8)
    save_model(path, model)
    tensors = load_file(str(path))
    config = {**model.config, **changes}
    save_file(tensors, str(path), metadata={"format": "throughway-model-1", "config": json.dumps(config)})
    return path


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


def test_cached_dataset_is_validated_on_load(tmp_path, fake_arrays, capsys):
    bad = type(fake_arrays)(**{**fake_arrays.__dict__, "test_y": fake_arrays.test_y.copy()})
    bad.test_y[0] = 12  # a label outside 0..9, with a manifest whose checksums fit the damaged arrays
    save_cache(tmp_path / "data" / "mnist", bad, "tampered")
    with pytest.raises(ValueError, match=r"label 12 outside 0\.\.9"):
        load_mnist(tmp_path / "data")
    short = type(fake_arrays)(**{**fake_arrays.__dict__, "val_y": fake_arrays.val_y[:-1]})
    save_cache(tmp_path / "short" / "mnist", short, "tampered")
    code, err = _run(capsys, ARGS + ["--out", str(tmp_path / "run"), "--data-dir", str(tmp_path / "short")])
    assert code == 2 and "malformed arrays" in err and str(tmp_path / "short" / "mnist") in err


def test_manifest_with_wrong_types_is_an_error_naming_the_field(tmp_path, fake_arrays, capsys):
    save_cache(tmp_path / "data" / "mnist", fake_arrays, "test")
    manifest = tmp_path / "data" / "mnist" / "manifest.json"
    for field, value in (("num_classes", "ten"), ("files", ["train_x.npy"])):
        content = json.loads(manifest.read_text())
        content[field] = value
        manifest.write_text(json.dumps(content))
        code, err = _run(capsys, ARGS + ["--out", str(tmp_path / "run"), "--data-dir", str(tmp_path / "data")])
        assert code == 2 and "manifest.json" in err and repr(field) in err
    assert not (tmp_path / "run" / "results.json").exists()


# -- correctness: options that silently did something else ------------------------------------------

def test_resume_without_results_json_checks_the_config(tmp_path, fake_mnist_root, capsys):
    out = _interrupted_run(tmp_path / "run")
    (out / "results.json").unlink()
    before = _snapshot(out)
    code, err = _run(capsys, ARGS + ["--out", str(out), "--resume", "--seed", "7"])
    assert code == 2 and "seed: 0 → 7" in err
    assert _snapshot(out) == before
    code, _ = _run(capsys, ARGS + ["--out", str(out), "--resume"])
    assert code == 0
    results = read_results(out)
    assert results["final"]["epochs_completed"] == 2 and [r["epoch"] for r in results["history"]] == [1, 2]


@pytest.mark.parametrize("extra,named", [
    (["--model-arg", "depth=5"], ["--model-arg 'depth=5'", "--depth"]),
    (["--model-arg", "width=5"], ["--model-arg 'width=5'", "--width"]),
    (["--momentum", "0.5"], ["--momentum", "--recipe gresnet-mnist", "nadam"]),
    (["--lr-decay", "0.9"], ["--lr-decay", "--recipe gresnet-mnist", "'constant'"]),
    (["--model-arg", "init_scale=NaN"], ["init_scale", "finite"]),
])
def test_conflicting_or_inapplicable_options_name_both(tmp_path, fake_mnist_root, capsys, no_data, extra, named):
    code, err = _run(capsys, ARGS + ["--out", str(tmp_path / "run")] + extra)
    assert code == 2
    assert all(part in err for part in named), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option,value", [("--k-init", "nan"), ("--lr", "inf"), ("--gate-bias", "-inf"),
                                          ("--weight-decay", "nan")])
def test_non_finite_numbers_are_refused(tmp_path, capsys, no_data, option, value):
    with pytest.raises(SystemExit) as exit_info:
        main(ARGS + ["--out", str(tmp_path / "run"), f"{option}={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert option in err and "finite" in err


@pytest.mark.parametrize("option,value,field", [("--lr", "1e308", "recipe_overrides.lr"),
                                                ("--model-arg", "k_init=1e39", "model_kwargs.k_init")])
def test_numbers_beyond_float32_are_refused_before_the_data(tmp_path, capsys, no_data, option, value, field):
    # finite in Python, but training runs in float32, where they overflow
    code, err = _run(capsys, ARGS + ["--out", str(tmp_path / "run"), option, value])
    assert code == 2 and field in err and "float32" in err, err
    assert not (tmp_path / "run").exists()


def test_a_held_lock_is_refused_naming_the_holder(tmp_path, fake_mnist_root, capsys, no_data):
    with RunDir(tmp_path / "run").locked():
        holder = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
        code, err = _run(capsys, ARGS + ["--out", str(tmp_path / "run")])
    assert holder["pid"] == os.getpid()
    assert code == 2 and f"pid {os.getpid()}" in err and "in use" in err
    assert not (tmp_path / "run" / LOCK_FILE).exists(), "the lock's record outlives the lock"


@pytest.mark.slow
def test_two_processes_on_one_out(tmp_path, fake_mnist_root, capsys):
    """One `train` process runs; a second on the same --out exits 2 naming the first; the first keeps its run.

    The first process is given far more epochs than it can finish, so it is certainly still running
    when the second tries (on a fast machine an 8-epoch run could end first and the test would prove
    nothing); it is then interrupted, and its finished epochs must be
    checkpointed intact (that such a checkpoint resumes is tested above).
    """
    out = tmp_path / "run"
    env = {**os.environ, "THROUGHWAY_DATA": str(fake_mnist_root)}
    # The child's output goes to files, not pipes: a pipe nobody reads while the second run works can fill and
    # block the child, and a pipe inherited by any process the child starts keeps `communicate` waiting after
    # the child itself has ended (the test hung twice in full runs under load with pipes).
    # The child starts with Ctrl-C at its default, as from a terminal. A pytest started in the background
    # (`nohup ... &` from a script) has SIGINT ignored, an ignored SIGINT is inherited through exec, and a
    # Python started so installs no KeyboardInterrupt handler: the toolkit rightly ignores Ctrl-C then, and the
    # test waited 120 s for a Ctrl-C that only landed if it hit an epoch's checkpoint write (which defers it).
    parent_handler = signal.getsignal(signal.SIGINT)
    with open(tmp_path / "first.out", "w") as stdout, open(tmp_path / "first.err", "w") as stderr_file:
        first = subprocess.Popen([sys.executable, "-m", "throughway", *ARGS, "--epochs", "100000", "--out", str(out)],
                                 env=env, stdout=stdout, stderr=stderr_file, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.json").is_file():  # the lock is held and an epoch is finished
            assert first.poll() is None, (tmp_path / "first.err").read_text()
            assert time.monotonic() < deadline, "the first process did not start its run"
            time.sleep(0.05)
        code, err = _run(capsys, ARGS + ["--epochs", "100000", "--out", str(out)])
        still_running = first.poll() is None
    finally:
        first.send_signal(signal.SIGINT)
        try:
            first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
            raise AssertionError(f"Ctrl-C did not end the first process within 120 s (this process's SIGINT "
                                 f"handler: {parent_handler!r}); its stderr: "
                                 + (tmp_path / "first.err").read_text()[-2000:]) from None
    stderr = (tmp_path / "first.err").read_text()
    assert still_running, "the first process ended before the second tried; the test proved nothing"
    assert code == 2 and f"pid {first.pid}" in err and "in use" in err
    assert first.returncode == 130, stderr
    done = json.loads((out / "checkpoint.json").read_text())["epoch"]
    assert done >= 1 and len(read_results(out)["history"]) == done
    meta = json.loads((out / "checkpoint.json").read_text())
    assert sha256_file(out / meta["file"]) == meta["sha256"]  # the interrupted run is intact to resume


def test_stray_tmp_files_are_cleaned_on_the_next_start(tmp_path, fake_mnist_root, capsys):
    out = _interrupted_run(tmp_path / "run")
    stray = [out / ".results.json.ab12cd34.tmp", out / ".checkpoint-e0002.safetensors.x_y1z2w3.tmp"]
    for path in stray:
        path.write_bytes(b"half written")
    mine = out / ".notes.tmp"  # not a name the toolkit writes: left alone
    mine.write_text("keep")
    code, _ = _run(capsys, ARGS + ["--out", str(out), "--resume"])
    assert code == 0 and not any(p.exists() for p in stray) and mine.read_text() == "keep"


# -- errors: a message and exit 2, before any expensive work ----------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_device_cuda_without_cuda(tmp_path, capsys, no_data):
    code, err = _run(capsys, ARGS + ["--out", str(tmp_path / "run"), "--device", "cuda"])
    assert code == 2 and "--device 'cuda'" in err and "accepted here: cpu" in err
    assert not (tmp_path / "run").exists()


def test_unknown_device_is_refused(tmp_path, capsys, no_data):
    code, err = _run(capsys, ARGS + ["--out", str(tmp_path / "run"), "--device", "tpu9"])
    assert code == 2 and "--device 'tpu9'" in err and "accepted" in err


@pytest.mark.parametrize("inside", [False, True])
def test_out_that_is_a_file(tmp_path, capsys, no_data, inside):
    target = tmp_path / "a_file"
    target.write_text("not a directory")
    out = target / "run" if inside else target
    code, err = _run(capsys, ARGS + ["--out", str(out)])
    assert code == 2 and f"--out {out}" in err and "file" in err
    assert target.read_text() == "not a directory"


def test_num_classes_that_does_not_match_the_data(tmp_path, capsys, no_data):
    code, err = _run(capsys, ARGS + ["--out", str(tmp_path / "run"), "--model-arg", "num_classes=5"])
    assert code == 2 and "num_classes=5" in err and "'mnist'" in err and "10" in err


def test_full_disk_keeps_the_last_finished_epoch_and_resumes(tmp_path, fake_mnist_root, capsys, monkeypatch, sentinel):
    straight = tmp_path / "straight"
    assert main(ARGS + ["--epochs", "3", "--out", str(straight)]) == 0
    out = tmp_path / "run"
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:  # the write of epoch 2's checkpoint finds the disk full
        if "checkpoint-e0002" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    capsys.readouterr()
    code, err = _run(capsys, ARGS + ["--epochs", "3", "--out", str(out)])
    assert code == 2
    assert "checkpoint-e0002.safetensors" in err and "no space left on device" in err
    assert "nothing finished was lost" in err
    meta = json.loads((out / "checkpoint.json").read_text())
    assert meta["epoch"] == 1 and sha256_file(out / meta["file"]) == meta["sha256"]
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert read_results(out)["final"] is None and len(read_results(out)["history"]) == 1
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert main(ARGS + ["--epochs", "3", "--out", str(out), "--resume"]) == 0
    strip = lambda h: [{k: v for k, v in r.items() if not k.endswith("_s")} for r in h]  # noqa: E731
    assert strip(read_results(out)["history"]) == strip(read_results(straight)["history"])
    assert sentinel.read_text() == "must survive\n"


def test_truncated_checkpoint_is_an_error_naming_it(tmp_path, fake_mnist_root, capsys):
    out = _interrupted_run(tmp_path / "run")
    checkpoint = out / "checkpoint-e0001.safetensors"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    code, err = _run(capsys, ARGS + ["--out", str(out), "--resume"])
    assert code == 2 and str(checkpoint) in err and "damaged" in err
    assert checkpoint.stat().st_size == 100


def test_truncated_model_file_is_an_error_naming_it(tmp_path, capsys):
    path = _model_file(tmp_path / "model.safetensors")
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
        load_model(path)


@pytest.mark.parametrize("content", ["[]", "null", '{"config": [], "final": null}', '{"final": {"diverged": 1}}'])
def test_results_json_of_the_wrong_shape(tmp_path, fake_mnist_root, capsys, no_data, content):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(content)
    code, err = _run(capsys, ARGS + ["--out", str(out), "--resume"])
    assert code == 2 and "results.json" in err
    assert (out / "results.json").read_text() == content


# -- batched training: the same promises for its run directories and its batch state ----------------

def test_batched_training_locks_and_validates_its_state(tmp_path, fake_mnist_root, monkeypatch, sentinel):
    from throughway.train import stack as stack_module
    from throughway.train.rundir import RunLockedError

    configs = [RunConfig(model="mlp_plain", depth=2, epochs=2, seed=s, model_kwargs={"width": 8}) for s in (0, 1)]
    dirs = [tmp_path / "runs" / f"s{s}" for s in (0, 1)]
    state = tmp_path / "state"
    with RunDir(dirs[1]).locked():
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            stack_module.train_stacked(configs, dirs, progress=False, state_dir=state)
    assert not (dirs[0] / "results.json").exists()

    real = stack_module._evaluate
    calls = {"n": 0}

    def interrupt_after_epoch_1(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the validation split after epoch 2: epoch 1's state is saved
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(stack_module, "_evaluate", interrupt_after_epoch_1)
    with pytest.raises(KeyboardInterrupt):
        stack_module.train_stacked(configs, dirs, progress=False, state_dir=state)
    monkeypatch.setattr(stack_module, "_evaluate", real)
    meta = json.loads((state / "batch.json").read_text())
    meta["file"] = "../VICTIM.txt"
    (state / "batch.json").write_text(json.dumps(meta))
    stray = state / ".batch.json.abcd1234.tmp"
    stray.write_text("half")
    before = _snapshot(state)
    with pytest.raises(ValueError, match=r"batch\.json: field 'file' is '\.\./VICTIM\.txt'"):
        stack_module.train_stacked(configs, dirs, progress=False, state_dir=state, resume=True)
    assert sentinel.read_text() == "must survive\n"
    assert not stray.exists() and _snapshot(state) == {k: v for k, v in before.items() if k != stray.name}


def test_analyze_checkpoint_checks_the_results_model_config(tmp_path, fake_mnist_root, capsys):
    out = _interrupted_run(tmp_path / "run")
    results = json.loads((out / "results.json").read_text())
    results["model"]["config"]["depth"] = 50_000
    (out / "results.json").write_text(json.dumps(results))
    started = time.perf_counter()
    code, err = _run(capsys, ["analyze", "lesion", str(out), "--checkpoint"])
    assert code == 2 and "results.json: config says depth=50000" in err
    assert time.perf_counter() - started < 10.0
