"""Renderers of docs/reproductions/batched.md: batched training (the throughput benchmark and where a step's time
goes) and the highway paper's random search (results/batched/, results/highway-depth/)."""

from __future__ import annotations

import re
from pathlib import Path

from throughway.report.tables import table_header

from .common import _json, _match, _report_file, _text


def _batched_benchmark(root: Path) -> str:
    source = "batched/benchmark_batched_throughput.txt"
    text = _text(root, source)
    ceiling = _match(r"fp32 matmul ceiling \(2048² mm\): ([\d.]+) GFLOP/s", text, source).group(1)
    ceiling_end = _match(r"fp32 matmul ceiling again at the end: ([\d.]+) GFLOP/s", text, source).group(1)
    compile_s = _match(r"first epoch incl\. compilation (\d+) s", text, source).group(1)
    n32 = text[text.index("N=32, depth-20"):text.index("N=8, depth-20")]
    n8 = text[text.index("N=8, depth-20"):]
    seq = _match(r"sequential.*?, (\d+) samples/s", n32, source).group(1)
    eager = _match(r"batched: .*?, (\d+) samples/s.*?= ([\d.]+)% of the ceiling", n32, source)
    eager_ratio = _match(r"RATIO N=32 eager: ([\d.]+)x", n32, source).group(1)
    comp = _match(r"batched \+ torch\.compile: .*?, (\d+) samples/s.*?= ([\d.]+)% of the ceiling", n32, source)
    comp_ratio = _match(r"RATIO N=32 compiled: ([\d.]+)x", n32, source).group(1)
    e8 = _match(r"batched: .*?, (\d+) samples/s.*?= ([\d.]+)% of the ceiling", n8, source)
    r8 = _match(r"RATIO N=8 eager: ([\d.]+)x", n8, source).group(1)

    def count(v: str) -> str:
        return f"{int(v):,}"

    return "\n".join([
        *table_header(["32 depth-20 gated residual MLPs (width 50, NAdam, batch 128)", "samples/s, summed over models",
                       "ratio", f"share of the fp32 matmul ceiling ({float(ceiling):.0f}–{float(ceiling_end):.0f} GFLOP/s)"]),
        f"| one after another, the ordinary `fit` loop | {count(seq)} | 1 | |",
        f"| batched, eager | {count(eager.group(1))} | **{float(eager_ratio):.2f}×** (target ≥ 10×) | {eager.group(2)}% |",
        f"| batched, `torch.compile` ({compile_s} s compilation, paid first) | {count(comp.group(1))} | "
        f"**{float(comp_ratio):.1f}×** | {comp.group(2)}% |",
        f"| N = 8, batched, eager | {count(e8.group(1))} | {float(r8):.2f}× | {e8.group(2)}% |",
    ])


def _batched_step(root: Path) -> str:
    source = "batched/benchmark_batched_throughput.txt"
    text = _text(root, source)
    step = _match(r"gather [\d.]+ ms \((\d+)%\), forward \+ loss [\d.]+ ms \((\d+)%\), backward [\d.]+ ms \((\d+)%\), "
                  r"optimiser [\d.]+ ms \((\d+)%\)", text, source)
    bmm = sum(float(m.group(1)) for m in re.finditer(r"aten::(?:bmm|baddbmm)\s+[\d.]+\s+([\d.]+)%", text))
    vmap = _match(r"vmap\(functional_call\).*?\(([\d.]+)x\)", text, source).group(1)
    foreach = _match(r"foreach over the models' tensors.*?\(([\d.]+)x\)", text, source).group(1)
    gather, forward, backward, optimiser = step.groups()
    return (
        f"Where one eager N = 32 step goes: forward and loss {forward}%, backward {backward}%, optimiser {optimiser}%, "
        f"data gather {gather}%; batched matrix products are about {bmm:.0f}% of the time, the rest is elementwise "
        f"work and BatchNorm that only compilation fuses. Stacked batched products beat `torch.func.vmap` over "
        f"`functional_call` by {vmap}× (forward + backward), and the flat batched NAdam step beats torch's foreach "
        f"NAdam over the 32 models' tensors by {float(foreach):.1f}×."
    )


def _highway_depth_table(root: Path) -> str:
    from throughway.experiments import highway_depth

    # The title, the loss table and the verdict table; the settings notes under them stay in table.md.
    return "\n\n".join(highway_depth.table_markdown(_json(root, "highway-depth/results.json")).split("\n\n")[:3])


def _highway_depth_text(root: Path) -> str:
    """The search's findings.md (`highway_depth_report.findings_markdown`), placed as the study wrote it."""
    from throughway.experiments import highway_depth_report

    return _report_file(root, "highway-depth", "findings.md", highway_depth_report.findings_markdown)


def _paper_scale_estimate(root: Path) -> str:
    """Highway figure 1 at the paper's scale, never run here: the projection of `--estimate` measured under
    load (estimate.md) beside the one measured on a quiet machine (estimate-quiet.md), both eager."""
    rows = []
    for name, what in (("estimate.md", "measured while the cores were shared"),
                       ("estimate-quiet.md", "measured on a quiet machine")):
        relative = f"highway-depth-paper-scale/{name}"
        text = _text(root, relative)
        load = float(_match(r"measured with load average ([0-9.]+)", text, relative).group(1))
        total = _match(r"serial sum ([0-9.]+) h; projected wall time with (\d+) worker\(s\): ([0-9.]+) h", text, relative)
        rows.append((what, load, float(total.group(1)), int(total.group(2)), float(total.group(3)), relative))
    (_, load_busy, _, _, busy, _), (_, load_quiet, serial, workers, quiet, _) = rows
    return (f"`--estimate` projects {quiet:.0f} hours on this machine's {workers} cores ({serial:.0f} hours serial), "
            f"measured on a quiet machine (load average {load_quiet:.2f}; `results/highway-depth-paper-scale/"
            f"estimate-quiet.md`). The same projection measured while the cores were shared (load average "
            f"{load_busy:.1f}) came to {busy:.0f} hours, {busy / quiet:.1f}× more: wall-clock step times under "
            f"contention say little about a quiet machine, and neither figure is a bound (diverged trials leave "
            f"their batch and shorten it). Both time eager steps; the full run would compile its steps (the "
            f"default for batches of at least 10,000 steps), which was not timed here.")
