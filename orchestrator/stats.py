"""Statistics as the papers print them: mean ± 95% CI margin, Wilson score intervals."""

from __future__ import annotations

import math

import numpy as np


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the margin of its two-sided confidence interval (Student t, n - 1 dof).

    The margin is nan for fewer than two values. Table 1 of the Delta paper reports
    "average cumulative reward and 95% confidence interval margin of error over 100 runs".
    """
    from scipy.special import stdtrit

    x = np.asarray(values, dtype=np.float64).ravel()
    n = x.size
    if n == 0:
        return float("nan"), float("nan")
    mean = float(x.mean())
    if n < 2:
        return mean, float("nan")
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    return mean, float(stdtrit(n - 1, 0.5 + confidence / 2) * sem)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (e.g. 97/100 -> (0.9155, 0.9897))."""
    from scipy.special import ndtri

    if n <= 0:
        return float("nan"), float("nan")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in 0..{n}, got {successes}")
    z = float(ndtri(0.5 + confidence / 2))
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, center - half)  # exact at the edges (no rounding)
    hi = 1.0 if successes == n else min(1.0, center + half)
    return lo, hi
