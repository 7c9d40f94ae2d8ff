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

Adding a block (e.g. the MNIST depth study's Table 1): write one function

    def _mnist_depth_table(root: Path) -> str:
        return mnist_depth.table_markdown(_json(root, "mnist-depth/results.json"))

that reads committed files under `root` only (`_json`, `_text`) and returns markdown, reusing the
experiment's own `table_markdown` where the README quotes it whole; add one entry
`"mnist-depth-table": _mnist_depth_table` to `RENDERERS`; put the two markers in the README and
run `throughway report --readme README.md`. This module lives in `experiments` (not `report`)
because it reuses the experiments' table functions, and imports flow downwards only.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable

__all__ = ["RENDERERS", "BLOCK", "block_names", "render_text", "differing_blocks", "update_readme",
           "figures56_contrary_pairs"]

# <!-- generated:NAME -->BODY<!-- /generated:NAME -->, NAME of letters, digits, '.', '_', '-'.
BLOCK = re.compile(r"<!-- generated:(?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /generated:(?P=name) -->", re.DOTALL)


def _json(root: Path, relative: str) -> Any:
    """The parsed JSON file root/relative; FileNotFoundError naming it when it is missing."""
    path = Path(root) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path}: results file not found (a README block reads it)")
    return json.loads(path.read_text())


def _text(root: Path, relative: str) -> str:
    """The text of root/relative; FileNotFoundError naming it when it is missing."""
    path = Path(root) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path}: results file not found (a README block reads it)")
    return path.read_text()


def _match(pattern: str, text: str, source: str) -> re.Match[str]:
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(f"{source}: no line matches {pattern!r}")
    return found


# ---------------------------------------------------------------------------------------------
# The README's first lines: what the two commands cost (scripts/measure_timings.sh)

def _fields(root: Path, relative: str) -> dict[str, str]:
    """The `key: value` lines of a timings file."""
    out = {}
    for line in _text(root, relative).splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _main_job_time(root: Path) -> str:
    """"N.N minutes on a fresh clone on C cores, set-up included" from timings/main-job.txt."""
    f = _fields(root, "timings/main-job.txt")
    cores = _match(r"(\d+) cores", f["machine"], "timings/main-job.txt").group(1)
    return f"{float(f['wall_s']) / 60:.1f} minutes on a fresh clone on {cores} cores, set-up included"


def _test_suite_time(root: Path) -> str:
    """"N tests, M.M minutes on C cores once set up" from timings/test-suite.txt."""
    f = _fields(root, "timings/test-suite.txt")
    counts = [int(n) for n in re.findall(r"(\d+) (?:passed|failed|skipped|errors?)", f["summary"])]
    cores = _match(r"(\d+) cores", f["machine"], "timings/test-suite.txt").group(1)
    return f"{sum(counts)} tests, {float(f['wall_s']) / 60:.1f} minutes on {cores} cores once set up"


# ---------------------------------------------------------------------------------------------
# Section 1: the MNIST depth study

def _mnist_depth_stem_dense_table(root: Path) -> str:
    """The one-seed study with the Dot-BN-ReLU first layer (the stem ablation), as its table.md."""
    from .experiments import mnist_depth

    return mnist_depth.table_markdown(_json(root, "mnist-depth-stem-dense/results.json"))


def _mnist_depth_table(root: Path) -> str:
    """The 5-seed study with the paper's first layer, as its table.md (finished or not)."""
    from .experiments import mnist_depth

    return mnist_depth.table_markdown(_json(root, "mnist-depth/results.json"))


def _mnist_depth_findings(root: Path) -> str:
    """The 5-seed study's findings against the paper (`mnist_depth.findings_markdown`)."""
    from .experiments import mnist_depth

    return mnist_depth.findings_markdown(_json(root, "mnist-depth/results.json"))


def _mnist_depth_stem_ablation(root: Path) -> str:
    """The 5-seed study (linear first layer) beside the one-seed Dot-BN-ReLU study."""
    from .experiments import mnist_depth

    return mnist_depth.stem_ablation_markdown(_json(root, "mnist-depth/results.json"),
                                              _json(root, "mnist-depth-stem-dense/results.json"))


def _mnist_depth_stem_dense_k_ratio(root: Path) -> str:
    """The range over depths of paper's mean k / our mean k in the stem ablation, e.g. "3.0–6.7"."""
    summary = _json(root, "mnist-depth-stem-dense/results.json")
    ratios = [c["paper_k_mean"] / c["k_mean"]["mean"] for c in summary["cells"]
              if c["arch"] == "gated" and c["paper_k_mean"] and c["k_mean"]["mean"]]
    return f"{min(ratios):.1f}–{max(ratios):.1f}"


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


# ---------------------------------------------------------------------------------------------
# Section 3: distance to identity

def _sdi_table(root: Path) -> str:
    from .experiments.sdi_table import _form

    summary = _json(root, "sdi/results.json")
    rows, eqs = summary["table1"], {e["layer"]: e for e in summary["equations"]}

    def joined(key: str) -> str:
        return " / ".join(_form(r[key]) for r in rows)

    def eq(layer: str) -> str:
        e = eqs[layer]
        return (f"{_form(e['tsdi_paper'])} | {_form(e['tsdi_ours_paper_convention'])} | "
                f"{_form(e['tsdi_ours_stated_convention'])} | {_form(e['tsdi_ours_toolkit'])}")

    gate = summary["config"]["gate_bias"]
    cs = " / ".join(format(r["c"], "g") for r in rows)
    g_paper = " / ".join(format(r["g_paper"], "g") for r in rows)
    g_ours = " / ".join(format(r["g_ours"], ".4f") for r in rows)
    return "\n".join([
        "| | paper | ours, paper's convention (σ_b² = 2/n) | ours, the convention the text states (σ_b² = 0) | "
        f"ours, toolkit init (Glorot, b_t = {gate:g}) |".replace("-", "−"),
        "|---|---|---|---|---|",
        f"| Table 1, c = {cs}: g(·) | {g_paper} | {g_ours} | | |".replace("-", "−"),
        f"| Table 1: highway TSDI | {joined('tsdi_paper')} | {joined('tsdi_ours_paper_convention')} | "
        f"{joined('tsdi_ours_stated_convention')} | {joined('tsdi_ours_toolkit')} |",
        f"| eq 6, classical | {eq('classical')} |",
        f"| eq 14, residual | {eq('residual')} |",
        f"| gated (section 3), k = 1 | {eq('gated')} |",
    ])


def _sdi_monte_carlo(root: Path) -> str:
    from .experiments.sdi_table import _max_z

    summary = _json(root, "sdi/results.json")
    return (f"Monte Carlo ({summary['config']['mc_samples']} draws of the real initialisers) agrees with the analytic "
            f"values within {_max_z(summary):.2f} standard errors everywhere (tested).")


def _identity_distance(root: Path) -> str:
    summary = _json(root, "sdi/identity-distance/results.json")
    config = summary["config"]
    rel = {r["arch"]: r["relation"] for r in summary["runs"]}
    travelled = [r["travelled_sq_at_end"] for r in rel.values()]
    change = {a: r["identity_sq_at_end"] - r["identity_sq_at_init"] for a, r in rel.items()}
    residual = rel["residual"]
    initial = ", ".join(format(r["identity_sq_at_init"], ".0f") for r in rel.values())
    return (
        f"Beyond the paper, `throughway reproduce identity-distance` logs during MNIST training the distance "
        f"travelled from initialisation, the path length, and the distance to the nearest identity configuration "
        f"(`results/sdi/identity-distance`, d = {summary['runs'][0]['depth']}, {config['epochs']} epochs). SDI does "
        f"not predict the optimiser's path. The squared distance travelled is {min(travelled):.0f}–{max(travelled):.0f} "
        f"for plain, residual and gated nets alike, while their SDI at initialisation differs "
        f"{max(r['identity_sq_at_init'] for r in rel.values()) / min(r['identity_sq_at_init'] for r in rel.values()):.0f}"
        f"-fold ({initial}); plain and residual "
        f"blocks move *away* from the paper's identity configuration during training ({change['plain']:+.0f} and "
        f"{change['residual']:+.0f}), the gated blocks barely towards theirs ({change['gated']:+.1f}); the distance "
        f"to the *nearest* identity configuration of a residual block (silencing its last layer unit by unit: "
        f"{residual['nearest_identity_sq_at_init']:.0f}) is "
        f"{residual['nearest_identity_sq_at_init'] / residual['identity_sq_at_init']:.2f} of the paper's "
        f"({residual['identity_sq_at_init']:.0f})."
    ).replace("+-", "−").replace("(-", "(−")


# ---------------------------------------------------------------------------------------------
# Section 4: the Hessian (Demystifying ResNet)

def _hessian_theorem2(root: Path) -> str:
    summary = _json(root, "hessian/figure4/results.json")
    rows = summary["theorem2"]
    zero = [r for r in rows if r["shortcut_depth"] == 3]
    two = [r for r in rows if r["shortcut_depth"] == 2]
    one = [r for r in rows if r["shortcut_depth"] == 1]

    def depths(group: list[dict[str, Any]]) -> str:
        return ", ".join(str(r["depth"]) for r in group)

    exact_zero = all(r["gradient_norm"] == 0 and r["hessian_max_abs_entry"] == 0 for r in zero)
    conditions = sorted({f"{r['spectrum_condition']:.3f}" for r in two})
    unit_diff = max(r["unit_blocks_max_difference"] for r in two)
    eig_diff = max(r["eigenvalues_vs_pm_singular_values_max_difference"] for r in two)
    return "\n".join([
        "| Theorem 2 | measured (width 10, whitened MNIST) |",
        "|---|---|",
        f"| n ≥ 3: zero gradient and zero Hessian | ‖∇ℓ‖ = 0 and H = 0 {'exactly' if exact_zero else 'NOT exactly'} "
        f"at depths {depths(zero)} (n = 3; n = 4 and tanh in the tests) |",
        "| n = 2: block diagonal, eigenvalues ± the singular values of one block, once per unit, depth-invariant | "
        f"condition number {' / '.join(conditions)} at depths {depths(two)}; "
        + ("unit blocks identical" if unit_diff == 0 else f"unit blocks equal to {unit_diff:.1e}")
        + f"; eigenvalues = ±σ(A) to {eig_diff:.1e} |",
        "| n = 1: condition number grows with depth | "
        + ", ".join(f"{r['spectrum_condition']:.1f}" for r in one) + f" at depths {depths(one)} |",
    ])


def _fmt_condition(point: dict[str, Any]) -> str:
    stat = point["condition"]
    undefined = point.get("undefined_condition", 0)
    if undefined:
        return f"undefined in {undefined} of {point['runs']} runs (singular to tolerance)"
    mean, std = stat["mean"], stat["std"]
    if std is not None and std < 1e-6 * abs(mean):
        text = f"{mean:.4g}"
    elif abs(mean) >= 1e4:
        text = f"{mean:.1e} ± {std:.1e}"
    else:
        text = f"{mean:.3g} ± {std:.1g}" if std < 1 else f"{mean:.3g} ± {std:.2g}"
    if point.get("singular"):
        text += " (singular to tolerance; P10 resolved)"
    return text


def _hessian_figure4(root: Path) -> str:
    summary = _json(root, "hessian/figure4/results.json")
    networks = summary["config"]["networks"]
    labels = {"xavier": "Xavier", "orthogonal": "orthogonal", "shortcut2-zero": "2-shortcut, zero init",
              "shortcut1-zero": "1-shortcut, zero init"}
    by = {(p["network"], p["depth"]): p for p in summary["points"]}
    lines = ["| depth | " + " | ".join(labels.get(n, n) for n in networks) + " |",
             "|---|" + "---|" * len(networks)]
    for depth in summary["config"]["depths"]:
        lines.append(f"| {depth} | " + " | ".join(_fmt_condition(by[(n, depth)]) for n in networks) + " |")
    return "\n".join(lines)


def figures56_contrary_pairs(summary: dict[str, Any], loss_window: float = 0.05) -> dict[str, Any]:
    """Figure 5's claim, "the 2-shortcut network's condition number is smaller at every loss", pair by pair.

    A pair is a 2-shortcut point and a point of another network (any seeds) whose loss differs
    from the 2-shortcut point's by at most `loss_window` (5%) of it (the figure compares the
    networks at equal loss); it is contrary when the 2-shortcut condition number is not the
    smaller. Points with an undefined condition number are left out.
    Returns {"pairs", "contrary", "by_network": {name: (pairs, contrary)}}.
    """
    traces = summary["traces"]
    shortcut = [t for t in traces if t["network"] == "shortcut2-zero"]
    others = [t for t in traces if t["network"] != "shortcut2-zero"]
    by_network: dict[str, list[int]] = {}
    for s in shortcut:
        for o in others:
            counts = by_network.setdefault(o["network"], [0, 0])
            for p in s["hessian"]:
                for q in o["hessian"]:
                    if p["condition"] is None or q["condition"] is None:
                        continue
                    if abs(q["loss"] - p["loss"]) <= loss_window * p["loss"]:
                        counts[0] += 1
                        counts[1] += p["condition"] >= q["condition"]
    return {"pairs": sum(c[0] for c in by_network.values()), "contrary": sum(c[1] for c in by_network.values()),
            "by_network": {k: tuple(v) for k, v in by_network.items()}}


def _hessian_figures56(root: Path) -> str:
    summary = _json(root, "hessian/figures5-6/results.json")
    config = summary["config"]
    pairs = figures56_contrary_pairs(summary)
    by = pairs["by_network"]
    finals: dict[str, list[float]] = {}
    for t in summary["traces"]:
        finals.setdefault(t["network"], []).append(t["hessian"][-1]["loss"])
    orth, short = finals.get("orthogonal", []), finals.get("shortcut2-zero", [])
    starts = sorted({round(t["hessian"][0]["index"], 3) for t in summary["traces"] if t["network"] == "shortcut2-zero"})
    ends = [t["hessian"][-1]["index"] for t in summary["traces"] if t["network"] == "shortcut2-zero"]
    singular = sum(1 for t in summary["traces"] for p in t["hessian"] if p.get("singular"))
    singular_networks = sorted({t["network"] for t in summary["traces"] if any(p.get("singular") for p in t["hessian"])})
    points = sum(len(t["hessian"]) for t in summary["traces"])
    share = 100.0 * pairs["contrary"] / pairs["pairs"] if pairs["pairs"] else math.nan
    return (
        f"Along full-batch gradient descent (depth {config['depth']}, lr {config['lr']:g}, {config['epochs']:,} "
        f"epochs, {len(config['seeds'])} seeds; figures 5 and 6, `results/hessian/figures5-6`) the 2-shortcut "
        f"network mostly keeps the smaller condition number at equal loss, not at every loss: of {pairs['pairs']} "
        f"pairs of a 2-shortcut point and another network's point whose loss is within 5% of it, {pairs['contrary']} "
        f"({share:.0f}%) have the 2-shortcut condition number the larger ("
        + ", ".join(f"against {n}: {c} of {p}" for n, (p, c) in by.items()) + "). "
        f"Its index starts at {' / '.join(f'{s:.2f}' for s in starts)} and drops to "
        f"{min(ends):.3f}–{max(ends):.3f}; at the end orthogonal and 2-shortcut reach similar losses "
        f"({min(orth + short):.2f}–{max(orth + short):.2f} against the least squares optimum "
        f"{summary['optimal_linear_loss']:.3f}). {singular} of the {points} Hessians are singular to tolerance"
        + (f" (all {', '.join(singular_networks)})" if singular_networks else "")
        + "; their index is undefined and left out of figure 6."
    )


def _lr_point(summary: dict[str, Any], network: str, depth: int) -> dict[str, Any]:
    """The learning-rate study's point of `network` at `depth`; ValueError naming both when absent."""
    for p in summary["points"]:
        if p["network"] == network and p["depth"] == depth:
            return dict(p)
    raise ValueError(f"results have no point for network {network!r} at depth {depth}")


def _hessian_figure7(root: Path) -> str:
    summary = _json(root, "hessian/figure7-linear/results.json")
    config = summary["config"]
    optimum = summary["optimal_linear_loss"]
    depths = config["depths"]
    gaps = {d: _lr_point(summary, "shortcut2-zero", d)["best_loss"] - optimum for d in depths}
    worst = max(gaps, key=lambda d: gaps[d])
    rates = sorted({_lr_point(summary, "shortcut2-zero", d)["best_lr"] for d in depths if d >= 8})
    xavier = _lr_point(summary, "xavier", depths[-1])["best_loss"]
    lrs = [10 ** e for e in config["lr_exponents"]]
    close: dict[str, float] = {}
    for network in ("orthogonal", "shortcut1-zero"):
        allowed = []
        for d in depths:
            p = _lr_point(summary, network, d)
            if p is None:
                continue
            allowed += [lr for lr, loss in zip(lrs, p["final_loss_by_lr"]) if loss is not None and loss - optimum <= 0.005]
        close[network] = max(allowed) if allowed else math.nan
    return (
        f"Figure 7 (linear, {config['epochs']:,} epochs of full-batch gradient descent, {len(lrs)} learning rates from "
        f"{lrs[0]:g} to {lrs[-1]:g}, depths {depths[0]}–{depths[-1]}): the 2-shortcut network's best final loss stays "
        f"within {max(gaps.values()):.1g} of the least-squares optimum ({optimum:.4f}) at every depth (largest gap at "
        f"depth {worst}; " + ", ".join(f"{gaps[d]:.0e}" for d in depths) + f" at depths {', '.join(map(str, depths))}), "
        f"with best learning rates of {' to '.join(f'{r:.3g}' for r in (rates[0], rates[-1]))} from depth 8 on, while "
        f"Xavier's rises to {xavier:.3f} at depth {depths[-1]}; orthogonal and 1-shortcut nets come within 0.005 of the "
        f"optimum only with rates ≤ {max(close.values()):.3g}."
    )


def _hessian_figure8(root: Path) -> str:
    summary = _json(root, "hessian/figure8-relu/results.json")
    config = summary["config"]
    depths = config["depths"]

    def best(network: str, selected: list[int]) -> list[float]:
        return [_lr_point(summary, network, d)["best_loss"] for d in selected]

    deep = [d for d in depths if d >= 8]
    late = [d for d in depths if d >= 16]
    s, x, o = best("shortcut2-zero", deep), best("xavier", late), best("orthogonal", late)
    s_late = best("shortcut2-zero", late)
    s2 = _lr_point(summary, "shortcut2-zero", depths[0])
    holds = max(s_late) < min(x + o)
    early = [d for d in depths if d < late[0]
             and min(best("xavier", [d]) + best("orthogonal", [d])) <= best("shortcut2-zero", [d])[0]]
    return (
        f"Figure 8 (mid ReLUs, the first {config['subset']:,} images, {config['epochs']} epochs, depths "
        f"{depths[0]}–{depths[-1]} to fit this machine; the paper's statement is about depth 64): the 2-shortcut net "
        f"reaches {min(s):.2f}–{max(s):.2f} from depth 8 on; at depths {late[0]}–{late[-1]} Xavier reaches "
        f"{min(x):.2f}–{max(x):.2f} and orthogonal {min(o):.2f}–{max(o):.2f}, so the paper's statement "
        f"{'holds there' if holds else 'does not hold there'}"
        + (f", and only there: at depths {', '.join(map(str, early))} a plain net reaches a loss as low as or lower "
           f"than the 2-shortcut net's" if early else "") + ". With one unit of 10 mid ReLUs a 2-shortcut net cannot "
        f"cancel its identity path: its depth-{depths[0]} loss stays at {s2['best_loss']:.2f} after "
        f"{config['epochs']} epochs."
    )


def _hessian_figure3(root: Path) -> str:
    summary = _json(root, "hessian/figure3-weight-norms/results.json")
    curves = sorted((c for c in summary["curves"].values() if c["activation"] == "linear"), key=lambda c: c["depth"])
    if not curves:
        raise ValueError("hessian/figure3-weight-norms/results.json: no linear curves")
    first, last = curves[0], curves[-1]
    return (f"linear: {first['avg_frobenius'][-1]:.2f} at L = {first['depth']} to "
            f"{last['avg_frobenius'][-1]:.2f} at L = {last['depth']}")


# ---------------------------------------------------------------------------------------------
# Section 5: batched training and the highway search

def _highway_depth_table(root: Path) -> str:
    from .experiments import highway_depth

    # The title, the loss table and the verdict table; the settings notes under them stay in table.md.
    return "\n\n".join(highway_depth.table_markdown(_json(root, "highway-depth/results.json")).split("\n\n")[:3])


def _highway_depth_text(root: Path) -> str:
    import statistics

    from .experiments import highway_depth

    summary = _json(root, "highway-depth/results.json")
    config = summary["config"]
    by = {(c["arch"], c["layers"]): c for c in summary["cells"]}
    layers = config["layers"]

    def best(arch: str, n: int) -> float:
        return by[(arch, n)]["best"]["final_train_loss"]

    plain = [best("plain", n) for n in layers]
    high = [best("highway", n) for n in layers]
    ratio = best("plain", layers[-1]) / best("highway", layers[-1])
    falling = all(c["best"]["train_loss"][-1] < c["best"]["train_loss"][-2] for c in summary["cells"])
    diverged = [x for x in summary["trials"] if x.get("diverged_at") is not None]
    finished = [x for x in summary["trials"] if x.get("diverged_at") is None and x.get("state") == "finished"]
    activations = sorted({x["activation"] for x in diverged})
    counts = [c["diverged"] for c in summary["cells"]]
    verdict = highway_depth.observations(summary)[0][2]
    shallow = [n for n in layers if n in (10, 20)]
    shallow_best = [best("plain", n) for n in shallow]
    return "\n".join([
        "What it shows, against the paper:",
        f"- **Reproduced.** Plain nets get harder to optimise as depth grows. Their best final training loss is "
        f"{', '.join(f'{v:.1e}' for v in plain[:-1])} and {plain[-1]:.1e} at {', '.join(map(str, layers[:-1]))} and "
        f"{layers[-1]} layers. Highway nets hardly notice depth: {', '.join(f'{v:.1e}' for v in high[:-1])} and "
        f"{high[-1]:.1e}. At {layers[-1]} layers the best highway net's loss is {ratio:.0f} times lower than the best "
        f"plain net's; the paper says \"more than 2 orders of magnitude\".",
        f"- **Inconclusive.** The paper's {'- and '.join(map(str, shallow))}-layer plain nets reach a loss below 1e-4; "
        f"our best are {' and '.join(f'{v:.1e}' for v in shallow_best)}. The verdict is "
        f"\"{verdict.split(':')[0]}\": our search is smaller than the paper's ({config['trials']} trials, not "
        f"{highway_depth.PAPER_SEARCH_TRIALS}), and its runs are short ({config['epochs']} epochs on "
        f"{config['limit']:,} images, chosen to fit this 2-core machine). "
        + ("Every best curve is still falling at its last epoch, so the gap is what a shorter search would give, "
           "not evidence against the paper." if falling else "Not every best curve is still falling at its last epoch."),
        f"- Diverged trials rank last. Each cell lost {min(counts)}–{max(counts)} of its {config['trials']} trials to "
        f"divergence (the table's second count). All {len(diverged)} diverged trials are {' or '.join(a.replace('relu', 'ReLU') for a in activations)} "
        f"nets, most with large learning rates: their median learning rate is "
        f"{statistics.median(x['lr'] for x in diverged):.2g}, against "
        f"{statistics.median(x['lr'] for x in finished):.2g} for the trials that finished. The learning-rate range "
        f"is ours.",
    ])


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
        f"| 32 depth-20 gated residual MLPs (width 50, NAdam, batch 128) | samples/s, summed over models | ratio | "
        f"share of the fp32 matmul ceiling ({float(ceiling):.0f}–{float(ceiling_end):.0f} GFLOP/s) |",
        "|---|---|---|---|",
        f"| one after another, the ordinary `fit` loop | {count(seq)} | 1 | |",
        f"| batched, eager | {count(eager.group(1))} | **{float(eager_ratio):.2f}×** (target ≥ 10×) | {eager.group(2)}% |",
        f"| batched, `torch.compile` ({compile_s} s compilation, paid first) | {count(comp.group(1))} | "
        f"**{float(comp_ratio):.1f}×** | {comp.group(2)}% |",
        f"| N = 8, batched, eager | {count(e8.group(1))} | {float(r8):.2f}× | {e8.group(2)}% |",
    ])


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
        "| benchmark | what | measured |",
        "|---|---|---|",
        f"| `benchmarks/batched_throughput.py` | 32 batched depth-20 gated MLPs vs 32 trained one after another by "
        f"`fit` | {float(eager):.2f}× eager, {float(compiled):.1f}× compiled |",
        f"| `benchmarks/hessian_speed.py` | exact Hessian + spectrum of a {int(params):,}-parameter net vs plain "
        f"torch.func; Lanczos vs full spectrum | {total.group(1)} s, {total.group(2)} GiB; {plain}×; {lanczos}× |",
        f"| `benchmarks/prune_speed.py` | inference time of a half-pruned d = 100 gated net vs the full one | "
        f"{ratios.group(1)} (parameters {ratios.group(2)}) |",
        f"| `benchmarks/wrn_step_throughput.py` | WRN-16-4 step, toolkit loop vs DataLoader loop | {wrn} |",
    ])


# ---------------------------------------------------------------------------------------------
# Section 6: convolutional networks

def _conv_table(root: Path) -> str:
    def final(run: str) -> dict[str, Any]:
        return _json(root, f"conv/{run}/results.json")["final"]

    long, short = final("highway-conv-mnist-w16-e20"), final("highway-conv-mnist-w16")
    plain, gated = final("preact14-w8-gated-false"), final("preact14-w8-gated-true")
    return "\n".join([
        "| run | epochs | test error (%) | paper |",
        "|---|---|---|---|",
        f"| 10-layer conv highway net, width 16, MNIST (`mnist-10-ours`, `highway-conv-mnist-ours`: our layout and "
        f"schedule; the recipe was called `highway-conv-mnist` then) | "
        f"{long['epochs_completed']} | {long['test_error_pct']:.2f} | 0.57 (best of 5 runs; 0.60 ± 0.03 mean) |",
        f"| the same, a separate {short['epochs_completed']}-epoch run (the schedule follows the epoch count) | "
        f"{short['epochs_completed']} | {short['test_error_pct']:.2f} | |",
        f"| pre-activation ResNet-14 (width 8), Fashion-MNIST, ungated (`preact-cifar`) | {plain['epochs_completed']} | "
        f"{plain['test_error_pct']:.2f} | — (not in the papers) |",
        f"| the same, gated | {gated['epochs_completed']} | {gated['test_error_pct']:.2f} (mean k "
        f"{gated['k_mean']:.2f}) | — |",
    ])


def _hessian_speed(root: Path) -> str:
    source = "hessian/benchmark_hessian_speed.txt"
    text = _text(root, source)
    own = _match(r"toolkit, depth (\d+) \((\d+) parameters\): exact Hessian ([\d.]+) s .*?\+ eigvalsh ([\d.]+) s = "
                 r"([\d.]+) s total .*?peak memory ([\d.]+) GiB", text, source)
    lanczos = _match(r"Lanczos top eigenvalue: [\d.]+ in ([\d.]+) s .*?relative difference ([\d.e+-]+)", text, source)
    ratio = _match(r"RATIO full spectrum / Lanczos top eigenvalue = ([\d.]+)x", text, source).group(1)
    plain = _match(r"plain torch\.func\.hessian \+ eigvalsh, depth \d+: ([\d.]+) s .*?peak memory ([\d.]+) GiB", text, source)
    ratios = _match(r"RATIO plain / toolkit time at depth \d+ = ([\d.]+)x; Hessian formation only ([\d.]+)x", text, source)
    depth, params, formed, eig, total, memory = own.groups()
    return (
        f"Speed (`benchmarks/hessian_speed.py`, depth {depth}, width 10, {int(params):,} parameters, 2 cores, measured "
        f"in one run): exact Hessian {formed} s + full spectrum (`eigvalsh`) {eig} s = **{total} s, peak {memory} GiB** "
        f"(targets ≤ 60 s, ≤ 4 GiB); plain `torch.func.hessian` + `eigvalsh` {plain.group(1)} s and {plain.group(2)} GiB "
        f"(**{ratios.group(1)}×** slower in all, **{ratios.group(2)}×** for forming the Hessian); the top eigenvalue by "
        f"Lanczos in {lanczos.group(1)} s, **{ratio}×** faster than the full spectrum (target ≥ 20×), agreeing with it "
        f"to {lanczos.group(2)}. The exact Hessian is built from vmapped forward-over-reverse products, one leaf tensor "
        f"per parameter, the lower block triangle only; `eigvalsh` (LAPACK syevd) is now "
        f"{100 * float(eig) / float(total):.0f}% of the time."
    )


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
