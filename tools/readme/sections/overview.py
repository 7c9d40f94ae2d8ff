"""README: the one table of every reproduction (the paper's headline number, ours, the verdict, the page).

Each row reads the same committed results files as its page's blocks; a verdict is computed from the
numbers where a rule decides it (stated beside the rule), and says "pending" where nothing was run.
"""

from __future__ import annotations

from pathlib import Path

from throughway.experiments.gate_family_report import comparisons, dataset_verdicts, finished_depths, verdict_changes
from throughway.report.stats import CORRECTION, NO_DIFFERENCE, SIGNIFICANCE, format_mean_std, format_p, judge
from throughway.report.tables import table_header

from .common import _json
from .gate_family import second_dataset_summary
from .gates import _gates_numbers
from .layer_drop import layer_drop_row


def _mnist_depth_row(root: Path) -> str:
    # Table 1 is reached where some seed of ours is at or below the paper's number.
    cells = {(c["arch"], c["depth"]): c for c in _json(root, "mnist-depth/results.json")["cells"]}
    deepest = max(d for _, d in cells)
    gated, residual = cells[("gated", deepest)], cells[("residual", deepest)]
    n = gated["test_error_pct"]["n"]
    reached = [a for a, c in (("gated", gated), ("residual", residual))
               if min(c["test_error_pct"]["values"]) <= c["paper_test_error_pct"]]
    verdict = ("reached by " + " and ".join(reached)) if reached else "not reached: every seed above the paper"
    return (f"| [MNIST depth study](docs/reproductions/mnist-depth.md): gated-residual-v2 Table 1, d = {deepest}, "
            f"test error (%) | gated {gated['paper_test_error_pct']:.2f}, residual {residual['paper_test_error_pct']:.2f} "
            f"| gated {format_mean_std(gated['test_error_pct'])}, residual {format_mean_std(residual['test_error_pct'])} "
            f"({n} seeds) | {verdict} |")


def _mean_k_row(root: Path) -> str:
    cells = {(c["arch"], c["depth"]): c for c in _json(root, "mnist-depth/results.json")["cells"]}
    deepest = max(d for _, d in cells)
    gated = cells[("gated", deepest)]
    ratio = gated["k_mean"]["mean"] / gated["paper_k_mean"]
    return (f"| [MNIST depth study](docs/reproductions/mnist-depth.md): Table 2, mean k of the gated net, "
            f"d = {deepest} | {gated['paper_k_mean']:.2f} | {format_mean_std(gated['k_mean'], '.3f')} | {'lower' if ratio < 1 else 'higher'}: {ratio:.2f}× the paper's |")


def _pruning_row(root: Path) -> str:
    # The paper: "over 90%" of the accuracy kept with half of the layers removed. One net (seed 0): the
    # spread is over its random removal orders, not over seeds.
    half = _gates_numbers(root, "linear")["gated"]["random_half_removed_ratio"]
    verdict = "holds" if half["mean"] > 0.9 else "does not hold"
    return (f"| [What the gates learned](docs/reproductions/gates.md): gated-residual-v2 figure 5, accuracy kept "
            f"with half of the layers removed | over 90% | {100 * half['mean']:.1f}% (one net, d = 100, seed 0: the "
            f"mean over 10 random removal orders, std over the orders {100 * half['std']:.1f}%) | {verdict} |")


def _lesion_row(root: Path) -> str:
    # The paper: lesioning layers 15-45 of a 50-layer highway net barely changes the error.
    middle = _json(root, "highway-analysis/mnist/lesion.json")["summary"]["network_layers_15_to_45"]
    verdict = "holds" if middle["num_barely_matter"] == middle["num_layers"] else "partly"
    return (f"| [What the gates learned](docs/reproductions/gates.md): highway figure 4, lesioning layers 15–45 "
            f"(MNIST) | barely matter | error up by at most {middle['max_increase_pct_points']:+.2f} points "
            f"({middle['num_barely_matter']} of {middle['num_layers']} layers) | {verdict} |")


def _sdi_row(root: Path) -> str:
    from throughway.experiments.sdi_table import _form

    rows = _json(root, "sdi/results.json")["table1"]
    paper = " / ".join(_form(r["tsdi_paper"]) for r in rows)
    ours = " / ".join(_form(r["tsdi_ours_paper_convention"]) for r in rows)
    verdict = "reproduced" if paper == ours else "differs"
    return (f"| [Distance to identity](docs/reproductions/identity.md): gated-residual-v1 Table 1, highway TSDI "
            f"| {paper} | {ours} (the paper's bias convention) | {verdict}; the paper's conventions are inconsistent "
            f"(see the page) |")


def _hessian_row(root: Path) -> str:
    # Figure 4: the 2-shortcut network's condition number does not grow with depth.
    cells = [c for c in _json(root, "hessian/figure4/results.json")["cells"].values()
             if c["network"] == "shortcut2-zero"]
    values = [c["condition"] for c in cells]
    depths = sorted({c["depth"] for c in cells})
    verdict = "holds" if max(values) <= 1.01 * min(values) else "does not hold"
    span = f"{min(values):.3f}" if f"{min(values):.3f}" == f"{max(values):.3f}" else f"{min(values):.3f}–{max(values):.3f}"
    return (f"| [The Hessian](docs/reproductions/hessian.md): Demystifying ResNet figure 4, condition number of "
            f"the 2-shortcut net at init | constant in depth | {span} at every depth "
            f"{depths[0]}–{depths[-1]} | {verdict} |")


def _highway_depth_row(root: Path) -> str:
    from throughway.experiments import highway_depth

    summary = _json(root, "highway-depth/results.json")
    claim, ours, verdict = highway_depth.observations(summary)[-1]
    shallow = highway_depth.observations(summary)[0][2].split(":")[0]
    return (f"| [Batched training, highway search](docs/reproductions/batched.md): highway figure 1, 100 layers, "
            f"plain / highway training loss | more than 100× | {ours.split(' = ')[-1]} ({summary['config']['trials']} "
            f"trials per cell) | {verdict}; plain nets below 1e-4 at 10–20 layers: {shallow} |")


def _conv_row(root: Path) -> str:
    final = _json(root, "conv/highway-conv-mnist-w16-e20/results.json")["final"]
    verdict = "reached" if final["test_error_pct"] <= 0.57 else "not reached (one CPU run of 20 epochs, our recipe)"
    return (f"| [Convolutional networks](docs/reproductions/cifar.md): highway Table 1, 10-layer conv highway "
            f"net on MNIST, test error (%) | 0.57 (best of 5) | {final['test_error_pct']:.2f} (1 run) | {verdict} |")


def _selection_row(root: Path) -> str:
    # Which epoch Table 1 reports: even the best test epoch (optimistic) of d = 100 gated against 1.26.
    from throughway.experiments import mnist_depth_report

    summary = mnist_depth_report.epoch_selection(Path(root) / "mnist-depth")
    cell = next(c for c in summary["cells"] if c["arch"] == "gated" and c["depth"] == 100)
    best = cell["best-test"]
    verdict = ("reached on the test set" if best["best"] <= cell["paper"] else
               f"not reached even at the best test epoch of the best seed ({best['best']:.2f})")
    val = "validation-selected: pending"
    if (Path(root) / "mnist-depth-val" / "runs").is_dir():
        selection = mnist_depth_report.epoch_selection(Path(root) / "mnist-depth-val")
        honest = mnist_depth_report.selection_findings(selection, "best-val")
        depths = sorted({c["depth"] for c in selection["cells"]})
        val = f"validation-selected epoch, d = {', '.join(map(str, depths))}: " + ", ".join(
            f"{arch} {len(v['within'])} of {len(v['within']) + len(v['below']) + len(v['above'])} cells reproduced"
            for arch, v in honest.items())
        deep = next((c for c in selection["cells"] if c["arch"] == "gated" and c["depth"] == 100), None)
        if deep is not None:
            val += f"; d = 100 gated {format_mean_std(deep['best-val'])}"
    return (f"| [MNIST depth study](docs/reproductions/mnist-depth.md#which-epoch-table-1-reports): Table 1, d = 100 "
            f"gated, test error (%) at the best test epoch (optimistic) | {cell['paper']:.2f} | {format_mean_std(best)} "
            f"({best['n']} seeds; {val}) | {verdict} |")


def _versus(row: dict) -> str:
    """A judged row's verdict said with both sides: "<family> better than gated" (or the reverse) in test
    error for a gated − family row, "<family>'s gate order better than random removal" for a removal row."""
    verdict = row["verdict"]
    if "family" in row:
        return f"{row['family']}'s {verdict} than random removal"
    return f"{verdict} than {row['a'] if verdict.startswith(row['b']) else row['b']} in test error"


def gate_family_second_dataset(root: Path, mnist: dict) -> str:
    """The README's words for the gate family on Fashion-MNIST: pending until results/gate-family-fashion
    holds a depth every family finished; then, at those depths, how many of its judged tests (gated against
    each family, and the removal tests) give MNIST's verdict, the verdicts Fashion-MNIST adds (with their
    corrected p) and how many of MNIST's it does not detect (each dataset corrected over its own tests, as
    the page's table, which lists every change: `gate_family.second_dataset_summary`)."""
    second = second_dataset_summary(root)
    if second is None:
        return "Fashion-MNIST (d = 50, 100): pending"
    records = dataset_verdicts({"MNIST": mnist, "Fashion-MNIST": second})
    same, changed = verdict_changes(records, "Fashion-MNIST")
    added = [r for r in changed if r["rows"]["Fashion-MNIST"]["verdict"] != NO_DIFFERENCE]
    lost = len(changed) - len(added)
    words = [f"{_versus(r['rows']['Fashion-MNIST'])} at d = {r['depth']} ({CORRECTION} p = "
             f"{format_p(r['rows']['Fashion-MNIST']['p_corrected'])})" for r in added]
    return (f"Fashion-MNIST, d = {', '.join(map(str, second['config']['depths']))}: {same} of {same + len(changed)} "
            f"judged tests give MNIST's verdict" + (f"; there only: {', '.join(words)}" if words else "")
            + (f"; {lost} of MNIST's significant verdicts not detected there" if lost else ""))


def _gate_family_row(root: Path) -> str:
    # Beyond the papers: the gate families at initialisation (distance to identity at the deepest depth)
    # and, once results/gate-family holds trained cells, the paired tests of gated against each family
    # at the depths where every family finished all its seeds.
    summary = _json(root, "gate-family-init/results.json")
    deepest = max(summary["config"]["depths"])
    by = {p["family"]: p for p in summary["points"] if p["depth"] == deepest}
    init = (f"at init, squared distance to identity at d = {deepest}: ReZero "
            f"{by['rezero']['distance_to_identity']['mean']:.3g}, gated {by['gated']['distance_to_identity']['mean']:.3g}, "
            f"residual {by['residual']['distance_to_identity']['mean']:.3g}")
    trained, verdict = "trained: pending", "measured at init; trained study pending"
    if (Path(root) / "gate-family" / "results.json").is_file():
        study = _json(root, "gate-family/results.json")
        seeds = study["config"]["seeds"]
        done = finished_depths(study)
        # the family: the judged tests at the finished depths (those of the findings)
        tests = judge([r for r in comparisons(study) if r["depth"] in done and r["p_corrected"] is not None])
        passing = [r for r in tests if r["verdict"] != NO_DIFFERENCE]
        below = sum(1 for r in tests if r["test"]["p_value"] < SIGNIFICANCE)
        outcome = (f"{len(passing)} significant after {CORRECTION} over the {len(tests)}"
                   + (" (" + "; ".join(f"{r['verdict']} than {r['b'] if r['verdict'].startswith(r['a']) else r['a']} at "
                                       f"d = {r['depth']}, {CORRECTION} p = {format_p(r['p_corrected'])}" for r in passing)
                      + ")" if passing else "")
                   + f", {below} at uncorrected p < {SIGNIFICANCE}; {NO_DIFFERENCE} in the others")
        pending = [d for d in study["config"]["depths"] if d not in done]
        trained = (f"trained, d = {', '.join(map(str, done))} ({seeds} seeds): {len(tests)} paired tests of gated "
                   f"against each family, {outcome}") if done else "trained: no depth finished yet"
        verdict = "measured" + (f"; d = {', '.join(map(str, pending))} pending" if pending else "")
        trained += "; " + gate_family_second_dataset(root, study)
    return (f"| [Beyond the papers: ReZero, SkipInit, LayerScale](docs/reproductions/gate-family.md): the 2017 "
            f"gate against its successors on the MNIST protocol | — | {init}; {trained} | {verdict} |")


def _transformer_gates_row(root: Path) -> str:
    # Ours: the 2017 gate and today's layer-dropping criteria in a small ViT; the counts of its paired tests.
    summary = _json(root, "transformer-gates/results.json")
    config = summary["config"]
    depth = max(config["depths"])
    cell = next((c for c in summary["cells"] if c["family"] == "prenorm" and c["depth"] == depth), None)
    error = (f"ungated test error {format_mean_std(cell['test_error_pct'])}%; " if cell and cell["test_error_pct"]["n"]
             else "")
    tests = [r for r in summary["comparisons"] if r.get("p_corrected") is not None]
    significant = sum(1 for r in tests if r["p_corrected"] < SIGNIFICANCE)
    criteria = [r for r in summary["criteria_tests"] if r.get("p_corrected") is not None]
    gate_ahead = sum(1 for r in criteria if r["verdict"] == "gate better")
    criterion_ahead = sum(1 for r in criteria if r["verdict"] == f"{r['a']} better")
    removed = ", ".join(str(n) for n in sorted({r["n"] for r in summary["criteria_tests"]}))
    return (f"| [Which layers a trained transformer can lose](docs/reproductions/transformer-gates.md) (ours): the "
            f"2017 gate (relu(k) via add_gates), ReZero and LayerScale against ShortGPT's block influence, the angular "
            f"distance, SLEB's lesion test, deepest and random orders, in a small ViT on MNIST | — | "
            f"{', '.join(map(str, config['depths']))} layers, {config['seeds']} seeds: {error}{significant} of "
            f"{len(tests)} paired tests of gated against each family significant after {CORRECTION}; with {removed} "
            f"layers removed, the gate order keeps more test accuracy in {gate_ahead} and less in {criterion_ahead} of "
            f"{len(criteria)} paired tests against the other criteria ({CORRECTION}) | measured |")


def _reproductions_table(root: Path) -> str:
    """The README's table: one row per reproduced claim, each linking to its page under docs/reproductions.
    A new study (e.g. the gate family, the Table 1 selection) adds its row function here."""
    return "\n".join([
        *table_header(["reproduction", "paper", "ours", "verdict"]),
        _mnist_depth_row(root), _selection_row(root), _mean_k_row(root), _pruning_row(root), _lesion_row(root), _sdi_row(root),
        _hessian_row(root), _highway_depth_row(root), _conv_row(root),
        "| [Convolutional networks](docs/reproductions/cifar.md): gated-residual-v2 Tables 3, 4, Wide Gated "
        "ResNet on CIFAR-10 / 100, test error (%) | 3.65 / 18.27 | not run: no CIFAR data or GPU here | pending |",
        _gate_family_row(root), layer_drop_row(root), _transformer_gates_row(root),
    ])
