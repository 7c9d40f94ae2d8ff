"""Demystifying ResNet figure 4 and Theorem 2: the Hessian of the loss at initialisation against depth.

Figure 4: the initial condition number (max |λ| over the 10th percentile of |λ|) of the exact
Hessian of linear networks on whitened MNIST (10 principal components, one-hot targets, squared
error), for plain networks with Xavier and orthogonal initialisation and 2-shortcut networks
initialised at zero plus `zero_scale` × Xavier, mean ± std over `runs` initialisations per depth.
The linear networks see the training set through its second moments only, so the Hessian is
computed exactly on the condensed 20-sample set (equal loss, gradient and Hessian).

Theorem 2 (checked at the exact zero point, zero_scale = 0, for shortcut depths 1, 2, 3): n ≥ 3
gives a zero gradient and a zero Hessian; n = 2 a Hessian whose eigenvalues are ± the singular
values of one off-diagonal block A, repeated once per unit, identical across depths; n = 1 a
block Toeplitz Hessian whose condition number grows with depth.

Writes results.json (every cell, resumable), table.md and figure4_condition_vs_depth.png.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write_json
from ..analysis.hessian import apply_tolerance, exact_hessian, gradient_norm, spectrum_summary, squared_error_loss
from ..study.options import MAX_SEEDS, check_even_depths, option
from ..study.folders import read_summary
from ..study.options import config_from_json
from ..study.summary import remake_report
from ..report.stats import format_mean_std, mean_std
from ..models import create_model
from ..study.nets import seeded_model
from ..study.shortcut import network_kwargs, whitened_data
from ..study.resumable import ResumableOptions, ResumableStudy
from ..report.tables import table_head, table_header, table_row

__all__ = ["NAME", "DESCRIPTION", "Config", "run", "write_report",
           "theorem2_check"]

NAME = "hessian-init"
DESCRIPTION = "Demystifying ResNet figure 4 + Theorem 2: initial Hessian condition number vs depth (Xavier, orthogonal, 2-shortcut zero)"

PAPER_STATEMENT = ("Figure 4: 2-shortcut linear networks have constant condition numbers; with Xavier or orthogonal "
                   "initialisation the initial condition numbers go to infinity as depth grows, orthogonal growing "
                   "slower than Xavier.")


def _check_theorem2_depths(depths: tuple[int, ...]) -> None:
    bad = [d for d in depths if d % 6]
    if bad:
        raise ValueError(f"{bad} are not multiples of 6 (units of 1, 2 and 3 layers)")


@dataclass(frozen=True)
class Config(ResumableOptions):
    """Settings; the paper's figure uses 10 runs per point (its depths were lost in conversion)."""

    depths: tuple[int, ...] = option((2, 4, 8, 16, 32, 64), "network depths L (even)", quick=(2, 4, 8), minimum=2,
                                     check=check_even_depths)
    networks: tuple[str, ...] = option(("xavier", "orthogonal", "shortcut2-zero"), "network kinds",
                                       choices=("xavier", "orthogonal", "shortcut1-zero", "shortcut2-zero"))
    runs: int = option(10, "initialisations (seeds) per point (paper: 10)", quick=2, minimum=1, flag="--seeds",
                       aliases=("--runs",), maximum=MAX_SEEDS)
    zero_scale: float = option(1e-4, "the small multiple of Xavier of the zero init", minimum=0)
    theorem2_depths: tuple[int, ...] = option((6, 12, 24, 48), "depths of the Theorem 2 check (multiples of 6; "
                                                               "none to skip it)", quick=(6,), minimum=1, empty_ok=True,
                                             check=_check_theorem2_depths)


def _cell_key(network: str, depth: int, seed: int) -> str:
    return f"{network}-L{depth}-s{seed}"


def theorem2_check(depths: tuple[int, ...], x: torch.Tensor, y: torch.Tensor, width: int = 10) -> list[dict[str, Any]]:
    """Theorem 2 at the exact zero point for shortcut depths 1, 2 and 3 at each depth in `depths`.

    For n = 2 the Hessian is checked against its predicted structure: zero outside the diagonal
    blocks of the units, all units' blocks equal, zero diagonal sub-blocks, and eigenvalues equal
    to ± the singular values of the off-diagonal sub-block A (one copy per unit).
    """
    rows = []
    reference_a = None
    for n in (1, 2, 3):
        for depth in depths:
            model = create_model("shortcut_net", depth=depth, shortcut_depth=n, width=width, init="zero", zero_scale=0.0)
            h = exact_hessian(model, squared_error_loss, x, y)
            grad_norm = gradient_norm(model, squared_error_loss, x, y)
            eig = torch.linalg.eigvalsh(h)
            summary = spectrum_summary(eig)
            row: dict[str, Any] = {"shortcut_depth": n, "depth": depth, "units": depth // n, "params": h.shape[0],
                                   "gradient_norm": grad_norm, "hessian_max_abs_entry": float(h.abs().max()),
                                   **{f"spectrum_{k}": v for k, v in summary.to_dict().items()}}
            if n == 1:
                p = width * width
                blocks = h.reshape(depth, p, depth, p).transpose(1, 2)  # blocks[i, j] = H_(i,j)
                upper = torch.triu_indices(depth, depth, 1)
                # block Toeplitz (H_(i,j) depends on j − i only); at zero, on the sign of j − i only
                row["block_toeplitz_max_difference"] = max(
                    float((blocks[torch.arange(depth), torch.arange(depth)] - blocks[0, 0]).abs().max()),
                    float((blocks[upper[0], upper[1]] - blocks[0, 1]).abs().max()) if depth > 1 else 0.0,
                    float((blocks[upper[1], upper[0]] - blocks[1, 0]).abs().max()) if depth > 1 else 0.0)
            if n == 2:
                p = width * width
                block = 2 * p
                units = depth // 2
                first = h[:block, :block]
                off_block = h.clone()
                for u in range(units):
                    off_block[u * block:(u + 1) * block, u * block:(u + 1) * block] = 0
                a = first[:p, p:]
                sv = torch.linalg.svdvals(a)
                predicted = torch.sort(torch.cat([sv, -sv]).repeat(units)).values
                row.update({
                    "outside_unit_blocks_max_abs": float(off_block.abs().max()),
                    "unit_blocks_max_difference": max(float((h[u * block:(u + 1) * block, u * block:(u + 1) * block] - first)
                                                            .abs().max()) for u in range(units)),
                    "diagonal_subblocks_max_abs": max(float(first[:p, :p].abs().max()), float(first[p:, p:].abs().max())),
                    "eigenvalues_vs_pm_singular_values_max_difference": float((torch.sort(eig).values - predicted).abs().max()),
                    "singular_values_of_A": sv.tolist(),
                })
                if reference_a is None:
                    reference_a = a
                row["A_difference_from_shallowest"] = float((a - reference_a).abs().max())
            rows.append(row)
    return rows


def summarize(config: Config, cells: dict[str, Any]) -> list[dict[str, Any]]:
    """Mean ± std of the condition number (and max |λ|, 10th percentile, index) per network and depth."""
    points = []
    for network in config.networks:
        for depth in config.depths:
            found = [cells[k] for k in (_cell_key(network, depth, s) for s in range(config.runs)) if k in cells]
            conds = [c["condition"] for c in found if c["condition"] is not None]
            points.append({"network": network, "depth": depth, "runs": len(found),
                           "undefined_condition": sum(c["condition"] is None for c in found),
                           "singular": sum(bool(c.get("singular")) for c in found),
                           "condition": mean_std(conds),
                           "max_abs": mean_std([c["max_abs"] for c in found]),
                           "low_abs": mean_std([c["low_abs"] for c in found]),
                           "index": mean_std([c["index"] for c in found if c["index"] is not None])})
    return points


def _fmt(stat: dict[str, Any]) -> str:
    return format_mean_std(stat, ".4g", ".2g")


def table_markdown(summary: dict[str, Any]) -> str:
    """Figure 4 as a table (condition number mean ± std per depth) and the Theorem 2 checks."""
    config = summary["config"]
    networks = config["networks"]
    lines = ["Initial Hessian condition number max|λ| / P10(|λ|), mean ± std over runs "
             "(Demystifying ResNet figure 4)", "",
             *table_header(["depth", *networks])]
    by = {(p["network"], p["depth"]): p for p in summary["points"]}
    for depth in config["depths"]:
        row = [str(depth)]
        for network in networks:
            p = by[(network, depth)]
            text = _fmt(p["condition"]) + (f" ({p['runs']} runs)" if p["runs"] != config["runs"] else "")
            if p["undefined_condition"]:  # a mean over the defined runs only would be biased
                text = f"undefined in {p['undefined_condition']} of {p['runs']} runs" + (
                    f" (the other {p['condition']['n']}: {_fmt(p['condition'])})" if p["condition"]["n"] else "")
            if p.get("singular"):
                text += f" [singular: {p['singular']} of {p['runs']}]"
            row.append(text)
        lines.append(table_row(row))
    lines += ["", f"Paper: {PAPER_STATEMENT}", "",
              f"Data: {summary['data']}. Zero init = {config['zero_scale']:g} × Xavier Gaussian. "
              f"Index (fraction of negative eigenvalues) at init: " + "; ".join(
                  f"{p['network']} L={p['depth']}: {_fmt(p['index']) if p['index']['mean'] is not None else 'undefined (singular)'}" for p in summary["points"]
                  if p["depth"] == config["depths"][-1] or p["depth"] == config["depths"][0]) + "."]
    singular = [f"{p['network']} L={p['depth']} ({p['singular']} of {p['runs']})" for p in summary["points"]
                if p.get("singular")]
    if singular:
        lines += ["", "Singular to tolerance (min |λ| ≤ P · eps · max |λ|, P the number of parameters): "
                  + ", ".join(singular) + ". Their index is undefined (the signs of their zero eigenvalues are "
                  "rounding noise) and left out of the means; their condition number max|λ| / P10(|λ|) is "
                  "undefined where the 10th percentile itself is within the tolerance ('undefined' above), and is "
                  "otherwise kept, since the measure leaves out the smallest tenth of |λ| on purpose."]
    rows = summary.get("theorem2", [])
    if rows:
        lines += ["", *table_head("Theorem 2 at the exact zero point (zero_scale = 0)",
                                  ["n", "depth", "units", "‖∇ℓ‖", "max |H_ij|", "max|λ|", "P10|λ|", "condition (P10)",
                                   "index", "paper"])]
        paper = {1: "condition number grows with depth (block Toeplitz)",
                 2: "block diagonal, eigenvalues ±σ(A) once per unit, depth-invariant condition number",
                 3: "zero gradient and zero Hessian ((n−1)-th order stationary point)"}
        for r in rows:
            cond = r["spectrum_condition"]
            undefined = "undefined (zero Hessian)" if r["spectrum_zero"] else "undefined (singular)"
            lines.append(table_row([r["shortcut_depth"], r["depth"], r["units"], f"{r['gradient_norm']:.3g}",
                                    f"{r['hessian_max_abs_entry']:.3g}", f"{r['spectrum_max_abs']:.4g}",
                                    f"{r['spectrum_low_abs']:.4g}", undefined if cond is None else f"{cond:.4g}",
                                    undefined if r["spectrum_index"] is None else format(r["spectrum_index"], ".3f"),
                                    paper[r["shortcut_depth"]]]))
        ones = [r for r in rows if r["shortcut_depth"] == 1 and "block_toeplitz_max_difference" in r]
        if ones:
            lines += ["", "n = 1 structure check: largest difference between Hessian blocks H_(i,j) that a block "
                      "Toeplitz matrix makes equal: " + "; ".join(
                          f"L={r['depth']}: {r['block_toeplitz_max_difference']:.1e}" for r in ones) + "."]
        twos = [r for r in rows if r["shortcut_depth"] == 2]
        if twos:
            lines += ["", "n = 2 structure checks (max absolute deviations; 0 means exact): " + "; ".join(
                f"L={r['depth']}: outside unit blocks {r['outside_unit_blocks_max_abs']:.1e}, unit blocks differ "
                f"{r['unit_blocks_max_difference']:.1e}, diagonal sub-blocks {r['diagonal_subblocks_max_abs']:.1e}, "
                f"eigenvalues vs ±σ(A) {r['eigenvalues_vs_pm_singular_values_max_difference']:.1e}, A vs shallowest "
                f"{r['A_difference_from_shallowest']:.1e}" for r in twos) + "."]
    return "\n".join(lines) + "\n"


def refresh_summary(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Bring `out`/results.json up to date without recomputing a Hessian: mark every stored cell and
    Theorem 2 row singular to tolerance or not (`apply_tolerance`), recompute the points; rewrite
    the file only when this changed something. Returns the summary."""
    path = Path(out) / "results.json"
    summary = read_summary(path, NAME)
    cells = {k: apply_tolerance(c) for k, c in summary.get("cells", {}).items()}
    theorem2 = [apply_tolerance(r, prefix="spectrum_") for r in summary.get("theorem2", [])]
    config = config_from_json(Config, summary["config"])
    updated = {**summary, "cells": cells, "theorem2": theorem2, "points": summarize(config, cells)}
    if updated != summary:
        atomic_write_json(path, updated)
    return updated


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md and the figure from `out`/results.json (marking singular Hessians first)."""
    from ..report.hessian_plots import plot_condition_vs_depth

    refresh_summary(out)
    return remake_report(out, table_markdown, [(plot_condition_vs_depth, "figure4_condition_vs_depth.png")])


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Compute every (network, depth, run) cell (resumable: finished cells in results.json are kept)."""
    study = ResumableStudy(out, NAME, config, ("zero_scale",), resume, progress=progress)
    cells: dict[str, Any] = study.stored_part("cells", {})
    theorem2: list[dict[str, Any]] = study.stored_part("theorem2", [])
    data = whitened_data(linear=True, data_dir=config.data_dir)
    x, y = data.x.to(config.device), data.y.to(config.device)

    def save() -> dict[str, Any]:  # every shard's cells (study.shards): shards may run at once into `out`
        return study.save_shared("cells", cells, lambda every: dict(
            data=data.description, cells=every, points=summarize(config, every), theorem2=theorem2,
            paper=PAPER_STATEMENT))

    # Redo the Theorem 2 check (seconds) when the stored one is for other depths or predates a check.
    stale = (sorted({r["depth"] for r in theorem2}) != sorted(set(config.theorem2_depths))
             or any(r["shortcut_depth"] == 1 and "block_toeplitz_max_difference" not in r for r in theorem2))
    if config.theorem2_depths and stale and not config.merge:
        theorem2 = theorem2_check(config.theorem2_depths, x, y)
        save()
    pieces = ((_cell_key(network, depth, seed), (network, depth, seed))
              for depth in sorted(config.depths) for seed in range(config.runs) for network in config.networks)
    for key, (network, depth, seed) in study.pending(pieces, cells):
        started = time.perf_counter()
        model = seeded_model("shortcut_net", seed, config.device,
                             **network_kwargs(network, depth, zero_scale=config.zero_scale))
        h = exact_hessian(model, squared_error_loss, x, y)
        formed = time.perf_counter() - started
        eig = torch.linalg.eigvalsh(h)
        cells[key] = {"network": network, "depth": depth, "seed": seed, **spectrum_summary(eig).to_dict(),
                      "hessian_seconds": formed, "total_seconds": time.perf_counter() - started}
        save()
        c = cells[key]["condition"]
        study.progress(f"{key}: condition {c if c is None else f'{c:.4g}'} ({cells[key]['total_seconds']:.1f} s)")
    return study.finish(save, write_report)

