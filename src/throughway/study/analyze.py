"""`throughway analyze gates|prune|highway|lesion RUN_DIR`: what a finished run's gates learned.

Each command reads RUN_DIR/results.json and RUN_DIR/model.safetensors (or, with checkpoint=True, the
latest checkpoint of a run that has not finished), reloads the run's dataset as its config says
(dataset, train_on_full, limit, data_dir), writes a results JSON, the printed text (<what>.txt) and PNG
figures into RUN_DIR/analysis/ (or `out`), and returns a text that puts the paper's number or claim
beside ours. Figures are drawn from the JSON files by report.analysis_plots, so they can be redrawn
without a model.

* gates   (gated-residual-v2 Table 2, figure 5 left; figure 7 for a gated CIFAR ResNet): k per block,
          mean k, dead gates (k ≤ 0).
* prune   (gated-residual-v2 §3.1, figure 5 right): remove blocks greedily by k and in random orders,
          physically (`analysis.prune`), test accuracy after each removal.
* highway (highway paper §4, figures 2 and 3): transform-gate maps, layers × blocks.
* lesion  (highway paper §4.2, figure 4): training-set error with one layer's gates closed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import torch
from safetensors.torch import load_file

from .._io import atomic_write_json, atomic_write_text, environment_info, read_json, sha256_file
from ..analysis.gates import (highway_layer_change, highway_sample_activations, k_statistics, model_family,
                              projection_blocks, transform_gate_biases, transform_gate_statistics)
from ..analysis.lesion import check_prunable, layers_per_block, lesion, removal_curve, removal_order
from ..data import DataSplits, load_dataset
from ..report.analysis_plots import (plot_class_differences, plot_highway_maps, plot_k_by_block, plot_lesion,
                                     plot_removal_curves)
from ..train import RESULTS_FILE, evaluate, load_model, read_results
from ..models import create_model, with_legacy_config
from ..train.checkpoint import CHECKPOINT_JSON, MODEL_FILE, check_model_config, read_checkpoint_meta
from .runs import command_line, mean_std
from .papers import PAPER_MEAN_K, PAPER_TEST_ERROR

__all__ = ["COMMANDS", "load_run", "redraw", "analyze_gates", "analyze_prune", "analyze_highway", "analyze_lesion",
           "GATES_FILE", "PRUNE_FILE", "HIGHWAY_FILE", "LESION_FILE"]

GATES_FILE, PRUNE_FILE, HIGHWAY_FILE, LESION_FILE = "gates.json", "prune.json", "highway.json", "lesion.json"
COMMANDS = ("gates", "prune", "highway", "lesion", "redraw")

# gated-residual-v2 §3.1 (abstract and figure 5 right), stated as text only: no curve values are given.
PAPER_PRUNE_CLAIMS = {
    "random_half_removed": "a gated residual net (d = 100) retains over 90% of its performance after half of its "
                           "layers have been removed at random",
    "residual": "a residual net suffers a performance decrease after just a few layers are removed",
    "greedy": "greedy removal (smallest k first) is slightly better than random for gated residual nets",
}
# highway paper §4 (figures 2 and 4), MNIST 50-layer net, stated as text only.
PAPER_HIGHWAY_CLAIMS = {
    "biases": "most transform-gate biases decreased further during training (initialised to −2 for MNIST)",
    "change": "most of the change in block outputs happens in the early layers (≈ 15 for MNIST)",
    "sparse": "the transform-gate activity for a single example is very sparse (more so for CIFAR-100 than MNIST)",
    "routing": "for MNIST digits 0 and 7 the class-mean gate activity differs from the overall mean substantially "
               "within the first 15 layers (figure 3)",
    "lesion": "lesioning early layers hurts; many later layers (about 15 to 45) barely matter on MNIST",
}


def _config(model: torch.nn.Module) -> dict[str, Any]:
    return cast(dict, model.config)  # every registered model carries its config (create_model)


def _blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    return cast(torch.nn.ModuleList, model.blocks)


def _out_dir(run_dir: Path, out: str | os.PathLike[str] | None) -> Path:
    return Path(out) if out is not None else run_dir / "analysis"


def _checkpoint_model(run_dir: Path, results: dict[str, Any], device: str) -> tuple[torch.nn.Module, int]:
    """The model weights of the run's latest checkpoint (checked against the SHA-256 that
    checkpoint.json records) in the model that results.json describes, and the epoch they are from."""
    meta = read_checkpoint_meta(run_dir)  # validated: its file name cannot lead outside run_dir
    path = run_dir / meta["file"]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: named by {run_dir / CHECKPOINT_JSON} but missing")
    if sha256_file(path) != meta.get("sha256"):
        raise ValueError(f"{path}: checksum differs from {CHECKPOINT_JSON} (the run may have just written a "
                         f"newer checkpoint: try again)")
    config = with_legacy_config(dict((results.get("model") or {}).get("config") or {}))
    if "name" not in config:
        raise ValueError(f"{run_dir / RESULTS_FILE}: no model.config to rebuild the model from")
    prefix = "model."
    state = {k[len(prefix):]: v for k, v in load_file(str(path)).items() if k.startswith(prefix)}
    # results.json is untrusted too: its model config must fit the checkpoint's tensors before anything is built.
    config = check_model_config(config, {k: tuple(v.shape) for k, v in state.items()}, run_dir / RESULTS_FILE)
    model = create_model(config.pop("name"), **config)
    model.load_state_dict(state)
    return model.to(device).eval(), int(meta["epoch"])


def load_run(run_dir: str | os.PathLike[str], device: str = "cpu",
             checkpoint: bool = False) -> tuple[dict[str, Any], torch.nn.Module]:
    """The run's results.json and its trained model (eval mode). Raises FileNotFoundError naming the
    missing file, and ValueError for a directory that is not a single training run.

    checkpoint=True analyses a run that has not finished: the model comes from its latest checkpoint,
    and the returned results' `final` is {"snapshot": True, "epochs_completed", "test_error_pct"} of
    that epoch (figures then say "after epoch N")."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: run directory not found")
    results = read_results(run_dir)
    if "config" not in results or "model" not in results.get("config", {}):
        raise ValueError(f"{run_dir / RESULTS_FILE}: not a single training run (no config.model); "
                         f"analyze needs the directory of one `throughway train` run")
    model_path = run_dir / MODEL_FILE
    if checkpoint:
        if not (run_dir / CHECKPOINT_JSON).is_file():
            raise FileNotFoundError(f"{run_dir / CHECKPOINT_JSON}: not found; --checkpoint needs a run that is "
                                    f"still training or was interrupted" +
                                    (" (this one has finished: drop --checkpoint)" if model_path.is_file() else ""))
        model, epoch = _checkpoint_model(run_dir, results, device)
        history = results.get("history") or []
        record: dict[str, Any] = next((r for r in history if r.get("epoch") == epoch), {})
        results = {**results, "final": {"snapshot": True, "epochs_completed": epoch,
                                        "test_error_pct": record.get("test_error_pct")}}
        return results, model
    if not model_path.is_file():
        hint = " (it has a checkpoint: add --checkpoint to analyse that)" if (run_dir / CHECKPOINT_JSON).is_file() else ""
        raise FileNotFoundError(f"{model_path}: not found; the run has not finished (model.safetensors is "
                                f"written when training ends){hint}")
    return results, load_model(model_path, device=device)


def _load_data(results: dict[str, Any], device: str, data_dir: str | None) -> DataSplits:
    config = results["config"]
    return load_dataset(config["dataset"], data_dir if data_dir is not None else config.get("data_dir"),
                        train_on_full=bool(config.get("train_on_full")), device=device, limit=config.get("limit"))


def _require_family(model: torch.nn.Module, run_dir: Path, accepted: Sequence[str], command: str) -> str:
    try:
        family = model_family(model)
    except ValueError as exc:
        raise ValueError(f"{run_dir}: `analyze {command}` needs a run of family {list(accepted)}; this run's "
                         f"model {getattr(model, 'config', {}).get('name')!r} is none of them: {exc}") from exc
    if family not in accepted:
        raise ValueError(f"{run_dir}: `analyze {command}` needs a run of family {list(accepted)}, "
                         f"but this run's model is {family!r}")
    return family


def _header(run_dir: Path, results: dict[str, Any], family: str, model: torch.nn.Module) -> dict[str, Any]:
    config = results["config"]
    return {
        "run_dir": str(run_dir),
        "command": command_line(),
        "environment": environment_info(config.get("device")),
        "family": family,
        "model": model.config,
        "depth": config["depth"],
        "dataset": config["dataset"],
        "train_on_full": bool(config.get("train_on_full")),
        "run_final": results.get("final"),
    }


def _accuracy(split: Any) -> Callable[[torch.nn.Module], float]:
    return lambda m: 100.0 - evaluate(m, split)[1]


def _finish_text(out_dir: Path, name: str, lines: list[str]) -> str:
    """The printout, also written to OUT/<name>.txt so the committed results keep it beside the JSON."""
    text = "\n".join(lines)
    atomic_write_text(out_dir / f"{name}.txt", text + "\n")
    return text


def _blocks_1based(indices: Sequence[int]) -> str:
    return ", ".join(str(i + 1) for i in indices) if indices else "none"


# The setting of gated-residual-v2 Tables 1 and 2 (§3.1): width 50, d = 2 .. 100, 100 epochs.
PAPER_TABLE_EPOCHS, PAPER_TABLE_WIDTH = 100, 50


def _paper_setting_differences(results: dict[str, Any], model: torch.nn.Module) -> list[str]:
    """How the run differs from the setting of gated-residual-v2 Tables 1 and 2 (empty when it does not)."""
    config = results["config"]
    depth = int(config["depth"])
    epochs = (results.get("final") or {}).get("epochs_completed") or config.get("epochs")
    width = getattr(model, "config", {}).get("width")
    differences = []
    if depth not in PAPER_MEAN_K:
        differences.append(f"depth {depth} (the tables have d = {', '.join(map(str, sorted(PAPER_MEAN_K)))})")
    if epochs is not None and int(epochs) != PAPER_TABLE_EPOCHS:
        differences.append(f"{int(epochs)} epoch{'s' if int(epochs) != 1 else ''} "
                           f"(the paper trained {PAPER_TABLE_EPOCHS})")
    if width is not None and int(width) != PAPER_TABLE_WIDTH:
        differences.append(f"width {int(width)} (the paper's is {PAPER_TABLE_WIDTH})")
    return differences


def _paper_caveat(differences: Sequence[str]) -> str:
    return ("  caveat: this run differs from the paper's setting: " + "; ".join(differences) +
            ", so the paper's number is a distant reference, not a target") if differences else ""


def analyze_gates(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                  device: str = "cpu", checkpoint: bool = False) -> tuple[dict[str, Any], str]:
    """k per block, mean k and dead gates of a gated residual (or augmented) run, fully connected
    (gated-residual-v2 Table 2, figure 5 left) or convolutional (figure 7); writes gates.json,
    gates.txt and gates_k_by_block.png. Returns (result, text with the paper's numbers beside ours)."""
    run_dir = Path(run_dir)
    results, model = load_run(run_dir, device, checkpoint)
    family = _require_family(model, run_dir, ("gated", "augmented"), "gates")
    stats = k_statistics(model)
    depth = int(results["config"]["depth"])
    name = _config(model).get("name")
    # Table 2's mean k belongs to the fully connected MNIST nets, indexed by d; other models (a CIFAR
    # preact_resnet of depth 20, say) must not pick up the d = 20 entry.
    mnist_table = name == "mlp_gated_residual" and results["config"].get("dataset") == "mnist"
    projections = projection_blocks(model)
    differences = _paper_setting_differences(results, model) if mnist_table else []
    result = {**_header(run_dir, results, family, model), **stats, "projection_blocks": projections,
              "paper": {"k_mean": PAPER_MEAN_K.get(depth) if mnist_table else None,
                        "setting_differences": differences,
                        "figure": "figure 7" if projections else "figure 5 left",
                        "source": "gated-residual-v2 Table 2 (mean k of the MNIST nets by d), figure 5 left "
                                  "(k by block, MNIST d = 100), figure 7 (k by block, Wide Gated ResNet on CIFAR)"}}
    out_dir = _out_dir(run_dir, out)
    atomic_write_json(out_dir / GATES_FILE, result)
    figure = plot_k_by_block(result, out_dir / "gates_k_by_block.png")
    paper = result["paper"]["k_mean"]
    order = sorted(range(len(stats["k"])), key=lambda i: stats["k"][i])
    lines = [
        f"{run_dir}: {family} ({name}), depth {depth}, {stats['num_blocks']} gated blocks",
        f"  mean k: ours {stats['k_mean']:.3f}   paper (Table 2, d = {depth}): "
        f"{paper if paper is not None else 'n/a (Table 2 covers the fully connected MNIST nets, d = 2 .. 100)'}"
        + (f" (d = {depth}, {PAPER_TABLE_EPOCHS} epochs)" if paper is not None else ""),
        f"  k range: {stats['k_min']:.3f} .. {stats['k_max']:.3f}; dead gates (k ≤ 0): {stats['num_dead']}"
        + (f" (blocks {_blocks_1based(stats['dead_blocks'])}, 1-based)" if stats["dead_blocks"] else ""),
        f"  smallest k at blocks (1-based): {_blocks_1based(order[:5])}",
    ]
    if differences:
        lines.insert(2, _paper_caveat(differences))
    if projections:
        lines.append(f"  ours: blocks that change the shape (1-based): {_blocks_1based(projections)}; "
                     f"largest k at block {order[-1] + 1} of {len(order)}")
        lines.append("  paper (figure 7, Wide Gated ResNet (4,10) on CIFAR): the lowest k are at the blocks that "
                     "increase the feature-map dimension (1, 5, 9), the peak at the last block")
    else:
        lines.append("  paper (figure 5 left, d = 100 on MNIST): blocks near the middle have a smaller k than those "
                     "at the beginning or the end")
    lines.append(f"  results: {out_dir / GATES_FILE}; figure: {figure}")
    return result, _finish_text(out_dir, "gates", lines)


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
    only (analysis.lesion.PRUNABLE_MODELS)."""
    if strategy not in ("greedy", "random", "all"):
        raise ValueError(f"strategy={strategy!r}; accepted values: ['greedy', 'random', 'all']")
    if orders < 1:
        raise ValueError(f"orders={orders}: must be ≥ 1")
    run_dir = Path(run_dir)
    compared = []
    for path in compare:
        path = Path(path)
        if path.is_dir():
            path = path / PRUNE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: --compare needs a prune.json written by `analyze prune`")
        compared.append(read_json(path))
    results, model = load_run(run_dir, device, checkpoint)
    family = _require_family(model, run_dir, ("gated", "residual", "augmented"), "prune")
    try:
        check_prunable(model)
    except ValueError as exc:
        raise ValueError(f"{run_dir}: `analyze prune`: {exc}") from exc
    has_k = family in ("gated", "augmented")
    if strategy == "greedy" and not has_k:
        raise ValueError(f"{run_dir}: greedy removal orders blocks by k, and this {family} run has no gates; "
                         f"use --strategy random")
    data = _load_data(results, device, data_dir)
    metric = _accuracy(data.test)
    count = len(_blocks(model))
    result = {**_header(run_dir, results, family, model), "num_blocks": count,
              "layers_per_block": layers_per_block(model), "split": "test", "removal": "physical (analysis.prune)",
              "paper": {"claims": PAPER_PRUNE_CLAIMS,
                        "test_error_pct": PAPER_TEST_ERROR.get(family, {}).get(int(results["config"]["depth"]))
                        if results["config"].get("dataset") == "mnist" else None,
                        "setting_differences": _paper_setting_differences(results, model)
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

    out_dir = _out_dir(run_dir, out)
    atomic_write_json(out_dir / PRUNE_FILE, result)
    figure = plot_removal_curves([result, *compared], out_dir / "prune_accuracy.png")

    lines = [f"{run_dir}: {family}, {count} blocks ({result['layers_per_block']} layers each); "
             f"full test accuracy {full:.2f}% (paper's test error for this model: "
             f"{result['paper']['test_error_pct'] if result['paper']['test_error_pct'] is not None else 'n/a'}%)"]
    if result["paper"]["test_error_pct"] is not None and result["paper"]["setting_differences"]:
        lines.append(_paper_caveat(result["paper"]["setting_differences"]))
    if "random" in result:
        r = summary["random_half_removed_ratio"]
        lines.append(f"  random ({orders} order{'s' if orders != 1 else ''}), half of the layers removed ({half} blocks): accuracy "
                     f"{summary['random_half_removed_accuracy_pct']:.2f}% = {100 * r['mean']:.1f}% ± {100 * r['std']:.1f}% "
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
    return result, _finish_text(out_dir, "prune", lines)


def analyze_highway(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                    classes: Sequence[int] = (0, 7), sample: int | None = None, seed: int = 0,
                    device: str = "cpu", data_dir: str | None = None,
                    checkpoint: bool = False) -> tuple[dict[str, Any], str]:
    """Transform-gate maps of a fully connected highway run over its training split (highway paper
    figures 2 and 3): biases, mean T(x), T(x) and block outputs for one training sample (index
    `sample`, or one drawn from `seed`), class mean minus overall mean for `classes`, and the mean
    change per layer. Writes highway.json, highway.txt, highway_gate_maps.png and highway_class_routing.png."""
    run_dir = Path(run_dir)
    results, model = load_run(run_dir, device, checkpoint)
    family = _require_family(model, run_dir, ("highway",), "highway")
    data = _load_data(results, device, data_dir)
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
    bias_init = _config(model).get("gate_bias")
    share = (change.cumsum(0) / change.sum()).tolist()
    result = {
        **_header(run_dir, results, family, model),
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
    out_dir = _out_dir(run_dir, out)
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
    return result, _finish_text(out_dir, "highway", lines)


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
    results, model = load_run(run_dir, device, checkpoint)
    family = _require_family(model, run_dir, ("highway", "gated", "residual", "augmented"), "lesion")
    data = _load_data(results, device, data_dir)
    part = getattr(data, split)
    if part is None:
        raise ValueError(f"{run_dir}: the run trained on train+validation, so it has no validation split; "
                         f"use split 'train' or 'test'")
    _, base = evaluate(model, part)
    errors = []
    for index in range(len(_blocks(model))):
        with lesion(model, index):
            errors.append(evaluate(model, part)[1])
        if progress and (index + 1) % 10 == 0:
            print(f"  lesioned {index + 1}/{len(_blocks(model))}", file=sys.stderr, flush=True)
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
    result = {**_header(run_dir, results, family, model), "split": split, "num_samples": len(part),
              "unlesioned_error_pct": base, "lesioned_error_pct": errors, "increase_pct_points": increase,
              "summary": summary,
              "paper": {"claim": PAPER_HIGHWAY_CLAIMS["lesion"], "source": "highway paper §4.2, figure 4"}}
    out_dir = _out_dir(run_dir, out)
    atomic_write_json(out_dir / LESION_FILE, result)
    figure = plot_lesion(result, out_dir / "lesion_error_by_layer.png")
    unit = "highway layer" if family == "highway" else "block"
    lines = [
        f"{run_dir}: {family}, {count} {unit}s, {split} split ({len(part)} samples)",
        f"  unlesioned error {base:.2f}%; lesioned: {min(errors):.2f}% .. {max(errors):.2f}%",
        f"  most harmful to lesion ({unit}, 1-based): "
        + ", ".join(f"{i + 1} (+{increase[i]:.2f})" for i in summary["most_harmful_blocks"]),
        f"  {len(barely)} of {count} {unit}s raise the error by < {tolerance_pct_points} point when lesioned",
    ]
    if window:
        w, e = summary["network_layers_15_to_45"], summary["network_layers_before_15"]
        lines.append(f"  network layers 15–45 (highway layers 14–44): mean +{w['mean_increase_pct_points']:.2f} points, "
                     f"max +{w['max_increase_pct_points']:.2f}; {w['num_barely_matter']}/{w['num_layers']} barely matter; "
                     f"layers 2–14: mean +{e['mean_increase_pct_points']:.2f} points")
    if family == "highway":
        lines.append(f"  paper (highway §4.2, figure 4, 50-layer highway net on MNIST): {PAPER_HIGHWAY_CLAIMS['lesion']}")
    else:
        lines.append(f"  for comparison only: the highway paper (§4.2, figure 4) lesions a 50-layer highway net on MNIST: "
                     f"{PAPER_HIGHWAY_CLAIMS['lesion']}; the gated residual papers report no lesioning")
    lines.append(f"  results: {out_dir / LESION_FILE}; figure: {figure}")
    return result, _finish_text(out_dir, "lesion", lines)


def redraw(out: str | os.PathLike[str], compare: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """Redraw every figure of an analysis folder from its JSON files alone (no model, no data):
    gates.json, prune.json, highway.json, lesion.json.

    The prune figure keeps the curves it was drawn with (`analyze prune --compare`, stored in
    prune.json); `compare` names prune.json files (or folders holding one) to draw instead of them.
    Returns the figures written; raises FileNotFoundError when the folder holds none of the files."""
    out = Path(out)
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
