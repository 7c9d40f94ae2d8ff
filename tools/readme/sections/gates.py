"""Renderers of docs/reproductions/gates.md: k, dead gates, pruning (gated-residual-v2 Table 2, figure 5) and the
highway paper's section 4 analyses (gate maps, lesioning)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from throughway.report.tables import table_header

from .common import _json, _match, _text


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
        row("gated net, half of its layers removed at random, share of its full accuracy (one net: mean ± std over "
            "10 random orders, not over seeds)", lambda n: _half(n["gated"]), "\"over 90%\""),
        row("residual net, the same", lambda n: _half(n["residual"]), "\"decrease after just a few layers\""),
        row(f"residual net, accuracy lost after {' / '.join(str(2 * n) for n in layers)} removed layers", drops,
            "(a decrease)"),
        row("greedy removal (smallest k first) minus the random orders' mean, gated net, mean over the first half / "
            "over all (one net: no test)",
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
        f"and removing the blocks of smallest k first keeps "
        f"{gated['greedy_minus_random_first_half_pct_points']:+.2f} points against the random orders' mean over the "
        f"first half (one net, no test; the [gate-family study](gate-family.md) tests the orders over 5 seeds). Its "
        f"mean k is "
        f"{gates['k_mean']:.3f} against the paper's 0.67 ({old['gates']['k_mean']:.3f} with the Dot-BN-ReLU first "
        f"layer). Where it differs: {gates['num_dead']} of its {gates['num_blocks']} gates closed for good "
        f"({last_third} of them in the last third, blocks {_ranges(n['dead'])}), where the paper's figure 5 (left) "
        f"shows the smallest k near the middle, not zero at the end")
    if first is not None:
        text += (f"; the first gate closed in epoch {first}, and {closing[-1][1]} were closed at epoch "
                 f"{closing[-1][0]}")
    return text + (f". With the Dot-BN-ReLU first layer {old['gates']['num_dead']} gates closed and the ungated ResNet "
                   f"kept {100 * old['residual']['random_half_removed_ratio']['mean']:.1f}% against the gated net's "
                   f"{100 * old['gated']['random_half_removed_ratio']['mean']:.1f}% (one net each, over 10 orders).")


def _highway_analysis_table(root: Path) -> str:
    data = {ds: (_json(root, f"highway-analysis/{ds}/highway.json")["summary"],
                 _json(root, f"highway-analysis/{ds}/lesion.json")) for ds in ("mnist", "fashion-mnist")}
    (m, ml), (f, fl) = data["mnist"], data["fashion-mnist"]
    m_mid, f_mid = ml["summary"]["network_layers_15_to_45"], fl["summary"]["network_layers_15_to_45"]
    inc = ml["increase_pct_points"]
    return "\n".join([
        *table_header(["highway paper section 4", "MNIST (ours)", "Fashion-MNIST (ours)"]),
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

