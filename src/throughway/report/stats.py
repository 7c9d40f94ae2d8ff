"""Statistics over seeds: mean ± std, and the paired comparison behind every "A beats B" claim.

The papers report single numbers or mean ± std over runs; a claim that one architecture beats
another needs a test over seeds, not one run. `paired_t_test` compares two architectures trained
with the same seeds (same data order and the same seed for initialisation): the per-seed
differences remove the part of the seed-to-seed variation that both share. Every paired comparison
carries what a finding may say from it (`PairedTest`): the mean difference, its 95% confidence
interval, the two-sided p, and the smallest difference the test could have detected with 80% power
(`minimum_detectable_difference`). A family of tests is corrected by the project's one rule,
Holm's step-down procedure (`CORRECTION`, `correct`; Holm 1979: it controls the family-wise error
rate as Bonferroni does and rejects at least whatever Bonferroni rejects). A verdict is drawn from
the corrected p (`verdict`). A claim that two things do not differ by more than a margin is made only
by an equivalence test (`equivalence_test`: two one-sided paired t-tests, TOST, Schuirmann 1987)
against a margin stated beside it; without one the words are "no difference detected; 95% CI [a, b]"
(`no_difference_text`).

Student's t distribution (central and noncentral) is computed here from the regularised incomplete
beta function: stdlib and math only, no SciPy (tests/test_stats.py compares every function with
SciPy's).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

__all__ = ["PairedTest", "EquivalenceTest", "SIGNIFICANCE", "CONFIDENCE", "POWER", "CORRECTION",
           "MIN_PAIRS_FOR_VERDICT", "NO_DIFFERENCE", "TOO_FEW", "finite", "mean_std", "mean_curve", "format_mean_std", "LAST_EPOCHS",
           "last_epochs_mean",
           "regularized_incomplete_beta", "student_t_sf", "student_t_cdf", "student_t_ppf", "noncentral_t_cdf",
           "paired_power", "minimum_detectable_difference", "paired_t_test", "paired_by_seed", "equivalence_test",
           "bonferroni", "holm", "correct", "judged", "correct_family", "verdict", "judge", "paired_verdict",
           "format_interval", "format_p", "no_difference_text", "gated_comparisons", "difference_text",
           "detectable_text", "judged_in_words"]

# The level at which a difference is called significant in the reports (two-sided; on the corrected p).
SIGNIFICANCE = 0.05
# The coverage of every confidence interval in the reports.
CONFIDENCE = 0.95
# The power at which `minimum_detectable_difference` is quoted.
POWER = 0.80
# The project's one correction for a family of tests, named on every page that draws a verdict.
CORRECTION = "Holm"
# A paired test over 2 seeds has 1 degree of freedom: its p-value swings with a single seed, so no
# verdict is drawn from fewer than 3 pairs (the table says "too few seeds" instead).
MIN_PAIRS_FOR_VERDICT = 3
# The verdicts that are not a difference: a test that does not reject, and one that is not drawn.
NO_DIFFERENCE = "no difference detected"
TOO_FEW = "too few seeds"


def finite(value: float | None) -> float | None:
    """`value` if it is a finite number, else None: a diverged run's NaN or infinity recorded as a
    missing value (JSON holds neither, and `mean_std` skips None)."""
    return value if value is not None and math.isfinite(value) else None


def mean_std(values: Sequence[float | None]) -> dict[str, Any]:
    """The seeds' summary of `values` (None entries skipped): {"mean", "std", "n", "values"}, with
    `std` the sample standard deviation (n − 1 in the denominator). With no value mean and std are
    None; with one value std is None too: a sample std is undefined for one seed (it is not 0: one
    seed says nothing about the spread). Every study summary and table goes through this one function."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"mean": None, "std": None, "n": 0, "values": []}
    mean = sum(vals) / len(vals)
    std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else None
    return {"mean": mean, "std": std, "n": len(vals), "values": vals}


def mean_curve(curves: Sequence[Sequence[float]]) -> list[float] | None:
    """The seeds' mean curve: the mean of `curves` point by point (as far as the shortest one goes),
    None when there is no curve."""
    if not curves:
        return None
    return [sum(values) / len(values) for values in zip(*curves)]


def format_mean_std(stat: Mapping[str, Any], fmt: str = ".2f", std_fmt: str | None = None, *, count: bool = False,
                    empty: str = "—", scale: float = 1.0, unit: str = "") -> str:
    """"mean ± std" of a `mean_std` summary, the mean in `fmt` and the std in `std_fmt` (default: `fmt`), each
    times `scale` and followed by `unit` (a share as "63.1% ± 2.0%": scale=100, unit="%"); with `count`,
    " (n=N)" after it. `empty` where no value is summarised (n = 0 or mean None). One value (n = 1) renders
    as the mean alone, without a count: its std is undefined (None; summaries written before that rule
    stored 0.0 and render the same). A summary stored without its "n" renders its mean and std as they are."""
    if stat.get("n") == 0 or stat.get("mean") is None:
        return empty
    text = format(scale * stat["mean"], fmt) + unit
    if stat.get("n") == 1 or stat.get("std") is None or math.isnan(stat["std"]):
        return text
    text += f" ± {format(scale * stat['std'], std_fmt or fmt)}{unit}"
    return text + (f" (n={stat['n']})" if count and stat.get("n") is not None else "")


# "the mean of the last 10 epochs": a run's test error less sensitive to one epoch's noise.
LAST_EPOCHS = 10


def last_epochs_mean(history: Sequence[dict[str, Any]], key: str = "test_error_pct") -> float | None:
    """The mean of `key` over the last `LAST_EPOCHS` records of a run's `history` that hold it; None if none do."""
    tail = [h[key] for h in history[-LAST_EPOCHS:] if h.get(key) is not None]
    return sum(tail) / len(tail) if tail else None


# ----------------------------------------------------------------------------------------------------------
# Student's t distribution, central and noncentral

def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1, by Lentz's continued fraction (relative error ~1e-14)."""
    if not (a > 0 and b > 0):
        raise ValueError(f"a={a}, b={b}: both must be > 0")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x={x}: must lie in [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1.0) / (a + b + 2.0):  # the continued fraction converges fast only on this side
        return 1.0 - regularized_incomplete_beta(1.0 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h / a


def _check_df(df: float) -> None:
    if not df > 0:
        raise ValueError(f"df={df}: must be > 0")


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom (the one-sided upper tail)."""
    _check_df(df)
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return tail if t >= 0 else 1.0 - tail


def student_t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    return student_t_sf(-t, df)


def student_t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t with `df` degrees of freedom (the t with P(T ≤ t) = q), 0 < q < 1:
    the CDF inverted by bisection to the float's resolution (e.g. 2.776 for q = 0.975, df = 4)."""
    _check_df(df)
    if not 0.0 < q < 1.0:
        raise ValueError(f"q={q}: must lie strictly between 0 and 1")
    if q == 0.5:
        return 0.0
    if q < 0.5:  # the distribution is symmetric; bisect on the upper side, where the tail is accurate
        return -student_t_ppf(1.0 - q, df)
    tail = 1.0 - q
    low, high = 0.0, 1.0
    while student_t_sf(high, df) > tail:
        low, high = high, 2.0 * high
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if student_t_sf(middle, df) > tail:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def noncentral_t_cdf(t: float, df: float, noncentrality: float) -> float:
    """P(T ≤ t) for the noncentral t with `df` degrees of freedom and noncentrality δ: the law of
    (Z + δ) / √(V / df), Z standard normal, V χ²(df). For t ≥ 0 the series of Guenther (1978) and
    Lenth (1989, algorithm AS 243),

        F(t) = Φ(−δ) + ½ Σ_j [p_j I_x(j + ½, df/2) + q_j I_x(j + 1, df/2)],  x = t² / (t² + df),
        p_j = e^(−δ²/2) (δ²/2)^j / j!,  q_j = δ e^(−δ²/2) (δ²/2)^j / (√2 Γ(j + 3/2)),

    summed until the Poisson weights are spent; for t < 0, F(t; δ) = 1 − F(−t; −δ). δ = 0 is Student's t."""
    _check_df(df)
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    if t < 0:
        return 1.0 - noncentral_t_cdf(-t, df, -noncentrality)
    delta = float(noncentrality)
    if delta == 0.0:
        return student_t_cdf(t, df)
    x = t * t / (t * t + df)
    half_square = delta * delta / 2.0
    total = _normal_cdf(-delta)
    if x == 0.0:
        return total
    last = int(half_square + 12.0 * math.sqrt(half_square) + 40.0)  # beyond it the Poisson weights are < 1e-16
    log_weight = -half_square  # log of e^(−δ²/2) (δ²/2)^j, j = 0
    log_half_square = math.log(half_square)
    series = 0.0
    for j in range(last + 1):
        if j:
            log_weight += log_half_square
        p = math.exp(log_weight - math.lgamma(j + 1.0))
        q = math.copysign(math.exp(log_weight + math.log(abs(delta)) - 0.5 * math.log(2.0) - math.lgamma(j + 1.5)),
                          delta)
        series += p * regularized_incomplete_beta(x, j + 0.5, df / 2.0) + q * regularized_incomplete_beta(x, j + 1.0, df / 2.0)
    return min(1.0, max(0.0, total + 0.5 * series))


def paired_power(difference: float, std: float, n: int, alpha: float = SIGNIFICANCE) -> float:
    """The power of the two-sided paired t-test at level `alpha` over `n` pairs whose differences have
    standard deviation `std`, when the true mean difference is `difference`: P(|T| > t_(1−α/2, n−1))
    for T noncentral t with n − 1 degrees of freedom and noncentrality difference·√n / std."""
    if n < 2:
        raise ValueError(f"n={n}: a paired t-test needs at least 2 pairs")
    if not std > 0:
        raise ValueError(f"std={std}: must be > 0")
    df = n - 1
    critical = student_t_ppf(1.0 - alpha / 2.0, df)
    delta = difference * math.sqrt(n) / std
    return 1.0 - noncentral_t_cdf(critical, df, delta) + noncentral_t_cdf(-critical, df, delta)


@lru_cache(maxsize=None)
def _detectable_noncentrality(n: int, alpha: float, power: float) -> float:
    """The noncentrality δ at which the two-sided paired t-test over `n` pairs has `power`: the
    detectable difference is δ·std/√n for any std, so δ depends on n, alpha and power alone (cached)."""
    def excess(delta: float) -> float:  # std = √n makes the difference δ itself
        return paired_power(delta, math.sqrt(n), n, alpha) - power

    low, high = 0.0, 2.0
    f_low, f_high = excess(low), excess(high)
    while f_high < 0:
        low, f_low, high = high, f_high, 2.0 * high
        f_high = excess(high)
    # Illinois regula falsi: the bracket always holds the root, and converges in a few steps
    side = 0
    for _ in range(200):
        middle = high - f_high * (high - low) / (f_high - f_low)
        f_middle = excess(middle)
        if abs(f_middle) < 1e-13 or high - low < 1e-13 * high:
            return middle
        if f_middle < 0:
            low, f_low = middle, f_middle
            if side == -1:
                f_high /= 2.0
            side = -1
        else:
            high, f_high = middle, f_middle
            if side == 1:
                f_low /= 2.0
            side = 1
    return 0.5 * (low + high)


def minimum_detectable_difference(std: float, n: int, alpha: float = SIGNIFICANCE,
                                  power: float = POWER) -> float | None:
    """The smallest true mean difference that the two-sided paired t-test at level `alpha` over `n`
    pairs detects with probability `power`, taking the observed `std` of the differences as the
    true one: the root of `paired_power`, solved on the noncentral t (no normal approximation; that
    one, (z_(1−α/2) + z_power)·std/√n ≈ 2.80·std/√n, is too small for few pairs: at n = 5 the exact
    value is 1.68·std, the approximation 1.25·std). None below 2 pairs; 0 when `std` is 0 (any
    difference is then detected)."""
    if n < 2:
        return None
    if not 0.0 < power < 1.0 or not 0.0 < alpha < 1.0:
        raise ValueError(f"power={power}, alpha={alpha}: both must lie strictly between 0 and 1")
    if not (math.isfinite(std) and std >= 0.0):
        raise ValueError(f"std={std}: must be a finite number >= 0")
    if std == 0.0:
        return 0.0
    return _detectable_noncentrality(int(n), float(alpha), float(power)) * std / math.sqrt(n)


# ----------------------------------------------------------------------------------------------------------
# The paired comparison

@dataclass(frozen=True)
class PairedTest:
    """A paired two-sided t-test of a − b over matched seeds, with what a finding may say from it.

    `mean_difference` is the mean of a − b, `std_difference` the sample std of the differences,
    `standard_error` = std / √n, `t` = mean / standard_error with `df` = n − 1, `p_value` two-sided.
    `ci_low`, `ci_high`: the 95% (CONFIDENCE) interval of the mean difference, mean ± t_(0.975, n−1)·se.
    `detectable`: the smallest true difference the test detects with 80% power at p < 0.05
    (`minimum_detectable_difference` at the observed std). `p_value` is None when fewer than two
    pairs exist or every difference is equal (std 0 with a nonzero mean gives p = 0); the interval and
    `detectable` are None below two pairs.
    """

    n: int
    mean_difference: float | None
    standard_error: float | None
    t: float | None
    df: int
    p_value: float | None
    std_difference: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    detectable: float | None = None
    test: str = "paired two-sided Student t-test over seeds"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def _differences(a: Sequence[float], b: Sequence[float], name: str) -> list[float]:
    if len(a) != len(b):
        raise ValueError(f"{name}: {len(a)} values against {len(b)}; pairs need equal lengths")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    if not all(math.isfinite(d) for d in diffs):
        raise ValueError(f"{name}: every value must be finite")
    return diffs


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """The paired t-test of a − b (a[i] and b[i] from the same seed), with its 95% interval and the
    difference it could detect (`PairedTest`). Raises ValueError when the lengths differ or a value is
    not finite."""
    diffs = _differences(a, b, "paired_t_test")
    n = len(diffs)
    if n == 0:
        return PairedTest(0, None, None, None, 0, None)
    mean = sum(diffs) / n
    if n < 2:
        return PairedTest(n, mean, None, None, 0, None)
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = std / math.sqrt(n)
    half_width = student_t_ppf(0.5 + CONFIDENCE / 2.0, n - 1) * se
    low, high, detectable = mean - half_width, mean + half_width, minimum_detectable_difference(std, n)
    if se == 0.0:
        return PairedTest(n, mean, 0.0, None, n - 1, 0.0 if mean != 0.0 else None, std, low, high, detectable)
    t = mean / se
    p = min(1.0, 2.0 * student_t_sf(abs(t), n - 1))
    return PairedTest(n, mean, se, t, n - 1, p, std, low, high, detectable)


def paired_by_seed(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[list[int], PairedTest]:
    """The seeds both `a` and `b` ({seed: value}) hold, in order, and the paired t-test of a − b over
    them: the one wrapper behind every per-depth / per-cell comparison of two studies or families."""
    seeds = sorted(set(a) & set(b))
    return seeds, paired_t_test([a[s] for s in seeds], [b[s] for s in seeds])


@dataclass(frozen=True)
class EquivalenceTest:
    """A paired equivalence test of a − b against the margin ±`margin` (TOST, Schuirmann 1987): two
    one-sided paired t-tests, of H0: mean ≤ −margin (`p_lower`) and of H0: mean ≥ +margin (`p_upper`).
    `p_value` = the larger of the two; `equivalent` is p_value < SIGNIFICANCE, the same as the 90%
    interval (`ci_low`, `ci_high`: mean ± t_(0.95, n−1)·se) lying inside (−margin, +margin). None
    fields below two pairs."""

    n: int
    margin: float
    mean_difference: float | None
    standard_error: float | None
    df: int
    p_lower: float | None
    p_upper: float | None
    p_value: float | None
    ci_low: float | None
    ci_high: float | None
    equivalent: bool | None
    test: str = "paired equivalence test (two one-sided Student t-tests, TOST) over seeds"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def equivalence_test(a: Sequence[float], b: Sequence[float], margin: float,
                     alpha: float = SIGNIFICANCE) -> EquivalenceTest:
    """The TOST of a − b (paired by position, as `paired_t_test`) against ±`margin` (> 0, in the units
    of a and b): "a and b differ by less than `margin`" is supported when `equivalent` is True. A
    margin must be stated wherever the claim is made. ValueError for a margin that is not a positive
    finite number, unequal lengths or a value that is not finite."""
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin={margin!r}: expected a positive finite number")
    diffs = _differences(a, b, "equivalence_test")
    n = len(diffs)
    if n < 2:
        mean = sum(diffs) / n if n else None
        return EquivalenceTest(n, float(margin), mean, None, max(n - 1, 0), None, None, None, None, None, None)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) / math.sqrt(n)
    df = n - 1
    if se == 0.0:
        inside = -margin < mean < margin
        p_lower = 0.0 if mean > -margin else 1.0
        p_upper = 0.0 if mean < margin else 1.0
        return EquivalenceTest(n, float(margin), mean, 0.0, df, p_lower, p_upper, max(p_lower, p_upper), mean, mean,
                               inside)
    p_lower = student_t_sf((mean + margin) / se, df)
    p_upper = student_t_cdf((mean - margin) / se, df)
    half_width = student_t_ppf(1.0 - alpha, df) * se
    p = max(p_lower, p_upper)
    return EquivalenceTest(n, float(margin), mean, se, df, p_lower, p_upper, p, mean - half_width, mean + half_width,
                           p < alpha)


# ----------------------------------------------------------------------------------------------------------
# A family of tests: the correction and the verdict

def bonferroni(p_values: Sequence[float]) -> list[float]:
    """Bonferroni-corrected p values of a family of m tests: min(1, m·p) each, in the order given.
    Not the project's rule (`correct` is); kept for comparison: Holm's p is never larger."""
    m = len(p_values)
    return [min(1.0, m * float(p)) for p in p_values]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p values of a family of m tests (Holm 1979), in the order given: the
    i-th smallest p times (m − i + 1), made non-decreasing along the sorted order and capped at 1. A test
    rejects at family-wise level α when its adjusted p < α."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: float(p_values[i]))
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[index])))
        adjusted[index] = running
    return adjusted


def correct(p_values: Sequence[float]) -> list[float]:
    """The project's correction (`CORRECTION`: Holm) of a family of p values, in the order given."""
    return holm(p_values)


def _field(test: PairedTest | Mapping[str, Any], name: str) -> Any:
    return getattr(test, name) if isinstance(test, PairedTest) else test.get(name)


def judged(test: PairedTest | Mapping[str, Any]) -> bool:
    """Whether a paired test gives a verdict: at least MIN_PAIRS_FOR_VERDICT pairs and a p value."""
    return (_field(test, "n") or 0) >= MIN_PAIRS_FOR_VERDICT and _field(test, "p_value") is not None


def correct_family(tests: Sequence[PairedTest | Mapping[str, Any]]) -> list[float | None]:
    """The corrected p (`correct`) of each test of a family, in order: the family is the tests that
    are `judged`; None for the others (too few pairs, or no p)."""
    family = [i for i, test in enumerate(tests) if judged(test)]
    out: list[float | None] = [None] * len(tests)
    for index, p in zip(family, correct([float(_field(tests[i], "p_value")) for i in family])):
        out[index] = p
    return out


def verdict(test: PairedTest | Mapping[str, Any], p_corrected: float | None, a: str, b: str,
            better: str = "lower") -> str:
    """The verdict on a paired test of a − b at its corrected p (`correct_family`): TOO_FEW below
    MIN_PAIRS_FOR_VERDICT pairs; "<a> better" / "<b> better" where p_corrected < SIGNIFICANCE (with
    `better` = "lower", a negative difference is a's advantage, as for an error; "higher" the reverse);
    else NO_DIFFERENCE, which says nothing about equality (`no_difference_text`)."""
    if (_field(test, "n") or 0) < MIN_PAIRS_FOR_VERDICT:
        return TOO_FEW
    if better not in ("lower", "higher"):
        raise ValueError(f"better={better!r}; accepted values: 'lower', 'higher'")
    mean = _field(test, "mean_difference")
    if p_corrected is None or p_corrected >= SIGNIFICANCE or not mean:
        return NO_DIFFERENCE
    a_ahead = (mean < 0) == (better == "lower")
    return f"{a} better" if a_ahead else f"{b} better"


def judge(rows: list[dict[str, Any]], better: str = "lower") -> list[dict[str, Any]]:
    """`rows` (each with "a", "b" and a paired "test" of a − b: a PairedTest's dict) as one family of tests:
    each row gets "p_corrected" (`correct_family`: Holm over the rows whose test is judged; None for the
    others) and "verdict" from it (`verdict`: "<a> better", "<b> better", NO_DIFFERENCE or TOO_FEW;
    `better` = "lower" when a lower value is better). Changed in place and returned."""
    for row, corrected in zip(rows, correct_family([row["test"] for row in rows])):
        row["p_corrected"] = corrected
        row["verdict"] = verdict(row["test"], corrected, row["a"], row["b"], better)
    return rows


def paired_verdict(test: PairedTest | Mapping[str, Any], a: str, b: str) -> str:
    """The verdict on ONE paired test, not part of a family (its p is its corrected p): `verdict`."""
    return verdict(test, _field(test, "p_value"), a, b)


# ----------------------------------------------------------------------------------------------------------
# The words

def format_interval(low: float | None, high: float | None, fmt: str = "+.2f") -> str:
    """An interval as "[low, high]" in `fmt` ("—" when either end is missing)."""
    if low is None or high is None:
        return "—"
    return f"[{format(low, fmt)}, {format(high, fmt)}]"


def format_p(p: float | None, digits: int = 2) -> str:
    """A p value in `digits` significant digits ("—" when there is none)."""
    return "—" if p is None else f"{p:.{digits}g}"


def no_difference_text(test: PairedTest | Mapping[str, Any], fmt: str = "+.2f") -> str:
    """The words for a test that does not reject: "no difference detected; 95% CI [a, b]"."""
    return (f"{NO_DIFFERENCE}; {CONFIDENCE:.0%} CI "
            f"{format_interval(_field(test, 'ci_low'), _field(test, 'ci_high'), fmt)}")


def gated_comparisons(summary: dict[str, Any], other: str, reference: str = "gated") -> list[dict[str, Any]]:
    """Per depth of the summary's config, the paired t-test (`stats.paired_t_test`, two-sided, with its 95%
    interval and detectable difference) of `reference` − `other` last-epoch test error over the seeds both
    finished: {"depth", "a", "b", "seeds", "test"}. No verdict: a verdict needs the family's correction
    (`stats.judge`)."""
    by = {(c["family"], c["depth"]): c for c in summary["cells"]}
    rows = []
    for depth in summary["config"]["depths"]:
        if (reference, depth) not in by or (other, depth) not in by:
            continue
        first = {r["seed"]: r["test_error_pct"] for r in by[(reference, depth)]["per_seed"]}
        second = {r["seed"]: r["test_error_pct"] for r in by[(other, depth)]["per_seed"]}
        seeds, test = paired_by_seed(first, second)
        rows.append({"depth": depth, "a": reference, "b": other, "seeds": seeds, "test": test.to_dict()})
    return rows


def difference_text(row: dict[str, Any], digits: int = 2) -> str:
    """A judged row's (`stats.judge`) mean difference a − b with its 95% interval and both p values, in points."""
    test = row["test"]
    return (f"{row['a']} − {row['b']} {test['mean_difference']:+.{digits}f} points, {CONFIDENCE:.0%} CI "
            f"{format_interval(test['ci_low'], test['ci_high'], f'+.{digits}f')}, p = {format_p(test['p_value'])}, "
            f"{CORRECTION} p = {format_p(row['p_corrected'])}")


def detectable_text(rows: Sequence[Mapping[str, Any]], scale: float = 1.0) -> str:
    """The differences the paired tests `rows` (judged rows, "test" a PairedTest's fields) could detect with
    `POWER` power, times |`scale`|, in points: "the tests detect differences of a to b points with 80% power"
    ("" when none says)."""
    values = [abs(scale) * r["test"]["detectable"] for r in rows if r["test"].get("detectable") is not None]
    if not values:
        return ""
    span = f"{min(values):.2f}" if f"{min(values):.2f}" == f"{max(values):.2f}" else f"{min(values):.2f} to {max(values):.2f}"
    return f"the tests detect differences of {span} points with {POWER:.0%} power"


def judged_in_words(rows: Sequence[dict[str, Any]], phrase: Any = None, *, detectable: bool = False) -> list[str]:
    """What the judged paired tests `rows` (`judge`: one family, e.g. one depth's tests of a − b) say, as the
    findings say it, one part each: a test significant after the correction as `phrase(row)` (default: its
    verdict) with its difference, interval and both p (`difference_text`); one significant only uncorrected
    as "against b no difference detected after Holm, significant only uncorrected (...)"; the others in one
    last part, "no difference detected against b (95% CI [..])", ..., with `detectable` the differences
    the tests could detect (`detectable_text`)."""
    said = phrase if phrase is not None else (lambda row: row["verdict"])
    significant = [r for r in rows if r["verdict"] not in (NO_DIFFERENCE, TOO_FEW)]
    uncorrected = [r for r in rows if r not in significant and r["test"]["p_value"] < SIGNIFICANCE]
    quiet = [r for r in rows if r not in significant and r not in uncorrected]
    parts = [f"{said(r)} ({difference_text(r)})" for r in significant]
    parts += [f"against {r['b']} {NO_DIFFERENCE} after {CORRECTION}, significant only uncorrected "
              f"({difference_text(r)})" for r in uncorrected]
    if quiet:
        power = detectable_text(quiet) if detectable else ""
        parts.append(f"{NO_DIFFERENCE} against " + ", ".join(
            f"{r['b']} ({CONFIDENCE:.0%} CI {format_interval(r['test']['ci_low'], r['test']['ci_high'])})"
            for r in quiet) + (f"; {power}" if power else ""))
    return parts
