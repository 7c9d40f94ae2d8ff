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

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write_json, atomic_write_text, environment_info, read_json
from ..analysis.distance import IdentityDistance
from ..data import load_dataset
from ..models import create_model
from ..train import get_recipe
from ..train.loop import fit
from .common import command_line

__all__ = ["NAME", "DESCRIPTION", "Config", "run", "write_report", "add_arguments", "config_from_args"]

NAME = "identity-distance"
DESCRIPTION = "beyond the papers: distance travelled vs distance to identity (SDI) during MNIST training"

ARCHS = {"plain": "mlp_plain", "residual": "mlp_residual", "gated": "mlp_gated_residual"}


@dataclass(frozen=True)
class Config:
    """Settings: a small, quick study (a few epochs, small d)."""

    archs: tuple[str, ...] = ("plain", "residual", "gated")
    depth: int = 10
    width: int = 50
    epochs: int = 4
    recipe: str = "gresnet-mnist"
    seed: int = 0
    limit: int | None = None
    threads: int = 1
    device: str = "cpu"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.archs) - set(ARCHS))
        if unknown:
            raise ValueError(f"archs: {unknown} not known; accepted values: {list(ARCHS)}")
        if self.depth % 2 or self.depth < 2:
            raise ValueError(f"depth={self.depth}: must be an even integer ≥ 2")


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
    }


def table_markdown(summary: dict[str, Any]) -> str:
    """The relation of travelled distance and distance to identity, per architecture."""
    config = summary["config"]
    lines = [f"Distance travelled vs distance to identity, MNIST, d = {config['depth']}, width {config['width']}, "
             f"{config['epochs']} epochs of {config['recipe']} (sums over the middle blocks)", "",
             "| arch | identity² at init (SDI) | identity² at end | ‖θ_T − θ_0‖² | (path length)² | travelled / SDI | "
             "corr. over blocks (travelled, initial identity²) | final test error % |", "|---|---|---|---|---|---|---|---|"]
    for run in summary["runs"]:
        r = run["relation"]
        ratio = r["travelled_over_initial_identity"]
        corr = r["block_correlation_travelled_vs_initial_identity"]
        lines.append(f"| {run['arch']} | {r['identity_sq_at_init']:.4g} | {r['identity_sq_at_end']:.4g} | "
                     f"{r['travelled_sq_at_end']:.4g} | {r['path_length_sq_at_end']:.4g} | "
                     f"{'—' if ratio is None else f'{ratio:.3g}'} | {'—' if corr is None else f'{corr:.2f}'} | "
                     f"{run['history'][-1]['test_error_pct']:.2f} |")
    lines += ["", "Paper (gated-residual-v1 §2): SDI is assumed to be a credible surrogate for (a lower bound on) the "
              "squared length of the optimiser's path to an identity layer. Identity distances: plain ‖W − I‖² + ‖b‖², "
              "residual ‖W‖² + ‖b‖² of the branch's linear layers, gated max(k, 0)²; BatchNorm parameters are in the "
              "travelled distance only."]
    return "\n".join(lines) + "\n"


def write_report(out: str | os.PathLike[str]) -> str:
    """Remake table.md and the figure from `out`/results.json."""
    from ..report.hessian_plots import plot_identity_distance

    out = Path(out)
    summary = read_json(out / "results.json")
    table = table_markdown(summary)
    atomic_write_text(out / "table.md", table)
    plot_identity_distance(summary, out / "identity_distance.png")
    return table


def run(config: Config, out: str | os.PathLike[str], *, resume: bool = False, jobs: int = 1,
        progress: bool = True) -> dict[str, Any]:
    """Train each architecture with the callback (resumable per architecture), then report."""
    torch.set_num_threads(config.threads)
    out = Path(out)
    path = out / "results.json"
    runs: dict[str, Any] = {}
    if path.is_file():
        if not resume:
            raise FileExistsError(f"{out} holds a {NAME} study; pass --resume to continue it")
        runs = {r["arch"]: r for r in read_json(path)["runs"]}
    data = load_dataset("mnist", config.data_dir, device=config.device, limit=config.limit)
    recipe = get_recipe(config.recipe, epochs=config.epochs)

    def save() -> dict[str, Any]:
        summary = {"experiment": NAME, "config": asdict(config),
                   "runs": [runs[a] for a in config.archs if a in runs], "command": command_line(),
                   "environment": environment_info(config.device)}
        atomic_write_json(path, summary)
        return summary

    for arch in config.archs:
        if arch in runs:
            continue
        started = time.perf_counter()
        torch.manual_seed(config.seed)
        model = create_model(ARCHS[arch], depth=config.depth, width=config.width).to(config.device)
        callback = IdentityDistance()
        history = fit(model, data, recipe, [callback], seed=config.seed, progress=False)
        runs[arch] = {"arch": arch, "model": ARCHS[arch], "depth": config.depth, "history": history.epochs,
                      "diverged": history.diverged, "distance": callback.records, "block_kinds": callback.kinds,
                      "relation": relate(callback.records), "seconds": time.perf_counter() - started}
        save()
        if progress:
            print(f"[{NAME}] {arch}: {runs[arch]['relation']} ({runs[arch]['seconds']:.0f} s)", file=sys.stderr, flush=True)
    summary = save()
    write_report(out)
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line options."""
    parser.add_argument("--archs", nargs="+", choices=list(ARCHS))
    parser.add_argument("--depth", type=int, help="d, middle layers (even; default 10)")
    parser.add_argument("--width", type=int, help="units per layer (default 50)")
    parser.add_argument("--epochs", type=int, help="epochs (default 4)")
    parser.add_argument("--limit", type=int, help="keep only the first N samples of each split")
    parser.add_argument("--threads", type=int, help="torch threads (default 1)")


def config_from_args(args: argparse.Namespace) -> Config:
    """Config from parsed options."""
    changes: dict[str, Any] = {"device": args.device, "data_dir": args.data_dir}
    for option in ("depth", "width", "epochs", "limit", "threads"):
        value = getattr(args, option)
        if value is not None:
            changes[option] = value
    if args.archs:
        changes["archs"] = tuple(args.archs)
    return replace(Config(), **changes)
