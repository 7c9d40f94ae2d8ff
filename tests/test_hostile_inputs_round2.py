"""Issue 25, the second reliability round: one test per finding (numbered as in the issue).

Each test asserts the exact promise: exit 2 (or ValueError) with a message naming the file, field or
option; no file outside the run directory created or changed (the SHA-256 of a sentinel tree); no
finished work lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from throughway.cli import main
from throughway.data import to_splits
from throughway.data.sources import save_cache
from throughway.models import create_model
from throughway.train import RunConfig, load_model, run_training, save_model
from throughway.train.checkpoint import read_checkpoint_meta, save_checkpoint
from throughway.train.rundir import RunDir
from conftest import Crash, make_arrays

TRAIN = ["train", "--model", "mlp_gated_residual", "--depth", "2", "--width", "8", "--epochs", "2", "--limit", "64",
         "--quiet"]
CONFIG = RunConfig(model="mlp_gated_residual", depth=2, epochs=2, limit=64, model_kwargs={"width": 8})


def _tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path → SHA-256), links included as their target's name."""
    tree = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            tree[str(path.relative_to(folder))] = "link:" + os.readlink(path)
        elif path.is_file():
            tree[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return tree


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    """A folder outside every run directory, with files that must survive unchanged."""
    folder = tmp_path / "sentinel"
    (folder / "sub").mkdir(parents=True)
    (folder / "VICTIM.txt").write_text("must survive\n")
    (folder / "sub" / "gates.json").write_text('{"mine": true}\n')
    (folder / "metrics.csv").write_text("my,own,numbers\n")
    return folder


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """data/: a fake MNIST cache; finished/: a finished gated run; interrupted/: one stopped after epoch 1."""
    root = tmp_path_factory.mktemp("round2")
    arrays = make_arrays(n_train=128, n_val=64, n_test=64)
    save_cache(root / "data" / "mnist", arrays, "test fixture")
    data = to_splits(arrays)
    run_training(CONFIG, root / "finished", progress=False, data=data)
    with pytest.raises(KeyboardInterrupt):
        run_training(CONFIG, root / "interrupted", progress=False, data=data, callbacks=[Crash(after=1)])
    return root


@pytest.fixture
def work(base, tmp_path, monkeypatch) -> Path:
    """A copy of `base` in this test's folder, with $THROUGHWAY_DATA pointing at its data cache."""
    for name in ("data", "finished", "interrupted"):
        shutil.copytree(base / name, tmp_path / name, symlinks=True)
    monkeypatch.setenv("THROUGHWAY_DATA", str(tmp_path / "data"))
    return tmp_path


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


def _edit_results(run: Path, change: Any) -> None:
    results = json.loads((run / "results.json").read_text())
    change(results)
    (run / "results.json").write_text(json.dumps(results))


# -- 1. a run directory never chooses the data folder; every config field read back is type-checked --

def test_1_analyze_never_takes_the_data_folder_from_results_json(work, capsys, sentinel):
    elsewhere = work / "elsewhere"
    _edit_results(work / "finished", lambda r: r["config"].update(data_dir=str(elsewhere)))
    before = _tree(sentinel)
    code, err = _run(capsys, ["analyze", "lesion", str(work / "finished"), "--quiet"])
    assert code == 0, err
    assert not elsewhere.exists()  # nothing downloaded to, or read from, the folder the file names
    assert _tree(sentinel) == before
    assert (work / "finished" / "analysis" / "lesion.json").is_file()


@pytest.mark.parametrize("field, value, accepted", [
    ("train_on_full", "no", "true or false"),
    ("limit", "64", "null or an integer ≥ 2"),
    ("dataset", "../mnist", "one of"),
    ("depth", 2.5, "an integer from 1 to"),
])
def test_1_config_fields_read_back_are_type_checked(work, capsys, field, value, accepted):
    _edit_results(work / "finished", lambda r: r["config"].update({field: value}))
    code, err = _run(capsys, ["analyze", "lesion", str(work / "finished"), "--quiet"])
    assert code == 2
    assert f"results.json: field 'config.{field}' is {value!r}; accepted: {accepted}" in err
    assert not (work / "finished" / "analysis").exists()


# -- 2. symbolic links inside run directories are refused -------------------------------------------

def test_2_a_symlinked_analysis_folder_is_refused(work, capsys, sentinel):
    (work / "finished" / "analysis").symlink_to(sentinel / "sub")
    before = _tree(sentinel)
    code, err = _run(capsys, ["analyze", "gates", str(work / "finished")])
    assert code == 2
    assert f"{work / 'finished' / 'analysis'}: is a symbolic link" in err and "nothing was written" in err
    assert _tree(sentinel) == before


@pytest.mark.parametrize("link", [".", "results.json", "metrics.csv", "checkpoint.json", ".lock.json"])
def test_2_a_symlinked_run_folder_or_run_file_is_refused(work, capsys, sentinel, link):
    run = work / "interrupted"
    if link == ".":
        target, run = run, work / "link"
        run.symlink_to(target)
    else:
        if not (sentinel / link).exists():
            (sentinel / link).write_text("{}\n")
        (run / link).unlink(missing_ok=True)
        (run / link).symlink_to(sentinel / link)
    before, target_before = _tree(sentinel), _tree(work / "interrupted")
    code, err = _run(capsys, TRAIN + ["--out", str(run), "--resume"])
    assert code == 2
    assert "is a symbolic link" in err and "nothing was changed" in err
    assert _tree(sentinel) == before and _tree(work / "interrupted") == target_before


def test_2_a_symlinked_run_folder_in_a_study_is_not_trained_into(tmp_path, capsys, sentinel, fake_mnist_root):
    out = tmp_path / "study"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "gated-d2-s0").symlink_to(sentinel / "sub")
    before = _tree(sentinel)
    code, err = _run(capsys, STUDY + ["--depths", "2", "--out", str(out), "--resume"])
    assert code == 2
    assert f"{out / 'runs' / 'gated-d2-s0'} is a symbolic link" in err
    assert _tree(sentinel) == before


def test_2_a_symlinked_runs_folder_of_a_study_is_refused(tmp_path, capsys, sentinel):
    out = tmp_path / "study"
    out.mkdir()
    (out / "runs").symlink_to(sentinel)
    before = _tree(sentinel)
    code, err = _run(capsys, STUDY + ["--depths", "2", "--out", str(out), "--resume"])
    assert code == 2
    assert f"--out {out}: {out / 'runs'} is a symbolic link" in err
    assert _tree(sentinel) == before


# -- 3. a user's metrics.csv and .lock.json are never overwritten or deleted -------------------------

def test_3_a_folder_holding_metrics_csv_is_refused_without_resume(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.csv").write_text("my,own,numbers\n")
    code, err = _run(capsys, TRAIN + ["--out", str(out)])
    assert code == 2
    assert f"{out} already holds a run (metrics.csv); pass --resume" in err
    assert (out / "metrics.csv").read_text() == "my,own,numbers\n"


def test_3_a_batched_member_folder_holding_metrics_csv_is_refused_without_resume(tmp_path, fake_data):
    from throughway.train import RunExistsError
    from throughway.train.batched import train_batched

    dirs = [tmp_path / "study" / f"run-{i}" for i in range(2)]
    dirs[1].mkdir(parents=True)
    (dirs[1] / "metrics.csv").write_text("my,own,numbers\n")
    configs = [RunConfig(model="mlp_gated_residual", depth=2, epochs=1, seed=s, model_kwargs={"width": 8}) for s in (0, 1)]
    with pytest.raises(RunExistsError, match=rf"{dirs[1]} already holds a run \(metrics.csv\); pass --resume"):
        train_batched(configs, dirs, progress=False, data=fake_data)
    assert (dirs[1] / "metrics.csv").read_text() == "my,own,numbers\n"


def test_3_a_lock_file_the_toolkit_did_not_write_is_left_alone(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock.json").write_text('{"my": "notes"}\n')
    code, err = _run(capsys, TRAIN + ["--out", str(out)])
    assert code == 2
    assert f"{out / '.lock.json'}: exists but is not a lock record written by throughway" in err
    assert (out / ".lock.json").read_text() == '{"my": "notes"}\n'


def test_3_a_lock_file_replaced_while_the_run_holds_the_lock_is_not_deleted(tmp_path):
    run = RunDir(tmp_path / "out")
    with run.locked():
        assert json.loads(run.lock_file.read_text())["pid"] == os.getpid()
        run.lock_file.write_text('{"written": "by someone else"}\n')
    assert run.lock_file.read_text() == '{"written": "by someone else"}\n'
    run.lock_file.unlink()
    with run.locked():
        pass
    assert not run.lock_file.exists()  # the record this process wrote is removed at the end


# -- 4. runs of 10,000 epochs or more resume -------------------------------------------------------

def test_4_checkpoints_past_epoch_9999_are_valid_and_rotate(tmp_path, sentinel):
    model = create_model("mlp_plain", depth=1, width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator()
    before = _tree(sentinel)
    for epoch in (9999, 10000, 10001):
        save_checkpoint(tmp_path, model=model, optimizer=optimizer, generator=generator, epoch=epoch, extra={})
    assert read_checkpoint_meta(tmp_path)["file"] == "checkpoint-e10001.safetensors"
    assert sorted(p.name for p in tmp_path.glob("checkpoint-e*")) == ["checkpoint-e10001.safetensors"]
    assert [p.name for p in RunDir(tmp_path).checkpoint_files()] == ["checkpoint-e10001.safetensors"]
    assert _tree(sentinel) == before


def test_4_batch_states_past_epoch_9999_are_valid():
    from throughway.train.rundir import BATCH_FILE, CHECKPOINT_FILE

    assert BATCH_FILE.fullmatch("batch-e12345.safetensors") and CHECKPOINT_FILE.fullmatch("checkpoint-e10000.safetensors")
    assert not CHECKPOINT_FILE.fullmatch("checkpoint-e999.safetensors")


# -- 5. a finished run whose model.safetensors is missing, truncated or a FIFO ---------------------

@pytest.mark.parametrize("damage", ["missing", "truncated", "fifo"])
def test_5_a_finished_runs_lost_model_file_is_rebuilt_from_its_final_checkpoint(work, capsys, damage):
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
    code, err = _run(capsys, TRAIN[:-1] + ["--out", str(run), "--resume"])
    assert code == 0, err
    assert f"{model}: " in err and "rebuilt from checkpoint-e0002.safetensors (epoch 2)" in err
    rebuilt = load_file(str(model))
    assert sorted(rebuilt) == sorted(original) and all(torch.equal(rebuilt[k], original[k]) for k in original)
    recorded = json.loads((run / "results.json").read_text())["model"]["config"]
    assert {k: load_model(model).config[k] for k in recorded} == recorded


def test_5_a_finished_run_without_model_or_checkpoint_is_an_error_naming_the_file(work, capsys):
    run = work / "finished"
    for name in ("model.safetensors", "checkpoint.json", "checkpoint-e0002.safetensors"):
        (run / name).unlink()
    before = _tree(run)
    code, err = _run(capsys, TRAIN + ["--out", str(run), "--resume"])
    assert code == 2
    assert f"{run / 'model.safetensors'}: is missing, but {run / 'results.json'} says the run finished" in err
    assert _tree(run) == before


# -- 6. analyze checks model.safetensors against results.json ---------------------------------------

def test_6_a_model_file_of_another_depth_is_refused(work, capsys):
    run = work / "finished"
    save_model(run / "model.safetensors", create_model("mlp_gated_residual", depth=4, width=8))
    code, err = _run(capsys, ["analyze", "gates", str(run)])
    assert code == 2
    assert f"{run / 'model.safetensors'}: holds another model than {run / 'results.json'} describes" in err
    assert "model.config.depth: file 4, results 2; config.depth: file 4, results 2" in err
    assert not (run / "analysis").exists()


# -- 7. analyze bn-stats pools only runs of one setting ---------------------------------------------

@pytest.mark.parametrize("field, value", [("recipe", "highway-mnist"), ("epochs", 7), ("limit", 32)])
def test_7_bn_stats_refuses_to_pool_runs_of_other_settings(work, capsys, field, value):
    other = work / "other"
    shutil.copytree(work / "finished", other)
    _edit_results(other, lambda r: r["config"].update({field: value}))
    code, err = _run(capsys, ["analyze", "bn-stats", str(work / "finished"), str(other), "--out", str(work / "bn")])
    assert code == 2
    assert f"fields config.{field} differ; a row pools seeds of one setting only" in err
    assert not (work / "bn").exists()


def test_7_bn_stats_refuses_to_pool_runs_of_other_widths(work, capsys):
    other = work / "other"
    shutil.copytree(work / "finished", other)
    save_model(other / "model.safetensors", create_model("mlp_gated_residual", depth=2, width=16))

    def widen(results: dict[str, Any]) -> None:
        results["model"]["config"]["width"] = results["config"]["model_kwargs"]["width"] = 16

    _edit_results(other, widen)
    code, err = _run(capsys, ["analyze", "bn-stats", str(work / "finished"), str(other), "--out", str(work / "bn")])
    assert code == 2
    assert "fields model.config, config.model_kwargs differ" in err
    assert not (work / "bn").exists()


# -- 12. analyze --checkpoint while train writes the run --------------------------------------------

def test_12_a_checkpoint_is_paired_with_its_own_epoch_record(work, capsys):
    run = work / "interrupted"
    meta = read_checkpoint_meta(run)
    record = meta["history"]["epochs"][meta["epoch"] - 1]
    # results.json is rewritten after the checkpoint: a reader may see it one epoch behind.
    _edit_results(run, lambda r: r.update(history=[]))
    code, err = _run(capsys, ["analyze", "gates", str(run), "--checkpoint"])
    assert code == 0, err
    gates = json.loads((run / "analysis" / "gates.json").read_text())
    assert gates["run_final"] == {"snapshot": True, "epochs_completed": meta["epoch"],
                                  "test_error_pct": record["test_error_pct"]}


@pytest.mark.parametrize("damage", ["missing", "rewritten"])
def test_12_a_checkpoint_replaced_while_reading_says_try_again(work, capsys, damage):
    run = work / "interrupted"
    path = run / read_checkpoint_meta(run)["file"]
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:-10])
    code, err = _run(capsys, ["analyze", "gates", str(run), "--checkpoint"])
    assert code == 2
    assert str(path) in err and "try again" in err


# -- 8. duplicate values in study lists are refused up front ----------------------------------------

STUDY = ["reproduce", "mnist-depth", "--quick", "--archs", "gated", "--epochs", "1", "--limit", "64", "--width", "8",
         "--jobs", "1", "--quiet"]


@pytest.mark.parametrize("argv, named", [
    (STUDY + ["--depths", "2", "2"], "--depths 2 2: lists 2 more than once; accepted: distinct values"),
    (["reproduce", "hessian-dynamics", "--seeds", "3", "3"],
     "--seeds 3 3: lists 3 more than once; accepted: distinct values"),
    (["reproduce", "shortcut-lr", "--networks", "xavier", "orthogonal", "xavier"],
     "--networks xavier orthogonal xavier: lists xavier more than once"),
])
def test_8_a_study_list_with_a_repeated_value_is_refused_before_anything_runs(tmp_path, capsys, argv, named):
    code, err = _run(capsys, argv + ["--out", str(tmp_path / "study")])
    assert code == 2
    assert named in err
    assert not (tmp_path / "study").exists()


def test_8_check_specs_refuses_a_run_listed_twice():
    from throughway.study.spec import RunSpec, check_specs

    spec = RunSpec("gated-d2-s0", CONFIG)
    with pytest.raises(ValueError, match="runs gated-d2-s0: listed more than once"):
        check_specs([spec, spec])


# -- 15. one process per study folder ---------------------------------------------------------------

def test_15_a_second_study_process_on_one_out_exits_at_once_naming_the_holder(tmp_path, capsys, monkeypatch):
    from throughway.study.shards import study_lock

    def refuse(*args, **kwargs):
        raise AssertionError("the second process read data or trained")

    monkeypatch.setattr("throughway.study.stacking.prepare_data", refuse)
    out = tmp_path / "study"
    out.mkdir()
    with study_lock(out):  # the first process (a separate open file description: flock's unit)
        code, err = _run(capsys, STUDY + ["--depths", "2", "--out", str(out)])
        assert (out / ".lock.json").is_file()
    assert code == 2
    assert f"throughway: error: {out} is in use by another throughway process (pid {os.getpid()} on " in err
    # Nothing written but the empty `.lock` that filelock locks (kept, so that no process can lock an
    # unlinked file); the holder's record was removed by it.
    assert sorted(p.name for p in out.iterdir()) == [".lock"] and (out / ".lock").stat().st_size == 0


# -- 13. a study folder whose results.json holds another JSON value ---------------------------------

@pytest.mark.parametrize("argv, name", [
    (STUDY + ["--depths", "2"], "mnist-depth"),
    (["reproduce", "hessian-init", "--depths", "2", "--resume"], "hessian-init"),
    (["reproduce", "gate-family", "--quick", "--resume"], "gate-family"),
])
def test_13_a_study_summary_that_is_not_an_object_is_named(tmp_path, capsys, argv, name):
    out = tmp_path / "study"
    out.mkdir()
    (out / "results.json").write_text("[]\n")
    code, err = _run(capsys, argv + ["--out", str(out)])
    assert code == 2
    assert f"{out / 'results.json'}: holds list []; expected a {name} study's summary (a JSON object)" in err
    # nothing written but the study lock's empty `.lock` (filelock's, kept: see test_15)
    assert sorted(p.name for p in out.iterdir()) == [".lock", "results.json"]
    assert (out / "results.json").read_text() == "[]\n"


# -- 14. damaged study or run files are named with the field ----------------------------------------

def _study_with_run(tmp_path: Path, base: Path, change: Any) -> Path:
    out = tmp_path / "study"
    run = out / "runs" / "gated-d2-s0"
    shutil.copytree(base / "finished", run)
    _edit_results(run, change)
    return out


@pytest.mark.parametrize("change, named", [
    (lambda r: r["history"][0].pop("epoch"), "field 'history[0].epoch' is None (missing)"),
    (lambda r: r["history"][0].update(train_loss=[1.0]), "field 'history[0].train_loss' is [1.0] (wrong type)"),
    (lambda r: r["history"][1].update(epoch="2"), "field 'history[1].epoch' is '2' (wrong type)"),
    (lambda r: r["history"][0].update(test_error_pct="1.5"), "field 'history[0].test_error_pct' is '1.5'"),
    (lambda r: r["final"].update(k=["a"]), "field 'final.k' is ['a']; accepted: null or a list of numbers"),
    (lambda r: r.update(history={"epochs": []}), "field 'history' must be a list of objects"),
])
def test_14_a_damaged_run_of_a_study_is_named_with_its_field(tmp_path, base, capsys, change, named):
    out = _study_with_run(tmp_path, base, change)
    run = out / "runs" / "gated-d2-s0"
    before = _tree(run)
    # --epochs 2: the run copied in is the study's gated-d2-s0 but for its damage (its config is checked first)
    code, err = _run(capsys, STUDY + ["--depths", "2", "--epochs", "2", "--out", str(out), "--resume"])
    assert code == 2
    assert f"{run / 'results.json'}: {named}" in err
    assert _tree(run) == before


def test_14_a_damaged_study_summary_is_named_with_its_field(tmp_path, capsys):
    out = tmp_path / "study"
    summary = {"experiment": "mnist-depth", "config": {}}
    out.mkdir()
    (out / "results.json").write_text(json.dumps(summary))
    code, err = _run(capsys, STUDY + ["--depths", "2", "--out", str(out), "--resume"])
    assert code == 2
    assert f"{out / 'results.json'}: field 'cells' is not a list of cells" in err


def test_14_redraw_names_the_folder_for_a_field_that_is_no_number(tmp_path, capsys):
    folder = tmp_path / "analysis"
    folder.mkdir()
    (folder / "prune.json").write_text(json.dumps({"family": "gated", "layers_per_block": "abc"}))
    code, err = _run(capsys, ["analyze", "redraw", str(folder)])
    assert code == 2
    assert f"throughway: error: {folder}: its analysis JSON files" in err
    assert "ValueError: invalid literal for int()" in err


# -- 9. model arguments and the batch size are checked before any data is read ----------------------

@pytest.fixture
def no_data(monkeypatch):
    """Reading the data fails the test: the case must be refused before."""
    def refuse(*args, **kwargs):
        raise AssertionError("the data was read before the arguments were checked")

    monkeypatch.setattr("throughway.train.run.load_dataset", refuse)


@pytest.mark.parametrize("argument, accepted", [
    ("bn_momentum=5", "bn_momentum=5 (--model-arg bn_momentum=..., model_kwargs.bn_momentum); accepted: a number from 0 to 1"),
    ("bn_momentum=-1", "bn_momentum=-1 (--model-arg"),
    ("bn_eps=-1", "bn_eps=-1 (--model-arg bn_eps=..., model_kwargs.bn_eps); accepted: a number above 0, at most 1"),
    ("bn_eps=1e30", "bn_eps=1e+30 (--model-arg"),
])
def test_9_batchnorm_constants_out_of_range_are_refused_before_the_data(tmp_path, capsys, no_data, argument, accepted):
    out = tmp_path / "out"
    code, err = _run(capsys, TRAIN + ["--model-arg", argument, "--out", str(out)])
    assert code == 2
    assert accepted in err
    assert not out.exists()


def test_9_a_batch_of_one_with_batchnorm_is_refused_before_the_data(tmp_path, capsys, no_data):
    out = tmp_path / "out"
    code, err = _run(capsys, TRAIN + ["--batch-size", "1", "--out", str(out)])
    assert code == 2
    assert "recipe_overrides.batch_size=1 (--batch-size): model 'mlp_gated_residual' has BatchNorm layers" in err
    assert not out.exists()


@pytest.mark.parametrize("key, value", [("bn_eps", 1e30), ("bn_momentum", float("inf")), ("k_init", float("nan"))])
def test_9_load_model_refuses_metadata_out_of_range(tmp_path, key, value):
    from safetensors.torch import save_file

    model = create_model("mlp_gated_residual", depth=2, width=8)
    path = tmp_path / "model.safetensors"
    config = {**model.config, key: value}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"format": "throughway-model-1", "config": json.dumps(config)})
    with pytest.raises(ValueError, match=rf"{path}: metadata field 'config' does not describe a model .*{key}="):
        load_model(path)


def test_9_load_model_refuses_integer_tensors_where_floats_belong(tmp_path):
    model = create_model("mlp_gated_residual", depth=2, width=8)
    path = save_model(tmp_path / "model.safetensors", model)
    tensors = load_file(str(path))
    metadata = {"format": "throughway-model-1", "config": json.dumps(model.config)}
    tensors = {k: v.to(torch.int32) if v.is_floating_point() else v.clone() for k, v in tensors.items()}
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(ValueError, match=rf"{path}: tensor '.*' is torch.int32, the model's is torch.float32"):
        load_model(path)


# -- 10. sdi refuses non-finite numbers --------------------------------------------------------------

@pytest.mark.parametrize("option, value", [("--gate-bias", "nan"), ("--target", "inf"), ("--k-init", "nan")])
def test_10_sdi_refuses_non_finite_numbers(capsys, option, value):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # refused by the option's own type, before anything is computed
        main(["sdi", option, value])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2
    assert f"argument {option}: {value}: must be a finite number" in err
    assert out == ""  # no table of nan


@pytest.mark.parametrize("argument", ["gate_bias", "target", "k_init"])
def test_10_the_sdi_function_refuses_non_finite_numbers(argument):
    from throughway.analysis.sdi import sdi

    layer = "gated" if argument == "k_init" else "highway"
    with pytest.raises(ValueError, match=rf"{argument}=nan \(--{argument.replace('_', '-')}\): accepted: a finite number"):
        sdi(layer, 8, **{argument: float("nan")})


# -- 11. the Python API checks what the command line checks ----------------------------------------

@pytest.mark.parametrize("config, named", [
    (RunConfig(model="mlp_plain", depth=2, epochs=1.5, model_kwargs={"width": 8}),  # type: ignore[arg-type]
     "epochs=1.5: must be a whole number ≥ 1"),
    (RunConfig(model="mlp_plain", depth=2, recipe="wrn-cifar", dataset="mnist",
               recipe_overrides={"milestone_factor": -0.1}, model_kwargs={"width": 8}),
     "milestone_factor=-0.1: must be a finite number > 0"),
])
def test_11_run_training_refuses_what_the_cli_refuses(tmp_path, no_data, config, named):
    with pytest.raises(ValueError, match=named):
        run_training(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, named", [
    ({"weight_decay": float("nan")}, "weight_decay=nan: must be a finite number ≥ 0"),
    ({"milestone_factor": -0.5}, "milestone_factor=-0.5"),
    ({"epochs": 2.5}, "epochs=2.5: must be a whole number"),
    ({"batch_size": 1.5}, "batch_size=1.5: must be a whole number"),
])
def test_11_recipes_refuse_fractional_counts_and_non_finite_rates(change, named):
    from throughway.train.recipes import get_recipe

    with pytest.raises(ValueError, match=named):
        get_recipe("gresnet-mnist", **change)


def test_11_nan_inputs_are_named_as_the_data_not_a_divergence():
    from throughway.train import fit

    x = torch.rand(16, 1, 28, 28)
    x[5, 0, 3, 3] = float("nan")
    y = torch.randint(0, 10, (16,))
    model = create_model("mlp_plain", depth=2, width=8)
    with pytest.raises(ValueError, match=r"^data: the inputs hold NaN or infinite values in 1 sample\(s\) "
                                         r"\(the first: index 5\)"):
        fit(model, (x, y), "gresnet-mnist", progress=False)


# -- 16. --quiet is quiet; prune names a meta-device model ------------------------------------------

def test_16_quiet_prints_no_start_or_done_lines(tmp_path, capsys, monkeypatch):
    from throughway.study import workers
    from throughway.study.spec import RunSpec

    monkeypatch.setattr(workers, "run_training", lambda *a, **k: None)
    spec = RunSpec("gated-d2-s0", CONFIG)
    capsys.readouterr()
    assert workers._worker(spec, str(tmp_path), False, 1, False) == ("gated-d2-s0", None)
    assert capsys.readouterr().err == ""
    workers._worker(spec, str(tmp_path), False, 1, True)
    assert capsys.readouterr().err == "[gated-d2-s0] start\n[gated-d2-s0] done\n"


def test_16_train_resume_quiet_prints_nothing(work, capsys):
    code, err = _run(capsys, TRAIN + ["--out", str(work / "interrupted"), "--resume"])
    assert code == 0
    assert err == ""


def test_16_prune_names_a_meta_device_model():
    from throughway.analysis.removal import prune

    with torch.device("meta"):
        model = create_model("mlp_gated_residual", depth=4, width=8)
    with pytest.raises(ValueError, match=r"\('mlp_gated_residual'\) is on the meta device .*prune needs a model with its weights"):
        prune(model, [0])


def test_an_interrupt_during_an_epochs_writes_waits_for_both_files():
    """Ctrl-C while an epoch's checkpoint and results.json are written lands after both (interrupts_deferred)."""
    import os
    import signal

    from throughway.train.rundir import interrupts_deferred

    written = []
    # Python's own handler, whatever an earlier test or library (Lightning's trainer) left installed
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts_deferred():
                written.append("checkpoint")
                os.kill(os.getpid(), signal.SIGINT)   # arrives between the two writes
                written.append("results")
        assert written == ["checkpoint", "results"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handler is restored
    finally:
        signal.signal(signal.SIGINT, outer)
