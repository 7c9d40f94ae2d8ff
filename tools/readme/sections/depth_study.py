"""Renderers of docs/reproductions/mnist-depth.md: the MNIST depth study (gated-residual-v2 Tables 1 and 2), its
findings and the first-layer (stem) ablation, from results/mnist-depth*/results.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .common import _json, _report_file


def _mnist_depth_stem_dense_table(root: Path) -> str:
    """The one-seed study with the Dot-BN-ReLU first layer (the stem ablation), as its table.md."""
    from throughway.experiments import mnist_depth

    return mnist_depth.table_markdown(_json(root, "mnist-depth-stem-dense/results.json"))


def _mnist_depth_table(root: Path) -> str:
    """The 5-seed study with the paper's first layer, as its table.md (finished or not)."""
    from throughway.experiments import mnist_depth

    return mnist_depth.table_markdown(_json(root, "mnist-depth/results.json"))


def _mnist_depth_findings(root: Path) -> str:
    """The 5-seed study's findings against the paper: its findings.md (`mnist_depth.findings_markdown`)."""
    from throughway.experiments import mnist_depth

    return _report_file(root, "mnist-depth", "findings.md", mnist_depth.findings_markdown)


def _mnist_depth_stem_ablation(root: Path) -> str:
    """The 5-seed study (linear first layer) beside the one-seed Dot-BN-ReLU study."""
    from throughway.experiments import mnist_depth

    return mnist_depth.stem_ablation_markdown(_json(root, "mnist-depth/results.json"),
                                              _json(root, "mnist-depth-stem-dense/results.json"))


def _mnist_depth_batchnorm_ablation(root: Path) -> str:
    """The 5-seed study beside the same study with Keras's BatchNorm constants (finished cells or not)."""
    from throughway.experiments import mnist_depth

    return mnist_depth.batchnorm_ablation_markdown(_json(root, "mnist-depth/results.json"),
                                                   _json(root, "mnist-depth-keras-bn/results.json"))


def _mnist_depth_stem_dense_k_ratio(root: Path) -> str:
    """The range over depths of paper's mean k / our mean k in the stem ablation, e.g. "3.0–6.7"."""
    summary = _json(root, "mnist-depth-stem-dense/results.json")
    ratios = [c["paper_k_mean"] / c["k_mean"]["mean"] for c in summary["cells"]
              if c["arch"] == "gated" and c["paper_k_mean"] and c["k_mean"]["mean"]]
    return f"{min(ratios):.1f}–{max(ratios):.1f}"


def _bn_stats(root: Path) -> str:
    """One sentence from results/bn-stats: how much the test error moves when the study's nets'
    BatchNorm running statistics are re-estimated exactly (momentum → 0), the paired tests over seeds
    (Holm over the cells), and, against the gap to Table 1 of each cell from d = 10 on, the equivalence
    test (TOST) that says whether the change is smaller than that gap; recomputed from the runs' errors."""
    from throughway.report.stats import (CORRECTION, SIGNIFICANCE, correct, correct_family, equivalence_test,
                                         format_interval, format_p, paired_t_test)

    data = _json(root, "bn-stats/bn_stats.json")
    cells = []
    for group in data["groups"]:
        runs = sorted((r for r in data["runs"] if (r["model"], r["depth"]) == (group["model"], group["depth"])),
                      key=lambda r: r["seed"])
        after, before = [r["test_error_pct_reestimated"] for r in runs], [r["test_error_pct_running"] for r in runs]
        paper = group["paper_test_error_pct"]
        gap = group["running"]["mean"] - paper if paper is not None else None
        margin = gap if gap is not None and gap > 0 and group["depth"] >= 10 else None
        cells.append({"group": group, "test": paired_t_test(after, before), "margin": margin,
                      "tost": equivalence_test(after, before, margin) if margin is not None else None})
    for cell, corrected in zip(cells, correct_family([c["test"] for c in cells])):
        cell["p_corrected"] = corrected
    tested = [c for c in cells if c["p_corrected"] is not None]
    significant = [c for c in tested if c["p_corrected"] < SIGNIFICANCE]
    diffs = [c["test"].mean_difference for c in cells]
    seeds = "/".join(str(n) for n in sorted({c["group"]["n"] for c in cells}))
    tests = (f"significant after {CORRECTION} in {len(significant)} of {len(tested)} paired tests over seeds ("
             + ", ".join(f"{c['group']['model']} d = {c['group']['depth']}: {CORRECTION} p = {format_p(c['p_corrected'])}"
                         for c in significant) + ")"
             if significant else
             f"no difference detected in any cell after {CORRECTION} over {len(tested)} paired tests (smallest "
             f"uncorrected p = {min(c['test'].p_value for c in tested):.2f}; 95% CIs from "
             f"{min(c['test'].ci_low for c in tested):+.3f} to {max(c['test'].ci_high for c in tested):+.3f})")
    tost = [c for c in cells if c["tost"] is not None and c["tost"].p_value is not None]
    shown = []
    for cell, corrected in zip(tost, correct([c["tost"].p_value for c in tost])):
        cell["tost_corrected"] = corrected
        if corrected < SIGNIFICANCE:
            shown.append(cell)
    margins = [c["margin"] for c in tost]
    verdict = (f"an equivalence test (TOST, two one-sided paired t-tests, {CORRECTION} over the {len(tost)} cells from "
               f"d = 10 on) against a margin of each cell's gap to Table 1 ({min(margins):.2f} to {max(margins):.2f} "
               f"points) shows the change smaller than the gap in {len(shown)} of {len(tost)} cells"
               + ("" if len(shown) == len(tost) else " (not shown: " + ", ".join(
                   f"{c['group']['model']} d = {c['group']['depth']}, margin ±{c['margin']:.2f}, 90% CI "
                   f"{format_interval(c['tost'].ci_low, c['tost'].ci_high, '+.3f')}" for c in tost if c not in shown) + ")"))
    return (f"re-estimating every BatchNorm layer's running statistics exactly over the training set (the limit "
            f"of momentum → 0, which Keras's 0.99 approaches; training never uses them) moves the test error by "
            f"{min(diffs):+.3f} to {max(diffs):+.3f} points (mean over {seeds} seeds per cell), {tests}; {verdict} "
            f"(`results/bn-stats`). Its ε (1e-5 against Keras's 1e-3) acts in training, so it needs the study "
            f"trained again (below)")


def _mnist_depth_selection(root: Path) -> str:
    """The 60,000-image study's Table 1 by epoch selection: last epoch and best test epoch (optimistic)."""
    from throughway.experiments import mnist_depth_report

    return mnist_depth_report.selection_report_markdown(Path(root) / "mnist-depth", ("last", "best-test"))


def _mnist_depth_val_selection(root: Path) -> str:
    """The 50,000/10,000 study's Table 1 with the epoch chosen on the validation split (honest), beside the
    last and best test epochs; a pending line while results/mnist-depth-val is not committed."""
    from throughway.experiments import mnist_depth_report

    folder = Path(root) / "mnist-depth-val"
    if not (folder / "runs").is_dir():
        return ("Pending: `results/mnist-depth-val` is not committed yet "
                "(`throughway reproduce mnist-depth --archs plain residual gated --out results/mnist-depth-val`).")
    return mnist_depth_report.selection_report_markdown(folder, ("last", "best-test", "best-val"))


def validation_ties(folder: Path) -> dict[str, Any]:
    """The runs of a study folder (runs/*/results.json with a validation split) whose lowest validation
    error is reached at more than one epoch: {"runs": how many runs, "tied": {run name: {"epochs", "test"}}},
    "test" being the test errors at the tied epochs."""
    runs = sorted(p.parent for p in (Path(folder) / "runs").glob("*/results.json"))
    tied: dict[str, dict[str, Any]] = {}
    for run in runs:
        history = [h for h in json.loads((run / "results.json").read_text())["history"]
                   if h.get("val_error_pct") is not None and h.get("test_error_pct") is not None]
        if not history:
            continue
        lowest = min(h["val_error_pct"] for h in history)
        at = [h for h in history if h["val_error_pct"] == lowest]
        if len(at) > 1:
            tied[run.name] = {"epochs": [h["epoch"] for h in at], "test": [h["test_error_pct"] for h in at]}
    return {"runs": len(runs), "tied": tied}


def _mnist_depth_val_ties(root: Path) -> str:
    """How the validation selection breaks ties (the earliest epoch), and how many runs of
    results/mnist-depth-val have one, with the spread of test error across their tied epochs."""
    ties = validation_ties(Path(root) / "mnist-depth-val")
    tied = ties["tied"]
    text = ("When several epochs share a run's lowest validation error, the selection takes the earliest of "
            "them, as early stopping would")
    if not tied:
        return text + f" (no run of the {ties['runs']} has such a tie)."
    spread = max(max(t["test"]) - min(t["test"]) for t in tied.values())
    return (text + f": {len(tied)} of the {ties['runs']} runs have a tie ({', '.join(sorted(tied))}), and their test "
            f"errors at the tied epochs differ by up to {spread:.2f} points.")
