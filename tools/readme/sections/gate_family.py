"""docs/reproductions/gate-family.md: the 2017 scalar gate beside ReZero, SkipInit and LayerScale.

The analyses at initialisation come from results/gate-family-init (`throughway reproduce
gate-family-init`); the trained study's tables come from results/gate-family once it is committed,
and the page says "pending" until then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from throughway.experiments import gate_family, gate_family_init
from throughway.experiments.gate_family_report import (datasets_markdown, errors_prose, finished_depths,
                                                      findings_markdown, first_epoch_prose, removal_prose)

from .common import _json, _report_file


def _gate_family_findings(root: Path) -> str:
    """The trained study's findings.md (`gate_family_report.findings_markdown`: per finished depth the paired
    tests of gated against each family at the Holm-corrected p, every pair of families, the removal tests); a pending line while
    results/gate-family is not committed."""
    if not (Path(root) / "gate-family" / "results.json").is_file():
        return "Pending: no trained cell is committed yet."
    return _report_file(root, "gate-family", "findings.md", findings_markdown)


SECOND_DATASET = "gate-family-fashion"  # the gate family on Fashion-MNIST (results/)


def second_dataset_summary(root: Path) -> dict[str, Any] | None:
    """results/gate-family-fashion's summary with its depths cut to those every family finished (so that its
    tests are corrected over the finished depths' alone, on the page and in the README alike); None while it
    is not committed or no depth is finished."""
    if not (Path(root) / SECOND_DATASET / "results.json").is_file():
        return None
    second = _json(root, f"{SECOND_DATASET}/results.json")
    done = finished_depths(second)
    return {**second, "config": {**second["config"], "depths": done}} if done else None


def _gate_family_datasets(root: Path) -> str:
    """The verdicts on MNIST and on Fashion-MNIST side by side (`gate_family_report.datasets_markdown`, at
    the depths where every family finished on Fashion-MNIST); a pending line until
    results/gate-family-fashion holds one."""
    second = second_dataset_summary(root)
    if second is None:
        return ("Pending: the Fashion-MNIST runs are not committed yet, or no depth has every family finished (the "
                "study resumes where it stopped); no verdict of this section is drawn before then.")
    return datasets_markdown({"MNIST": _json(root, "gate-family/results.json"), "Fashion-MNIST": second})


def _gate_family_removal_prose(root: Path) -> str:
    """What the removal tests say after Holm's correction (`gate_family_report.removal_prose`)."""
    summary = _json(root, "gate-family/results.json")
    return removal_prose(summary)


def _gate_family_errors_prose(root: Path) -> str:
    """What the paired tests of the test error say after Holm's correction (`gate_family_report.errors_prose`)."""
    return errors_prose(_json(root, "gate-family/results.json"))


def _gate_family_first_epoch(root: Path) -> str:
    """The first-epoch blow-up without BatchNorm at the deepest depth (`gate_family_report.first_epoch_prose`)."""
    return first_epoch_prose(_json(root, "gate-family/results.json"))


def _gate_family_init_table(root: Path) -> str:
    """The distance-to-identity and Hessian tables at initialisation, by family and depth."""
    return gate_family_init.table_markdown(_json(root, "gate-family-init/results.json"))


# What a replay must repeat exactly: the trajectory (training loss, every error, the gates). The evaluated
# losses are sums whose order depends on the evaluation's batch of models: compared to a relative tolerance.
_EXACT_FIELDS = ("epoch", "train_loss", "train_error_pct", "val_error_pct", "test_error_pct", "k", "k_mean")
_EVALUATED_LOSSES = ("val_loss", "test_loss")


def _history(run: Path) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = json.loads((run / "results.json").read_text())["history"]
    return history


def _loss_gap(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    """The largest relative difference of two histories' evaluated losses."""
    return max((abs(x[k] - y[k]) / max(abs(y[k]), 1e-30) for x, y in zip(a, b) for k in _EVALUATED_LOSSES
                if x.get(k) is not None and y.get(k) is not None), default=0.0)


def replay_comparison(root: Path, other: str = "mnist-depth-val") -> dict[int, dict[str, Any]]:
    """Per depth that both studies trained, for the residual and gated nets of the same seeds: whether
    every run repeats the other study's trajectory exactly (`_EXACT_FIELDS` of every epoch), the largest
    relative difference of the evaluated losses, and the largest difference of the two cell means (points)."""
    here, there = Path(root) / "gate-family" / "runs", Path(root) / other / "runs"
    summary = _json(root, "gate-family/results.json")
    out: dict[int, dict[str, Any]] = {}
    for depth in finished_depths(summary):
        equal, gaps, loss_gap = True, [], 0.0
        for arch in ("residual", "gated"):
            names = [f"{arch}-d{depth}-s{s}" for s in range(summary["config"]["seeds"])]
            if not all((there / n / "results.json").is_file() for n in names):
                break
            for n in names:
                a, b = _history(here / n), _history(there / n)
                equal &= [{k: r.get(k) for k in _EXACT_FIELDS} for r in a] == [{k: r.get(k) for k in _EXACT_FIELDS} for r in b]
                loss_gap = max(loss_gap, _loss_gap(a, b))
            means = [sum(_history(folder / n)[-1]["test_error_pct"] for n in names) / len(names) for folder in (here, there)]
            gaps.append(abs(means[0] - means[1]))
        else:
            out[depth] = {"replay": equal, "max_mean_gap": max(gaps), "loss_gap": loss_gap}
    return out


def _gate_family_replay(root: Path) -> str:
    """Where the gate-family study's residual and gated runs repeat results/mnist-depth-val's bit for bit
    (the same seeds), and how far the same seeds land elsewhere."""
    summary = _json(root, "gate-family/results.json")
    compared = replay_comparison(root)
    replays = [d for d, c in compared.items() if c["replay"]]
    others = [d for d, c in compared.items() if not c["replay"]]
    gated = {c["depth"]: c["test_error_pct"]["mean"] for c in summary["cells"] if c["family"] == "gated"}
    deepest = max(gated)
    text = f"The gated net at d = {deepest} ends at {gated[deepest]:.2f}, not at the paper's 1.26."
    if replays:
        text += (f" Its d = {', '.join(map(str, replays))} gated and residual runs are replays of the "
                 f"[MNIST depth study](mnist-depth.md)'s (`results/mnist-depth-val`: the same seeds; every epoch's "
                 f"training loss, errors and k equal bit for bit, the evaluated losses to a relative "
                 f"{max(compared[d]['loss_gap'] for d in replays):.0e}), not a second sample.")
    if others:
        gap = max(compared[d]["max_mean_gap"] for d in others)
        text += (f" At d = {', '.join(map(str, others))} the same seeds, trained in other batches of stacked models, "
                 f"differ: the two studies' cell means by up to {gap:.2f} points. A run's numbers can depend on which "
                 f"models share its stack: bit for bit holds for the same command, not across stack compositions.")
    return text


def _gate_family_rezero_condition(root: Path) -> str:
    """ReZero's condition number over the non-zero eigenvalues at initialisation, from the shallowest to
    the deepest depth (its smallest and largest mean)."""
    points = [p for p in _json(root, "gate-family-init/results.json")["points"] if p["family"] == "rezero"
              and p["nonzero_condition"]["mean"] is not None]
    points.sort(key=lambda p: p["depth"])
    values = [(p["depth"], p["nonzero_condition"]["mean"]) for p in points]
    low, high = min(values, key=lambda v: v[1]), max(values, key=lambda v: v[1])
    last = values[-1]
    return (f"a non-zero condition number that grows from {low[1]:.0f} at d = {low[0]} to {high[1]:.0f} at d = {high[0]}"
            + (f" ({last[1]:.0f} at d = {last[0]})" if last not in (low, high) else ""))


def _gate_family_trained(root: Path) -> str:
    """The trained study's error table, paired tests, gate values and removal table, or a pending line
    naming the command while results/gate-family is not committed."""
    if not (Path(root) / "gate-family" / "results.json").is_file():
        return ("Pending: the trained study (`throughway reproduce gate-family`, 7 families × 5 depths × 5 seeds × "
                "100 epochs) has not finished on this machine; `results/gate-family` will hold it.")
    return gate_family.report_markdown(_json(root, "gate-family/results.json"))
