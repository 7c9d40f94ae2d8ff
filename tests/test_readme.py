"""The generated blocks of README.md and docs/ (tools.readme): CI fails when they differ from results/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import readme
from tools.readme.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


def test_repository_pages_match_the_results_files(capsys):
    # The check CI runs: every generated block of README.md and docs/**/*.md is what results/ gives.
    status = main(["--check"])
    out = capsys.readouterr().out
    assert status == 0, out
    files = readme.generated_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "cli.md" in files
    names = [name for path in files for name in readme.block_names(path.read_text())]
    assert len(names) >= 6 and set(names) <= set(readme.RENDERERS)
    # every renderer is used by some page (a block moved off a page must not leave a dead renderer)
    assert set(readme.RENDERERS) == set(names)


def _fake(tmp_path: Path, text: str) -> tuple[Path, Path]:
    results = tmp_path / "results"
    results.mkdir()
    (results / "x.json").write_text(json.dumps({"value": 1.5}))
    path = tmp_path / "README.md"
    path.write_text(text)
    return path, results


@pytest.fixture
def fake_renderer(monkeypatch):
    monkeypatch.setitem(readme.RENDERERS, "test-value", lambda root: f"{readme._json(root, 'x.json')['value']:.2f}")
    monkeypatch.setitem(readme.RENDERERS, "test-table",
                        lambda root: f"| a |\n|---|\n| {readme._json(root, 'x.json')['value']} |")


def test_check_names_differing_blocks_and_rewrite_fixes_them(tmp_path, capsys, fake_renderer):
    text = ("intro <!-- generated:test-value -->9.99<!-- /generated:test-value --> end\n\n"
            "<!-- generated:test-table -->\n| a |\n|---|\n| 1.5 |\n<!-- /generated:test-table -->\n")
    path, results = _fake(tmp_path, text)
    assert main(["--check", "--results", str(results), str(path)]) == 1
    assert "test-value" in capsys.readouterr().out
    assert path.read_text() == text  # --check changes nothing
    assert main(["--results", str(results), str(path)]) == 0
    assert "<!-- generated:test-value -->1.50<!-- /generated:test-value --> end" in path.read_text()
    assert path.read_text().endswith(text.split("end\n\n")[1])  # the matching block is untouched
    assert main(["--check", "--results", str(results), str(path)]) == 0


def test_unknown_block_or_missing_file_exits_2_naming_it(tmp_path, capsys, fake_renderer):
    path, results = _fake(tmp_path, "<!-- generated:no-such-block -->x<!-- /generated:no-such-block -->\n")
    assert main(["--check", "--results", str(results), str(path)]) == 2
    assert "no-such-block" in capsys.readouterr().err
    path.write_text("<!-- generated:test-value -->x<!-- /generated:test-value -->\n")
    (results / "x.json").unlink()
    assert main(["--check", "--results", str(results), str(path)]) == 2
    assert "x.json" in capsys.readouterr().err


def test_the_cli_page_lists_every_command_and_option():
    # docs/cli.md is rendered from the parser: every sub-command and every option string appears on it.
    import argparse

    from throughway.cli import build_parser
    from tools.readme.sections.cli_reference import _commands

    page = (ROOT / "docs" / "cli.md").read_text()
    for prog, parser in _commands(build_parser(), "throughway"):
        assert f"`{prog}`" in page, prog
        for action in parser._actions:
            if action.help != argparse.SUPPRESS:
                for option in action.option_strings:
                    assert option in page, f"{prog} {option}"


def test_figures56_contrary_pairs_counts_pairs_at_equal_loss():
    def trace(network, points):
        return {"network": network, "hessian": [{"loss": loss, "condition": c} for loss, c in points]}

    summary = {"traces": [trace("shortcut2-zero", [(1.0, 2.0), (0.5, 50.0)]),
                          trace("orthogonal", [(1.02, 10.0), (0.51, 20.0), (3.0, 1.0)]),
                          trace("xavier", [(1.0, None)])]}
    result = readme.figures56_contrary_pairs(summary)
    assert result["pairs"] == 2 and result["contrary"] == 1  # (1.0 vs 1.02): fine; (0.5 vs 0.51): contrary


def _gate_family_summary(done_depths, pending_depth, p_values):
    # A gate-family results.json in the shape `gate_family.summarize` writes: two families, 3 seeds.
    cells, comparisons = [], []
    for depth in [*done_depths, pending_depth]:
        for family, base in (("gated", 2.0), ("rezero", 2.5)):
            n = 3 if depth in done_depths else 0
            values = [base + 0.1 * s for s in range(n)]
            cells.append({"family": family, "depth": depth, "test_error_pct": {
                "mean": sum(values) / n if n else None, "std": 0.1 if n else None, "n": n, "values": values}})
        p = p_values.get(depth)
        comparisons.append({"depth": depth, "a": "gated", "b": "rezero", "seeds": [0, 1, 2] if p else [],
                            "test": {"mean_difference": -0.5 if p else None, "p_value": p, "n": 3 if p else 0},
                            "verdict": ("gated better" if p < 0.05 else "no significant difference") if p else "too few"})
    return {"config": {"depths": [*done_depths, pending_depth], "families": ["gated", "rezero"], "seeds": 3},
            "cells": cells, "comparisons": comparisons}


def test_gate_family_findings_and_row_say_only_what_the_tests_support(tmp_path):
    from tools.readme.sections.gate_family import _gate_family_findings
    from tools.readme.sections.overview import _gate_family_row

    (tmp_path / "gate-family-init").mkdir()
    (tmp_path / "gate-family-init" / "results.json").write_text(json.dumps({"config": {"depths": [2]}, "points": [
        {"family": f, "depth": 2, "distance_to_identity": {"mean": v}} for f, v in
        (("rezero", 0.0), ("gated", 1.0), ("residual", 99.0))]}))
    assert _gate_family_findings(tmp_path) == "Pending: no trained cell is committed yet."
    assert "trained study pending" in _gate_family_row(tmp_path)
    (tmp_path / "gate-family").mkdir()
    summary = _gate_family_summary([2, 10], 20, {2: 0.4, 10: 0.01})
    (tmp_path / "gate-family" / "results.json").write_text(json.dumps(summary))
    text = _gate_family_findings(tmp_path)
    assert "- **d = 2**: lowest mean test error gated 2.10" in text
    assert "no significant difference from 1 family (p = 0.4 to 0.4)" in text
    assert "gated better than rezero (gated − rezero -0.50 points, p = 0.01)" in text
    assert "d = 20" in text.splitlines()[-1] and "Pending" in text.splitlines()[-1]
    assert "Bonferroni threshold of 0.05 / 2 = 0.025; 1 of the 2 pass it (gated better than rezero at d = 10)." in text
    row = _gate_family_row(tmp_path)
    assert "d = 2, 10 (3 seeds): 2 paired tests" in row and "1 gated better" in row and "d = 20 pending" in row


def test_gate_family_findings_name_the_removal_orders_that_a_paired_test_separates(tmp_path):
    from tools.readme.sections.gate_family import _gate_family_findings

    summary = _gate_family_summary([2, 10], 20, {2: 0.4, 10: 0.01})
    shares = {10: [(0.99, 0.95), (0.98, 0.95), (0.99, 0.94)], 20: [(0.99, 0.95)] * 3}
    for cell in summary["cells"]:
        if cell["family"] == "gated" and cell["depth"] in shares:  # d = 20 is unfinished: not a finding
            cell["removal"] = [{"seed": s, "half_share_greedy": g, "half_share_random": r}
                               for s, (g, r) in enumerate(shares[cell["depth"]])]
    (tmp_path / "gate-family").mkdir()
    (tmp_path / "gate-family" / "results.json").write_text(json.dumps(summary))
    line = next(x for x in _gate_family_findings(tmp_path).splitlines() if x.startswith("- **Removal**"))
    assert "gated: d = 10 gate order +4.0 points (p = " in line and "d = 20" not in line
    assert "Bonferroni over this test: threshold 0.05, 1 passes it." in line
