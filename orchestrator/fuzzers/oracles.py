"""Optimality oracles (Delta, Sec. 3.4.2): is the challenger better than the AUT from this state?

* :class:`DifferentialOracle` (Eq. 2): a bug when ``R_ca > R_aut + delta`` (``delta >= 0``,
  default 0: the strict inequality). With several repeats per state the mean returns are
  compared. For deterministic scenarios, one rollout per agent decides.
* :class:`StatisticalOracle` (Eq. 9): for stochastic scenarios (Hopper-Noise), ``N`` rollouts per
  agent from the state (default 5, independent seeds) and a one-sided Mann–Whitney U test with
  the alternative ``R_ca > R_aut`` (shifted by ``delta``); a bug when ``p < alpha`` (default
  0.05). The p-value is scipy's ``mannwhitneyu(..., alternative="greater")`` (exact for small
  samples without ties, the normal approximation with tie correction otherwise). With ``n``
  repeats per agent the smallest exact p is 1 / C(2n, n) (the challenger above the AUT in every
  pair): 0.05 for n = 3, 0.014 for n = 4. A repeat count whose smallest p is not below ``alpha``
  could never report a bug, so the oracle refuses it, naming the minimum
  (:func:`min_repeats`).

``make_oracle(kind, scenario, ...)``: ``kind = "auto"`` picks the statistical oracle for
stochastic scenarios and the differential one otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ORACLES = ("auto", "differential", "statistical")


@dataclass
class DifferentialOracle:
    delta: float = 0.0
    repeats: int = 1
    kind: str = "differential"

    def __post_init__(self):
        if not (np.isfinite(self.delta) and self.delta >= 0):
            raise ValueError(f"oracle delta must be a finite number >= 0, got {self.delta!r}")
        if int(self.repeats) < 1:
            raise ValueError(f"oracle repeats must be >= 1, got {self.repeats!r}")

    def judge(self, r_aut: np.ndarray, r_ca: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``r_aut``, ``r_ca``: (n, repeats) returns. Returns (bug (n,) bool, p-value (n,): NaN)."""
        a, c = np.atleast_2d(r_aut), np.atleast_2d(r_ca)
        bug = c.mean(axis=1) > a.mean(axis=1) + self.delta
        return bug, np.full(bug.shape, np.nan)


def smallest_p(repeats: int) -> float:
    """The smallest one-sided exact Mann–Whitney p with ``repeats`` returns per agent: 1 / C(2n, n)."""
    return 1.0 / math.comb(2 * int(repeats), int(repeats))


def min_repeats(alpha: float) -> int:
    """The fewest repeats per agent whose smallest p is below ``alpha``."""
    n = 2
    while smallest_p(n) >= alpha:
        n += 1
    return n


@dataclass
class StatisticalOracle:
    repeats: int = 5
    alpha: float = 0.05
    delta: float = 0.0
    kind: str = "statistical"

    def __post_init__(self):
        if int(self.repeats) < 2:
            raise ValueError(f"the statistical oracle needs repeats >= 2, got {self.repeats!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"oracle alpha must be in (0, 1), got {self.alpha!r}")
        if not (np.isfinite(self.delta) and self.delta >= 0):
            raise ValueError(f"oracle delta must be a finite number >= 0, got {self.delta!r}")
        if smallest_p(self.repeats) >= self.alpha:
            raise ValueError(
                f"the statistical oracle cannot reach alpha = {self.alpha:g} with repeats = {int(self.repeats)}: with "
                f"a one-sided Mann-Whitney U test and n repeats per agent the smallest p is 1/C(2n, n) = "
                f"{smallest_p(self.repeats):.4g}; use repeats >= {min_repeats(self.alpha)} (or a larger alpha)")

    def judge(self, r_aut: np.ndarray, r_ca: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from scipy.stats import mannwhitneyu

        a, c = np.atleast_2d(r_aut), np.atleast_2d(r_ca)
        p = np.ones(a.shape[0])
        for i in range(a.shape[0]):
            x, y = c[i] - self.delta, a[i]
            if np.ptp(np.concatenate([x, y])) == 0:  # all equal: no evidence either way
                continue
            p[i] = float(mannwhitneyu(x, y, alternative="greater").pvalue)
        return p < self.alpha, p


def make_oracle(kind: str, scenario, *, delta: float = 0.0, repeats: int | None = None, alpha: float = 0.05):
    if kind not in ORACLES:
        raise ValueError(f"unknown oracle {kind!r}; choose one of {', '.join(ORACLES)}")
    if kind == "auto":
        kind = "statistical" if getattr(scenario, "stochastic", False) else "differential"
    if kind == "statistical":
        return StatisticalOracle(repeats=5 if repeats is None else int(repeats), alpha=float(alpha), delta=float(delta))
    return DifferentialOracle(delta=float(delta), repeats=1 if repeats is None else int(repeats))


def bug_distance(states: np.ndarray) -> float:
    """Mean pairwise Euclidean distance between bug initial states, in the scenario's raw state
    units (the Delta paper's Distance column). NaN for fewer than 2 bugs."""
    return _mean_pairwise(np.asarray(states, dtype=np.float64))


def bug_distance_normalized(states: np.ndarray, low: np.ndarray, high: np.ndarray) -> float:
    """:func:`bug_distance` after min–max normalising each dimension by the scenario's
    initial-state bounds (``(s - low) / (high - low)``, so every dimension spans [0, 1]; zero-width
    dimensions are dropped): every dimension weighs the same. Not the paper's scale."""
    s = np.asarray(states, dtype=np.float64)
    width = np.asarray(high, np.float64) - np.asarray(low, np.float64)
    keep = width > 0
    return _mean_pairwise((s[:, keep] - np.asarray(low, np.float64)[keep]) / width[keep])


def _mean_pairwise(x: np.ndarray) -> float:
    if x.ndim != 2 or x.shape[0] < 2:
        return float("nan")
    n = x.shape[0]
    total, sq = 0.0, (x * x).sum(axis=1)
    for lo in range(0, n, 2048):  # chunked: O(n^2) pairs without an n x n matrix at once
        blk = x[lo:lo + 2048]
        d2 = sq[lo:lo + 2048, None] + sq[None, :] - 2.0 * blk @ x.T
        total += np.sqrt(np.maximum(d2, 0.0)).sum()
    return float(total / (n * (n - 1)))  # the diagonal contributes 0
