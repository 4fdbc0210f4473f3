"""Behaviour clustering (Delta Sec. 6.1, Table 6): how many distinct behaviours the AUT shows
on the initial states that trigger optimality bugs.

    res = cluster_run("runs/quickstart")     # the AUT's trajectories from bugs.parquet's states
    res.counts                               # {0.1: 37, 0.2: 12, 0.3: 5}
    scipy.cluster.hierarchy.dendrogram(res.linkage)

The method, as the paper describes it:

* one sequence per bug: the AUT's observation sequence of its (first) episode from the bug's
  initial state (``aut_episode_id`` in ``bugs.parquet``, the steps in the run's ``steps/``
  store), in time order;
* states normalised per dimension before any distance: z-score, (x − mean) / std, with mean and
  std over every step of every sequence being clustered (a dimension with std 0 becomes 0). The
  paper does not say how (or whether) it normalises; without it the dimension with the largest
  numbers (e.g. angular velocities) would decide the distances alone. ``normalize="minmax"``
  (to [0, 1] over the same pooled steps) and ``None`` are the alternatives;
* the pairwise distance is multivariate DTW (dtaidistance, C): the square root of the minimum,
  over warping paths, of the summed squared Euclidean distances between matched states. No
  window: sequences of different lengths are compared whole, without padding, as in the paper;
* agglomerative clustering (scipy.cluster.hierarchy.linkage) of the condensed DTW matrix. The
  paper says "the pair of clusters with the smallest pairwise distance is merged" and cites an
  overview [Murtagh & Contreras 2012] without naming the linkage; we use **average linkage**
  (UPGMA): it is defined for any dissimilarity (Ward and centroid linkage assume Euclidean
  vectors, which DTW distances are not) and does not chain like single linkage. ``method=``
  takes any other scipy linkage for comparison ("single" is the most literal reading);
* the dendrogram's maximum merge distance is d_max; the number of behavioural patterns at τ is
  the number of clusters when the dendrogram is cut at τ · d_max
  (``fcluster(criterion="distance")``: clusters whose merge height is at most τ · d_max merge).
  The paper reports τ ∈ {0.10, 0.20, 0.30}.

Cost: N sequences of length L take N(N − 1)/2 DTW computations of L² cells each.
``max_sequences`` caps N by a seeded random sample of the bugs (the result says how many of how
many), so that a report on a run with thousands of bugs stays in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import RunStore

TAUS = (0.10, 0.20, 0.30)
LINKAGE = "average"


@dataclass
class Clustering:
    """Cluster counts at each τ, and what drew them."""

    counts: dict  # tau -> number of clusters (behavioural patterns)
    linkage: np.ndarray | None  # scipy linkage matrix (n - 1, 4); None for fewer than 2 sequences
    d_max: float  # maximum merge distance of the dendrogram (nan for fewer than 2 sequences)
    labels: dict = field(default_factory=dict)  # tau -> cluster label of each sequence (1-based)
    distances: np.ndarray | None = None  # condensed DTW distance matrix (scipy order)
    ids: list = field(default_factory=list)  # what each sequence is (bug ids when from a run)
    method: str = LINKAGE
    normalize: str | None = "zscore"
    total: int = 0  # sequences available (bugs) before any sampling
    lengths: list = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict:
        return {"counts": {f"{t:.2f}": int(c) for t, c in self.counts.items()}, "d_max": self.d_max,
                "sequences": self.n, "total": self.total, "method": self.method, "normalize": self.normalize,
                "mean_length": float(np.mean(self.lengths)) if self.lengths else float("nan")}


def normalise(seqs: list[np.ndarray], how: str | None = "zscore") -> list[np.ndarray]:
    """Per-dimension normalisation over the pooled steps of all ``seqs`` (each (T_i, D))."""
    seqs = [np.asarray(s, dtype=np.float64).reshape(len(s), -1) for s in seqs]
    if how is None or not seqs:
        return seqs
    allx = np.concatenate(seqs, axis=0)
    if how == "zscore":
        centre, scale = allx.mean(axis=0), allx.std(axis=0)
    elif how == "minmax":
        centre, scale = allx.min(axis=0), allx.max(axis=0) - allx.min(axis=0)
    else:
        raise ValueError(f"normalize must be 'zscore', 'minmax' or None, got {how!r}")
    scale = np.where(scale > 0, scale, 1.0)
    out = []
    for s in seqs:
        z = (s - centre) / scale
        if how == "zscore":
            z[:, allx.std(axis=0) == 0] = 0.0
        out.append(np.ascontiguousarray(z))
    return out


def dtw_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Multivariate DTW between two sequences (T_a, D) and (T_b, D), dtaidistance's C code."""
    from dtaidistance import dtw_ndim

    a = np.ascontiguousarray(np.asarray(a, dtype=np.float64).reshape(len(a), -1))
    b = np.ascontiguousarray(np.asarray(b, dtype=np.float64).reshape(len(b), -1))
    return float(dtw_ndim.distance_fast(a, b))


def dtw_matrix(seqs: list[np.ndarray], parallel: bool = False) -> np.ndarray:
    """Condensed pairwise DTW distances (scipy's ``pdist`` order: (0,1), (0,2), …, (1,2), …)."""
    from dtaidistance import dtw_ndim

    seqs = [np.ascontiguousarray(np.asarray(s, dtype=np.float64).reshape(len(s), -1)) for s in seqs]
    if len(seqs) < 2:
        return np.zeros(0)
    return np.asarray(dtw_ndim.distance_matrix_fast(seqs, compact=True, parallel=parallel), dtype=np.float64)


def cluster(seqs: list[np.ndarray], taus=TAUS, *, method: str = LINKAGE, normalize: str | None = "zscore",
            ids=None, total: int | None = None, parallel: bool = False) -> Clustering:
    """Normalise, DTW, agglomerative clustering, cluster counts at every τ · d_max. ``parallel``:
    the DTW matrix on every core (the same distances; for pools of thousands of sequences)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    ids = list(range(len(seqs))) if ids is None else list(ids)
    lengths = [int(len(s)) for s in seqs]
    total = len(seqs) if total is None else int(total)
    if len(seqs) == 0:
        return Clustering({t: 0 for t in taus}, None, float("nan"), ids=ids, method=method, normalize=normalize,
                          total=total)
    if len(seqs) == 1:
        return Clustering({t: 1 for t in taus}, None, float("nan"), labels={t: np.ones(1, int) for t in taus},
                          ids=ids, method=method, normalize=normalize, total=total, lengths=lengths)
    d = dtw_matrix(normalise(seqs, normalize), parallel=parallel)
    z = linkage(d, method=method)
    d_max = float(z[:, 2].max())
    labels, counts = {}, {}
    for t in taus:
        lab = fcluster(z, t=t * d_max, criterion="distance")
        labels[t] = lab
        counts[t] = int(len(np.unique(lab)))
    return Clustering(counts, z, d_max, labels=labels, distances=d, ids=ids, method=method, normalize=normalize,
                      total=total, lengths=lengths)


def bug_trajectories(run_dir: str | Path, *, max_sequences: int | None = 500, seed: int = 0
                     ) -> tuple[list[np.ndarray], list[int], int]:
    """The AUT's observation sequences from the bug-triggering initial states of a run.

    Returns (sequences, bug ids, number of bugs). Bugs are read from ``bugs.parquet``; when there
    are more than ``max_sequences``, a seeded random sample of them (sorted by bug id).
    """
    folder = RunFolder(run_dir)
    if not folder.bugs_parquet.is_file():
        return [], [], 0
    bugs = pd.read_parquet(folder.bugs_parquet, columns=["bug_id", "aut_episode_id"])
    total = len(bugs)
    if max_sequences is not None and total > max_sequences:
        keep = np.sort(np.random.default_rng(seed).choice(total, size=max_sequences, replace=False))
        bugs = bugs.iloc[keep]
    if bugs.empty:
        return [], [], total
    steps = RunStore.open(folder.root).read_steps(role="aut", episode_ids=bugs["aut_episode_id"].to_numpy())
    eid = steps["episode_id"]
    obs = steps["obs"].reshape(len(eid), -1)
    bounds = np.flatnonzero(np.diff(eid)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(eid)]])
    by_episode = {int(eid[s]): obs[s:e] for s, e in zip(starts, ends)} if len(eid) else {}
    seqs, ids = [], []
    for bug_id, ep in zip(bugs["bug_id"], bugs["aut_episode_id"]):
        if int(ep) in by_episode:
            seqs.append(by_episode[int(ep)])
            ids.append(int(bug_id))
    return seqs, ids, total


def cluster_run(run_dir: str | Path, taus=TAUS, *, method: str = LINKAGE, normalize: str | None = "zscore",
                max_sequences: int | None = 500, seed: int = 0) -> Clustering:
    """Behaviour clustering of the AUT on the bugs of one optimality run."""
    seqs, ids, total = bug_trajectories(run_dir, max_sequences=max_sequences, seed=seed)
    return cluster(seqs, taus, method=method, normalize=normalize, ids=ids, total=total)
