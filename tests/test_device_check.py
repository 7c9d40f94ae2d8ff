"""scripts/device_check.{sh,py} (issue 35): the CPU-side logic of the GPU window's script: arguments,
the protocol's projection, the conv highway table's shard bookkeeping and time guard, the output layout."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = REPOSITORY / "scripts" / "device_check.sh"

# scripts/ is no package: the helper is loaded from its file (an installed package called `scripts`
# cannot shadow it).
_spec = importlib.util.spec_from_file_location("device_check", REPOSITORY / "scripts" / "device_check.py")
assert _spec is not None and _spec.loader is not None
dc = importlib.util.module_from_spec(_spec)
sys.modules["device_check"] = dc
_spec.loader.exec_module(dc)


def _finished(run_dir: Path, epochs: int = 300, diverged: bool = False) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({"history": [{}] * epochs, "diverged": diverged,
                                                      "final": {"test_error_pct": 0.6}}))


def _stopped(run_dir: Path, epoch: int) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({"history": [{}] * epoch, "final": None}))
    (run_dir / "checkpoint.json").write_text(json.dumps({"epoch": epoch}))


def test_the_projection_adds_capture_epochs_and_evaluations_over_the_depths():
    measured = {2: {"first_epoch_s": 3.0, "epoch_s": 1.0, "eval_s": 0.1},
                100: {"first_epoch_s": 12.0, "epoch_s": 2.0, "eval_s": 0.5}}
    p = dc.project_protocol(measured, epochs=100)
    assert p["per_depth_s"] == {"2": pytest.approx(3 + 99 + 10), "100": pytest.approx(12 + 198 + 50)}
    assert p["total_s"] == pytest.approx(112 + 260)
    assert p["total_min"] == pytest.approx(372 / 60)
    assert dc.project_protocol(measured, epochs=1)["total_s"] == pytest.approx(3.1 + 12.5)
    with pytest.raises(ValueError, match="epochs=0"):
        dc.project_protocol(measured, epochs=0)


def test_peak_bf16_knows_the_h100_variants_and_the_h200():
    assert dc.peak_bf16("NVIDIA H100 80GB HBM3") == 989e12
    assert dc.peak_bf16("NVIDIA H100 PCIe") == 756e12
    assert dc.peak_bf16("NVIDIA H200") == 989e12
    assert dc.peak_bf16("NVIDIA A100-SXM4-80GB") == 312e12
    assert dc.peak_bf16("a card nobody has heard of") is None


def test_the_shard_is_the_first_unfinished_runs_in_table_order(tmp_path):
    assert dc.next_shard(tmp_path, 5) == [(16, s) for s in range(5)]
    _finished(tmp_path / "w16-s0")
    _finished(tmp_path / "w16-s1", diverged=True)   # a diverged run is finished too
    _stopped(tmp_path / "w16-s2", epoch=120)        # a window stopped it: resumed first
    (tmp_path / "w16-s3").mkdir()                   # an empty folder counts as no run
    assert dc.next_shard(tmp_path, 3) == [(16, 2), (16, 3), (16, 4)]
    assert dc.run_status(tmp_path / "w16-s2") == {"status": "resumable", "epoch": 120, "of": 300}
    assert dc.run_status(tmp_path / "w16-s1")["status"] == "finished"
    for s in range(2, 5):
        (tmp_path / f"w16-s{s}").mkdir(exist_ok=True)
        _finished(tmp_path / f"w16-s{s}x")  # a folder of another name does not count
    assert dc.next_shard(tmp_path, 10) == [(16, 2), (16, 3), (16, 4)] + [(32, s) for s in range(5)]
    with pytest.raises(ValueError, match="--parallel 0"):
        dc.next_shard(tmp_path, 0)


def test_a_finished_table_runs_nothing(tmp_path):
    for w, s in dc.TABLE:
        _finished(tmp_path / dc.run_name(w, s))
    args = SimpleNamespace(results=str(tmp_path), parallel=5, budget_s=100.0, device="cpu", epochs=300,
                           data_dir=None, out=str(tmp_path / "out"))
    report = dc.highway(args)
    assert report["shard"] == [] and "finished" in report["outcome"]


def test_the_deadline_stops_at_an_epoch_end_only_when_another_epoch_would_not_fit(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(dc.time, "time", lambda: now[0])
    guard = dc.Deadline(deadline=1100.0)
    state = SimpleNamespace(epoch=1, recipe=SimpleNamespace(epochs=300))
    guard.on_epoch_start(state)
    now[0] = 1040.0  # a 40 s epoch; the next would end at 1090 (+ a quarter): fits
    guard.on_epoch_end(state, {})
    guard.on_epoch_start(state)
    now[0] = 1060.0  # a 20 s epoch, but the longest was 40: 1060 + 50 > 1100
    state.epoch = 2
    with pytest.raises(dc.DeadlineReached, match="after epoch 2"):
        guard.on_epoch_end(state, {})
    state.epoch = 300  # the last epoch ends normally, whatever the clock says
    guard.on_epoch_end(state, {})


@pytest.mark.slow
def test_a_run_stopped_by_the_deadline_resumes_to_the_end(tmp_path, fake_mnist_root):
    args = SimpleNamespace(width=4, seed=0, run_dir=str(tmp_path / "w4-s0"), deadline=0.0, device="cpu",
                           data_dir=str(fake_mnist_root), epochs=2, limit=64)
    assert dc.highway_run(args) == 3  # the deadline has passed: stopped after the first epoch
    assert dc.run_status(tmp_path / "w4-s0", epochs=2) == {"status": "resumable", "epoch": 1, "of": 2}
    args.deadline = dc.time.time() + 3600
    assert dc.highway_run(args) == 0
    status = dc.run_status(tmp_path / "w4-s0", epochs=2)
    assert status["status"] == "finished" and status["epoch"] == 2


@pytest.mark.slow
def test_the_highway_part_resumes_a_committed_run_and_archives_the_shard(tmp_path, fake_mnist_root):
    results = tmp_path / "results"
    first = SimpleNamespace(width=16, seed=0, run_dir=str(results / "w16-s0"), deadline=0.0, device="cpu",
                            data_dir=str(fake_mnist_root), epochs=2, limit=32)
    assert dc.highway_run(first) == 3  # a committed run, stopped after epoch 1 by an earlier window
    _finished(results / "w16-s1", epochs=2)
    out = tmp_path / "out"
    args = SimpleNamespace(results=str(results), parallel=1, budget_s=600.0, margin_s=5.0, device="cpu", epochs=2,
                           data_dir=str(fake_mnist_root), limit=32, out=str(out))
    out.mkdir()
    report = dc.highway(args)
    assert report["shard"] == ["w16-s0"] and report["outcome"] == "ran"
    assert report["before"]["w16-s0"]["status"] == "resumable"
    assert report["after"] == {"w16-s0": {"status": "finished", "epoch": 2, "diverged": False}}
    with tarfile.open(out / "highway_runs.tar.gz") as archive:
        names = archive.getnames()
    assert "w16-s0/results.json" in names and "w16-s0/checkpoint.json" in names
    assert not [n for n in names if Path(n).name.startswith(".lock") or n.endswith(".tmp")]
    history = json.loads((results / "w16-s0" / "results.json").read_text())["history"]
    assert len(history) == 1  # the committed folder itself is not written; the archive carries the update


def test_without_mnist_the_highway_part_says_so(tmp_path):
    args = SimpleNamespace(results=str(tmp_path / "results"), parallel=2, budget_s=100.0, device="cpu", epochs=300,
                           data_dir=str(tmp_path / "nothing"), out=str(tmp_path))
    report = dc.highway(args)
    assert report["shard"] == ["w16-s0", "w16-s1"] and report["outcome"].startswith("skipped: no MNIST")


def test_the_protocol_dry_run_writes_its_file_and_the_summary(tmp_path):
    assert dc.main(["protocol", "--out", str(tmp_path), "--dry-run"]) == 0
    assert dc.main(["summary", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "protocol.json").read_text())
    assert result["device"] == "cpu" and set(result["measured"]) == {"2", "4"} and result["complete"] is True
    assert result["measured"]["2"]["models"] == 3 and result["projection"]["epochs"] == 100
    scale = dc.PROTOCOL_TRAIN / result["samples_timed"]
    assert result["at_protocol_size"]["4"]["epoch_s"] == pytest.approx(result["measured"]["4"]["epoch_s"] * scale)
    text = (tmp_path / "summary.md").read_text()
    assert "projected" in text and "wrn.json missing" in text and "highway_shard.json missing" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["protocol.json", "summary.md"]
    # every depth at once (the dry run's one round): its projection from the per-depth numbers and the round
    c = result["concurrent"]
    assert len(c["rounds_s"]) == 1 and c["round_s"] == pytest.approx(c["rounds_s"][0] * scale)
    assert c["sequential_round_s"] == pytest.approx(sum(m["epoch_s"] for m in result["at_protocol_size"].values()))
    assert "Every depth's stack at once" in text


def test_the_concurrent_projection_adds_captures_rounds_and_evaluations():
    per_depth = {2: {"first_epoch_s": 3.0, "epoch_s": 1.0, "eval_s": 0.5},
                 100: {"first_epoch_s": 9.0, "epoch_s": 4.0, "eval_s": 1.5}}
    p = dc.project_concurrent(per_depth, round_s=2.5, epochs=10)
    assert p["total_s"] == pytest.approx(12.0 + 9 * 2.5 + 10 * 2.0)
    assert p["sequential_round_s"] == 5.0 and p["speedup"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="epochs"):
        dc.project_concurrent(per_depth, round_s=2.5, epochs=0)


def test_a_concurrent_round_names_the_depth_that_failed():
    class Broken:
        def epoch(self, *args):
            raise RuntimeError("out of memory")
    x, y = torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)
    stacks = {2: (Broken(), [torch.Generator().manual_seed(0)])}
    with pytest.raises(RuntimeError, match="d = 2.*out of memory"):
        dc.concurrent_rounds(stacks, x, y, 4, torch.device("cpu"), rounds=1)
    with pytest.raises(ValueError, match="rounds"):
        dc.concurrent_rounds(stacks, x, y, 4, torch.device("cpu"), rounds=0)


def test_the_wrn_dry_run_times_the_lagged_loss_read_and_the_summary_prints_it(tmp_path):
    assert dc.main(["wrn", "--out", str(tmp_path), "--dry-run"]) == 0
    assert dc.main(["summary", "--out", str(tmp_path), "--parts", "wrn,summary"]) == 0
    result = json.loads((tmp_path / "wrn.json").read_text())
    for key in ("toolkit_images_per_s", "hand_loop_images_per_s", "hand_loop_reading_loss_images_per_s",
                "toolkit_lagged_images_per_s"):
        assert result[key] > 0, key
    assert result["ratio_lagged"] == pytest.approx(result["toolkit_lagged_images_per_s"] / result["hand_loop_images_per_s"])
    text = (tmp_path / "summary.md").read_text()
    assert f"**ratio {result['ratio']:.3f}**" in text
    assert 'loss_read="lagged"' in text and f"**ratio {result['ratio_lagged']:.3f}** to the hand loop" in text


def test_a_protocol_stopped_between_depths_leaves_the_depths_it_measured(tmp_path, monkeypatch):
    """protocol.json is written after each depth; a part killed at its time limit (window
    h200-2026-11-26-b) still brings back what it measured, marked incomplete, with no projection."""
    measured = {"first_epoch_s": 2.0, "epoch_s": 1.0, "eval_s": 0.1, "models": 3, "captures": 0, "epochs_timed": 2}

    def time_depth(depth, *args, **kwargs):
        if depth == 4:
            raise KeyboardInterrupt  # what `timeout` ends the part with, as far as the file is concerned
        return dict(measured)

    monkeypatch.setattr(dc, "time_protocol_depth", time_depth)
    with pytest.raises(KeyboardInterrupt):
        dc.main(["protocol", "--out", str(tmp_path), "--dry-run"])
    result = json.loads((tmp_path / "protocol.json").read_text())
    assert result["complete"] is False and result["projection"] is None and set(result["measured"]) == {"2"}
    assert dc.main(["summary", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "stopped before every depth was measured" in text and "d = 2: epoch" in text


def test_the_shell_script_takes_the_protocol_compiled_on_request_and_times_the_depths_at_once():
    sh = SCRIPT.read_text()
    assert '--compile-protocol) COMPILE="--compile blocks"' in sh
    assert 'protocol --out "$OUT" --concurrent $COMPILE' in sh
    args = dc.parser().parse_args(["protocol", "--out", "x", "--compile", "blocks"])
    assert args.compile == "blocks" and dc.parser().parse_args(["protocol", "--out", "x"]).compile is None


SECOND_ROUND = ("device", "wrn", "profile", "conv", "protocol", "studies", "summary")


def test_the_outputs_fit_what_a_device_window_brings_back():
    """At most 8 files a window (the default parts, or the profile/conv/studies round), no folders,
    names of letters, digits, '.', '_' and '-'."""
    for parts in (dc.DEFAULT_PARTS, SECOND_ROUND):
        assert sum(len(dc.PART_FILES[part]) for part in parts) <= 8, parts
    assert sorted(dc.OUTPUT_FILES) == sorted(f for files in dc.PART_FILES.values() for f in files)
    assert all(name.replace(".", "").replace("_", "").replace("-", "").isalnum() for name in dc.OUTPUT_FILES)
    sh = SCRIPT.read_text()
    py = (REPOSITORY / "scripts" / "device_check.py").read_text()
    for name in dc.OUTPUT_FILES:
        assert name in sh or name in py, name


@pytest.mark.parametrize("argument", ["--budget-s=soon", "--fast"])
def test_the_shell_script_refuses_unknown_arguments(tmp_path, argument):
    done = subprocess.run(["bash", str(SCRIPT), argument], env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "device_check.sh" in done.stderr
    assert not list(tmp_path.iterdir())


def test_the_shell_script_needs_out(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode != 0 and "OUT" in done.stderr


def test_every_part_is_time_limited_and_the_highway_part_gets_the_rest_of_the_budget():
    sh = SCRIPT.read_text()
    parts = [line.split("&& ", 1)[1] for line in sh.splitlines() if line.startswith("want ")]
    assert all(line.startswith("want " + p.split()[1] + " ") for line, p in
               zip([li for li in sh.splitlines() if li.startswith("want ")], parts))  # each part behind its own name
    # the WRN step (seconds) before the protocol (minutes): window h200-2026-11-26-b's protocol ate the window;
    # the studies and the highway shard take what is left
    assert [p.split()[1] for p in parts] == ["device", "wrn", "profile", "conv", "protocol", "highway", "summary"]
    assert "part studies" in sh and sh.index("part studies") > sh.index("part protocol")
    assert "timeout --kill-after" in sh and "gpu-tests" in sh and "-m gpu" in sh
    assert "--budget-s \"$HIGHWAY_S\"" in sh


# --------------------------------------------------------------------------------------------
# The docs' rendering of the windows (tools/readme/sections/device.py)

def test_the_highway_table_renders_finished_runs_with_n_and_marks_the_rest(tmp_path):
    from tools.readme.sections.device import _highway_conv_table

    folder = tmp_path / "highway-conv-table1"
    for seed, error in ((0, 0.6), (1, 0.7)):
        _finished(folder / f"w16-s{seed}")
        data = json.loads((folder / f"w16-s{seed}" / "results.json").read_text())
        data["final"]["test_error_pct"] = error
        (folder / f"w16-s{seed}" / "results.json").write_text(json.dumps(data))
    _stopped(folder / "w16-s2", 40)
    stopped = json.loads((folder / "w16-s2" / "results.json").read_text())
    stopped["history"] = [{"test_error_pct": 1.0}] * 40
    (folder / "w16-s2" / "results.json").write_text(json.dumps(stopped))
    rows = {line.split("|")[1].strip(): line for line in _highway_conv_table(tmp_path).splitlines()[2:]}
    assert "| 2 of 5 | 0.65 ± 0.07 (n=2) |" in rows["16"] and "1 resumable at epoch 40 of 300" in rows["16"]
    assert "2 pending" in rows["16"] and "0.57 / 0.60 ± 0.03" in rows["16"]
    assert "| 0 of 5 | — |" in rows["32"] and "5 pending" in rows["32"]


def test_a_window_stopped_in_its_protocol_renders_the_depths_its_log_kept(tmp_path):
    from tools.readme.sections.device import _gpu_protocol, _gpu_windows

    window = tmp_path / "device-check" / "h200-x"
    window.mkdir(parents=True)
    (window / "device.json").write_text(json.dumps({"gpu": "NVIDIA H200", "torch": "2.11.0+cu130"}))
    (window / "device_check.log").write_text(
        "== gpu-tests: limit 110 s\n1 passed, 14 deselected, 4 warnings in 73.48s\n"
        "torch/_inductor/compile_fx.py:322: UserWarning: TensorFloat32\n"
        "protocol d = 2: 15 models, first epoch 58.67 s, epoch 0.117 s, evaluation 0.018 s (60000 / 10000 images)\n"
        "protocol d = 10: 15 models, first epoch 17.27 s, epoch 0.244 s, evaluation 0.023 s (60000 / 10000 images)\n")
    (window / "highway_shard.json").write_text(json.dumps({"shard": [], "before": {}, "outcome": "skipped: no MNIST"}))
    windows = _gpu_windows(tmp_path)
    assert "1 passed, 14 deselected" in windows and "not run (no time left)" in windows
    assert "stopped at its limit after d = 2, d = 10 (compiled): no projection" in windows and "skipped: no MNIST" in windows
    protocol = _gpu_protocol(tmp_path)
    assert "| 10 | 0.244 / 17.3 |" in protocol and "(compiled, stopped)" in protocol


# -- where the outputs go, and what ran ----------------------------------------------------------------

def _script(cwd: Path, out: str, *args: str) -> subprocess.CompletedProcess:
    """device_check.sh with every part a no-op (PYTHON=true): where it writes, what it refuses, in milliseconds."""
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], cwd=cwd, capture_output=True, text=True,
                          env={"OUT": out, "PYTHON": "true", "PATH": "/usr/bin:/bin"}, timeout=60)


def test_a_relative_out_is_the_callers_and_a_used_out_is_refused(tmp_path):
    _script(tmp_path, "window")  # (exit 1: the no-op parts wrote no summary.md to print)
    log = tmp_path / "window" / "device_check.log"
    assert "== done after" in log.read_text() and not (REPOSITORY / "window").exists()  # not in the checkout
    (tmp_path / "window" / "summary.md").write_text("window a\n")
    before = {p.name: p.read_bytes() for p in (tmp_path / "window").iterdir()}
    again = _script(tmp_path, str(tmp_path / "window"))
    assert again.returncode == 2 and "already holds device_check.log" in again.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "window").iterdir()} == before  # the first window kept


def test_the_shell_script_refuses_every_output_file_device_check_writes():
    line = next(li for li in SCRIPT.read_text().splitlines() if li.startswith("OUTPUT_FILES="))
    assert line.split("=", 1)[1].strip('"').split() == list(dc.OUTPUT_FILES)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_device_json_records_the_commit_that_ran_and_whether_the_tree_was_dirty(tmp_path):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    first = _git(repo, "rev-parse", "HEAD")
    record = dc.source_record(repo)
    assert record["git_revision"] == first and record["git_dirty"] is False
    assert dc.commits_of(record["sources_sha256"], repo) == [first]
    # The files of a later commit in a checkout whose HEAD says the first (a stale .git, as in window
    # h200-2026-11-26-b): dirty, and the digest names the later commit.
    (repo / "src" / "a.py").write_text("x = 2\n")
    (repo / "src" / "new.py").write_text("y = 1\n")  # untracked, not ignored: it ran too
    stale = dc.source_record(repo)
    assert stale["git_revision"] == first and stale["git_dirty"] is True
    assert dc.commits_of(stale["sources_sha256"], repo) == []  # not committed yet
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "second")
    assert dc.commits_of(stale["sources_sha256"], repo) == [_git(repo, "rev-parse", "HEAD")]
    text = dc._revision_text({**stale})
    assert f"git HEAD {first}, but the sources differed from it (dirty" in text and stale["sources_sha256"] in text
    assert dc._revision_text({"git_revision": first, "git_dirty": False}) == f"git {first} (clean)"


# --------------------------------------------------------------------------------------------
# The second round's parts: profile, conv, studies


def test_kernels_are_sorted_into_kinds_by_name():
    assert dc.kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "matmul"
    assert dc.kernel_kind("void at::native::(anonymous namespace)::multi_tensor_apply_kernel") == "optimizer (foreach)"
    assert dc.kernel_kind("void at::native::reduce_kernel<512, 1>") == "reduction"
    assert dc.kernel_kind("void at::native::vectorized_elementwise_kernel<4>") == "elementwise"
    assert dc.kernel_kind("Memcpy DtoD (Device -> Device)") == "memory"
    assert dc.kernel_kind("something new") == "other"


def test_busy_time_is_the_union_of_kernel_intervals():
    # overlapping kernels count once, a gap not at all (microseconds in, seconds out)
    assert dc.busy_seconds([(0, 10), (5, 20), (30, 40)]) == pytest.approx(30e-6)
    assert dc.busy_seconds([(30, 40), (0, 10), (2, 3)]) == pytest.approx(20e-6)
    assert dc.busy_seconds([]) == 0.0


def test_the_profile_and_conv_dry_runs_write_their_files_and_the_summary_reads_them(tmp_path):
    assert dc.main(["profile", "--out", str(tmp_path), "--dry-run"]) == 0
    assert dc.main(["conv", "--out", str(tmp_path), "--dry-run"]) == 0
    prof = json.loads((tmp_path / "profile.json").read_text())
    assert set(prof["depths"]) == {"2", "4"}
    for m in prof["depths"].values():
        assert m["kernels"] > 0 and 0 < m["busy_share"] and m["kernels_per_step"] == m["kernels"] / prof["steps"]
        assert sum(k["count"] for k in m["by_kind"].values()) == m["kernels"]
    conv = json.loads((tmp_path / "conv.json").read_text())
    rows = conv["widths"]["4"]
    assert rows["fp32 (as the table runs)"]["speedup"] == 1.0 and "channels_last" in rows
    assert rows["captured step"]["runs"] == 1 and rows["2 runs at once, captured, one stream each"]["runs"] == 2
    assert rows["2 runs at once, captured, one stream each"]["images_per_s"] > 0
    text = dc.summary(tmp_path, ["profile", "conv"])
    assert "kernels a step" in text and "w = 4" in text and "protocol.json missing" not in text


def _stand_in_study(tmp_path: Path, seconds: float) -> str:
    """A stand-in for `throughway reproduce`: finishes one run at once, then trains another for `seconds`,
    leaving a checkpoint; resumed, it says so."""
    script = tmp_path / "stand_in.py"
    script.write_text(
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "out = Path(sys.argv[sys.argv.index('--out') + 1])\n"
        "if '--resume' in sys.argv: print('resumed', sorted(p.name for p in (out / 'runs').iterdir()))\n"
        "for name in ('a', 'b'): (out / 'runs' / name).mkdir(parents=True, exist_ok=True)\n"
        "(out / 'runs' / 'a' / 'results.json').write_text(json.dumps({'final': {'x': 1}}))\n"
        "(out / 'runs' / 'b' / 'checkpoint.json').write_text('{}')\n"
        "(out / 'runs' / 'b' / '.lock').write_text('')\n"
        f"time.sleep({seconds})\n"
        "(out / 'runs' / 'b' / 'results.json').write_text(json.dumps({'final': {'x': 2}}))\n")
    return str(script)


def test_the_studies_part_interrupts_at_its_budget_keeps_finished_runs_and_resumes(tmp_path, monkeypatch):
    script = _stand_in_study(tmp_path, seconds=60)
    monkeypatch.setattr(dc, "study_command", lambda name, out, args, resume:
                        [sys.executable, script, "--out", str(out)] + (["--resume"] if resume else []))
    out = tmp_path / "out"
    args = dc.parser().parse_args(["studies", "--out", str(out), "--budget-s", "4", "--margin-s", "2",
                                   "--studies", "layer-drop"])
    out.mkdir()
    args.jobs = {"layer-drop": 1}
    report = dc.studies(args)
    state = report["studies"]["layer-drop"]
    assert state["exit_code"] != 0 and state["after"] == {"runs": 2, "finished": 1, "summary": False}
    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "studies.tar.gz") as archive:
        names = archive.getnames()
        archive.extractall(unpacked, filter="data")
    assert "studies.json" in names and "layer-drop/runs/b/checkpoint.json" in names
    assert not any(n.endswith(".lock") for n in names)  # a lock is never carried into the next window
    script = _stand_in_study(tmp_path, seconds=0)
    out2 = tmp_path / "out2"
    out2.mkdir()
    args = dc.parser().parse_args(["studies", "--out", str(out2), "--budget-s", "30", "--margin-s", "6", "--studies", "layer-drop",
                                   "--resume-from", str(unpacked)])
    args.jobs = {"layer-drop": 1}
    report = dc.studies(args)
    state = report["studies"]["layer-drop"]
    assert state["resumed"] and state["before"]["finished"] == 1
    assert state["exit_code"] == 0 and state["after"]["finished"] == 2


def test_the_studies_archive_fits_a_window_weights_last_and_only_an_unfinished_runs_newest(tmp_path):
    work = tmp_path / "work"
    done, going, other = work / "s" / "runs" / "done", work / "s" / "runs" / "going", work / "s" / "runs" / "other"
    for run in (done, going, other):
        run.mkdir(parents=True)
    (done / "results.json").write_text(json.dumps({"final": {"x": 1}}))
    (done / "model.safetensors").write_bytes(b"0" * 4000)  # a finished run's weights stay on the device
    for run, size in ((going, 1000), (other, 3000)):
        (run / "results.json").write_text(json.dumps({"final": None}))
        (run / "checkpoint-e0001.safetensors").write_bytes(b"1" * size)
        (run / "checkpoint-e0002.safetensors").write_bytes(b"2" * size)
        (run / ".lock").write_text("")
    archive = tmp_path / "studies.tar.gz"
    summary = dc.archive_studies(work, archive, {"studies": {}}, limit=4000)
    with tarfile.open(archive) as packed:
        names = set(packed.getnames())
    assert "s/runs/going/checkpoint-e0002.safetensors" in names  # the newest of the run that fits
    assert "s/runs/going/checkpoint-e0001.safetensors" not in names and "s/runs/done/model.safetensors" not in names
    assert summary["weights_left_out"] == ["s/runs/other/checkpoint-e0002.safetensors"]
    assert "studies.json" in names and not any(n.endswith(".lock") for n in names)
    assert {"s/runs/done/results.json", "s/runs/other/results.json"} <= names


def test_the_baby_gpt_options_are_the_studys_own_and_go_to_a_folder_of_their_own(tmp_path):
    from throughway.cli.parser import build_parser
    from throughway.experiments import layer_drop
    from throughway.study import config_from_args
    args = dc.parser().parse_args(["studies", "--out", str(tmp_path), "--budget-s", "10", "--study-options", "baby-gpt"])
    args.jobs = {"layer-drop": 1, "transformer-gates": 1}
    command = dc.study_command("layer-drop", tmp_path / "layer-drop-baby-gpt", args, resume=False)
    argv = command[command.index("reproduce"):]
    config = config_from_args(layer_drop.Config, build_parser().parse_args(argv))
    assert (config.layers, config.width, config.heads, config.context, config.batch_size) == (6, 384, 6, 256, 64)
    assert config.steps % config.eval_every == 0
    # the other study keeps its defaults
    assert dc.study_command("transformer-gates", tmp_path, args, False)[-1] == "--quiet"
