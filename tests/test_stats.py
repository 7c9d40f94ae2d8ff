"""report.stats: Student's t tail and the paired t-test behind every "A beats B" in the reports."""

from __future__ import annotations

import math
import random

import pytest

from throughway.report.stats import (format_mean_std, mean_std, paired_by_seed, paired_t_test, regularized_incomplete_beta,
                                     student_t_sf)


@pytest.mark.parametrize("t,df,two_sided", [(2.776445105, 4, 0.05), (12.7062047, 1, 0.05), (2.228138852, 10, 0.05),
                                            (4.604094871, 4, 0.01), (1.0, 1, 0.5)])
def test_two_sided_p_matches_t_tables(t, df, two_sided):
    assert 2 * student_t_sf(t, df) == pytest.approx(two_sided, rel=1e-7)


def test_t_tail_matches_a_monte_carlo_estimate():
    rng = random.Random(0)
    df, t, n = 3, 1.5, 200_000
    hits = 0
    for _ in range(n):
        z = rng.gauss(0, 1)
        chi2 = sum(rng.gauss(0, 1) ** 2 for _ in range(df))
        hits += z / math.sqrt(chi2 / df) > t
    assert student_t_sf(t, df) == pytest.approx(hits / n, abs=0.003)


def test_incomplete_beta_symmetry_and_edges():
    assert regularized_incomplete_beta(0.3, 2.0, 5.0) + regularized_incomplete_beta(0.7, 5.0, 2.0) == pytest.approx(1.0)
    assert regularized_incomplete_beta(0.5, 1.0, 1.0) == pytest.approx(0.5)  # uniform
    assert regularized_incomplete_beta(0.0, 2, 3) == 0.0 and regularized_incomplete_beta(1.0, 2, 3) == 1.0


def test_paired_test_by_hand():
    a, b = [1.2, 1.3, 1.1, 1.25, 1.4], [1.5, 1.4, 1.3, 1.6, 1.45]
    test = paired_t_test(a, b)
    diffs = [-0.3, -0.1, -0.2, -0.35, -0.05]
    mean = sum(diffs) / 5
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4) / math.sqrt(5)
    assert test.mean_difference == pytest.approx(mean) and test.standard_error == pytest.approx(se)
    assert test.t == pytest.approx(mean / se) and test.df == 4
    assert test.p_value == pytest.approx(2 * student_t_sf(abs(mean / se), 4))
    assert test.p_value < 0.05


def test_paired_test_is_the_pairing_not_the_groups():
    # Large shared seed-to-seed spread, a small constant shift: the pairs see it, the groups would not.
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    b = [x + 0.1 + 0.01 * (-1) ** i for i, x in enumerate(a)]
    assert paired_t_test(a, b).p_value < 1e-4


def test_paired_test_edge_cases():
    assert paired_t_test([], []).p_value is None
    assert paired_t_test([1.0], [2.0]).p_value is None
    assert paired_t_test([1.0, 2.0], [1.0, 2.0]).p_value is None  # every difference 0
    with pytest.raises(ValueError, match="equal lengths"):
        paired_t_test([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        paired_t_test([1.0, float("nan")], [1.0, 2.0])


def test_paired_verdict_needs_three_pairs():
    from throughway.report.stats import MIN_PAIRS_FOR_VERDICT, paired_verdict

    assert MIN_PAIRS_FOR_VERDICT == 3
    two = paired_t_test([1.0, 1.1], [2.0, 2.2])
    assert two.p_value is not None and two.p_value < 0.05 and paired_verdict(two, "a", "b") == "too few seeds"
    three = paired_t_test([1.0, 1.1, 1.05], [2.0, 2.2, 2.1])
    assert paired_verdict(three, "a", "b") == "a better" and paired_verdict(paired_t_test([2.0, 2.2, 2.1], [1.0, 1.1, 1.05]), "a", "b") == "b better"
    assert paired_verdict(paired_t_test([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]), "a", "b") == "no significant difference"


# ----------------------------------------------------------------------------------------------------------
# The seeds' summary and its "mean ± std" text (issue 33: one summariser, one rule for one seed)

def test_mean_std_of_one_seed_has_no_std():
    # A sample std is undefined for one value: None, not 0.0 (the two summarisers used to disagree).
    assert mean_std([1.5]) == {"mean": 1.5, "std": None, "n": 1, "values": [1.5]}
    assert mean_std([]) == {"mean": None, "std": None, "n": 0, "values": []}
    stat = mean_std([1.0, None, 3.0])
    assert stat["n"] == 2 and stat["mean"] == 2.0 and stat["std"] == pytest.approx(math.sqrt(2.0))


def test_format_mean_std_renders_one_seed_as_the_mean_alone():
    assert format_mean_std(mean_std([1.0, 3.0])) == "2.00 ± 1.41"
    assert format_mean_std(mean_std([1.0, 3.0]), ".3g", ".2g", count=True) == "2 ± 1.4 (n=2)"
    assert format_mean_std(mean_std([1.234]), count=True) == "1.23"
    # summaries written before the rule stored std 0.0 for one seed: rendered the same way
    assert format_mean_std({"mean": 1.234, "std": 0.0, "n": 1}) == "1.23"
    assert format_mean_std(mean_std([])) == "—"
    assert format_mean_std(mean_std([]), empty="pending") == "pending"


def test_paired_by_seed_pairs_the_common_seeds():
    seeds, test = paired_by_seed({0: 1.0, 1: 2.0, 2: 3.5, 3: 9.0}, {1: 1.0, 2: 2.0, 0: 0.5})
    assert seeds == [0, 1, 2]
    assert test == paired_t_test([1.0, 2.0, 3.5], [0.5, 1.0, 2.0])
