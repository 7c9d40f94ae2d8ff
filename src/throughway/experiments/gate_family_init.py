"""The gate families at initialisation: distance to identity and the Demystifying Hessian.

No training. For each family of `gate_family.FAMILIES`, depth d and seed, at initialisation:

* Distance to identity, on the study's own nets (width 50, 784 inputs): the squared distance from the
  initial parameters to the identity configuration the paper's SDI measures, summed over the blocks
  (gated-residual-v1 §2-3; analysis.distance.block_identity_distance, the per-block target that
  `identity-distance` sums): Σ max(k, 0)² for relu gates, Σ α² for ReZero, Σ ‖λ‖² for LayerScale (its
  identity configuration is λ = 0; computed here, as analysis.distance treats only scalar gates), and
  the squared norm of the branch's weights and biases for an ungated residual block (Ŵ = 0, b̂ = 0).
* The Hessian of the cross-entropy loss (the loss the study trains with) at initialisation, exactly
  (analysis.hessian.exact_hessian, float64, BatchNorm with batch statistics as in training) and its
  full spectrum, as in Demystifying ResNet figure 4 and appendix B: the condition number max|λ| over
  the 10th percentile of |λ| (analysis.spectrum.condition_number; undefined where a tenth of the
  spectrum is zero to tolerance) and the index (the fraction of negative eigenvalues; undefined when
  singular). Because the exact Hessian of the width-50, 784-input nets (≥ 42,000 parameters) cannot be
  formed, the Hessian is taken on narrow proxies of the same families: `hessian_width` units, inputs the
  first `samples` whitened MNIST training images reduced to 10 principal components (study.shortcut's
  whitened MNIST, Demystifying ResNet's input), their class labels as targets. The report adds the
  fraction of eigenvalues zero to tolerance (the flat directions that make the P10 measure undefined)
  and, for every Hessian, the condition number and the index over its non-zero eigenvalues only
  (labelled as not the paper's measures: ReLU nets with BatchNorm are singular at initialisation, so
  their index is always undefined).

Writes results.json (every cell, resumable), table.md and init_by_depth.png.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ..analysis.distance import block_identity_distance
from ..analysis.hessian import SingularHessianWarning, exact_hessian, spectrum_summary
from ..analysis.spectrum import condition_number
from ..layers import VectorGate
from ..study.options import MAX_SEEDS, check_residual_depths, option
from ..study.resumable import ResumableOptions, ResumableStudy
from ..study.summary import remake_report
from ..report.stats import format_mean_std, mean_std
from ..study.nets import seeded_model
from ..study.shortcut import whitened_data
from ..report.tables import table_header, table_row
from ..study.gate_families import FAMILIES, family_kwargs

__all__ = ["NAME", "DESCRIPTION", "Config", "distance_to_identity", "hessian_cell", "summarize", "table_markdown",
           "write_report", "run"]

NAME = "gate-family-init"
DESCRIPTION = ("the gate families at initialisation (no training): distance to identity and the "
               "Demystifying Hessian condition number (P10) and index by depth")


@dataclass(frozen=True)
class Config(ResumableOptions):
    """Settings (see the module docstring)."""

    depths: tuple[int, ...] = option((2, 10, 20, 50, 100), "values of d, the middle layers (even)", quick=(2, 6),
                                     minimum=0, check=check_residual_depths)
    families: tuple[str, ...] = option(tuple(FAMILIES), "families", choices=tuple(FAMILIES))
    seeds: int = option(3, "initialisations per family and depth", quick=2, minimum=1, maximum=MAX_SEEDS)
    width: int = option(50, "units per layer of the nets whose distance to identity is measured (the study's)",
                        minimum=1)
    hessian_width: int = option(4, "units per layer of the Hessian proxies (exact Hessian: keep P ≲ 4,000)",
                                quick=3, minimum=1)
    samples: int = option(128, "whitened MNIST training images the Hessian's loss averages over", quick=32,
                          minimum=2)


def _key(family: str, depth: int, seed: int) -> str:
    return f"{family}-d{depth}-s{seed}"


def distance_to_identity(model: nn.Module) -> float:
    """Σ over blocks of the squared distance to the block's identity configuration (see the module
    docstring): analysis.distance.block_identity_distance, and ‖λ‖² for a LayerScale (vector) gate."""
    total = 0.0
    for block in cast(nn.ModuleList, model.blocks):
        gate = getattr(block, "gate", None)
        if isinstance(gate, VectorGate):
            total += float(gate.k.detach().double().pow(2).sum())
        else:
            total += block_identity_distance(block)[1]
    return total


def _cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


def hessian_cell(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """The exact Hessian's spectrum of the mean cross-entropy of `model` (train mode) on (x, labels):
    spectrum_summary's fields (condition = max|λ| / P10|λ|, index, max_abs, low_abs, singular, ...),
    `zero_fraction` (eigenvalues with |λ| ≤ rtol·max|λ|), and over the eigenvalues above that
    tolerance only `nonzero_condition` (their P10 condition number) and `nonzero_index` (their fraction
    of negatives); both None for a zero Hessian."""
    model.train()
    started, cpu = time.perf_counter(), time.process_time()
    hessian = exact_hessian(model, _cross_entropy, x, labels)
    eigenvalues = torch.linalg.eigvalsh(hessian)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingularHessianWarning)  # recorded as `singular` below
        summary = spectrum_summary(eigenvalues).to_dict()
    magnitude = eigenvalues.abs()
    nonzero = eigenvalues[magnitude > summary["rtol"] * float(magnitude.max())]
    return {**summary, "zero_fraction": 1.0 - len(nonzero) / len(eigenvalues),
            "nonzero_condition": condition_number(nonzero) if len(nonzero) else None,
            "nonzero_index": float((nonzero < 0).double().mean()) if len(nonzero) else None,
            "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu}


def summarize(config: Config, cells: dict[str, Any]) -> list[dict[str, Any]]:
    """Per family and depth: mean ± std over seeds of the distance to identity and of each Hessian
    measure (the condition number and index over the seeds where they are defined, with the count of
    seeds where they are not)."""
    points = []
    for family in config.families:
        for depth in config.depths:
            found = [cells[k] for k in (_key(family, depth, s) for s in range(config.seeds)) if k in cells]
            hessians = [c["hessian"] for c in found]
            point: dict[str, Any] = {"family": family, "depth": depth, "seeds": len(found),
                                     "distance_to_identity": mean_std([c["distance_to_identity"] for c in found]),
                                     "parameters": found[0]["hessian"]["size"] if found else None}
            for measure in ("condition", "index", "nonzero_condition", "nonzero_index"):
                defined = [h[measure] for h in hessians if h[measure] is not None]
                point[measure] = mean_std(defined)
                point[f"{measure}_undefined"] = len(hessians) - len(defined)
            for measure in ("max_abs", "zero_fraction"):
                point[measure] = mean_std([h[measure] for h in hessians])
            points.append(point)
    return points


def _stat(stat: dict[str, Any], fmt: str = ".3g") -> str:
    return format_mean_std(stat, fmt, ".2g")


def _defined(point: dict[str, Any], measure: str, fmt: str = ".3g") -> str:
    undefined = point[f"{measure}_undefined"]
    if undefined == point["seeds"]:
        return "undefined" if undefined else "pending"
    return _stat(point[measure], fmt) + (f" (undefined in {undefined})" if undefined else "")


def _with_seeds(cell: Any, point: dict[str, Any], seeds: int) -> str:
    """A table cell: "pending" without any seed, the seed count added where it falls short of `seeds`."""
    if not point["seeds"]:
        return "pending"
    return cell(point) + (f" (n={point['seeds']} of {seeds})" if point["seeds"] < seeds else "")


def table_markdown(summary: dict[str, Any]) -> str:
    """One table per measure, depth (rows) × family (columns): distance to identity; the Hessian's P10
    condition number; its index; the fraction of zero eigenvalues; the P10 condition number of the
    non-zero eigenvalues. Mean ± std over seeds; "undefined" where no seed's value is defined."""
    config = summary["config"]
    families, depths = config["families"], config["depths"]
    by = {(p["family"], p["depth"]): p for p in summary["points"]}

    def table(title: str, cell: Any) -> list[str]:
        rows = [title, "", *table_header(["d", *families])]
        for depth in depths:
            rows.append(table_row([depth, *(_with_seeds(cell, by[(f, depth)], config["seeds"]) for f in families)]))
        return rows + [""]

    sizes = ", ".join(f"d = {d}: {by[(families[0], d)]['parameters']}" for d in depths
                      if by[(families[0], d)]["parameters"])
    lines = [f"At initialisation, mean ± std over {config['seeds']} seeds per cell unless a cell says otherwise "
             "(no training).", ""]
    lines += table(f"Squared distance to identity, summed over blocks, of the study's nets (width {config['width']}, "
                   "784 inputs): Σ max(k,0)² (gated), Σ α² (ReZero), Σ ‖λ‖² (LayerScale), Σ ‖branch weights‖² "
                   "(residual)", lambda p: _stat(p["distance_to_identity"]))
    lines += [f"Hessian of the cross-entropy at initialisation, exact, on proxies of width {config['hessian_width']} "
              f"with 10 whitened MNIST components as input, {config['samples']} training images (parameters P, "
              f"{families[0]}: {sizes}).", ""]
    lines += table("Condition number max|λ| / P10(|λ|) (Demystifying ResNet appendix B); undefined when a tenth of "
                   "the spectrum is zero to tolerance", lambda p: _defined(p, "condition"))
    lines += table("Index (fraction of negative eigenvalues); undefined when the Hessian is singular to tolerance",
                   lambda p: _defined(p, "index", ".3f"))
    lines += table("Fraction of eigenvalues zero to tolerance (|λ| ≤ P·eps·max|λ|)",
                   lambda p: _stat(p["zero_fraction"], ".3f"))
    lines += table("Not the paper's measure: max|λ| / P10(|λ|) over the non-zero eigenvalues only",
                   lambda p: _defined(p, "nonzero_condition"))
    lines += table("Not the paper's measure: the index over the non-zero eigenvalues only",
                   lambda p: _defined(p, "nonzero_index", ".3f"))
    lines += table("Largest |λ|", lambda p: _stat(p["max_abs"]))
    return "\n".join(lines)


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md and init_by_depth.png from `out`/results.json alone; return the table text."""
    from ..report.gate_family_plots import plot_init_by_depth

    return remake_report(out, table_markdown, [(plot_init_by_depth, "init_by_depth.png")])


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Compute every (family, depth, seed) cell, shallowest depth first (resumable: cells already in
    results.json are kept); `jobs` is accepted for the common interface and unused (one process). With
    `config.shard` 'i/N', only cells i, i + N, ... of that order; with `config.merge`, none (the
    summary of every shard's cells is written)."""
    study = ResumableStudy(out, NAME, config, ("width", "hessian_width", "samples"), resume, progress=progress)
    cells: dict[str, Any] = study.stored_part("cells", {})
    data = whitened_data(linear=False, data_dir=config.data_dir, subset=config.samples)
    x = data.x.to(config.device)
    labels = data.y.argmax(dim=1).to(config.device)

    def save() -> dict[str, Any]:  # every shard's cells (study.shards): shards may run at once into `out`
        return study.save_shared("cells", cells, lambda every: dict(data=data.description, cells=every,
                                                                    points=summarize(config, every)))

    pieces = ((_key(family, depth, seed), (family, depth, seed))
              for depth in sorted(config.depths) for seed in range(config.seeds) for family in config.families)
    for key, (family, depth, seed) in study.pending(pieces, cells):
        name, kwargs = FAMILIES[family][0], family_kwargs(family, depth)
        distance = distance_to_identity(seeded_model(name, seed, depth=depth, width=config.width, **kwargs))
        proxy = seeded_model(name, seed, config.device, depth=depth, width=config.hessian_width,
                             in_features=x.shape[1], **kwargs)
        hessian = hessian_cell(proxy, x, labels)
        cells[key] = {"family": family, "depth": depth, "seed": seed, "distance_to_identity": distance,
                      "hessian": hessian}
        save()
        c = hessian["condition"]
        study.progress(f"{key}: distance {distance:.4g}, condition "
                       f"{'undefined' if c is None else f'{c:.4g}'}, zero {hessian['zero_fraction']:.3f} "
                       f"(P = {hessian['size']}, {hessian['seconds']:.1f} s, CPU {hessian['cpu_seconds']:.1f} s)")
    return study.finish(save, write_report)
