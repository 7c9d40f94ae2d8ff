"""Renderers of the GPU windows (scripts/device_check.sh, results/device-check/<window>/) and of the conv
highway table the windows train (results/highway-conv-table1/): docs/benchmarks.md, "On a GPU"."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from throughway.report.stats import format_mean_std, mean_std
from throughway.report.tables import table_header

from .common import _json, _text

# The highway paper's Table 1 (Srivastava et al. 2015), conv highway nets on MNIST: best and mean ± std of
# the test error (%) over its runs, per width.
HIGHWAY_PAPER = {16: ("0.57", "0.60 ± 0.03"), 32: ("0.45", "0.46 ± 0.02")}
HIGHWAY_RUNS, HIGHWAY_EPOCHS = 5, 300
# A line the protocol part prints per depth (what a window stopped at the part's limit still has).
_PROTOCOL_LINE = re.compile(r"protocol d = (\d+): (\d+) models, first epoch ([\d.]+) s, epoch ([\d.]+) s, "
                            r"evaluation ([\d.]+) s \((\d+) / (\d+) images\)")


# protocol.json's "compile": how the protocol's step ran (False in windows before "whole" and "blocks" existed).
_HOW = {None: "eager kernels", False: "eager kernels", True: "compiled", "whole": "compiled",
        "blocks": "compiled per block"}


def _windows(root: Path) -> list[Path]:
    return sorted(p for p in (root / "device-check").iterdir() if p.is_dir())


def _tests_line(log: str) -> str:
    """The GPU tests' outcome: pytest's summary line in the window's log."""
    found = re.findall(r"^=*\s*((?:\d+ (?:passed|failed|deselected|skipped|errors?),? ?)+)", log, re.M)
    return found[0].strip().rstrip(",") if found else "not run"


def _protocol(window: Path, log: str) -> tuple[str, dict[int, tuple[float, float]], dict[str, Any] | None] | None:
    """A window's protocol: how its step ran, {d: (first epoch s, epoch s)} at the protocol's sizes, and
    its projection (None when stopped at its limit); from protocol.json, else from the lines its log
    kept. None when the part did not run."""
    if (window / "protocol.json").is_file():
        p = json.loads((window / "protocol.json").read_text())
        return (_HOW[p.get("compile")], {int(d): (m["first_epoch_s"], m["epoch_s"]) for d, m in p["at_protocol_size"].items()},
                p.get("projection") and {**p["projection"], "goal_min": p["goal_min"]})
    lines = _PROTOCOL_LINE.findall(log)
    if not lines:
        return None
    if any(int(m[5]) != 60_000 for m in lines):  # the log's lines are at the protocol's sizes only then
        raise ValueError(f"device-check/{window.name}: the protocol timed fewer than 60,000 images")
    how = "compiled" if "torch/_inductor" in log else "eager kernels"  # inductor warns only when it compiles
    return how, {int(m[0]): (float(m[2]), float(m[3])) for m in lines}, None


def _protocol_cell(window: Path, log: str) -> str:
    protocol = _protocol(window, log)
    if protocol is None:
        return "not run"
    how, per_depth, projection = protocol
    if projection:
        return f"**{projection['total_min']:.1f} min** projected ({how}; goal {projection['goal_min']:g})"
    return f"stopped at its limit after {', '.join(f'd = {d}' for d in per_depth)} ({how}): no projection"


def _wrn_cell(window: Path) -> str:
    if not (window / "wrn.json").is_file():
        return "not run (no time left)"
    w = json.loads((window / "wrn.json").read_text())
    share = "" if w.get("toolkit_share_of_peak") is None else (
        f"; {100 * w['toolkit_share_of_peak']:.0f}% / {100 * w['hand_loop_share_of_peak']:.0f}% of the bf16 peak")
    return (f"**{w['ratio']:.2f}×** ({w['toolkit_images_per_s']:.0f} / {w['hand_loop_images_per_s']:.0f} images/s"
            f"{share})")


def _gpu_windows(root: Path) -> str:
    """One row per GPU window: device, the GPU tests, the WRN step ratio, the protocol, the highway shard."""
    rows = table_header(["window", "device", "GPU tests", "WRN-28-10 step, toolkit / hand loop (goal ≥ 1.0)",
                         "Table 1 protocol, 75 models × 100 epochs", "conv highway shard"])
    for window in _windows(root):
        device = _json(root, f"device-check/{window.name}/device.json")
        log = _text(root, f"device-check/{window.name}/device_check.log")
        shard = (_json(root, f"device-check/{window.name}/highway_shard.json")
                 if (window / "highway_shard.json").is_file() else {"outcome": "not run"})
        epochs = sorted({a["epoch"] for a in shard.get("after", {}).values()})
        before = sorted({shard["before"][name]["epoch"] for name in shard.get("shard", [])})
        span = f"epoch {epochs[-1]}" if epochs and before[0] + 1 == epochs[-1] else \
            f"epochs {before[0] + 1}–{epochs[-1]}" if epochs else ""
        runs = f"{len(shard.get('shard', []))} runs, {span}" if epochs else shard["outcome"]
        rows.append(f"| `{window.name}` | {device.get('gpu', 'no GPU')}, torch {device['torch']} | {_tests_line(log)} | "
                    f"{_wrn_cell(window)} | {_protocol_cell(window, log)} | {runs} |")
    return "\n".join(rows)


def _gpu_protocol(root: Path) -> str:
    """Per depth, each window's epoch and first epoch (capture, and compilation where compiled) at the
    protocol's sizes: protocol.json where the part finished, else the lines its log kept."""
    columns: dict[str, dict[int, tuple[float, float]]] = {}
    for window in _windows(root):
        protocol = _protocol(window, _text(root, f"device-check/{window.name}/device_check.log"))
        if protocol is not None:
            how, per_depth, projection = protocol
            columns[f"`{window.name}` ({how}{'' if projection else ', stopped'})"] = per_depth
    depths = sorted({d for c in columns.values() for d in c})
    rows = table_header(["d", *(f"{label}: epoch / first epoch (s)" for label in columns)])
    for d in depths:
        cells = [f"{c[d][1]:.3f} / {c[d][0]:.1f}" if d in c else "—" for c in columns.values()]
        rows.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _highway_conv_table(root: Path) -> str:
    """The conv highway table (paper Table 1, MNIST): per width, the finished runs' final test error with
    n, and where the others stand; the paper's best and mean beside."""
    folder = root / "highway-conv-table1"
    rows = table_header(["width", "finished runs", "test error % (ours, mean ± std)", "paper best / mean ± std",
                         "unfinished runs"])
    for width, (best, mean) in HIGHWAY_PAPER.items():
        finished, stopped = [], []
        for seed in range(HIGHWAY_RUNS):
            run = folder / f"w{width}-s{seed}"
            if not (run / "results.json").is_file():
                continue
            data = json.loads((run / "results.json").read_text())
            if data.get("final") is not None:
                finished.append(data["final"].get("test_error_pct"))
            else:
                stopped.append((len(data["history"]), data["history"][-1].get("test_error_pct")))
        pending = HIGHWAY_RUNS - len(finished) - len(stopped)
        parts = []
        if stopped:
            at = sorted({e for e, _ in stopped})
            errors = format_mean_std(mean_std([err for _, err in stopped]))
            parts.append(f"{len(stopped)} resumable at epoch {'/'.join(map(str, at))} of {HIGHWAY_EPOCHS} "
                         f"(test error there {errors} %)")
        if pending:
            parts.append(f"{pending} pending")
        rows.append(f"| {width} | {len(finished)} of {HIGHWAY_RUNS} | "
                    f"{format_mean_std(mean_std(finished), count=True) if finished else '—'} | {best} / {mean} | "
                    f"{'; '.join(parts) or '—'} |")
    return "\n".join(rows)


def _compile_blocks(root: Path) -> str:
    """benchmarks/compile_blocks.py's output (results/protocol): per depth, the first epoch (compilation
    included) and a later epoch, compiled whole and per block."""
    text = _text(root, "protocol/benchmark_compile_blocks_cpu.txt")
    found = re.findall(r"d = (\d+) (whole|blocks): first epoch ([\d.]+) s \(compilation included\), epoch ([\d.]+) s", text)
    if not found:
        raise ValueError("protocol/benchmark_compile_blocks_cpu.txt: no `d = N whole|blocks: ...` line")
    by_depth: dict[int, dict[str, tuple[str, str]]] = {}
    for depth, mode, first, epoch in found:
        by_depth.setdefault(int(depth), {})[mode] = (first, epoch)
    rows = table_header(["d", "whole: first epoch (s) / epoch (s)", "per block: first epoch (s) / epoch (s)",
                         "first epoch, whole / per block"])
    for depth, modes in sorted(by_depth.items()):
        (wf, we), (bf, be) = modes["whole"], modes["blocks"]
        rows.append(f"| {depth} | {wf} / {we} | {bf} / {be} | {float(wf) / float(bf):.1f}× |")
    return "\n".join(rows)


def _gpu_profile(root: Path) -> str:
    """Each profiled window's captured protocol epoch per depth (device_check profile): kernels a step,
    their median length, the device's busy share and the kernel time by kind."""
    kinds = ["elementwise", "matmul", "reduction", "memory", "optimizer (foreach)", "other"]
    rows = table_header(["window", "d", "models", "kernels a step", "median kernel (µs)", "busy share of the epoch",
                         "epoch of 100 steps (s)", *(f"{k} (% of kernel time)" for k in kinds)])
    for window in _windows(root):
        if not (window / "profile.json").is_file():
            continue
        prof = _json(root, f"device-check/{window.name}/profile.json")
        for d, m in sorted(prof["depths"].items(), key=lambda item: int(item[0])):
            shares = [100 * m["by_kind"].get(k, {"time_s": 0.0})["time_s"] / m["kernel_time_s"] for k in kinds]
            rows.append(f"| `{window.name}` | {d} | {m['models']} | {m['kernels_per_step']:.0f} | "
                        f"{m['median_kernel_us']:.1f} | {100 * m['busy_share']:.0f}% | {m['epoch_s']:.3f} | "
                        + " | ".join(f"{x:.0f}" for x in shares) + " |")
    return "\n".join(rows)


def _gpu_conv(root: Path) -> str:
    """Each window's conv highway step (device_check conv): images per second of one run per width and
    variant, and the speed-up over the fp32 step measured in the same run."""
    rows = table_header(["window", "width", "variant", "images/s (one run)", "over fp32"])
    for window in _windows(root):
        if not (window / "conv.json").is_file():
            continue
        conv = _json(root, f"device-check/{window.name}/conv.json")
        for width, variants in conv["widths"].items():
            for name in ("fp32 (as the table runs)", "channels_last", "bf16 autocast + channels_last"):
                if name in variants:
                    row = variants[name]
                    rows.append(f"| `{window.name}` | {width} | {name} | {row['images_per_s']:.0f} | "
                                f"{row['speedup']:.2f}× |")
    return "\n".join(rows)


RENDERERS: dict[str, Any] = {"gpu-windows": _gpu_windows, "gpu-protocol": _gpu_protocol,
                             "highway-conv-table": _highway_conv_table, "compile-blocks": _compile_blocks,
                             "gpu-profile": _gpu_profile, "gpu-conv": _gpu_conv}
