"""The repository's generated documentation blocks: every quoted table and number, rendered from results/.

Tooling for this repository, not part of the installed package (it reads results/ and the docs of a
checkout). README.md and the pages under docs/ mark what they quote from the committed results files:

    <!-- generated:NAME -->
    ...markdown...
    <!-- /generated:NAME -->

(a block: the opening marker ends its line) or, inside a sentence, an inline span
`<!-- generated:NAME -->1.467<!-- /generated:NAME -->`. `render_text` rewrites the inside of every
marker pair from `RENDERERS[NAME](root)`, where `root` is the results folder. From the repository root,

    python -m tools.readme            rewrite every block of README.md and docs/**/*.md
    python -m tools.readme --check    change nothing; exit 1 naming the files and blocks that differ

and `tests/test_readme.py` runs the check, so a table or number that the results files do not give
fails CI.

The renderers live in `tools.readme.sections`, one module per page (timings, depth_study, gates,
identity, hessian, batched, conv, cli_reference). They place what the studies write, they do not
word it: a study's findings are written by its own report (`write_report` writes findings.md beside
table.md, the text `throughway report` saves), and a renderer places that file with
`sections.common._report_file`, which fails when the file is stale. Adding a block (e.g. a new study's
table): write one function in its page's module

    def _gate_family_table(root: Path) -> str:
        return gate_family.table_markdown(_json(root, "gate-family/results.json"))

that reads committed files under `root` only (`_json`, `_text`, `_report_file` of `sections.common`) and
returns markdown made by the experiment's own functions (`table_markdown`, `findings_markdown`, ...);
add one entry `"gate-family-table": _gate_family_table` to `RENDERERS`; put the two markers in the page
and run `python -m tools.readme`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from .sections.batched import (_batched_benchmark, _batched_step, _highway_depth_table, _highway_depth_text,
                               _paper_scale_estimate)
from .sections.cli_reference import cli_reference
from .sections.common import _json, _match, _text
from .sections.conv import _conv_table
from .sections.depth_study import (_bn_stats, _mnist_depth_batchnorm_ablation, _mnist_depth_findings,
                                   _mnist_depth_stem_ablation, _mnist_depth_stem_dense_k_ratio,
                                   _mnist_depth_stem_dense_table, _mnist_depth_table,
                                   _mnist_depth_selection, _mnist_depth_val_selection, _mnist_depth_val_ties)
from .sections.gate_family import (_gate_family_datasets, _gate_family_errors_prose, _gate_family_findings,
                                   _gate_family_first_epoch, _gate_family_init_table,
                                   _gate_family_removal_prose, _gate_family_replay, _gate_family_rezero_condition,
                                   _gate_family_trained)
from .sections.gates import _gates_table, _gates_text, _highway_analysis_table
from .sections.hessian import (_hessian_figure3, _hessian_figure4, _hessian_figure7, _hessian_figure8,
                               _hessian_figures56, _hessian_speed, _hessian_theorem2)
from throughway.experiments.hessian_dynamics import figures56_contrary_pairs
from .sections.identity import _identity_distance, _sdi_monte_carlo, _sdi_table
from .sections.overview import _reproductions_table
from .sections.layer_drop import _layer_drop_findings, _layer_drop_setup, _layer_drop_status, _layer_drop_table
from .sections.transformer_gates import (_transformer_gates_findings, _transformer_gates_first_layers,
                                         _transformer_gates_orders, _transformer_gates_setup, _transformer_gates_table)
from .sections.device import RENDERERS as DEVICE_RENDERERS
from .sections.timings import _benchmarks, _main_job_time, _test_suite_time

__all__ = ["RENDERERS", "BLOCK", "REPOSITORY", "block_names", "render_text", "differing_blocks", "update_file",
           "generated_files", "figures56_contrary_pairs", "_json", "_match", "_text"]

# The checkout this tooling belongs to: README.md, docs/ and results/ are read from here by default.
REPOSITORY = Path(__file__).resolve().parents[2]

# <!-- generated:NAME -->BODY<!-- /generated:NAME -->, NAME of letters, digits, '.', '_', '-'.
BLOCK = re.compile(r"<!-- generated:(?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /generated:(?P=name) -->", re.DOTALL)


RENDERERS: dict[str, Callable[[Path], str]] = {
    "reproductions": _reproductions_table,
    "main-job-time": _main_job_time,
    "test-suite-time": _test_suite_time,
    "mnist-depth-table": _mnist_depth_table,
    "mnist-depth-findings": _mnist_depth_findings,
    "mnist-depth-selection": _mnist_depth_selection,
    "mnist-depth-val-selection": _mnist_depth_val_selection,
    "mnist-depth-val-ties": _mnist_depth_val_ties,
    "mnist-depth-stem-ablation": _mnist_depth_stem_ablation,
    "bn-stats": _bn_stats,
    "mnist-depth-batchnorm-ablation": _mnist_depth_batchnorm_ablation,
    "mnist-depth-stem-dense-table": _mnist_depth_stem_dense_table,
    "mnist-depth-stem-dense-k-ratio": _mnist_depth_stem_dense_k_ratio,
    "gates-table": _gates_table,
    "layer-drop-findings": _layer_drop_findings,
    "layer-drop-table": _layer_drop_table,
    "layer-drop-setup": _layer_drop_setup,
    "layer-drop-status": _layer_drop_status,
    "transformer-gates-findings": _transformer_gates_findings,
    "transformer-gates-table": _transformer_gates_table,
    "transformer-gates-orders": _transformer_gates_orders,
    "transformer-gates-setup": _transformer_gates_setup,
    "transformer-gates-first-layers": _transformer_gates_first_layers,
    "gate-family-init-table": _gate_family_init_table,
    "gate-family-trained": _gate_family_trained,
    "highway-paper-scale-estimate": _paper_scale_estimate,
    "gate-family-findings": _gate_family_findings,
    "gate-family-datasets": _gate_family_datasets,
    "gate-family-removal-prose": _gate_family_removal_prose,
    "gate-family-errors-prose": _gate_family_errors_prose,
    "gate-family-first-epoch": _gate_family_first_epoch,
    "gate-family-replay": _gate_family_replay,
    "gate-family-rezero-condition": _gate_family_rezero_condition,
    "gates-text": _gates_text,
    "highway-analysis-table": _highway_analysis_table,
    "sdi-table": _sdi_table,
    "sdi-monte-carlo": _sdi_monte_carlo,
    "identity-distance": _identity_distance,
    "hessian-theorem2": _hessian_theorem2,
    "hessian-figure4": _hessian_figure4,
    "hessian-figures5-6": _hessian_figures56,
    "hessian-figure7": _hessian_figure7,
    "hessian-figure8": _hessian_figure8,
    "hessian-figure3": _hessian_figure3,
    "highway-depth-table": _highway_depth_table,
    "highway-depth-text": _highway_depth_text,
    "hessian-speed": _hessian_speed,
    "batched-benchmark": _batched_benchmark,
    "batched-step": _batched_step,
    "conv-table": _conv_table,
    "benchmarks": _benchmarks,
    "cli-reference": cli_reference,
    **DEVICE_RENDERERS,
}


# ---------------------------------------------------------------------------------------------

def block_names(text: str) -> list[str]:
    """The names of the generated blocks and spans in `text`, in order."""
    return [m.group("name") for m in BLOCK.finditer(text)]


def _render_body(name: str, body: str, root: Path) -> str:
    if name not in RENDERERS:
        raise KeyError(f"generated block {name!r} is not known; known blocks: {sorted(RENDERERS)}")
    rendered = RENDERERS[name](Path(root)).strip("\n")
    return f"\n{rendered}\n" if body.startswith("\n") else rendered.strip()


def render_text(text: str, root: str | Path) -> str:
    """`text` with the inside of every generated block and span rewritten from the files under `root`.

    A block (its opening marker ends a line) keeps its markers on their own lines; a span stays
    inline. Raises KeyError naming an unknown block and FileNotFoundError naming a missing file.
    """
    return BLOCK.sub(lambda m: (f"<!-- generated:{m.group('name')} -->"
                                f"{_render_body(m.group('name'), m.group('body'), Path(root))}"
                                f"<!-- /generated:{m.group('name')} -->"), text)


def differing_blocks(text: str, root: str | Path) -> list[str]:
    """Names of the blocks of `text` whose inside differs from what the results under `root` give."""
    return [m.group("name") for m in BLOCK.finditer(text)
            if m.group("body") != _render_body(m.group("name"), m.group("body"), Path(root))]


def update_file(path: str | Path, root: str | Path | None = None, *, check: bool = False) -> list[str]:
    """Rewrite the generated blocks of the markdown file `path` from `root` (default: REPOSITORY/results).

    Returns the names of the blocks that differed before; with `check` the file is left alone.
    """
    path = Path(path)
    root = Path(root) if root is not None else REPOSITORY / "results"
    text = path.read_text()
    names = differing_blocks(text, root)
    if names and not check:
        path.write_text(render_text(text, root))
    return names


def generated_files(repository: str | Path = REPOSITORY) -> list[Path]:
    """The markdown files whose generated blocks the check covers: README.md and every docs/**/*.md."""
    repository = Path(repository)
    return [repository / "README.md"] + sorted((repository / "docs").rglob("*.md"))
