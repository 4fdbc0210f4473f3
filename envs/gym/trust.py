"""Trust checks: a generic scenario's verdicts are only as good as its setter and its determinism.

Run once per scenario version and process, before the scenario is first used (``gym_scenario``
runs them), on three initial states from the sampler plus the two corners of the bounds, with
fixed seeds and seeded random actions, for ``trust_steps`` steps:

1. **The setter sets.** ``reset_to`` runs without error; where the setter can read the state back
   (``state_of``), it reads back the state it was given; where the environment exposes its own
   observation (``observe``), it equals the observation ``reset_to`` returned; and the five states
   do not all give the same episode after the first observation (what ``step`` returns, with one
   seed and one action sequence: a setter that writes where the environment never reads gives the
   same steps from all of them).
2. **Determinism.** The same state, seed and actions give the same episode twice in one
   environment copy and once more in a fresh copy (observations, rewards, ends: bit for bit).
3. **Replay.** Episodes run in lockstep by the batched simulator (copies reused from the pool)
   equal the same episodes replayed alone in a fresh copy: what a verdict records can be replayed
   in the plain environment.

A failed check raises :class:`TrustError` (a :class:`~envs.base.ScenarioError`: the CLI prints one
line and exits 2) naming what failed and the fix.
"""

from __future__ import annotations

import numpy as np

from envs.base import ScenarioError
from envs.gym.simulator import flat

N_SAMPLED = 3
SEEDS = (101, 202, 303, 404, 505)
_TRUSTED: set = set()


class TrustError(ScenarioError):
    """A generic scenario that cannot be trusted: its setter does not set, or it is not deterministic."""


def _fmt(x) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in np.asarray(x, dtype=np.float64).ravel()[:8]) + \
        (", ..." if np.size(x) > 8 else "") + "]"


def _actions(scenario, rng, steps: int) -> list:
    a = scenario.action
    if a.discrete:
        return list(rng.integers(0, a.n, size=steps))
    return list(rng.uniform(a.low, a.high, size=(steps,) + tuple(a.shape)).astype(np.float32))


def _episode(scenario, env, state, seed, actions, steps: int):
    """One episode alone: (observations, rewards, failure events, ends) for at most ``steps`` steps."""
    obs = [flat(scenario.setter.reset_to(env, state, seed), scenario.obs_dim, scenario.name)]
    rew, ev, end = [], [], []
    for t in range(steps):
        o, r, term, trunc, info = env.step(scenario.env_action(actions[t]))
        e, ended = scenario.step_verdict(o, float(r), bool(term), bool(trunc), info)
        obs.append(flat(o, scenario.obs_dim, scenario.name))
        rew.append(float(r))
        ev.append(e)
        end.append(ended)
        if e or ended:
            break
    return np.array(obs), np.array(rew), np.array(ev, dtype=bool), np.array(end, dtype=bool)


def _first_difference(a, b, first: int = 0) -> str | None:
    """Where two episodes first differ from step ``first`` on (None: identical bit for bit)."""
    names = ("observation", "reward", "failure event", "end")
    n = min(len(a[0]), len(b[0]))
    for t in range(first, n):
        for k, what in enumerate(names):
            if k > 0 and t == 0:
                continue
            x, y = a[k][t - (k > 0)], b[k][t - (k > 0)]
            if not np.array_equal(x, y, equal_nan=True):
                return f"the {what} at step {t} ({_fmt(x)} vs {_fmt(y)})"
    if len(a[0]) != len(b[0]):
        return f"the episode's length ({len(a[0]) - 1} vs {len(b[0]) - 1} steps)"
    return None


def _check_setter(sc, env, states, seeds) -> None:
    fix = ("Fix: choose the setter that fits the environment (setter: classic-control | mujoco | reset-options | "
           "module:reset_to) or correct the reset_to function")
    for s, seed in zip(states, seeds):
        try:
            obs = flat(sc.setter.reset_to(env, s, seed), sc.obs_dim, sc.name)
        except Exception as exc:  # noqa: BLE001 - any error of a user's setter is the finding
            raise TrustError(f"{sc.name} cannot be set: setter {sc.setter.describe()} failed on initial state "
                             f"{_fmt(s)} ({type(exc).__name__}: {exc}). {fix}") from exc
        back = sc.setter.state_of(env)
        if back is not None:
            tol = 1e-6 * (1.0 + np.abs(np.asarray(s)))
            bad = np.flatnonzero(np.abs(np.asarray(back, np.float64).ravel()[:len(s)] - s) > tol)
            if back.size != len(s) or bad.size:
                j = int(bad[0]) if bad.size else 0
                raise TrustError(f"{sc.name} cannot be set: after reset_to the environment holds "
                                 f"{sc.state_names[j]} = {back.ravel()[j]:.6g} where the initial state says "
                                 f"{s[j]:.6g} (setter {sc.setter.describe()}). {fix}")
        own = sc.setter.observe(env)
        if own is not None and not np.allclose(flat(own, sc.obs_dim, sc.name), obs, rtol=1e-6, atol=1e-6):
            raise TrustError(f"{sc.name} cannot be set: the observation reset_to returned, {_fmt(obs)}, is not the "
                             f"environment's own observation of the state it holds, {_fmt(flat(own, sc.obs_dim, sc.name))} "
                             f"(setter {sc.setter.describe()}). {fix}")


def check(sc, steps: int | None = None) -> None:
    """Run the trust checks on GymScenario ``sc`` (cached per name and version in this process)."""
    key = (sc.name, sc.version)
    if key in _TRUSTED:
        return
    steps = int(min(steps or sc.trust_steps, sc.max_steps))
    rng = np.random.default_rng(2024)
    try:
        sampled = sc.sample(rng, N_SAMPLED)
    except ScenarioError:
        raise
    except Exception as exc:  # noqa: BLE001 - the sampler is user data too
        raise TrustError(f"{sc.name}: sampler {sc.sampler} failed ({type(exc).__name__}: {exc})") from exc
    corners = sc.validate(np.stack([sc.low, sc.high]))
    states = np.concatenate([sampled, corners])
    seeds = np.array(SEEDS[: len(states)], dtype=np.int64)
    acts = [_actions(sc, rng, steps) for _ in states]
    env = sc.make_env()
    fresh = sc.make_env()
    try:
        _check_setter(sc, env, states, seeds)
        if np.any(sc.high > sc.low):  # a space of one state has nothing to tell apart
            # every state with the same seed and actions: what the environment's step() makes of them
            eps = [_episode(sc, env, s, int(seeds[0]), acts[0], steps) for s in states]
            if all(_first_difference(eps[0], e, first=1) is None for e in eps[1:]):
                raise TrustError(
                    f"{sc.name} cannot be set: from {len(states)} different initial states, the corners "
                    f"{_fmt(corners[0])} and {_fmt(corners[1])} among them (same seed, same actions), the episode is "
                    f"the same for {len(eps[0][0]) - 1} steps, so setter {sc.setter.describe()} does not put the state "
                    f"into the environment. Fix: choose the setter that fits the environment (classic-control | "
                    f"mujoco | reset-options | module:reset_to)")
        alone = []
        for s, seed, a in zip(states, seeds, acts):
            runs = [_episode(sc, env, s, int(seed), a, steps), _episode(sc, env, s, int(seed), a, steps),
                    _episode(sc, fresh, s, int(seed), a, steps)]
            for other, where in ((runs[1], "a second run in the same copy"), (runs[2], "a run in a fresh copy")):
                diff = _first_difference(runs[0], other)
                if diff is not None:
                    raise TrustError(
                        f"{sc.name} is not deterministic: from initial state {_fmt(s)} with seed {int(seed)} and the "
                        f"same actions, {where} differs in {diff}. deltarl needs each episode to be a function of "
                        f"(state, seed, actions). Fix: draw all randomness from the reset seed (self.np_random), not "
                        f"from global random state, the clock or leftovers of the previous episode")
            alone.append(runs[2])
        _check_replay(sc, states, seeds, acts, steps, alone)
    finally:
        env.close()
        fresh.close()
    _TRUSTED.add(key)


def _check_replay(sc, states, seeds, acts, steps, alone) -> None:
    """The batched simulator (pooled copies, lockstep) against each episode alone in a fresh copy."""
    for _ in range(2):  # the second pass reuses the pooled copies: leftovers of an episode would show
        sim = sc.simulator(len(states))
        sim.max_steps = steps
        obs = [[o] for o in sim.reset_to(states, seeds)]
        rew = [[] for _ in states]
        for t in range(steps):
            live = np.flatnonzero(~sim.done)
            if live.size == 0:
                break
            act = np.array([a[t] for a in acts])
            out = sim.step(act)
            for i in live:
                obs[i].append(out.obs[i])
                rew[i].append(out.reward[i])
        del sim
        for i, ref in enumerate(alone):
            n = min(len(obs[i]), len(ref[0]))
            same = np.array_equal(np.array(obs[i][:n]), ref[0][:n]) and np.array_equal(np.array(rew[i][:n - 1]),
                                                                                         ref[1][:n - 1])
            if not same or len(obs[i]) != len(ref[0]):
                raise TrustError(
                    f"{sc.name}: an episode run in lockstep with others does not replay alone in a fresh environment "
                    f"(initial state {_fmt(states[i])}, seed {int(seeds[i])}): environment copies share state or "
                    f"keep some from their previous episode. Fix: keep all simulation state on the instance and "
                    f"reset all of it in reset()")
