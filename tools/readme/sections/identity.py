"""Renderers of docs/reproductions/identity.md: distance to identity (SDI/TSDI table, its Monte Carlo check, and the
distance travelled during training), from results/sdi/."""

from __future__ import annotations

from pathlib import Path

from .common import _json


def _sdi_table(root: Path) -> str:
    from throughway.experiments.sdi_table import _form

    summary = _json(root, "sdi/results.json")
    rows, eqs = summary["table1"], {e["layer"]: e for e in summary["equations"]}

    def joined(key: str) -> str:
        return " / ".join(_form(r[key]) for r in rows)

    def eq(layer: str) -> str:
        e = eqs[layer]
        return (f"{_form(e['tsdi_paper'])} | {_form(e['tsdi_ours_paper_convention'])} | "
                f"{_form(e['tsdi_ours_stated_convention'])} | {_form(e['tsdi_ours_toolkit'])}")

    gate = summary["config"]["gate_bias"]
    cs = " / ".join(format(r["c"], "g") for r in rows)
    g_paper = " / ".join(format(r["g_paper"], "g") for r in rows)
    g_ours = " / ".join(format(r["g_ours"], ".4f") for r in rows)
    return "\n".join([
        "| | paper | ours, paper's convention (σ_b² = 2/n) | ours, the convention the text states (σ_b² = 0) | "
        f"ours, toolkit init (Glorot, b_t = {gate:g}) |".replace("-", "−"),
        "|---|---|---|---|---|",
        f"| Table 1, c = {cs}: g(·) | {g_paper} | {g_ours} | | |".replace("-", "−"),
        f"| Table 1: highway TSDI | {joined('tsdi_paper')} | {joined('tsdi_ours_paper_convention')} | "
        f"{joined('tsdi_ours_stated_convention')} | {joined('tsdi_ours_toolkit')} |",
        f"| eq 6, classical | {eq('classical')} |",
        f"| eq 14, residual | {eq('residual')} |",
        f"| gated (section 3), k = 1 | {eq('gated')} |",
    ])


def _sdi_monte_carlo(root: Path) -> str:
    from throughway.experiments.sdi_table import _max_z

    summary = _json(root, "sdi/results.json")
    return (f"Monte Carlo ({summary['config']['mc_samples']} draws of the real initialisers) agrees with the analytic "
            f"values within {_max_z(summary):.2f} standard errors everywhere (tested).")


def _identity_distance(root: Path) -> str:
    summary = _json(root, "sdi/identity-distance/results.json")
    config = summary["config"]
    rel = {r["arch"]: r["relation"] for r in summary["runs"]}
    travelled = [r["travelled_sq_at_end"] for r in rel.values()]
    change = {a: r["identity_sq_at_end"] - r["identity_sq_at_init"] for a, r in rel.items()}
    residual = rel["residual"]
    initial = ", ".join(format(r["identity_sq_at_init"], ".0f") for r in rel.values())
    return (
        f"Beyond the paper, `throughway reproduce identity-distance` logs during MNIST training the distance "
        f"travelled from initialisation, the path length, and the distance to the nearest identity configuration "
        f"(`results/sdi/identity-distance`, d = {summary['runs'][0]['depth']}, {config['epochs']} epochs). SDI does "
        f"not predict the optimiser's path. The squared distance travelled is {min(travelled):.0f}–{max(travelled):.0f} "
        f"for plain, residual and gated nets alike, while their SDI at initialisation differs "
        f"{max(r['identity_sq_at_init'] for r in rel.values()) / min(r['identity_sq_at_init'] for r in rel.values()):.0f}"
        f"-fold ({initial}); plain and residual "
        f"blocks move *away* from the paper's identity configuration during training ({change['plain']:+.0f} and "
        f"{change['residual']:+.0f}), the gated blocks barely towards theirs ({change['gated']:+.1f}); the distance "
        f"to the *nearest* identity configuration of a residual block (silencing its last layer unit by unit: "
        f"{residual['nearest_identity_sq_at_init']:.0f}) is "
        f"{residual['nearest_identity_sq_at_init'] / residual['identity_sq_at_init']:.2f} of the paper's "
        f"({residual['identity_sq_at_init']:.0f})."
    ).replace("+-", "−").replace("(-", "(−")
