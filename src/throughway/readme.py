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
from .readme_sections.depth_study import (_bn_stats, _mnist_depth_batchnorm_ablation, _mnist_depth_findings, _mnist_depth_stem_ablation,
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


# Section 2 analyses: the 5-seed study's nets with the paper's linear first layer (results/gates), and
# beside them the one-seed Dot-BN-ReLU-first-layer nets of the stem ablation (results/gates-stem-dense).
_GATES = {"linear": ("gates", "mnist-depth"), "dense": ("gates-stem-dense", "mnist-depth-stem-dense")}


def _gates_numbers(root: Path, stem: str) -> dict[str, Any]:
    folder, study = _GATES[stem]
    gates = _json(root, f"{folder}/gated-d100-s0/gates.json")
    prune = _text(root, f"{folder}/benchmark_prune_speed.txt")
    ratios = _match(r"time ratio pruned/full: ([\d.]+)\s+parameter ratio pruned/full: ([\d.]+)", prune, "prune speed")
    difference = float(_match(r"max \|pruned − full\| over the batch's logits: ([\d.e+-]+)", prune, "prune speed").group(1))
    return {"gates": gates, "gated": _json(root, f"{folder}/gated-d100-s0/prune.json")["summary"],
            "residual": _json(root, f"{folder}/residual-d100-s0/prune.json")["summary"],
            "history": _json(root, f"{study}/runs/gated-d100-s0/results.json")["history"],
            "time_ratio": ratios.group(1), "param_ratio": ratios.group(2), "difference": difference,
            "dead": [b + 1 for b in gates["dead_blocks"]]}


def _half(summary: dict[str, Any]) -> str:
    r = summary["random_half_removed_ratio"]
    return f"{100 * r['mean']:.1f}% ± {100 * r['std']:.1f}%"


def _gates_table(root: Path) -> str:
    ours = {stem: _gates_numbers(root, stem) for stem in _GATES}

    def row(label: str, cell: Callable[[dict[str, Any]], str], paper: str) -> str:
        return f"| {label} | {cell(ours['linear'])} | {cell(ours['dense'])} | {paper} |"

    def drops(n: dict[str, Any]) -> str:
        d = n["residual"]["random_drop_after_few_removals_pct_points"]
        return " / ".join(f"{d[k]:.2f}" for k in sorted(d, key=int)) + " points"

    layers = sorted(int(k) for k in ours["linear"]["residual"]["random_drop_after_few_removals_pct_points"])
    return "\n".join([
        "| | ours: linear first layer (the paper's) | ours: Dot-BN-ReLU first layer (ablation) | paper |",
        "|---|---|---|---|",
        row("mean k of the gated net (Table 2)", lambda n: f"{n['gates']['k_mean']:.3f}", "0.67"),
        row("dead gates (k ≤ 0, a ReLU gate that can never reopen)",
            lambda n: f"{n['gates']['num_dead']} of {n['gates']['num_blocks']}, blocks {_ranges(n['dead'])}",
            "— (figure 5 left: smallest k near the middle)"),
        row("gated net, half of its layers removed at random (10 orders), share of its full accuracy",
            lambda n: _half(n["gated"]), "\"over 90%\""),
        row("residual net, the same", lambda n: _half(n["residual"]), "\"decrease after just a few layers\""),
        row(f"residual net, accuracy lost after {' / '.join(str(2 * n) for n in layers)} removed layers", drops,
            "(a decrease)"),
        row("greedy removal (smallest k first) minus random, gated net, mean over the first half / over all",
            lambda n: f"{n['gated']['greedy_minus_random_first_half_pct_points']:+.2f} / "
                      f"{n['gated']['greedy_minus_random_mean_pct_points']:+.2f} points", "\"slightly better\""),
        row("inference time of the half-pruned gated net / full (batch 1000, 1 thread)",
            lambda n: f"{n['time_ratio']} (parameters {n['param_ratio']}); "
                      + ("outputs identical" if n["difference"] == 0 else f"logits differ by up to {n['difference']:.2g}"),
            "—"),
    ])


def _gates_text(root: Path) -> str:
    n, old = _gates_numbers(root, "linear"), _gates_numbers(root, "dense")
    gates, gated, residual = n["gates"], n["gated"], n["residual"]
    closing = [(h["epoch"], sum(k <= 0 for k in h["k"])) for h in n["history"]]
    first = next((e for e, c in closing if c > 0), None)
    last_third = sum(1 for b in n["dead"] if b > 2 * gates["num_blocks"] // 3)
    g, r = 100 * gated["random_half_removed_ratio"]["mean"], 100 * residual["random_half_removed_ratio"]["mean"]
    text = (
        f"With the paper's first layer the gated net behaves as the paper describes on robustness: it keeps {g:.1f}% "
        f"of its accuracy with half of its layers removed at random (the paper: over 90%), the ungated ResNet "
        f"{r:.1f}% ({g - r:+.1f} points for the gated net, one net of each over 10 orders, not a test over seeds), "
        f"and removing the blocks of smallest k first beats random removal "
        f"({gated['greedy_minus_random_first_half_pct_points']:+.2f} points over the first half). Its mean k is "
        f"{gates['k_mean']:.3f} against the paper's 0.67 ({old['gates']['k_mean']:.3f} with the Dot-BN-ReLU first "
        f"layer). Where it differs: {gates['num_dead']} of its {gates['num_blocks']} gates closed for good "
        f"({last_third} of them in the last third, blocks {_ranges(n['dead'])}), where the paper's figure 5 (left) "
        f"shows the smallest k near the middle, not zero at the end")
    if first is not None:
        text += (f"; the first gate closed in epoch {first}, and {closing[-1][1]} were closed at epoch "
                 f"{closing[-1][0]}")
    return text + (f". With the Dot-BN-ReLU first layer {old['gates']['num_dead']} gates closed and the ungated ResNet "
                   f"was nearly as robust as the gated one ({100 * old['residual']['random_half_removed_ratio']['mean']:.1f}% "
                   f"against {100 * old['gated']['random_half_removed_ratio']['mean']:.1f}%).")


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
    "bn-stats": _bn_stats,
    "mnist-depth-batchnorm-ablation": _mnist_depth_batchnorm_ablation,
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
