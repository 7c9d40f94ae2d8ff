"""The MNIST depth study's tables and findings (experiments.mnist_depth), made from its results.json
summary alone: test error beside gated-residual-v2 Table 1, mean k beside Table 2, the paired
gated − residual tests (95% intervals, p uncorrected and Holm-corrected, detectable differences), the
findings against the paper, the first-layer (stem) ablation and the BatchNorm-constants ablation (with
its equivalence tests against the gap to Table 1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._io import read_json
from ..report.stats import (LAST_EPOCHS, CONFIDENCE, CORRECTION, MIN_PAIRS_FOR_VERDICT, NO_DIFFERENCE, POWER, SIGNIFICANCE, correct,
                            correct_family, equivalence_test, format_interval, format_mean_std, format_p, judged, mean_std,
                            paired_by_seed)
from ..report.stats import verdict as test_verdict
from ..study.papers import PAPER_MEAN_K, PAPER_TEST_ERROR
from ..study.summary import read_runs
from ..report.tables import paired_cells, paired_columns, table_header, table_row

__all__ = ["LAST_EPOCHS", "differences_from_paper", "paired_comparisons", "comparison_family", "table_markdown", "findings_markdown", "stem_ablation_markdown",
           "batchnorm_ablation_markdown", "batchnorm_ablation_tests", "SELECTIONS", "selected_epoch", "epoch_selection",
           "selection_table_markdown", "selection_findings", "selection_findings_markdown",
           "selection_report_markdown"]

def differences_from_paper(config: dict[str, Any]) -> list[str]:
    """What this study's settings change from the paper's protocol (printed with every table)."""
    out = []
    if config.get("stem", "dense") != "linear":
        out.append("first layer Dot-BN-ReLU instead of the paper's linear layer")
    if config["epochs"] != 100:
        out.append(f"{config['epochs']} epochs instead of the paper's 100 (errors are not converged)")
    if not config["train_on_full"]:
        out.append("trained on 50,000 images, 10,000 held out for validation (the paper: all 60,000)")
    if config["limit"] is not None:
        out.append(f"only the first {config['limit']} images of each split")
    missing = sorted(set(PAPER_MEAN_K) - set(config["depths"]))
    if missing:
        out.append(f"depths {missing} not run")
    return out






_METRICS = {"test_error_pct": "last epoch", "test_error_last10_pct": f"mean of the last {LAST_EPOCHS} epochs"}


def paired_comparisons(summary: dict[str, Any], a: str = "gated", b: str = "residual") -> list[dict[str, Any]]:
    """Per depth, the paired t-test (report.stats.paired_t_test: with its 95% interval and detectable
    difference) of `a` − `b` test error over the seeds both finished, for the last-epoch error and for
    the mean of the last 10 epochs: {"depth", "a", "b", "seeds", "test_error_pct", "test_error_last10_pct"},
    each test a PairedTest's dict with "p_corrected" and "verdict" added by `comparison_family` (Holm over
    every judged test of both errors; the last-10 tests only with at least 10 epochs). Recomputed from the
    cells' per-seed errors, so a summary written before the intervals existed reads the same."""
    by = {(c["arch"], c["depth"]): c for c in summary["cells"]}
    out = []
    for depth in summary["config"]["depths"]:
        if (a, depth) not in by or (b, depth) not in by:
            continue
        first = {r["seed"]: r for r in by[(a, depth)]["per_seed"]}
        second = {r["seed"]: r for r in by[(b, depth)]["per_seed"]}
        seeds = sorted(set(first) & set(second))
        row: dict[str, Any] = {"depth": depth, "a": a, "b": b, "seeds": seeds}
        for key in _METRICS:
            _, test = paired_by_seed({s: first[s][key] for s in seeds}, {s: second[s][key] for s in seeds})
            row[key] = test.to_dict()
        out.append(row)
    return comparison_family(out, summary["config"]["epochs"])


def comparison_family(rows: list[dict[str, Any]], epochs: int) -> list[dict[str, Any]]:
    """The tests of `paired_comparisons`' rows as one family: each test gets "p_corrected" (Holm over the
    judged tests of both errors; the last-10 errors only with at least LAST_EPOCHS epochs) and "verdict"
    (report.stats.verdict at the corrected p). Changed in place and returned."""
    keys = [key for key in _METRICS if key == "test_error_pct" or epochs >= LAST_EPOCHS]
    tests = [(row, key) for row in rows for key in keys]
    for (row, key), corrected in zip(tests, correct_family([row[key] for row, key in tests])):
        row[key]["p_corrected"] = corrected
        row[key]["verdict"] = test_verdict(row[key], corrected, row["a"], row["b"])
    for row in rows:
        for key in _METRICS:
            if key not in keys:
                row[key]["p_corrected"], row[key]["verdict"] = None, f"too few epochs ({epochs} < {LAST_EPOCHS})"
    return rows


def _format_cell(cell: dict[str, Any], key: str, epochs: int) -> str:
    stat = cell[key]
    unfinished = [r for r in cell["runs"] if r["state"] in ("running", "not started")]
    if stat["mean"] is None:
        if not unfinished:
            return "—"
        r = max(unfinished, key=lambda r: r["epochs"])
        return "not run" if r["state"] == "not started" else f"(unfinished: epoch {r['epochs']}/{epochs})"
    text = format_mean_std(stat)
    if any(r["state"] == "diverged" for r in cell["runs"]):
        at = next(r for r in cell["runs"] if r["state"] == "diverged")["diverged_at"] or {}
        text += f" (diverged, epoch {at.get('epoch', '?')})"
    if unfinished:
        text += f" ({stat['n']}/{len(cell['runs'])} seeds)"
    return text



def _format_p(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"



def table_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables: test error beside Table 1 (mean ± std and best over seeds, last epoch; mean of
    the last 10 epochs), mean k beside Table 2, and the paired gated − residual test per depth."""
    config = summary["config"]
    epochs = config["epochs"]
    archs = config["archs"]
    seeds = config["seeds"]
    by = {(c["arch"], c["depth"]): c for c in summary["cells"]}
    lines = [f"Test error (%) at the last epoch — gated-residual-v2 Table 1 (paper) beside ours "
             f"(mean ± std over {seeds} seed{'s' if seeds > 1 else ''}; best seed)", ""]
    header = ["d"]
    for arch in archs:
        header += ([f"{arch} (paper)"] if arch in PAPER_TEST_ERROR else []) + [f"{arch} (ours)", "best"]
    lines += [*table_header(header)]
    for depth in config["depths"]:
        row = [str(depth)]
        for arch in archs:
            cell = by[(arch, depth)]
            if arch in PAPER_TEST_ERROR:
                paper = cell["paper_test_error_pct"]
                row.append(f"{paper:.2f}" if paper is not None else "—")
            row.append(_format_cell(cell, "test_error_pct", epochs))
            best = cell.get("test_error_best_pct")
            row.append(f"{best:.2f}" if best is not None else "—")
        lines.append(table_row(row))
    if epochs < LAST_EPOCHS:
        lines += ["", f"Test error, mean of the last {LAST_EPOCHS} epochs: too few epochs ({epochs} < {LAST_EPOCHS})."]
    else:
        lines += ["", f"Test error (%), mean of the last {LAST_EPOCHS} epochs of each seed (mean ± std over seeds)", "",
                  *table_header(["d", *archs])]
        for depth in config["depths"]:
            lines.append(table_row([depth, *(_format_cell(by[(arch, depth)], "test_error_last10_pct", epochs)
                                             for arch in archs)]))
    if "gated" in archs:
        lines += ["", "Mean k of the gated residual nets — gated-residual-v2 Table 2 (paper) beside ours "
                  "(mean ± std over seeds)", "",
                  *table_header(["d", "mean k (paper)", "mean k (ours)", "dead gates (k ≤ 0) per seed",
                                 "k: middle third − outer thirds"])]
        for depth in config["depths"]:
            cell = by[("gated", depth)]
            paper = cell["paper_k_mean"]
            dead = ", ".join(str(r["dead_gates"]) for r in cell.get("per_seed", []) if r.get("dead_gates") is not None)
            lines.append(table_row([depth, f"{paper:.2f}" if paper is not None else "—",
                                    _format_cell(cell, "k_mean", epochs), f"{dead or '—'} of {max(depth // 2, 0)}",
                                    _format_cell(cell, "k_middle_minus_ends", epochs) if depth >= 6 else "—"]))
    comparisons = paired_comparisons(summary)
    if comparisons:
        tested = sum(1 for c in comparisons for key in _METRICS if c[key]["p_corrected"] is not None)
        family = (f"over this table's {tested} tests" if tested else
                  f"over this table's tests (none here: no test has the {MIN_PAIRS_FOR_VERDICT} seeds a verdict needs)")
        lines += ["", "Gated − residual test error (points), paired over seeds (two-sided paired t-test): the mean "
                  f"difference, its {CONFIDENCE:.0%} confidence interval, p uncorrected and {CORRECTION}-corrected "
                  f"{family}, and the smallest difference the test detects with {POWER:.0%} power; "
                  f"a verdict only at {CORRECTION}-corrected p < {SIGNIFICANCE} with at least {MIN_PAIRS_FOR_VERDICT} "
                  "seeds", "",
                  *table_header(["d", "test error", "seeds", *paired_columns("gated − residual")])]
        for comparison in comparisons:
            for key, label in _METRICS.items():
                if key == "test_error_last10_pct" and epochs < LAST_EPOCHS:
                    lines.append(table_row([comparison["depth"], label, len(comparison["seeds"]), *["—"] * 5,
                                            comparison[key]["verdict"]]))
                    continue
                lines.append(table_row([comparison["depth"], label, len(comparison["seeds"]),
                                        *paired_cells({**comparison[key], "test": comparison[key]})]))
    notes = [f"{epochs} epochs, recipe {config['recipe']}, {seeds} seed(s), first layer "
             f"{_STEM_WORDS.get(config.get('stem', 'dense'), config.get('stem'))}, trained on "
             f"{'60,000' if config['train_on_full'] else '50,000'} images; test error at the last epoch."
             + (" BatchNorm constants: Keras's defaults (momentum 0.99, i.e. PyTorch's 0.01; eps 1e-3)."
                if config.get("batchnorm", "torch") == "keras" else "")]
    cuts = differences_from_paper(config)
    if cuts:
        notes.append(("--quick cut: " if config.get("quick") else "Differences from the paper: ") + "; ".join(cuts) + ".")
    if "highway" in archs:
        notes.append("highway: not in the paper's table; tanh H, gate bias −2, dense first layer, same recipe.")
    return "\n".join(lines + [""] + notes) + "\n"



def findings_markdown(summary: dict[str, Any]) -> str:
    """What the study's finished cells say against the paper, as a markdown list: per architecture,
    the depths where Table 1's error lies within our seeds' range and where it is below or above
    it; Table 2's mean k against ours; and per depth the paired gated − residual verdict (p < 0.05).
    Only cells with at least MIN_PAIRS_FOR_VERDICT (3) finished seeds are judged: fewer give no verdict."""
    config = summary["config"]
    by = {(c["arch"], c["depth"]): c for c in summary["cells"]}
    lines = []
    for arch in [a for a in config["archs"] if a in PAPER_TEST_ERROR]:
        inside, below, above = [], [], []
        for depth in config["depths"]:
            cell = by.get((arch, depth))
            values = [r["test_error_pct"] for r in (cell or {}).get("per_seed", [])]
            paper = PAPER_TEST_ERROR[arch].get(depth)
            if len(values) < MIN_PAIRS_FOR_VERDICT or paper is None:
                continue
            if min(values) <= paper <= max(values):
                inside.append(str(depth))
            elif paper < min(values):
                below.append(f"{depth} (ours {min(values):.2f}–{max(values):.2f}, paper {paper:.2f})")
            else:
                above.append(f"{depth} (ours {min(values):.2f}–{max(values):.2f}, paper {paper:.2f})")
        parts = [f"within our seeds' range at d = {', '.join(inside)}" if inside else "",
                 f"below every seed of ours at d = {'; '.join(below)}" if below else "",
                 f"above every seed of ours at d = {'; '.join(above)}" if above else ""]
        text = "; ".join(p for p in parts if p)
        lines.append(f"- **{arch}**, Table 1's error: {text or 'no depth with three finished seeds yet (too few)'}.")
    ratios = []
    for depth in config["depths"]:
        cell = by.get(("gated", depth))
        if cell and cell["k_mean"]["n"] >= MIN_PAIRS_FOR_VERDICT and cell["k_mean"]["mean"] and PAPER_MEAN_K.get(depth):
            ratios.append((depth, PAPER_MEAN_K[depth] / cell["k_mean"]["mean"], cell["k_mean"]))
    if ratios:
        lines.append("- **Mean k** (Table 2 / ours): " + ", ".join(
            f"d = {d}: {r:.2f} (ours {format_mean_std(k)})" for d, r, k in ratios) + ".")
    rows = [row for row in paired_comparisons(summary) if len(row["seeds"]) >= MIN_PAIRS_FOR_VERDICT]
    for row in rows:
        last, tail = row["test_error_pct"], row["test_error_last10_pct"]
        tail_text = (f"mean of the last {LAST_EPOCHS} epochs: too few epochs ({config['epochs']} < {LAST_EPOCHS})"
                     if config["epochs"] < LAST_EPOCHS else f"mean of the last {LAST_EPOCHS} epochs {_said(tail)}")
        lines.append(f"- **d = {row['depth']}, gated − residual** over {len(row['seeds'])} seeds ({CORRECTION} over "
                     f"the table's tests): last epoch {_said(last)}; {tail_text}.")
    lines += _against_paper_advantage(rows, config)
    return "\n".join(lines) + "\n" if lines else "- No cell has three finished seeds yet (too few for a verdict).\n"



def _said(test: dict[str, Any]) -> str:
    """A judged test (`comparison_family`) in words: its difference in points, 95% interval, both p and
    the verdict at the corrected p."""
    return (f"{test['mean_difference']:+.3f} points ({CONFIDENCE:.0%} CI "
            f"{format_interval(test['ci_low'], test['ci_high'], '+.3f')}, p = {_format_p(test['p_value'])}, "
            f"{CORRECTION} p = {_format_p(test['p_corrected'])}: {test['verdict']})")


def _against_paper_advantage(rows: list[dict[str, Any]], config: dict[str, Any]) -> list[str]:
    """One line: for each error measure (last epoch; the mean of the last 10 epochs, where run), the depths
    where the paper's own gated − residual difference (Table 1) lies inside the 95% interval of ours, so
    that the study cannot tell the paper's difference from zero there, and those where it lies outside;
    with the differences the tests detect with 80% power."""
    paper = {row["depth"]: PAPER_TEST_ERROR.get(row["a"], {}).get(row["depth"]) for row in rows}
    paper = {d: v - PAPER_TEST_ERROR[rows[0]["b"]][d] for d, v in paper.items()
             if v is not None and PAPER_TEST_ERROR.get(rows[0]["b"], {}).get(d) is not None} if rows else {}
    keys = [key for key in _METRICS if key == "test_error_pct" or config["epochs"] >= LAST_EPOCHS]
    parts = []
    for key in keys:
        cells = [(row["depth"], row[key]) for row in rows if row["depth"] in paper and row[key]["ci_low"] is not None]
        if not cells:
            continue
        inside = [d for d, t in cells if t["ci_low"] <= paper[d] <= t["ci_high"]]
        outside = [d for d, t in cells if d not in inside]
        said = [f"inside at d = {', '.join(map(str, inside))}" if inside else "",
                f"outside at d = {', '.join(map(str, outside))}" if outside else ""]
        detectable = [t["detectable"] for _, t in cells if t.get("detectable") is not None]
        parts.append(f"{_METRICS[key]}: " + ", ".join(p for p in said if p)
                     + (f" (detectable with {POWER:.0%} power: {min(detectable):.2f} to {max(detectable):.2f} points)"
                        if detectable else ""))
    if not parts:
        return []
    return ["- **Against the paper's difference** (Table 1, gated − residual: "
            + ", ".join(f"{v:+.2f} at d = {d}" for d, v in paper.items()) + f"), whether it lies in our "
            f"{CONFIDENCE:.0%} CI of gated − residual (inside: the study cannot tell the paper's difference from zero "
            "there): " + "; ".join(parts) + "."]


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"



_STEM_WORDS = {"linear": "linear (a single Dot, the paper's)", "dense": "Dot-BN-ReLU (not the paper's)"}



def stem_ablation_markdown(summary: dict[str, Any], ablation: dict[str, Any]) -> str:
    """A table of this study's cells (the paper's linear first layer) beside `ablation`, a study run
    with the Dot-BN-ReLU first layer: test error and mean k per depth, with the paper's numbers."""
    ours = {(c["arch"], c["depth"]): c for c in summary["cells"]}
    other = {(c["arch"], c["depth"]): c for c in ablation["cells"]}

    def fmt(cell: dict[str, Any] | None, key: str) -> str:
        return "—" if cell is None else format_mean_std(cell[key], count=True)

    lines = [*table_header(["d", "arch", "paper", "first layer linear (paper's)", "first layer Dot-BN-ReLU",
                            "k: paper", "k: linear", "k: Dot-BN-ReLU"])]
    for depth in summary["config"]["depths"]:
        for arch in ("residual", "gated"):
            a, b = ours.get((arch, depth)), other.get((arch, depth))
            if a is None:
                continue
            paper = PAPER_TEST_ERROR[arch].get(depth)
            k_paper = PAPER_MEAN_K.get(depth) if arch == "gated" else None
            lines.append(table_row([depth, arch, _num(paper), fmt(a, "test_error_pct"), fmt(b, "test_error_pct"),
                                    _num(k_paper), fmt(a, "k_mean") if arch == "gated" else "—",
                                    fmt(b, "k_mean") if arch == "gated" else "—"]))
    return "\n".join(lines) + "\n"


def batchnorm_ablation_tests(summary: dict[str, Any], keras: dict[str, Any]) -> list[dict[str, Any]]:
    """Per residual/gated cell of `keras` (the study run with `--batchnorm keras`): the paired t-test of
    keras − torch test error over the seeds finished in both studies (the same seed: the same initial
    weights and data order), as {"arch", "depth", "torch", "keras" (the cells, None when absent), "test"
    (PairedTest), "p_corrected" (Holm over the judged cells), "margin" (the cell's gap to Table 1: our
    PyTorch-constants mean − the paper's number; None without a positive gap), "equivalence" (the TOST of
    keras − torch against ±margin, report.stats.equivalence_test; None without a margin),
    "equivalence_p_corrected" (Holm over the cells' TOST p)}. The TOST asks whether the constants move the
    error by less than the whole gap, so that they cannot be its cause."""
    ours = {(c["arch"], c["depth"]): c for c in summary["cells"]}
    other = {(c["arch"], c["depth"]): c for c in keras["cells"]}
    rows: list[dict[str, Any]] = []
    for depth in keras["config"]["depths"]:
        for arch in ("residual", "gated"):
            a, b = ours.get((arch, depth)), other.get((arch, depth))
            if b is None:
                continue
            first = {r["seed"]: r["test_error_pct"] for r in (a or {}).get("per_seed", [])
                     if r.get("test_error_pct") is not None}
            second = {r["seed"]: r["test_error_pct"] for r in b["per_seed"] if r.get("test_error_pct") is not None}
            seeds, test = paired_by_seed(second, first)
            paper = PAPER_TEST_ERROR[arch].get(depth)
            mean = (a or {}).get("test_error_pct", {}).get("mean")
            margin = mean - paper if paper is not None and mean is not None and mean > paper else None
            equivalence = (equivalence_test([second[s] for s in seeds], [first[s] for s in seeds], margin)
                           if margin is not None and len(seeds) >= MIN_PAIRS_FOR_VERDICT else None)
            rows.append({"arch": arch, "depth": depth, "torch": a, "keras": b, "test": test, "margin": margin,
                         "equivalence": equivalence})
    for row, corrected in zip(rows, correct_family([row["test"] for row in rows])):
        row["p_corrected"] = corrected
    tost = [i for i, row in enumerate(rows) if row["equivalence"] is not None and row["equivalence"].p_value is not None]
    for row in rows:
        row["equivalence_p_corrected"] = None
    for i, corrected in zip(tost, correct([rows[i]["equivalence"].p_value for i in tost])):
        rows[i]["equivalence_p_corrected"] = corrected
    return rows


def _within_gap(row: dict[str, Any]) -> str:
    """The TOST of a BatchNorm-ablation row in a cell: margin, p, corrected p and what it shows."""
    test, corrected = row["equivalence"], row["equivalence_p_corrected"]
    if test is None or corrected is None:
        return "—"
    shown = "within the gap" if corrected < SIGNIFICANCE else "not shown"
    return (f"±{test.margin:.2f}: p = {format_p(test.p_value)}, {CORRECTION} p = {format_p(corrected)}, {shown}")


def batchnorm_ablation_markdown(summary: dict[str, Any], keras: dict[str, Any]) -> str:
    """This study's cells (PyTorch's BatchNorm constants) beside `keras`, the same study run with
    `--batchnorm keras` (Keras's momentum 0.99 and eps 1e-3), at the depths `keras` covers: test error
    mean ± std over the seeds finished in each, the paired test of `batchnorm_ablation_tests` (95% interval,
    p uncorrected and Holm-corrected), its equivalence test against the cell's gap to Table 1, mean k;
    then what the finished cells show."""

    def fmt(cell: dict[str, Any] | None, key: str) -> str:
        return "—" if cell is None else format_mean_std(cell[key], count=True)

    lines = table_header(["d", "arch", "paper", "BatchNorm: PyTorch's constants (ours)", "BatchNorm: Keras's constants",
                          "Keras − PyTorch, paired by seed (pp)", f"{CONFIDENCE:.0%} CI", "p", f"p ({CORRECTION})",
                          f"change within the gap to Table 1? (TOST, margin ± the gap, {CORRECTION})",
                          "k: paper", "k: PyTorch's", "k: Keras's"])
    rows = batchnorm_ablation_tests(summary, keras)
    for row in rows:
        arch, depth, a, b, test = row["arch"], row["depth"], row["torch"], row["keras"], row["test"]
        gated = arch == "gated"
        few = test.n < MIN_PAIRS_FOR_VERDICT
        paired = "—" if test.mean_difference is None else f"{test.mean_difference:+.3f} (n={test.n})"
        lines.append(table_row([depth, arch, _num(PAPER_TEST_ERROR[arch].get(depth)), fmt(a, "test_error_pct"),
                                fmt(b, "test_error_pct"), paired,
                                "—" if few else format_interval(test.ci_low, test.ci_high, "+.3f"),
                                "—" if few else _format_p(test.p_value), "—" if few else _format_p(row["p_corrected"]),
                                _within_gap(row), _num(PAPER_MEAN_K.get(depth) if gated else None),
                                fmt(a, "k_mean") if gated else "—", fmt(b, "k_mean") if gated else "—"]))
    tested = [r for r in rows if judged(r["test"])]
    if tested:
        diffs = [r["test"].mean_difference for r in tested]
        significant = [r for r in tested if r["p_corrected"] < SIGNIFICANCE]
        where = ", ".join(sorted({f"d = {r['depth']}" for r in tested}, key=lambda t: int(t[4:])))
        said = (f"significantly after {CORRECTION} in {len(significant)} cell(s) ("
                + ", ".join(f"{r['arch']} d = {r['depth']}: {r['test'].mean_difference:+.3f}, {CONFIDENCE:.0%} CI "
                            f"{format_interval(r['test'].ci_low, r['test'].ci_high, '+.3f')}, p = "
                            f"{_format_p(r['test'].p_value)}, {CORRECTION} p = {_format_p(r['p_corrected'])}"
                            for r in significant) + ")"
                if significant else
                f"with {NO_DIFFERENCE} in any cell after {CORRECTION} over the {len(tested)} tests (95% CIs from "
                f"{min(r['test'].ci_low for r in tested):+.3f} to {max(r['test'].ci_high for r in tested):+.3f})")
        text = (f"Where both are finished ({where}), Keras's constants move the test error by {min(diffs):+.3f} "
                f"to {max(diffs):+.3f} points, {said}.")
        tost = [r for r in tested if r["equivalence_p_corrected"] is not None]
        if tost:
            shown = [r for r in tost if r["equivalence_p_corrected"] < SIGNIFICANCE]
            missing = [r for r in tost if r not in shown]
            text += (f" Equivalence test (TOST: two one-sided paired t-tests at {SIGNIFICANCE}, {CORRECTION} over the "
                     f"{len(tost)} cells) against a margin of each cell's gap to Table 1 (our mean with PyTorch's "
                     f"constants − the paper's number: {min(r['margin'] for r in tost):.2f} to "
                     f"{max(r['margin'] for r in tost):.2f} points): the change is smaller than the gap in {len(shown)} of "
                     f"{len(tost)} cells" + (": not shown for " + ", ".join(
                         f"{r['arch']} d = {r['depth']} (margin ±{r['margin']:.2f}, 90% CI "
                         f"{format_interval(r['equivalence'].ci_low, r['equivalence'].ci_high, '+.2f')}, {CORRECTION} "
                         f"p = {format_p(r['equivalence_p_corrected'])})" for r in missing) if missing else "") + ".")
        lines += ["", text]
    return "\n".join(lines) + "\n"


# Which epoch of a run gives the number that Table 1 would report. gated-residual-v2 §3.1
# states neither the epoch nor the run behind Table 1; each selection here is one reading of it.
SELECTIONS: dict[str, str] = {
    "last": "the last epoch",
    "best-test": "the epoch with the lowest test error (selected on the test set: optimistic)",
    "best-val": "the epoch with the lowest validation error (trained on 50,000, selected on the 10,000 held out; "
                "that epoch's test error)",
}


def selected_epoch(history: list[dict[str, Any]], selection: str) -> dict[str, Any] | None:
    """The epoch record `selection` picks from a run's `history` (results.json "history"), or None
    when no epoch has the number it selects on (e.g. "best-val" of a run trained without a validation
    split). "last": the last epoch with a test error; "best-test": the lowest test_error_pct;
    "best-val": the lowest val_error_pct. Ties go to the earliest epoch, as early stopping would."""
    if selection not in SELECTIONS:
        raise ValueError(f"selection={selection!r} is not known; accepted values: {list(SELECTIONS)}")
    key = {"last": "test_error_pct", "best-test": "test_error_pct", "best-val": "val_error_pct"}[selection]
    usable = [h for h in history if h.get(key) is not None and h.get("test_error_pct") is not None]
    if not usable:
        return None
    if selection == "last":
        return usable[-1]
    return min(usable, key=lambda h: (h[key], h["epoch"]))


def epoch_selection(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Table 1's test error under each of SELECTIONS, from a mnist-depth study folder's
    results.json (its config: depths, architectures, seeds) and every run's runs/<arch>-d<d>-s<seed>/
    results.json, finished or not.

    Returns {"folder", "config", "cells"}: per (arch, depth) of the paper's three architectures a
    cell {"arch", "depth", "paper", "finished" (seeds), "seeds" (per seed: "seed", "state" (finished,
    diverged, running at epoch N, not started) and per finished seed, for each selection, {"epoch",
    "test_error_pct"} or None), and per selection {"mean", "std", "n", "values"} over the finished
    seeds with "best" (the lowest) and "best_seed"}. Only finished, undiverged runs are counted:
    a running run's best epoch so far is not its best epoch."""
    folder = Path(folder)
    summary_path = folder / "results.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path}: no mnist-depth summary (run `throughway reproduce mnist-depth "
                                f"--out {folder}` or copy the study's results.json there)")
    config = read_json(summary_path).get("config")
    if not isinstance(config, dict) or not all(k in config for k in ("depths", "archs", "seeds", "epochs")):
        raise ValueError(f"{summary_path}: 'config' lacks depths, archs, seeds or epochs; not a mnist-depth summary")
    cells = []
    for depth in config["depths"]:
        for arch in [a for a in config["archs"] if a in PAPER_TEST_ERROR]:
            names = [f"{arch}-d{depth}-s{seed}" for seed in range(config["seeds"])]
            seeds: list[dict[str, Any]] = []
            for seed, (_name, result) in enumerate(read_runs(folder / "runs", names)):
                if result is None:
                    seeds.append({"seed": seed, "state": "not started"})
                    continue
                history = result.get("history") or []
                if result.get("diverged"):
                    seeds.append({"seed": seed, "state": "diverged"})
                elif result.get("final") is None:
                    seeds.append({"seed": seed, "state": f"running at epoch {len(history)}"})
                else:
                    picked = {s: selected_epoch(history, s) for s in SELECTIONS}
                    seeds.append({"seed": seed, "state": "finished", **{
                        s: None if h is None else {"epoch": h["epoch"], "test_error_pct": h["test_error_pct"]}
                        for s, h in picked.items()}})
            cell: dict[str, Any] = {"arch": arch, "depth": depth, "paper": PAPER_TEST_ERROR[arch].get(depth),
                                    "finished": sum(1 for s in seeds if s["state"] == "finished"), "seeds": seeds}
            for selection in SELECTIONS:
                chosen = [(s[selection]["test_error_pct"], s["seed"]) for s in seeds
                          if s["state"] == "finished" and s[selection] is not None]
                best = min(chosen) if chosen else None
                cell[selection] = {**mean_std([v for v, _ in chosen]), "best": best[0] if best else None,
                                   "best_seed": best[1] if best else None}
            cells.append(cell)
    return {"folder": str(folder), "config": config, "cells": cells}


def _selection_cell(cell: dict[str, Any], selection: str) -> str:
    stat = cell[selection]
    if stat["mean"] is None:
        running = [s["state"] for s in cell["seeds"] if s["state"].startswith("running")]
        return f"pending ({running[0]})" if running else "pending"
    text = format_mean_std(stat)
    text += f"; best {stat['best']:.2f} (seed {stat['best_seed']})"
    if stat["n"] < len(cell["seeds"]):
        text += f" ({stat['n']}/{len(cell['seeds'])} seeds)"
    return text


def selection_table_markdown(selection_summary: dict[str, Any], selections: tuple[str, ...] = ("last", "best-test")
                             ) -> str:
    """A markdown table of Table 1's test error (%) per depth and architecture beside the paper's, one
    column per selection in `selections` (keys of SELECTIONS): mean ± std over the finished seeds and
    the best seed; "pending" where no seed has finished. `selection_summary` is `epoch_selection`'s."""
    unknown = [s for s in selections if s not in SELECTIONS]
    if unknown:
        raise ValueError(f"selections: {unknown} not known; accepted values: {list(SELECTIONS)}")
    config = selection_summary["config"]
    archs = [a for a in config["archs"] if a in PAPER_TEST_ERROR]
    by = {(c["arch"], c["depth"]): c for c in selection_summary["cells"]}
    header = ["d"]
    for arch in archs:
        header += [f"{arch} (paper)"] + [f"{arch}: {s}" for s in selections]
    lines = [*table_header(header)]
    for depth in config["depths"]:
        row = [str(depth)]
        for arch in archs:
            cell = by[(arch, depth)]
            row += [_num(cell["paper"])] + [_selection_cell(cell, s) for s in selections]
        lines.append(table_row(row))
    images = "60,000" if config.get("train_on_full") else "50,000 (10,000 held out for validation)"
    lines += ["", f"Test error (%), mean ± std over the finished seeds of {config['seeds']}; best seed. "
                  f"{config['epochs']} epochs, trained on {images}. Selections: "
              + "; ".join(f"**{s}**: {SELECTIONS[s]}" for s in selections) + "."]
    return "\n".join(lines) + "\n"


def selection_findings(selection_summary: dict[str, Any], selection: str) -> dict[str, dict[str, list[Any]]]:
    """Per architecture of the paper's residual and gated columns: which depths `selection` reproduces.
    The rule (ours; the paper gives no spread): Table 1's number is reproduced where it lies within the
    range of our finished seeds' selected errors (lowest to highest); "below" where it is lower than
    every seed (a gap: the paper's number is better than any of our runs), "above" where it is higher
    than every seed. Cells with fewer than MIN_PAIRS_FOR_VERDICT (3) finished seeds are not judged ("pending"). Returns {arch: {"within":
    [d], "below": [(d, our best, paper)], "above": [(d, our lowest, paper)], "pending": [d]}}."""
    out: dict[str, dict[str, list[Any]]] = {}
    for cell in selection_summary["cells"]:
        if cell["arch"] not in ("residual", "gated") or cell["paper"] is None:
            continue
        verdict = out.setdefault(cell["arch"], {"within": [], "below": [], "above": [], "pending": []})
        values = cell[selection]["values"]
        if len(values) < MIN_PAIRS_FOR_VERDICT:
            verdict["pending"].append(cell["depth"])
        elif min(values) <= cell["paper"] <= max(values):
            verdict["within"].append(cell["depth"])
        elif cell["paper"] < min(values):
            verdict["below"].append((cell["depth"], min(values), cell["paper"]))
        else:
            verdict["above"].append((cell["depth"], min(values), cell["paper"]))
    return out


def selection_findings_markdown(selection_summary: dict[str, Any], selections: tuple[str, ...] = ("last", "best-test")
                                ) -> str:
    """One sentence per selection and architecture (residual, gated) saying at which depths the
    selection reproduces Table 1 (`selection_findings`' rule) and which gaps remain, the d = 100 gated
    cell (the paper's 1.26) named on its own."""
    counts = []
    for selection in selections:
        findings = selection_findings(selection_summary, selection)
        judged = {arch: len(v["within"]) + len(v["below"]) + len(v["above"]) for arch, v in findings.items()}
        counts.append(f"{selection}: " + ", ".join(
            f"{arch} {len(v['within'])} of {judged[arch]}" if judged[arch] else f"{arch} not judged"
            for arch, v in findings.items()))
    lines = ["- Cells of Table 1 reproduced, by selection: " + "; ".join(counts) + "."]
    for selection in selections:
        findings = selection_findings(selection_summary, selection)
        for arch, verdict in findings.items():
            parts = []
            if verdict["within"]:
                parts.append(f"reproduces d = {', '.join(map(str, verdict['within']))} (the paper's number within "
                             f"our seeds' range)")
            if verdict["below"]:
                parts.append("leaves a gap at " + "; ".join(
                    f"d = {d} (our best seed {best:.2f}, paper {paper:.2f}: {best - paper:.2f} points)"
                    for d, best, paper in verdict["below"]))
            if verdict["above"]:
                parts.append("is better than the paper at " + "; ".join(
                    f"d = {d} (our best seed {best:.2f}, paper {paper:.2f})" for d, best, paper in verdict["above"]))
            if verdict["pending"]:
                parts.append(f"is not judged at d = {', '.join(map(str, verdict['pending']))} (fewer than three "
                             f"finished seeds: too few)")
            lines.append(f"- **{selection}**, {arch}: " + ("; ".join(parts) or "no cell") + ".")
        watch = next((c for c in selection_summary["cells"] if c["arch"] == "gated" and c["depth"] == 100), None)
        if watch is not None and len(watch[selection]["values"]) >= MIN_PAIRS_FOR_VERDICT:
            stat = watch[selection]
            lines.append(f"  - d = 100 gated, the paper's {watch['paper']:.2f}: ours {format_mean_std(stat)}, best seed {stat['best']:.2f} "
                         + ("(reached)." if stat["best"] <= watch["paper"] else
                            f"({stat['best'] - watch['paper']:.2f} points above the paper even at our best seed)."))
    rule = ("Rule (ours; the paper gives no spread): a selection reproduces a cell when Table 1's number lies "
            "between our lowest and highest finished seed; cells need three finished seeds.")
    return "\n".join(lines + ["", rule]) + "\n"


def selection_report_markdown(folder: str | os.PathLike[str],
                              selections: tuple[str, ...] = ("last", "best-test")) -> str:
    """`selection_table_markdown` and `selection_findings_markdown` of the mnist-depth study in `folder`
    (`epoch_selection`), as one markdown block: what results/<study>/best_epoch.md holds."""
    summary = epoch_selection(folder)
    return selection_table_markdown(summary, selections) + "\n" + selection_findings_markdown(summary, selections)

