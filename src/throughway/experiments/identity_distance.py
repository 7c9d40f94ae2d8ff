"""Beyond the papers: is the squared distance to identity (SDI) a surrogate for the optimiser's path?

gated-residual-v1 section 2 assumes that the squared distance from a layer's initial parameters
to an identity configuration is "a credible surrogate" for the length of the path the optimiser
travels. Here plain, residual and gated residual MLPs (the MNIST study's models, d middle layers
of width 50, recipe gresnet-mnist) train on MNIST for a few epochs while the `IdentityDistance`
callback logs, after every epoch and per middle block, the squared distance travelled from
initialisation ‖θ_t − θ_0‖², the epoch-chord path length, and the squared distance to the nearest
identity configuration (see throughway.analysis.distance for the definitions).

Reported per architecture: the distance to identity at initialisation (the realised SDI), the
squared distance travelled and the (path length)² at the end, the distance to identity at the
end, and the correlation across blocks between travelled distance and initial distance to identity.
Writes results.json, table.md and identity_distance.png.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..analysis.distance import IdentityDistance
from ..data import load_dataset
from ..study.nets import seeded_model
from ..train import get_recipe
from ..train.loop import fit
from ..study.options import check_even_depths, option
from ..study.summary import remake_report
from ..study.resumable import ResumableOptions, ResumableStudy
from ..report.tables import table_header, table_row

__all__ = ["NAME", "DESCRIPTION", "Config", "run", "write_report"]

NAME = "identity-distance"
DESCRIPTION = "beyond the papers: distance travelled vs distance to identity (SDI) during MNIST training"

ARCHS = {"plain": "mlp_plain", "residual": "mlp_residual", "gated": "mlp_gated_residual"}


@dataclass(frozen=True)
class Config(ResumableOptions):
    """Settings: a small, quick study (a few epochs, small d)."""

    archs: tuple[str, ...] = option(("plain", "residual", "gated"), "architectures", choices=tuple(ARCHS))
    depth: int = option(10, "d, middle layers (even)", quick=2, minimum=2, check=check_even_depths)
    width: int = option(50, "units per layer", minimum=1)
    epochs: int = option(4, "epochs", quick=1, minimum=1)
    recipe: str = "gresnet-mnist"
    seed: int = 0
    limit: int | None = option(None, "keep only the first N samples of each split", quick=5000, minimum=1)
    stem: str = option("linear", "first layer: linear (gated-residual-v1 §4.1: 'a linear layer with 50 neurons') or "
                                 "dense (Dot-BN-ReLU, as results/sdi/identity-distance was made)",
                       choices=("linear", "dense"))


def _pearson(a: list[float], b: list[float]) -> float | None:
    if len(a) < 3:
        return None
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    if float(x.std()) == 0 or float(y.std()) == 0:
        return None
    return float(torch.corrcoef(torch.stack([x, y]))[0, 1])


def relate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Summary numbers of one run's distance log."""
    first, last = records[0], records[-1]
    return {
        "identity_sq_at_init": first["identity_sq"], "identity_sq_at_end": last["identity_sq"],
        "travelled_sq_at_end": last["travelled_sq"], "path_length_sq_at_end": last["path_length"] ** 2,
        "travelled_over_initial_identity": last["travelled_sq"] / first["identity_sq"] if first["identity_sq"] else None,
        "block_correlation_travelled_vs_initial_identity": _pearson(last["block_travelled_sq"], first["block_identity_sq"]),
        "identity_change": last["identity_sq"] - first["identity_sq"],
        # results written before the nearest-identity distance existed lack these
        "nearest_identity_sq_at_init": first.get("nearest_identity_sq"),
        "nearest_identity_sq_at_end": last.get("nearest_identity_sq"),
        "travelled_over_nearest_identity": (last["travelled_sq"] / first["nearest_identity_sq"]
                                            if first.get("nearest_identity_sq") else None),
    }


def table_markdown(summary: dict[str, Any]) -> str:
    """The relation of travelled distance and distance to identity, per architecture."""
    config = summary["config"]
    lines = [f"Distance travelled vs distance to identity, MNIST, d = {config['depth']}, width {config['width']}, "
             f"{config['epochs']} epochs of {config['recipe']} (sums over the middle blocks)", "",
             *table_header(["arch", "paper's identity² at init (SDI)", "at end", "nearest identity² at init", "at end",
                            "‖θ_T − θ_0‖²", "(path length)²", "travelled / SDI", "travelled / nearest",
                            "corr. over blocks (travelled, initial identity²)", "final test error %"])]

    def fmt(value: float | None, spec: str) -> str:
        return "—" if value is None else format(value, spec)

    for run in summary["runs"]:
        r = run["relation"]
        lines.append(table_row([run["arch"], f"{r['identity_sq_at_init']:.4g}", f"{r['identity_sq_at_end']:.4g}",
                                fmt(r.get("nearest_identity_sq_at_init"), ".4g"),
                                fmt(r.get("nearest_identity_sq_at_end"), ".4g"), f"{r['travelled_sq_at_end']:.4g}",
                                f"{r['path_length_sq_at_end']:.4g}", fmt(r["travelled_over_initial_identity"], ".3g"),
                                fmt(r.get("travelled_over_nearest_identity"), ".3g"),
                                fmt(r["block_correlation_travelled_vs_initial_identity"], ".2f"),
                                f"{run['history'][-1]['test_error_pct']:.2f}"]))
    lines += ["", "Paper (gated-residual-v1 §2): SDI is assumed to be a credible surrogate for (a lower bound on) the "
              "squared length of the optimiser's path to an identity layer. Paper's identity distances: plain "
              "‖W − I‖² + ‖b‖², residual ‖W‖² + ‖b‖² of all the branch's linear layers, gated max(k, 0)². Nearest "
              "identity: silence the branch's last layer unit by unit (Σ_j min(‖W_j‖², γ_j²) + max(β_j, 0)²) or close "
              "the gate, whichever is nearer (— for plain blocks, whose identity depends on BatchNorm's batch "
              "statistics). BatchNorm parameters count in the travelled distance."]
    lines += ["", _finding(summary["runs"])]
    return "\n".join(lines) + "\n"


def _finding(runs: list[dict[str, Any]]) -> str:
    """One sentence, from the numbers, on whether the distance travelled follows SDI."""
    if not runs:
        return "No runs yet."
    rel = {run["arch"]: run["relation"] for run in runs}
    travelled = [r["travelled_sq_at_end"] for r in rel.values()]
    sdi = [r["identity_sq_at_init"] for r in rel.values()]
    moved = {arch: r["identity_sq_at_end"] - r["identity_sq_at_init"] for arch, r in rel.items()}
    return (f"Measured: the squared distance travelled ranges {min(travelled):.3g}–{max(travelled):.3g} "
            f"(a factor {max(travelled) / min(travelled):.2g}) while the SDI at initialisation ranges "
            f"{min(sdi):.3g}–{max(sdi):.3g} (a factor {max(sdi) / max(min(sdi), 1e-300):.2g}); the paper's identity "
            "distance changed by " + ", ".join(f"{arch} {d:+.3g}" for arch, d in moved.items()) +
            " over training (negative: the blocks moved towards identity).")


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md and the figure from `out`/results.json."""
    from ..report.hessian_plots import plot_identity_distance

    return remake_report(out, table_markdown, [(plot_identity_distance, "identity_distance.png")])


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Train each architecture with the callback (resumable per architecture), then report."""
    # Studies stored before the first layer was an option were built with the dense one.
    study = ResumableStudy(out, NAME, config, ("depth", "width", "epochs", "recipe", "seed", "limit", "stem"), resume,
                           legacy={"stem": "dense"}, progress=progress)
    # runs logged before the nearest-identity distance existed are redone
    stored = study.stored["runs"] if study.stored is not None else []
    runs: dict[str, Any] = {r["arch"]: r for r in stored if "nearest_identity_sq" in r["distance"][0]}
    data = load_dataset("mnist", config.data_dir, device=config.device, limit=config.limit)
    recipe = get_recipe(config.recipe, epochs=config.epochs)

    def save() -> dict[str, Any]:  # every shard's runs (study.shards): shards may run at once into `out`
        return study.save_shared("runs", runs, lambda every: dict(runs=[every[a] for a in config.archs if a in every]),
                                 stored_as=lambda stored: {r["arch"]: r for r in stored
                                                           if "nearest_identity_sq" in r["distance"][0]})

    for position, arch in enumerate(config.archs):
        if arch in runs or not study.in_shard(position):
            continue
        started = time.perf_counter()
        model = seeded_model(ARCHS[arch], config.seed, config.device, depth=config.depth, width=config.width,
                             stem=config.stem)
        callback = IdentityDistance()
        history = fit(model, data, recipe, [callback], seed=config.seed, progress=False)
        runs[arch] = {"arch": arch, "model": ARCHS[arch], "depth": config.depth, "history": history.epochs,
                      "diverged": history.diverged, "distance": callback.records, "block_kinds": callback.kinds,
                      "relation": relate(callback.records), "seconds": time.perf_counter() - started}
        save()
        study.progress(f"{arch}: {runs[arch]['relation']} ({runs[arch]['seconds']:.0f} s)")
    return study.finish(save, write_report)

