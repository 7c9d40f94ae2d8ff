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


# Per depth, each family's test error over 3 seeds: at d = 2 gated and rezero differ by about 0.13 points with
# differences of both signs (p ≈ 0.4), at d = 10 by 0.5 points every time (p ≈ 0.0003, Holm p over 2 tests ≈ 0.0007).
_ERRORS = {2: {"gated": [2.0, 2.1, 2.2], "rezero": [2.3, 2.0, 2.4]},
           10: {"gated": [2.0, 2.1, 2.2], "rezero": [2.5, 2.62, 2.69]}}


def _gate_family_summary(done_depths, pending_depth):
    # A gate-family results.json in the shape `gate_family.summarize` writes: two families, 3 seeds.
    from throughway.report.stats import mean_std

    cells = []
    for depth in [*done_depths, pending_depth]:
        for family in ("gated", "rezero"):
            values = _ERRORS[depth][family] if depth in done_depths else []
            cells.append({"family": family, "depth": depth, "test_error_pct": mean_std(values),
                          "per_seed": [{"seed": s, "test_error_pct": v} for s, v in enumerate(values)]})
    return {"config": {"depths": [*done_depths, pending_depth], "families": ["gated", "rezero"], "seeds": 3},
            "cells": cells, "comparisons": []}


def test_gate_family_findings_and_row_say_only_what_the_tests_support(tmp_path):
    from throughway.experiments.gate_family_report import comparisons, findings_markdown
    from tools.readme.sections.gate_family import _gate_family_findings
    from tools.readme.sections.overview import _gate_family_row

    (tmp_path / "gate-family-init").mkdir()
    (tmp_path / "gate-family-init" / "results.json").write_text(json.dumps({"config": {"depths": [2]}, "points": [
        {"family": f, "depth": 2, "distance_to_identity": {"mean": v}} for f, v in
        (("rezero", 0.0), ("gated", 1.0), ("residual", 99.0))]}))
    assert _gate_family_findings(tmp_path) == "Pending: no trained cell is committed yet."
    assert "trained study pending" in _gate_family_row(tmp_path)
    (tmp_path / "gate-family").mkdir()
    summary = _gate_family_summary([2, 10], 20)
    (tmp_path / "gate-family" / "results.json").write_text(json.dumps(summary))
    at2, at10 = comparisons(summary)[:2]
    assert at2["test"]["p_value"] > 0.05 and at10["p_corrected"] < 0.05
    text = findings_markdown(summary)
    assert "- **d = 2**: lowest mean test error gated 2.10" in text
    assert (f"no difference detected against rezero (95% CI [{at2['test']['ci_low']:+.2f}, "
            f"{at2['test']['ci_high']:+.2f}])") in text
    assert (f"gated better than rezero (gated − rezero -0.50 points, 95% CI [{at10['test']['ci_low']:+.2f}, "
            f"{at10['test']['ci_high']:+.2f}], p = {at10['test']['p_value']:.2g}, Holm p = {at10['p_corrected']:.2g})") in text
    assert "d = 20" in text.splitlines()[-1] and "Pending" in text.splitlines()[-1]
    assert ("Holm's correction over the 2 paired tests of gated against each family: 1 of the 2 significant "
            f"(gated better than rezero at d = 10 (Holm p = {at10['p_corrected']:.2g})); 1 at uncorrected p < 0.05.") in text
    row = _gate_family_row(tmp_path)
    assert "d = 2, 10 (3 seeds): 2 paired tests of gated against each family, 1 significant after Holm over the 2" in row
    assert "d = 20 pending" in row and "Bonferroni" not in row


def test_gate_family_findings_name_the_removal_orders_that_a_paired_test_separates(tmp_path):
    from throughway.experiments.gate_family_report import findings_markdown

    summary = _gate_family_summary([2, 10], 20)
    shares = {10: [(0.99, 0.95), (0.98, 0.95), (0.99, 0.94)], 20: [(0.99, 0.95)] * 3}
    for cell in summary["cells"]:
        if cell["family"] == "gated" and cell["depth"] in shares:  # d = 20 is unfinished: not a finding
            cell["removal"] = [{"seed": s, "half_share_greedy": g, "half_share_random": r}
                               for s, (g, r) in enumerate(shares[cell["depth"]])]
    line = next(x for x in findings_markdown(summary).splitlines() if x.startswith("- **Removal**"))
    assert "gated: d = 10 gate order better by +4.0 points (95% CI [" in line and "d = 20" not in line
    assert "1 of the 1 significant after Holm (gated at d = 10)." in line


# ---------------------------------------------------------------------------------------------------------
# The gate-family and MNIST pages' prose says exactly what the committed numbers support: each sentence that
# carries a number is rendered from results/ (tools/readme/sections), and checked here against the numbers
# recomputed from the committed files.

RESULTS = ROOT / "results"
GATE_FAMILY_PAGE = ROOT / "docs" / "reproductions" / "gate-family.md"


def _committed_gate_family() -> dict:
    return json.loads((RESULTS / "gate-family" / "results.json").read_text())


def test_removal_prose_says_which_tests_survive_holm_and_the_size_of_the_gains():
    from throughway.experiments.gate_family_report import RELU_FAMILIES, removal_comparisons, removal_rows
    from throughway.report.stats import SIGNIFICANCE
    from tools.readme.sections.gate_family import _gate_family_removal_prose

    summary = _committed_gate_family()
    rows = removal_rows(summary)
    assert len(rows) == 20 and all(r["test"] == c["test"] for r, c in zip(rows, removal_comparisons(summary)))
    # Holm by hand: the i-th smallest p times (20 − i), kept non-decreasing; a test passes while all before it do
    ordered = sorted(rows, key=lambda r: r["test"]["p_value"])
    passing = []
    for i, r in enumerate(ordered):
        if r["test"]["p_value"] * (len(rows) - i) >= SIGNIFICANCE:
            break
        passing.append(r)
    assert {(r["family"], r["depth"]) for r in passing} == {(r["family"], r["depth"]) for r in rows
                                                            if r["p_corrected"] < SIGNIFICANCE}
    text = _gate_family_removal_prose(RESULTS)
    named: dict[str, list[int]] = {}
    for r in rows:  # by depth, then family: the order the prose names them in
        if r in passing:
            named.setdefault(r["family"], []).append(r["depth"])
    assert "for " + "; ".join(f"{f} at d = {', '.join(map(str, d))}" for f, d in named.items()) + "." in text
    # the tests significant only before the correction are said as such, with both p
    for r in rows:
        if r["kept_difference"] > 0 and r not in passing and r["test"]["p_value"] < SIGNIFICANCE:
            assert f"{r['family']} at d = {r['depth']} (p = {r['test']['p_value']:.2g}, Holm p = {r['p_corrected']:.2g})" in text
    # the sizes of the gains are given with their intervals and not compared by a test
    relu = [r["kept_difference"] for r in passing if r["family"] in RELU_FAMILIES]
    assert f"{min(relu):+.1f} to {max(relu):+.1f} points (95% CIs from" in text
    assert "the sizes are not compared by a test" in text
    page = GATE_FAMILY_PAGE.read_text()
    assert "from d = 20 on, removing" not in page and "Bonferroni" not in page and "is the one whose" not in page


def test_dead_gates_per_seed_are_said_against_the_removed_half():
    from tools.readme.sections.gate_family import _gate_family_removal_prose

    cell = next(c for c in _committed_gate_family()["cells"] if c["family"] == "gated" and c["depth"] == 100)
    dead = [p["dead_gates"] for p in cell["per_seed"]]
    half = cell["removal"][0]["half"]
    assert dead == [23, 25, 21, 22, 19] and half == 25 and all(r["half"] == half for r in cell["removal"])
    text = _gate_family_removal_prose(RESULTS)
    assert "number 23, 25, 21, 22, 19 in the 5 seeds, so in 4 of 5 seeds the removed half also takes live blocks" in text
    assert all(r["half_share_greedy"] > 0.999 for r in cell["removal"])
    # not "at no measurable cost": the accuracy each half-pruned net loses, the largest named
    lost = [r["greedy"][0] - r["greedy"][half] for r in cell["removal"]]
    assert f"changes by {-max(lost):+.2f} to {-min(lost):+.2f} points" in text and max(lost) > 0
    assert "no measurable cost" not in GATE_FAMILY_PAGE.read_text()
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
    # the words on the docs page are the study's own, written by `throughway report` beside its results
    # (every verdict at the Holm-corrected p), not made up by tools/readme.
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
        assert "Holm's correction over the 30 paired tests of gated against each family: 1 of the 30 significant" in written
    else:
        assert "indistinguishable" not in written and "Holm p = " in written and "95% CI [" in written


def test_the_readme_row_says_one_passes_holm_and_four_are_significant_uncorrected():
    from tools.readme.sections.overview import _gate_family_row

    row = _gate_family_row(RESULTS)
    assert ("30 paired tests of gated against each family, 1 significant after Holm over the 30 (gated better than "
            "residual-nf at d = 100, Holm p = 0.017), 4 at uncorrected p < 0.05; no difference detected in the others") in row
    assert row in (ROOT / "README.md").read_text()


def test_the_readme_pruning_row_says_its_spread_is_over_removal_orders_of_one_net():
    from tools.readme.sections.overview import _pruning_row

    row = _pruning_row(RESULTS)
    assert "95.0% (one net, d = 100, seed 0: the mean over 10 random removal orders, std over the orders 2.6%)" in row
    assert "95.0% ± 2.6%" not in (ROOT / "README.md").read_text()


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
