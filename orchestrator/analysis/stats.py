"""Statistics as the papers print them: mean ± 95% CI margin, Wilson score intervals, Mann–Whitney U,
Cohen's d, improvement over the best baseline, and the table cells."""

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


def mann_whitney(a, b, alternative: str = "two-sided") -> tuple[float, float]:
    """Mann–Whitney U test of ``a`` against ``b``: (U of ``a``, p-value), via scipy.

    ``alternative``: ``"two-sided"``, ``"greater"`` (``a`` tends to be larger) or ``"less"``.
    scipy picks the exact distribution for small samples without ties and the normal
    approximation with tie and continuity correction otherwise. U counts the pairs (x, y)
    with x > y plus half the ties. (nan, nan) when either sample is empty.
    """
    from scipy.stats import mannwhitneyu

    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.size == 0 or y.size == 0:
        return float("nan"), float("nan")
    res = mannwhitneyu(x, y, alternative=alternative)
    return float(res.statistic), float(res.pvalue)


def cohens_d(a, b) -> float:
    """Cohen's d of ``a`` against ``b``: (mean a - mean b) / pooled standard deviation.

    Pooled SD = sqrt(((n_a - 1) s_a² + (n_b - 1) s_b²) / (n_a + n_b - 2)), sample variances
    (ddof 1). nan with fewer than 3 values in all or an empty sample; when the pooled SD is 0,
    0.0 for equal means and ±inf otherwise.
    """
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    na, nb = x.size, y.size
    if na == 0 or nb == 0 or na + nb < 3:
        return float("nan")
    va = x.var(ddof=1) if na > 1 else 0.0
    vb = y.var(ddof=1) if nb > 1 else 0.0
    sd = math.sqrt(((na - 1) * va + (nb - 1) * vb) / (na + nb - 2))
    diff = float(x.mean() - y.mean())
    if sd == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / sd


def improvement(ours: float, best_baseline: float) -> float:
    """Improvement over the best baseline in percent, as Table 3 prints it:
    100 · (ours − best) / |best| (CartPole bugs: 105.6 vs 72.0 → +46.7%). nan when best is 0."""
    if best_baseline == 0 or best_baseline != best_baseline or ours != ours:
        return float("nan")
    return 100.0 * (ours - best_baseline) / abs(best_baseline)


def best_baseline(values: dict, higher_is_better: bool = True) -> tuple[str | None, float]:
    """(name, value) of the best entry of ``{name: value}``, nan values ignored; (None, nan) if none."""
    items = [(k, float(v)) for k, v in values.items() if v is not None and v == v]
    if not items:
        return None, float("nan")
    return (max if higher_is_better else min)(items, key=lambda kv: kv[1])


def _margin_str(margin: float, small: bool, digits: int) -> str:
    if small and 0 < margin < 0.1:  # the papers print small margins as one significant digit: 3e-3
        mant, exp = f"{margin:.0e}".split("e")
        return f"{mant}e{int(exp)}"
    return f"{margin:.{digits}f}"


def format_cell(mean: float, margin: float | None = None, *, p: float | None = None,
                improvement_pct: float | None = None, digits: int | None = None) -> str:
    """A table cell the papers' way.

    ``format_cell(496.8, 13.8)`` → ``496.8 ± 13.8``; ``format_cell(618.8, p=0.008)`` →
    ``618.8 (p=0.008)``; ``format_cell(105.6, 17.7, improvement_pct=46.7)`` →
    ``105.6 ± 17.7 (+46.7%)``; ``format_cell(0.071, 0.003)`` → ``0.071 ± 3e-3``.
    Digits: 1 decimal, or 3 when |mean| < 1 (distances), unless ``digits`` is given. A nan
    margin (one value) is left out; a nan mean prints ``n/a``. p < 0.001 prints ``p<0.001``.
    """
    if mean is None or mean != mean:
        return "n/a"
    small = abs(mean) < 1 and mean != 0
    d = digits if digits is not None else (3 if small else 1)
    out = f"{mean:.{d}f}"
    if margin is not None and margin == margin:
        out += f" ± {_margin_str(float(margin), small and digits is None, d)}"
    extra = []
    if improvement_pct is not None and improvement_pct == improvement_pct:
        extra.append(f"{improvement_pct:+.1f}%")
    if p is not None and p == p:
        extra.append("p<0.001" if p < 0.001 else f"p={p:.3f}")
    if extra:
        out += " (" + ", ".join(extra) + ")"
    return out


def format_rate(successes: int, n: int, confidence: float = 0.95) -> str:
    """A success rate with its Wilson interval, Table 1's way: ``97.0 [91.6, 99.0]`` (percent)."""
    if n <= 0:
        return "n/a"
    lo, hi = wilson_interval(successes, n, confidence)
    return f"{100 * successes / n:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"
