"""Behaviour clustering (Delta Sec. 6.1): DTW against hand-computed values and a pure-numpy DTW,
clusters on synthetic behaviour groups, and the AUT's bug trajectories read from a real run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis.behaviour import (
    TAUS,
    bug_trajectories,
    cluster,
    cluster_run,
    dtw_distance,
    dtw_matrix,
    normalise,
)


def numpy_dtw(a: np.ndarray, b: np.ndarray) -> float:
    """Textbook DTW: D[i, j] = |a_i - b_j|² + min(D[i-1, j], D[i, j-1], D[i-1, j-1]); result sqrt(D[n, m])."""
    a = np.asarray(a, float).reshape(len(a), -1)
    b = np.asarray(b, float).reshape(len(b), -1)
    n, m = len(a), len(b)
    d = np.full((n + 1, m + 1), np.inf)
    d[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost = float(((a[i - 1] - b[j - 1]) ** 2).sum())
            d[i, j] = cost + min(d[i - 1, j], d[i, j - 1], d[i - 1, j - 1])
    return math.sqrt(d[n, m])


def test_dtw_hand_computed():
    # a = 0, 1, 2 against b = 0, 2. Squared costs |a_i - b_j|²:
    #        b=0  b=2
    #   a=0   0    4
    #   a=1   1    1
    #   a=2   4    0
    # cumulative: D(0,0)=0, D(0,1)=4, D(1,0)=1, D(1,1)=1+min(0,4,1)=1, D(2,0)=5, D(2,1)=0+min(1,1,5)=1 -> sqrt(1)
    assert dtw_distance(np.array([0.0, 1.0, 2.0]), np.array([0.0, 2.0])) == pytest.approx(1.0)
    # one state each: the Euclidean distance (3-4-5)
    assert dtw_distance(np.array([[0.0, 0.0]]), np.array([[3.0, 4.0]])) == pytest.approx(5.0)
    # the same path at another speed costs nothing: DTW warps time
    a = np.array([[0, 0], [1, 1], [2, 2]], float)
    b = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [2, 2]], float)
    assert dtw_distance(a, b) == 0.0
    # Euclidean (lock-step) distance would not be 0 for a shifted copy, DTW of a repeated state is
    assert dtw_distance(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 2.0, 3.0])) == 0.0


def test_dtw_matches_pure_numpy_on_random_sequences():
    rng = np.random.default_rng(7)
    seqs = [rng.normal(size=(int(rng.integers(3, 15)), 3)) for _ in range(8)]
    want = [numpy_dtw(seqs[i], seqs[j]) for i in range(8) for j in range(i + 1, 8)]
    np.testing.assert_allclose(dtw_matrix(seqs), want, rtol=1e-10)
    for i, j in ((0, 1), (2, 7), (5, 5)):
        assert dtw_distance(seqs[i], seqs[j]) == pytest.approx(numpy_dtw(seqs[i], seqs[j]), rel=1e-10)
    # scipy's condensed order, as linkage expects
    from scipy.spatial.distance import squareform

    sq = squareform(dtw_matrix(seqs))
    assert sq[2, 5] == pytest.approx(numpy_dtw(seqs[2], seqs[5]))


def test_normalise_per_dimension():
    a = np.array([[0.0, 100.0, 5.0], [2.0, 300.0, 5.0]])
    b = np.array([[4.0, 200.0, 5.0]])
    za, zb = normalise([a, b], "zscore")
    pooled = np.vstack([a, b])
    np.testing.assert_allclose(za[:, :2], (a[:, :2] - pooled[:, :2].mean(0)) / pooled[:, :2].std(0))
    assert (za[:, 2] == 0).all() and (zb[:, 2] == 0).all()  # a constant dimension carries no distance
    ma, mb = normalise([a, b], "minmax")
    np.testing.assert_allclose(ma[:, 0], [0.0, 0.5])
    np.testing.assert_allclose(mb[0, :2], [1.0, 0.5])
    np.testing.assert_allclose(ma[:, 1], [0.0, 1.0])
    assert (ma[:, 2] == 0).all() and (mb[:, 2] == 0).all()
    with pytest.raises(ValueError):
        normalise([a], "l2")


def three_behaviours(rng, per_group=8):
    """Three behaviours in 2-D, each at varying speeds (lengths 30-60) with noise: swing up, swing down, circle."""
    seqs, truth = [], []
    for g in range(3):
        for _ in range(per_group):
            t = np.linspace(0, 1, int(rng.integers(30, 61)))
            if g == 0:
                x = np.c_[t, np.sin(np.pi * t)]
            elif g == 1:
                x = np.c_[t, -np.sin(np.pi * t)]
            else:
                x = np.c_[np.cos(2 * np.pi * t) - 1, np.sin(2 * np.pi * t)]
            seqs.append(x + rng.normal(0, 0.03, x.shape))
            truth.append(g)
    return seqs, np.array(truth)


def test_three_obvious_behaviours_give_three_clusters():
    seqs, truth = three_behaviours(np.random.default_rng(0))
    res = cluster(seqs)
    assert res.counts[0.30] == 3
    lab = res.labels[0.30]
    # the clusters are the groups: each group maps onto one label, and the labels differ
    assert all(len(set(lab[truth == g])) == 1 for g in range(3)) and len(set(lab)) == 3
    assert res.linkage.shape == (len(seqs) - 1, 4) and res.d_max == pytest.approx(res.linkage[:, 2].max())
    # counts fall (weakly) as tau grows, and a cut above d_max leaves one cluster
    assert res.counts[0.10] >= res.counts[0.20] >= res.counts[0.30]
    assert cluster(seqs, taus=(1.0,)).counts[1.0] == 1
    # two of the groups: two clusters, split along the groups
    two = cluster([s for s, g in zip(seqs, truth) if g < 2])
    assert two.counts[0.30] == 2 and len(set(two.labels[0.30][:8])) == 1
    # without normalisation (these dimensions have similar scales) the groups separate as well
    assert cluster(seqs, normalize=None).counts[0.30] == 3


def test_cluster_edge_cases():
    assert cluster([]).counts == {t: 0 for t in TAUS}
    r = cluster([np.zeros((4, 2))])
    assert r.counts == {t: 1 for t in TAUS} and r.linkage is None
    two = cluster([np.zeros((4, 2)), np.ones((5, 2))])
    assert two.counts[0.3] == 2 and two.d_max > 0


@pytest.mark.campaign
def test_bug_trajectories_from_a_run(tmp_path):
    """A real optimality run (random AUT against the balancer): one AUT observation sequence per bug,
    starting at the bug's initial state (CartPole observes its state), as long as the AUT's episode."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign

    p = tmp_path / "c.yaml"
    p.write_text(f"""
name: beh
scenario: CartPole-v1
aut: "random:0"
workers: 0
output: {tmp_path / 'run'}
mlflow: false
safety: null
optimality:
  fuzzer: delta
  challenger: "python:workers.examples:cartpole_balancer"
  budget: {{episodes: 48}}
  generation_size: 16
""")
    run_campaign(load_campaign(p), progress=False)
    run = tmp_path / "run"
    bugs = pd.read_parquet(run / "bugs.parquet")
    assert len(bugs) > 5
    seqs, ids, total = bug_trajectories(run)
    assert total == len(bugs) and ids == bugs["bug_id"].tolist()
    eps = pd.read_parquet(run / "episodes").set_index("episode_id")
    for s, bid in zip(seqs, ids):
        row = bugs.set_index("bug_id").loc[bid]
        np.testing.assert_allclose(s[0], row["initial_state"], rtol=1e-6)
        assert len(s) == eps.loc[row["aut_episode_id"], "length"] == row["aut_return"]
    sub, sub_ids, sub_total = bug_trajectories(run, max_sequences=5, seed=3)
    assert len(sub) == 5 and sub_total == len(bugs) and sub_ids == sorted(sub_ids)
    assert bug_trajectories(run, max_sequences=5, seed=3)[1] == sub_ids  # seeded
    res = cluster_run(run, max_sequences=None)
    assert res.n == len(bugs) and res.total == len(bugs)
    assert 1 <= res.counts[0.30] <= res.counts[0.10] <= len(bugs)
    assert cluster_run(tmp_path).counts == {t: 0 for t in TAUS}  # no bugs.parquet
