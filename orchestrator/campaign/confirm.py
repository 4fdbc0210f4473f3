"""Verdicts about the agent as deployed: every candidate failure and bug is re-run with each
policy acting alone (a batch of one) before it counts.

Why: a batched policy call is not the same computation as one observation at a time. Float32
matrix products sum in a different order for different batch sizes, so near-tied Q-values can
flip the argmax, and a chaotic system turns one flipped action into a different episode (the
zoo CartPole agent gives 500 alone and 100 in a batch of 64 from the same state). A deployed
agent acts on one observation at a time; a verdict is about that agent.

The search itself keeps running in batches (fast); only its candidates are re-run here, with
the generation's episode seeds (``deltarl replay`` runs exactly this). A candidate whose
verdict does not hold alone is *flaky*: it is recorded (``flaky.parquet``, both returns) and
counted apart, never as a failure or a bug. Flaky candidates say something true too: the agent
is near-tied at those states.
"""

from __future__ import annotations

import time

import numpy as np

from workers.rollout import rollout


def solo_rollout(scenario, policies: dict, states: np.ndarray, index: np.ndarray, seed: int, repeats: int = 1):
    """Each policy from each state (global indices ``index``), every policy call on one observation
    (``batch_size=1`` gives the same episodes; here the simulator steps them together)."""
    return rollout(scenario, policies, np.asarray(states, dtype=np.float64), repeats=repeats, seed=seed,
                   state_index=np.asarray(index, dtype=np.int64), alone=True)


def by_state(result, index: np.ndarray, repeats: int, field: str = "returns") -> dict:
    """``{role: (len(index), repeats) array}`` of a per-episode field, rows in ``index`` order."""
    pos = {int(g): i for i, g in enumerate(index)}
    out = {}
    for role in dict.fromkeys(result.role.tolist()):
        sel = np.flatnonzero(result.role == role)
        m = np.full((len(index), repeats), np.nan)
        for e in sel:
            m[pos[int(result.state_index[e])], int(result.repeat[e])] = getattr(result, field)[e]
        out[role] = m
    return out


class Confirmer:
    """Re-runs candidates alone and keeps the time it takes (the cost of sound verdicts).
    ``acted_alone``: the phase's episodes already ran with every policy acting alone (``inference:
    alone``), so the candidates' own returns are the deployed agent's: nothing is re-run (and no
    time is spent), the same verdicts are taken from them."""

    def __init__(self, scenario, policies: dict, acted_alone: bool = False):
        self.scenario, self.policies, self.acted_alone = scenario, policies, bool(acted_alone)
        self.seconds = 0.0

    def failures(self, states: np.ndarray, candidates: np.ndarray, seed: int,
                 returns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Safety: of the candidate failures (indices into ``states``), which fail alone; and
        the AUT's returns alone. ``returns``: the phase's AUT return per state."""
        if candidates.size == 0:
            return np.zeros(0, bool), np.zeros(0)
        if self.acted_alone:  # every candidate failed acting alone
            return np.ones(candidates.size, bool), np.asarray(returns, float)[candidates]
        t0 = time.perf_counter()
        res = solo_rollout(self.scenario, {"aut": self.policies["aut"]}, states[candidates], candidates, seed)
        fails = by_state(res, candidates, 1, "failure")["aut"][:, 0].astype(bool)
        returns = by_state(res, candidates, 1)["aut"][:, 0]
        self.seconds += time.perf_counter() - t0
        return fails, returns

    def bugs(self, states: np.ndarray, candidates: np.ndarray, seed: int, repeats: int, oracle,
             r_aut: np.ndarray, r_ca: np.ndarray):
        """Optimality: the oracle's verdict on the candidates when both agents act alone; returns
        (bug, p-value, AUT returns, challenger returns), each row a candidate. ``r_aut``,
        ``r_ca``: the phase's (states, repeats) returns."""
        if candidates.size == 0:
            z = np.zeros((0, repeats))
            return np.zeros(0, bool), np.zeros(0), z, z
        if self.acted_alone:
            bug, pval = oracle.judge(r_aut[candidates], r_ca[candidates])
            return np.asarray(bug, bool), np.asarray(pval, float), r_aut[candidates], r_ca[candidates]
        t0 = time.perf_counter()
        pols = {r: self.policies[r] for r in ("aut", "challenger")}
        res = solo_rollout(self.scenario, pols, states[candidates], candidates, seed, repeats)
        m = by_state(res, candidates, repeats)
        bug, pval = oracle.judge(m["aut"], m["challenger"])
        self.seconds += time.perf_counter() - t0
        return np.asarray(bug, bool), np.asarray(pval, float), m["aut"], m["challenger"]
