"""Studies split into shards (study.shards, issue 34): shards of whole batches, `--shard auto` from a job
array's variables, shards running at the same time into one folder, and the SLURM array script."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from throughway.cli import main
from throughway.cli.parser import build_parser
from throughway.experiments import EXPERIMENTS, get_experiment
from throughway.study.options import config_from_args
from throughway.study.shards import resolve_shard, select_shard
from throughway.study.stacking import group_specs

from conftest import MNIST_DEPTH_SMALL_ARGV, run_cli

ROOT = Path(__file__).resolve().parents[1]
# A tiny mnist-depth: 2 depths, one stacked batch each (plain and gated nets, 2 seeds).
TINY = ["reproduce", "mnist-depth", "--quick", "--depths", "2", "4", "--archs", "plain", "gated", "--epochs", "1",
        "--limit", "200", "--width", "8", "--jobs", "1", "--quiet"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SGE_", "PBS_"))}
    return {**env, "PYTHONPATH": os.pathsep.join(sys.path), "THROUGHWAY_THREADS": "1", "OMP_NUM_THREADS": "1", **extra}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "throughway", *args]


def _runs(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/results.json"))}


# -- which runs a shard trains ---------------------------------------------------------------------------

def test_shards_are_whole_batches_dealt_in_turn_and_cover_the_study_once(fake_mnist_root):
    study = get_experiment("mnist-depth")
    config = dataclasses.replace(study.QUICK, depths=(2, 4, 6, 8, 10, 12), archs=("plain", "gated"))
    batches = group_specs(study.specs(config))
    assert len(batches) == 6
    parts = [select_shard(batches, f"{i}/4") for i in (1, 2, 3, 4)]
    assert [len(p) for p in parts] == [2, 2, 1, 1]
    assert parts[0] == [batches[0], batches[4]] and parts[3] == [batches[3]]
    names = [s.name for part in parts for batch in part for s in batch]
    assert sorted(names) == sorted(s.name for s in study.specs(config))  # every run in exactly one shard
    assert select_shard(batches, "1/1") == batches and select_shard(batches, None) == batches


def test_every_study_of_many_runs_declares_shard_and_merge(capsys):
    # Every study of many runs or pieces (all but sdi-table: one table of closed forms, seconds) offers
    # --shard and --merge. A new study gets both by deriving its Config from study.options.StudyOptions
    # (or study.resumable.ResumableOptions) and passing config.shard on; add it here.
    studies = ["mnist-depth", "gate-family", "gate-family-init", "highway-depth", "cifar-gated", "hessian-init",
               "hessian-dynamics", "shortcut-lr", "weight-norms", "identity-distance", "transformer-gates"]
    studies += [name for name, module in EXPERIMENTS.items()  # and any other that declares them
                if name not in studies and "shard" in getattr(module.Config, "__dataclass_fields__", {})]
    for name in studies:
        with pytest.raises(SystemExit):
            build_parser().parse_args(["reproduce", name, "--help"])
        text = capsys.readouterr().out
        assert "--shard SHARD" in text and "--merge" in text and "SLURM_ARRAY_TASK_ID" in text, name
        fields = EXPERIMENTS[name].Config.__dataclass_fields__
        assert fields["shard"].default == "1/1" and fields["merge"].default is False, name


# -- --shard auto ------------------------------------------------------------------------------------

@pytest.mark.parametrize("env, shard", [
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "1"}, "3/8"),
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_MAX": "8", "SLURM_ARRAY_TASK_STEP": "1"}, "3/8"),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0",
      "SLURM_ARRAY_TASK_MAX": "3"}, "1/4"),  # --array=0-3: task 0 is shard 1
    ({"SGE_TASK_ID": "2", "SGE_TASK_FIRST": "1", "SGE_TASK_LAST": "5", "SGE_TASK_STEPSIZE": "1"}, "2/5"),
    ({"PBS_ARRAY_INDEX": "2", "THROUGHWAY_SHARD_COUNT": "6", "THROUGHWAY_SHARD_FIRST": "1"}, "2/6"),
    ({"PBS_ARRAY_INDEX": "2", "THROUGHWAY_SHARD_COUNT": "6", "THROUGHWAY_SHARD_FIRST": "0"}, "3/6"),
    ({"PBS_ARRAY_INDEX": "2", "THROUGHWAY_SHARD_COUNT": "6", "THROUGHWAY_SHARD_FIRST": "2"}, None),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
      "THROUGHWAY_SHARD_FIRST": "0"}, None),  # the two disagree
    ({}, None),  # not set: refused
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "1", "SLURM_ARRAY_TASK_MIN": "3",
      "SLURM_ARRAY_TASK_MAX": "3"}, None),  # a rerun of task 3 alone cannot tell N
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_MAX": "7"}, None),  # --array=1,3,7: not contiguous
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_STEP": "2"}, None),
    ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "4"}, None),
    ({"PBS_ARRAY_INDEX": "2"}, None),  # PBS gives no count
])
def test_shard_auto_reads_the_array_variables(env, shard):
    if shard is not None:
        assert resolve_shard("auto", env) == shard
    else:
        with pytest.raises(ValueError, match="--shard auto: "):
            resolve_shard("auto", env)
    assert resolve_shard("2/3", env) == "2/3"


@pytest.mark.parametrize("env", [
    {"PBS_ARRAY_INDEX": "{task}", "THROUGHWAY_SHARD_COUNT": "4"},  # qsub -J 0-3 (or 1-4)
    {"SLURM_ARRAY_TASK_ID": "{task}", "SLURM_ARRAY_TASK_COUNT": "4"},  # no SLURM_ARRAY_TASK_MIN
])
def test_shard_auto_without_a_first_id_deals_no_shard_twice(env):
    # Every task of the array must get its own shard; a task cannot tell 0..3 from 1..4 by its own id, so
    # without the first id every task is refused, naming the variable to set, and with it the shards are 1..4.
    for tasks in (range(0, 4), range(1, 5)):
        for task in tasks:
            with pytest.raises(ValueError, match="THROUGHWAY_SHARD_FIRST=0 for an array numbered 0..N-1"):
                resolve_shard("auto", {k: v.format(task=task) for k, v in env.items()})
        shards = [resolve_shard("auto", {**{k: v.format(task=task) for k, v in env.items()},
                                         "THROUGHWAY_SHARD_FIRST": str(tasks[0])}) for task in tasks]
        assert shards == ["1/4", "2/4", "3/4", "4/4"]


def test_shard_auto_on_the_command_line(tmp_path, capsys, monkeypatch):
    for name in [k for k in os.environ if k.startswith(("SLURM_", "SGE_", "PBS_"))]:
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit) as exit_:
        main([*TINY, "--shard", "auto", "--out", str(tmp_path / "s")])
    assert exit_.value.code == 2
    assert "none of SLURM_ARRAY_TASK_ID" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    module = get_experiment("mnist-depth")
    args = build_parser().parse_args([*TINY, "--shard", "auto"])
    config = config_from_args(module.Config, args, device=args.device, data_dir=args.data_dir)
    assert config.shard == "2/3"  # the config (and results.json) records i/N
    with pytest.raises(SystemExit):
        build_parser().parse_args([*TINY, "--shard", "4/3"])


# -- shards at the same time into one folder ---------------------------------------------------------

@pytest.mark.slow
def test_two_shards_at_once_into_one_folder_give_the_unsharded_summary(tmp_path, fake_mnist_root):
    whole, shared = tmp_path / "whole", tmp_path / "shared"
    env = _env(THROUGHWAY_DATA=str(fake_mnist_root))
    # The unsharded study (its own folder) and its two shards (one shared folder), all started at once.
    commands = [_cli(*TINY, "--out", str(whole))] + [_cli(*TINY, "--shard", f"{i}/2", "--out", str(shared))
                                                     for i in (1, 2)]
    started = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for c in commands]
    outputs = [p.communicate(timeout=300) for p in started]
    for p, (_, err) in zip(started, outputs):
        assert p.returncode == 0, err[-3000:]  # neither shard was refused by the other's lock

    expected = json.loads((whole / "results.json").read_text())
    last = json.loads((shared / "results.json").read_text())  # written by the shard that ended last
    for key in ("cells", "curves", "comparisons"):
        assert last[key] == expected[key], key
    assert last["errors"] == {} and [s["shard"] for s in last["shards"]] == ["1/2", "2/2"]
    assert sorted(n for s in last["shards"] for n in s["done"]) == sorted(_runs(whole))
    assert last["config"]["shard"] in ("1/2", "2/2")

    code = main(["reproduce", "mnist-depth", "--quick", "--depths", "2", "4", "--archs", "plain", "gated",
                 "--epochs", "1", "--limit", "200", "--width", "8", "--merge", "--quiet", "--out", str(shared)])
    assert code == 0
    merged = json.loads((shared / "results.json").read_text())
    for key in ("cells", "curves", "comparisons"):
        assert merged[key] == expected[key], key

    # Every run records its shard and launch: one process (world size 1), shard 1/2 or 2/2 of the study.
    runs, alone = _runs(shared), _runs(whole)
    assert sorted(runs) == sorted(alone) and len(runs) == 8
    assert {r["launch"]["shard"] for r in runs.values()} == {"1/2", "2/2"}
    assert {r["launch"]["shard"] for r in alone.values()} == {"1/1"}
    assert all(r["launch"]["world_size"] == 1 and r["launch"]["rank_layout"]["nodes"] == 1 for r in runs.values())
    def numbers(results: dict) -> list[dict]:  # every epoch's record but its wall times
        return [{k: v for k, v in h.items() if not k.endswith("_s")} for h in results["history"]]

    assert {n: numbers(r) for n, r in runs.items()} == {n: numbers(r) for n, r in alone.items()}


def test_a_shard_of_another_split_and_a_second_process_of_one_shard_are_refused(tmp_path, fake_mnist_root, capsys):
    from throughway.study.shards import shard_folder
    from throughway.train.rundir import RunDir

    out = tmp_path / "s"
    with RunDir(shard_folder(out, "1/2"), "--shard").locked():  # shard 1/2 is running
        assert main([*TINY, "--shard", "1/2", "--out", str(out)]) == 2
        assert "shards/1-of-2 is in use by another throughway process" in capsys.readouterr().err
        assert main([*TINY, "--out", str(out)]) == 2  # an unsharded study would train the shard's runs too
        assert "is in use by shards 1-of-2" in capsys.readouterr().err
    assert main([*TINY, "--shard", "1/3", "--out", str(out)]) == 2
    assert "holds shards of another split (1-of-2)" in capsys.readouterr().err


@pytest.mark.slow
def test_a_rerun_shard_needs_resume_and_failures_reach_the_summary(tmp_path, fake_mnist_root, capsys):
    out = tmp_path / "s"
    assert main([*TINY, "--shard", "2/2", "--out", str(out)]) == 0
    state = json.loads((out / "shards" / "2-of-2" / "state.json").read_text())
    assert state["shard"] == "2/2" and len(state["done"]) == 4 and state["errors"] == {}
    assert main([*TINY, "--shard", "2/2", "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    summary = json.loads((out / "results.json").read_text())
    states = [r["state"] for c in summary["cells"] for r in c["runs"]]
    assert states.count("finished") == 4 and states.count("not started") == 4
    assert main([*TINY, "--shard", "1/2", "--out", str(out)]) == 0  # the other shard, later: no --resume needed
    summary = json.loads((out / "results.json").read_text())
    assert all(r["state"] == "finished" for c in summary["cells"] for r in c["runs"])


# -- --merge checks what it merges ----------------------------------------------------------------------

SMALL = list(MNIST_DEPTH_SMALL_ARGV)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != ".summary.lock"}


@pytest.fixture
def small_study(tmp_path, fake_mnist_root, mnist_depth_small) -> Path:
    """A copy of the session's small mnist-depth study (conftest.mnist_depth_small)."""
    return Path(shutil.copytree(mnist_depth_small, tmp_path / "study", symlinks=True))


def test_merge_refuses_swapped_run_folders_naming_the_folder_and_the_fields(small_study, capsys):
    runs = small_study / "runs"
    (runs / "plain-d2-s0").rename(runs / "swap")
    (runs / "gated-d2-s0").rename(runs / "plain-d2-s0")
    (runs / "swap").rename(runs / "gated-d2-s0")
    before = _files(small_study)
    capsys.readouterr()
    assert main([*SMALL, "--merge", "--out", str(small_study)]) == 2
    err = capsys.readouterr().err
    assert f"{runs / 'plain-d2-s0'}: holds a run of another config than the study's run plain-d2-s0" in err
    assert "model: recorded 'mlp_gated_residual', the study's 'mlp_plain'" in err
    assert _files(small_study) == before  # nothing written: no summary, table or figure of the wrong cells


def test_merge_refuses_a_run_folder_copied_from_a_study_with_other_options(small_study, capsys):
    # A run of a study with `--epochs 3 --limit 100` copied in under the same name (its results.json says so).
    path = small_study / "runs" / "gated-d2-s1" / "results.json"
    results = json.loads(path.read_text())
    results["config"].update(epochs=3, limit=100)
    path.write_text(json.dumps(results))
    before = _files(small_study)
    capsys.readouterr()
    assert main([*SMALL, "--merge", "--out", str(small_study)]) == 2
    err = capsys.readouterr().err
    assert f"{small_study / 'runs' / 'gated-d2-s1'}: holds a run of another config" in err
    assert "epochs: recorded 3, the study's 1; limit: recorded 100, the study's 200" in err
    assert _files(small_study) == before


@pytest.mark.parametrize("link", ["runs/gated-d2-s0", "runs/gated-d2-s0/results.json", "runs"])
def test_merge_reads_no_run_through_a_link(small_study, tmp_path, capsys, link):
    # The linked copy holds the same files: only the link is the fault, and it is named.
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(small_study / link), str(elsewhere))
    (small_study / link).symlink_to(elsewhere, target_is_directory=elsewhere.is_dir())
    before = _files(small_study)
    capsys.readouterr()
    assert main([*SMALL, "--merge", "--out", str(small_study)]) == 2
    assert f"{small_study / link} is a symbolic link" in capsys.readouterr().err
    assert _files(small_study) == before


# -- the SLURM array script ----------------------------------------------------------------------------

@pytest.mark.slow
def test_the_slurm_array_script_runs_each_task_as_its_shard(tmp_path, fake_mnist_root):
    out = tmp_path / "study"
    study = " ".join(TINY[:-3] + ["--out", str(out)])  # the script adds --jobs, --threads, --quiet
    env = _env(THROUGHWAY_DATA=str(fake_mnist_root), STUDY_ARGS=study, THROUGHWAY=f"{sys.executable} -m throughway",
               SLURM_ARRAY_TASK_COUNT="2", SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_MAX="2", SLURM_CPUS_PER_TASK="1")
    script = str(ROOT / "scripts" / "slurm_study.sbatch")
    tasks = [subprocess.Popen(["bash", script], env={**env, "SLURM_ARRAY_TASK_ID": str(i)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    outputs = [t.communicate(timeout=300) for t in tasks]
    for task, (_, err) in zip(tasks, outputs):
        assert task.returncode == 0, err[-3000:]
    assert "task 1 of 2" in outputs[0][1] and "--shard auto" in outputs[0][1]
    summary = json.loads((out / "results.json").read_text())
    assert all(r["state"] == "finished" for c in summary["cells"] for r in c["runs"])
    assert {r["launch"]["shard"] for r in _runs(out).values()} == {"1/2", "2/2"}
    assert all(r["launch"]["scheduler"]["SLURM_ARRAY_TASK_ID"] in ("1", "2") for r in _runs(out).values())
    # A resubmitted task (--array=2: SLURM_ARRAY_TASK_MIN 2) cannot tell N: refused, exit 2, nothing trained.
    rerun = subprocess.run(["bash", script], env={**env, "SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "2",
                                                  "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_TASK_COUNT": "1"},
                           capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 2 and "SLURM_ARRAY_TASK_MIN=2" in rerun.stderr
    # ... unless told its shard: the finished shard resumes and trains nothing.
    again = subprocess.run(["bash", script], env={**env, "SLURM_ARRAY_TASK_ID": "2", "SHARD": "2/2"},
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]


# -- a study computed piece by piece (study.resumable) -------------------------------------------------

def test_gate_family_init_shards_compute_every_cell_once_into_one_folder(tmp_path, fake_mnist_root):
    study = get_experiment("gate-family-init")
    config = dataclasses.replace(study.Config(), depths=(2,), families=("gated", "rezero", "residual"), seeds=1,
                                 hessian_width=3, samples=16, width=8)
    whole = study.run(config, tmp_path / "whole", progress=False)
    out = tmp_path / "shared"
    first = study.run(dataclasses.replace(config, shard="1/2"), out, progress=False)
    assert sorted(first["cells"]) == ["gated-d2-s0", "residual-d2-s0"]  # cells 1 and 3 of the study's order
    second = study.run(dataclasses.replace(config, shard="2/2"), out, progress=False)  # no --resume needed
    merged = study.run(dataclasses.replace(config, merge=True), out, progress=False)

    def numbers(summary: dict) -> dict:  # every cell's numbers but its timings
        return {key: {**cell, "hessian": {k: v for k, v in cell["hessian"].items() if "seconds" not in k}}
                for key, cell in summary["cells"].items()}

    for summary in (second, merged):
        assert numbers(summary) == numbers(whole)
    assert json.loads((out / "shards" / "2-of-2" / "cells.json").read_text()).keys() >= {"rezero-d2-s0"}
    assert (out / "table.md").read_text() == (tmp_path / "whole" / "table.md").read_text()


def test_a_demystifying_study_in_two_shards_equals_the_whole(tmp_path, fake_mnist_root):
    # The studies computed piece by piece share ResumableStudy's sharding: weight-norms' curves here.
    study = get_experiment("weight-norms")
    config = dataclasses.replace(study.Config(), depths=(2, 4), activations=("linear",), epochs=3, relu_epochs=2)
    whole = study.run(config, tmp_path / "whole", progress=False)
    out = tmp_path / "shared"
    first = study.run(dataclasses.replace(config, shard="1/2"), out, progress=False)
    assert sorted(first["curves"]) == ["linear-L2"]
    study.run(dataclasses.replace(config, shard="2/2"), out, progress=False)
    merged = study.run(dataclasses.replace(config, merge=True), out, progress=False)

    def numbers(summary: dict) -> dict:
        return {k: {f: v for f, v in c.items() if f != "seconds"} for k, c in summary["curves"].items()}

    assert numbers(merged) == numbers(whole) and len(merged["curves"]) == 2


# -- one unsharded process per study folder --------------------------------------------------------------

GATED_STUDY = ["reproduce", "mnist-depth", "--quick", "--archs", "gated", "--epochs", "1", "--limit", "64", "--width",
               "8", "--jobs", "1", "--quiet"]


def test_a_second_study_process_on_one_out_exits_at_once_naming_the_holder(tmp_path, capsys, monkeypatch):
    from throughway.study.shards import study_lock

    def refuse(*args, **kwargs):
        raise AssertionError("the second process read data or trained")

    monkeypatch.setattr("throughway.study.stacking.prepare_data", refuse)
    out = tmp_path / "study"
    out.mkdir()
    with study_lock(out):  # the first process (a separate open file description: flock's unit)
        code, err = run_cli(capsys, GATED_STUDY + ["--depths", "2", "--out", str(out)])
        assert (out / ".lock.json").is_file()
    assert code == 2
    assert f"throughway: error: {out} is in use by another throughway process (pid {os.getpid()} on " in err
    # Nothing written but the empty `.lock` that filelock locks (kept, so that no process can lock an
    # unlinked file); the holder's record was removed by it.
    assert sorted(p.name for p in out.iterdir()) == [".lock"] and (out / ".lock").stat().st_size == 0
