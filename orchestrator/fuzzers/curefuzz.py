"""CureFuzz (He et al., ICSE 2024): curiosity-driven fuzzing of an agent's initial states.

The method as the CureFuzz and Delta papers describe it, run in generations (``n = 1`` is the
papers' serial loop; with larger ``n`` all parents of a generation are drawn from the corpus as
it stood at the start of the generation):

* **Curiosity** (:mod:`orchestrator.fuzzers.rnd`): a Random Network Distillation pair reads the
  observations the AUT visits. The novelty ``D`` of an episode is the RND error averaged over its
  trajectory (Delta, Eq. 3), estimated on at most ``rnd_states_per_episode`` evenly spaced
  states of it. After each generation the predictor takes ``ceil(rnd_updates_per_episode · n)``
  Adam steps on minibatches of the generation's visited states, so novelty falls where the AUT
  has been. Inputs are standardised by the running mean/std of the (thinned) visited states.
* **Sampling phase**: seeds come from ``scenario.sample``; every sampled seed whose episode does
  not fail joins the corpus with its return ``R`` and novelty ``D`` (a failing one is a found
  fault, not a seed, as for mutants; ``keep_failing_seeds=True`` keeps it).
* **Fuzzing phase**: parents are drawn with probability ∝ a multi-objective energy that favours
  low return (likely to crash) and high curiosity, each term min–max normalised over the corpus
  and weighted (``w_return``, ``w_novelty``); each draw spends one unit of the parent's energy
  budget (``seed_energy``) and a seed whose budget is spent leaves the corpus. The mutant
  (``scenario.mutate`` with ``mutation_scale``) is run; if it fails the oracle it is a found fault
  and is not kept, else it joins the corpus (with a fresh budget) when it lowers its parent's
  return or its novelty exceeds ``novelty_threshold``. When the corpus runs dry the generation
  is filled with fresh samples (``kind = "sample"``), which join it like sampled seeds.
* **Thresholds** (``threshold_mode = "relative"``, the default): novelty is divided by a running
  reference, an exponential moving average (``reference_rate`` per episode) of each generation's
  median novelty, so ``novelty_threshold = 2`` means "twice as novel as a typical recent
  episode", whatever the environment's observation scale and however far the predictor has
  learnt. ``"absolute"`` compares raw values (the public code's constants 10 / 200 / 500 belong
  to its own unnormalised network scales).
* **Entropy** (optional, ``w_entropy > 0``; off by default): the public code's third objective,
  the distance between the final observations (standardised) of a seed's episode and of a
  perturbed run of it. Each corpus seed of the sampling phase then gets a *twin* episode
  (``kind = "twin"``, a mutant of it, proposed in a later generation of the phase, counted in the
  budget, never kept as a seed); a mutant's entropy is measured against its parent and a seed
  without a twin takes its first mutant's. Entropy enters the energy (weight ``w_entropy``) and
  the corpus update (relative entropy above ``entropy_threshold``).

Tags of a proposal: ``kind`` (``seed``, ``twin``, ``mutant`` or ``sample``), ``parent`` (corpus id,
-1 for none) and ``parent_return`` (NaN for none). Corpus scores: ``return``, ``novelty`` (raw D),
``novelty_rel``, ``entropy`` (relative, NaN until measured or when off), ``count`` (energy budget
left), ``parent``, ``generation``; ``Corpus.energy`` holds the selection weight.
``last_observed`` holds the last generation's per-episode scores and decisions.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.fuzzers.base import Feedback, Fuzzer, Proposal
from orchestrator.fuzzers.corpus import Corpus
from orchestrator.fuzzers.rnd import RND, evenly_spaced

_SEED_KINDS = ("seed", "sample")


class CureFuzz(Fuzzer):
    """Curiosity (RND over visited states) + multi-objective seed selection + curiosity-aware
    corpus update. Parameters (all keyword; unknown ones raise ``TypeError``):

    ``mutation_scale`` = None (the scenario's), ``seed_energy`` = 5 draws per seed,
    ``w_return`` = 1, ``w_novelty`` = 1, ``w_entropy`` = 0 (> 0 turns the entropy objective, its
    acceptance term and the twin episodes on), ``novelty_threshold`` = 2, ``entropy_threshold`` = 4,
    ``threshold_mode`` = "relative" | "absolute", ``reference_rate`` = 0.05;
    RND: ``rnd_hidden`` = 64 (int or list of ints), ``rnd_out`` = 16, ``rnd_lr`` = 1e-3,
    ``rnd_l2`` = 1e-4, ``rnd_batch`` = 256, ``rnd_updates_per_episode`` = 0.125,
    ``rnd_states_per_episode`` = 64 (0 = every state); ``keep_failing_seeds`` = False (True: sampled
    seeds whose episode fails join the corpus too).
    """

    name = "curefuzz"

    def __init__(self, scenario, seed: int = 0, *, mutation_scale: float | None = None, seed_energy: int = 5,
                 w_return: float = 1.0, w_novelty: float = 1.0, w_entropy: float = 0.0,
                 novelty_threshold: float = 2.0, entropy_threshold: float = 4.0,
                 threshold_mode: str = "relative", reference_rate: float = 0.05,
                 rnd_hidden=64, rnd_out: int = 16, rnd_lr: float = 1e-3, rnd_l2: float = 1e-4,
                 rnd_batch: int = 256, rnd_updates_per_episode: float = 0.125, rnd_states_per_episode: int = 64,
                 keep_failing_seeds: bool = False, **params):
        super().__init__(scenario, seed, **params)
        self.mutation_scale = None if mutation_scale is None else float(mutation_scale)
        self.seed_energy = int(seed_energy)
        self.w_return, self.w_novelty, self.w_entropy = float(w_return), float(w_novelty), float(w_entropy)
        self.novelty_threshold, self.entropy_threshold = float(novelty_threshold), float(entropy_threshold)
        self.threshold_mode = str(threshold_mode)
        self.reference_rate = float(reference_rate)
        self.rnd_updates_per_episode = float(rnd_updates_per_episode)
        self.rnd_states_per_episode = int(rnd_states_per_episode)  # <= 0: every state
        self.keep_failing_seeds = bool(keep_failing_seeds)
        if self.seed_energy < 1:
            raise ValueError(f"curefuzz: seed_energy must be >= 1, got {seed_energy!r}")
        if min(self.w_return, self.w_novelty, self.w_entropy) < 0:
            raise ValueError("curefuzz: the selection weights w_return, w_novelty, w_entropy must be >= 0")
        if self.threshold_mode not in ("relative", "absolute"):
            raise ValueError(f"curefuzz: threshold_mode must be 'relative' or 'absolute', got {threshold_mode!r}")
        if not (0 < self.reference_rate <= 1):
            raise ValueError(f"curefuzz: reference_rate must be in (0, 1], got {reference_rate!r}")
        if self.rnd_updates_per_episode < 0:
            raise ValueError("curefuzz: rnd_updates_per_episode must be >= 0")
        if self.mutation_scale is not None and not (np.isfinite(self.mutation_scale) and self.mutation_scale >= 0):
            raise ValueError(f"curefuzz: mutation_scale must be a finite number >= 0, got {mutation_scale!r}")
        self.entropy_on = self.w_entropy > 0
        self.rnd = RND(scenario.obs_dim, hidden=rnd_hidden, out_dim=rnd_out, lr=rnd_lr, l2=rnd_l2,
                       batch_size=rnd_batch, seed=int(self.rng.integers(2**31 - 1)))
        self.corpus = Corpus(scenario.state_dim)
        self._final: dict[int, np.ndarray] = {}  # entropy on: corpus id -> final observation of its episode
        self._pending: list[int] = []  # sampling phase: corpus ids still waiting for their twin
        self.ref_novelty = float("nan")
        self.ref_entropy = float("nan")
        self.generation = 0
        self.last_observed: dict = {}
        self.counters = {k: 0 for k in ("episodes", "seeds", "twins", "mutants", "samples", "failures",
                                        "mutant_failures", "accepted", "accepted_return", "accepted_novelty",
                                        "accepted_entropy", "rejected", "exhausted")}

    # -- phases ------------------------------------------------------------------------------
    def start_phase(self, phase: str) -> None:
        super().start_phase(phase)
        if phase == "fuzzing":
            self._pending = []  # seeds without a twin take their entropy from their first mutant

    # -- proposing ---------------------------------------------------------------------------
    def propose(self, n: int) -> Proposal:
        n = int(n)
        if n < 0:
            raise ValueError(f"propose: n must be >= 0, got {n}")
        if self.phase == "sampling":
            return self._propose_sampling(n)
        return self._propose_fuzzing(n)

    def _mutate(self, states: np.ndarray) -> np.ndarray:
        return self.scenario.mutate(states, self.rng, self.mutation_scale)

    def _propose_sampling(self, n: int) -> Proposal:
        twins = []
        while self._pending and len(twins) < n:
            sid = self._pending.pop(0)
            if self.corpus.index_of([sid])[0] >= 0:
                twins.append(sid)
        twin_ids = np.asarray(twins, dtype=np.int64)
        empty = np.zeros((0, self.scenario.state_dim))
        twin_states = self._mutate(self.corpus.states[self.corpus.index_of(twin_ids)]) if twins else empty
        fresh = self.scenario.sample(self.rng, n - len(twins)) if n > len(twins) else empty
        return self._proposal(np.concatenate([twin_states, fresh]),
                              ["twin"] * len(twins) + ["seed"] * (n - len(twins)),
                              np.concatenate([twin_ids, np.full(n - len(twins), -1, np.int64)]),
                              np.full(n, np.nan))

    def _propose_fuzzing(self, n: int) -> Proposal:
        parents, parent_states, parent_returns = self._select(n)
        k = parents.size
        mutants = self._mutate(parent_states) if k else np.zeros((0, self.scenario.state_dim))
        fresh = self.scenario.sample(self.rng, n - k) if n > k else np.zeros((0, self.scenario.state_dim))
        return self._proposal(np.concatenate([mutants, fresh]), ["mutant"] * k + ["sample"] * (n - k),
                              np.concatenate([parents, np.full(n - k, -1, np.int64)]),
                              np.concatenate([parent_returns, np.full(n - k, np.nan)]))

    @staticmethod
    def _proposal(states, kinds, parents, parent_returns) -> Proposal:
        return Proposal(np.asarray(states, dtype=np.float64),
                        {"kind": np.asarray(kinds, dtype="<U6"), "parent": np.asarray(parents, dtype=np.int64),
                         "parent_return": np.asarray(parent_returns, dtype=np.float64)})

    # -- seed selection ----------------------------------------------------------------------
    def selection_weights(self) -> np.ndarray:
        """The multi-objective energy of every corpus seed (also stored in ``corpus.energy``):
        ``w_return·low_return + w_novelty·curiosity + w_entropy·entropy + floor``, each term
        min–max normalised over the corpus to [0, 1]; a small floor keeps every seed selectable."""
        c = self.corpus
        if len(c) == 0:
            return np.zeros(0)

        def minmax(v, high_is_good=True):
            v = np.asarray(v, dtype=np.float64)
            ok = np.isfinite(v)
            if not ok.any():
                return np.zeros(v.shape)
            v = np.where(ok, v, np.median(v[ok]))  # unmeasured: a typical seed
            lo, hi = v.min(), v.max()
            if hi - lo <= 1e-12 * max(1.0, abs(hi)):
                return np.zeros(v.shape)
            f = (v - lo) / (hi - lo)
            return f if high_is_good else 1.0 - f

        w = self.w_return * minmax(c.scores["return"], high_is_good=False)
        w = w + self.w_novelty * minmax(c.scores["novelty_rel"])
        if self.entropy_on:
            w = w + self.w_entropy * minmax(c.scores["entropy"])
        total = self.w_return + self.w_novelty + (self.w_entropy if self.entropy_on else 0.0)
        w = w + 0.01 * (total if total > 0 else 1.0)
        c.energy = w
        return w

    def _select(self, k: int):
        """k parents, each draw ∝ energy; a seed is drawn at most as often as its budget allows
        within a generation; spent seeds leave the corpus. Returns ids, states, returns (fewer
        than k when the corpus runs dry)."""
        ids, states, rets = [], [], []
        need = k
        while need > 0 and len(self.corpus) > 0:
            c = self.corpus
            self.selection_weights()
            idx = c.select(self.rng, need)
            count = c.scores["count"]
            order = np.argsort(idx, kind="stable")
            s = idx[order]
            first = np.r_[True, s[1:] != s[:-1]]
            start = np.maximum.accumulate(np.where(first, np.arange(s.size), 0))
            occurrence = np.empty_like(idx)
            occurrence[order] = np.arange(s.size) - start
            take = idx[occurrence < count[idx]]
            ids.append(c.ids[take])
            states.append(c.states[take])
            rets.append(c.scores["return"][take])
            need -= take.size
            used = np.bincount(take, minlength=len(c))
            count[:] = count - used
            spent = c.ids[count <= 0]
            if spent.size:
                self.counters["exhausted"] += int(spent.size)
                c.remove(spent)
        if not ids:
            return np.zeros(0, np.int64), np.zeros((0, self.scenario.state_dim)), np.zeros(0)
        return np.concatenate(ids), np.concatenate(states), np.concatenate(rets)

    # -- observing ---------------------------------------------------------------------------
    def _update_reference(self, ref: float, values: np.ndarray) -> float:
        v = values[np.isfinite(values)]
        if v.size == 0:
            return ref
        med = float(np.median(v))
        if not np.isfinite(ref):
            return med
        a = 1.0 - (1.0 - self.reference_rate) ** v.size
        return (1.0 - a) * ref + a * med

    def _entropy(self, final: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """Distance between each episode's final observation and its parent's, both standardised
        by the RND normaliser (NaN where the parent's final observation is not known)."""
        out = np.full(parents.shape, np.nan)
        known = np.array([int(p) in self._final for p in parents], dtype=bool)
        if known.any():
            theirs = np.stack([self._final[int(p)] for p in parents[known]])
            diff = self.rnd.normalize(final[known]) - self.rnd.normalize(theirs)
            out[known] = np.sqrt((diff.astype(np.float64) ** 2).sum(axis=1))
        return out

    def observe(self, proposal: Proposal, feedback: Feedback) -> None:
        n = len(proposal)
        if n == 0:
            return
        if len(feedback.returns) != n or len(feedback.traj_obs) != n:
            raise ValueError(f"curefuzz: feedback for {len(feedback.returns)} episodes, proposal of {n}")
        kinds = proposal.tags.get("kind", np.full(n, "sample"))
        parents = proposal.tags.get("parent", np.full(n, -1, np.int64)).astype(np.int64)
        parent_ret = proposal.tags.get("parent_return", np.full(n, np.nan)).astype(np.float64)
        returns = np.asarray(feedback.returns, dtype=np.float64)
        failure = np.asarray(feedback.failure, dtype=bool)
        trajs, final, visited = self._visited(feedback)
        first = self.rnd.count == 0
        if first:  # standardise from the very first states on
            self.rnd.update_normalizer(visited)

        # curiosity of every episode, before the predictor learns from this generation
        novelty = self.rnd.trajectory_novelty(trajs)
        self.ref_novelty = self._update_reference(self.ref_novelty, novelty)
        novelty_rel = novelty / max(self.ref_novelty, 1e-12)
        entropy, entropy_rel = self._episode_entropy(final, parents, n)

        for kind in ("seed", "twin", "mutant", "sample"):
            self.counters[kind + "s"] += int(np.sum(kinds == kind))
        self.counters["episodes"] += n
        self.counters["failures"] += int(failure.sum())
        # twins and mutants measure their parent's entropy (the first measurement counts)
        if self.entropy_on and len(self.corpus):
            self._record_parent_entropy(parents, entropy_rel)

        # new corpus members: non-failing seeds, and mutants that pass the CureFuzz rule
        rel = self.threshold_mode == "relative"
        is_seed = np.isin(kinds, _SEED_KINDS) & (~failure | self.keep_failing_seeds)
        is_mut = kinds == "mutant"
        lower, curious, entropic, accept = self._accept_mutants(
            is_mut, failure, returns < parent_ret, novelty_rel if rel else novelty, entropy_rel if rel else entropy)
        add = is_seed | accept
        # the generation's per-episode scores, for logging and inspection
        self.last_observed = {"kind": kinds, "return": returns, "failure": failure, "novelty": novelty,
                              "novelty_rel": novelty_rel, "entropy": entropy, "entropy_rel": entropy_rel,
                              "lower_return": lower, "curious": curious, "entropic": entropic,
                              "accepted": accept, "added": add}
        if add.any():
            self._add_to_corpus(proposal.states[add], kinds[add], is_mut[add], final[add], parents[add], **{
                "return": returns[add], "novelty": novelty[add], "novelty_rel": novelty_rel[add],
                "entropy_rel": entropy_rel[add]})
        # keep final observations of corpus seeds only
        if len(self._final) > len(self.corpus):
            live = set(self.corpus.ids.tolist())
            self._final = {k: v for k, v in self._final.items() if k in live}
        self._learn(visited, first, n)

    def _visited(self, feedback: Feedback):
        """(the trajectories thinned to ``rnd_states_per_episode`` states, each episode's final
        observation, all thinned states in one array)."""
        trajs = [np.asarray(t, dtype=np.float32).reshape(-1, self.scenario.obs_dim) for t in feedback.traj_obs]
        final = np.stack([t[-1] if len(t) else np.zeros(self.scenario.obs_dim, np.float32) for t in trajs])
        trajs = evenly_spaced(trajs, self.rnd_states_per_episode)
        return trajs, final, np.concatenate(trajs, axis=0)

    def _episode_entropy(self, final: np.ndarray, parents: np.ndarray, n: int):
        """(raw, relative) entropy of every episode that has a parent (NaN elsewhere, or all NaN
        when the entropy objective is off); updates the running reference."""
        entropy = np.full(n, np.nan)
        entropy_rel = np.full(n, np.nan)
        if self.entropy_on:
            has_parent = parents >= 0
            if has_parent.any():
                entropy[has_parent] = self._entropy(final[has_parent], parents[has_parent])
            self.ref_entropy = self._update_reference(self.ref_entropy, entropy)
            entropy_rel = entropy / max(self.ref_entropy, 1e-12)
        return entropy, entropy_rel

    def _record_parent_entropy(self, parents: np.ndarray, entropy_rel: np.ndarray) -> None:
        """A corpus seed without an entropy takes the first one measured against it."""
        c = self.corpus
        rows = np.flatnonzero((parents >= 0) & np.isfinite(entropy_rel))
        j = c.index_of(parents[rows])
        ok = j >= 0
        rows, j = rows[ok], j[ok]
        _, first_of = np.unique(j, return_index=True)  # one measurement per parent: the first
        rows, j = rows[first_of], j[first_of]
        unset = ~np.isfinite(c.scores["entropy"][j])
        c.scores["entropy"][j[unset]] = entropy_rel[rows[unset]]

    def _accept_mutants(self, is_mut, failure, lowers_return, nov_score, ent_score):
        """CureFuzz's corpus rule for non-failing mutants: a lower return than the parent's,
        novelty above ``novelty_threshold`` or entropy above ``entropy_threshold``; counts the
        decisions. Returns the (lower, curious, entropic, accept) masks."""
        lower = is_mut & lowers_return
        curious = is_mut & (nov_score > self.novelty_threshold)
        entropic = is_mut & (ent_score > self.entropy_threshold) if self.entropy_on else np.zeros(is_mut.size, bool)
        accept = is_mut & ~failure & (lower | curious | entropic)
        self.counters["mutant_failures"] += int(np.sum(is_mut & failure))
        self.counters["accepted"] += int(accept.sum())
        self.counters["accepted_return"] += int(np.sum(accept & lower))
        self.counters["accepted_novelty"] += int(np.sum(accept & curious))
        self.counters["accepted_entropy"] += int(np.sum(accept & entropic))
        self.counters["rejected"] += int(np.sum(is_mut & ~failure & ~accept))
        return lower, curious, entropic, accept

    def _add_to_corpus(self, states, kinds, is_mut, final, parents, *, entropy_rel, **scores) -> None:
        """New corpus seeds with a fresh energy budget (mutants keep their measured entropy);
        with entropy on, remember their final observations and, while sampling, owe seeds a twin."""
        new_ids = self.corpus.add(states, energy=1.0, **{
            **scores, "entropy": np.where(is_mut, entropy_rel, np.nan),
            "count": float(self.seed_energy), "parent": parents.astype(np.float64),
            "generation": float(self.generation)})
        if self.entropy_on:
            for sid, f in zip(new_ids, final):
                self._final[int(sid)] = f
            if self.phase == "sampling":
                self._pending.extend(int(s) for s, k in zip(new_ids, kinds) if k == "seed")

    def _learn(self, visited: np.ndarray, first: bool, n: int) -> None:
        """The predictor learns the generation's visited states."""
        if not first:
            self.rnd.update_normalizer(visited)
        steps = math.ceil(self.rnd_updates_per_episode * n)
        if steps:
            self.rnd.train(visited, steps=steps)
        self.generation += 1

    # -- logging and snapshots -------------------------------------------------------------
    def stats(self) -> dict:
        c = self.corpus
        out = {"phase": self.phase, "generation": self.generation, "corpus_size": len(c),
               "corpus_mean_return": c.mean("return") if len(c) else float("nan"),
               "corpus_mean_novelty_rel": c.mean("novelty_rel") if len(c) else float("nan"),
               "ref_novelty": self.ref_novelty, "ref_entropy": self.ref_entropy,
               "pending_twins": len(self._pending), "rnd_loss": self.rnd.last_loss,
               "rnd_steps": self.rnd.train_steps}
        out.update(self.counters)
        return out

    def state_dict(self) -> dict:
        d = super().state_dict()
        ids = np.array(sorted(self._final), dtype=np.int64)
        d.update({
            "corpus": self.corpus.state_dict(),
            "rnd": self.rnd.state_dict(),
            "final_ids": ids,
            "final_obs": np.stack([self._final[i] for i in ids]) if ids.size else
            np.zeros((0, self.scenario.obs_dim), np.float32),
            "pending": list(self._pending),
            "ref_novelty": self.ref_novelty, "ref_entropy": self.ref_entropy,
            "generation": self.generation, "counters": dict(self.counters),
        })
        return d

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.corpus.load_state_dict(state["corpus"])
        self.rnd.load_state_dict(state["rnd"])
        self._final = {int(i): np.array(f) for i, f in zip(state["final_ids"], state["final_obs"])}
        self._pending = list(state["pending"])
        self.ref_novelty, self.ref_entropy = float(state["ref_novelty"]), float(state["ref_entropy"])
        self.generation = int(state["generation"])
        self.counters = dict(state["counters"])
