"""Statistics over seeds: mean ± std and the paired t-test behind every "A beats B" claim.

The papers report single numbers or mean ± std over runs; a claim that one architecture beats
another needs a test over seeds, not one run. `paired_t_test` compares two architectures trained
with the same seeds (same data order and the same seed for initialisation): the per-seed
differences remove the part of the seed-to-seed variation that both share. The two-sided p-value
comes from Student's t distribution with n − 1 degrees of freedom, computed here through the
regularised incomplete beta function (stdlib only, no SciPy).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

__all__ = ["PairedTest", "bonferroni", "paired_t_test", "paired_by_seed", "paired_verdict", "student_t_sf",
           "regularized_incomplete_beta", "mean_std", "format_mean_std", "SIGNIFICANCE", "MIN_PAIRS_FOR_VERDICT"]

# The level at which a difference is called significant in the reports.
SIGNIFICANCE = 0.05
# A paired test over 2 seeds has 1 degree of freedom: its p-value swings with a single seed, so no
# verdict is drawn from fewer than 3 pairs (the table says "too few seeds" instead).
MIN_PAIRS_FOR_VERDICT = 3


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


def format_mean_std(stat: Mapping[str, Any], fmt: str = ".2f", std_fmt: str | None = None, *, count: bool = False,
                    empty: str = "—") -> str:
    """"mean ± std" of a `mean_std` summary, the mean in `fmt` and the std in `std_fmt` (default: `fmt`);
    with `count`, " (n=N)" after it. `empty` where no value is summarised (n = 0 or mean None). One
    value (n = 1) renders as the mean alone, without a count: its std is undefined (None; summaries
    written before that rule stored 0.0 and render the same)."""
    if not stat.get("n") or stat.get("mean") is None:
        return empty
    text = format(stat["mean"], fmt)
    if stat["n"] == 1 or stat.get("std") is None or math.isnan(stat["std"]):
        return text
    text += f" ± {format(stat['std'], std_fmt or fmt)}"
    return text + (f" (n={stat['n']})" if count else "")


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


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom (the one-sided upper tail)."""
    if df <= 0:
        raise ValueError(f"df={df}: must be > 0")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return tail if t >= 0 else 1.0 - tail


@dataclass(frozen=True)
class PairedTest:
    """A paired two-sided t-test of a − b over matched seeds.

    `mean_difference` is the mean of a − b, `standard_error` its standard error (sample std / √n),
    `t` = mean / standard_error with `df` = n − 1, `p_value` two-sided. `p_value` is None when fewer
    than two pairs exist or every difference is equal (std 0 with a nonzero mean gives p = 0).
    """

    n: int
    mean_difference: float | None
    standard_error: float | None
    t: float | None
    df: int
    p_value: float | None
    test: str = "paired two-sided Student t-test over seeds"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """The paired t-test of a − b (a[i] and b[i] from the same seed). Raises ValueError when the
    lengths differ or a value is not finite."""
    if len(a) != len(b):
        raise ValueError(f"paired_t_test: {len(a)} values against {len(b)}; pairs need equal lengths")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    if not all(math.isfinite(d) for d in diffs):
        raise ValueError("paired_t_test: every value must be finite")
    n = len(diffs)
    if n == 0:
        return PairedTest(0, None, None, None, 0, None)
    mean = sum(diffs) / n
    if n < 2:
        return PairedTest(n, mean, None, None, 0, None)
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = std / math.sqrt(n)
    if se == 0.0:
        return PairedTest(n, mean, 0.0, None, n - 1, 0.0 if mean != 0.0 else None)
    t = mean / se
    p = min(1.0, 2.0 * student_t_sf(abs(t), n - 1))
    return PairedTest(n, mean, se, t, n - 1, p)


def paired_by_seed(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[list[int], PairedTest]:
    """The seeds both `a` and `b` ({seed: value}) hold, in order, and the paired t-test of a − b over
    them: the one wrapper behind every per-depth / per-cell comparison of two studies or families."""
    seeds = sorted(set(a) & set(b))
    return seeds, paired_t_test([a[s] for s in seeds], [b[s] for s in seeds])


def paired_verdict(test: PairedTest, a: str, b: str) -> str:
    """The verdict of a paired test of a − b: "too few seeds" below MIN_PAIRS_FOR_VERDICT pairs;
    "<a> better" / "<b> better" where p < SIGNIFICANCE; else (equal pairs included) "no significant
    difference"."""
    if test.n < MIN_PAIRS_FOR_VERDICT or test.p_value is None:
        return "too few seeds" if test.n < MIN_PAIRS_FOR_VERDICT else "no significant difference"
    if test.p_value < SIGNIFICANCE and test.mean_difference:
        return f"{a} better" if test.mean_difference < 0 else f"{b} better"
    return "no significant difference"


def bonferroni(p_values: Sequence[float]) -> list[float]:
    """Bonferroni-corrected p values of a family of m tests: min(1, m·p) each, in the order given.
    A corrected p below SIGNIFICANCE is the uncorrected p below SIGNIFICANCE / m."""
    m = len(p_values)
    return [min(1.0, m * float(p)) for p in p_values]
