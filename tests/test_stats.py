"""Statistics against scipy and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from orchestrator.stats import mean_ci, wilson_interval


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
