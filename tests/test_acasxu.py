"""ACAS Xu as MDPFuzz defines it: the collision-course construction, validity, mutation, the
100-step episode and discounted return, the failure rates of random testing and of MDPFuzz's
mutants against the peers' measurements, and the DNN agent (numpy forward vs onnxruntime,
behaviour against a never-manoeuvring baseline, errors)."""

from __future__ import annotations

import numpy as np
import pytest

from envs import get_scenario
from envs.acasxu import MUTATION_STEP, NMAC_FT, AcasXuEnv, intruder_motion
from workers.acasxu_policy import (
    MEANS,
    RANGES,
    RHO_MAX,
    AcasXuDNN,
    AcasXuError,
    AlwaysCOC,
    network_path,
)


@pytest.fixture(scope="module")
def scenario():
    return get_scenario("ACASXu")


@pytest.fixture(scope="module")
def dnn():
    return AcasXuDNN()


def _run(scenario, agent, states):
    """Batched episodes driven by ``agent``; returns (returns, lengths, terminated, obs log)."""
    sim = scenario.simulator(len(states))
    obs = sim.reset_to(states)
    n = len(states)
    ret = np.zeros(n)
    term = np.zeros(n, dtype=bool)
    actions = []
    while not sim.done.all():
        live = ~sim.done
        a = np.zeros(n, dtype=np.int64)
        a[live] = agent.act(obs[live])
        actions.append(np.where(live, a, -1))
        out = sim.step(a)
        ret[live] += out.reward[live]
        term |= out.terminated
        obs = out.obs
    return ret, sim.t.copy(), term, np.array(actions).T


def _coc_collisions(scenario, n=4000, seed=11):
    """States of the reset distribution in which an ownship that never manoeuvres collides."""
    states = scenario.sample(np.random.default_rng(seed), n)
    _, _, term, _ = _run(scenario, AlwaysCOC(), states)
    return states[term]


@pytest.mark.slow
def test_numpy_forward_equals_onnxruntime(dnn):
    import onnxruntime as ort
    rng = np.random.default_rng(7)
    n = 40
    x = np.stack(
        [
            rng.uniform(0.0, 60760.0, n),
            rng.uniform(-np.pi, np.pi, n),
            rng.uniform(-np.pi, np.pi, n),
            rng.uniform(100.0, 1200.0, n),
            rng.uniform(0.0, 1200.0, n),
        ],
        axis=1,
    ).astype(np.float32)
    checked = agree = 0
    for tau in (0, 4, 8):
        for prev in range(5):
            ours = dnn.scores(x, np.full(n, prev), tau=tau)
            sess = ort.InferenceSession(str(network_path(dnn.directory, prev, tau)), providers=["CPUExecutionProvider"])
            ref = np.stack([sess.run(None, {"X": ((xi - MEANS) / RANGES).astype(np.float32)})[0] for xi in x])
            scale = np.abs(ref).max(axis=1, keepdims=True) + 1e-3
            assert np.all(np.abs(ours - ref) <= 1e-4 * scale), f"prev {prev} tau {tau}: max diff {np.abs(ours - ref).max()}"
            # the advisory agrees wherever the two best scores are not a float32 tie
            srt = np.sort(ref, axis=1)
            clear = srt[:, 1] - srt[:, 0] > 1e-3 * scale[:, 0]
            assert np.array_equal(ours.argmin(1)[clear], ref.argmin(1)[clear])
            checked += n
            agree += int(clear.sum())
    assert agree > 0.9 * checked


def test_agent_selects_network_by_previous_advisory(dnn):
    assert dnn.tau == 1 and dnn.coc_beyond is None  # MDPFuzz's set (<prev>_2 files), a network at every step
    rng = np.random.default_rng(3)
    obs = np.zeros((50, 6), dtype=np.float32)
    obs[:, 0] = rng.uniform(1000, 20000, 50)
    obs[:, 1] = rng.uniform(-np.pi, np.pi, 50)
    obs[:, 2] = rng.uniform(-np.pi, np.pi, 50)
    obs[:, 3] = rng.uniform(10, 1100, 50)
    obs[:, 4] = rng.uniform(10, 1100, 50)
    obs[:, 5] = rng.integers(0, 5, 50)
    acts = dnn.act(obs)
    for i in range(50):  # row by row equals the batch (the batch groups rows by network)
        p = int(obs[i, 5])
        assert acts[i] == np.argmin(dnn.scores(obs[i : i + 1, :5], np.array([p]))[0])
    # the previous advisory matters: not all 5 networks give the same advisories
    per_net = [dnn.act(np.concatenate([obs[:, :5], np.full((50, 1), p, np.float32)], 1)) for p in range(5)]
    assert any(not np.array_equal(per_net[0], q) for q in per_net[1:])
    # with coc_beyond, beyond that separation the agent says clear-of-conflict without a network
    far = obs.copy()
    far[:, 0] = 70000.0
    assert np.all(AcasXuDNN(coc_beyond=RHO_MAX).act(far) == 0)


@pytest.mark.slow
def test_sampled_encounters_are_collision_courses(scenario):
    """The peers' construction: the heading lies between "at the ownship's start" and parallel
    to the ownship, and the derived intruder speed makes both aircraft, flying straight, reach
    the crossing point of their paths at the same time."""
    a = scenario.sample(np.random.default_rng(0), 2000)
    np.testing.assert_array_equal(a, scenario.sample(np.random.default_rng(0), 2000))
    own, x, y, h = a.T
    rho = np.hypot(x, y)
    assert rho.min() >= 1000.0 - 1e-6 and rho.max() <= 60261.0 + 1e-6
    assert own.min() >= 10 and own.max() <= 1100 and own.std() > 250  # U(10, 1100), not fixed
    at_own = np.arctan2(-y, -x)  # direction from the intruder to the ownship's start
    # the heading is within the arc from at_own to pi/2 (the shorter way, at most pi)
    span = _signed(np.pi / 2 - at_own)  # signed angle from at_own to pi/2
    off = _signed(h - at_own)
    assert np.all(off * span >= -1e-9) and np.all(np.abs(off) <= np.abs(span) + 1e-9)
    v, hf = intruder_motion(a)
    assert np.all((v >= 0) & (v <= 1200))
    t_int = -x / (v * np.cos(hf))  # when the intruder crosses the ownship's path (x = 0)
    t_own = (y + v * np.sin(hf) * t_int) / own  # when the ownship gets to that point
    assert np.all(t_int > 0)
    np.testing.assert_allclose(t_own, t_int, rtol=1e-9)
    assert scenario.valid(a).all()


@pytest.mark.slow
def test_dnn_avoids_collisions_that_coc_does_not(scenario, dnn):
    states = _coc_collisions(scenario)
    # a never-manoeuvring ownship collides in ~3.5% of the encounters (the construction)
    assert len(states) >= 100
    _, _, dnn_term, dnn_actions = _run(scenario, dnn, states)
    # the DNN turns away from most of them (measured: 22 of 152 still collide) -- require a 4x reduction
    assert dnn_term.sum() <= len(states) // 4
    assert (dnn_actions != 0).any(axis=1).mean() > 0.5  # it manoeuvres


def _signed(a):
    """Angle to [-pi, pi)."""
    return (a + np.pi) % (2 * np.pi) - np.pi


def _peers_return(rhos):
    r = 0.0
    for rho in rhos:
        r = r * 0.99 + rho / 60261.0
        if rho < 200.0:
            r -= 100.0
    return r


def test_failure_oracle_return_and_episode_length(scenario):
    # ownship 500 ft/s; the intruder 6000 ft to the west and 4000 ft ahead flies east: their paths
    # cross at (0, 4000) after 8 s, so the derived intruder speed is 6000 / 8 = 750 ft/s
    states = np.array([[500.0, -6000.0, 4000.0, 0.0],
                       # the same geometry 20000 ft ahead: they would meet after 40 s, beyond 10 s
                       [500.0, -3000.0, 20000.0, 0.0]])
    v, _ = intruder_motion(states)
    np.testing.assert_allclose(v, [750.0, 75.0])
    ret, lengths, term, _ = _run(scenario, AlwaysCOC(), states)
    assert term.tolist() == [True, False]
    assert lengths.tolist() == [100, 100]  # every episode runs all 100 steps
    assert scenario.is_failure(ret, lengths, term).tolist() == [True, False]
    env = AcasXuEnv()
    for i, s in enumerate(states):
        scenario.reference_reset_to(env, s)
        total, steps, rhos, done = 0.0, 0, [], False
        while not done:
            _, r, te, tr, info = env.step(0)
            total += r
            steps += 1
            rhos.append(info["rho"])
            done = te or tr
        assert (te, steps) == (bool(term[i]), 100)
        assert total == pytest.approx(ret[i], rel=1e-12)
        # the return is the peers' 0.99-discounted reward, -100 at every step below 200 ft
        assert total == pytest.approx(_peers_return(rhos), rel=1e-12)
        below = int((np.array(rhos) < NMAC_FT).sum())
        # they meet at t = 8 s and close at 901 ft/s: the samples at 7.8 .. 8.2 s are within 200 ft
        assert below == (5 if i == 0 else 0)
    assert ret[0] < -200 and ret[1] > 0
    # the oracle reads only the terminated flags (terminated <=> a collision at some step)
    assert scenario.is_failure(np.array([50.0, -60.0]), np.array([100, 100]), np.array([False, True])).tolist() == [False, True]


@pytest.mark.slow
def test_batched_equals_reference_in_collision_episodes(scenario, dnn):
    """The conformance test rarely meets a collision; here most episodes have one."""
    states = _coc_collisions(scenario, n=1500, seed=5)[:30]
    m = len(states)
    assert m >= 20
    agents = [AlwaysCOC() if i % 2 else dnn for i in range(m)]
    sim = scenario.simulator(m)
    obs = sim.reset_to(states)
    log = [[obs[i].copy()] for i in range(m)]
    rewards = [[] for _ in range(m)]
    acts = [[] for _ in range(m)]
    term = np.zeros(m, dtype=bool)
    while not sim.done.all():
        live = np.flatnonzero(~sim.done)
        a = np.zeros(m, dtype=np.int64)
        for i in live:
            a[i] = agents[i].act(obs[i : i + 1])[0]
            acts[i].append(int(a[i]))
        out = sim.step(a)
        term |= out.terminated
        for i in live:
            log[i].append(out.obs[i].copy())
            rewards[i].append(out.reward[i])
        obs = out.obs
    assert term.sum() >= m // 2  # the always-COC half collides
    env = scenario.reference_env()
    for i in range(m):
        ref = [scenario.reference_reset_to(env, states[i], seed=i)]
        ref_r = []
        for a in acts[i]:
            o, r, te, tr, _ = env.step(a)
            ref.append(o)
            ref_r.append(r)
        assert te == term[i]
        np.testing.assert_array_equal(np.array(log[i]), np.array(ref))
        np.testing.assert_array_equal(np.array(rewards[i]), np.array(ref_r))


@pytest.fixture(scope="module")
def random_campaign(scenario, dnn):
    """20000 random valid encounters (seed 2021): the states and which ones the DNN / an
    always-COC ownship collide in."""
    states = scenario.sample(np.random.default_rng(2021), 20000)
    _, _, dnn_fail, _ = _run(scenario, dnn, states)
    _, _, coc_fail, _ = _run(scenario, AlwaysCOC(), states)
    return states, dnn_fail, coc_fail


@pytest.mark.slow
def test_random_failure_rates_match_mdpfuzz(random_campaign):
    """The peers' executor over 20000 encounters: the DNN fails 0.48% (Wilson 95% [0.40, 0.59]),
    always-COC 3.4%. Binomial sd at n = 20000: 0.05 and 0.13 points; the bands below are about
    +-3 sd around the targets and exclude the previous scenario (0.045% and 0.24%). Measured
    (seed 2021): see docs/scenarios.md."""
    _, dnn_fail, coc_fail = random_campaign
    assert 0.0035 <= dnn_fail.mean() <= 0.0065, dnn_fail.mean()
    assert 0.028 <= coc_fail.mean() <= 0.042, coc_fail.mean()


@pytest.mark.slow
def test_mdpfuzz_mutants_of_failing_seeds_fail_again(scenario, dnn, random_campaign):
    """MDPFuzz's local mutation keeps mutants on collision courses next to their parent: mutants of
    a failing seed fail again far more often (peers: 62%) than fresh random draws (0.48%)."""
    states, dnn_fail, _ = random_campaign
    seeds = states[dnn_fail][:25]
    assert len(seeds) == 25
    parents = np.repeat(seeds, 20, axis=0)
    mutants = scenario.mutate(parents, np.random.default_rng(7))
    step = np.abs(mutants - parents)
    step[:, 3] = np.minimum(step[:, 3], 2 * np.pi - step[:, 3])  # the heading wraps
    assert np.all(step <= MUTATION_STEP + 1e-9) and (step > 0).mean() > 0.95
    assert scenario.valid(mutants).all()
    _, _, fail, _ = _run(scenario, dnn, mutants)
    assert fail.mean() >= 0.3, fail.mean()  # measured: see docs/scenarios.md
    assert fail.mean() >= 20 * dnn_fail.mean()


def test_sample_rejects_invalid_encounters(scenario):
    a = scenario.sample(np.random.default_rng(0), 300)
    assert scenario.escapable(a).all() and scenario.speed_ok(a).all()
    # an intruder that would need 5000 ft/s to meet the ownship is invalid
    assert not scenario.speed_ok(np.array([[1000.0, -5000.0, 1000.0, 0.0]]))[0]
    # ownship 500 ft/s, the paths crossing 2000 ft ahead after 4 s: no constant turn escapes
    assert not scenario.escapable(np.array([[500.0, -3000.0, 2000.0, 0.0]]))[0]


def test_policy_uris_load_the_agent(scenario):
    from workers.policies import load_policy

    for uri in ("python:workers.acasxu_policy:AcasXuDNN", "python:workers/acasxu_policy.py:AcasXuDNN"):
        pol = load_policy(uri, scenario, device="cpu")
        states = scenario.sample(np.random.default_rng(1), 4)
        obs = scenario.simulator(4).reset_to(states)
        a = pol.act(obs)
        assert a.dtype == np.int64 and a.shape == (4,) and np.all((a >= 0) & (a <= 4))


def test_missing_networks_give_a_clear_error(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("DELTARL_ACASXU_DIR", str(missing))
    with pytest.raises(AcasXuError, match=r"nowhere is not a directory\. Set DELTARL_ACASXU_DIR .*default: "):
        AcasXuDNN()
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "ACASXU_run2a_1_1_batch_2000.onnx").write_bytes(b"")
    with pytest.raises(AcasXuError, match=r"missing in .*partial: 44 of 45 files, e\.g\. ACASXU_run2a_1_2_batch_2000\.onnx"):
        AcasXuDNN(tmp_path / "partial")


@pytest.mark.slow
def test_zoo_entry_matches_the_numpy_agent(scenario, dnn, tmp_path):
    import json
    from pathlib import Path

    from workers.acasxu_policy import export_torchscript
    from workers.policies import load_policy

    card = json.loads((Path(__file__).resolve().parents[1] / "experiments/zoo/ACASXu-dnn/card.json").read_text())
    assert card["scenario"] == "ACASXu" and card["uri"].startswith("python:")
    rng = np.random.default_rng(2)
    n = 3000
    obs = np.stack(
        [rng.uniform(0, 70000, n), rng.uniform(-np.pi, np.pi, n), rng.uniform(-np.pi, np.pi, n),
         np.full(n, 800.0), rng.uniform(10, 1100, n), rng.integers(0, 5, n)], axis=1
    ).astype(np.float32)
    want = dnn.act(obs)
    shipped = load_policy("zoo:ACASXu", scenario, device="cpu")
    fresh = load_policy(str(export_torchscript(tmp_path / "p.pt")), scenario, device="cpu")
    assert (load_policy(card["uri"], scenario, device="cpu").act(obs) == want).all()
    # torch and numpy sum in different orders: allow the odd float32 tie to break differently
    assert (shipped.act(obs) == want).mean() > 0.999
    assert (fresh.act(obs) == shipped.act(obs)).all()


def test_invalid_encounters_are_refused_and_never_proposed():
    """Valid = the peers' verify (derived speed in [0, 1200], escapable by a constant strong
    turn): validate refuses the others with a message; mutation, uniform sampling and projection
    only produce valid encounters; require_valid=False lifts the check."""
    from envs import InvalidStateError

    sc = get_scenario("ACASXu")
    doomed = np.array([[500.0, -3000.0, 2000.0, 0.0]])
    with pytest.raises(InvalidStateError, match="cannot be escaped.*require_valid"):
        sc.validate(doomed)
    too_fast = np.array([[1000.0, -5000.0, 1000.0, 0.0]])
    with pytest.raises(InvalidStateError, match=r"would need 5000 ft/s .*valid: 0\.\.1200"):
        sc.validate(too_fast)
    rng = np.random.default_rng(0)
    near = np.tile(np.array([[500.0, -6000.0, 4000.0, 0.0]]), (64, 1))  # escapable, but not by much
    assert sc.valid(near).all()
    assert sc.valid(sc.mutate(near, rng, scale=20.0)).all()
    assert sc.valid(sc.sample_uniform(rng, 64)).all()
    projected = sc.project(np.vstack([doomed, too_fast, near[:3], [[5000.0, 1e6, -1e6, 9.0]]]))
    assert sc.valid(projected).all()
    np.testing.assert_array_equal(projected[2:5], near[:3])  # valid states stay where they are
    free = get_scenario("ACASXu", require_valid=False)
    free.validate(doomed)
    free.validate(too_fast)
