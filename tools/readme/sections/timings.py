"""Renderers of measured costs: the README's opening lines (job and test-suite times) and docs/benchmarks.md
(scripts/measure_timings.sh) and the Benchmarks section's table (benchmarks/*.py outputs)."""

from __future__ import annotations

import re
from pathlib import Path

from throughway.report.tables import table_header

from .common import _match, _text


def _fields(root: Path, relative: str) -> dict[str, str]:
    """The `key: value` lines of a timings file."""
    out = {}
    for line in _text(root, relative).splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _caches(f: dict[str, str]) -> tuple[bool, bool]:
    """(cold, data_kept) of a timings file's `caches` line: whether the build caches were new and empty
    (scripts/measure_timings.sh writes "caches: cold ..."), and whether the machine's data cache was
    kept, so that MNIST was already downloaded (files measured before the script emptied it too)."""
    caches = f.get("caches", "")
    return caches.startswith("cold"), "data cache" in caches.partition("kept: ")[2]


def _main_job_time(root: Path) -> str:
    """"N.N minutes on a fresh clone on C cores, set-up ..." from timings/main-job.txt, saying exactly which
    caches the measurement started with: a newcomer's first run also downloads MNIST, so a time measured
    with the machine's data cache kept says so."""
    f = _fields(root, "timings/main-job.txt")
    cores = _match(r"(\d+) cores", f["machine"], "timings/main-job.txt").group(1)
    cold, data_kept = _caches(f)
    minutes = f"{float(f['wall_s']) / 60:.1f} minutes on a fresh clone on {cores} cores"
    if not cold:
        return f"{minutes}, set-up included"
    if data_kept:
        return (f"{minutes}, set-up included, with every cache cold but pip's downloads and the data cache: MNIST "
                f"was already downloaded, which a first run also does")
    return f"{minutes}, set-up and MNIST's download included, with every cache cold but pip's downloads"


def _test_suite_time(root: Path) -> str:
    """"N tests, M.M minutes on C cores once set up" from timings/test-suite.txt."""
    f = _fields(root, "timings/test-suite.txt")
    counts = [int(n) for n in re.findall(r"(\d+) (?:passed|failed|skipped|errors?)", f["summary"])]
    cores = _match(r"(\d+) cores", f["machine"], "timings/test-suite.txt").group(1)
    # measured on a fresh clone with empty torch-compile and matplotlib caches (scripts/measure_timings.sh
    # writes "caches: cold ..."), or, in files measured before, in a set-up checkout whose caches were warm
    cold, data_kept = _caches(f)
    where = "" if not cold else " on a fresh clone with cold caches" + (" but the MNIST data cache" if data_kept else "")
    return f"{sum(counts)} tests, {float(f['wall_s']) / 60:.1f} minutes{where} on {cores} cores once set up"


def _benchmarks(root: Path) -> str:
    batched = _text(root, "batched/benchmark_batched_throughput.txt")
    eager = _match(r"RATIO N=32 eager: ([\d.]+)x", batched, "batched").group(1)
    compiled = _match(r"RATIO N=32 compiled: ([\d.]+)x", batched, "batched").group(1)
    hessian = _text(root, "hessian/benchmark_hessian_speed.txt")
    total = _match(r"= ([\d.]+) s total .*?peak memory ([\d.]+) GiB", hessian, "hessian speed")
    plain = _match(r"RATIO plain / toolkit time at depth \d+ = ([\d.]+)x", hessian, "hessian speed").group(1)
    lanczos = _match(r"RATIO full spectrum / Lanczos top eigenvalue = ([\d.]+)x", hessian, "hessian speed").group(1)
    params = _match(r"toolkit, depth \d+ \((\d+) parameters\)", hessian, "hessian speed").group(1)
    prune = _text(root, "gates-stem-dense/benchmark_prune_speed.txt")
    ratios = _match(r"time ratio pruned/full: ([\d.]+)\s+parameter ratio pruned/full: ([\d.]+)", prune, "prune speed")
    wrn = _match(r"ratio toolkit / plain: ([\d.]+)", _text(root, "conv/benchmark_wrn_step_throughput.txt"), "wrn").group(1)
    return "\n".join([
        *table_header(["benchmark", "what", "measured"]),
        f"| `benchmarks/batched_throughput.py` | 32 batched depth-20 gated MLPs vs 32 trained one after another by "
        f"`fit` | {float(eager):.2f}× eager, {float(compiled):.1f}× compiled |",
        f"| `benchmarks/hessian_speed.py` | exact Hessian + spectrum of a {int(params):,}-parameter net vs plain "
        f"torch.func; Lanczos vs full spectrum | {total.group(1)} s, {total.group(2)} GiB; {plain}×; {lanczos}× |",
        f"| `benchmarks/prune_speed.py` | inference time of a half-pruned d = 100 gated net vs the full one | "
        f"{ratios.group(1)} (parameters {ratios.group(2)}) |",
        f"| `benchmarks/wrn_step_throughput.py` | WRN-16-4 step, toolkit loop vs DataLoader loop | {wrn} |",
    ])
