"""The seed corpus: initial states with their scores and energies, and energy-proportional selection.

Plain class (a fuzzer owns one); ``orchestrator.cluster.pool.corpus_actor_class(Corpus)`` wraps it as a Ray actor for
campaigns that share a corpus between drivers or want it to outlive one (snapshots via ``state_dict``).
The central corpus of an async campaign with ``corpus: actor`` holds a whole fuzzer (its corpus,
energies, models and RNG) in such an actor instead (:mod:`orchestrator.cluster.corpus_actor`).
"""

from __future__ import annotations

import numpy as np


def selection_cdf(energy) -> np.ndarray | None:
    """The cumulative selection probabilities of Eq. 8 (P(σ_i) = E_i / Σ_j E_j), computed as
    numpy's ``Generator.choice`` does; None when no energy is positive. NaN and inf count as 0."""
    e = np.clip(np.nan_to_num(np.asarray(energy, dtype=np.float64), nan=0.0, posinf=0.0), 0.0, None)
    total = e.sum()
    if not total > 0:
        return None
    cdf = (e / total).cumsum()
    cdf /= cdf[-1]
    return cdf


def pick(energy, u) -> np.ndarray:
    """Inverse-CDF selection: for each uniform draw in ``u``, the row whose cumulative energy
    share first exceeds it (uniform over the rows, by the same draw, when no energy is positive)."""
    u = np.asarray(u, dtype=np.float64)
    cdf = selection_cdf(energy)
    if cdf is None:
        n = int(np.size(energy))
        return np.minimum((u * n).astype(np.int64), n - 1)
    return cdf.searchsorted(u, side="right").astype(np.int64)


class Corpus:
    """Seeds = rows of ``states`` with a stable integer id, named per-seed scores and an energy."""

    def __init__(self, state_dim: int):
        self.state_dim = int(state_dim)
        self.states = np.zeros((0, self.state_dim))
        self.ids = np.zeros(0, dtype=np.int64)
        self.energy = np.zeros(0)
        self.scores: dict[str, np.ndarray] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return int(self.ids.size)

    def add(self, states: np.ndarray, energy=None, **scores) -> np.ndarray:
        """Append seeds; returns their ids. Scores not given are NaN for the new seeds."""
        states = np.asarray(states, dtype=np.float64).reshape(-1, self.state_dim)
        k = states.shape[0]
        ids = np.arange(self._next_id, self._next_id + k, dtype=np.int64)
        self._next_id += k
        self.states = np.concatenate([self.states, states])
        self.ids = np.concatenate([self.ids, ids])
        e = np.ones(k) if energy is None else np.broadcast_to(np.asarray(energy, dtype=np.float64), (k,))
        self.energy = np.concatenate([self.energy, e])
        for name in set(self.scores) | set(scores):
            old = self.scores.get(name, np.full(len(self) - k, np.nan))
            new = np.broadcast_to(np.asarray(scores.get(name, np.nan), dtype=np.float64), (k,))
            self.scores[name] = np.concatenate([old, new])
        return ids

    def index_of(self, ids) -> np.ndarray:
        """Row index of each id (-1 when the seed is no longer in the corpus)."""
        ids = np.asarray(ids, dtype=np.int64)
        pos = np.searchsorted(self.ids, ids)  # ids stay sorted: appended increasing, removal keeps order
        pos = np.clip(pos, 0, max(len(self) - 1, 0))
        found = (len(self) > 0) & (self.ids[pos] == ids) if len(self) else np.zeros(ids.shape, bool)
        return np.where(found, pos, -1)

    def remove(self, ids) -> None:
        keep = ~np.isin(self.ids, np.asarray(ids, dtype=np.int64))
        self.states, self.ids, self.energy = self.states[keep], self.ids[keep], self.energy[keep]
        self.scores = {k: v[keep] for k, v in self.scores.items()}

    def update(self, ids, **scores) -> None:
        """Set scores (and ``energy=``) of existing seeds; unknown ids are ignored."""
        idx = self.index_of(ids)
        ok = idx >= 0
        for name, value in scores.items():
            value = np.broadcast_to(np.asarray(value, dtype=np.float64), idx.shape)
            if name == "energy":
                self.energy[idx[ok]] = value[ok]
                continue
            if name not in self.scores:
                self.scores[name] = np.full(len(self), np.nan)
            self.scores[name][idx[ok]] = value[ok]

    def select(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """k row indices drawn with probability ∝ energy (uniform when all energies are 0)."""
        return self.select_with_draws(rng, k)[0]

    def select_with_draws(self, rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`select`, also returning the uniform draws ``u`` behind it (None when the energies
        are all 0 and the draw was uniform over the rows): ``pick(self.energy, u)`` gives the same
        rows, and ``pick(other_energy, u)`` what another energy would have chosen with the same
        draw. Consumes the RNG exactly as ``rng.choice(len(self), k, p=energy / energy.sum())``."""
        if len(self) == 0:
            raise IndexError("select from an empty corpus")
        cdf = selection_cdf(self.energy)
        if cdf is None:
            return rng.integers(0, len(self), size=int(k), dtype=np.int64), None
        u = rng.random(int(k))
        return cdf.searchsorted(u, side="right").astype(np.int64), u

    def mean(self, name: str) -> float:
        v = self.scores.get(name)
        return float(np.nanmean(v)) if v is not None and np.isfinite(v).any() else float("nan")

    def state_dict(self) -> dict:
        return {"state_dim": self.state_dim, "states": self.states.copy(), "ids": self.ids.copy(),
                "energy": self.energy.copy(), "scores": {k: v.copy() for k, v in self.scores.items()},
                "next_id": self._next_id}

    def load_state_dict(self, d: dict) -> None:
        self.state_dim = int(d["state_dim"])
        self.states, self.ids, self.energy = d["states"].copy(), d["ids"].copy(), d["energy"].copy()
        self.scores = {k: v.copy() for k, v in d["scores"].items()}
        self._next_id = int(d["next_id"])
