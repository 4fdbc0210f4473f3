"""The one conformance test every scenario passes.

For each registered scenario: 200 initial states sampled from the scenario's reset
distribution are run in ONE batched simulator with seeded actions (a mix of uniformly random
actions and a noisy "keep going" controller so that some episodes run long); then every
episode is replayed in the reference gymnasium environment, started in the same state with
the same actions, and observations, rewards and terminated/truncated flags are compared step
for step.

Tolerance: none. Observations, rewards, terminated/truncated flags and episode lengths must
be bit-identical. The batched simulators repeat gymnasium's float64 arithmetic in the same
order (classic control: the same numpy ufuncs, and C ``pow()`` where gymnasium squares numpy
scalars; MuJoCo: the same ``mj_step`` calls on the same integration state, solver warm-start
included), so any difference is a bug, and a chaotic system (Acrobot, Hopper) would amplify
even a one-ulp difference within a few hundred steps. The reference env gets float64
actions (gymnasium computes the MuJoCo control cost in the action's dtype).
"""

from __future__ import annotations

import numpy as np
import pytest

from envs import SCENARIOS, get_scenario

N_STATES = 200


def _actions(scenario, rng, obs, live_idx):
    """Seeded actions: half of the episodes random, half a noisy heuristic controller."""
    n = len(live_idx)
    spec = scenario.action
    if spec.discrete:
        a = rng.integers(0, spec.n, size=n)
        heuristic = live_idx % 2 == 0
        if scenario.name == "CartPole-v1":
            push = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
            keep = rng.random(n) < 0.9
            a = np.where(heuristic & keep, push, a)
        elif scenario.name == "MountainCar-v0":
            a = np.where(heuristic, np.where(obs[:, 1] >= 0, 2, 0), a)
        elif scenario.name == "Acrobot-v1":
            a = np.where(heuristic, np.where(obs[:, 4] >= 0, 2, 0), a)
        return a.astype(np.int64)
    shape = (n,) + spec.shape
    a = rng.uniform(spec.low, spec.high, size=shape)
    small = (live_idx % 2 == 0)[:, None]
    return np.where(small, 0.1 * a, a).astype(np.float32)


def run_batched(scenario, states, seeds, rng):
    sim = scenario.simulator(len(states))
    obs = sim.reset_to(states, seeds)
    n = len(states)
    traj = [dict(obs=[obs[i].copy()], actions=[], rewards=[], term=[], trunc=[]) for i in range(n)]
    while not sim.done.all():
        live = np.flatnonzero(~sim.done)
        act_live = _actions(scenario, rng, obs[live], live)
        actions = np.zeros((n,) + act_live.shape[1:], dtype=act_live.dtype)
        actions[live] = act_live
        out = sim.step(actions)
        obs = out.obs
        for j, i in enumerate(live):
            traj[i]["actions"].append(act_live[j])
            traj[i]["rewards"].append(out.reward[i])
            traj[i]["term"].append(bool(out.terminated[i]))
            traj[i]["trunc"].append(bool(out.truncated[i]))
            traj[i]["obs"].append(out.obs[i].copy())
    return traj


def replay_reference(scenario, env, state, seed, actions):
    obs = [scenario.reference_reset_to(env, state, seed=seed)]
    rewards, term, trunc = [], [], []
    for t, a in enumerate(actions):
        a = int(a) if scenario.action.discrete else np.asarray(a, dtype=np.float64)
        o, r, te, tr, _ = env.step(a)
        tr = bool(tr) or (t + 1 >= scenario.max_steps and not te)
        obs.append(np.asarray(o))
        rewards.append(float(r))
        term.append(bool(te))
        trunc.append(tr)
        if te or tr:
            break
    return dict(obs=obs, rewards=rewards, term=term, trunc=trunc)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_batched_simulator_matches_reference(name):
    scenario = get_scenario(name)
    rng = np.random.default_rng(1234)
    states = scenario.sample(rng, N_STATES)
    seeds = np.arange(N_STATES, dtype=np.int64) + 1000
    batched = run_batched(scenario, states, seeds, np.random.default_rng(99))
    env = scenario.reference_env()
    lengths = []
    for i in range(N_STATES):
        b = batched[i]
        ref = replay_reference(scenario, env, states[i], int(seeds[i]), b["actions"])
        assert len(ref["rewards"]) == len(b["rewards"]), f"{name} state #{i}: episode length differs"
        np.testing.assert_array_equal(
            np.asarray(b["obs"], dtype=np.float64),
            np.asarray(ref["obs"], dtype=np.float64),
            err_msg=f"{name} state #{i}: observations differ",
        )
        np.testing.assert_array_equal(b["rewards"], ref["rewards"], err_msg=f"{name} state #{i}: rewards differ")
        assert b["term"] == ref["term"], f"{name} state #{i}: terminated differs"
        assert b["trunc"] == ref["trunc"], f"{name} state #{i}: truncated differs"
        lengths.append(len(b["rewards"]))
    # the comparison must have exercised more than the first few steps
    assert max(lengths) >= min(scenario.max_steps, 50)


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_space_contract(name):
    scenario = get_scenario(name)
    rng = np.random.default_rng(0)
    d = scenario.state_dim
    assert len(scenario.state_meaning) == d and scenario.low.shape == scenario.high.shape == (d,)
    s = scenario.sample(rng, 500)
    assert s.shape == (500, d)
    assert np.all(s >= scenario.low) and np.all(s <= scenario.high)
    u = scenario.sample_uniform(rng, 100)
    m = scenario.mutate(u, rng)
    assert m.shape == u.shape
    assert np.all(m >= scenario.low) and np.all(m <= scenario.high)
    width = scenario.high - scenario.low
    moved = np.abs(m - u)
    assert np.all(moved[:, width == 0] == 0)
    if (width > 0).any():
        assert moved[:, width > 0].mean() > 0
    # a larger scale moves further on average
    big = scenario.mutate(u, np.random.default_rng(1), scale=0.3)
    small = scenario.mutate(u, np.random.default_rng(1), scale=0.01)
    assert np.abs(big - u).sum() > np.abs(small - u).sum()
    # the grid: indices inside 0..k-1, corners in the first and last cell
    cells = scenario.grid_cells(np.stack([scenario.low, scenario.high]))
    k = scenario.grid_intervals
    assert cells.min() >= 0 and cells.max() <= k - 1
    assert np.all(cells[0] == 0)
    assert np.all(cells[1][width > 0] == k - 1)
    assert 1 <= scenario.count_distinct(s) <= min(500, k ** int((width > 0).sum()))
    desc = scenario.describe()
    assert desc["name"] == scenario.name and len(desc["state"]) == d
    # project: any vector (a generator's output) lands on a valid state
    wild = rng.normal(size=(50, d)) * (width + 1.0) * 2 + (scenario.low + scenario.high) / 2
    scenario.validate(scenario.project(wild))


@pytest.mark.parametrize("name", SCENARIOS)
def test_validation_rejects_bad_states(name):
    from envs import InvalidStateError

    scenario = get_scenario(name)
    good = scenario.sample(np.random.default_rng(0), 3)
    bad = good.copy()
    bad[1, 0] = np.nan
    with pytest.raises(InvalidStateError, match=r"initial state #1 has a non-finite value .* every value must be a finite number"):
        scenario.validate(bad)
    bad = good.copy()
    bad[2, -1] = scenario.high[-1] + 1.0
    with pytest.raises(InvalidStateError, match=r"initial state #2 .* outside the valid initial-state region"):
        scenario.validate(bad)
    with pytest.raises(InvalidStateError, match=r"has %d values" % scenario.state_dim):
        scenario.validate(good[:, :-1])
    with pytest.raises(InvalidStateError):
        scenario.simulator(3).reset_to(bad)


def test_unknown_scenario_lists_known_ones():
    from envs import ScenarioError

    with pytest.raises(ScenarioError, match="unknown scenario 'Pong-v5'; known scenarios: CartPole-v1, .*Hopper-Noise"):
        get_scenario("Pong-v5")
    assert get_scenario("cartpole-v1").name == "CartPole-v1"


def test_failure_oracles_follow_the_paper():
    cp = get_scenario("CartPole-v1")
    assert list(cp.is_failure(np.array([10, 500]), np.array([10, 500]), np.array([True, False]))) == [True, False]
    mc = get_scenario("MountainCar-v0")
    assert list(mc.is_failure(np.array([-120, -200]), np.array([120, 200]), np.array([True, False]))) == [False, True]
    ac = get_scenario("Acrobot-v1")
    assert list(ac.is_failure(np.array([-99.0, -101.0]), np.array([100, 102]), np.array([True, True]))) == [False, True]
    for name in ("Hopper-v5", "Walker2d-v5", "Hopper-Noise"):
        s = get_scenario(name)
        assert list(s.is_failure(np.array([100.0, 3000.0]), np.array([50, 1000]), np.array([True, False]))) == [True, False]
