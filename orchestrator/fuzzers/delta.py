"""Delta (He et al., ISSTA 2026), Algorithm 1: energy-guided differential fuzzing for optimality.

Each test case is an initial state σ run by the AUT and by the challenger (CA). Delta keeps a
corpus S of seeds, each with three scores:

* **Diversity** D(σ) (Eq. 3): the RND novelty ‖T(s) − P(s)‖² averaged over the states of the
  AUT's trajectory (:mod:`orchestrator.fuzzers.rnd`; at most ``rnd_states_per_episode`` evenly
  spaced states, default 64, the same estimate for a new seed and for the corpus refresh).
  After **every evaluated trajectory** P takes ``rnd_updates_per_episode`` (1) Adam steps on that
  trajectory's states (Algorithm 1: "Update P ... over s ∈ τ′_aut"), after its D was taken; the
  D of every corpus seed is then recomputed from its kept (thinned) trajectory.
* **Regret** A(σ) = exp(R_ca − R_aut) (Eq. 4), computed as ``exp(clip(R_ca − R_aut, −c, c))``
  with ``c = regret_clip`` (default 20): A > 1 ⇔ the challenger did better.
* **Inconsistency** I(σ) = |H_aut ∩ H_ca| / |H_aut| (Eqs. 5–6) over all states of both
  trajectories: H are the sets of LSH codes of the states each agent visited; a code is the sign
  pattern of the projections of a state on ``k`` random hyperplanes through the origin
  (``lsh_bits``, default 16). States are standardised by the RND normaliser first (the running
  mean/std of the AUT's visited states), so the origin sits in the middle of the visited region
  whatever the observation scale. I = 1 when both agents visit the same regions, lower as they part.

**Energy** (Eq. 7), E(σ) = α·D′ + β·A′ + λ·(1 − I)′ with the weights ``alpha``, ``beta``, ``lam``
(1 each), in one of two forms (``energy``):

* ``literal``: the printed formula on raw values, D′ = D, A′ = A, (1 − I)′ = 1 − I. On the
  classic scenarios it does not let every term decide (docs/optimality.md has the
  measurements): a seed the challenger beats has A up to e^20 and takes almost every draw; on
  the others A ≤ 1 and 1 − I ≤ 1 sit beside a D of 13–47 (Acrobot, the loop before #17).
* ``normalized`` (default, a deviation from the printed formula): each term is put on [0, 1]
  over the current corpus. D′ and (1 − I)′ are percentile ranks (the share of the corpus strictly
  below; ties share the lowest rank, so a term that is constant over the corpus is 0 everywhere).
  A′ = A_s / (1 + A_s) with A_s = exp((R_ca − R_aut) / s), i.e. a logistic function of the
  return gap: ½ at a tie, → 1 as the challenger wins by more; ``s = regret_scale``, by default the
  corpus's mean |R_ca − R_aut| (1 when every gap is 0), so the transform follows the scenario's
  return scale.

Seeds are drawn with probability ∝ E (Eq. 8) by inverse-CDF sampling; energies are recomputed
after every generation. A mutant σ′ joins S when D(σ′) > mean D of S, or A(σ′) > 1, or I(σ′) <
mean I of S (dynamic thresholds, on the raw values in both forms).

**Decision shares**: for every parent drawn in the fuzzing phase the same uniform draw is also
inverted through the energy without each term (E − w_k·term_k); ``stats()`` reports per term
the share of draws whose chosen seed that changes (``decision_share_diversity`` etc.). A term
whose share is 0 did not steer the search; an ablated term has share 0 by construction.

Sampling phase: the initial corpus, states from ``scenario.sample`` (all join S). Fuzzing phase:
parents drawn ∝ energy, mutated with ``scenario.mutate``. With generation size n > 1 all parents
of a generation are drawn from S as it stood at the start of the generation; Delta's default
generation size in an optimality phase is 8 (``default_generation_size``), so the energies are
refreshed every 8 test cases.

The loop before issue #17 is ``energy: literal, rnd_update: generation,
rnd_updates_per_episode: 0.125, rnd_states_per_episode: 32`` with generations of 64
(``rnd_update: generation``: ⌈u·n⌉ Adam steps per generation on minibatches of the pooled,
thinned states of the generation).

Ablations (Table 4): ``without = ["diversity"]`` (or regret, inconsistency) sets that weight to 0
and drops its admission criterion.

Delta needs the challenger's episodes: it runs only in the optimality phase, whose feedback
carries ``ca_returns`` and ``ca_traj_obs``.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.fuzzers.base import Feedback, Fuzzer, Proposal
from orchestrator.fuzzers.corpus import Corpus, pick
from orchestrator.fuzzers.rnd import RND, evenly_spaced

COMPONENTS = ("diversity", "regret", "inconsistency")
ENERGIES = ("normalized", "literal")
RND_UPDATES = ("trajectory", "generation")
DIVERSITY_REFRESHES = ("stacked", "rebuild")


class TrajectoryStack:
    """The corpus seeds' thinned trajectories as one growing array, in corpus order (appended as
    seeds join; capacity doubles), with their lengths: what the diversity refresh passes to
    :meth:`RND.stacked_novelty` without concatenating every seed's trajectory anew."""

    def __init__(self, dim: int):
        self.dim, self.rows, self.count = int(dim), np.zeros((0, int(dim)), np.float32), 0
        self.lengths: list[int] = []

    def __len__(self) -> int:
        return len(self.lengths)

    def append(self, traj) -> None:
        t = np.asarray(traj, np.float32).reshape(-1, self.dim)
        if self.count + t.shape[0] > self.rows.shape[0]:
            grown = np.zeros((max(2 * self.rows.shape[0], self.count + t.shape[0], 1024), self.dim), np.float32)
            grown[:self.count] = self.rows[:self.count]
            self.rows = grown
        self.rows[self.count:self.count + t.shape[0]] = t
        self.count += t.shape[0]
        self.lengths.append(t.shape[0])

    def states(self) -> np.ndarray:
        return self.rows[:self.count]


def regret(r_ca, r_aut, clip: float = 20.0) -> np.ndarray:
    """A = exp(R_ca − R_aut) with the exponent clipped to [−clip, clip] (A > 1 ⇔ R_ca > R_aut)."""
    return np.exp(np.clip(np.asarray(r_ca, np.float64) - np.asarray(r_aut, np.float64), -clip, clip))


def rank01(x) -> np.ndarray:
    """Percentile rank on [0, 1]: the share of the other values strictly below each value, i.e.
    (min-rank − 1) / (n − 1). Ties share the lowest rank (a constant array maps to 0), NaN counts
    as the lowest value; one value or none: zeros."""
    x = np.asarray(x, np.float64)
    n = x.size
    if n <= 1:
        return np.zeros(n)
    x = np.where(np.isnan(x), -np.inf, x)
    return np.searchsorted(np.sort(x), x, side="left") / (n - 1)


def energy_terms(mode: str, diversity, gap, inconsistency_, *, regret_clip: float = 20.0,
                 regret_scale: float | None = None) -> dict:
    """The three terms of Eq. 7 for seeds with diversity D, return gap R_ca − R_aut and
    inconsistency I, unweighted, in the ``literal`` or ``normalized`` form (module docstring)."""
    D = np.asarray(diversity, np.float64)
    gap = np.asarray(gap, np.float64)
    one_minus_i = 1.0 - np.asarray(inconsistency_, np.float64)
    if mode == "literal":
        return {"diversity": D, "regret": np.exp(np.clip(gap, -regret_clip, regret_clip)),
                "inconsistency": one_minus_i}
    if mode != "normalized":
        raise ValueError(f"delta: unknown energy {mode!r}; choose from {', '.join(ENERGIES)}")
    s = regret_scale
    if s is None:
        finite = np.abs(gap[np.isfinite(gap)])
        s = float(finite.mean()) if finite.size else 0.0
        s = s if s > 0 else 1.0
    # logistic(gap / s) written with tanh: no overflow for any gap
    a = 0.5 * (1.0 + np.tanh(np.nan_to_num(gap, nan=0.0) / (2.0 * s)))
    return {"diversity": rank01(D), "regret": a, "inconsistency": rank01(one_minus_i)}


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
    ``energy`` = "normalized" (or "literal": Eq. 7 on raw values), ``regret_scale`` = None (the
    corpus's mean |R_ca − R_aut|; normalized energy only), ``without`` = [] (ablations),
    ``lsh_bits`` = 16, ``regret_clip`` = 20, ``mutation_scale`` = None (the scenario's); RND:
    ``rnd_hidden`` = 64, ``rnd_out`` = 16, ``rnd_lr`` = 1e-3, ``rnd_l2`` = 1e-4, ``rnd_batch`` = 256,
    ``rnd_update`` = "trajectory" (Adam steps on each evaluated trajectory) or "generation"
    (the pooled states of a generation), ``rnd_updates_per_episode`` = 1 (an integer in
    trajectory mode), ``rnd_states_per_episode`` = 64 (D's estimate; 0 = every state);
    ``diversity_refresh`` = "stacked" (the seeds' trajectories kept stacked for the refresh of
    every seed's D after each observe) or "rebuild" (stacked anew each time; the same bits),
    ``diversity_refresh_every`` = 1 (k > 1: every seed's D is refreshed after every k-th observe
    only, a stale-D approximation that divides the refresh's O(corpus) cost by k; not the paper's)."""

    name = "delta"
    needs_challenger = True
    default_generation_size = 8

    def __init__(self, scenario, seed: int = 0, *, alpha: float = 1.0, beta: float = 1.0, lam: float = 1.0,
                 energy: str = "normalized", regret_scale: float | None = None,
                 without=(), lsh_bits: int = 16, regret_clip: float = 20.0, mutation_scale: float | None = None,
                 rnd_hidden=64, rnd_out: int = 16, rnd_lr: float = 1e-3, rnd_l2: float = 1e-4, rnd_batch: int = 256,
                 rnd_update: str = "trajectory", rnd_updates_per_episode: float = 1.0,
                 rnd_states_per_episode: int = 64, diversity_refresh: str = "stacked",
                 diversity_refresh_every: int = 1, **params):
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
        if energy not in ENERGIES:
            raise ValueError(f"delta: unknown energy {energy!r}; choose from {', '.join(ENERGIES)}")
        self.energy = energy
        if regret_scale is not None and not (np.isfinite(regret_scale) and regret_scale > 0):
            raise ValueError(f"delta: regret_scale must be a positive number or null, got {regret_scale!r}")
        self.regret_scale = None if regret_scale is None else float(regret_scale)
        if not (np.isfinite(regret_clip) and regret_clip > 0):
            raise ValueError(f"delta: regret_clip must be a positive number, got {regret_clip!r}")
        self.regret_clip = float(regret_clip)
        self.mutation_scale = None if mutation_scale is None else float(mutation_scale)
        if rnd_update not in RND_UPDATES:
            raise ValueError(f"delta: unknown rnd_update {rnd_update!r}; choose from {', '.join(RND_UPDATES)}")
        self.rnd_update = rnd_update
        self.rnd_updates_per_episode = float(rnd_updates_per_episode)
        if not self.rnd_updates_per_episode >= 0 or (
                rnd_update == "trajectory" and self.rnd_updates_per_episode != int(self.rnd_updates_per_episode)):
            raise ValueError("delta: rnd_updates_per_episode must be >= 0, and a whole number of Adam steps per "
                             f"trajectory with rnd_update: trajectory; got {rnd_updates_per_episode!r}")
        self.rnd_states_per_episode = int(rnd_states_per_episode)
        if diversity_refresh not in DIVERSITY_REFRESHES:
            raise ValueError(f"delta: unknown diversity_refresh {diversity_refresh!r}; choose from "
                             f"{', '.join(DIVERSITY_REFRESHES)}")
        self.diversity_refresh = diversity_refresh
        if int(diversity_refresh_every) != diversity_refresh_every or diversity_refresh_every < 1:
            raise ValueError(f"delta: diversity_refresh_every must be a whole number >= 1, got {diversity_refresh_every!r}")
        self.diversity_refresh_every = int(diversity_refresh_every)
        sub = np.random.default_rng(self.rng.integers(2**63 - 1, size=2))
        self.rnd = RND(scenario.obs_dim, hidden=rnd_hidden, out_dim=rnd_out, lr=rnd_lr, l2=rnd_l2,
                       batch_size=rnd_batch, seed=int(sub.integers(2**31 - 1)))
        self.lsh = LSH(scenario.obs_dim, lsh_bits, seed=int(sub.integers(2**31 - 1)))
        self.corpus = Corpus(scenario.state_dim)
        self._traj: dict[int, np.ndarray] = {}  # corpus id -> thinned AUT trajectory (for D)
        self._stack = TrajectoryStack(scenario.obs_dim)  # the same, stacked in corpus order (rebuilt on load)
        self.generation = 0
        self.last_observed: dict = {}
        self.counters = self._fresh_counters()

    @staticmethod
    def _fresh_counters() -> dict:
        return {k: 0 for k in ("episodes", "samples", "mutants", "bugs", "accepted", "accepted_diversity",
                               "accepted_regret", "accepted_inconsistency", "selections", "decided_by_diversity",
                               "decided_by_regret", "decided_by_inconsistency")}

    @property
    def weights(self) -> dict:
        return {"diversity": self.alpha, "regret": self.beta, "inconsistency": self.lam}

    # -- proposing -------------------------------------------------------------------------
    def propose(self, n: int) -> Proposal:
        n = int(n)
        if n < 0:
            raise ValueError(f"propose: n must be >= 0, got {n}")
        d = self.scenario.state_dim
        if self.phase == "sampling" or len(self.corpus) == 0:
            states, parents, kind = self.scenario.sample(self.rng, n), np.full(n, -1, np.int64), "sample"
        else:
            idx, u = self.corpus.select_with_draws(self.rng, n)  # Eq. 8: ∝ energy
            if u is not None and n:
                self._count_decisions(idx, u)
            parents = self.corpus.ids[idx]
            states = self.scenario.mutate(self.corpus.states[idx], self.rng, self.mutation_scale)
            kind = "mutant"
        return Proposal(np.asarray(states, np.float64).reshape(n, d),
                        {"kind": np.full(n, kind, dtype="<U6"), "parent": parents})

    def _count_decisions(self, chosen: np.ndarray, u: np.ndarray) -> None:
        """Per term: how many of these draws would have chosen another seed without it."""
        terms = self._terms()
        self.counters["selections"] += int(u.size)
        for k, w in self.weights.items():
            if w > 0:
                alt = pick(self._combine(terms, drop=k), u)
                self.counters["decided_by_" + k] += int(np.sum(alt != chosen))

    # -- scores ----------------------------------------------------------------------------
    def _combine(self, terms: dict, drop: str | None = None) -> np.ndarray:
        """Eq. 7: Σ weight·term (> 0: every seed selectable), optionally without one term."""
        e = sum(w * terms[k] for k, w in self.weights.items() if k != drop)
        e = np.asarray(e, np.float64) * np.ones_like(terms["diversity"], dtype=np.float64)
        return np.maximum(np.nan_to_num(e, nan=0.0), 0.0) + 1e-12

    def _terms(self) -> dict:
        c = self.corpus
        return {k: c.scores["term_" + k] for k in COMPONENTS}

    def _refresh_energy(self) -> None:
        """Recompute the three terms and the energy of every seed from its scores."""
        c = self.corpus
        if not len(c):
            return
        gap = c.scores.get("gap")
        if gap is None:  # a snapshot from before the gap was kept: the (clipped) exponent of A
            gap = c.scores["gap"] = np.log(c.scores["regret"])
        terms = energy_terms(self.energy, c.scores["diversity"], gap, c.scores["inconsistency"],
                             regret_clip=self.regret_clip, regret_scale=self.regret_scale)
        for k in COMPONENTS:
            c.scores["term_" + k] = np.asarray(terms[k], np.float64)
        c.energy = self._combine(terms)

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
        aut_full = [np.asarray(t, np.float32).reshape(-1, obs_dim) for t in feedback.traj_obs]
        ca_full = [np.asarray(t, np.float32).reshape(-1, obs_dim) for t in feedback.ca_traj_obs]
        aut = evenly_spaced(aut_full, self.rnd_states_per_episode)
        per_trajectory = self.rnd_update == "trajectory"
        visited = np.concatenate(aut_full if per_trajectory else aut, axis=0)
        first = self.rnd.count == 0
        if first:
            self.rnd.update_normalizer(visited)

        D = self.rnd.trajectory_novelty(aut)  # Eq. 3, before P learns these trajectories
        gap = np.asarray(feedback.ca_returns, np.float64) - np.asarray(feedback.returns, np.float64)
        A = regret(feedback.ca_returns, feedback.returns, self.regret_clip)  # Eq. 4
        I = self._inconsistency(aut_full, ca_full)  # Eqs. 5-6
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
        self.last_observed = {"kind": kinds, "diversity": D, "regret": A, "gap": gap, "inconsistency": I,
                              "added": add}
        if add.any():
            ids = c.add(proposal.states[add], energy=0.0, diversity=D[add], regret=A[add], gap=gap[add],
                        inconsistency=I[add], generation=float(self.generation))
            in_step = len(self._stack) == len(c) - len(ids)  # else rebuilt when next needed
            for sid, t in zip(ids, (aut[i] for i in np.flatnonzero(add))):
                self._traj[int(sid)] = t
                if in_step:
                    self._stack.append(t)

        # P learns the AUT states just evaluated; then every seed's D and energy are recomputed
        if not first:
            self.rnd.update_normalizer(visited)
        if per_trajectory:
            steps = int(self.rnd_updates_per_episode)
            if steps:
                for t in aut_full:
                    self.rnd.train(t, steps=steps)
        else:
            steps = math.ceil(self.rnd_updates_per_episode * n)
            if steps:
                self.rnd.train(visited, steps=steps)
        if len(c) and self.alpha > 0 and self.generation % self.diversity_refresh_every == 0:
            c.scores["diversity"][:] = self._corpus_diversity()
        self._refresh_energy()
        self.generation += 1

    def _corpus_diversity(self) -> np.ndarray:
        """D of every corpus seed under the predictor as it now stands (Eq. 3): one forward pass
        over ``len(corpus) × rnd_states_per_episode`` states, the cost that grows with the corpus
        (benchmarks/corpus_cost.py). ``diversity_refresh="rebuild"``: the seeds' trajectories are
        concatenated anew (the former code); ``"stacked"`` (default): they are kept stacked as
        seeds join. Both give the same bits."""
        c = self.corpus
        if self.diversity_refresh == "rebuild":
            return self.rnd.trajectory_novelty([self._traj[int(i)] for i in c.ids])
        if len(self._stack) != len(c):  # after load_state_dict (Delta never removes a seed)
            self._stack = TrajectoryStack(self.scenario.obs_dim)
            for i in c.ids:
                self._stack.append(self._traj[int(i)])
        return self.rnd.stacked_novelty(self._stack.states(), self._stack.lengths)

    # -- logging and snapshots -------------------------------------------------------------
    def decision_shares(self) -> dict:
        """Per term, the share of fuzzing-phase draws whose chosen seed the term decided (NaN
        before any draw)."""
        sel = self.counters["selections"]
        return {"decision_share_" + k: (self.counters["decided_by_" + k] / sel if sel else float("nan"))
                for k in COMPONENTS}

    def stats(self) -> dict:
        c = self.corpus
        div = c.scores.get("diversity") if len(c) else None
        div = div if div is not None and np.isfinite(div).any() else None
        out = {"phase": self.phase, "generation": self.generation, "corpus_size": len(c),
               "corpus_mean_diversity": c.mean("diversity") if len(c) else float("nan"),
               "corpus_min_diversity": float(np.nanmin(div)) if div is not None else float("nan"),
               "corpus_max_diversity": float(np.nanmax(div)) if div is not None else float("nan"),
               "corpus_mean_inconsistency": c.mean("inconsistency") if len(c) else float("nan"),
               "rnd_loss": self.rnd.last_loss, "rnd_train_steps": self.rnd.train_steps}
        out.update(self.counters)
        out.update(self.decision_shares())
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
        self._stack = TrajectoryStack(self.scenario.obs_dim)
        self.generation = int(state["generation"])
        self.counters = {**self._fresh_counters(), **dict(state["counters"])}
        if len(self.corpus) and any("term_" + k not in self.corpus.scores for k in COMPONENTS):
            self._refresh_energy()  # a snapshot without the terms: rebuild them from the scores


__all__ = ["COMPONENTS", "ENERGIES", "Delta", "LSH", "energy_terms", "inconsistency", "rank01", "regret"]
