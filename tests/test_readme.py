"""The generated blocks of README.md and docs/ (tools.readme): CI fails when they differ from results/."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
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
    from throughway.experiments.gate_family_report import findings_markdown
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
    text = findings_markdown(summary)
    assert "- **d = 2**: lowest mean test error gated 2.10" in text
    assert "no significant difference from 1 family (p = 0.4 to 0.4)" in text
    assert "gated better than rezero (gated − rezero -0.50 points, p = 0.01)" in text
    assert "d = 20" in text.splitlines()[-1] and "Pending" in text.splitlines()[-1]
    assert "Bonferroni threshold of 0.05 / 2 = 0.025; 1 of the 2 pass it (gated better than rezero at d = 10)." in text
    row = _gate_family_row(tmp_path)
    assert "d = 2, 10 (3 seeds): 2 paired tests" in row and "1 gated better" in row and "d = 20 pending" in row


def test_gate_family_findings_name_the_removal_orders_that_a_paired_test_separates(tmp_path):
    from throughway.experiments.gate_family_report import findings_markdown

    summary = _gate_family_summary([2, 10], 20, {2: 0.4, 10: 0.01})
    shares = {10: [(0.99, 0.95), (0.98, 0.95), (0.99, 0.94)], 20: [(0.99, 0.95)] * 3}
    for cell in summary["cells"]:
        if cell["family"] == "gated" and cell["depth"] in shares:  # d = 20 is unfinished: not a finding
            cell["removal"] = [{"seed": s, "half_share_greedy": g, "half_share_random": r}
                               for s, (g, r) in enumerate(shares[cell["depth"]])]
    line = next(x for x in findings_markdown(summary).splitlines() if x.startswith("- **Removal**"))
    assert "gated: d = 10 gate order +4.0 points (p = " in line and "d = 20" not in line
    assert "Bonferroni over this test: threshold 0.05, 1 passes it (gated at d = 10)." in line


# ---------------------------------------------------------------------------------------------------------
# The gate-family and MNIST pages' prose says exactly what the committed numbers support: each sentence that
# carries a number is rendered from results/ (tools/readme/sections), and checked here against the numbers
# recomputed from the committed files.

RESULTS = ROOT / "results"
GATE_FAMILY_PAGE = ROOT / "docs" / "reproductions" / "gate-family.md"


def _committed_gate_family() -> dict:
    return json.loads((RESULTS / "gate-family" / "results.json").read_text())


def test_removal_prose_says_which_tests_survive_bonferroni_and_the_size_of_the_gains():
    from throughway.experiments.gate_family_report import removal_comparisons
    from throughway.report.stats import SIGNIFICANCE
    from throughway.experiments.gate_family_report import RELU_FAMILIES, removal_rows
    from tools.readme.sections.gate_family import _gate_family_removal_prose

    summary = _committed_gate_family()
    rows = removal_rows(summary)
    assert len(rows) == 20 and all(r in removal_comparisons(summary) for r in rows)
    threshold = SIGNIFICANCE / len(rows)
    text = _gate_family_removal_prose(RESULTS)
    passing = [r for r in rows if r["test"]["p_value"] < threshold and r["kept_difference"] > 0]
    # what survives the correction, named by family and depth; nothing else named as surviving
    assert {(r["family"], r["depth"]) for r in passing} == {(f, d) for f in ("gated", "gated-nf", "rezero-nf")
                                                            for d in (50, 100)}
    assert "for gated at d = 50, 100; gated-nf at d = 50, 100; rezero-nf at d = 50, 100." in text
    # the relu nets' d = 20 results are significant only uncorrected (the old prose said "from d = 20 on")
    at20 = {r["family"]: r["test"]["p_value"] for r in rows if r["depth"] == 20 and r["family"] in RELU_FAMILIES}
    assert all(threshold < p < SIGNIFICANCE for p in at20.values())
    assert f"gated at d = 20 (p = {at20['gated']:.2g}), gated-nf at d = 20 (p = {at20['gated-nf']:.2g})" in text
    # the advantage is in the size: +4.0 to +7.7 where the relu gates pass, at most +1.7 for the others
    relu = [r["kept_difference"] for r in passing if r["family"] in RELU_FAMILIES]
    others = [r["kept_difference"] for r in rows if r["family"] not in RELU_FAMILIES]
    assert f"{min(relu):+.1f} to {max(relu):+.1f} points" in text and f"at most {max(others):+.1f}" in text
    assert min(relu) > 2 * max(others)
    assert "from d = 20 on, removing" not in GATE_FAMILY_PAGE.read_text()


def test_dead_gates_per_seed_are_said_against_the_removed_half():
    from tools.readme.sections.gate_family import _gate_family_removal_prose

    cell = next(c for c in _committed_gate_family()["cells"] if c["family"] == "gated" and c["depth"] == 100)
    dead = [p["dead_gates"] for p in cell["per_seed"]]
    half = cell["removal"][0]["half"]
    assert dead == [23, 25, 21, 22, 19] and half == 25 and all(r["half"] == half for r in cell["removal"])
    text = _gate_family_removal_prose(RESULTS)
    assert "number 23, 25, 21, 22, 19 in the 5 seeds, so in 4 of 5 seeds the removed half also takes live blocks" in text
    assert all(r["half_share_greedy"] > 0.999 for r in cell["removal"])  # "at no measurable cost"
    assert "since the blocks it removes first are the ones its dead gates" not in GATE_FAMILY_PAGE.read_text()


def test_the_first_epoch_blow_up_is_said_with_its_final_ranks_not_as_a_recovery():
    from tools.readme.sections.gate_family import _gate_family_first_epoch

    summary = _committed_gate_family()
    errors = {c["family"]: c["test_error_pct"]["mean"] for c in summary["cells"] if c["depth"] == 100}
    blown = {f for f in errors if min(summary["curves"][f"{f}-d100-s{s}"]["train_loss"][0] for s in range(5)) >= 1000}
    assert blown == {"residual-nf", "gated-nf"}
    assert set(sorted(errors, key=errors.get)[-2:]) == blown  # the two worst of seven at d = 100
    text = _gate_family_first_epoch(RESULTS)
    assert "end with the 2 highest mean test errors of the 7 families" in text
    assert "All of them recover" not in GATE_FAMILY_PAGE.read_text()


def test_the_d100_gated_and_residual_runs_are_replays_of_mnist_depth_val():
    from tools.readme.sections.gate_family import _gate_family_replay, replay_comparison

    compared = replay_comparison(RESULTS)
    assert compared[100]["replay"] and compared[100]["loss_gap"] < 1e-6
    assert not any(compared[d]["replay"] for d in (2, 10, 20, 50))
    gap = max(compared[d]["max_mean_gap"] for d in (2, 10, 20, 50))
    assert 0.1 < gap < 0.13
    text = _gate_family_replay(RESULTS)
    assert "d = 100 gated and residual runs are replays" in text and f"up to {gap:.2f} points" in text
    assert "not across stack compositions" in text
    assert "not across stack compositions" in (ROOT / "docs" / "guide.md").read_text()  # the reproducibility docs


@pytest.mark.parametrize("study,page,block", [("gate-family", "gate-family.md", "gate-family-findings"),
                                              ("mnist-depth", "mnist-depth.md", "mnist-depth-findings")])
def test_docs_findings_are_the_findings_file_that_throughway_report_writes(study, page, block, tmp_path):
    # issue 33: the words on the docs page are the study's own, written by `throughway report` beside its
    # results (with the Bonferroni count for gate-family), not made up by tools/readme.
    from throughway.cli import main as throughway
    from tools.readme import BLOCK

    copy = tmp_path / study
    copy.mkdir()
    shutil.copyfile(RESULTS / study / "results.json", copy / "results.json")  # the committed numbers alone
    with contextlib.redirect_stdout(io.StringIO()):
        assert throughway(["report", str(copy)]) == 0
    written = (copy / "findings.md").read_text()
    assert written == (RESULTS / study / "findings.md").read_text()
    shown = next(m.group("body") for m in BLOCK.finditer((ROOT / "docs" / "reproductions" / page).read_text())
                 if m.group("name") == block)
    assert shown.strip("\n") == written.rstrip("\n")
    if study == "gate-family":
        assert "Bonferroni threshold of 0.05 / 30 = 0.0017; 1 of the 30 pass it" in written


def test_the_readme_row_says_the_four_are_uncorrected_and_one_passes_bonferroni():
    from tools.readme.sections.overview import _gate_family_row

    row = _gate_family_row(RESULTS)
    assert "30 paired tests" in row and "4 gated better (the 4 at p < 0.05 uncorrected; 1 passes Bonferroni over the 30)" in row
    assert row in (ROOT / "README.md").read_text()


def test_layerscale_epsilon_mapping_is_stated_as_the_code_does_it():
    from throughway.layers import cait_layerscale_init

    # the code: our d stands for CaiT's depth; by branches (d/2 of them, CaiT's layers have two each) d/4 would
    by_d = {d: cait_layerscale_init(d) for d in (2, 10, 20, 50, 100)}
    by_branch = {d: cait_layerscale_init(d // 4) for d in (2, 10, 20, 50, 100)}
    assert by_d == {2: 0.1, 10: 0.1, 20: 1e-5, 50: 1e-6, 100: 1e-6}
    assert by_branch == {2: 0.1, 10: 0.1, 20: 0.1, 50: 0.1, 100: 1e-6}
    page = " ".join(GATE_FAMILY_PAGE.read_text().split())
    assert "So d = 20 (10 branches) gets 1e-5 and d = 50 (25 branches) 1e-6, where a CaiT with as many branches" in page
    assert "d = 2 and 10 get 0.1 and d = 100 1e-6 either way" in page


def test_rezero_condition_number_and_the_k1_hessians_are_said_as_measured():
    from tools.readme.sections.gate_family import _gate_family_rezero_condition

    points = json.loads((RESULTS / "gate-family-init" / "results.json").read_text())["points"]
    rezero = {p["depth"]: p["nonzero_condition"]["mean"] for p in points if p["family"] == "rezero"}
    assert round(rezero[2]) == 33 and round(max(rezero.values())) == 86
    assert _gate_family_rezero_condition(RESULTS) == "a non-zero condition number that grows from 33 at d = 2 to 86 at " \
                                                     "d = 50 (81 at d = 100)"
    # the gated proxies have d/2 more parameters (one k per block) than the residual ones: not the same Hessian
    params = {(p["family"], p["depth"]): p["parameters"] for p in points}
    assert all(params[("gated", d)] - params[("residual", d)] == d // 2 for d in (2, 10, 20, 50, 100))
    page = " ".join(GATE_FAMILY_PAGE.read_text().split())
    assert "Hessians at initialisation coincide" not in page and "stays near 100" not in page


def test_mnist_page_says_how_validation_ties_are_broken():
    from throughway.experiments.mnist_depth_report import selected_epoch
    from tools.readme.sections.depth_study import _mnist_depth_val_ties, validation_ties

    ties = validation_ties(RESULTS / "mnist-depth-val")
    assert ties["runs"] == 75 and len(ties["tied"]) == 8
    for name, tie in ties["tied"].items():  # the selection takes the earliest tied epoch
        history = json.loads((RESULTS / "mnist-depth-val" / "runs" / name / "results.json").read_text())["history"]
        assert selected_epoch(history, "best-val")["epoch"] == min(tie["epochs"])
    text = _mnist_depth_val_ties(RESULTS)
    assert "takes the earliest of them" in text and "8 of the 75 runs have a tie" in text
    assert text in (ROOT / "docs" / "reproductions" / "mnist-depth.md").read_text()
