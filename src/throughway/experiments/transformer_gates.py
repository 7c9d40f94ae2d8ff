"""The 2017 gate in a transformer (ours: none of the papers trains one): a small vision transformer over
MNIST patches, ungated pre-norm against relu(k)-gated (gated-residual-v2's gate put into both branches
of every layer by `add_gates`), ReZero's α and LayerScale's λ.

The model is `vit_patch` (models.vit): 16 patches of 7 × 7 pixels, width 32, 4 heads, torch's
`nn.TransformerEncoderLayer` (pre-norm, GELU, feed-forward width 64, no dropout), LayerNorm, mean
over tokens, linear. The families differ only in the gate at the end of each residual branch:

* prenorm: u = x + f(x) (no gate);
* gated: u = x + relu(k)·f(x), k = 1 at first (gated-residual-v2 §2.2; the same function as prenorm
  at initialisation);
* rezero: u = x + α·f(x), α = 0 at first (ReZero's gate; the pre-norm LayerNorm is kept: ours);
* layerscale: u = x + diag(λ)·f(x), λ = CaiT's ε for the number of layers (0.1 up to 18 layers).

One recipe for all: `gresnet-mnist` (NAdam, lr 0.002, batch 128, no schedule, no weight decay), the
gated residual paper's MNIST recipe, so that these nets train as the paper's MLPs did and as the
gate-family study's; no warm-up (ours: a transformer recipe would usually warm up, which would hide
what the gate does at the start). By default each run trains on the first 10,000 training images
and evaluates on 10,000 validation and all 10,000 test images (`limit`), so that the whole study fits
about 90 minutes on 2 CPU cores (`--estimate`).

Writes, in the output folder: runs/<family>-L<layers>-s<seed>/ (one run directory each), results.json
(the summary), removal.json (layer-removal curves of the gated families), table.md (error, paired
tests, gates, removal), findings.md (the sentences the docs page shows, `findings_markdown`) and
transformer_gates.png (error by depth, removal curves: report.transformer_gates_plots).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write_text, read_json
from ..layers import find_branches
from ..models import create_model
from ..analysis.blocks import gate_value
from ..report.stats import CORRECTION, NO_DIFFERENCE, SIGNIFICANCE, TOO_FEW, format_interval, format_mean_std, mean_std
from ..study.options import add_options, check_known, option, quick_config, MAX_SEEDS
from ..study.options import config_from_args as study_config_from_args
from ..study.shards import merge_option, shard_option
from ..study.runs import (RunSpec, StudySummary, check_study_folder, json_config, read_runs, rebuild_from_runs,
                          run_many, run_status)
from ..train import RESULTS_FILE, RunConfig, load_model
from ..report.tables import table_header
from .gate_family_report import (MIN_SEEDS, REMOVAL_FILE, difference_text, gated_comparisons, judge, paired_cells,
                                 paired_columns, removal_baseline, removal_comparisons, update_removal)

__all__ = ["NAME", "DESCRIPTION", "FAMILIES", "Config", "QUICK", "run_name", "specs", "summarize", "table_markdown",
           "findings_markdown", "orders_prose", "report_markdown", "write_report", "run", "estimate", "estimate_text",
           "add_arguments", "config_from_args"]

NAME = "transformer-gates"
DESCRIPTION = ("ours: the 2017 gate in a transformer: a small pre-norm ViT on MNIST patches, ungated, relu(k)-gated "
               "(add_gates), ReZero and LayerScale, by depth")

# family -> the `gate` argument of vit_patch
FAMILIES: dict[str, str] = {"prenorm": "none", "gated": "relu", "rezero": "rezero", "layerscale": "layerscale"}
GATE_SYMBOL = {"gated": "k", "rezero": "α", "layerscale": "|λ|"}
REMOVAL_ORDERS = 3


@dataclass(frozen=True)
class Config:
    """The study's settings (ours; see the module docstring for why)."""

    depths: tuple[int, ...] = option((1, 2, 4), "transformer layers (two gated branches each), shallowest first",
                                     quick=(1, 4), minimum=1)
    families: tuple[str, ...] = option(tuple(FAMILIES), "families to train", choices=tuple(FAMILIES))
    epochs: int = option(6, "epochs per run", quick=1, minimum=1)
    seeds: int = option(5, "seeds per cell: mean ± std and paired tests of gated against each family", quick=1,
                        minimum=1, maximum=MAX_SEEDS)
    width: int = option(32, "channels per token", quick=8, minimum=1)
    limit: int | None = option(10000, "keep only the first N images of each split (train, validation, test)",
                               quick=64, minimum=2)
    recipe: str = option("gresnet-mnist", "training recipe (NAdam, lr 0.002, batch 128)", cli=False)
    shard: str = shard_option()
    merge: bool = merge_option()
    device: str = "cpu"
    data_dir: str | None = None
    quick: bool = option(False, "made by --quick", quick=True, cli=False)

    def __post_init__(self) -> None:
        check_known("families", self.families, FAMILIES)
        if not self.depths or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in self.depths):
            raise ValueError(f"depths={self.depths!r}: expected one or more layer counts >= 1")


QUICK = quick_config(Config)


def run_name(family: str, depth: int, seed: int) -> str:
    """The folder name of one run: <family>-L<layers>-s<seed>."""
    return f"{family}-L{depth}-s{seed}"


def specs(config: Config) -> list[RunSpec]:
    """One RunSpec per (depth, family, seed), shallowest depth first, so that a study stopped early
    leaves whole depths finished."""
    return [RunSpec(run_name(family, depth, seed), RunConfig(
        model="vit_patch", depth=depth, dataset="mnist", recipe=config.recipe, epochs=config.epochs, seed=seed,
        device=config.device, limit=config.limit, data_dir=config.data_dir,
        model_kwargs={"width": config.width, "gate": FAMILIES[family]}))
        for depth in sorted(config.depths) for family in config.families for seed in range(config.seeds)]


def _gate_record(model: torch.nn.Module, family: str) -> dict[str, Any]:
    """One net's gates at the end, per branch (two per layer): the mean (k or α; |λ| over channels for
    LayerScale), the dead branches (relu gate with k ≤ 0: an exact identity) and the negative ones
    (identity gate below 0 in every entry: a sign flip, not a closed branch)."""
    gates = {name: ref.gate for name, ref in find_branches(model).items() if ref.gate is not None}
    values = [gate_value(g) for g in gates.values()]
    raw = [float(torch.as_tensor(g.k).detach().double().mean()) if family != "layerscale"
           else float(gate_value(g).abs().mean()) for g in gates.values()]
    return {"branches": list(gates), "per_branch": raw, "mean": sum(raw) / len(raw),
            "dead": sum(1 for v in values if bool((v == 0).all())) if family == "gated" else None,
            "negative": sum(1 for v in values if bool((v < 0).all())) if family != "gated" else None,
            "count": len(values)}


def _selected(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The test error at the epoch of lowest validation error (the earliest of tied epochs), the
    number this study compares: with a constant learning rate and 10,000 images the last epoch's
    test error swings by several points from one epoch to the next."""
    scored = [(h["val_error_pct"], i) for i, h in enumerate(history) if h.get("val_error_pct") is not None]
    if not scored:
        return {"test_error_pct": history[-1]["test_error_pct"], "selected_epoch": len(history), "val_error_pct": None}
    val, index = min(scored)
    return {"test_error_pct": history[index]["test_error_pct"], "selected_epoch": index + 1, "val_error_pct": val}


def summarize(config: Config, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Every run's results.json under `out`/runs collected into the summary: per cell (family, depth)
    the test error at the epoch of lowest validation error (`_selected`; mean ± std over the finished
    seeds, each seed's numbers) and the last epoch's, the gates
    at the end (`_gate_record`, from each run's model.safetensors) and the removal records
    (removal.json); `comparisons` holds per depth the paired t-test of gated − each other family
    (gate_family_report.gated_comparisons), `removal_tests` the paired test of smallest-|gate|-first
    against random removal; each list one family of tests (gate_family_report.judge: its Holm-corrected
    p "p_corrected" and the verdict drawn from it)."""
    out = Path(out)
    removal_path = out / REMOVAL_FILE
    removal = read_json(removal_path) if removal_path.is_file() else {}
    cells = []
    for depth in sorted(config.depths):
        for family in config.families:
            per_seed, status, gates, removals = [], [], [], []
            names = [run_name(family, depth, seed) for seed in range(config.seeds)]
            for seed, (name, result) in enumerate(read_runs(out / "runs", names)):
                status.append(run_status(name, result, diverged_at=False))  # its summaries never recorded it
                if result is None:
                    continue
                final = result.get("final")
                if final is None:
                    continue
                per_seed.append({"seed": seed, **_selected(result["history"]),
                                 "last_epoch_test_error_pct": final["test_error_pct"]})
                model_path = out / "runs" / name / "model.safetensors"
                if family in GATE_SYMBOL and model_path.is_file():
                    gates.append({"seed": seed, **_gate_record(load_model(model_path), family)})
                if name in removal:
                    removals.append({"seed": seed, **removal[name]})
            cells.append({"family": family, "depth": depth, "gate": FAMILIES[family],
                          "test_error_pct": mean_std([r["test_error_pct"] for r in per_seed]),
                          "last_epoch_test_error_pct": mean_std([r["last_epoch_test_error_pct"] for r in per_seed]),
                          "per_seed": per_seed, "runs": status, "gates": gates, "removal": removals})
    summary: dict[str, Any] = {"experiment": NAME, "config": asdict(config), "cells": cells}
    summary["config"]["depths"] = sorted(config.depths)
    comparisons = judge([row for other in config.families if other != "gated" and "gated" in config.families
                         for row in gated_comparisons(summary, other)])
    removal_tests = judge([row for row in removal_comparisons(summary) if row["family"] in GATE_SYMBOL])
    summary["comparisons"], summary["removal_tests"] = comparisons, removal_tests
    return summary


def _mean_std(stat: dict[str, Any]) -> str:
    return format_mean_std(stat, count=True, empty="pending")


def table_markdown(summary: dict[str, Any]) -> str:
    """The tables: test error by layers and family; the paired tests of gated against each family;
    the gates at the end; the share of accuracy kept with half the layers removed, gate order against
    random removal, with its paired tests. Each test with its 95% interval, p uncorrected and
    Holm-corrected over the tests of its table, the difference it could detect with 80% power and the
    verdict at the corrected p."""
    families = summary["config"]["families"]
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    lines = ["Test error (%) at the epoch of lowest validation error (earliest of ties), mean ± std over seeds", "",
             *table_header(["layers", *families])]
    for depth in summary["config"]["depths"]:
        lines.append(f"| {depth} | " + " | ".join(_mean_std(by[(f, depth)]["test_error_pct"]) for f in families) + " |")
    lines += ["", "Test error (%) at the last epoch, mean ± std over seeds (noisier: the learning rate is constant)", "",
              *table_header(["layers", *families])]
    for depth in summary["config"]["depths"]:
        lines.append(f"| {depth} | " + " | ".join(_mean_std(by[(f, depth)].get("last_epoch_test_error_pct", {"n": 0}))
                                                  for f in families) + " |")
    lines += ["", "Paired t-test (two-sided) over seeds, gated − other, validation-selected test error in points: the "
              f"mean difference, its 95% interval, p uncorrected and {CORRECTION}-corrected over this table's tests, "
              f"the difference the test detects with 80% power; a verdict only with n ≥ {MIN_SEEDS} and "
              f"{CORRECTION}-corrected p < {SIGNIFICANCE}", "",
              *table_header(["layers", "other", "n", *paired_columns("gated − other")])]
    for row in summary.get("comparisons", []):
        lines.append(f"| {row['depth']} | {row['b']} | {len(row['seeds'])} | " + " | ".join(paired_cells(row)) + " |")
    gated = [f for f in families if f in GATE_SYMBOL]
    lines += ["", "Gates at the end, per branch (two per layer): mean over seeds of each net's mean gate; dead = relu "
              "gate with k ≤ 0 (an exact identity), negative = identity gate below 0", "",
              *table_header(["layers", *(f"{f} (mean {GATE_SYMBOL[f]})".replace("|λ|", "\\|λ\\|") for f in gated)])]
    for depth in summary["config"]["depths"]:
        cells = []
        for family in gated:
            gates = by[(family, depth)]["gates"]
            if not gates:
                cells.append("pending")
                continue
            stat = mean_std([g["mean"] for g in gates])
            total = sum(g["count"] for g in gates)
            extra = (f"dead {sum(g['dead'] for g in gates)}/{total}" if family == "gated"
                     else f"negative {sum(g['negative'] for g in gates)}/{total}")
            cells.append(f"{format_mean_std(stat, '.3g', '.2g')} ({extra})")
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    lines += ["", "Share of test accuracy kept with half the layers removed: smallest |gate| first / random removal "
              f"(mean over seeds); the paired test of the two, {CORRECTION} over this table's tests. "
              + removal_baseline(summary, "epoch of lowest validation error", "layers"), "",
              *table_header(["layers", "family", "n", "gate order", "random", *paired_columns("gate − random")])]
    for row in summary.get("removal_tests", []):
        cell = by[(row["family"], row["depth"])]
        greedy = mean_std([r["half_share_greedy"] for r in cell["removal"]])
        random = mean_std([r["half_share_random"] for r in cell["removal"]])
        lines.append(f"| {row['depth']} | {row['family']} | {len(row['seeds'])} | {greedy['mean']:.3f} | "
                     f"{random['mean']:.3f} | " + " | ".join(paired_cells(row, "+.2f", -100.0, 2)) + " |")
    return "\n".join(lines) + "\n"


def _layers(depth: int) -> str:
    return f"{depth} layer" + ("" if depth == 1 else "s")


def findings_markdown(summary: dict[str, Any]) -> str:
    """The findings in words, exactly as the tests support them: per depth the family with the lowest
    mean error and the paired tests of gated against each family (significant after Holm, significant
    only uncorrected, or "no difference detected" with their 95% intervals), the dead gates, and the
    removal tests at their Holm-corrected p. What `throughway report` writes as findings.md and the docs
    page shows."""
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    lines = []
    for depth in summary["config"]["depths"]:
        finished = {f: by[(f, depth)]["test_error_pct"] for f in summary["config"]["families"]
                    if by[(f, depth)]["test_error_pct"]["n"]}
        if not finished:
            lines.append(f"- {_layers(depth)}: pending.")
            continue
        best = min(finished, key=lambda f: finished[f]["mean"])
        tests = [r for r in summary.get("comparisons", []) if r["depth"] == depth and r.get("p_corrected") is not None]
        significant = [r for r in tests if r["verdict"] not in (NO_DIFFERENCE, TOO_FEW)]
        uncorrected = [r for r in tests if r not in significant and r["test"]["p_value"] < SIGNIFICANCE]
        quiet = [r for r in tests if r not in significant and r not in uncorrected]
        parts = [f"{r['verdict']} ({difference_text(r)})" for r in significant]
        parts += [f"against {r['b']} {NO_DIFFERENCE} after {CORRECTION}, significant only uncorrected "
                  f"({difference_text(r)})" for r in uncorrected]
        if quiet:
            parts.append(f"{NO_DIFFERENCE} against " + ", ".join(
                f"{r['b']} (95% CI {format_interval(r['test']['ci_low'], r['test']['ci_high'])})" for r in quiet))
        seeds = min(v["n"] for v in finished.values())
        lines.append(f"- {_layers(depth)}: lowest mean test error (validation-selected epoch) {best} "
                     f"({format_mean_std(finished[best])}%, n={finished[best]['n']}); "
                     + (f"too few seeds for a verdict (n = {seeds})" if seeds < MIN_SEEDS else
                        f"gated against each family (paired, gated − other in points, {CORRECTION} over the "
                        f"{sum(1 for r in summary.get('comparisons', []) if r.get('p_corrected') is not None)} "
                        f"tests): " + "; ".join(parts)) + ".")
    dead = [(c["depth"], sum(g["dead"] for g in c["gates"]), sum(g["count"] for g in c["gates"]))
            for c in summary["cells"] if c["family"] == "gated" and c["gates"]]
    if dead:
        lines.append("- Dead relu gates (k ≤ 0) at the end, summed over seeds: "
                     + "; ".join(f"{_layers(d)} {n}/{total}" for d, n, total in dead) + ".")
    removal = [r for r in summary.get("removal_tests", []) if r.get("p_corrected") is not None]
    if removal:
        def kept(r: dict[str, Any]) -> str:
            return (f"{abs(r['kept_difference']):.1f} points {'more' if r['kept_difference'] > 0 else 'less'} than "
                    f"random removal (95% CI of the difference {format_interval(-100 * r['test']['ci_high'], -100 * r['test']['ci_low'], '+.1f')}, "
                    f"p = {r['test']['p_value']:.2g}, {CORRECTION} p = {r['p_corrected']:.2g})")

        significant = [r for r in removal if r["verdict"] not in (NO_DIFFERENCE, TOO_FEW)]
        uncorrected = [r for r in removal if r not in significant and r["test"]["p_value"] < SIGNIFICANCE]
        quiet = [r for r in removal if r not in significant and r not in uncorrected]
        parts = [f"{r['family']} at {r['depth']} layers: smallest |gate| first keeps {kept(r)}" for r in significant]
        parts += [f"{r['family']} at {r['depth']} layers: {NO_DIFFERENCE} after {CORRECTION}, significant only "
                  f"uncorrected: smallest |gate| first keeps {kept(r)}" for r in uncorrected]
        parts += [f"{r['family']} at {r['depth']} layers: {NO_DIFFERENCE} ({r['kept_difference']:+.1f} points, 95% CI "
                  f"{format_interval(-100 * r['test']['ci_high'], -100 * r['test']['ci_low'], '+.1f')}, p = "
                  f"{r['test']['p_value']:.2g})" for r in quiet]
        lines.append(f"- Removing half the layers, smallest |gate| first against random removal ({len(removal)} paired "
                     f"tests, {CORRECTION} over them): " + "; ".join(parts) + ". "
                     + removal_baseline(summary, "epoch of lowest validation error", "layers"))
    return "\n".join(lines) + "\n"


def orders_prose(summary: dict[str, Any], removal: dict[str, Any]) -> str:
    """How the smallest-|gate|-first orders of the 4-layer gated nets begin, counted over seeds: the
    layers they remove first, and the mean k of layers 0-1 against layers 2-3 (`removal`: removal.json by run). The docs page's sentence."""
    gated = [v for k, v in sorted(removal.items()) if k.startswith("gated-L4-")]
    early = sum(1 for v in gated if sorted(v["greedy_order"][:2]) == [0, 1])
    cell = next(c for c in summary["cells"] if c["family"] == "gated" and c["depth"] == 4)
    first = [sum(g["per_branch"][:4]) / 4 for g in cell["gates"]]
    last = [sum(g["per_branch"][4:]) / 4 for g in cell["gates"]]
    return (f"in {early} of {len(gated)} seeds the order removes layers 0 and 1 first; their branches' mean k is "
            f"{sum(first) / len(first):.3f} against {sum(last) / len(last):.3f} for layers 2 and 3")


def report_markdown(summary: dict[str, Any]) -> str:
    """table.md: the tables, then the findings."""
    return table_markdown(summary) + "\nFindings\n\n" + findings_markdown(summary)


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md, findings.md and transformer_gates.png from `out`/results.json alone; return the
    table text."""
    from ..report.transformer_gates_plots import plot_transformer_gates

    out = Path(out)
    summary = read_json(out / RESULTS_FILE)
    plot_transformer_gates(summary, out / "transformer_gates.png")
    atomic_write_text(out / "findings.md", findings_markdown(summary))
    text = report_markdown(summary)
    atomic_write_text(out / "table.md", text)
    return text


def _update_removal(config: Config, out: Path) -> None:
    gated = [(spec.name, asdict(spec.config)) for spec in specs(config)
             if spec.name.split("-L")[0] in GATE_SYMBOL and spec.config.depth >= 4]
    update_removal(out, gated, orders=REMOVAL_ORDERS, device=config.device, data_dir=config.data_dir)


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Train every run into `out`/runs (resumable, one run per worker process), rewriting the summary,
    the removal records and the report at most every 30 s as runs end, and at the end."""
    out = Path(out)
    new = json_config(config)
    new["depths"] = sorted(new["depths"])
    resume = check_study_folder(out, NAME, new, resume, config.shard, config.merge)
    out.mkdir(parents=True, exist_ok=True)

    def summary_with_removal() -> dict[str, Any]:
        _update_removal(config, out)
        return summarize(config, out)

    refresh = StudySummary.for_study(out, config, summary_with_removal, lambda: write_report(out), min_interval_s=30.0,
                                     runs=specs(config))
    return refresh.around(lambda on_done: run_many(specs(config), out / "runs", resume=resume, jobs=jobs,
                                                   progress=progress, on_done=on_done, shard=config.shard),
                          merge=config.merge)


def _step_seconds(depth: int, width: int, steps: int) -> float:
    model = create_model("vit_patch", depth=depth, width=width, gate="relu")
    optimizer = torch.optim.NAdam(model.parameters(), lr=0.002)
    x, y = torch.rand(128, 784), torch.randint(0, 10, (128,))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def estimate(config: Config, jobs: int = 1, steps: int = 3) -> dict[str, Any]:
    """Project the study's wall time on this machine without training it: one training step per depth
    timed (median of `steps`, batch 128, one thread per worker as `run` gives them), times the steps of
    every run, plus evaluation (validation and test forward passes, counted as 1/3 of a training step
    per image), spread over `jobs` workers."""
    torch.set_num_threads(1)
    train = min(config.limit or 50000, 50000)
    evaluated = 2 * min(config.limit or 10000, 10000)
    per_run = {}
    for depth in sorted(config.depths):
        step = _step_seconds(depth, config.width, steps)
        per_run[depth] = config.epochs * (train / 128 + evaluated / 128 / 3) * step
    runs = len(config.families) * config.seeds
    total = sum(per_run.values()) * runs
    return {"per_run_s": per_run, "runs": runs * len(config.depths), "cpu_s": total, "jobs": jobs,
            "wall_s": total / max(1, jobs)}


def estimate_text(config: Config, jobs: int = 1) -> str:
    """`estimate` as a table and a projected wall time."""
    projection = estimate(config, jobs)
    lines = [f"{NAME}: {len(config.families)} families x {len(config.depths)} depths x {config.seeds} seeds, "
             f"{config.epochs} epochs, {config.limit} images per split", "", *table_header(["layers", "one run (min)"])]
    lines += [f"| {d} | {s / 60:.1f} |" for d, s in projection["per_run_s"].items()]
    lines += ["", f"{projection['runs']} runs: about {projection['wall_s'] / 60:.0f} min on {jobs} worker(s) "
              f"(one thread each)"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The study's command-line options: one per Config field, and --estimate."""
    add_options(parser, Config)
    parser.add_argument("--estimate", action="store_true",
                        help="train nothing: time one training step per depth and print the projected duration")


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config the command line asks for: --quick's values, then every explicit option."""
    return study_config_from_args(Config, args, device=args.device, data_dir=args.data_dir)


def report_finished(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Rebuild `out`/results.json and the report from the run folders as they stand, without training."""
    return rebuild_from_runs(out, Config, summarize, write_report, _update_removal, specs=specs)
