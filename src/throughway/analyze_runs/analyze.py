"""`throughway analyze gates|prune|highway|lesion RUN_DIR`: what a finished run's gates learned.

Each command reads RUN_DIR/results.json and RUN_DIR/model.safetensors (or, with checkpoint=True, the
latest checkpoint of a run that has not finished), reloads the run's dataset as its config says
(dataset, train_on_full, limit; the data folder is --data-dir, $THROUGHWAY_DATA or the default cache,
never the run's own file), writes a results JSON, the printed text (<what>.txt) and PNG
figures into RUN_DIR/analysis/ (or `out`), and returns a text that puts the paper's number or claim
beside ours. Figures are drawn from the JSON files by report.analysis_plots, so they can be redrawn
without a model. What the commands share (loading the run, its data, the result header) is in
analyze_runs.run_files.

* gates   (gated-residual-v2 Table 2, figure 5 left; figure 7 for a gated CIFAR ResNet): k per block,
          mean k, dead gates (k ≤ 0).
* prune   (gated-residual-v2 §3.1, figure 5 right): remove blocks greedily by k and in random orders,
          physically (`analysis.prune`), test accuracy after each removal (analyze_runs.prune).
* highway (highway paper §4, figures 2 and 3): transform-gate maps, layers × blocks.
* lesion  (highway paper §4.2, figure 4): training-set error with one layer's gates closed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from .._io import atomic_write_json, read_json
from ..analysis.gates import (highway_layer_change, highway_sample_activations, k_statistics, projection_blocks,
                              transform_gate_biases, transform_gate_statistics)
from ..analysis.removal import lesion
from ..report.analysis_plots import (plot_class_differences, plot_highway_maps, plot_k_by_block, plot_lesion,
                                     plot_removal_curves)
from ..train import evaluate
from .run_files import (GATES_FILE, HIGHWAY_FILE, LESION_FILE, PAPER_TABLE_EPOCHS, PRUNE_FILE, run_blocks,
                            block_names_of, run_config, finish_text, analysis_header, load_run_data, analysis_dir, refuse_linked_output, paper_caveat,
                            paper_setting_differences, require_family, load_run)
from .prune import analyze_prune
from ..study.papers import PAPER_MEAN_K

__all__ = ["COMMANDS", "load_run", "redraw", "analyze_gates", "analyze_prune", "analyze_highway", "analyze_lesion",
           "GATES_FILE", "PRUNE_FILE", "HIGHWAY_FILE", "LESION_FILE"]

COMMANDS = ("gates", "prune", "highway", "lesion", "bn-stats", "redraw")

# highway paper §4 (figures 2 and 4), MNIST 50-layer net, stated as text only.
PAPER_HIGHWAY_CLAIMS = {
    "biases": "most transform-gate biases decreased further during training (initialised to −2 for MNIST)",
    "change": "most of the change in block outputs happens in the early layers (≈ 15 for MNIST)",
    "sparse": "the transform-gate activity for a single example is very sparse (more so for CIFAR-100 than MNIST)",
    "routing": "for MNIST digits 0 and 7 the class-mean gate activity differs from the overall mean substantially "
               "within the first 15 layers (figure 3)",
    "lesion": "lesioning early layers hurts; many later layers (about 15 to 45) barely matter on MNIST",
}


def analyze_gates(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                  device: str = "cpu", checkpoint: bool = False) -> tuple[dict[str, Any], str]:
    """k per block, mean k and dead gates of a gated residual (or augmented) run, fully connected
    (gated-residual-v2 Table 2, figure 5 left) or convolutional (figure 7); writes gates.json,
    gates.txt and gates_k_by_block.png. Returns (result, text with the paper's numbers beside ours)."""
    run_dir = Path(run_dir)
    out_dir = analysis_dir(run_dir, out)  # checked before the run is read
    results, model = load_run(run_dir, device, checkpoint)
    family = require_family(model, run_dir, ("gated", "augmented"), "gates")
    stats = k_statistics(model)
    depth = int(results["config"]["depth"])
    name = run_config(model).get("name")
    # Table 2's mean k belongs to the fully connected MNIST nets, indexed by d; other models (a CIFAR
    # preact_resnet of depth 20, say) must not pick up the d = 20 entry.
    mnist_table = name == "mlp_gated_residual" and results["config"].get("dataset") == "mnist"
    projections = projection_blocks(model)
    differences = paper_setting_differences(results, model) if mnist_table else []
    result = {**analysis_header(run_dir, results, family, model), **stats, "projection_blocks": projections,
              "paper": {"k_mean": PAPER_MEAN_K.get(depth) if mnist_table else None,
                        "setting_differences": differences,
                        "figure": "figure 7" if projections else "figure 5 left",
                        "source": "gated-residual-v2 Table 2 (mean k of the MNIST nets by d), figure 5 left "
                                  "(k by block, MNIST d = 100), figure 7 (k by block, Wide Gated ResNet on CIFAR)"}}
    atomic_write_json(out_dir / GATES_FILE, result)
    figure = plot_k_by_block(result, out_dir / "gates_k_by_block.png")
    paper = result["paper"]["k_mean"]
    order = sorted(range(len(stats["k"])), key=lambda i: stats["k"][i])
    lines = [
        f"{run_dir}: {family} ({name}), depth {depth}, {stats['num_blocks']} gated blocks",
        f"  mean k: ours {stats['k_mean']:.3f}   paper (Table 2, d = {depth}): "
        f"{paper if paper is not None else 'n/a (Table 2 covers the fully connected MNIST nets, d = 2 .. 100)'}"
        + (f" (d = {depth}, {PAPER_TABLE_EPOCHS} epochs)" if paper is not None else ""),
        f"  k range: {stats['k_min']:.3f} .. {stats['k_max']:.3f}; dead gates (g(k) = 0): {stats['num_dead']}"
        + (f" ({block_names_of(model, stats['dead_blocks'])})" if stats["dead_blocks"] else "")
        + (f"; negative g(k): {block_names_of(model, stats['negative_blocks'])}" if stats["negative_blocks"] else ""),
        f"  smallest k at: {block_names_of(model, order[:5])}",
    ]
    if differences:
        lines.insert(2, paper_caveat(differences))
    if projections:
        lines.append(f"  ours: blocks that change the shape: {block_names_of(model, projections)}; "
                     f"largest k at {block_names_of(model, order[-1:])} (block {order[-1] + 1} of {len(order)})")
        lines.append("  paper (figure 7, Wide Gated ResNet (4,10) on CIFAR): the lowest k are at the blocks that "
                     "increase the feature-map dimension (1, 5, 9, counted from 1), the peak at the last block")
    else:
        lines.append("  paper (figure 5 left, d = 100 on MNIST): blocks near the middle have a smaller k than those "
                     "at the beginning or the end")
    lines.append(f"  results: {out_dir / GATES_FILE}; figure: {figure}")
    return result, finish_text(out_dir, "gates", lines)


def analyze_highway(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                    classes: Sequence[int] = (0, 7), sample: int | None = None, seed: int = 0,
                    device: str = "cpu", data_dir: str | None = None,
                    checkpoint: bool = False) -> tuple[dict[str, Any], str]:
    """Transform-gate maps of a fully connected highway run over its training split (highway paper
    figures 2 and 3): biases, mean T(x), T(x) and block outputs for one training sample (index
    `sample`, or one drawn from `seed`), class mean minus overall mean for `classes`, and the mean
    change per layer. Writes highway.json, highway.txt, highway_gate_maps.png and highway_class_routing.png."""
    run_dir = Path(run_dir)
    out_dir = analysis_dir(run_dir, out)  # checked before the run is read
    results, model = load_run(run_dir, device, checkpoint)
    family = require_family(model, run_dir, ("highway",), "highway")
    data = load_run_data(results, device, data_dir)
    x, y = data.train.x, data.train.y
    for label in classes:
        if not 0 <= label < data.num_classes:
            raise ValueError(f"classes: {label} is not a class of {data.name}; accepted values 0 .. {data.num_classes - 1}")
    if sample is None:
        sample = int(torch.randint(len(x), (1,), generator=torch.Generator().manual_seed(seed)))
    if not 0 <= sample < len(x):
        raise ValueError(f"sample={sample}: accepted values 0 .. {len(x) - 1} (training split)")
    biases = transform_gate_biases(model)
    stats = transform_gate_statistics(model, x, y, data.num_classes)
    gates, outputs = highway_sample_activations(model, x[sample])
    change = highway_layer_change(model, x)
    bias_init = run_config(model).get("gate_bias")
    share = (change.cumsum(0) / change.sum()).tolist()
    result = {
        **analysis_header(run_dir, results, family, model),
        "num_layers": int(biases.shape[0]), "num_blocks": int(biases.shape[1]), "gate_bias_init": bias_init,
        "mean_over": f"the training split ({len(x)} samples)",
        "biases": biases.tolist(),
        "mean_gate": stats.mean.tolist(),
        "sample": {"index": sample, "label": int(y[sample]), "gates": gates.tolist(), "outputs": outputs.tolist()},
        "class_differences": {str(c): stats.class_difference(c).tolist() for c in classes},
        "class_counts": stats.counts.tolist(),
        "layer_change": change.tolist(),
        "layer_change_cumulative_share": share,
        "summary": {
            "bias_mean": float(biases.mean()),
            "bias_fraction_below_init": float((biases < bias_init).float().mean()) if bias_init is not None else None,
            "mean_gate_overall": float(stats.mean.mean()),
            "mean_gate_by_layer": stats.mean.mean(dim=1).tolist(),
            "sample_gate_fraction_above_half": float((gates > 0.5).float().mean()),
            "change_share_first_15_layers": share[min(14, len(share) - 1)],
            # Where the class-conditional routing happens: the share of Σ|class mean − overall mean|
            # that falls in the first 15 highway layers (15 / layers if it were spread evenly).
            "class_difference_share_first_15_layers": {
                str(c): float(d[:15].abs().sum() / d.abs().sum()) if float(d.abs().sum()) > 0 else None
                for c, d in ((c, stats.class_difference(c)) for c in classes)},
            "even_share_first_15_layers": min(15, int(biases.shape[0])) / int(biases.shape[0]),
        },
        "paper": {"claims": PAPER_HIGHWAY_CLAIMS, "source": "highway paper §4, figures 2 and 3"},
    }
    atomic_write_json(out_dir / HIGHWAY_FILE, result)
    maps = plot_highway_maps(result, out_dir / "highway_gate_maps.png")
    routing = plot_class_differences(result, out_dir / "highway_class_routing.png")
    s = result["summary"]
    lines = [
        f"{run_dir}: highway, {result['num_layers']} highway layers × {result['num_blocks']} blocks, {data.name}",
        f"  transform-gate biases: mean {s['bias_mean']:.3f} (initialised to {bias_init}); "
        f"{100 * s['bias_fraction_below_init']:.1f}% below their initial value" if bias_init is not None else
        f"  transform-gate biases: mean {s['bias_mean']:.3f}",
        f"  paper: {PAPER_HIGHWAY_CLAIMS['biases']}",
        f"  mean T(x) over the training split: {s['mean_gate_overall']:.3f}; one sample (#{sample}): "
        f"{100 * s['sample_gate_fraction_above_half']:.1f}% of its gates above 0.5",
        f"  paper: {PAPER_HIGHWAY_CLAIMS['sparse']}",
        f"  share of the total change |y − x| made by the first 15 highway layers: "
        f"{100 * s['change_share_first_15_layers']:.1f}% (an even spread would give "
        f"{100 * s['even_share_first_15_layers']:.1f}%)",
        f"  paper: {PAPER_HIGHWAY_CLAIMS['change']}",
        "  share of |class mean T(x) − overall mean| in the first 15 highway layers: " + "; ".join(
            f"class {c}: " + (f"{100 * v:.1f}%" if v is not None else "n/a")
            for c, v in s["class_difference_share_first_15_layers"].items()),
        f"  paper: {PAPER_HIGHWAY_CLAIMS['routing']}",
        f"  results: {out_dir / HIGHWAY_FILE}; figures: {maps}, {routing}",
    ]
    return result, finish_text(out_dir, "highway", lines)


def analyze_lesion(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                   split: str = "train", device: str = "cpu", data_dir: str | None = None,
                   tolerance_pct_points: float = 1.0, progress: bool = True,
                   checkpoint: bool = False) -> tuple[dict[str, Any], str]:
    """Error on `split` (default the training split, as the paper) with each block lesioned in turn
    (highway: T = 0; gated residual: g(k) = 0; ungated residual: branch dropped), beside the
    unlesioned error (highway paper figure 4). Writes lesion.json, lesion.txt and lesion_error_by_layer.png.
    `tolerance_pct_points`: a layer "barely matters" when lesioning it raises the error by less."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split={split!r}; accepted values: ['train', 'val', 'test']")
    run_dir = Path(run_dir)
    out_dir = analysis_dir(run_dir, out)  # checked before the run is read
    results, model = load_run(run_dir, device, checkpoint)
    family = require_family(model, run_dir, ("highway", "gated", "residual", "augmented"), "lesion")
    data = load_run_data(results, device, data_dir)
    part = getattr(data, split)
    if part is None:
        raise ValueError(f"{run_dir}: the run trained on train+validation, so it has no validation split; "
                         f"use split 'train' or 'test'")
    _, base = evaluate(model, part)
    errors = []
    for index in range(len(run_blocks(model))):
        with lesion(model, index):
            errors.append(evaluate(model, part)[1])
        if progress and (index + 1) % 10 == 0:
            print(f"  lesioned {index + 1}/{len(run_blocks(model))}", file=sys.stderr, flush=True)
    increase = [e - base for e in errors]
    barely = [i for i, d in enumerate(increase) if d < tolerance_pct_points]
    count = len(errors)
    # The paper's "15 to 45" counts the network's layers; the plain first layer is layer 1, so highway
    # layer i (1-based) is network layer i + 1. Reported for highway runs only.
    window = [i for i in range(count) if 15 <= i + 2 <= 45] if family == "highway" else []
    summary: dict[str, Any] = {
        "unlesioned_error_pct": base,
        "max_increase_pct_points": max(increase),
        "most_harmful_blocks": sorted(range(count), key=lambda i: -increase[i])[:5],
        "barely_matter_blocks": barely,
        "num_barely_matter": len(barely),
        "tolerance_pct_points": tolerance_pct_points,
    }
    if window:
        summary["network_layers_15_to_45"] = {
            "mean_increase_pct_points": sum(increase[i] for i in window) / len(window),
            "max_increase_pct_points": max(increase[i] for i in window),
            "num_barely_matter": sum(1 for i in window if increase[i] < tolerance_pct_points),
            "num_layers": len(window),
        }
        early = [i for i in range(count) if i + 2 < 15]
        summary["network_layers_before_15"] = {
            "mean_increase_pct_points": sum(increase[i] for i in early) / max(1, len(early)),
            "num_barely_matter": sum(1 for i in early if increase[i] < tolerance_pct_points),
            "num_layers": len(early),
        }
    result = {**analysis_header(run_dir, results, family, model), "split": split, "num_samples": len(part),
              "unlesioned_error_pct": base, "lesioned_error_pct": errors, "increase_pct_points": increase,
              "summary": summary,
              "paper": {"claim": PAPER_HIGHWAY_CLAIMS["lesion"], "source": "highway paper §4.2, figure 4"}}
    atomic_write_json(out_dir / LESION_FILE, result)
    figure = plot_lesion(result, out_dir / "lesion_error_by_layer.png")
    unit = "highway layer" if family == "highway" else "block"
    lines = [
        f"{run_dir}: {family}, {count} {unit}s, {split} split ({len(part)} samples)",
        f"  unlesioned error {base:.2f}%; lesioned: {min(errors):.2f}% .. {max(errors):.2f}%",
        "  most harmful to lesion: "
        + ", ".join(f"{block_names_of(model, [i])} (+{increase[i]:.2f})" for i in summary["most_harmful_blocks"]),
        f"  {len(barely)} of {count} {unit}s raise the error by < {tolerance_pct_points} point when lesioned",
    ]
    if window:
        w, e = summary["network_layers_15_to_45"], summary["network_layers_before_15"]
        lines.append(f"  network layers 15–45 ({block_names_of(model, window[:1])} .. {block_names_of(model, window[-1:])}): "
                     f"mean +{w['mean_increase_pct_points']:.2f} points, "
                     f"max +{w['max_increase_pct_points']:.2f}; {w['num_barely_matter']}/{w['num_layers']} barely matter; "
                     f"layers 2–14: mean +{e['mean_increase_pct_points']:.2f} points")
    if family == "highway":
        lines.append(f"  paper (highway §4.2, figure 4, 50-layer highway net on MNIST): {PAPER_HIGHWAY_CLAIMS['lesion']}")
    else:
        lines.append(f"  for comparison only: the highway paper (§4.2, figure 4) lesions a 50-layer highway net on MNIST: "
                     f"{PAPER_HIGHWAY_CLAIMS['lesion']}; the gated residual papers report no lesioning")
    lines.append(f"  results: {out_dir / LESION_FILE}; figure: {figure}")
    return result, finish_text(out_dir, "lesion", lines)


def redraw(out: str | os.PathLike[str], compare: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """Redraw every figure of an analysis folder from its JSON files alone (no model, no data):
    gates.json, prune.json, highway.json, lesion.json.

    The prune figure keeps the curves it was drawn with (`analyze prune --compare`, stored in
    prune.json); `compare` names prune.json files (or folders holding one) to draw instead of them.
    Returns the figures written; raises FileNotFoundError when the folder holds none of the files, and
    ValueError naming it when the folder is a symbolic link (nothing is read back or written through one)."""
    out = Path(out)
    refuse_linked_output(out, "the analysis folder")
    written: list[Path] = []
    if (out / GATES_FILE).is_file():
        written.append(plot_k_by_block(read_json(out / GATES_FILE), out / "gates_k_by_block.png"))
    if (out / PRUNE_FILE).is_file():
        result = read_json(out / PRUNE_FILE)
        if compare:
            others = [read_json(Path(p) / PRUNE_FILE if Path(p).is_dir() else Path(p)) for p in compare]
        else:
            others = list(result.get("compare") or [])
        written.append(plot_removal_curves([result, *others], out / "prune_accuracy.png"))
    if (out / HIGHWAY_FILE).is_file():
        result = read_json(out / HIGHWAY_FILE)
        written.append(plot_highway_maps(result, out / "highway_gate_maps.png"))
        written.append(plot_class_differences(result, out / "highway_class_routing.png"))
    if (out / LESION_FILE).is_file():
        written.append(plot_lesion(read_json(out / LESION_FILE), out / "lesion_error_by_layer.png"))
    if not written:
        raise FileNotFoundError(f"{out}: holds none of {[GATES_FILE, PRUNE_FILE, HIGHWAY_FILE, LESION_FILE]}")
    return written
