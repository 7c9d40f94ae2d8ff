"""Renderers of docs/reproductions/mnist-depth.md: the MNIST depth study (gated-residual-v2 Tables 1 and 2), its
findings and the first-layer (stem) ablation, from results/mnist-depth*/results.json."""

from __future__ import annotations

from pathlib import Path

from .common import _json


def _mnist_depth_stem_dense_table(root: Path) -> str:
    """The one-seed study with the Dot-BN-ReLU first layer (the stem ablation), as its table.md."""
    from throughway.experiments import mnist_depth

    return mnist_depth.table_markdown(_json(root, "mnist-depth-stem-dense/results.json"))


def _mnist_depth_table(root: Path) -> str:
    """The 5-seed study with the paper's first layer, as its table.md (finished or not)."""
    from throughway.experiments import mnist_depth

    return mnist_depth.table_markdown(_json(root, "mnist-depth/results.json"))


def _mnist_depth_findings(root: Path) -> str:
    """The 5-seed study's findings against the paper (`mnist_depth.findings_markdown`)."""
    from throughway.experiments import mnist_depth

    return mnist_depth.findings_markdown(_json(root, "mnist-depth/results.json"))


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
    BatchNorm running statistics are re-estimated exactly (momentum → 0), the paired tests over seeds,
    and the gap to Table 1 it is compared with."""
    groups = _json(root, "bn-stats/bn_stats.json")["groups"]
    diffs = [g["test"]["mean_difference"] for g in groups]
    significant = [g for g in groups if g["test"]["p_value"] is not None and g["test"]["p_value"] < 0.05]
    gaps = [g["running"]["mean"] - g["paper_test_error_pct"] for g in groups
            if g["paper_test_error_pct"] is not None and g["depth"] >= 10]
    seeds = "/".join(str(n) for n in sorted({g["n"] for g in groups}))
    tests = (f"significant in {len(significant)} of {len(groups)} paired tests over seeds ("
             + ", ".join(f"{g['model']} d = {g['depth']}: p = {g['test']['p_value']:.3f}" for g in significant) + ")"
             if significant else
             f"in no cell significantly (smallest p = {min(g['test']['p_value'] for g in groups):.2f} over "
             f"{len(groups)} paired tests)")
    verdict = ("so BatchNorm's momentum does not explain the gap"
               if gaps and max(abs(d) for d in diffs) < min(gaps) / 3 else "a part of the gap to weigh")
    return (f"re-estimating every BatchNorm layer's running statistics exactly over the training set (the limit "
            f"of momentum → 0, which Keras's 0.99 approaches; training never uses them) moves the test error by "
            f"{min(diffs):+.3f} to {max(diffs):+.3f} points (mean over {seeds} seeds per cell), {tests}, against a "
            f"gap to Table 1 of {min(gaps):.2f} to {max(gaps):.2f} points from d = 10 on (`results/bn-stats`): "
            f"{verdict}; its ε (1e-5 against Keras's 1e-3) acts in training, so it needs the study trained again (below)")
