"""CureFuzz and its RND curiosity module: known cases, the selection and acceptance rules,
valid proposals, determinism, snapshots, and a short in-process CartPole campaign."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import torch

from envs import get_scenario
from orchestrator.fuzzers import FuzzerError, make_fuzzer
from orchestrator.fuzzers.base import Feedback, Proposal
from orchestrator.fuzzers.curefuzz import CureFuzz
from orchestrator.fuzzers.rnd import RND, evenly_spaced


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks: one thread (several threads on a busy machine only add waiting)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def cartpole():
    return get_scenario("CartPole-v1")


def fake_feedback(scenario, states, T=12):
    """A deterministic stand-in for a rollout: observations drift away from the initial state
    (obs = state for CartPole), return falls with the distance from the centre, episodes
    starting far out fail."""
    states = np.asarray(states, dtype=np.float64)
    k = states.shape[0]
    growth = 1.15 ** np.arange(T + 1)
    traj = [(s[None, :] * growth[:, None]).astype(np.float32) for s in states]
    r = np.linalg.norm(states, axis=1) / np.linalg.norm(scenario.high)
    returns = 500.0 * (1.0 - r)
    failure = r > 0.9
    return Feedback(returns=returns, lengths=np.full(k, T), terminated=failure.copy(), failure=failure,
                    traj_obs=traj)


def same_proposal(p, q) -> bool:
    def eq(a, b):
        return np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return eq(p.states, q.states) and p.tags.keys() == q.tags.keys() and all(eq(p.tags[k], q.tags[k]) for k in p.tags)


def run(fz, scenario, gens, n, fuzz_from):
    """Drive fz for `gens` generations of `n` on fake feedback; returns the proposals."""
    out = []
    for g in range(gens):
        if g == fuzz_from:
            fz.start_phase("fuzzing")
        p = fz.propose(n)
        fz.observe(p, fake_feedback(scenario, p.states))
        out.append(p)
    return out


# --------------------------------------------------------------------------------------------
# RND
# --------------------------------------------------------------------------------------------
def _clusters():
    rng = np.random.default_rng(0)
    near = rng.normal([1.0, -2.0, 0.5], [0.1, 0.2, 0.05], size=(2000, 3))
    far = near.mean(0) + np.array([4.0, -4.0, 4.0]) * near.std(0) + rng.normal(0, 0.05, (200, 3)) * near.std(0)
    return near, far


def test_rnd_novelty_drops_where_trained_and_stays_high_far_away():
    near, far = _clusters()
    rnd = RND(3, seed=1, lr=3e-3)
    rnd.update_normalizer(near)
    near0 = rnd.novelty(near).mean()
    rnd.train(near, steps=150)
    near1, far1 = rnd.novelty(near).mean(), rnd.novelty(far).mean()
    assert near1 < near0 / 5  # learnt the visited region
    assert far1 > 5 * near1  # the unexplored one stays novel
    assert rnd.novelty(near).shape == (2000,) and np.all(rnd.novelty(near) >= 0)


def test_rnd_target_is_fixed_and_predictor_learns():
    near, _ = _clusters()
    rnd = RND(3, hidden=(32, 16), seed=2)
    rnd.update_normalizer(near)
    target0 = [t.clone() for t in rnd.target]
    pred0 = [p.clone() for p in rnd.predictor]
    rnd.train(near, steps=20)
    assert all(torch.equal(a, b) for a, b in zip(target0, rnd.target))
    assert not all(torch.equal(a, b) for a, b in zip(pred0, rnd.predictor))
    assert rnd.train_steps == 20 and np.isfinite(rnd.last_loss)


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [(16,), (16, 8)])
def test_rnd_hand_written_adam_matches_torch(hidden):
    """The hand-written gradient + Adam step equals autograd + torch.optim.Adam."""
    x = np.random.default_rng(1).normal(size=(100, 5))
    rnd = RND(5, hidden=hidden, out_dim=7, lr=1e-2, l2=1e-3, batch_size=1000, seed=3)
    rnd.update_normalizer(x)
    params = [torch.nn.Parameter(p.clone()) for p in rnd.predictor]
    opt = torch.optim.Adam(params, lr=1e-2)
    z = torch.from_numpy(rnd.normalize(x))
    y = RND._mlp(rnd.target, z)
    for _ in range(4):
        loss = torch.nn.functional.mse_loss(RND._mlp(params, z), y) + 1e-3 * sum((p * p).sum() for p in params)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mine = rnd.train(x, steps=1)
        assert mine == pytest.approx(float(loss.detach()), rel=1e-5)
    for p, q in zip(params, rnd.predictor):
        assert torch.allclose(p.detach(), q, atol=1e-6)


def test_rnd_deterministic_and_snapshot_continues_exactly():
    near, far = _clusters()

    def fresh(seed):
        r = RND(3, seed=seed, batch_size=64)
        r.update_normalizer(near)
        r.train(near, steps=5)
        return r

    a, b = fresh(7), fresh(7)
    assert np.array_equal(a.novelty(far), b.novelty(far))
    assert not np.array_equal(a.novelty(far), fresh(8).novelty(far))
    snap = pickle.loads(pickle.dumps(a.state_dict()))
    a.train(near, steps=5)
    a.update_normalizer(far)
    c = RND(3, seed=123, batch_size=64)  # other seed: everything comes from the snapshot
    c.load_state_dict(snap)
    c.train(near, steps=5)
    c.update_normalizer(far)
    assert np.array_equal(a.novelty(near), c.novelty(near))
    with pytest.raises(ValueError):
        RND(4).load_state_dict(snap)


def test_rnd_trajectory_novelty_is_mean_over_states():
    near, far = _clusters()
    rnd = RND(3, seed=0)
    rnd.update_normalizer(near)
    trajs = [near[:10], far[:3], near[10:11]]
    got = rnd.trajectory_novelty(trajs)
    want = [rnd.novelty(t).mean() for t in trajs]
    assert np.allclose(got, want, rtol=1e-5)  # float32 forward passes over different batches
    assert rnd.trajectory_novelty([]).shape == (0,)
    thin = evenly_spaced([np.arange(100)[:, None], np.arange(5)[:, None]], 10)
    assert len(thin[0]) == 10 and thin[0][0, 0] == 0 and thin[0][-1, 0] == 99 and len(thin[1]) == 5
    # normalisation: running mean/std of everything seen
    assert np.allclose(rnd.mean, near.mean(0)) and np.allclose(rnd.std, near.std(0))


# --------------------------------------------------------------------------------------------
# CureFuzz: construction, selection, acceptance
# --------------------------------------------------------------------------------------------
def test_parameters(cartpole):
    with pytest.raises(TypeError):
        CureFuzz(cartpole, seed=0, no_such_param=1)
    with pytest.raises(FuzzerError):
        make_fuzzer("curefuzz", cartpole, seed=0, bogus=True)
    for bad in ({"seed_energy": 0}, {"w_return": -1}, {"threshold_mode": "x"}, {"reference_rate": 0},
                {"mutation_scale": -0.1}):
        with pytest.raises(ValueError):
            CureFuzz(cartpole, **bad)
    fz = make_fuzzer("curefuzz", cartpole, seed=0, mutation_scale=0.1, rnd_hidden=[32, 32])
    assert fz.name == "curefuzz" and fz.rnd.hidden == (32, 32) and not fz.entropy_on


def _corpus_of(fz, returns, novelty_rel, energy=1000):
    k = len(returns)
    fz.corpus.add(np.zeros((k, fz.scenario.state_dim)), **{
        "return": np.asarray(returns, float), "novelty": np.asarray(novelty_rel, float),
        "novelty_rel": np.asarray(novelty_rel, float), "entropy": np.nan, "count": float(energy),
        "parent": -1.0, "generation": 0.0})


def test_selection_favours_low_return_and_high_novelty(cartpole):
    fz = CureFuzz(cartpole, seed=0)
    #            high R / dull, low R / dull, high R / novel, low R / novel
    _corpus_of(fz, [500, 20, 500, 20], [1.0, 1.0, 3.0, 3.0])
    w = fz.selection_weights()
    assert w[3] > w[1] > w[0] and w[3] > w[2] > w[0]
    assert np.array_equal(fz.corpus.energy, w)
    fz.start_phase("fuzzing")
    picks = np.concatenate([fz.propose(64).tags["parent"] for _ in range(20)])
    freq = np.bincount(picks, minlength=4) / picks.size
    assert freq[3] > freq[1] > freq[0] and freq[2] > freq[0]
    # weights are objectives: w_novelty = 0 leaves only the return
    fz2 = CureFuzz(cartpole, seed=0, w_novelty=0.0)
    _corpus_of(fz2, [500, 20, 500, 20], [1.0, 1.0, 3.0, 3.0])
    w2 = fz2.selection_weights()
    assert w2[0] == w2[2] and w2[1] == w2[3] > w2[0]


def test_energy_budget_and_dry_corpus(cartpole):
    fz = CureFuzz(cartpole, seed=0, seed_energy=2)
    _corpus_of(fz, [100, 200, 300], [1, 1, 1], energy=2)
    fz.start_phase("fuzzing")
    p = fz.propose(10)
    parents = p.tags["parent"]
    kinds = p.tags["kind"]
    assert np.all(np.bincount(parents[parents >= 0]) <= 2)
    assert (kinds == "mutant").sum() == 6 and (kinds == "sample").sum() == 4  # 3 seeds x 2 draws
    assert len(fz.corpus) == 0 and fz.counters["exhausted"] == 3
    pr = dict(zip(parents[:6].tolist(), p.tags["parent_return"][:6].tolist()))
    assert pr == {0: 100.0, 1: 200.0, 2: 300.0}


def _trained_fuzzer(cartpole, **kw):
    """A fuzzer in its fuzzing phase whose RND has learnt states near 0.01 and whose corpus
    holds one seed (return 400)."""
    fz = CureFuzz(cartpole, seed=0, **kw)
    base = np.full((8, 4), 0.01)
    rng = np.random.default_rng(0)
    familiar = [(base[0] + rng.normal(0, 0.01, (30, 4))).astype(np.float32) for _ in range(8)]
    fb = Feedback(returns=np.full(8, 400.0), lengths=np.full(8, 29), terminated=np.zeros(8, bool),
                  failure=np.zeros(8, bool), traj_obs=familiar)
    fz.observe(fz.propose(8), fb)  # the seeds
    fz.rnd.train(np.concatenate(familiar), steps=300)
    fz.ref_novelty = float("nan")  # forget the reference measured by the untrained predictor
    fz.start_phase("fuzzing")
    return fz, familiar


def test_acceptance_rule(cartpole):
    fz, familiar = _trained_fuzzer(cartpole)
    p = fz.propose(8)
    assert np.all(p.tags["kind"] == "mutant") and np.all(p.tags["parent_return"] == 400.0)
    novel = (np.full((30, 4), 0.01) + np.array([3.0, -3.0, 3.0, -3.0]) * fz.rnd.std).astype(np.float32)
    #          lower    novel   same     lower+fail  same ...
    returns = np.array([399.0, 450.0, 400.0, 10.0, 400.0, 400.0, 401.0, 400.0])
    failure = np.array([False, False, False, True, False, False, False, False])
    trajs = [familiar[0], novel, familiar[1], familiar[2], familiar[3], familiar[4], familiar[5], familiar[6]]
    size0 = len(fz.corpus)
    fz.observe(p, Feedback(returns=returns, lengths=np.full(8, 29), terminated=failure.copy(), failure=failure,
                           traj_obs=trajs))
    lo = fz.last_observed
    assert lo["accepted"].tolist() == [True, True, False, False, False, False, False, False]
    assert lo["lower_return"][0] and not lo["curious"][0]
    assert lo["curious"][1] and lo["novelty_rel"][1] > fz.novelty_threshold
    assert lo["lower_return"][3] and not lo["accepted"][3]  # a failing mutant is a fault, not a seed
    c = fz.counters
    assert (c["accepted"], c["accepted_return"], c["accepted_novelty"], c["mutant_failures"], c["rejected"]) == \
        (2, 1, 1, 1, 5)
    assert len(fz.corpus) == size0 + 2
    new = fz.corpus.scores["parent"][-2:]
    assert np.array_equal(new, p.tags["parent"][:2].astype(float))
    assert np.array_equal(fz.corpus.states[-2:], p.states[:2])


@pytest.mark.slow
def test_acceptance_absolute_thresholds(cartpole):
    fz, familiar = _trained_fuzzer(cartpole, threshold_mode="absolute", novelty_threshold=1e9)
    p = fz.propose(2)
    novel = (np.full((30, 4), 0.01) + 3.0 * fz.rnd.std).astype(np.float32)
    fz.observe(p, Feedback(returns=np.array([400.0, 400.0]), lengths=np.full(2, 29), terminated=np.zeros(2, bool),
                           failure=np.zeros(2, bool), traj_obs=[familiar[0], novel]))
    assert not fz.last_observed["accepted"].any()  # absurd absolute threshold: novelty never suffices
    fz2, _ = _trained_fuzzer(cartpole, threshold_mode="absolute", novelty_threshold=0.0)
    p = fz2.propose(1)
    fz2.observe(p, Feedback(returns=np.array([400.0]), lengths=np.full(1, 29), terminated=np.zeros(1, bool),
                            failure=np.zeros(1, bool), traj_obs=[familiar[0]]))
    assert fz2.last_observed["accepted"].all()


def test_sampling_phase_seeds_skip_failures(cartpole):
    fz = CureFuzz(cartpole, seed=0)
    p = fz.propose(6)
    assert np.all(p.tags["kind"] == "seed") and np.all(p.tags["parent"] == -1)
    fb = fake_feedback(cartpole, p.states)
    fb.failure[:2] = True
    fz.observe(p, fb)
    assert len(fz.corpus) == 4 and np.array_equal(fz.corpus.states, p.states[2:])
    assert np.allclose(fz.corpus.scores["return"], fb.returns[2:])
    assert np.all(np.isfinite(fz.corpus.scores["novelty"])) and np.all(np.isnan(fz.corpus.scores["entropy"]))
    keep = CureFuzz(cartpole, seed=0, keep_failing_seeds=True)
    p = keep.propose(6)
    keep.observe(p, fb)
    assert len(keep.corpus) == 6


# --------------------------------------------------------------------------------------------
# proposals, twins, determinism, snapshots
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["CartPole-v1", "MountainCar-v0", "Acrobot-v1"])
@pytest.mark.parametrize("w_entropy", [0.0, 1.0])
def test_proposals_valid_in_both_phases(name, w_entropy):
    sc = get_scenario(name)
    fz = CureFuzz(sc, seed=3, w_entropy=w_entropy, mutation_scale=0.2)
    for g, n in enumerate([5, 1, 4, 7, 3, 1, 6]):
        if g == 3:
            fz.start_phase("fuzzing")
        p = fz.propose(n)
        assert isinstance(p, Proposal) and len(p) == n and p.states.shape == (n, sc.state_dim)
        assert np.array_equal(sc.validate(p.states), p.states)
        assert set(p.tags) == {"kind", "parent", "parent_return"} and all(len(v) == n for v in p.tags.values())
        allowed = {"seed", "twin"} if fz.phase == "sampling" else {"mutant", "sample"}
        assert set(p.tags["kind"]) <= allowed
        k = sc.obs_dim
        traj = [np.tile(np.resize(s, k).astype(np.float32), (5, 1)) * (1 + 0.1 * np.arange(5)[:, None])
                for s in p.states]
        fz.observe(p, Feedback(returns=-np.abs(p.states).sum(1), lengths=np.full(n, 4), terminated=np.zeros(n, bool),
                               failure=np.zeros(n, bool), traj_obs=traj))
    assert len(fz.propose(0)) == 0
    s = fz.stats()
    assert s["episodes"] == 27 and s["seeds"] + s["twins"] + s["mutants"] + s["samples"] == 27
    assert (s["twins"] > 0) == (w_entropy > 0)


def test_twins_measure_entropy(cartpole):
    fz = CureFuzz(cartpole, seed=0, w_entropy=1.0)
    p1 = fz.propose(4)  # 4 seeds
    fz.observe(p1, fake_feedback(cartpole, p1.states))
    p2 = fz.propose(3)  # twins of the first 3 seeds (FIFO)
    assert p2.tags["kind"].tolist() == ["twin"] * 3 and p2.tags["parent"].tolist() == fz.corpus.ids[:3].tolist()
    fz.observe(p2, fake_feedback(cartpole, p2.states))
    e = fz.corpus.scores["entropy"]
    assert np.all(np.isfinite(e[:3])) and np.isnan(e[3]) and len(fz.corpus) == 4  # twins never join
    p3 = fz.propose(3)  # the last twin, then fresh seeds
    assert p3.tags["kind"].tolist() == ["twin", "seed", "seed"]
    fz.start_phase("fuzzing")  # seeds without a twin take their entropy from their first mutant
    assert fz.stats()["pending_twins"] == 0


def test_deterministic_under_seed(cartpole):
    a = run(CureFuzz(cartpole, seed=11, w_entropy=1.0), cartpole, 8, 16, 3)
    b = run(CureFuzz(cartpole, seed=11, w_entropy=1.0), cartpole, 8, 16, 3)
    c = run(CureFuzz(cartpole, seed=12, w_entropy=1.0), cartpole, 8, 16, 3)
    assert all(same_proposal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[-1].states, c[-1].states)


@pytest.mark.parametrize("cut", [2, 6])  # snapshot in the sampling phase (twins pending) / fuzzing
def test_state_dict_round_trip_continues_identically(cartpole, cut):
    n, fuzz_from = 12, 4
    fz = CureFuzz(cartpole, seed=5, w_entropy=1.0)
    run(fz, cartpole, cut, n, fuzz_from)
    snap = pickle.loads(pickle.dumps(fz.state_dict()))
    resumed = CureFuzz(cartpole, seed=999, w_entropy=1.0)  # its own seed must not matter
    resumed.load_state_dict(snap)
    if cut > fuzz_from:
        assert resumed.phase == "fuzzing"
    for g in range(cut, 10):
        if g == fuzz_from:
            fz.start_phase("fuzzing")
            resumed.start_phase("fuzzing")
        p, q = fz.propose(n), resumed.propose(n)
        assert same_proposal(p, q)
        fz.observe(p, fake_feedback(cartpole, p.states))
        resumed.observe(q, fake_feedback(cartpole, q.states))
    sa, sb = fz.stats(), resumed.stats()
    assert sa.keys() == sb.keys()
    assert all((sa[k] == sb[k]) or (sa[k] != sa[k] and sb[k] != sb[k]) for k in sa)
    assert np.array_equal(fz.corpus.states, resumed.corpus.states)


# --------------------------------------------------------------------------------------------
# end to end: the in-process engine on CartPole
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_end_to_end_cartpole(cartpole):
    from workers.policies import load_policy
    from workers.rollout import rollout

    pol = load_policy("python:workers.examples:cartpole_balancer", cartpole)
    fz = CureFuzz(cartpole, seed=0, mutation_scale=0.3)
    n, t_fuzzer, t_rollout, episodes = 32, 0.0, 0.0, 0
    for g in range(8):
        if g == 3:
            fz.start_phase("fuzzing")
        t0 = time.perf_counter()
        p = fz.propose(n)
        t1 = time.perf_counter()
        res = rollout(cartpole, pol, p.states)
        t2 = time.perf_counter()
        fz.observe(p, Feedback.from_result(res))
        t_fuzzer += (t1 - t0) + (time.perf_counter() - t2)
        t_rollout += t2 - t1
        episodes += n
        if fz.phase == "fuzzing":
            mut = p.tags["kind"] == "mutant"
            assert mut.any()
            parents = fz.last_observed["kind"] == "mutant"
            assert np.array_equal(parents, mut)
    s = fz.stats()
    assert s["episodes"] == episodes == 256 and s["seeds"] == 96 and s["mutants"] + s["samples"] == 160
    assert s["accepted"] + s["rejected"] + s["mutant_failures"] == s["mutants"]
    assert s["rnd_steps"] == 8 * 4 and np.isfinite(s["rnd_loss"]) and s["corpus_size"] > 0
    assert t_fuzzer < t_rollout  # the fuzzer costs less than running the episodes
