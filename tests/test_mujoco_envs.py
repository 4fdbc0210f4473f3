"""MuJoCo scenarios (Hopper-v5, Walker2d-v5, Hopper-Noise): batched simulator vs gymnasium.

Conformance: 200 initial states sampled from each scenario's reset distribution run in one
batched simulator with seeded random actions (half full-range, half scaled by 0.1); every
episode is then replayed in the reference gymnasium environment (for Hopper-Noise, Hopper-v5
wrapped with the same wind) started in the same state, with the same actions, and compared
step by step. A few long episodes (a PD controller that keeps the walker up until the
1000-step limit, plus noise) check truncation, the solver warm-start carried over 1000 steps
and the wind stream across its chunk boundaries.

Tolerance: EXACT equality (0 ulp) of observations, rewards, terminated/truncated flags and
lengths. The batched simulator advances MuJoCo's full integration state (qpos, qvel, ctrl,
xfrc_applied, time and the solver warm-start qacc_warmstart) with the same ``mj_step`` calls
as gymnasium, and computes observation and reward with gymnasium's float64 operations in
gymnasium's order, so there is no admissible source of difference: any drift means the state
(typically the warm-start) was not carried, and the chaotic contact dynamics would amplify even
a 1-ulp difference within a few hundred steps anyway.
"""

from __future__ import annotations

import numpy as np
import pytest

from envs import InvalidStateError, ScenarioError, get_scenario
from envs.mujoco_envs import (
    WIND_CHUNK,
    HopperNoise,
    MujocoSim,
    _WindStreams,
    wind_normals,
    wind_uniforms,
)
from tests.test_conformance import replay_reference as _replay_reference

NAMES = ("Hopper-v5", "Walker2d-v5", "Hopper-Noise")
N_STATES = 200


def _pd_action(name: str, obs: np.ndarray) -> np.ndarray:
    """A PD controller that keeps the walker standing (joint angles to 0): long episodes."""
    nj = 3 if name.startswith("Hopper") else 6
    q, qd = obs[:, 2 : 2 + nj], obs[:, 2 + nj + 3 :]
    kp, kd = (10.0, 1.0) if nj == 3 else (3.0, 0.05)
    return np.clip(-kp * q - kd * qd, -1.0, 1.0)


def run_batched(scenario, states, seeds, action_fn, batch_size=None, **sim_kwargs):
    """Run the episodes in one batch; return per-episode dicts of actions/obs/rewards/flags."""
    n = len(states)
    sim = scenario.simulator(batch_size or n, **sim_kwargs)
    obs = sim.reset_to(states, seeds)
    traj = [dict(obs=[obs[i].copy()], actions=[], rewards=[], term=[], trunc=[]) for i in range(n)]
    while not sim.done.all():
        live = np.flatnonzero(~sim.done)
        actions = action_fn(obs, sim.t)  # (n, nu) float64; entries of finished episodes unused
        out = sim.step(actions)
        for i in live:
            traj[i]["actions"].append(actions[i].copy())
            traj[i]["obs"].append(out.obs[i].copy())
            traj[i]["rewards"].append(out.reward[i])
            traj[i]["term"].append(bool(out.terminated[i]))
            traj[i]["trunc"].append(bool(out.truncated[i]))
        obs = out.obs
    for tr in traj:
        for k in ("obs", "actions", "rewards"):
            tr[k] = np.asarray(tr[k])
    return traj, sim


def replay_reference(scenario, env, state, seed, actions):
    """The shared conformance replay, with numpy arrays back."""
    r = _replay_reference(scenario, env, state, seed, actions)
    return dict(obs=np.asarray(r["obs"]), rewards=np.asarray(r["rewards"]), term=r["term"], trunc=r["trunc"])


def assert_same_episode(name, i, b, ref):
    assert len(ref["rewards"]) == len(b["rewards"]), f"{name} state #{i}: episode length differs"
    dobs = np.abs(b["obs"] - ref["obs"]).max()
    assert np.array_equal(b["obs"], ref["obs"]), f"{name} state #{i}: observations differ (max |diff| {dobs:.3g})"
    drew = np.abs(b["rewards"] - ref["rewards"]).max()
    assert np.array_equal(b["rewards"], ref["rewards"]), f"{name} state #{i}: rewards differ (max |diff| {drew:.3g})"
    assert b["term"] == ref["term"], f"{name} state #{i}: terminated differs"
    assert b["trunc"] == ref["trunc"], f"{name} state #{i}: truncated differs"


# Random-action conformance over 200 states lives in tests/test_conformance.py (one test for
# every scenario); here: long episodes under a standing controller, to the 1000-step limit.


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides", [(n, {}) for n in NAMES]
                         + [("Hopper-Noise", {"wind": "ar1", "wind_body": "torso"})])
def test_conformance_long_episodes(name, overrides):
    """A few episodes kept up by a noisy PD controller until the 1000-step limit."""
    scenario = get_scenario(name, **overrides)
    n = 4
    states = scenario.sample(np.random.default_rng(5), n)
    seeds = np.array([3, 1_000_003, 2**40 + 5, 2**62 + 17], dtype=np.int64)
    rng = np.random.default_rng(11)
    nu = scenario.action.size

    def actions(obs, t):
        return np.clip(_pd_action(name, obs) + 0.05 * rng.normal(size=(n, nu)), -1.0, 1.0)

    batched, sim = run_batched(scenario, states, seeds, actions)
    lengths = np.array([len(b["rewards"]) for b in batched])
    # most run past the wind's first 256-step chunk, at least one to the step limit
    assert (lengths > 300).sum() >= 3 and lengths.max() == scenario.max_steps, lengths
    env = scenario.reference_env()
    for i in range(n):
        ref = replay_reference(scenario, env, states[i], int(seeds[i]), batched[i]["actions"])
        assert_same_episode(name, i, batched[i], ref)
        if lengths[i] == scenario.max_steps:
            assert batched[i]["trunc"][-1] and not batched[i]["term"][-1]


def test_model_matches_gymnasium():
    """Initial qpos, joint names, dimensions, action bounds and xml file are gymnasium's."""
    import os

    for name in ("Hopper-v5", "Walker2d-v5"):
        scenario = get_scenario(name)
        env = scenario.reference_env()
        u = env.unwrapped
        assert os.path.basename(u.fullpath) == scenario.xml_file
        np.testing.assert_array_equal(u.init_qpos, scenario.init_qpos)
        np.testing.assert_array_equal(u.init_qvel, np.zeros(u.model.nv))
        joints = [u.model.joint(j).name for j in range(u.model.njnt)]
        assert joints[0] == "rootx"
        assert scenario.state_names == tuple(joints[1:]) + tuple(f"v_{j}" for j in joints)
        assert len(scenario.state_meaning) == scenario.state_dim == u.model.nq - 1 + u.model.nv
        assert scenario.obs_dim == env.observation_space.shape[0]
        np.testing.assert_array_equal(scenario.action.low, env.action_space.low)
        np.testing.assert_array_equal(scenario.action.high, env.action_space.high)
        assert u._reset_noise_scale == scenario.reset_noise_scale == 5e-3
        center = np.concatenate([u.init_qpos[1:], u.init_qvel])
        np.testing.assert_allclose(scenario.low, center - 5e-3)
        np.testing.assert_allclose(scenario.high, center + 5e-3)
        assert scenario.max_steps == env.spec.max_episode_steps == 1000


@pytest.mark.parametrize("name", NAMES)
def test_sample_mutate_validate(name):
    scenario = get_scenario(name)
    rng = np.random.default_rng(0)
    s = scenario.sample(rng, 1000)
    assert s.shape == (1000, scenario.state_dim)
    assert np.all(s >= scenario.low) and np.all(s <= scenario.high)
    # uniform over the box: every dimension spreads over its whole width
    width = scenario.high - scenario.low
    assert np.all(s.max(0) - s.min(0) > 0.95 * width)
    for scale in (None, 0.01, 0.5, 3.0):
        m = scenario.mutate(s, rng, scale=scale)
        assert np.all(m >= scenario.low) and np.all(m <= scenario.high)
        assert np.any(m != s)
    bad = s[:3].copy()
    bad[1, 4] = np.nan
    with pytest.raises(InvalidStateError, match=rf"initial state #1 has a non-finite value \(nan\) for '{scenario.state_names[4]}'"):
        scenario.validate(bad)
    bad = s[:3].copy()
    bad[2, 0] = 0.5  # a fallen torso height: far outside the reset region
    with pytest.raises(
        InvalidStateError,
        match=r"initial state #2 has 'rootz' = 0.5, outside the valid initial-state region \[1.245, 1.255\]",
    ):
        scenario.validate(bad)
    with pytest.raises(InvalidStateError, match="outside the valid initial-state region"):
        scenario.simulator(3).reset_to(bad)
    with pytest.raises(InvalidStateError, match=rf"has {scenario.state_dim} values"):
        scenario.validate(s[:, :-1])


def test_reset_noise_scale_widens_the_region():
    scenario = get_scenario("Hopper-v5", reset_noise_scale=0.1)
    np.testing.assert_allclose(scenario.high - scenario.low, 0.2)
    assert scenario.low[0] == pytest.approx(1.15) and scenario.high[0] == pytest.approx(1.35)
    s = scenario.sample(np.random.default_rng(1), 500)
    assert np.abs(s[:, 1]).max() > 0.05  # now beyond the default 5e-3
    scenario.validate(s)
    assert get_scenario("Hopper-v5").high[0] == pytest.approx(1.255)  # others unaffected
    with pytest.raises(ScenarioError, match="reset_noise_scale must be a finite number >= 0"):
        get_scenario("Walker2d-v5", reset_noise_scale=-1.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_is_failure_matches_terminations(name):
    scenario = get_scenario(name)
    n = 12
    states = scenario.sample(np.random.default_rng(3), n)
    rng = np.random.default_rng(4)
    # half random (falls fast), half PD-controlled (reaches the limit)
    pd = np.arange(n) % 2 == 0

    def actions(obs, t):
        a = rng.uniform(-1, 1, size=(n, scenario.action.size))
        return np.where(pd[:, None], _pd_action(name, obs), a)

    traj, sim = run_batched(scenario, states, np.arange(n), actions)
    terminated = np.array([tr["term"][-1] for tr in traj])
    truncated = np.array([tr["trunc"][-1] for tr in traj])
    returns = np.array([tr["rewards"].sum() for tr in traj])
    lengths = sim.t.copy()
    fail = scenario.is_failure(returns, lengths, terminated)
    assert fail.dtype == bool and np.array_equal(fail, terminated)
    assert np.array_equal(fail, lengths < scenario.max_steps)  # unhealthy before the limit
    assert np.array_equal(~fail, truncated)
    assert fail.any() and (~fail).any()
    assert "1000 steps" in scenario.failure_rule


@pytest.mark.slow
def test_simulator_reuse_partial_batches_and_backends():
    """A simulator reused for a second (smaller) batch, larger-than-needed batch sizes and the
    pure-Python loop backend all give the same episodes as a fresh exact-size batch."""
    for name in NAMES:
        scenario = get_scenario(name)
        n = 12
        states = scenario.sample(np.random.default_rng(9), n)
        seeds = np.arange(n) + 100
        act = np.random.default_rng(10).uniform(-0.3, 0.3, size=(1000, n, scenario.action.size))

        def episodes(sim, idx, states=states, seeds=seeds, act=act):  # bound now: the loop rebinds them
            obs0 = sim.reset_to(states[idx], seeds[idx])
            last = obs0.copy()
            t = 0
            while not sim.done.all():
                live = ~sim.done
                out = sim.step(act[t, idx])
                last[live] = out.obs[live]
                t += 1
            return sim.t.copy(), obs0, last

        idx = np.arange(n)
        ref_len, ref_obs0, ref_last = episodes(scenario.simulator(n), idx)
        sim = scenario.simulator(20)
        episodes(sim, idx)  # warm-start, time, wind state of this run must not leak into the next
        sub = np.arange(0, n, 2)
        sub_len, sub_obs0, sub_last = episodes(sim, sub)
        assert np.array_equal(sub_len, ref_len[sub]) and np.array_equal(sub_obs0, ref_obs0[sub])
        assert np.array_equal(sub_last, ref_last[sub])

        # exact per-step comparison of the two backends
        tb, _ = run_batched(scenario, states, seeds, lambda o, t, act=act: act[min(t.max(), 999)])
        tl, _ = run_batched(scenario, states, seeds, lambda o, t, act=act: act[min(t.max(), 999)], backend="loop")
        for i in range(n):
            assert np.array_equal(tb[i]["obs"], tl[i]["obs"]) and np.array_equal(tb[i]["rewards"], tl[i]["rewards"])


def test_bad_actions_and_backend():
    scenario = get_scenario("Hopper-v5")
    sim = scenario.simulator(4)
    sim.reset_to(scenario.sample(np.random.default_rng(0), 4))
    with pytest.raises(ScenarioError, match=r"actions must have shape \(4, 3\)"):
        sim.step(np.zeros((4, 6)))
    with pytest.raises(ScenarioError, match="unknown MuJoCo backend"):
        scenario.simulator(4, backend="gpu")


# ---------------------------------------------------------------------------------------------
# Hopper-Noise
# ---------------------------------------------------------------------------------------------


def _noise_episodes(scenario, states, seeds, batch_size=None):
    """Episodes under the PD controller (actions depend only on each episode's own obs)."""
    traj, sim = run_batched(scenario, states, seeds, lambda o, t: _pd_action("Hopper", o), batch_size=batch_size)
    return traj


@pytest.mark.slow
def test_hopper_noise_reproducible_and_seed_dependent():
    scenario = get_scenario("Hopper-Noise", max_steps=300)  # crosses the first wind chunk
    states = np.repeat(scenario.sample(np.random.default_rng(0), 1), 6, axis=0)
    seeds = np.array([1, 1, 2, 3, 1, 2])
    traj = _noise_episodes(scenario, states, seeds)
    again = _noise_episodes(scenario, states, seeds)
    for i in range(6):
        assert np.array_equal(traj[i]["obs"], again[i]["obs"])  # same seed, same run: identical
    for i, j in [(0, 1), (0, 4), (2, 5)]:  # same seed in the same batch: identical
        assert np.array_equal(traj[i]["obs"], traj[j]["obs"])
    for i, j in [(0, 2), (0, 3), (2, 3)]:  # different seeds: different wind, different episodes
        k = min(len(traj[i]["obs"]), len(traj[j]["obs"]))
        assert not np.array_equal(traj[i]["obs"][:k], traj[j]["obs"][:k])
    # Hopper-Noise with no wind is Hopper-v5
    calm = get_scenario("Hopper-Noise", wind_limit=0.0, max_steps=300)
    plain = _noise_episodes(get_scenario("Hopper-v5", max_steps=300), states[:2], seeds[:2])
    still = _noise_episodes(calm, states[:2], seeds[:2])
    assert np.array_equal(plain[0]["obs"], still[0]["obs"])
    # the wind does move the hopper
    assert not np.array_equal(plain[0]["obs"], traj[0]["obs"][: len(plain[0]["obs"])])


@pytest.mark.slow
def test_hopper_noise_independent_of_batch_composition():
    scenario = get_scenario("Hopper-Noise", max_steps=300)
    rng = np.random.default_rng(1)
    states = scenario.sample(rng, 8)
    seeds = np.array([5, 17, 99, 5, 123456789, 42, 7, 2**50])
    full = _noise_episodes(scenario, states, seeds)
    # the same episodes alone, in another order, and in a larger simulator with other company
    for i in (0, 2, 6):
        alone = _noise_episodes(scenario, states[i : i + 1], seeds[i : i + 1])
        assert np.array_equal(alone[0]["obs"], full[i]["obs"])
        assert np.array_equal(alone[0]["rewards"], full[i]["rewards"])
    perm = np.array([7, 3, 1, 6, 0, 5, 2, 4])
    other = np.concatenate([scenario.sample(rng, 5), states[perm]])
    other_seeds = np.concatenate([np.array([1, 2, 3, 4, 6]), seeds[perm]])
    shuffled = _noise_episodes(scenario, other, other_seeds, batch_size=32)
    for k, i in enumerate(perm):
        assert np.array_equal(shuffled[5 + k]["obs"], full[i]["obs"])


def test_wind_stream_and_model():
    # a pure function of (seed, chunk): standard normals, chunks and seeds independent
    a = wind_normals(12345, 0)
    assert a.shape == (WIND_CHUNK,) and np.array_equal(a, wind_normals(12345, 0))
    assert not np.array_equal(a, wind_normals(12345, 1)) and not np.array_equal(a, wind_normals(12346, 0))
    z = np.concatenate([wind_normals(s, c) for s in range(40) for c in range(4)])
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1.0) < 0.02
    assert np.array_equal(wind_normals(-1, 0), wind_normals(2**64 - 1, 0))  # seeds taken mod 2**64

    # the force process: mean/std as documented, AR(1) lag-1 correlation exp(-dt/tau)
    wind = HopperNoise(wind="ar1", wind_mean=2.0, wind_std=10.0, wind_tau=0.2).wind_model(0.008)
    streams = _WindStreams(wind, np.arange(300))
    idx = np.arange(300)
    f = np.stack([wind.force(streams.advance(idx, np.full(300, t))) for t in range(600)], axis=1)
    assert abs(f.mean() - 2.0) < 0.5 and abs(f.std() - 10.0) < 0.5
    assert abs(f[:, 0].std() - 10.0) < 1.5  # stationary from the first step
    lag1 = np.mean((f[:, :-1] - 2.0) * (f[:, 1:] - 2.0)) / 100.0
    assert abs(lag1 - np.exp(-0.008 / 0.2)) < 0.03
    white = HopperNoise(wind="ar1", wind_tau=0.0).wind_model(0.008)
    assert white.rho == 0.0 and white.innovation == 1.0

    # the default, 1R2R's walk: W_0 = u_0 · step · limit, |W_t - W_{t-1}| <= step · limit, |W_t| <= limit,
    # uniform draws from the episode's stream; it reaches its bounds within an episode
    walk = HopperNoise().wind_model(0.008)
    assert (walk.kind, walk.limit, walk.step, walk.mean) == ("walk", 2.5, 0.1, 0.0)
    u = wind_uniforms(7, 0)
    assert u.min() >= -1.0 and u.max() < 1.0 and abs(u.mean()) < 0.1 and np.array_equal(u, wind_uniforms(7, 0))
    streams = _WindStreams(walk, np.arange(300))
    f = np.stack([walk.force(streams.advance(idx, np.full(300, t))) for t in range(1000)], axis=1)
    np.testing.assert_allclose(f[:7, 0], np.array([wind_uniforms(s, 0)[0] for s in range(7)]) * 0.25)
    assert np.all(np.abs(np.diff(f, axis=1)) <= 0.25 + 1e-12) and np.all(np.abs(f) <= 2.5)
    assert np.mean(np.abs(f).max(axis=1) == 2.5) > 0.5  # most episodes reach the limit
    w = np.clip(np.cumsum(wind_uniforms(3, 0)[:20] * 0.25), -2.5, 2.5)  # unclipped start: a plain sum
    if np.all(np.abs(np.cumsum(wind_uniforms(3, 0)[:20] * 0.25)) < 2.5):
        np.testing.assert_allclose(f[3, :20], w)

    # the reference wrapper applies the force to every body's xfrc_applied (x component; 1R2R),
    # or to the torso's only with wind_body: torso
    for body, pushed in (("all", ["torso", "thigh", "leg", "foot"]), ("torso", ["torso"])):
        scenario = get_scenario("Hopper-Noise", wind_body=body)
        env = scenario.reference_env()
        scenario.reference_reset_to(env, scenario.sample(np.random.default_rng(0), 1)[0], seed=3)
        model, data = env.unwrapped.model, env.unwrapped.data
        for _ in range(5):
            env.step(np.zeros(3))
            ids = [model.body(b).id for b in pushed]
            assert np.all(data.xfrc_applied[ids, 0] == env.last_force) and env.last_force != 0.0
            assert np.all(np.delete(data.xfrc_applied[:, 0], ids) == 0.0)
            assert np.all(data.xfrc_applied[:, 1:] == 0.0)
    with pytest.raises(ScenarioError, match="wind_body: no body 'tail'"):
        get_scenario("Hopper-Noise", wind_body="tail").simulator(2)
    with pytest.raises(ScenarioError, match="wind must be one of walk, ar1"):
        get_scenario("Hopper-Noise", wind="gale").simulator(2)
    with pytest.raises(ScenarioError, match="wind_std must be a finite number >= 0"):
        get_scenario("Hopper-Noise", wind_std=-1.0).simulator(2)


@pytest.mark.slow
def test_simulator_type_and_threads():
    scenario = get_scenario("Walker2d-v5")
    sim = scenario.simulator(8, nthread=2)
    assert isinstance(sim, MujocoSim)
    states = scenario.sample(np.random.default_rng(0), 8)
    obs = sim.reset_to(states)
    assert obs.shape == (8, 17) and obs.dtype == np.float64
    np.testing.assert_array_equal(obs[:, :8], states[:, :8])
    one, _ = run_batched(scenario, states, np.zeros(8), lambda o, t: np.full((8, 6), 0.2))
    two, _ = run_batched(scenario, states, np.zeros(8), lambda o, t: np.full((8, 6), 0.2), nthread=2)
    for i in range(8):
        assert np.array_equal(one[i]["obs"], two[i]["obs"])
