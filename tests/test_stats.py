"""report.stats: Student's t (central and noncentral), the paired t-test behind every "A beats B" in the
reports, its interval and power, the equivalence test and the project's correction, checked against SciPy."""

from __future__ import annotations

import math
import random

import pytest
import scipy.stats as scipy_stats  # a dev dependency: the reference that report.stats (stdlib only) is checked against

from throughway.report.stats import (CORRECTION, NO_DIFFERENCE, SIGNIFICANCE, TOO_FEW, bonferroni, correct,
                                     correct_family, equivalence_test, format_interval, format_mean_std, format_p, holm,
                                     mean_std, minimum_detectable_difference, no_difference_text, noncentral_t_cdf,
                                     paired_by_seed, paired_power, paired_t_test, regularized_incomplete_beta,
                                     student_t_cdf, student_t_ppf, student_t_sf, verdict)


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
    assert paired_verdict(paired_t_test([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]), "a", "b") == "no difference detected"


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


# ----------------------------------------------------------------------------------------------------------
# Against SciPy: the t distribution, the interval, the power and the equivalence test (stdlib only in
# report.stats; SciPy is a dev dependency for these checks)

@pytest.mark.parametrize("df", [1, 2, 4, 9, 30, 100.5])
def test_t_cdf_and_quantile_match_scipy(df):
    for t in (-40.0, -3.0, -0.7, 0.0, 0.2, 2.776, 12.7):
        assert student_t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), rel=1e-10, abs=1e-15)
    for q in (1e-4, 0.025, 0.3, 0.5, 0.9, 0.975, 0.9995):
        assert student_t_ppf(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("df,delta", [(1, 0.5), (2, -4.0), (4, 2.0), (4, 5.5), (9, -1.5), (29, 3.0), (4, 12.0)])
def test_noncentral_t_cdf_matches_scipy(df, delta):
    for t in (-6.0, -1.0, 0.0, 0.5, 2.776, 8.0):
        assert noncentral_t_cdf(t, df, delta) == pytest.approx(scipy_stats.nct.cdf(t, df, delta), rel=1e-8, abs=1e-12)
    assert noncentral_t_cdf(1.3, df, 0.0) == pytest.approx(scipy_stats.t.cdf(1.3, df), rel=1e-12)


def _scipy_power(difference, std, n, alpha=0.05):
    df, delta = n - 1, difference * math.sqrt(n) / std
    critical = scipy_stats.t.ppf(1 - alpha / 2, df)
    # SciPy's nct returns nan at df = 1 for large noncentralities in the far tail: read it by symmetry,
    # P(T(δ) < −c) = 1 − P(T(−δ) < c)
    lower = 1 - scipy_stats.nct.cdf(critical, df, -delta)
    return 1 - scipy_stats.nct.cdf(critical, df, delta) + lower


@pytest.mark.parametrize("n", [2, 3, 5, 10, 40])
def test_minimum_detectable_difference_has_80_percent_power(n):
    std = 0.37
    detectable = minimum_detectable_difference(std, n)
    assert paired_power(detectable, std, n) == pytest.approx(_scipy_power(detectable, std, n), rel=1e-8)
    assert _scipy_power(detectable, std, n) == pytest.approx(0.80, abs=1e-9)
    assert _scipy_power(0.95 * detectable, std, n) < 0.80  # the smallest such difference, not any
    # above the normal approximation (z_0.975 + z_0.8)·std/√n, which undercounts few pairs
    assert detectable > 2.8016 * std / math.sqrt(n)
    assert minimum_detectable_difference(2 * std, n) == pytest.approx(2 * detectable)


def test_minimum_detectable_difference_edges():
    assert minimum_detectable_difference(0.3, 1) is None
    assert minimum_detectable_difference(0.0, 5) == 0.0
    assert minimum_detectable_difference(1.0, 5) == pytest.approx(1.682, abs=1e-3)  # 5 seeds: 1.68 std
    with pytest.raises(ValueError, match="std"):
        minimum_detectable_difference(float("nan"), 5)


def test_paired_test_interval_and_p_match_scipy():
    a, b = [2.51, 2.06, 1.89, 1.88, 1.82, 2.3], [2.42, 2.05, 1.91, 1.83, 1.85, 2.0]
    ours = paired_t_test(a, b)
    theirs = scipy_stats.ttest_rel(a, b)
    interval = theirs.confidence_interval(0.95)
    assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-10)
    assert ours.t == pytest.approx(theirs.statistic, rel=1e-12)
    assert (ours.ci_low, ours.ci_high) == (pytest.approx(interval.low, rel=1e-10), pytest.approx(interval.high, rel=1e-10))
    assert ours.std_difference == pytest.approx(ours.standard_error * math.sqrt(6))
    assert ours.detectable == pytest.approx(minimum_detectable_difference(ours.std_difference, 6))
    # the interval excludes 0 exactly when p < 0.05
    assert (ours.ci_low > 0 or ours.ci_high < 0) == (ours.p_value < 0.05)


def test_equivalence_test_matches_two_one_sided_scipy_tests():
    a, b = [1.20, 1.31, 1.18, 1.25, 1.27], [1.22, 1.28, 1.21, 1.20, 1.30]
    diffs = [x - y for x, y in zip(a, b)]
    margin = 0.1
    test = equivalence_test(a, b, margin)
    lower = scipy_stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(diffs, margin, alternative="less").pvalue
    assert test.p_lower == pytest.approx(lower, rel=1e-10) and test.p_upper == pytest.approx(upper, rel=1e-10)
    assert test.p_value == max(test.p_lower, test.p_upper)
    # equivalent at 0.05 exactly when the 90% interval lies inside the margin
    inside = -margin < test.ci_low and test.ci_high < margin
    assert test.equivalent is (test.p_value < 0.05) and test.equivalent is inside and test.equivalent
    assert equivalence_test(a, b, 0.01).equivalent is False  # a margin too narrow for 5 seeds' spread
    with pytest.raises(ValueError, match="margin"):
        equivalence_test(a, b, 0.0)
    assert equivalence_test([1.0], [1.0], 0.1).p_value is None


# ----------------------------------------------------------------------------------------------------------
# The project's correction and the verdict drawn from it

def test_holm_by_hand_and_against_bonferroni():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> kept non-decreasing: 0.06
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert all(h <= b for h, b in zip(holm(p), bonferroni(p)))
    assert holm([0.9, 0.3]) == pytest.approx([0.9, 0.6]) and holm([0.9, 0.8]) == [1.0, 1.0] and holm([]) == []
    assert correct(p) == holm(p) and CORRECTION == "Holm"


def test_verdict_is_drawn_from_the_corrected_p():
    close = paired_t_test([1.0, 1.2, 1.05, 1.3], [1.1, 1.35, 1.2, 1.32])     # p ≈ 0.04
    tests = [paired_t_test([1.0, 1.1, 1.05, 1.2], [1.3, 1.35, 1.4, 1.5]),    # p ≈ 0.001
             close, close,
             paired_t_test([1.0, 1.2], [1.5, 1.9])]                          # 2 pairs: not judged
    assert 0.01 < close.p_value < SIGNIFICANCE
    corrected = correct_family(tests)
    assert corrected[3] is None and corrected[0] == pytest.approx(3 * tests[0].p_value)
    assert corrected[1] == corrected[2] == pytest.approx(2 * close.p_value)
    assert verdict(tests[0], corrected[0], "a", "b") == "a better"
    # significant uncorrected, not after Holm: no verdict of a difference
    assert corrected[1] >= SIGNIFICANCE and verdict(tests[1], corrected[1], "a", "b") == NO_DIFFERENCE
    assert verdict(tests[3], corrected[3], "a", "b") == TOO_FEW
    assert verdict(tests[0], corrected[0], "a", "b", better="higher") == "b better"
    assert verdict(tests[0].to_dict(), corrected[0], "a", "b") == "a better"  # a stored test reads the same


def test_no_difference_is_said_with_its_interval():
    test = paired_t_test([1.0, 1.2, 0.9, 1.1, 1.0], [1.05, 1.1, 1.0, 1.0, 1.1])
    assert no_difference_text(test) == f"no difference detected; 95% CI [{test.ci_low:+.2f}, {test.ci_high:+.2f}]"
    assert format_interval(None, 1.0) == "—" and format_p(0.000123) == "0.00012" and format_p(None) == "—"


def test_a_curve_mean_and_a_finite_value_are_written_once():
    from throughway.report.stats import finite, mean_curve

    # The seeds' mean removal curve, point by point, as far as the shortest curve; None for none.
    assert mean_curve([[1.0, 2.0, 3.0], [3.0, 4.0]]) == [2.0, 3.0]
    assert mean_curve([]) is None
    # A diverged run's NaN or infinity is recorded as missing, which mean_std then skips.
    assert [finite(v) for v in (1.5, math.nan, math.inf, None)] == [1.5, None, None, None]
