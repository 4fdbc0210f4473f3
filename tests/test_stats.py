"""Statistics against scipy and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from orchestrator.analysis.stats import (
    best_baseline,
    cohens_d,
    format_cell,
    format_rate,
    improvement,
    mann_whitney,
    mean_ci,
    wilson_interval,
)


def test_mean_ci_matches_scipy_t_interval():
    x = np.random.default_rng(0).normal(100, 15, size=37)
    mean, margin = mean_ci(x)
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert mean == pytest.approx(x.mean())
    assert margin == pytest.approx((hi - lo) / 2, rel=1e-10)


def test_mean_ci_hand_computed():
    # x = 1..5: mean 3, s = sqrt(2.5), t(0.975, 4) = 2.776445105
    mean, margin = mean_ci([1, 2, 3, 4, 5])
    assert mean == 3.0
    assert margin == pytest.approx(2.776445105 * math.sqrt(2.5) / math.sqrt(5), rel=1e-8)
    assert math.isnan(mean_ci([4.0])[1])
    assert mean_ci([7.0, 7.0, 7.0]) == (7.0, 0.0)


def test_wilson_interval_known_values():
    # the example 97/100 -> [91.6, 99.0]: exactly [91.548, 98.975] (91.55 rounded up)
    lo, hi = wilson_interval(97, 100)
    assert (round(100 * lo, 2), round(100 * hi, 2)) == (91.55, 98.97)
    ci = stats.binomtest(97, 100).proportion_ci(confidence_level=0.95, method="wilson")
    assert (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-12)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_mann_whitney_matches_scipy_one_and_two_sided():
    rng = np.random.default_rng(1)
    for n1, n2, shift in ((5, 5, 1.0), (12, 9, 0.3), (40, 35, 0.5)):
        a = rng.normal(shift, 1, n1)
        b = rng.normal(0, 1, n2)
        for alt in ("two-sided", "greater", "less"):
            ref = stats.mannwhitneyu(a, b, alternative=alt)
            assert mann_whitney(a, b, alt) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)
    with pytest.raises(ValueError):
        mann_whitney([1], [2], "bigger")
    assert all(math.isnan(v) for v in mann_whitney([], [1.0, 2.0]))


def test_mann_whitney_hand_computed():
    # a = 1, 2, 3 below every b = 4, 5, 6: U_a = 0. Exact null: all C(6, 3) = 20 splits equally
    # likely, and only one has U = 0 (and one U = 9), so P(U <= 0) = 1/20.
    u, p = mann_whitney([1, 2, 3], [4, 5, 6], "less")
    assert (u, p) == (0.0, pytest.approx(1 / 20))
    assert mann_whitney([1, 2, 3], [4, 5, 6])[1] == pytest.approx(2 / 20)
    assert mann_whitney([1, 2, 3], [4, 5, 6], "greater")[1] == pytest.approx(1.0)
    # with ties: pairs (x > y) count 1, ties 1/2. a = 1, 2, 2 vs b = 2, 3: two ties (2, 2) -> U = 1
    assert mann_whitney([1, 2, 2], [2, 3])[0] == 1.0
    # Delta vs CureFuzz on Acrobot bugs (docs/results.md): 5 vs 5 seeds, all of Delta's above -> U = 25
    u, p = mann_whitney([5, 6, 7, 8, 9], [0, 1, 2, 3, 4])
    assert u == 25.0 and p == pytest.approx(2 / 252)  # 2 / C(10, 5) = 0.0079 ("p = 0.008")


def test_cohens_d_hand_computed():
    # equal variances 1, means 2 and 5: d = (2 - 5) / 1
    assert cohens_d([1, 2, 3], [4, 5, 6]) == pytest.approx(-3.0)
    # a = 2, 4, 6, 8: mean 5, s² = 20/3; b = 1, 2, 3: mean 2, s² = 1
    # pooled = sqrt((3 · 20/3 + 2 · 1) / (4 + 3 - 2)) = sqrt(22/5)
    assert cohens_d([2, 4, 6, 8], [1, 2, 3]) == pytest.approx(3 / math.sqrt(22 / 5))
    x = np.random.default_rng(2).normal(size=20)
    y = np.random.default_rng(3).normal(0.5, 2, size=31)
    pooled = math.sqrt((19 * x.var(ddof=1) + 30 * y.var(ddof=1)) / 49)
    assert cohens_d(x, y) == pytest.approx((x.mean() - y.mean()) / pooled)
    assert cohens_d([3, 3], [3, 3]) == 0.0
    assert cohens_d([4, 4], [3, 3]) == math.inf
    assert math.isnan(cohens_d([1], [2])) and math.isnan(cohens_d([], [1, 2, 3]))


def test_improvement_reproduces_the_papers_percentages():
    # Delta Table 3: bugs CartPole 105.6 vs CureFuzz 72.0 (+46.7%), distinct Acrobot 467.4 vs
    # MDPFuzz 93.2 (+401.5%), distance Acrobot 0.157 vs GMT 0.097 (+61.9%); Table 7 87.8 vs 32.4 (+171%)
    assert round(improvement(105.6, 72.0), 1) == 46.7
    assert round(improvement(467.4, 93.2), 1) == 401.5
    assert round(improvement(0.157, 0.097), 1) == 61.9
    assert round(improvement(87.8, 32.4)) == 171
    assert improvement(-75.0, -100.0) == pytest.approx(25.0)  # negative returns: relative to |best|
    assert math.isnan(improvement(3.0, 0.0))
    assert best_baseline({"mdpfuzz": 54.0, "curefuzz": 72.0, "gmt": 60.6}) == ("curefuzz", 72.0)
    assert best_baseline({"a": 0.2, "b": 0.1, "c": float("nan")}, higher_is_better=False) == ("b", 0.1)
    assert best_baseline({}) == (None, pytest.approx(float("nan"), nan_ok=True))


def test_format_cell_prints_the_papers_way():
    assert format_cell(496.8, 13.8) == "496.8 ± 13.8"
    assert format_cell(618.8, p=0.008) == "618.8 (p=0.008)"
    assert format_cell(105.6, 17.7, improvement_pct=46.667) == "105.6 ± 17.7 (+46.7%)"
    assert format_cell(5450.0, 1241.7, improvement_pct=40.86, p=0.0001) == "5450.0 ± 1241.7 (+40.9%, p<0.001)"
    assert format_cell(0.071, 0.003) == "0.071 ± 3e-3"
    assert format_cell(0.060, 0.02) == "0.060 ± 2e-2"
    assert format_cell(0.537, 0.159) == "0.537 ± 0.159"
    assert format_cell(-81.3, 3.0) == "-81.3 ± 3.0"
    assert format_cell(7.0, float("nan")) == "7.0"
    assert format_cell(float("nan"), 1.0) == "n/a"
    assert format_cell(12.0, 1.5, digits=0) == "12 ± 2"
    # Table 1's success rate: 97/100 with the Wilson interval [91.548, 98.975] (the paper rounds 91.6)
    assert format_rate(97, 100) == "97.0 [91.5, 99.0]"
    assert format_rate(0, 0) == "n/a"
