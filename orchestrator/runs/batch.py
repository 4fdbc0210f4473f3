"""A rollout result checked and laid out as the store's columns, and the store's error.

:meth:`RolloutBatch.from_result` checks a :class:`workers.rollout.RolloutResult` against itself
(shapes, episode indices, lengths that add up to the steps) and against what the run recorded
(action kind and size), vectorised, and normalises it: observations float32 (N, obs_dim),
actions int64 (N,) or float32 (N, act_dim), initial states float64 (E, d). The per-episode
extras of :meth:`orchestrator.runs.store.RunStore.write` (iteration, wall time, bug flag,
policy hashes, final observations) are checked here too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from orchestrator.runs.files import StoreError
from orchestrator.runs.parquet import fixed_list


@dataclass
class RolloutBatch:
    """A rollout result, checked and laid out as the store's columns (N steps, E episodes)."""

    obs: np.ndarray  # (N, obs_dim) float32
    obs_shape: tuple[int, ...]
    obs_dim: int
    actions: np.ndarray  # (N,) int64 when discrete, else (N, act_dim) float32
    kind: str  # "discrete" or "continuous"
    act_dim: int | None
    init: np.ndarray  # (E, state_dim) float64
    state_dim: int
    lengths: np.ndarray  # (E,) int64
    episode: np.ndarray  # (N,) int64, index into the result's episodes
    t: np.ndarray  # (N,) int64
    rewards: np.ndarray | None = None  # (N,) float64, set by add_step_values
    terminals: np.ndarray | None = None  # (N,) bool
    timeouts: np.ndarray | None = None  # (N,) bool

    @classmethod
    def from_result(cls, result, E: int, N: int, meta: dict, run_id: str, root) -> "RolloutBatch":
        """Observations, actions, initial states and the step layout of ``result``, checked
        (:class:`StoreError`); ``meta`` is the run's recorded metadata."""
        obs, obs_shape, obs_dim = _check_obs(result, N)
        actions, kind, act_dim = _check_actions(result, N, meta.get("action_kind"), run_id, root)
        init, state_dim, lengths, episode, t = _check_episodes(result, E, N)
        _check_action_range(actions, kind, N, meta.get("action_size"))
        return cls(obs, obs_shape, obs_dim, actions, kind, act_dim, init, state_dim, lengths, episode, t)

    def check_against(self, meta: dict, root) -> None:
        """Raise :class:`StoreError` when the run ``meta`` recorded other shapes than this batch's."""
        obs_shape, action_kind, act_dim, state_dim = self.obs_shape, self.kind, self.act_dim, self.state_dim
        m = meta
        problems = []
        if m.get("obs_shape") is not None and tuple(m["obs_shape"]) != tuple(obs_shape):
            problems.append(f"observations of shape {tuple(obs_shape)}, but the run holds shape {tuple(m['obs_shape'])}")
        if m.get("action_kind") is not None and m["action_kind"] != action_kind:
            problems.append(f"{action_kind} actions, but the run holds {m['action_kind']} actions")
        elif action_kind == "continuous" and m.get("action_size") is not None and int(m["action_size"]) != act_dim:
            problems.append(f"actions of dimension {act_dim}, but the run holds dimension {m['action_size']}")
        if m.get("state_dim") is not None and int(m["state_dim"]) != state_dim:
            problems.append(f"initial states of {state_dim} values, but the run holds {m['state_dim']} values")
        if problems:
            raise StoreError(
                f"cannot write to run {m['run_id']!r} in {root}: this result has " + "; ".join(problems)
            )

    def record_shapes(self, meta: dict) -> bool:
        """Record in ``meta`` the shapes it lacks (the run's first write); True when it changed."""
        m, action_kind = meta, self.kind
        changed = False
        if m.get("obs_shape") is None:
            m["obs_shape"] = [int(x) for x in self.obs_shape]
            changed = True
        if m.get("action_kind") is None:
            m["action_kind"] = action_kind
            changed = True
        if action_kind == "continuous" and m.get("action_size") is None:
            m["action_size"] = int(self.act_dim)
            changed = True
        if m.get("state_dim") is None:
            m["state_dim"] = int(self.state_dim)
            changed = True
        return changed

    def add_step_values(self, result) -> None:
        """Rewards, terminal and timeout flags of ``result``; then steps sorted by (episode, t)."""
        self.rewards = np.asarray(result.rewards, dtype=np.float64)
        self.terminals = np.asarray(result.terminals, dtype=bool)
        self.timeouts = np.asarray(result.timeouts, dtype=bool)
        self._sort_steps()

    def _sort_steps(self) -> None:
        # already sorted for rollout() output
        if self.obs.shape[0] <= 1:
            return
        episode, t = self.episode, self.t
        de = np.diff(episode)
        if bool(np.all(de >= 0) and np.all(np.diff(t)[de == 0] > 0)):
            return
        order = np.lexsort((t, episode))
        self.obs, self.actions, self.rewards = self.obs[order], self.actions[order], self.rewards[order]
        self.terminals, self.timeouts = self.terminals[order], self.timeouts[order]
        self.episode, self.t = episode[order], t[order]


# --------------------------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------------------------
def _check_obs(result, N: int) -> tuple[np.ndarray, tuple[int, ...], int]:
    """(obs as float32 (N, obs_dim), obs_shape, obs_dim)."""
    obs = np.asarray(result.obs)
    if obs.ndim < 2 or obs.shape[0] != N:
        raise StoreError(f"obs must have shape (n_steps={N}, obs_dim); got {obs.shape}")
    obs_shape = tuple(int(x) for x in obs.shape[1:])
    obs_dim = int(np.prod(obs_shape))
    return np.ascontiguousarray(obs, dtype=np.float32).reshape(N, obs_dim), obs_shape, obs_dim


def _check_actions(result, N: int, recorded_kind: str | None, run_id: str, root) -> tuple[np.ndarray, str, int | None]:
    """(actions, kind, act_dim): int64 (N,) for discrete runs, float32 (N, act_dim) else."""
    actions = np.asarray(result.actions)
    if actions.shape[:1] != (N,):
        raise StoreError(f"actions must have {N} rows (one per step); got shape {actions.shape}")
    if recorded_kind is not None:
        kind = recorded_kind
    else:
        kind = "discrete" if (np.issubdtype(actions.dtype, np.integer) and actions.ndim == 1) else "continuous"
    if kind == "discrete":
        if not np.issubdtype(actions.dtype, np.integer) or actions.ndim != 1:
            raise StoreError(
                f"cannot write to run {run_id!r} in {root}: it holds discrete actions, "
                f"this result has {actions.dtype} actions of shape {actions.shape}"
            )
        return actions.astype(np.int64, copy=False), kind, None
    if actions.ndim == 1:
        act_dim = 1
    else:
        act_dim = int(np.prod(actions.shape[1:]))
    return np.ascontiguousarray(actions, dtype=np.float32).reshape(N, act_dim), kind, act_dim


def _check_episodes(result, E: int, N: int):
    """(initial states (E, d) float64, d, lengths, episode, t): the steps must add up to the lengths."""
    init = np.asarray(result.initial_states, dtype=np.float64)
    if init.ndim != 2 or init.shape[0] != E:
        raise StoreError(f"initial_states must have shape (n_episodes={E}, d); got {init.shape}")
    state_dim = int(init.shape[1])

    lengths = np.asarray(result.lengths, dtype=np.int64)
    episode = np.asarray(result.episode, dtype=np.int64)
    t = np.asarray(result.t, dtype=np.int64)
    if episode.shape != (N,) or t.shape != (N,):
        raise StoreError(f"episode and t must have shape ({N},); got {episode.shape} and {t.shape}")
    if N and (episode.min() < 0 or episode.max() >= E):
        raise StoreError(f"episode indices must lie in [0, {E}); got [{episode.min()}, {episode.max()}]")
    counts = np.bincount(episode, minlength=E) if N else np.zeros(E, dtype=np.int64)
    if lengths.shape != (E,) or not np.array_equal(counts, lengths):
        bad = int(np.flatnonzero(counts != lengths)[0]) if lengths.shape == (E,) else 0
        raise StoreError(
            f"episode lengths do not match the steps: episode #{bad} has length "
            f"{lengths[bad] if lengths.shape == (E,) else lengths.shape} but {counts[bad]} steps"
        )
    if N and t.max() > np.iinfo(np.int32).max:
        raise StoreError(f"step index t={t.max()} does not fit in int32")
    return init, state_dim, lengths, episode, t


def _check_action_range(actions: np.ndarray, kind: str, N: int, size) -> None:
    if kind == "discrete" and N and actions.min() < 0:
        raise StoreError(f"discrete actions must be >= 0; got {actions.min()}")
    if kind == "discrete" and size is not None and N and actions.max() >= int(size):
        raise StoreError(f"discrete action {actions.max()} out of range for {size} actions")


# --------------------------------------------------------------------------------------------
# per-episode extras
# --------------------------------------------------------------------------------------------
def per_episode(value, n: int, dtype, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim == 0:
        return np.full(n, arr, dtype=dtype)
    if arr.shape != (n,):
        raise StoreError(f"{name} must be a scalar or one value per episode ({n}); got shape {arr.shape}")
    return arr


def policy_sha_column(policy_sha256, roles: np.ndarray, E: int) -> pa.Array:
    if policy_sha256 is None:
        return pa.nulls(E, pa.string())
    if isinstance(policy_sha256, str):
        return pa.repeat(pa.scalar(policy_sha256, pa.string()), E)
    if isinstance(policy_sha256, dict):
        return pa.array([policy_sha256.get(r) for r in roles], type=pa.string())
    raise StoreError(f"policy_sha256 must be a str, a dict role -> hash or None; got {type(policy_sha256).__name__}")


def final_obs_column(result, E: int, obs_dim: int) -> pa.Array:
    final_obs = getattr(result, "final_obs", None)
    if final_obs is None:
        # NaN, not null: pyarrow cannot read back null fixed_size_list values from Parquet
        return fixed_list(np.full((E, obs_dim), np.nan, dtype=np.float32), obs_dim, pa.float32())
    fo = np.ascontiguousarray(np.asarray(final_obs, dtype=np.float32)).reshape(E, -1)
    if fo.shape[1] != obs_dim:
        raise StoreError(f"final_obs must have shape ({E}, {obs_dim}); got {np.shape(final_obs)}")
    return fixed_list(fo, obs_dim, pa.float32())
