"""The README's generated result blocks: every quoted table and number, rendered from results/.

The README marks what it quotes from the committed results files:

    <!-- generated:NAME -->
    ...markdown...
    <!-- /generated:NAME -->

(a block: the opening marker ends its line) or, inside a sentence, an inline span
`<!-- generated:NAME -->1.467<!-- /generated:NAME -->`. `render_text` rewrites the inside of
every marker pair from `RENDERERS[NAME](root)`, where `root` is the results folder;
`throughway report --readme README.md` writes the result, `--check` only lists the blocks whose
text differs (exit 1), and `tests/test_readme.py` runs that check on the repository's README, so
a table or number that the results files do not give fails CI.

The renderers live in `throughway.readme_sections`, one module per README section (timings,
depth_study, identity, hessian, batched, conv); section 2's gate renderers stay here. Adding a
block (e.g. the MNIST depth study's Table 1): write one function in its section's module

    def _mnist_depth_table(root: Path) -> str:
        return mnist_depth.table_markdown(_json(root, "mnist-depth/results.json"))

that reads committed files under `root` only (`_json`, `_text` of `readme_sections.common`) and
returns markdown, reusing the experiment's own `table_markdown` where the README quotes it whole;
add one entry `"mnist-depth-table": _mnist_depth_table` to `RENDERERS`; put the two markers in the
README and run `throughway report --readme README.md`. These modules sit beside `experiments` (not
in `report`) because they reuse the experiments' table functions, and imports flow downwards only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from .readme_sections.batched import _batched_benchmark, _batched_step, _highway_depth_table, _highway_depth_text
from .readme_sections.common import _json, _match, _text
from .readme_sections.conv import _conv_table
from .readme_sections.depth_study import (_mnist_depth_findings, _mnist_depth_stem_ablation,
                                          _mnist_depth_stem_dense_k_ratio, _mnist_depth_stem_dense_table,
                                          _mnist_depth_table)
from .readme_sections.hessian import (_hessian_figure3, _hessian_figure4, _hessian_figure7, _hessian_figure8,
                                      _hessian_figures56, _hessian_speed, _hessian_theorem2, figures56_contrary_pairs)
from .readme_sections.identity import _identity_distance, _sdi_monte_carlo, _sdi_table
from .readme_sections.timings import _benchmarks, _main_job_time, _test_suite_time

__all__ = ["RENDERERS", "BLOCK", "block_names", "render_text", "differing_blocks", "update_readme",
           "figures56_contrary_pairs"]

# <!-- generated:NAME -->BODY<!-- /generated:NAME -->, NAME of letters, digits, '.', '_', '-'.
BLOCK = re.compile(r"<!-- generated:(?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /generated:(?P=name) -->", re.DOTALL)


# ---------------------------------------------------------------------------------------------
# Section 2: what the gates learned


def _ranges(blocks: list[int]) -> str:
    """1-based block numbers as ranges: [21, 22, 23, 25, 26] -> "21–23, 25–26"."""
    spans: list[list[int]] = []
    for b in sorted(blocks):
        if spans and b == spans[-1][1] + 1:
            spans[-1][1] = b
        else:
            spans.append([b, b])
    return ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in spans)


def _gates_table(root: Path) -> str:
    gates = _json(root, "gates-stem-dense/gated-d100-s0/gates.json")
    gated = _json(root, "gates-stem-dense/gated-d100-s0/prune.json")["summary"]
    residual = _json(root, "gates-stem-dense/residual-d100-s0/prune.json")["summary"]
    prune = _text(root, "gates-stem-dense/benchmark_prune_speed.txt")
    ratios = _match(r"time ratio pruned/full: ([\d.]+)\s+parameter ratio pruned/full: ([\d.]+)", prune, "prune speed")
    difference = float(_match(r"max \|pruned − full\| over the batch's logits: ([\d.e+-]+)", prune, "prune speed").group(1))
    outputs = "outputs identical" if difference == 0 else f"outputs differ by up to {difference:.1e}"
    dead = [b + 1 for b in gates["dead_blocks"]]

    def half(summary: dict[str, Any]) -> str:
        r = summary["random_half_removed_ratio"]
        return f"{100 * r['mean']:.1f}% ± {100 * r['std']:.1f}% of its full accuracy"

    drops = residual["random_drop_after_few_removals_pct_points"]
    layers = sorted(int(k) for k in drops)
    return "\n".join([
        "| | ours | paper |",
        "|---|---|---|",
        f"| mean k of the gated net (Table 2) | {gates['k_mean']:.3f} | 0.67 |",
        f"| dead gates (k ≤ 0, a ReLU gate that can never reopen) | {gates['num_dead']} of {gates['num_blocks']}, "
        f"blocks {_ranges(dead)} | — (figure 5 left: smallest k near the middle) |",
        f"| gated net, half of its layers removed at random (10 orders) | {half(gated)} | \"over 90%\" |",
        f"| residual net, half of its layers removed at random (10 orders) | {half(residual)} | \"decrease after just a "
        f"few layers\" |",
        f"| residual net, accuracy lost after {' / '.join(str(2 * n) for n in layers)} removed layers | "
        f"{' / '.join(f'{drops[str(n)]:.2f}' for n in layers)} points | (a decrease) |",
        f"| greedy removal (smallest k first) minus random, gated net | "
        f"{gated['greedy_minus_random_first_half_pct_points']:+.2f} points over the first half, "
        f"{gated['greedy_minus_random_mean_pct_points']:+.2f} over all | \"slightly better\" |",
        f"| inference time of the half-pruned gated net / full (batch 1000, 1 thread) | {ratios.group(1)} (parameters "
        f"{ratios.group(2)}); {outputs} | — |",
    ])


def _gates_text(root: Path) -> str:
    gates = _json(root, "gates-stem-dense/gated-d100-s0/gates.json")
    gated = _json(root, "gates-stem-dense/gated-d100-s0/prune.json")["summary"]
    residual = _json(root, "gates-stem-dense/residual-d100-s0/prune.json")["summary"]
    history = _json(root, "mnist-depth-stem-dense/runs/gated-d100-s0/results.json")["history"]
    dead = [b + 1 for b in gates["dead_blocks"]]
    drops = residual["random_drop_after_few_removals_pct_points"]
    most = max(int(k) for k in drops)
    closing = [(h["epoch"], sum(k <= 0 for k in h["k"])) for h in history]
    first = next(e for e, n in closing if n > 0)
    marks = [e for e in (40, 50) if e < closing[-1][0]] + [closing[-1][0]]
    by_epoch = dict(closing)
    errors = {h["epoch"]: h["train_error_pct"] for h in history}
    late = sum(1 for b in dead if b > gates["num_blocks"] - 30)
    return (
        f"Our gated net agrees with the paper on robustness: it keeps "
        f"{100 * gated['random_half_removed_ratio']['mean']:.1f}% of its accuracy with half of its layers gone, and "
        f"since {gates['num_dead']} of its gates closed for good, greedy removal of those {2 * gates['num_dead']} layers "
        f"leaves the output bit-identical. Two things differ. Its k are far smaller than the paper's (mean "
        f"{gates['k_mean']:.3f} against 0.67) and the closed gates are {late} of the last 30 blocks (blocks "
        f"{_ranges(dead)}), not the middle ones; and our *ungated* ResNet is almost as robust to random removal as the "
        f"gated one ({drops[str(most)]:.1f} points lost after {2 * most} layers), where the paper reports a quick "
        f"decrease. What we measured: the gates close from epoch {first} on ("
        + ", ".join(f"{by_epoch[e]} dead at epoch {e}" for e in marks)
        + f") while the training error (training mode) falls from {errors[first]:.2f}% to "
        f"{errors[closing[-1][0]]:.2f}%."
    )


def _highway_analysis_table(root: Path) -> str:
    data = {ds: (_json(root, f"highway-analysis/{ds}/highway.json")["summary"],
                 _json(root, f"highway-analysis/{ds}/lesion.json")) for ds in ("mnist", "fashion-mnist")}
    (m, ml), (f, fl) = data["mnist"], data["fashion-mnist"]
    m_mid, f_mid = ml["summary"]["network_layers_15_to_45"], fl["summary"]["network_layers_15_to_45"]
    inc = ml["increase_pct_points"]
    return "\n".join([
        "| highway paper section 4 | MNIST (ours) | Fashion-MNIST (ours) |",
        "|---|---|---|",
        f"| most transform-gate biases decreased during training | {100 * m['bias_fraction_below_init']:.1f}% below "
        f"their initial −2 | {100 * f['bias_fraction_below_init']:.1f}% |",
        f"| one sample's gate activity is very sparse | {100 * m['sample_gate_fraction_above_half']:.1f}% of its gates "
        f"above 0.5 | {100 * f['sample_gate_fraction_above_half']:.1f}% |",
        f"| most of the change happens in the first ~15 layers | {100 * m['change_share_first_15_layers']:.1f}% of "
        f"Σ\\|y − x\\| in the first 15 (an even spread: {100 * m['even_share_first_15_layers']:.1f}%) | "
        f"{100 * f['change_share_first_15_layers']:.1f}% |",
        "| figure 4: lesioning early layers hurts, layers 15–45 barely matter | layers 1–5: "
        + ", ".join(f"{v:+.2f}" for v in inc[:5])
        + f" points; layers 15–45: at most {m_mid['max_increase_pct_points']:+.2f} ({m_mid['num_barely_matter']} of "
        f"{m_mid['num_layers']}) | first layer {fl['increase_pct_points'][0]:+.2f}, last layer "
        f"{fl['increase_pct_points'][-1]:+.2f}; layers 15–45: at most {f_mid['max_increase_pct_points']:+.2f} |",
    ])


RENDERERS: dict[str, Callable[[Path], str]] = {
    "main-job-time": _main_job_time,
    "test-suite-time": _test_suite_time,
    "mnist-depth-table": _mnist_depth_table,
    "mnist-depth-findings": _mnist_depth_findings,
    "mnist-depth-stem-ablation": _mnist_depth_stem_ablation,
    "mnist-depth-stem-dense-table": _mnist_depth_stem_dense_table,
    "mnist-depth-stem-dense-k-ratio": _mnist_depth_stem_dense_k_ratio,
    "gates-table": _gates_table,
    "gates-text": _gates_text,
    "highway-analysis-table": _highway_analysis_table,
    "sdi-table": _sdi_table,
    "sdi-monte-carlo": _sdi_monte_carlo,
    "identity-distance": _identity_distance,
    "hessian-theorem2": _hessian_theorem2,
    "hessian-figure4": _hessian_figure4,
    "hessian-figures5-6": _hessian_figures56,
    "hessian-figure7": _hessian_figure7,
    "hessian-figure8": _hessian_figure8,
    "hessian-figure3": _hessian_figure3,
    "highway-depth-table": _highway_depth_table,
    "highway-depth-text": _highway_depth_text,
    "hessian-speed": _hessian_speed,
    "batched-benchmark": _batched_benchmark,
    "batched-step": _batched_step,
    "conv-table": _conv_table,
    "benchmarks": _benchmarks,
}


# ---------------------------------------------------------------------------------------------

def block_names(text: str) -> list[str]:
    """The names of the generated blocks and spans in `text`, in order."""
    return [m.group("name") for m in BLOCK.finditer(text)]


def _render_body(name: str, body: str, root: Path) -> str:
    if name not in RENDERERS:
        raise KeyError(f"README block {name!r} is not known; known blocks: {sorted(RENDERERS)}")
    rendered = RENDERERS[name](Path(root)).strip("\n")
    return f"\n{rendered}\n" if body.startswith("\n") else rendered.strip()


def render_text(text: str, root: str | Path) -> str:
    """`text` with the inside of every generated block and span rewritten from the files under `root`.

    A block (its opening marker ends a line) keeps its markers on their own lines; a span stays
    inline. Raises KeyError naming an unknown block and FileNotFoundError naming a missing file.
    """
    return BLOCK.sub(lambda m: (f"<!-- generated:{m.group('name')} -->"
                                f"{_render_body(m.group('name'), m.group('body'), Path(root))}"
                                f"<!-- /generated:{m.group('name')} -->"), text)


def differing_blocks(text: str, root: str | Path) -> list[str]:
    """Names of the blocks of `text` whose inside differs from what the results under `root` give."""
    return [m.group("name") for m in BLOCK.finditer(text)
            if m.group("body") != _render_body(m.group("name"), m.group("body"), Path(root))]


def update_readme(readme: str | Path, root: str | Path | None = None, *, check: bool = False) -> list[str]:
    """Rewrite `readme`'s generated blocks from `root` (default: the results/ folder beside it).

    Returns the names of the blocks that differed before; with `check` the file is left alone.
    """
    readme = Path(readme)
    root = Path(root) if root is not None else readme.resolve().parent / "results"
    text = readme.read_text()
    names = differing_blocks(text, root)
    if names and not check:
        readme.write_text(render_text(text, root))
    return names
