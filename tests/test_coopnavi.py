"""CoopNavi (MPE simple_spread, centralised): the reference env against mpe2, batched vs
reference, collision counting and the failure oracle, validity, sampling and mutation."""

from __future__ import annotations

import numpy as np
import pytest

from envs import InvalidStateError, ScenarioError, get_scenario
from envs.coopnavi import AGENT_MIN_SEP, LANDMARK_MIN_SEP, is_valid, validity_violations


def _run_reference(sc, state, actions):
    env = sc.reference_env()
    obs = [sc.reference_reset_to(env, state)]
    rewards, term, trunc, infos = [], [], [], []
    for a in actions:
        o, r, te, tr, info = env.step(np.asarray(a, dtype=np.float64))
        obs.append(o)
        rewards.append(r)
        term.append(te)
        trunc.append(tr)
        infos.append(info)
        if te or tr:
            break
    return dict(obs=np.array(obs), rewards=np.array(rewards), term=term, trunc=trunc, infos=infos, env=env)


def _run_batched(sc, states, actions):
    """actions: (T, n, 6), the same for every step count; returns per-step arrays."""
    sim = sc.simulator(len(states))
    obs = [sim.reset_to(states)]
    rewards, term, trunc = [], [], []
    for a in actions:
        out = sim.step(a)
        obs.append(out.obs.copy())
        rewards.append(out.reward.copy())
        term.append(out.terminated.copy())
        trunc.append(out.truncated.copy())
        if sim.done.all():
            break
    return dict(obs=np.array(obs), rewards=np.array(rewards), term=np.array(term), trunc=np.array(trunc), sim=sim)


# ---------------------------------------------------------------------------------------------
# against mpe2's simple_spread_v3 (PettingZoo's MPE)
# ---------------------------------------------------------------------------------------------


def _mpe2_env():
    from mpe2 import simple_spread_v3

    # local_ratio 0: every agent's reward is the global reward; benchmark_data: collisions per agent
    return simple_spread_v3.parallel_env(N=3, local_ratio=0.0, max_cycles=25, continuous_actions=True,
                                         benchmark_data=True)


def _mpe2_rollout(env, state, actions):
    env.reset(seed=0)
    raw = env.unwrapped
    names = raw.possible_agents
    for i, ag in enumerate(raw.world.agents):
        ag.state.p_pos = state[2 * i: 2 * i + 2].copy()
        ag.state.p_vel = np.zeros(2)
    for j, lm in enumerate(raw.world.landmarks):
        lm.state.p_pos = state[6 + 2 * j: 8 + 2 * j].copy()
    obs = [np.concatenate([raw.observe(n) for n in names])]
    rewards, pos = [], []
    for a in actions:
        # our action (u_x, u_y) per agent -> MPE's [noop, left, right, down, up] in [0, 1]
        acts = {n: np.array([0.0, max(-a[2 * i], 0), max(a[2 * i], 0), max(-a[2 * i + 1], 0),
                             max(a[2 * i + 1], 0)], dtype=np.float32) for i, n in enumerate(names)}
        o, r, _, _, info = env.step(acts)
        obs.append(np.concatenate([o[n] for n in names]))
        pairs = sum(info[n]["benchmark_data"][1] for n in names) / 2  # each pair counted by both agents
        rewards.append(r[names[0]] - pairs)
        pos.append(np.concatenate([ag.state.p_pos for ag in raw.world.agents]))
    return np.array(obs), np.array(rewards), np.array(pos)


def _collision_course():
    """Agents 0 and 1 start 0.4 apart and are pushed into each other; agent 2 stays away."""
    state = np.array([-0.2, 0.0, 0.2, 0.0, 0.0, 0.8, -0.5, -0.5, 0.5, -0.5, 0.0, 0.8])
    actions = np.tile(np.array([1.0, 0.0, -1.0, 0.0, 0.0, 0.0], dtype=np.float32), (25, 1))
    return state, actions


def _drop_comm(mpe_obs):
    """mpe2's per-agent observation is 18 = our 14 + 4 communication zeros (silent agents)."""
    o = mpe_obs.reshape(len(mpe_obs), 3, 18)
    assert np.all(o[:, :, 14:] == 0)
    return o[:, :, :14].reshape(len(mpe_obs), 42)


@pytest.mark.slow
def test_reference_matches_mpe2_with_its_integration_order():
    sc = get_scenario("CoopNavi", integrator="mpe2")
    rng = np.random.default_rng(7)
    env = _mpe2_env()
    cases = [(s, rng.uniform(-1, 1, size=(25, 6)).astype(np.float32)) for s in sc.sample(rng, 12)]
    cases.append(_collision_course())
    hits_total = 0
    for state, actions in cases:
        ref = _run_reference(sc, state, actions)
        m_obs, m_rew, m_pos = _mpe2_rollout(env, state, actions)
        assert len(ref["rewards"]) == 25
        np.testing.assert_allclose(ref["obs"], _drop_comm(m_obs), rtol=0, atol=1e-9)
        np.testing.assert_allclose(ref["rewards"], m_rew, rtol=0, atol=1e-9)
        np.testing.assert_allclose(np.concatenate(ref["env"].unwrapped.agent_pos), m_pos[-1], rtol=0, atol=1e-9)
        hits_total += ref["infos"][-1]["collisions_total"]
    assert hits_total > 5  # the collision course exercised the contact force and the penalty


def test_default_integrator_is_openai_mpe_order(monkeypatch):
    """The default ("openai": velocity first, as in the original MPE the peers used) differs from
    mpe2 only by the integration order: with mpe2's integrate_state swapped for that order the
    two agree; unswapped they do not."""
    from mpe2._mpe_utils.core import World

    sc = get_scenario("CoopNavi")
    state, actions = _collision_course()
    ref = _run_reference(sc, state, actions)
    env = _mpe2_env()
    m_obs, m_rew, _ = _mpe2_rollout(env, state, actions)
    assert np.abs(ref["obs"] - _drop_comm(m_obs)).max() > 1e-3

    def velocity_first(self, p_force):
        for i, entity in enumerate(self.entities):
            if not entity.movable:
                continue
            entity.state.p_vel = entity.state.p_vel * (1 - self.damping)
            if p_force[i] is not None:
                entity.state.p_vel = entity.state.p_vel + (p_force[i] / entity.mass) * self.dt
            entity.state.p_pos = entity.state.p_pos + entity.state.p_vel * self.dt

    monkeypatch.setattr(World, "integrate_state", velocity_first)
    m_obs, m_rew, _ = _mpe2_rollout(_mpe2_env(), state, actions)
    np.testing.assert_allclose(ref["obs"], _drop_comm(m_obs), rtol=0, atol=1e-9)
    np.testing.assert_allclose(ref["rewards"], m_rew, rtol=0, atol=1e-9)


def test_first_step_by_hand():
    """From rest, far apart: v = 0.75·0 + 5·a·0.1, p = p0 + v·0.1 (openai order); the contact
    force of agents 0.33+ apart is below 1e-11."""
    sc = get_scenario("CoopNavi")
    state = np.array([-0.8, -0.8, 0.0, 0.8, 0.8, -0.8, 0.1, 0.1, 0.2, 0.2, 0.3, 0.3])
    a = np.array([1.0, 0.5, -0.25, 0.0, 2.0, -3.0])  # out of range: clipped to [-1, 1]
    ref = _run_reference(sc, state, [a])
    ac = np.clip(a, -1, 1)
    v = 5.0 * ac * 0.1
    p = state[:6] + v * 0.1
    obs = ref["obs"][1].reshape(3, 14)
    np.testing.assert_allclose(obs[:, 0:2].reshape(-1), v, atol=1e-6)  # float32 observation
    np.testing.assert_allclose(obs[:, 2:4].reshape(-1), p, atol=1e-6)
    lm = state[6:].reshape(3, 2)
    np.testing.assert_allclose(obs[1, 4:10], (lm - p[2:4]).reshape(-1), atol=1e-6)
    np.testing.assert_allclose(obs[1, 10:14], np.concatenate([p[0:2] - p[2:4], p[4:6] - p[2:4]]), atol=1e-6)
    d = np.linalg.norm(p.reshape(3, 1, 2) - lm.reshape(1, 3, 2), axis=2)  # (agent, landmark)
    assert ref["rewards"][0] == pytest.approx(-d.min(axis=0).sum(), abs=1e-9)


# ---------------------------------------------------------------------------------------------
# batched vs reference, collisions, oracle
# ---------------------------------------------------------------------------------------------


def test_batched_is_deterministic_and_independent_of_batch_composition():
    sc = get_scenario("CoopNavi")
    rng = np.random.default_rng(3)
    states = sc.sample(rng, 40)
    actions = rng.uniform(-1, 1, size=(25, 40, 6)).astype(np.float32)
    a = _run_batched(sc, states, actions)
    b = _run_batched(sc, states, actions)
    for k in ("obs", "rewards", "term", "trunc"):
        np.testing.assert_array_equal(a[k], b[k])
    # episode 5 alone, and in a reversed batch
    alone = _run_batched(sc, states[5:6], actions[:, 5:6])
    np.testing.assert_array_equal(alone["obs"][:, 0], a["obs"][:, 5])
    rev = _run_batched(sc, states[::-1], actions[:, ::-1])
    np.testing.assert_array_equal(rev["rewards"][:, ::-1], a["rewards"])
    # and against the reference env, step for step, bit for bit
    for i in (0, 5, 39):
        ref = _run_reference(sc, states[i], actions[:, i])
        np.testing.assert_array_equal(ref["obs"], a["obs"][:, i])
        np.testing.assert_array_equal(ref["rewards"], a["rewards"][:, i])
        assert ref["term"] == list(a["term"][:, i]) and ref["trunc"] == list(a["trunc"][:, i])


def test_collisions_are_counted_on_a_collision_course():
    sc = get_scenario("CoopNavi")
    state, actions = _collision_course()
    ref = _run_reference(sc, state, actions)
    per_step = [info["collisions"] for info in ref["infos"]]
    # agents 0 and 1 overlap within a few steps and are held together; agent 2 never collides
    assert per_step[0] == 0 and max(per_step) == 1
    assert sum(per_step) > 5 and ref["infos"][-1]["collisions_total"] == sum(per_step)
    # the reward is -sum of min distances - 1 per colliding pair
    env = ref["env"].unwrapped
    p = np.array(env.agent_pos)
    lm = np.array(env.landmark_pos)
    d = np.linalg.norm(p[:, None] - lm[None], axis=2)
    assert ref["rewards"][-1] == pytest.approx(-d.min(axis=0).sum() - per_step[-1], abs=1e-12)
    # the contact force keeps them from passing through each other
    assert p[0, 0] < p[1, 0]
    # > 5 collisions: the episode terminates at step 25 and is a failure
    assert len(ref["rewards"]) == 25 and ref["term"][-1] and not any(ref["term"][:-1])
    b = _run_batched(sc, state[None], actions[:, None])
    assert b["sim"].collisions[0] == sum(per_step)
    assert bool(b["term"][-1, 0]) and not b["trunc"][-1, 0]
    assert sc.is_failure(np.array([b["rewards"][:, 0].sum()]), np.array([25]), b["term"][-1]).tolist() == [True]


def test_covered_without_collisions_is_a_success_and_uncovered_a_failure():
    sc = get_scenario("CoopNavi")
    # every agent sits on a landmark and stays still
    on = np.array([-0.5, -0.5, 0.5, -0.5, 0.0, 0.6, -0.5, -0.5, 0.5, -0.5, 0.0, 0.6])
    zero = np.zeros((25, 6), dtype=np.float32)
    ref = _run_reference(sc, on, zero)
    assert len(ref["rewards"]) == 25 and ref["trunc"][-1] and not any(ref["term"])
    assert np.all(np.abs(ref["rewards"]) < 1e-9) and ref["infos"][-1]["covered"] == 3
    # landmark 2 away from everyone: no collision, but uncovered at the end -> failure
    off = on.copy()
    off[10:12] = [0.9, 0.9]
    ref = _run_reference(sc, off, zero)
    assert ref["infos"][-1]["collisions_total"] == 0 and ref["infos"][-1]["covered"] == 2
    assert ref["term"][-1] and not ref["trunc"][-1]
    b = _run_batched(sc, np.stack([on, off]), np.repeat(zero[:, None], 2, axis=1))
    assert b["term"][-1].tolist() == [False, True] and b["trunc"][-1].tolist() == [True, False]
    assert b["sim"].covered.tolist() == [3, 2]
    # just inside / just outside the cover radius
    near = on.copy()
    near[10:12] = on[4:6] + [0.0, 0.0999]
    far = on.copy()
    far[10:12] = on[4:6] + [0.0, 0.1001]
    b = _run_batched(sc, np.stack([near, far]), np.repeat(zero[:, None], 2, axis=1))
    assert b["term"][-1].tolist() == [False, True]


def test_failure_oracle_is_termination():
    sc = get_scenario("CoopNavi")
    assert sc.is_failure(np.array([-10.0, -10.0]), np.array([25, 25]), np.array([True, False])).tolist() == [True, False]
    assert "more than 5 collisions" in sc.failure_rule and "0.1" in sc.failure_rule


# ---------------------------------------------------------------------------------------------
# validity, sampling, mutation
# ---------------------------------------------------------------------------------------------


def test_validate_rejects_overlapping_agents_and_close_landmarks():
    sc = get_scenario("CoopNavi")
    good = sc.sample(np.random.default_rng(0), 3)
    bad = good.copy()
    bad[1, 4:6] = bad[1, 0:2] + [0.1, 0.0]  # agent 2 on top of agent 0
    with pytest.raises(InvalidStateError, match=r"CoopNavi: initial state #1 is invalid: agents 0 and 2 are 0\.1 "
                                                r"apart; agents must be at least 0\.33 apart"):
        sc.validate(bad)
    with pytest.raises(InvalidStateError, match="agents 0 and 2"):
        sc.simulator(3).reset_to(bad)
    bad = good.copy()
    bad[2, 8:10] = bad[2, 6:8] + [0.0, -0.1]
    with pytest.raises(InvalidStateError, match=r"initial state #2 is invalid: landmarks 0 and 1 are 0\.1 apart; "
                                                r"landmarks must be at least 0\.15 apart"):
        sc.validate(bad)
    # the boundary: exactly the minimum separations are valid, a hair less is not
    edge = good[0].copy()
    edge[0:2] = [0.0, 0.0]
    edge[2:4] = [AGENT_MIN_SEP, 0.0]
    edge[4:6] = [0.0, -0.8]
    edge[6:8] = [-0.9, 0.9]
    edge[8:10] = [-0.9, 0.9 - LANDMARK_MIN_SEP]
    edge[10:12] = [0.9, 0.9]
    assert validity_violations(edge[None]) == [None]
    sc.validate(edge)
    edge[2] -= 1e-6
    assert "agents 0 and 1" in validity_violations(edge[None])[0]
    # agents may start on landmarks (no agent-landmark constraint)
    on = np.array([-0.5, -0.5, 0.5, -0.5, 0.0, 0.6, -0.5, -0.5, 0.5, -0.5, 0.0, 0.6])
    sc.validate(on)


def test_sample_is_valid_seeded_and_uniform():
    sc = get_scenario("CoopNavi")
    s = sc.sample(np.random.default_rng(11), 3000)
    assert s.shape == (3000, 12) and np.all(is_valid(s))
    assert np.all(s >= -1) and np.all(s <= 1)
    np.testing.assert_array_equal(s, sc.sample(np.random.default_rng(11), 3000))
    assert np.all(np.abs(s.mean(axis=0)) < 0.06) and np.all(s.min(axis=0) < -0.99) and np.all(s.max(axis=0) > 0.99)
    u = sc.sample_uniform(np.random.default_rng(12), 500)
    assert np.all(is_valid(u))


def test_mutate_keeps_validity_and_falls_back_to_the_parent():
    sc = get_scenario("CoopNavi")
    rng = np.random.default_rng(5)
    s = sc.sample(rng, 400)
    m = sc.mutate(s, rng)
    assert np.all(is_valid(m)) and np.all(np.abs(m) <= 1)
    assert np.abs(m - s).mean() > 0.005 and np.abs(m - s).max() < 0.3
    chain = s
    for _ in range(30):
        chain = sc.mutate(chain, rng, scale=0.3)
        assert np.all(is_valid(chain))
    # crowded parents (agents just valid, next to each other) and no redraws: invalid mutants
    # are replaced by their parents, valid ones kept
    crowded = np.tile(np.array([0.0, 0.0, 0.331, 0.0, 0.0, 0.331, -0.9, -0.9, 0.9, 0.9, -0.9, 0.9]), (200, 1))
    sc0 = get_scenario("CoopNavi", max_redraws=0)
    m = sc0.mutate(crowded, np.random.default_rng(1), scale=0.05)
    kept = np.all(m == crowded, axis=1)
    assert np.all(is_valid(m)) and 0 < kept.sum() < 200
    # with redraws fewer parents are kept
    m2 = get_scenario("CoopNavi").mutate(crowded, np.random.default_rng(1), scale=0.05)
    assert np.all(is_valid(m2)) and np.all(m2 == crowded, axis=1).sum() < kept.sum()


def test_grid_is_the_quadrant_of_every_entity():
    sc = get_scenario("CoopNavi")
    s = np.array([[-0.5, 0.5, 0.5, -0.5, 0.5, 0.5, -0.5, -0.5, 0.1, 0.9, -0.9, 0.2]])
    assert sc.grid_cells(s).tolist() == [[0, 1, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1]]


def test_bad_integrator_and_action_shape_are_rejected():
    with pytest.raises(ScenarioError, match="integrator must be one of openai, mpe2"):
        get_scenario("CoopNavi", integrator="rk4").simulator(2)
    sc = get_scenario("CoopNavi")
    sim = sc.simulator(2)
    sim.reset_to(sc.sample(np.random.default_rng(0), 2))
    with pytest.raises(ScenarioError, match=r"actions have shape \(2, 6\)"):
        sim.step(np.zeros((2, 4)))


def test_greedy_baseline_beats_random():
    """The hand-written controller (workers.examples.coopnavi_greedy) is far better than random
    actions: the scenario is solvable with the given dynamics and oracle, but not trivially."""
    from workers.policies import load_policy
    from workers.rollout import rollout

    sc = get_scenario("CoopNavi")
    states = sc.sample(np.random.default_rng(2024), 300)
    rnd = rollout(sc, load_policy("random:0", scenario=sc), states, seed=0).summary()
    greedy = rollout(sc, load_policy("python:workers.examples:coopnavi_greedy", scenario=sc), states, seed=0).summary()
    assert rnd["failure_rate"] > 0.95 and rnd["mean_return"] < -40
    assert greedy["mean_return"] > -20 and 0.05 < greedy["failure_rate"] < 0.35
