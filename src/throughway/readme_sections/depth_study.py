"""README section 1 renderers: the MNIST depth study (gated-residual-v2 Tables 1 and 2), its
findings and the first-layer (stem) ablation, from results/mnist-depth*/results.json."""

from __future__ import annotations

from pathlib import Path

from .common import _json


def _mnist_depth_stem_dense_table(root: Path) -> str:
    """The one-seed study with the Dot-BN-ReLU first layer (the stem ablation), as its table.md."""
    from ..experiments import mnist_depth

    return mnist_depth.table_markdown(_json(root, "mnist-depth-stem-dense/results.json"))


def _mnist_depth_table(root: Path) -> str:
    """The 5-seed study with the paper's first layer, as its table.md (finished or not)."""
    from ..experiments import mnist_depth

    return mnist_depth.table_markdown(_json(root, "mnist-depth/results.json"))


def _mnist_depth_findings(root: Path) -> str:
    """The 5-seed study's findings against the paper (`mnist_depth.findings_markdown`)."""
    from ..experiments import mnist_depth

    return mnist_depth.findings_markdown(_json(root, "mnist-depth/results.json"))


def _mnist_depth_stem_ablation(root: Path) -> str:
    """The 5-seed study (linear first layer) beside the one-seed Dot-BN-ReLU study."""
    from ..experiments import mnist_depth

    return mnist_depth.stem_ablation_markdown(_json(root, "mnist-depth/results.json"),
                                              _json(root, "mnist-depth-stem-dense/results.json"))


def _mnist_depth_stem_dense_k_ratio(root: Path) -> str:
    """The range over depths of paper's mean k / our mean k in the stem ablation, e.g. "3.0–6.7"."""
    summary = _json(root, "mnist-depth-stem-dense/results.json")
    ratios = [c["paper_k_mean"] / c["k_mean"]["mean"] for c in summary["cells"]
              if c["arch"] == "gated" and c["paper_k_mean"] and c["k_mean"]["mean"]]
    return f"{min(ratios):.1f}–{max(ratios):.1f}"
