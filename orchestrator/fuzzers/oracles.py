"""Optimality oracles (Delta, Sec. 3.4.2): is the challenger better than the AUT from this state?

* :class:`DifferentialOracle` (Eq. 2): a bug when ``R_ca > R_aut + delta`` (``delta >= 0``,
  default 0: the strict inequality). With several repeats per state the mean returns are
  compared. For deterministic scenarios, one rollout per agent decides.
* :class:`StatisticalOracle` (Eq. 9): for stochastic scenarios (Hopper-Noise), ``N`` rollouts per
  agent from the state (default 5, independent seeds) and a one-sided Mann–Whitney U test with
  the alternative ``R_ca > R_aut`` (shifted by ``delta``); a bug when ``p < alpha`` (default
  0.05). The p-value is scipy's ``mannwhitneyu(..., alternative="greater")`` (exact for small
  samples without ties, the normal approximation with tie correction otherwise).

``make_oracle(kind, scenario, ...)``: ``kind = "auto"`` picks the statistical oracle for
stochastic scenarios and the differential one otherwise.
"""

from __future__ import annotations

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


def bug_distance(states: np.ndarray, low: np.ndarray, high: np.ndarray) -> float:
    """Mean pairwise Euclidean distance between bug initial states, each dimension min–max
    normalised by the scenario's initial-state bounds (``(s - low) / (high - low)``, so every
    dimension spans [0, 1]; zero-width dimensions are dropped). NaN for fewer than 2 bugs."""
    s = np.asarray(states, dtype=np.float64)
    if s.shape[0] < 2:
        return float("nan")
    width = np.asarray(high, np.float64) - np.asarray(low, np.float64)
    keep = width > 0
    x = (s[:, keep] - np.asarray(low, np.float64)[keep]) / width[keep]
    n = x.shape[0]
    total, sq = 0.0, (x * x).sum(axis=1)
    for lo in range(0, n, 2048):  # chunked: O(n^2) pairs without an n x n matrix at once
        blk = x[lo:lo + 2048]
        d2 = sq[lo:lo + 2048, None] + sq[None, :] - 2.0 * blk @ x.T
        total += np.sqrt(np.maximum(d2, 0.0)).sum()
    return float(total / (n * (n - 1)))  # the diagonal contributes 0
