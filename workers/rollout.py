"""Batched lockstep rollouts: run policies from chosen initial states, exactly and fast.

``rollout(scenario, policies, initial_states, ...)`` runs, for every policy role (e.g. ``aut``
and ``challenger``) and every repeat, one episode per initial state. Episodes of one role run
in lockstep batches: one batched ``policy.act`` call per step for all live episodes. The
result is columnar (:class:`RolloutResult`): per-episode arrays and per-step arrays, ready for
Parquet and for d3rlpy.

Episode order in the result: role-major, then repeat, then initial-state index. The random
stream of a stochastic scenario is keyed by ``seed``, the state index and the repeat (not by
batching), so the same call gives the same episodes whatever the batch size or worker count.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from envs.base import Scenario


@dataclass
class RolloutResult:
    """Columnar episodes. ``E`` episodes, ``N`` = total steps (sum of lengths)."""

    # per episode (length E)
    initial_states: np.ndarray  # (E, d) float64
    state_index: np.ndarray  # (E,) int64: index into the initial states given to rollout()
    repeat: np.ndarray  # (E,) int64
    role: np.ndarray  # (E,) object: policy role name ("aut", "challenger", ...)
    seed: np.ndarray  # (E,) int64: the seed of the episode's random stream (stochastic envs)
    returns: np.ndarray  # (E,) float64
    lengths: np.ndarray  # (E,) int64
    terminated: np.ndarray  # (E,) bool: ended by the environment (not by the step limit)
    truncated: np.ndarray  # (E,) bool: ended by the step limit
    failure: np.ndarray  # (E,) bool: the scenario's safety oracle
    # per step (length N), episodes contiguous in episode order, t ascending
    obs: np.ndarray  # (N, obs_dim) float32: observation the action was taken in
    actions: np.ndarray  # (N,) int64 or (N, act_dim) float32
    rewards: np.ndarray  # (N,) float64
    terminals: np.ndarray  # (N,) bool: true on the last step of a terminated episode
    timeouts: np.ndarray  # (N,) bool: true on the last step of a truncated episode
    episode: np.ndarray  # (N,) int64: index of the step's episode in this result
    t: np.ndarray  # (N,) int64: step index within the episode
    final_obs: np.ndarray = field(default=None)  # (E, obs_dim) float32: observation after the last step

    @property
    def n_episodes(self) -> int:
        return int(self.returns.shape[0])

    @property
    def n_steps(self) -> int:
        return int(self.rewards.shape[0])

    def select(self, mask: np.ndarray) -> "RolloutResult":
        """The episodes where ``mask`` (length E) is true, with their steps, re-indexed."""
        mask = np.asarray(mask, dtype=bool)
        keep = np.flatnonzero(mask)
        step_mask = mask[self.episode]
        remap = np.full(self.n_episodes, -1, dtype=np.int64)
        remap[keep] = np.arange(keep.size)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                out[f.name] = None
            elif v.shape[0] == self.n_episodes and f.name in _EPISODE_FIELDS:
                out[f.name] = v[mask]
            else:
                out[f.name] = v[step_mask]
        out["episode"] = remap[out["episode"]]
        return RolloutResult(**out)

    def by_role(self, role: str) -> "RolloutResult":
        return self.select(self.role == role)

    @staticmethod
    def concat(results: list["RolloutResult"]) -> "RolloutResult":
        """Concatenate results; episode indices are shifted to stay consistent."""
        results = [r for r in results if r is not None]
        if not results:
            raise ValueError("nothing to concatenate")
        offsets = np.cumsum([0] + [r.n_episodes for r in results[:-1]])
        out = {}
        for f in fields(RolloutResult):
            parts = [getattr(r, f.name) for r in results]
            if any(p is None for p in parts):
                out[f.name] = None
                continue
            if f.name == "episode":
                parts = [p + o for p, o in zip(parts, offsets)]
            out[f.name] = np.concatenate(parts, axis=0)
        return RolloutResult(**out)

    def summary(self) -> dict:
        """Mean return with its 95% CI margin (t distribution), failures, steps."""
        from scipy import stats

        n = self.n_episodes
        mean = float(np.mean(self.returns)) if n else float("nan")
        if n > 1:
            sem = float(np.std(self.returns, ddof=1) / np.sqrt(n))
            margin = float(stats.t.ppf(0.975, n - 1) * sem)
        else:
            margin = float("nan")
        return {
            "episodes": n,
            "steps": self.n_steps,
            "mean_return": mean,
            "ci95_margin": margin,
            "failures": int(np.sum(self.failure)),
            "failure_rate": float(np.mean(self.failure)) if n else float("nan"),
            "mean_length": float(np.mean(self.lengths)) if n else float("nan"),
        }


_EPISODE_FIELDS = {
    "initial_states",
    "state_index",
    "repeat",
    "role",
    "seed",
    "returns",
    "lengths",
    "terminated",
    "truncated",
    "failure",
    "final_obs",
}
