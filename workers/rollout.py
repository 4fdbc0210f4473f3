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
        """Plain aggregates (statistics with intervals live in ``orchestrator.analysis.stats``)."""
        n = self.n_episodes
        return {
            "episodes": n,
            "steps": self.n_steps,
            "mean_return": float(np.mean(self.returns)) if n else float("nan"),
            "std_return": float(np.std(self.returns, ddof=1)) if n > 1 else float("nan"),
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


def episode_seeds(seed: int, state_index: np.ndarray, repeat: np.ndarray) -> np.ndarray:
    """Seed of each episode's random stream: a splitmix64 hash of (seed, state index, repeat).

    It does not depend on the policy role (the AUT and a challenger started from the same
    state in the same repeat meet the same noise: common random numbers), nor on batching.
    """
    with np.errstate(over="ignore"):
        z = (
            np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
            + np.asarray(state_index, dtype=np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
            + np.asarray(repeat, dtype=np.uint64) * np.uint64(0x94D049BB133111EB)
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(1)).astype(np.int64)  # non-negative int64


def _act(policy, obs: np.ndarray, alone: bool) -> np.ndarray:
    """One batched policy call, or (``alone``) one call per observation: the agent as deployed,
    whose actions cannot depend on what else is in the batch."""
    if not alone or obs.shape[0] <= 1:
        return np.asarray(policy.act(obs))
    if hasattr(policy, "act_alone"):  # deltarl's policies: one model call per row, one check for all
        return np.asarray(policy.act_alone(obs))
    return np.concatenate([np.asarray(policy.act(obs[j:j + 1])) for j in range(obs.shape[0])])


def _checked_act(policy, obs: np.ndarray, alone: bool, t: int, role: str, states: np.ndarray,
                 live: np.ndarray) -> np.ndarray:
    """:func:`_act`, refusing actions that are not finite (NaN/inf would make every return NaN
    and every failure oracle silent) with an error naming the policy, the step and the episode."""
    from workers.policies.base import PolicyError

    label = getattr(policy, "label", None) or getattr(policy, "uri", None) or type(policy).__name__
    where = f"at step {t} of an episode of the {role} policy {label}"
    try:
        a = _act(policy, obs, alone)
    except PolicyError as exc:
        raise PolicyError(f"{exc} ({where})") from exc
    if np.issubdtype(a.dtype, np.floating) and a.size and not np.isfinite(a).all():
        j = int(np.flatnonzero(~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1))[0])
        start = ", ".join(f"{v:.6g}" for v in np.asarray(states[live[j]]).ravel())
        raise PolicyError(f"the {role} policy {label} returned a non-finite action ({a[j].tolist()}) at step {t} "
                          f"of the episode from initial state [{start}]: a NaN or infinite action cannot be "
                          f"simulated; check the model's weights and its input normalisation")
    return a


def _run_batch(scenario: Scenario, policy, states, seeds, max_steps, alone: bool = False, role: str = "aut"):
    """One lockstep batch: every live episode advances together; one policy call per step (one
    per live episode when ``alone``: the simulator stays batched, inference sees one row)."""
    n = states.shape[0]
    sim = scenario.simulator(n)
    sim.max_steps = max_steps
    obs = sim.reset_to(states, seeds)
    spec = scenario.action
    obs_buf = np.zeros((max_steps, n, scenario.obs_dim), dtype=np.float32)
    if spec.discrete:
        act_buf = np.zeros((max_steps, n), dtype=np.int64)
    else:
        act_buf = np.zeros((max_steps, n) + tuple(spec.shape), dtype=np.float32)
    rew_buf = np.zeros((max_steps, n), dtype=np.float64)
    final_obs = np.zeros((n, scenario.obs_dim), dtype=np.float32)
    terminated = np.zeros(n, dtype=bool)
    truncated = np.zeros(n, dtype=bool)
    actions = np.zeros(act_buf.shape[1:], dtype=act_buf.dtype)
    t = 0
    while t < max_steps:
        live = np.flatnonzero(~sim.done)
        if live.size == 0:
            break
        live_obs = obs[live]
        obs_buf[t, live] = live_obs
        a = _checked_act(policy, live_obs, alone, t, role, states, live)
        if a.shape[0] != live.size:
            raise ValueError(f"policy returned {a.shape[0]} actions for {live.size} observations")
        actions[live] = a.reshape(actions[live].shape)
        act_buf[t, live] = actions[live]
        out = sim.step(actions)
        rew_buf[t, live] = out.reward[live]
        ended = live[out.terminated[live] | out.truncated[live]]
        terminated[live] = out.terminated[live]
        truncated[live] = out.truncated[live]
        final_obs[ended] = out.obs[ended]
        obs = out.obs
        t += 1
    lengths = sim.t.copy()
    mask = np.arange(max_steps)[None, :] < lengths[:, None]  # (n, T), episode-major
    step_obs = np.swapaxes(obs_buf, 0, 1)[mask]
    step_act = np.swapaxes(act_buf, 0, 1)[mask]
    step_rew = rew_buf.T[mask]
    ep_of_step = np.repeat(np.arange(n), lengths)
    t_of_step = np.concatenate([np.arange(k) for k in lengths]) if n else np.zeros(0, np.int64)
    last = np.zeros(step_rew.shape[0], dtype=bool)
    last[np.cumsum(lengths) - 1] = True
    terminals = last & terminated[ep_of_step]
    timeouts = last & truncated[ep_of_step]
    returns = np.bincount(ep_of_step, weights=step_rew, minlength=n) if n else np.zeros(0)
    return dict(
        returns=returns,
        lengths=lengths,
        terminated=terminated,
        truncated=truncated,
        final_obs=final_obs,
        obs=step_obs,
        actions=step_act,
        rewards=step_rew,
        terminals=terminals,
        timeouts=timeouts,
        episode=ep_of_step,
        t=t_of_step.astype(np.int64),
    )


def rollout(
    scenario: Scenario,
    policies,
    initial_states: np.ndarray,
    *,
    max_steps: int | None = None,
    repeats: int = 1,
    seed: int = 0,
    batch_size: int = 256,
    state_offset: int = 0,
    state_index: np.ndarray | None = None,
    alone: bool = False,
) -> RolloutResult:
    """Run every policy from every initial state (``repeats`` times each), in lockstep batches.

    ``policies`` is one policy (role ``"aut"``) or a dict role → policy; each policy has
    ``act(obs_batch) -> action_batch``. Returns a :class:`RolloutResult`. ``state_offset``
    shifts the state indices (a chunk of a longer list keeps its global indices and seeds);
    ``state_index`` gives each state's global index instead (a few states picked out of a
    generation, e.g. to confirm them). ``alone``: every policy call sees one observation, as a
    deployed agent does; the results equal ``batch_size=1`` (the simulators are exact per
    episode) at a fraction of the cost.
    """
    if not isinstance(policies, dict):
        policies = {"aut": policies}
    states = scenario.validate(initial_states)
    max_steps = int(max_steps or scenario.max_steps)
    repeats = int(repeats)
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    m = states.shape[0]
    base = (np.arange(m, dtype=np.int64) + int(state_offset) if state_index is None
            else np.asarray(state_index, dtype=np.int64).reshape(m))
    local = np.tile(np.arange(m, dtype=np.int64), repeats)
    idx = base[local]
    rep = np.repeat(np.arange(repeats, dtype=np.int64), m)
    seeds = episode_seeds(seed, idx, rep)
    parts = []
    for role, policy in policies.items():
        for lo in range(0, idx.size, batch_size):
            sl = slice(lo, lo + batch_size)
            b = _run_batch(scenario, policy, states[local[sl]], seeds[sl], max_steps, alone, role)
            k = b["returns"].shape[0]
            parts.append(
                RolloutResult(
                    initial_states=states[local[sl]],
                    state_index=idx[sl],
                    repeat=rep[sl],
                    role=np.full(k, role, dtype=object),
                    seed=seeds[sl],
                    failure=np.asarray(scenario.is_failure(b["returns"], b["lengths"], b["terminated"]), dtype=bool),
                    **b,
                )
            )
    if not parts:
        return _empty_result(scenario)
    return RolloutResult.concat(parts)


def _empty_result(scenario: Scenario) -> RolloutResult:
    d, o = scenario.state_dim, scenario.obs_dim
    act = np.zeros(0, np.int64) if scenario.action.discrete else np.zeros((0,) + tuple(scenario.action.shape), np.float32)
    z = np.zeros(0)
    return RolloutResult(
        initial_states=np.zeros((0, d)), state_index=z.astype(np.int64), repeat=z.astype(np.int64),
        role=np.zeros(0, dtype=object), seed=z.astype(np.int64), returns=z, lengths=z.astype(np.int64),
        terminated=z.astype(bool), truncated=z.astype(bool), failure=z.astype(bool),
        obs=np.zeros((0, o), np.float32), actions=act, rewards=z, terminals=z.astype(bool),
        timeouts=z.astype(bool), episode=z.astype(np.int64), t=z.astype(np.int64),
        final_obs=np.zeros((0, o), np.float32),
    )


class RolloutWorker:
    """What one rollout actor does: hold a scenario and loaded policies, run episode batches.

    Plain class (testable without Ray); ``orchestrator.cluster.pool`` wraps it as a Ray actor.
    ``torch_threads`` (default 1): batched inference of small MLPs gains little from a second
    thread, and OpenMP threads spin badly when the cores are busy with other work (measured
    here: a 64-row forward pass took 29 ms instead of ~0.3 ms with training running beside it).
    """

    def __init__(
        self,
        scenario: str,
        policy_uris: dict[str, str],
        *,
        scenario_overrides: dict | None = None,
        device: str | None = None,
        batch_size: int = 256,
        torch_threads: int | None = 1,
        scenario_obj=None,
        policies: dict | None = None,
        alone: bool = False,
    ):
        from envs import get_scenario
        from workers.policies import load_policy

        if torch_threads:
            import torch

            torch.set_num_threads(int(torch_threads))
        # a scenario and policies this process already built are reused (each loaded once)
        self.scenario = scenario_obj if scenario_obj is not None else get_scenario(scenario, **(scenario_overrides or {}))
        have = policies or {}
        self.policies = {role: have[role] if role in have else load_policy(uri, self.scenario, device=device)
                         for role, uri in policy_uris.items()}
        self.batch_size = int(batch_size)
        self.alone = bool(alone)  # every policy call on one observation (a phase's `inference: alone`)

    def policy_hashes(self) -> dict[str, str]:
        return {role: getattr(p, "sha256", "") or "" for role, p in self.policies.items()}

    def run(
        self,
        initial_states: np.ndarray,
        *,
        roles: list[str] | None = None,
        repeats: int = 1,
        seed: int = 0,
        max_steps: int | None = None,
        state_offset: int = 0,
    ) -> RolloutResult:
        """Roll out ``roles`` (default: all loaded policies) from ``initial_states``.

        ``state_offset`` is added to the state indices (and so to the episode seeds), so that a
        driver splitting one list of states into chunks gets the same episodes as one call.
        """
        pols = self.policies if roles is None else {r: self.policies[r] for r in roles}
        res = rollout(
            self.scenario,
            pols,
            initial_states,
            max_steps=max_steps,
            repeats=repeats,
            seed=seed,
            batch_size=self.batch_size,
            state_offset=state_offset,
            alone=self.alone,
        )
        return res

    def ping(self) -> bool:
        return True


