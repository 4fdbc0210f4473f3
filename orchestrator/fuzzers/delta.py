"""Delta (He et al., ISSTA 2026), Algorithm 1: energy-guided differential fuzzing for optimality.

Each test case is an initial state σ run by the AUT and by the challenger (CA). Delta keeps a
corpus S of seeds, each with three scores:

* **Diversity** D(σ) (Eq. 3): the RND novelty ‖T(s) − P(s)‖² averaged over the states of the
  AUT's trajectory (:mod:`orchestrator.fuzzers.rnd`; at most ``rnd_states_per_episode`` evenly
  spaced states). After every generation the predictor P trains on the generation's AUT states,
  so D falls where the AUT has been; the D of every corpus seed is recomputed from its kept
  (thinned) trajectory at the end of each generation.
* **Regret** A(σ) = exp(R_ca − R_aut) (Eq. 4), computed as ``exp(clip(R_ca − R_aut, −c, c))``
  with ``c = regret_clip`` (default 20): no overflow for MuJoCo-sized return gaps, and since the
  clip keeps the sign of the exponent, A > 1 ⇔ the challenger did better.
* **Inconsistency** I(σ) = |H_aut ∩ H_ca| / |H_aut| (Eqs. 5–6): H are the sets of LSH codes of the
  states each agent visited; a code is the sign pattern of the projections of a state on ``k``
  random hyperplanes through the origin (``lsh_bits``, default 16). States are standardised by
  the RND normaliser first (the running mean/std of the AUT's visited states), so the origin
  sits in the middle of the visited region whatever the observation scale. I = 1 when both
  agents visit the same regions, lower as they part.

Energy E(σ) = α·D + β·A + λ·(1 − I) (Eq. 7, raw values as in the paper), seeds drawn with
probability ∝ E (Eq. 8), energies recomputed every generation. A mutant σ′ joins S when
D(σ′) > mean D of S, or A(σ′) > 1, or I(σ′) < mean I of S (dynamic thresholds).

Sampling phase: the initial corpus, states from ``scenario.sample`` (all join S). Fuzzing phase:
parents drawn ∝ energy, mutated with ``scenario.mutate``. With generation size n > 1 all parents
of a generation are drawn from S as it stood at the start of the generation.

Ablations (Table 4): ``without = ["diversity"]`` (or regret, inconsistency) sets that weight to 0
and drops its admission criterion.

Delta needs the challenger's episodes: it runs only in the optimality phase, whose feedback
carries ``ca_returns`` and ``ca_traj_obs``.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.fuzzers.base import Feedback, Fuzzer, Proposal
from orchestrator.fuzzers.corpus import Corpus
from orchestrator.fuzzers.rnd import RND, evenly_spaced

COMPONENTS = ("diversity", "regret", "inconsistency")


def regret(r_ca, r_aut, clip: float = 20.0) -> np.ndarray:
    """A = exp(R_ca − R_aut) with the exponent clipped to [−clip, clip] (A > 1 ⇔ R_ca > R_aut)."""
    return np.exp(np.clip(np.asarray(r_ca, np.float64) - np.asarray(r_aut, np.float64), -clip, clip))


class LSH:
    """Sign-of-projection hashing: ``k`` random hyperplanes through the origin (Gaussian normals)."""

    def __init__(self, dim: int, k: int = 16, seed: int = 0):
        if not 1 <= int(k) <= 62:
            raise ValueError(f"lsh_bits must be in 1..62, got {k!r}")
        self.planes = np.random.default_rng(seed).standard_normal((int(dim), int(k)))
        self.weights = (1 << np.arange(int(k), dtype=np.int64))

    def codes(self, states: np.ndarray) -> np.ndarray:
        bits = (np.asarray(states, np.float64) @ self.planes) > 0
        return bits.astype(np.int64) @ self.weights


def inconsistency(codes_aut: np.ndarray, codes_ca: np.ndarray) -> float:
    """|H_aut ∩ H_ca| / |H_aut| over the sets of codes (1.0 for an empty AUT trajectory)."""
    h_aut = np.unique(codes_aut)
    if h_aut.size == 0:
        return 1.0
    return float(np.intersect1d(h_aut, np.unique(codes_ca), assume_unique=True).size / h_aut.size)


class Delta(Fuzzer):
    """Parameters: ``alpha`` = 1 (diversity), ``beta`` = 1 (regret), ``lam`` = 1 (inconsistency),
    ``without`` = [] (ablations), ``lsh_bits`` = 16, ``regret_clip`` = 20, ``mutation_scale`` =
    None (the scenario's); RND: ``rnd_hidden`` = 64, ``rnd_out`` = 16, ``rnd_lr`` = 1e-3,
    ``rnd_l2`` = 1e-4, ``rnd_batch`` = 256, ``rnd_updates_per_episode`` = 0.125,
    ``rnd_states_per_episode`` = 32."""

    name = "delta"
    needs_challenger = True

    def __init__(self, scenario, seed: int = 0, *, alpha: float = 1.0, beta: float = 1.0, lam: float = 1.0,
                 without=(), lsh_bits: int = 16, regret_clip: float = 20.0, mutation_scale: float | None = None,
                 rnd_hidden=64, rnd_out: int = 16, rnd_lr: float = 1e-3, rnd_l2: float = 1e-4, rnd_batch: int = 256,
                 rnd_updates_per_episode: float = 0.125, rnd_states_per_episode: int = 32, **params):
        super().__init__(scenario, seed, **params)
        without = [without] if isinstance(without, str) else list(without or [])
        bad = [w for w in without if w not in COMPONENTS]
        if bad:
            raise ValueError(f"delta: unknown component {bad[0]!r} in without; choose from {', '.join(COMPONENTS)}")
        self.without = sorted(set(without))
        self.alpha = 0.0 if "diversity" in self.without else float(alpha)
        self.beta = 0.0 if "regret" in self.without else float(beta)
        self.lam = 0.0 if "inconsistency" in self.without else float(lam)
        if min(self.alpha, self.beta, self.lam) < 0:
            raise ValueError("delta: alpha, beta and lam must be >= 0")
        if not (np.isfinite(regret_clip) and regret_clip > 0):
            raise ValueError(f"delta: regret_clip must be a positive number, got {regret_clip!r}")
        self.regret_clip = float(regret_clip)
        self.mutation_scale = None if mutation_scale is None else float(mutation_scale)
        self.rnd_updates_per_episode = float(rnd_updates_per_episode)
        self.rnd_states_per_episode = int(rnd_states_per_episode)
        sub = np.random.default_rng(self.rng.integers(2**63 - 1, size=2))
        self.rnd = RND(scenario.obs_dim, hidden=rnd_hidden, out_dim=rnd_out, lr=rnd_lr, l2=rnd_l2,
                       batch_size=rnd_batch, seed=int(sub.integers(2**31 - 1)))
        self.lsh = LSH(scenario.obs_dim, lsh_bits, seed=int(sub.integers(2**31 - 1)))
        self.corpus = Corpus(scenario.state_dim)
        self._traj: dict[int, np.ndarray] = {}  # corpus id -> thinned AUT trajectory (for D)
        self.generation = 0
        self.last_observed: dict = {}
        self.counters = {k: 0 for k in ("episodes", "samples", "mutants", "bugs", "accepted", "accepted_diversity",
                                        "accepted_regret", "accepted_inconsistency")}

    # -- proposing -------------------------------------------------------------------------
    def propose(self, n: int) -> Proposal:
        n = int(n)
        if n < 0:
            raise ValueError(f"propose: n must be >= 0, got {n}")
        d = self.scenario.state_dim
        if self.phase == "sampling" or len(self.corpus) == 0:
            states, parents, kind = self.scenario.sample(self.rng, n), np.full(n, -1, np.int64), "sample"
        else:
            idx = self.corpus.select(self.rng, n)  # Eq. 8: ∝ energy
            parents = self.corpus.ids[idx]
            states = self.scenario.mutate(self.corpus.states[idx], self.rng, self.mutation_scale)
            kind = "mutant"
        return Proposal(np.asarray(states, np.float64).reshape(n, d),
                        {"kind": np.full(n, kind, dtype="<U6"), "parent": parents})

    # -- scores ----------------------------------------------------------------------------
    def _energy(self, D, A, I) -> np.ndarray:
        e = self.alpha * D + self.beta * A + self.lam * (1.0 - I)
        return np.maximum(np.nan_to_num(e, nan=0.0), 0.0) + 1e-12  # Eq. 7 (> 0: every seed selectable)

    def _inconsistency(self, aut_trajs, ca_trajs) -> np.ndarray:
        return np.array([inconsistency(self.lsh.codes(self.rnd.normalize(a)), self.lsh.codes(self.rnd.normalize(c)))
                         for a, c in zip(aut_trajs, ca_trajs)])

    # -- observing -------------------------------------------------------------------------
    def observe(self, proposal: Proposal, feedback: Feedback) -> None:
        n = len(proposal)
        if n == 0:
            return
        if feedback.ca_returns is None or feedback.ca_traj_obs is None:
            raise ValueError("delta needs the challenger's episodes: run it in an optimality phase "
                             "(campaign section `optimality:`), not as a safety fuzzer")
        kinds = proposal.tags.get("kind", np.full(n, "sample"))
        obs_dim = self.scenario.obs_dim
        aut = evenly_spaced([np.asarray(t, np.float32).reshape(-1, obs_dim) for t in feedback.traj_obs],
                            self.rnd_states_per_episode)
        ca = evenly_spaced([np.asarray(t, np.float32).reshape(-1, obs_dim) for t in feedback.ca_traj_obs],
                           self.rnd_states_per_episode)
        visited = np.concatenate(aut, axis=0)
        first = self.rnd.count == 0
        if first:
            self.rnd.update_normalizer(visited)

        D = self.rnd.trajectory_novelty(aut)  # Eq. 3, before P learns this generation
        A = regret(feedback.ca_returns, feedback.returns, self.regret_clip)  # Eq. 4
        I = self._inconsistency(aut, ca)  # Eqs. 5-6
        c = self.corpus
        if self.phase == "sampling" or len(c) == 0:
            add = np.ones(n, bool)
            why = {k: np.zeros(n, bool) for k in COMPONENTS}
        else:  # dynamic thresholds against the corpus as it stands
            why = {"diversity": (D > c.mean("diversity")) if self.alpha > 0 else np.zeros(n, bool),
                   "regret": (A > 1.0) if self.beta > 0 else np.zeros(n, bool),
                   "inconsistency": (I < c.mean("inconsistency")) if self.lam > 0 else np.zeros(n, bool)}
            add = why["diversity"] | why["regret"] | why["inconsistency"]
        self.counters["episodes"] += n
        self.counters["samples"] += int(np.sum(kinds == "sample"))
        self.counters["mutants"] += int(np.sum(kinds == "mutant"))
        if feedback.bug is not None:
            self.counters["bugs"] += int(np.sum(feedback.bug))
        if self.phase == "fuzzing":
            self.counters["accepted"] += int(add.sum())
            for k in COMPONENTS:
                self.counters["accepted_" + k] += int(np.sum(add & why[k]))
        self.last_observed = {"kind": kinds, "diversity": D, "regret": A, "inconsistency": I, "added": add}
        if add.any():
            ids = c.add(proposal.states[add], energy=self._energy(D[add], A[add], I[add]),
                        diversity=D[add], regret=A[add], inconsistency=I[add],
                        generation=float(self.generation))
            for sid, t in zip(ids, (aut[i] for i in np.flatnonzero(add))):
                self._traj[int(sid)] = t

        # P learns the generation's AUT states; then every seed's D and energy are recomputed
        if not first:
            self.rnd.update_normalizer(visited)
        steps = math.ceil(self.rnd_updates_per_episode * n)
        if steps:
            self.rnd.train(visited, steps=steps)
        if len(c) and self.alpha > 0:
            c.scores["diversity"][:] = self.rnd.trajectory_novelty([self._traj[int(i)] for i in c.ids])
        if len(c):
            c.energy = self._energy(c.scores["diversity"], c.scores["regret"], c.scores["inconsistency"])
        self.generation += 1

    # -- logging and snapshots -------------------------------------------------------------
    def stats(self) -> dict:
        c = self.corpus
        out = {"phase": self.phase, "generation": self.generation, "corpus_size": len(c),
               "corpus_mean_diversity": c.mean("diversity") if len(c) else float("nan"),
               "corpus_mean_inconsistency": c.mean("inconsistency") if len(c) else float("nan"),
               "rnd_loss": self.rnd.last_loss}
        out.update(self.counters)
        return out

    def state_dict(self) -> dict:
        d = super().state_dict()
        ids = np.array(sorted(self._traj), dtype=np.int64)
        d.update({"corpus": self.corpus.state_dict(), "rnd": self.rnd.state_dict(),
                  "traj_ids": ids, "trajs": [self._traj[int(i)] for i in ids], "lsh_planes": self.lsh.planes,
                  "generation": self.generation, "counters": dict(self.counters)})
        return d

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.corpus.load_state_dict(state["corpus"])
        self.rnd.load_state_dict(state["rnd"])
        self.lsh.planes = np.array(state["lsh_planes"])
        self._traj = {int(i): np.asarray(t) for i, t in zip(state["traj_ids"], state["trajs"])}
        self.generation = int(state["generation"])
        self.counters = dict(state["counters"])


__all__ = ["COMPONENTS", "Delta", "LSH", "inconsistency", "regret"]
