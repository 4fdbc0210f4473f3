"""Delta's diversity refresh (orchestrator/fuzzers/delta.py): the stacked trajectories give the
bits of the former rebuild, through a snapshot too; ``diversity_refresh_every`` bounds it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from envs import get_scenario
from orchestrator.fuzzers import Feedback, FuzzerError, make_fuzzer
from orchestrator.fuzzers.rnd import RND


def _feedback(proposal, rng, obs_dim=4):
    n = len(proposal)

    def episodes():
        lengths = rng.integers(3, 60, size=n)
        return lengths, [(np.resize(proposal.states[i], obs_dim) + np.cumsum(
            0.05 * rng.standard_normal((int(t) + 1, obs_dim)), axis=0)).astype(np.float32) for i, t in enumerate(lengths)]

    lengths, trajs = episodes()
    ca_lengths, ca_trajs = episodes()
    return Feedback(returns=lengths.astype(float), lengths=lengths, terminated=lengths < 59, failure=lengths < 10,
                    traj_obs=trajs, ca_returns=ca_lengths.astype(float), ca_traj_obs=ca_trajs,
                    bug=ca_lengths > lengths)


def _run(generations=30, snapshot_at=15, **params):
    sc = get_scenario("CartPole-v1")
    fz = make_fuzzer("delta", sc, seed=2, **params)
    rng = np.random.default_rng(4)
    proposed, diversity = [], []
    for g in range(generations):
        if g == 6:
            fz.start_phase("fuzzing")
        if g == snapshot_at:  # a resumed fuzzer rebuilds its stack from the snapshot
            state = pickle.loads(pickle.dumps(fz.state_dict()))
            fz = make_fuzzer("delta", sc, seed=2, **params)
            fz.load_state_dict(state)
        p = fz.propose(24 if g < 6 else 8)
        proposed.append(p.states)
        fz.observe(p, _feedback(p, rng))
        diversity.append(fz.corpus.scores["diversity"].copy())
    return fz, np.concatenate(proposed), diversity


@pytest.mark.slow
def test_stacked_refresh_gives_the_bits_of_the_rebuild():
    a, pa, da = _run(diversity_refresh="rebuild")
    b, pb, db = _run(diversity_refresh="stacked")
    assert len(a.corpus) > 150
    np.testing.assert_array_equal(pa, pb)
    for x, y in zip(da, db):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.corpus.energy, b.corpus.energy)
    assert len(b._stack) == len(b.corpus)  # kept in step as seeds joined after the reload


def test_rnd_stacked_novelty_equals_trajectory_novelty():
    rnd = RND(3, seed=1)
    rng = np.random.default_rng(0)
    trajs = [rng.standard_normal((k, 3)).astype(np.float32) for k in (5, 0, 12, 1)]
    rnd.update_normalizer(np.concatenate(trajs))
    got = rnd.stacked_novelty(np.concatenate(trajs), [len(t) for t in trajs])
    np.testing.assert_array_equal(got, rnd.trajectory_novelty(trajs))
    assert np.isnan(got[1]) and np.isfinite(got[[0, 2, 3]]).all()


@pytest.mark.slow
def test_refresh_every_k_keeps_old_diversities_between_refreshes():
    fz, _, div = _run(generations=20, snapshot_at=-1, diversity_refresh_every=4)
    # generation g refreshes when g % 4 == 0: between refreshes an old seed's D stays as it was
    assert np.array_equal(div[5][:50], div[6][:50]) and not np.array_equal(div[7][:50], div[8][:50])
    _, _, every = _run(generations=20, snapshot_at=-1)
    assert not np.array_equal(every[5][:50], every[6][:50])


@pytest.mark.parametrize("params", [{"diversity_refresh": "lazy"}, {"diversity_refresh_every": 0},
                                    {"diversity_refresh_every": 1.5}])
def test_refresh_parameters_are_validated(params):
    with pytest.raises((ValueError, FuzzerError), match="diversity_refresh"):
        make_fuzzer("delta", get_scenario("CartPole-v1"), **params)


@pytest.mark.subprocess
def test_corpus_cost_benchmark_smoke_prints_its_table():
    """benchmarks/corpus_cost.py at a tiny size: it runs, checks that the rebuilt and the stacked
    refresh propose the same states (it exits non-zero otherwise) and prints a row per case."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "benchmarks/corpus_cost.py", "--sizes", "40", "--units", "3",
                          "--fuzzers", "delta", "curefuzz"], cwd=repo, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| delta") or line.startswith("| curefuzz")]
    assert len(rows) == 4 and "| delta (rebuild) | 40 |" in out.stdout and "| delta (stacked) | 40 |" in out.stdout
