"""Batched lockstep rollouts: exactness against a one-episode loop, columns, roles, repeats."""

from __future__ import annotations

import numpy as np
import pytest

from envs import get_scenario
from workers.examples import cartpole_balancer
from workers.rollout import RolloutResult, episode_seeds, rollout


class CountingPolicy:
    """A deterministic policy that records how many times and on how many rows it was called."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def act(self, obs):
        self.calls.append(obs.shape[0])
        return self.fn(obs)


def serial_episode(scenario, fn, state, max_steps):
    """The peer tools' serial loop: one reference env, reset, set state, batch-1 calls."""
    env = scenario.reference_env()
    obs = scenario.reference_reset_to(env, state)
    total, n, term = 0.0, 0, False
    for _ in range(max_steps):
        a = int(fn(np.asarray(obs, dtype=np.float32)[None])[0])
        obs, r, term, trunc, _ = env.step(a)
        total += r
        n += 1
        if term or trunc:
            break
    return total, n, term


@pytest.mark.slow
def test_rollout_matches_serial_loop_and_batches_policy_calls():
    sc = get_scenario("CartPole-v1")
    states = sc.sample(np.random.default_rng(3), 40)
    pol = CountingPolicy(cartpole_balancer)
    res = rollout(sc, pol, states, batch_size=16)
    assert res.n_episodes == 40 and res.n_steps == int(res.lengths.sum())
    # one call per step per batch, never more rows than the batch
    assert max(pol.calls) <= 16 and len(pol.calls) <= 3 * sc.max_steps
    for i in range(0, 40, 7):
        ret, n, term = serial_episode(sc, cartpole_balancer, states[i], sc.max_steps)
        assert res.returns[i] == ret and res.lengths[i] == n and res.terminated[i] == term
    # columns are consistent: returns are sums of step rewards, last-step flags set once
    np.testing.assert_allclose(np.bincount(res.episode, weights=res.rewards), res.returns)
    assert res.terminals.sum() == res.terminated.sum()
    assert res.timeouts.sum() == res.truncated.sum()
    assert np.all(res.t[res.episode == 5] == np.arange(res.lengths[5]))
    np.testing.assert_array_equal(res.obs[res.t == 0], states.astype(np.float32))
    assert np.array_equal(res.failure, res.terminated & (res.lengths < 500))


@pytest.mark.slow
def test_batch_size_does_not_change_results():
    sc = get_scenario("Acrobot-v1")
    states = sc.sample(np.random.default_rng(4), 12)
    pol = CountingPolicy(lambda o: np.where(o[:, 4] >= 0, 2, 0))
    a = rollout(sc, pol, states, batch_size=12, max_steps=120)
    b = rollout(sc, pol, states, batch_size=5, max_steps=120)
    for f in ("returns", "lengths", "rewards", "obs", "actions", "terminals", "timeouts", "seed"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert a.lengths.max() <= 120 and a.truncated.any()


def test_differential_roles_and_repeats():
    sc = get_scenario("CartPole-v1")
    states = sc.sample(np.random.default_rng(5), 6)
    res = rollout(sc, {"aut": CountingPolicy(cartpole_balancer), "challenger": CountingPolicy(lambda o: np.zeros(len(o), np.int64))},
                  states, repeats=3)
    assert res.n_episodes == 2 * 3 * 6
    aut, ca = res.by_role("aut"), res.by_role("challenger")
    assert aut.n_episodes == ca.n_episodes == 18
    np.testing.assert_array_equal(aut.state_index, ca.state_index)
    np.testing.assert_array_equal(aut.seed, ca.seed)  # common random numbers across roles
    assert len(np.unique(aut.seed)) == 18  # a different stream per (state, repeat)
    assert ca.returns.max() < aut.returns.min()  # always pushing left drops the pole fast
    # select() keeps steps aligned with their episodes
    assert ca.n_steps == int(ca.lengths.sum()) and np.all(ca.episode < ca.n_episodes)
    back = RolloutResult.concat([aut, ca])
    assert back.n_episodes == 36 and back.n_steps == res.n_steps


def test_episode_seeds_are_stable_and_distinct():
    s = episode_seeds(7, np.arange(1000), np.zeros(1000, np.int64))
    assert len(np.unique(s)) == 1000 and (s >= 0).all()
    np.testing.assert_array_equal(s, episode_seeds(7, np.arange(1000), np.zeros(1000, np.int64)))
    assert not np.array_equal(s, episode_seeds(8, np.arange(1000), np.zeros(1000, np.int64)))


def test_rollout_rejects_bad_states_and_actions():
    from envs import InvalidStateError, ScenarioError

    sc = get_scenario("CartPole-v1")
    with pytest.raises(InvalidStateError, match="non-finite"):
        rollout(sc, CountingPolicy(cartpole_balancer), np.array([[0.0, np.inf, 0.0, 0.0]]))
    with pytest.raises(ScenarioError, match=r"actions must be in 0..1"):
        rollout(sc, CountingPolicy(lambda o: np.full(len(o), 5)), sc.sample(np.random.default_rng(0), 2))
