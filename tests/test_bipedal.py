"""The BipedalWalker scenario: the obstacle sequence decides the terrain, (state, seed) decides
the episode, mutation stays on the kinds, the oracle is gymnasium's fall."""

from __future__ import annotations

import numpy as np
import pytest

from envs import InvalidStateError, ScenarioError, get_scenario
from envs.bipedal import PIT, STAIRS, STUMP, _env_class

TS = 14 / 30.0  # gymnasium's TERRAIN_STEP


@pytest.fixture(scope="module")
def scenario():
    return get_scenario("BipedalWalker")


def _rollout_env(env, scenario, state, seed, steps=150, action_seed=7):
    """Observations, rewards and terminated flags of one episode in a raw env."""
    rng = np.random.default_rng(action_seed)
    o, _ = env.reset(seed=seed, options={"obstacles": state})
    obs, rew, term = [o], [], []
    for _ in range(steps):
        o, r, te, _, _ = env.step(rng.uniform(-1, 1, 4))
        obs.append(o)
        rew.append(float(r))
        term.append(bool(te))
        if te:
            break
    return np.asarray(obs), np.asarray(rew), term


def _kinds_from_geometry(env):
    """The obstacle kinds read back from the Box2D bodies, in x order (independent of the
    env's own bookkeeping): pit = two 1x4-tile walls, stairs = 3-4 adjacent 4x1-tile steps,
    stump = one square of 1 or 2 tiles."""
    boxes = []
    for body in env.terrain:
        for fx in body.fixtures:
            if fx.shape.type != 2:  # b2Shape.e_polygon; the grass is edge shapes
                continue
            vs = np.asarray(fx.shape.vertices)
            x0, x1 = vs[:, 0].min(), vs[:, 0].max()
            w, h = (x1 - x0) / TS, (vs[:, 1].max() - vs[:, 1].min()) / TS
            if abs(w - 1) < 1e-3 and abs(h - 4) < 1e-3:
                kind = PIT
            elif abs(w - 4) < 1e-3 and abs(h - 1) < 1e-3:
                kind = STAIRS
            elif abs(w - h) < 1e-3 and round(w) in (1, 2) and abs(w - round(w)) < 1e-3:
                kind = STUMP
            else:
                raise AssertionError(f"unexpected terrain polygon {w:.3f} x {h:.3f} tiles")
            boxes.append((x0, x1, kind))
    boxes.sort()
    groups = []  # [kind, n_polygons, end_x]
    for x0, x1, kind in boxes:
        if groups and x0 - groups[-1][2] < 4.5 * TS:  # parts of one obstacle (>= 5 grass tiles apart)
            assert groups[-1][0] == kind, "two kinds inside one obstacle"
            groups[-1][1] += 1
            groups[-1][2] = x1
        else:
            groups.append([kind, 1, x1])
    for kind, n, _ in groups:
        assert {PIT: n == 2, STAIRS: n in (3, 4), STUMP: n == 1}[kind], (kind, n)
    return [g[0] for g in groups]


@pytest.mark.slow
def test_same_state_and_seed_give_the_same_episode(scenario):
    state = np.array([3, 1, 2, 2, 3, 1, 1, 3, 2, 1, 2, 3, 3, 1, 2], dtype=float)
    cls = _env_class()
    a = _rollout_env(cls(), scenario, state, seed=11)
    env = cls()
    # unrelated episodes first: gymnasium's env keeps one Box2D world across resets, whose
    # leftover broad-phase state changed this episode after 8 of them (before the fix)
    for p in range(10):
        _rollout_env(env, scenario, np.full(15, 1.0 + p % 3), seed=p, steps=300, action_seed=p)
    b = _rollout_env(env, scenario, state, seed=11)
    assert len(a[1]) == len(b[1]) > 20
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2]
    # another seed: other sizes and push, another trajectory
    c = _rollout_env(cls(), scenario, state, seed=12)
    assert len(c[0]) != len(a[0]) or not np.array_equal(c[0], a[0])


def test_batched_episode_does_not_depend_on_its_batch(scenario):
    rng = np.random.default_rng(5)
    states = scenario.sample(rng, 6)
    seeds = np.arange(6) + 40

    def run(idx):
        sim = scenario.simulator(len(idx))
        obs = [sim.reset_to(states[idx], seeds[idx])]
        arng = np.random.default_rng(0)
        acts = arng.uniform(-1, 1, size=(120, 6, 4)).astype(np.float32)
        for t in range(120):
            obs.append(sim.step(acts[t][idx]).obs.copy())
        return np.stack(obs), sim.t.copy()

    full, t_full = run(np.arange(6))
    alone, t_alone = run(np.array([4]))
    n = t_alone[0]
    np.testing.assert_array_equal(full[: n + 1, 4], alone[: n + 1, 0])
    assert t_full[4] == n


def test_obstacle_kinds_appear_in_order_and_cycle(scenario):
    env = _env_class()()
    rng = np.random.default_rng(0)
    for seed in range(6):
        state = scenario.sample(rng, 1)[0]
        env.reset(seed=seed, options={"obstacles": state})
        kinds = _kinds_from_geometry(env)
        assert len(kinds) >= 8
        assert kinds == [int(state[k % 15]) for k in range(len(kinds))]
        assert [o["kind"] for o in env.obstacles] == kinds
    # short obstacles: more than 15 on the course, the sequence starts over
    state = np.array([PIT] + [STUMP] * 14, dtype=float)
    env.reset(seed=1, options={"obstacles": state})
    kinds = _kinds_from_geometry(env)
    assert len(kinds) > 15
    assert kinds[0] == kinds[15] == PIT and kinds.count(PIT) == len(kinds[::15])


def test_different_sequences_build_different_terrain(scenario):
    env = _env_class()()
    env.reset(seed=4, options={"obstacles": np.full(15, PIT)})
    y_pit = np.asarray(env.terrain_y)
    pits = [o for o in env.obstacles if o["kind"] == PIT]
    assert len(pits) >= 8 and len(pits) == len(env.obstacles)
    for o in pits:  # the ground inside the pit lies 4 tiles below the rim
        i = o["tile"]
        assert np.isclose(y_pit[i + 1], y_pit[i] - 4 * TS)
    env.reset(seed=4, options={"obstacles": np.full(15, STUMP)})
    y_stump = np.asarray(env.terrain_y)
    assert not np.allclose(y_pit, y_stump)
    assert np.abs(np.diff(y_stump)).max() < TS  # stumps are boxes on the ground: no drop
    assert np.abs(np.diff(y_pit)).max() > 3 * TS


def test_kinds_do_not_shift_the_random_stream(scenario):
    """Same seed, sequences differing at position 5 only: obstacles 0..4 identical (place and
    size), the same initial push (first observation), and reset without options draws the
    sequence from the same stream."""
    env = _env_class()()
    a = np.array([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], dtype=float)
    b = a.copy()
    b[5] = 1
    oa, _ = env.reset(seed=9, options={"obstacles": a})
    obs_a = list(env.obstacles)
    ob, _ = env.reset(seed=9, options={"obstacles": b})
    obs_b = list(env.obstacles)
    assert obs_a[:5] == obs_b[:5] and obs_a[5] != obs_b[5]
    np.testing.assert_array_equal(oa, ob)
    o_free, _ = env.reset(seed=9)
    drawn = env.obstacle_sequence.copy()
    o_given, _ = env.reset(seed=9, options={"obstacles": drawn})
    np.testing.assert_array_equal(o_free, o_given)
    assert set(np.unique(drawn)) <= {1, 2, 3}


def test_mutation_stays_on_the_kinds(scenario):
    """The peers' operator: Bernoulli(0.1) per position, then one step along 1 -> 2 -> 3 -> 1."""
    rng = np.random.default_rng(3)
    u = scenario.sample(rng, 2000)
    m = scenario.mutate(u, rng)
    assert set(np.unique(m)) <= {1.0, 2.0, 3.0}
    changed = m != u
    assert 0.09 < changed.mean() < 0.11  # Bernoulli(0.1) per position by default
    # a changed position always moves one step along the cycle: 1 -> 2, 2 -> 3, 3 -> 1
    assert np.all(((m - u) % 3)[changed] == 1)
    for a, b in ((1, 2), (2, 3), (3, 1)):
        assert np.all(m[changed & (u == a)] == b)
    assert 0.18 < (~changed).all(axis=1).mean() < 0.24  # no guard: 0.9^15 = 21% null mutants
    assert np.array_equal(scenario.mutate(u, rng, scale=0.0), u)
    assert np.all(scenario.mutate(u, rng, scale=1.0) != u)


def test_mutation_variants():
    rng = np.random.default_rng(4)
    either = get_scenario("BipedalWalker", mutation_operator="either")
    u = either.sample(rng, 2000)
    m = either.mutate(u, rng)
    shift = ((m - u) % 3)[m != u]
    assert 0.45 < (shift == 1).mean() < 0.55  # both other kinds, about equally often
    guarded = get_scenario("BipedalWalker", mutation_nonnull=True)
    g = guarded.mutate(u, rng)
    assert (g != u).any(axis=1).all()  # the replication's guard: no mutant equals its parent
    with pytest.raises(ScenarioError, match="mutation_operator must be 'cycle' or 'either'"):
        get_scenario("BipedalWalker", mutation_operator="swap").mutate(u[:2], rng)


def test_validate_rejects_non_integers(scenario):
    good = scenario.sample(np.random.default_rng(0), 2)
    assert np.array_equal(scenario.validate(good), good)
    bad = good.copy()
    bad[1, 3] = 2.5
    with pytest.raises(InvalidStateError, match=r"#1 has 'obstacle_4' = 2.5, not an integer.*1 stump, 2 stairs, 3 pit"):
        scenario.validate(bad)
    with pytest.raises(InvalidStateError, match="outside the valid initial-state region"):
        scenario.validate(np.zeros((1, 15)))
    with pytest.raises(InvalidStateError):
        scenario.simulator(2).reset_to(bad)


@pytest.mark.slow
def test_fall_is_the_failure(scenario):
    """Terminated episodes end with gymnasium's fall penalty, and only they are failures."""
    sc = get_scenario("BipedalWalker", max_steps=200)
    states = sc.sample(np.random.default_rng(1), 12)
    sim = sc.simulator(12)
    sim.reset_to(states, np.arange(12))
    rng = np.random.default_rng(2)
    last = np.zeros(12)
    ret = np.zeros(12)
    term = np.zeros(12, dtype=bool)
    scale = np.where(np.arange(12) % 2, 1.0, 0.05)[:, None]  # half random, half nearly still
    while not sim.done.all():
        live = ~sim.done
        out = sim.step(rng.uniform(-1, 1, size=(12, 4)) * scale)
        last[live] = out.reward[live]
        ret[live] += out.reward[live]
        term |= out.terminated
    fail = sc.is_failure(ret, sim.t, term)
    assert fail.any() and np.all(last[fail] == -100)
    assert np.all(sim.t[~fail] == 200)


def test_reaching_the_end_does_not_terminate(scenario):
    env = _env_class()()
    env.reset(seed=0, options={"obstacles": np.full(15, STUMP)})
    end_x = (200 - 10) * TS
    for body in [env.hull] + env.legs:  # lift the whole walker past the end of the course
        body.position = (body.position[0] + end_x + 1.0, body.position[1] + 5.0)
    _, r, terminated, _, _ = env.step(np.zeros(4))
    assert env.hull.position[0] > end_x and not env.game_over
    assert not terminated and r != -100  # gymnasium would have terminated here


def test_terrain_seed_makes_the_state_decide(scenario):
    sc = get_scenario("BipedalWalker", terrain_seed=0)
    assert sc.stochastic is False and scenario.stochastic is True
    state = sc.sample(np.random.default_rng(0), 1).repeat(2, axis=0)
    sim = sc.simulator(2)
    o = sim.reset_to(state, np.array([5, 6]))
    np.testing.assert_array_equal(o[0], o[1])
    free = scenario.simulator(2).reset_to(state, np.array([5, 6]))
    assert not np.array_equal(free[0], free[1])  # the push follows the episode seed
