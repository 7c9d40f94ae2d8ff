"""The MNIST depth study's report: per-seed statistics, the paired tests (intervals, Holm) and the findings."""

from __future__ import annotations

from throughway.experiments.mnist_depth import (PAPER_TEST_ERROR, findings_markdown, middle_minus_ends,
                                                paired_comparisons, table_markdown)
from throughway.report.stats import paired_t_test
from throughway.report.stats import mean_std


def _cell(arch, depth, errors, ks=None):
    per_seed = [{"seed": s, "test_error_pct": e, "test_error_last10_pct": e + 0.01,
                 "k_mean": (ks[s] if ks else None), "k": None, "dead_gates": None, "k_middle_minus_ends": None}
                for s, e in enumerate(errors)]
    return {"arch": arch, "depth": depth, "per_seed": per_seed, "test_error_pct": mean_std(errors),
            "test_error_best_pct": min(errors), "test_error_last10_pct": mean_std([e + 0.01 for e in errors]),
            "k_mean": mean_std(ks or []), "k_middle_minus_ends": mean_std([]),
            "runs": [{"run": f"{arch}-d{depth}-s{s}", "state": "finished", "epochs": 3} for s in range(len(errors))],
            "paper_test_error_pct": PAPER_TEST_ERROR[arch][depth], "paper_k_mean": 0.67 if arch == "gated" else None}


def _summary():
    cells = [_cell("residual", 100, [1.9, 2.0, 2.1, 2.0, 1.95]),
             _cell("gated", 100, [1.2, 1.3, 1.25, 1.28, 1.22], ks=[0.6, 0.7, 0.65, 0.7, 0.66])]
    summary = {"config": {"depths": [100], "archs": ["residual", "gated"], "epochs": 3, "seeds": 5, "stem": "linear",
                          "recipe": "gresnet-mnist", "train_on_full": True, "limit": None}, "cells": cells}
    summary["comparisons"] = paired_comparisons(summary)
    return summary


def test_paired_comparison_pairs_by_seed_and_gives_a_verdict():
    row = _summary()["comparisons"][0]
    assert row["seeds"] == [0, 1, 2, 3, 4]
    expected = paired_t_test([1.2, 1.3, 1.25, 1.28, 1.22], [1.9, 2.0, 2.1, 2.0, 1.95])
    assert row["test_error_pct"]["p_value"] == expected.p_value < 0.05
    assert row["test_error_pct"]["verdict"] == "gated better"


def test_findings_say_where_the_papers_number_lies():
    text = findings_markdown(_summary())
    # the paper's 1.26 lies within the gated seeds' 1.20–1.30; its 1.50 is below every residual seed
    assert "**gated**, Table 1's error: within our seeds' range at d = 100" in text
    assert "**residual**, Table 1's error: below every seed of ours at d = 100 (ours 1.90–2.10, paper 1.50)" in text
    assert "d = 100, gated − residual** over 5 seeds" in text and "gated better" in text
    assert "Mean k** (Table 2 / ours): d = 100: 1.01" in text


def test_table_shows_mean_std_best_and_the_test():
    text = table_markdown(_summary())
    assert "| 100 | 1.50 | 1.99 ± 0.07 | 1.90 | 1.26 | 1.25 ± 0.04 | 1.20 |" in text
    assert "paired" in text and "gated better" in text


def test_a_difference_significant_only_before_holm_gets_no_verdict():
    # gated lower by ~0.04 at both depths: p ≈ 0.039 each, uncorrected; Holm over the 2 tests: 0.079
    cells = [_cell("residual", 50, [1.90, 1.95, 2.00, 1.93, 1.97]), _cell("gated", 50, [1.82, 1.94, 1.98, 1.90, 1.90]),
             _cell("residual", 100, [1.90, 1.95, 2.00, 1.93, 1.97]), _cell("gated", 100, [1.82, 1.94, 1.98, 1.90, 1.90])]
    summary = {"config": {"depths": [50, 100], "archs": ["residual", "gated"], "epochs": 3, "seeds": 5, "stem": "linear",
                          "recipe": "gresnet-mnist", "train_on_full": True, "limit": None}, "cells": cells}
    (row, _) = paired_comparisons(summary)
    test = row["test_error_pct"]
    assert test["p_value"] < 0.05 <= test["p_corrected"] and test["verdict"] == "no difference detected"
    table = table_markdown(summary)
    assert "gated better" not in table and "verdict (Holm)" in table and "Holm-corrected over this table's 2 tests" in table
    line = next(r for r in table.splitlines() if r.startswith("| 50 | last epoch |"))
    assert f"[{test['ci_low']:+.3f}, {test['ci_high']:+.3f}]" in line and f"{test['detectable']:.3f}" in line
    text = findings_markdown(summary)
    assert f"Holm p = {test['p_corrected']:.3f}: no difference detected" in text and "gated better" not in text


def test_findings_say_whether_the_papers_difference_lies_in_our_interval():
    # Table 1 at d = 100: gated − residual = 1.26 − 1.50 = −0.24; ours is about −0.05 with a spread of ±0.1
    cells = [_cell("residual", 100, [1.90, 2.05, 1.95, 2.00, 1.98]), _cell("gated", 100, [1.85, 2.10, 1.80, 1.99, 1.90])]
    summary = {"config": {"depths": [100], "archs": ["residual", "gated"], "epochs": 3, "seeds": 5, "stem": "linear",
                          "recipe": "gresnet-mnist", "train_on_full": True, "limit": None}, "cells": cells}
    test = paired_comparisons(summary)[0]["test_error_pct"]
    assert test["ci_low"] > -0.24  # the interval excludes the paper's difference
    text = findings_markdown(summary)
    assert "(Table 1, gated − residual: -0.24 at d = 100)" in text and "last epoch: outside at d = 100" in text
    cells[1] = _cell("gated", 100, [1.5, 2.3, 1.6, 2.2, 1.9])  # five seeds that cannot tell −0.24 from 0
    assert "last epoch: inside at d = 100" in findings_markdown(summary)
    assert "indistinguishable" not in findings_markdown(summary)


def test_middle_minus_ends_sees_a_dip_in_the_middle():
    assert middle_minus_ends([1.0, 1.0, 0.1, 0.1, 1.0, 1.0]) < 0 < middle_minus_ends([0.1, 0.1, 1.0, 1.0, 0.1, 0.1])


def test_keras_batchnorm_option_reaches_the_models_and_the_table():
    from throughway.experiments.mnist_depth import Config, specs
    from throughway.models import create_model

    keras = specs(Config(depths=(2,), archs=("plain", "residual", "gated", "highway"), seeds=1, batchnorm="keras"))
    default = specs(Config(depths=(2,), archs=("residual",), seeds=1))
    for spec in keras:
        model = create_model(spec.config.model, depth=2, **spec.config.model_kwargs)
        norms = [m for m in model.modules() if m.__class__.__name__ == "BatchNorm1d"]
        if spec.config.model == "mlp_highway":  # not in the paper's table: the option leaves it alone
            assert "bn_eps" not in spec.config.model_kwargs
        else:
            assert norms and all((m.eps, m.momentum) == (1e-3, 0.01) for m in norms), spec.name
    # the default adds nothing, so the committed study's run configs are unchanged
    assert default[0].config.model_kwargs == {"width": 50, "stem": "linear"}
    summary = _summary()
    assert "Keras's defaults" not in table_markdown(summary)
    summary["config"]["batchnorm"] = "keras"
    assert "BatchNorm constants: Keras's defaults (momentum 0.99, i.e. PyTorch's 0.01; eps 1e-3)." in table_markdown(summary)


def test_batchnorm_ablation_pairs_the_seeds_finished_in_both():
    from throughway.experiments.mnist_depth import batchnorm_ablation_markdown

    torch_bn = _summary()
    keras = _summary()
    keras["cells"][1] = _cell("gated", 100, [1.1, 1.2, 1.15, 1.18], ks=[0.6, 0.7, 0.65, 0.7])  # seed 4 unfinished
    text = batchnorm_ablation_markdown(torch_bn, keras)
    expected = paired_t_test([1.1, 1.2, 1.15, 1.18], [1.2, 1.3, 1.25, 1.28])
    gated = next(line for line in text.splitlines() if line.startswith("| 100 | gated"))
    assert f"| {expected.mean_difference:+.3f} (n=4) | [{expected.ci_low:+.3f}, {expected.ci_high:+.3f}] |" in gated
    assert "| 1.26 | 1.25 ± 0.04 (n=5) | 1.16 ± 0.04 (n=4) |" in gated
    # the sentence under the table: the range of the paired differences and which cells are significant
    # after Holm (over the 2 cells), with the interval
    assert "Where both are finished (d = 100)" in text
    assert "significantly after Holm in 1 cell(s) (gated d = 100: -0.100, 95% CI [" in text
    residual_only = _summary()
    residual_only["cells"] = [_cell("residual", 100, [1.95, 1.98, 2.12, 1.99, 1.96])]  # vs 1.9, 2.0, 2.1, 2.0, 1.95
    text = batchnorm_ablation_markdown(torch_bn, residual_only)
    assert "with no difference detected in any cell after Holm over the 1 tests (95% CIs from" in text
    # the equivalence test: the residual cell's gap to Table 1 is 1.99 − 1.50 = 0.49 points; the constants move
    # the error by 0.01 ± a few hundredths, so the TOST shows the change within it
    residual = next(line for line in text.splitlines() if line.startswith("| 100 | residual"))
    assert "±0.49: p = " in residual and "within the gap" in residual
    assert "the change is smaller than the gap in 1 of 1 cells." in text
    # a noisy pair of studies: the TOST cannot show it (no equivalence is said from a non-significant test)
    noisy = _summary()
    noisy["cells"] = [_cell("residual", 100, [1.2, 2.8, 1.3, 2.7, 2.0])]
    text = batchnorm_ablation_markdown(torch_bn, noisy)
    assert "not shown" in next(line for line in text.splitlines() if line.startswith("| 100 | residual"))
    assert "smaller than the gap in 0 of 1 cells: not shown for residual d = 100" in text


def test_no_verdict_from_fewer_than_three_seeds():
    # 2 seeds whose differences agree give p < 0.05 with 1 degree of freedom; no verdict is drawn from it.
    cells = [_cell("residual", 100, [1.9, 2.0]), _cell("gated", 100, [1.2, 1.31], ks=[0.6, 0.7])]
    summary = {"config": {"depths": [100], "archs": ["residual", "gated"], "epochs": 12, "seeds": 2,
                          "stem": "linear", "recipe": "gresnet-mnist", "train_on_full": True, "limit": None},
               "cells": cells}
    summary["comparisons"] = paired_comparisons(summary)
    row = summary["comparisons"][0]["test_error_pct"]
    assert row["p_value"] is not None and row["p_value"] < 0.05
    assert row["verdict"] == "too few seeds"
    assert "gated better" not in table_markdown(summary) and "too few seeds" in table_markdown(summary)
    # a results.json written before the rule, holding a verdict from 2 seeds, is not believed either
    summary["comparisons"][0]["test_error_pct"]["verdict"] = "gated better"
    assert "gated better" not in table_markdown(summary) and "gated better" not in findings_markdown(summary)


def test_no_last_10_epochs_table_for_a_run_of_fewer_than_10_epochs():
    summary = _summary()  # 3 epochs
    text = table_markdown(summary)
    assert "mean of the last 10 epochs of each seed" not in text
    assert "too few epochs (3 < 10)" in text and "too few epochs (3 < 10)" in findings_markdown(summary)
    summary["config"]["epochs"] = 10
    assert "mean of the last 10 epochs of each seed" in table_markdown(summary)


# Table 1's epoch selection (issue 23) on a small synthetic study folder: the layout `reproduce
# mnist-depth` writes (results.json with the config; runs/<arch>-d<d>-s<seed>/results.json).

def _write_run(folder, name, history, finished=True, diverged=False):
    import json
    run = folder / "runs" / name
    run.mkdir(parents=True, exist_ok=True)   # a run may be written again as it finishes
    final = {"test_error_pct": history[-1]["test_error_pct"]} if finished else None
    (run / "results.json").write_text(json.dumps({"history": history, "final": final, "diverged": diverged}))


def _epochs(test, val=None):
    return [{"epoch": i + 1, "test_error_pct": t, "val_error_pct": None if val is None else val[i]}
            for i, t in enumerate(test)]


def _selection_folder(tmp_path):
    import json
    (tmp_path / "results.json").write_text(json.dumps({"config": {
        "depths": [100], "archs": ["residual", "gated"], "seeds": 3, "epochs": 4, "train_on_full": False}}))
    # gated seed 0: the test set's best epoch (2) is not the validation set's (3, the earlier of two ties at 1.0)
    _write_run(tmp_path, "gated-d100-s0", _epochs([1.6, 1.2, 1.4, 1.5], val=[2.0, 1.5, 1.0, 1.0]))
    _write_run(tmp_path, "gated-d100-s1", _epochs([1.9, 1.3, 1.8, 1.7], val=[2.0, 1.1, 1.2, 1.3]))
    _write_run(tmp_path, "gated-d100-s2", _epochs([1.0, 0.9]), finished=False)   # running: not counted
    _write_run(tmp_path, "residual-d100-s0", _epochs([1.8, 1.7], val=[1.0, 1.1]), finished=False)
    return tmp_path


def test_each_selection_picks_its_epoch_and_counts_only_finished_runs(tmp_path):
    from throughway.experiments.mnist_depth_report import epoch_selection

    summary = epoch_selection(_selection_folder(tmp_path))
    gated = next(c for c in summary["cells"] if c["arch"] == "gated")
    s0 = gated["seeds"][0]
    assert (s0["last"]["epoch"], s0["best-test"]["epoch"], s0["best-val"]["epoch"]) == (4, 2, 3)
    assert s0["best-val"]["test_error_pct"] == 1.4          # the chosen epoch's test error, not its val error
    assert gated["best-test"]["values"] == [1.2, 1.3] and gated["best-test"]["best_seed"] == 0
    assert gated["best-val"]["values"] == [1.4, 1.3] and gated["best-val"]["best"] == 1.3
    assert gated["seeds"][2]["state"] == "running at epoch 2" and gated["finished"] == 2
    residual = next(c for c in summary["cells"] if c["arch"] == "residual")
    assert residual["finished"] == 0 and residual["seeds"][1]["state"] == "not started"


def test_selection_table_says_pending_and_the_findings_name_the_gap(tmp_path):
    from throughway.experiments.mnist_depth_report import (epoch_selection, selection_findings,
                                                           selection_findings_markdown, selection_table_markdown)

    summary = epoch_selection(_selection_folder(tmp_path))
    table = selection_table_markdown(summary, ("best-test", "best-val"))
    row = next(line for line in table.splitlines() if line.startswith("| 100 |"))
    assert row.count("pending (running at epoch 2)") == 2        # residual: both selections
    assert "1.25 ± 0.07; best 1.20 (seed 0) (2/3 seeds)" in row   # gated best-test
    assert "selected on the test set: optimistic" in table
    # Two finished seeds are too few for a verdict (MIN_PAIRS_FOR_VERDICT = 3): the cell is pending.
    assert selection_findings(summary, "best-test")["gated"]["pending"] == [100]
    # The third seed finishes: best-test 1.35 and best-val 1.35 (both at epoch 3).
    _write_run(tmp_path, "gated-d100-s2", _epochs([1.5, 1.45, 1.35, 1.4], val=[2.0, 1.9, 1.2, 1.3]))
    summary = epoch_selection(tmp_path)
    # The paper's 1.26 lies between 1.2 and 1.35 (best-test) but below 1.3, 1.35 and 1.4 (best-val).
    assert selection_findings(summary, "best-test")["gated"]["within"] == [100]
    assert selection_findings(summary, "best-val")["gated"]["below"] == [(100, 1.3, 1.26)]
    assert selection_findings(summary, "best-val")["residual"]["pending"] == [100]
    text = selection_findings_markdown(summary, ("best-test", "best-val"))
    assert "best-test: residual not judged, gated 1 of 1; best-val: residual not judged, gated 0 of 1" in text
    assert "d = 100 (our best seed 1.30, paper 1.26: 0.04 points)" in text


def test_selection_refuses_a_folder_without_a_study(tmp_path):
    import pytest
    from throughway.experiments.mnist_depth_report import epoch_selection, selected_epoch

    with pytest.raises(FileNotFoundError, match="results.json"):
        epoch_selection(tmp_path)
    with pytest.raises(ValueError, match="accepted values"):
        selected_epoch([], "best-train")
    assert selected_epoch(_epochs([1.0, 2.0]), "best-val") is None   # trained without a validation split
