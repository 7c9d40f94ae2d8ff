"""`throughway analyze prune RUN_DIR` (gated-residual-v2 §3.1, figure 5 right): remove residual
blocks one at a time, physically, greedily by k or in random orders, and record test accuracy."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from .._io import atomic_write_json, read_json
from ..analysis.removal import check_prunable, layers_per_block, removal_curve, removal_order
from ..report.analysis_plots import plot_removal_curves
from ..study.nets import test_accuracy
from .run_files import (PRUNE_FILE, run_blocks, finish_text, analysis_header, load_run_data, analysis_dir,
                            paper_caveat, paper_setting_differences, require_family, load_run)
from ..study.papers import PAPER_TEST_ERROR
from ..report.stats import format_mean_std, mean_std

__all__ = ["analyze_prune", "PAPER_PRUNE_CLAIMS"]

# gated-residual-v2 §3.1 (abstract and figure 5 right), stated as text only: no curve values are given.
PAPER_PRUNE_CLAIMS = {
    "random_half_removed": "a gated residual net (d = 100) retains over 90% of its performance after half of its "
                           "layers have been removed at random",
    "residual": "a residual net suffers a performance decrease after just a few layers are removed",
    "greedy": "greedy removal (smallest k first) is slightly better than random for gated residual nets",
}



def _half_removed_ratio(curve: Sequence[float], half: int) -> float | None:
    return curve[half] / curve[0] if curve and curve[0] > 0 and half < len(curve) else None



def _removals_until(curve: Sequence[float], fraction: float) -> int | None:
    """The first number of removals after which the accuracy is below `fraction` of the full model's."""
    for removed, value in enumerate(curve):
        if value < fraction * curve[0]:
            return removed
    return None



# What plot_removal_curves reads from a prune result; a compared run is embedded with these keys only.
_CURVE_KEYS = ("run_dir", "family", "depth", "dataset", "run_final", "num_blocks", "layers_per_block",
               "full_accuracy_pct", "greedy", "random")



def _curves_only(result: dict[str, Any]) -> dict[str, Any]:
    curves = {key: result[key] for key in _CURVE_KEYS if key in result}
    if "random" in curves:  # the figure draws mean ± std; the per-order curves stay in the compared file
        curves["random"] = {key: curves["random"][key] for key in ("seed", "orders", "mean", "std")
                            if key in curves["random"]}
    return curves



def analyze_prune(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                  strategy: str = "all", orders: int = 10, seed: int = 0, device: str = "cpu",
                  data_dir: str | None = None, compare: Sequence[str | os.PathLike[str]] = (),
                  progress: bool = True, checkpoint: bool = False) -> tuple[dict[str, Any], str]:
    """Remove residual blocks one at a time, physically, and record test accuracy after each removal.

    strategy: "greedy" (smallest k first; gated runs only), "random" (`orders` random orders from
    `seed`, mean ± std) or "all" (greedy where there is k, and random). Writes prune.json, prune.txt
    and prune_accuracy.png (gated-residual-v2 figure 5 right); `compare` adds the curves of other runs'
    prune.json files to the figure (e.g. the residual run beside the gated one). Fully connected runs
    only (analysis.removal.PRUNABLE_MODELS)."""
    if strategy not in ("greedy", "random", "all"):
        raise ValueError(f"strategy={strategy!r}; accepted values: ['greedy', 'random', 'all']")
    if orders < 1:
        raise ValueError(f"orders={orders}: must be ≥ 1")
    run_dir = Path(run_dir)
    out_dir = analysis_dir(run_dir, out)  # checked before the run is read
    compared = []
    for path in compare:
        path = Path(path)
        if path.is_dir():
            path = path / PRUNE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: --compare needs a prune.json written by `analyze prune`")
        compared.append(read_json(path))
    results, model = load_run(run_dir, device, checkpoint)
    family = require_family(model, run_dir, ("gated", "residual", "augmented"), "prune")
    try:
        check_prunable(model)
    except ValueError as exc:
        raise ValueError(f"{run_dir}: `analyze prune`: {exc}") from exc
    has_k = family in ("gated", "augmented")
    if strategy == "greedy" and not has_k:
        raise ValueError(f"{run_dir}: greedy removal orders blocks by k, and this {family} run has no gates; "
                         f"use --strategy random")
    data = load_run_data(results, device, data_dir)
    metric = test_accuracy(data.test)
    count = len(run_blocks(model))
    result = {**analysis_header(run_dir, results, family, model), "num_blocks": count,
              "layers_per_block": layers_per_block(model), "split": "test", "removal": "physical (analysis.prune)",
              "paper": {"claims": PAPER_PRUNE_CLAIMS,
                        "test_error_pct": PAPER_TEST_ERROR.get(family, {}).get(int(results["config"]["depth"]))
                        if results["config"].get("dataset") == "mnist" else None,
                        "setting_differences": paper_setting_differences(results, model)
                        if results["config"].get("dataset") == "mnist" else [],
                        "source": "gated-residual-v2 abstract and §3.1, figure 5 right"}}
    full = metric(model)
    result["full_accuracy_pct"] = full
    if has_k and strategy in ("greedy", "all"):
        order = removal_order(model, "greedy")
        curve = removal_curve(model, order, metric)
        result["greedy"] = {"order": order, "accuracy_pct": curve}
        if progress:
            print(f"  greedy: {curve[count // 2]:.2f}% after {count // 2} of {count} blocks removed",
                  file=sys.stderr, flush=True)
    if strategy in ("random", "all"):
        generator = torch.Generator().manual_seed(seed)
        all_orders, curves = [], []
        for i in range(orders):
            order = removal_order(model, "random", generator)
            curves.append(removal_curve(model, order, metric))
            all_orders.append(order)
            if progress:
                print(f"  random order {i + 1}/{orders}: {curves[-1][count // 2]:.2f}% after {count // 2} removed",
                      file=sys.stderr, flush=True)
        columns = [mean_std([c[r] for c in curves]) for r in range(count + 1)]
        result["random"] = {"seed": seed, "orders": all_orders, "accuracy_pct": curves,
                            "mean": [c["mean"] for c in columns], "std": [c["std"] for c in columns]}

    half = count // 2
    summary: dict[str, Any] = {"half_removed_blocks": half}
    if "random" in result:
        mean = result["random"]["mean"]
        ratios = [_half_removed_ratio(c, half) for c in result["random"]["accuracy_pct"]]
        summary["random_half_removed_accuracy_pct"] = mean[half]
        summary["random_half_removed_ratio"] = mean_std([r for r in ratios if r is not None])
        summary["random_removals_until_below_90pct"] = _removals_until(mean, 0.9)
        summary["random_accuracy_after_removals"] = {str(r): mean[r] for r in (1, 2, 3, 5, 10, half) if r <= count}
        summary["random_drop_after_few_removals_pct_points"] = {str(r): mean[0] - mean[r] for r in (1, 2, 3, 5)
                                                                if r <= count}
    if "greedy" in result:
        greedy = result["greedy"]["accuracy_pct"]
        summary["greedy_half_removed_accuracy_pct"] = greedy[half]
        summary["greedy_half_removed_ratio"] = _half_removed_ratio(greedy, half)
        summary["greedy_removals_until_below_90pct"] = _removals_until(greedy, 0.9)
        if "random" in result:
            diffs = [g - r for g, r in zip(greedy, result["random"]["mean"])]
            summary["greedy_minus_random_mean_pct_points"] = sum(diffs[1:]) / max(1, len(diffs) - 1)
            summary["greedy_minus_random_first_half_pct_points"] = sum(diffs[1:half + 1]) / max(1, half)
    result["summary"] = summary
    # the compared curves travel inside prune.json, so `analyze redraw` draws them without --compare
    result["compare"] = [_curves_only(other) for other in compared]

    atomic_write_json(out_dir / PRUNE_FILE, result)
    figure = plot_removal_curves([result, *compared], out_dir / "prune_accuracy.png")

    lines = [f"{run_dir}: {family}, {count} blocks ({result['layers_per_block']} layers each); "
             f"full test accuracy {full:.2f}% (paper's test error for this model: "
             f"{result['paper']['test_error_pct'] if result['paper']['test_error_pct'] is not None else 'n/a'}%)"]
    if result["paper"]["test_error_pct"] is not None and result["paper"]["setting_differences"]:
        lines.append(paper_caveat(result["paper"]["setting_differences"]))
    if "random" in result:
        r = summary["random_half_removed_ratio"]
        lines.append(f"  random ({orders} order{'s' if orders != 1 else ''}), half of the layers removed ({half} blocks): accuracy "
                     f"{summary['random_half_removed_accuracy_pct']:.2f}% = {format_mean_std(r, '.1f', scale=100, unit='%')} "
                     f"of the full model's")
        until = summary["random_removals_until_below_90pct"]
        lines.append(f"  random: mean accuracy first below 90% of the full model's after "
                     f"{until if until is not None else 'never (all ' + str(count) + ')'} removed blocks")
        per = result["layers_per_block"]
        lines.append("  random, mean accuracy drop after a few removals: " + "; ".join(
            f"{int(r) * per} layers −{d:.2f} points" for r, d in summary["random_drop_after_few_removals_pct_points"].items()))
        lines.append(f"  paper: {PAPER_PRUNE_CLAIMS['random_half_removed'] if has_k else PAPER_PRUNE_CLAIMS['residual']}")
    if "greedy" in result:
        lines.append(f"  greedy (smallest k first), half removed: {summary['greedy_half_removed_accuracy_pct']:.2f}% "
                     f"(ratio {100 * summary['greedy_half_removed_ratio']:.1f}%)")
        if "random" in result:
            lines.append(f"  greedy − random mean accuracy, averaged over 1..{count} removals: "
                         f"{summary['greedy_minus_random_mean_pct_points']:+.2f} points "
                         f"(over the first half: {summary['greedy_minus_random_first_half_pct_points']:+.2f})")
        lines.append(f"  paper: {PAPER_PRUNE_CLAIMS['greedy']}")
    lines.append(f"  results: {out_dir / PRUNE_FILE}; figure: {figure}")
    return result, finish_text(out_dir, "prune", lines)
