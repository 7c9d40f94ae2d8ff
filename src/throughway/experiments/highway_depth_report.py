"""The highway search's table and the paper's observations against ours (experiments.highway_depth),
made from its results.json summary alone (highway paper §3.1, figure 1)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..report.tables import table_header, table_row

__all__ = ["PAPER_OBSERVATIONS", "PAPER_SEARCH_TRIALS", "RANKINGS", "observations", "ranked_loss", "table_markdown",
           "findings_markdown"]

PAPER_OBSERVATIONS = (
    "10- and 20-layer plain nets reach a mean loss below 1e-4",
    "plain nets become harder to optimise as depth grows",
    "50- and 100-layer highway nets perform like the 10- and 20-layer ones",
    "the 100-layer highway net's loss is more than two orders of magnitude below the 100-layer plain net's",
)



PAPER_SEARCH_TRIALS = 100  # highway §3.1: 100 runs of random search per architecture and depth

# What a trial is ranked by (Config.rank): the key of its summary entry and the words the table uses.
RANKINGS: dict[str, tuple[str, str]] = {
    "best-loss": ("best_train_loss", "the lowest mean training cross-entropy of any epoch (the paper: \"the best "
                                     "training set error achieved\")"),
    "last-loss": ("final_train_loss", "the last epoch's mean training cross-entropy"),
}


def ranked_loss(summary: dict[str, Any], entry: dict[str, Any] | None) -> float | None:
    """The loss that ranked `entry` (a trial of `summary`, or a cell's "best"): its lowest training
    loss under rank "best-loss", its last under "last-loss". Summaries written before the rank option
    existed were ranked by the last epoch's loss."""
    if entry is None:
        return None
    return entry.get(_rank_key(summary))


def _rank_key(summary: dict[str, Any]) -> str:
    return RANKINGS[summary.get("config", {}).get("rank", "last-loss")][0]


def _top10_mean(summary: dict[str, Any], cell: dict[str, Any]) -> float | None:
    """The mean ranked loss of a cell's top 10 trials."""
    return cell["top10"].get(f"mean_{_rank_key(summary)}")



def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return "all diverged" if math.isinf(value) else f"{value:.2e}"



def observations(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each of the paper's observations (highway §3.1, PAPER_OBSERVATIONS) beside what our numbers
    say and a verdict: "holds", "does not hold", or "not measured" while a cell it needs is empty;
    observation 1 (a loss the 10- and 20-layer plain nets reach) is "inconclusive" rather than "does
    not hold" when it is not reached by a search with fewer trials than the paper's 100.

    "Loss" is the loss that ranks the trials (`ranked_loss`: the lowest of any epoch, or the last
    epoch's for rank "last-loss") of the best trial (figure 1 left); observation 1 quotes the top-10
    mean too. Observation 3 holds when the best 50- and 100-layer highway losses are within a factor
    of 10 of the better of the 10- and 20-layer ones (the paper gives no tolerance: ours). A cell
    whose finished trials all diverged counts as an infinite loss."""
    by = {(c["arch"], c["layers"]): c for c in summary["cells"]}

    def best(arch: str, layers: int) -> float | None:
        cell = by.get((arch, layers))
        if not cell:
            return None
        if cell["best"]:
            return ranked_loss(summary, cell["best"])
        return math.inf if cell.get("finished", 0) > 0 else None

    def top(arch: str, layers: int) -> float | None:
        cell = by.get((arch, layers))
        return _top10_mean(summary, cell) if cell else None

    def verdict(ok: bool | None) -> str:
        return "not measured" if ok is None else ("holds" if ok else "does not hold")

    layers = sorted({c["layers"] for c in summary["cells"]})
    out = []
    shallow = [(n, best("plain", n), top("plain", n)) for n in (10, 20) if n in layers]
    values = [b for _, b, _ in shallow]
    reached = None if not values or None in values else all(v is not None and v < 1e-4 for v in values)
    first = verdict(reached)
    config = summary.get("config", {})
    trials = config.get("trials", PAPER_SEARCH_TRIALS)
    if reached is False and trials < PAPER_SEARCH_TRIALS:
        # Not reaching a loss in a smaller search than the paper's is no evidence that it cannot be reached.
        first = (f"inconclusive: not reached with {trials} trials of {config.get('epochs')} epochs per depth "
                 f"(the paper: {PAPER_SEARCH_TRIALS} trials; its epochs unstated)")
    out.append(("; ".join(f"plain {n} layers: best {_fmt(b)}, top-10 mean {_fmt(t)}" for n, b, t in shallow)
                or "not run", first))
    plain = [(n, best("plain", n)) for n in layers]
    known = [v for _, v in plain if v is not None]
    out.append(("plain best by depth: " + ", ".join(f"{n}: {_fmt(v)}" for n, v in plain),
                verdict(None if len(known) < 2 or None in [v for _, v in plain]
                        else all(a <= b for a, b in zip(known, known[1:])) and known[-1] > known[0])))
    high = [(n, best("highway", n)) for n in layers]
    ref = [v for n, v in high if n in (10, 20) and v is not None]
    deep = [(n, v) for n, v in high if n in (50, 100)]
    ok = None
    if ref and deep and all(v is not None for _, v in deep):
        ok = all(v is not None and v <= 10 * min(ref) for _, v in deep)
    out.append(("highway best by depth: " + ", ".join(f"{n}: {_fmt(v)}" for n, v in high), verdict(ok)))
    p100, h100 = best("plain", 100), best("highway", 100)
    if p100 is not None and h100 is not None and h100 > 0:
        ratio = p100 / h100 if math.isfinite(h100) else 0.0
        out.append((f"100 layers: plain {_fmt(p100)} / highway {_fmt(h100)} = {ratio:.3g}×", verdict(ratio > 100)))
    else:
        out.append(("100 layers: not (yet) available for both", verdict(None)))
    return [(paper, ours, v) for paper, (ours, v) in zip(PAPER_OBSERVATIONS, out)]



def table_markdown(summary: dict[str, Any]) -> str:
    """The table of the best trial's (and the top 10's mean) ranked training loss per depth (`ranked_loss`:
    the lowest of any epoch by default, the last epoch's for rank "last-loss"), and the observations."""
    config = summary["config"]
    by = {(c["arch"], c["layers"]): c for c in summary["cells"]}
    archs = config["archs"]
    header = ["layers"]
    for arch in archs:
        header += [f"{arch} best", f"{arch} top-10 mean", f"{arch} trials (finished/diverged/total)"]
    rank = config.get("rank", "last-loss")
    title = "Lowest training loss reached" if rank == "best-loss" else "Final training loss"
    lines = [f"{title} (cross-entropy) — highway paper §3.1 / figure 1", "",
             *table_header(header)]
    for layers in config["layers"]:
        row = [str(layers)]
        for arch in archs:
            cell = by[(arch, layers)]
            row += [_fmt(ranked_loss(summary, cell["best"])) if cell["best"] else "—",
                    _fmt(_top10_mean(summary, cell)) + (f" (n={cell['top10']['n']})" if cell["top10"]["n"] < 10 else ""),
                    f"{cell['finished']}/{cell['diverged']}/{config['trials']}"
                    + (f" ({cell['running']} running)" if cell["running"] else "")]
        lines.append(table_row(row))
    lines += ["", *table_header(["the paper says (highway §3.1)", "ours", "verdict"])]
    lines += [table_row(observation) for observation in observations(summary)]
    notes = [f"{config['epochs']} epochs per trial, {config['trials']} trials per architecture and depth "
             f"(paper: 100), recipe highway-mnist (SGD + momentum, exponential decay), batch 100, "
             f"{'60,000' if config['train_on_full'] else '50,000'} training images"
             + (f" (only the first {config['limit']})" if config["limit"] else "") + ".",
             f"Ranked by {RANKINGS[rank][1]} (rank {rank}; training mode); diverged trials rank last."
             + (" The paper (footnote 3, §4) searched \"to minimize the best training set error achieved\"; "
                "figure 1 plots the mean cross-entropy, which ranks here." if rank == "best-loss" else ""),
             "Layers: L = the first plain layer + L − 1 plain (71 units) or highway (50 blocks) layers; the "
             "softmax output layer is not counted (highway §3.1).",
             "Initialisation: " + {"normalized": "normalized (highway §3.1 [16, 17]): Glorot uniform for tanh nets, "
                                                 "He normal for ReLU nets"}.get(
                 config.get("init", "glorot_uniform"), config.get("init", "glorot_uniform"))
             + ("" if "init" in config else " (written before the init option existed)") + "; transform-gate "
             "biases as searched.",
             "Search space (ours; the paper gives only the gate-bias range): "
             + "; ".join(f"{k}: {v}" for k, v in summary["search_space"].items()) + "."]
    return "\n".join(lines + [""] + notes) + "\n"


def findings_markdown(summary: dict[str, Any]) -> str:
    """What the search shows against the paper, in words: what is reproduced (plain nets get harder to optimise
    with depth, highway nets hardly notice), what is inconclusive and why, and the diverged trials. What
    `throughway report` writes as findings.md and the docs page shows; a pending line until every cell has a
    finished trial."""
    if not summary["cells"] or not all(c.get("best") for c in summary["cells"]):
        return "Pending: not every cell has a finished trial yet.\n"
    config = summary["config"]
    by = {(c["arch"], c["layers"]): c for c in summary["cells"]}
    layers = config["layers"]
    missing = [f"{arch} {n}-layer" for arch in ("plain", "highway") for n in layers if (arch, n) not in by]
    if missing:  # a search of one architecture (--archs plain) has nothing to compare
        return (f"No findings: they compare plain and highway nets at each depth, and this search has no "
                f"{', '.join(missing)} cell.\n")

    def best(arch: str, n: int) -> float:
        return by[(arch, n)]["best"]["final_train_loss"]

    plain = [best("plain", n) for n in layers]
    high = [best("highway", n) for n in layers]
    ratio = best("plain", layers[-1]) / best("highway", layers[-1])
    falling = all(len(c["best"]["train_loss"]) > 1 and c["best"]["train_loss"][-1] < c["best"]["train_loss"][-2]
                  for c in summary["cells"])
    diverged = [x for x in summary["trials"] if x.get("diverged_at") is not None]
    finished = [x for x in summary["trials"] if x.get("diverged_at") is None and x.get("state") == "finished"]
    activations = sorted({x["activation"] for x in diverged})
    counts = [c["diverged"] for c in summary["cells"]]
    verdict = observations(summary)[0][2]
    shallow = [n for n in layers if n in (10, 20)]
    shallow_best = [best("plain", n) for n in shallow]
    return "\n".join([
        "What it shows, against the paper:",
        "",  # Python-Markdown (the docs site) reads a list glued to its paragraph as the paragraph's text
        f"- **Reproduced.** Plain nets get harder to optimise as depth grows. Their best final training loss is "
        f"{', '.join(f'{v:.1e}' for v in plain[:-1])} and {plain[-1]:.1e} at {', '.join(map(str, layers[:-1]))} and "
        f"{layers[-1]} layers. Highway nets hardly notice depth: {', '.join(f'{v:.1e}' for v in high[:-1])} and "
        f"{high[-1]:.1e}. At {layers[-1]} layers the best highway net's loss is {ratio:.0f} times lower than the best "
        f"plain net's; the paper says \"more than 2 orders of magnitude\".",
        f"- **Inconclusive.** The paper's {'- and '.join(map(str, shallow))}-layer plain nets reach a loss below 1e-4; "
        f"our best are {' and '.join(f'{v:.1e}' for v in shallow_best)}. The verdict is "
        f"\"{verdict.split(':')[0]}\": our search is smaller than the paper's ({config['trials']} trials, not "
        f"{PAPER_SEARCH_TRIALS}), and its runs are short ({config['epochs']} epochs on "
        f"{'all' if config['limit'] is None else format(config['limit'], ',')} images, chosen to fit this 2-core machine). "
        + ("Every best curve is still falling at its last epoch, so the gap is what a shorter search would give, "
           "not evidence against the paper." if falling else "Not every best curve is still falling at its last epoch."),
        "- No trial diverged." if not (diverged and finished) else
        f"- Diverged trials rank last. Each cell lost {min(counts)}–{max(counts)} of its {config['trials']} trials to "
        f"divergence (the table's second count). All {len(diverged)} diverged trials are {' or '.join(a.replace('relu', 'ReLU') for a in activations)} "
        f"nets, most with large learning rates: their median learning rate is "
        f"{statistics.median(x['lr'] for x in diverged):.2g}, against "
        f"{statistics.median(x['lr'] for x in finished):.2g} for the trials that finished. The learning-rate range "
        f"is ours.",
    ]) + "\n"
