"""MDPFuzz (Pang, Yuan and Wang, ISSTA 2022): sensitivity-prioritised fuzzing with GMM "freshness".

One file on purpose: the online GMM (DynEM), the trajectory density and the fuzzer read top to
bottom like the paper's Algorithm 1 and its freshness model.

The paper's Algorithm 1, as deltarl runs it in generations (``n = 1`` is the serial algorithm):

*Sampling phase.* Every seed ``s`` comes from ``scenario.sample``; a perturbed *twin*
``s + δ`` (``scenario.mutate`` with ``twin_scale``, by default the mutation's scale) is run
too, and the seed's sensitivity is the paper's Eq. 1, ``|R(s) − R(s + δ)| / ‖δ‖₂`` (‖δ‖ in
units of the bounds' widths; ``sensitivity_norm=False`` drops the divisor, as the authors'
ACAS Xu code does). The seed's trajectory gets its
density under the GMMs (below). The seed enters the corpus with energy = sensitivity
(selection probability ∝ sensitivity).

*Fuzzing phase.* Select a seed with probability ∝ sensitivity, mutate it (``mutation_scale``),
run the mutant ``s'``. A failing mutant is a result, not a seed. Otherwise the mutant is kept
when ``R(s') < R(s)`` (it lowers the return) **or** when its trajectory density is below ``τ``
(it is *fresh*). A kept mutant needs its own sensitivity: its twin ``s' + δ'`` is proposed at
the start of the next generation, and the mutant enters the corpus once the twin has run.

*Freshness.* Two Gaussian mixtures of ``K`` components model what the AUT has visited: ``G_s``
over single observations and ``G_c`` over consecutive pairs ``(o_t ‖ o_{t+1})``. The density
of a trajectory ``o_0 … o_T`` is ``p_s(o_0) · Π_t p_c(o_t ‖ o_{t+1}) / p_s(o_t)`` (the chain
rule with ``p(o_{t+1} | o_t) = p_c / p_s``), computed in log space. A trajectory whose density
is below ``τ`` updates both mixtures with DynEM: stepwise (online) EM over its observations
(resp. pairs) with step size ``γ``. Twins are not scored and do not update the mixtures.
Within one generation every trajectory is scored with the mixtures as they stood when
``observe`` was called, then the fresh ones update them in proposal order (``n = 1``: one
trajectory at a time, as in the paper).

Auxiliary episodes are tagged: ``Proposal.tags["kind"]`` is ``"seed"``, ``"twin"`` or
``"mutant"``; ``"pair"`` links a twin to its seed or mutant; ``"parent"`` is the corpus id a
mutant was made from (-1 otherwise). Every episode, twins included, is an AUT trajectory and
counts against the budget.

Differences to the paper and to the authors' code are listed in ``docs/fuzzers.md``; the
``budget_per_seed``, ``drop_parent_on_failure``, ``replace_parent``,
``mutant_sensitivity="parent"``, ``pdf_floor`` and ``ratio_cap`` parameters switch to the
public code's behaviour where it differs from the paper. Beside the PyPI ``mdpfuzz`` 0.0.3 (the
replication study's code) on the same inputs, this fuzzer makes the same decisions
(``benchmarks/peer_mdpfuzz.py --lockstep``; docs/fuzzers.md, "Beside the PyPI package").
"""

from __future__ import annotations

import contextlib
import copy
import math

import numpy as np

from orchestrator.fuzzers.base import Feedback, Fuzzer, Proposal
from orchestrator.fuzzers.corpus import Corpus

_LOG_2PI = math.log(2.0 * math.pi)
_KINDS = ("seed", "twin", "mutant")
_BLAS = []  # lazily: [threadpoolctl controller or None]


def _one_blas_thread():
    """Run the GMM's tall-and-skinny matrix products on one BLAS thread.

    On a busy machine (rollout workers, training) multi-threaded OpenBLAS was measured 3-14x
    slower than one thread on these shapes (N x d times d x K·d, d <= 22); the matrices are too
    thin for threads to pay off. Uses threadpoolctl when installed (it comes with scikit-learn).
    """
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS.append(ThreadpoolController())
        except ImportError:  # threadpoolctl is optional (it comes with scikit-learn)
            _BLAS.append(None)
    ctl = _BLAS[0]
    return ctl.limit(limits=1, user_api="blas") if ctl is not None else contextlib.nullcontext()


def logsumexp_rows(a: np.ndarray) -> np.ndarray:
    """``log Σ_k exp(a[:, k])`` per row; rows of all ``-inf`` give ``-inf``."""
    if a.shape[1] == 0:
        return np.full(a.shape[0], -np.inf)
    m = a.max(axis=1)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    t = a - m_safe[:, None]
    with np.errstate(divide="ignore", under="ignore"):
        np.exp(t, out=t)
        return m_safe + np.log(t.sum(axis=1))


class OnlineGMM:
    """A Gaussian mixture fitted by stepwise (online) EM — MDPFuzz's DynEM — in log space.

    Sufficient statistics per component ``k``: ``S0_k`` (mass), ``S1_k`` (first moment),
    ``S2_k`` (second moment). One online-EM step on a sample ``x`` with responsibilities
    ``r_k`` is ``S ← (1 − γ) S + γ r_k · (1, x, x xᵀ)``, then ``w_k = S0_k / Σ S0``,
    ``μ_k = S1_k / S0_k``, ``Σ_k = S2_k / S0_k − μ_k μ_kᵀ`` (eigenvalues floored at
    ``cov_floor``). :meth:`update` applies that recursion to a whole sequence of samples in
    closed form (each sample's weight is ``γ (1 − γ)^(rows after it)``), with the
    responsibilities of all its samples computed from the parameters as they stood before
    the sequence. Samples older than about ``log(1e-17) / log(1 − γ)`` rows weigh less than
    1e-17 of the newest and are skipped (exact to double precision).

    Densities are computed with one Cholesky factor per component, refreshed once per update:
    ``log N(x; μ, Σ) = −½‖L⁻¹(x − μ)‖² − Σ log diag L − (d/2) log 2π``, for a whole batch of
    samples with one matrix product. All statistics live in coordinates centred on
    ``offset`` (the mean of the initial means) to limit cancellation in ``S2/S0 − μμᵀ``.

    ``pdf_floor > 0`` adds that constant to every weighted component density ``w_k N_k(x)``
    (in the densities and the responsibilities), as the authors' code does with 1e-5.
    """

    def __init__(self, n_components: int, dim: int, *, gamma: float = 0.01, cov_floor: float = 1e-3,
                 pdf_floor: float = 0.0, chunk_rows: int = 2048):
        self.k = int(n_components)
        self.dim = int(dim)
        self.gamma = float(gamma)
        self.cov_floor = float(cov_floor)
        self.pdf_floor = float(pdf_floor)
        self.chunk_rows = int(chunk_rows)
        if self.k < 1 or self.dim < 1:
            raise ValueError(f"a GMM needs >= 1 component and dimension >= 1, got K={self.k}, d={self.dim}")
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {gamma!r}")
        self.offset = np.zeros(self.dim)
        self.s0 = np.full(self.k, 1.0 / self.k)
        self.s1 = np.zeros((self.k, self.dim))
        self.s2 = np.tile(np.eye(self.dim), (self.k, 1, 1)) / self.k
        self.weights = np.full(self.k, 1.0 / self.k)
        self.means_c = np.zeros((self.k, self.dim))  # centred on offset
        self.covs = np.tile(np.eye(self.dim), (self.k, 1, 1))
        self.n_updates = 0  # update() calls (sequences or batches of sequences)
        self.n_samples = 0  # samples fed to update()
        self.initialized = False
        self._refresh()

    # -- parameters ----------------------------------------------------------------------------
    @property
    def means(self) -> np.ndarray:
        return self.means_c + self.offset

    def initialize(self, means: np.ndarray, cov: float = 1.0) -> None:
        """Means from ``means`` (rows cycled when fewer than K), covariances ``cov·I``, weights 1/K."""
        means = np.asarray(means, dtype=np.float64).reshape(-1, self.dim)
        if means.shape[0] == 0:
            raise ValueError("GMM initialisation needs at least one sample")
        means = means[np.arange(self.k) % means.shape[0]]
        covs = np.tile(np.eye(self.dim) * float(cov), (self.k, 1, 1))
        self.set_params(np.full(self.k, 1.0 / self.k), means, covs)

    def set_params(self, weights, means, covs, offset=None) -> None:
        """Set the mixture directly (statistics are made consistent with it)."""
        w = np.asarray(weights, dtype=np.float64).reshape(self.k)
        mu = np.asarray(means, dtype=np.float64).reshape(self.k, self.dim)
        cov = np.asarray(covs, dtype=np.float64).reshape(self.k, self.dim, self.dim)
        self.offset = mu.mean(axis=0) if offset is None else np.asarray(offset, dtype=np.float64).reshape(self.dim)
        w = w / w.sum()
        self.weights = w
        self.means_c = mu - self.offset
        self.covs = self._floor_cov(cov)
        self.s0 = w.copy()
        self.s1 = w[:, None] * self.means_c
        self.s2 = w[:, None, None] * (self.covs + np.einsum("ki,kj->kij", self.means_c, self.means_c))
        self.initialized = True
        self._refresh()

    def _floor_cov(self, cov: np.ndarray) -> np.ndarray:
        cov = 0.5 * (cov + np.swapaxes(cov, -1, -2))
        vals, vecs = np.linalg.eigh(cov)
        vals = np.maximum(vals, self.cov_floor)
        return np.einsum("kij,kj,klj->kil", vecs, vals, vecs)

    def _refresh(self) -> None:
        """Cholesky factors, their inverses and the per-component constants (once per update)."""
        chol = np.linalg.cholesky(self.covs)  # (K, d, d) lower
        prec = np.linalg.inv(chol)  # L⁻¹: z = L⁻¹ (x − μ)
        proj = np.swapaxes(prec, 1, 2).transpose(1, 0, 2).reshape(self.dim, self.k * self.dim)  # blocks L_k⁻ᵀ
        shift = np.einsum("kij,kj->ki", prec, self.means_c).reshape(-1)  # L_k⁻¹ μ_k (centred)
        self._proj = np.ascontiguousarray(proj)
        self._bias = -(self.offset @ proj) - shift  # z = x @ proj + bias = L⁻¹ (x − offset − μ_c)
        with np.errstate(divide="ignore"):
            logw = np.log(self.weights)
        self._const = logw - np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1) - 0.5 * self.dim * _LOG_2PI
        self._log_floor = math.log(self.pdf_floor) if self.pdf_floor > 0 else None

    # -- densities -----------------------------------------------------------------------------
    def log_components(self, x: np.ndarray) -> np.ndarray:
        """``log(w_k N(x; μ_k, Σ_k) [+ pdf_floor])`` for every row and component: (N, K)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.dim)
        out = np.empty((x.shape[0], self.k))
        with _one_blas_thread():
            for a in range(0, x.shape[0], self.chunk_rows):
                z = x[a:a + self.chunk_rows] @ self._proj
                z += self._bias
                z = z.reshape(z.shape[0], self.k, self.dim)
                np.einsum("nkd,nkd->nk", z, z, out=out[a:a + z.shape[0]])
        out *= -0.5
        out += self._const
        if self._log_floor is not None:
            out = np.logaddexp(out, self._log_floor)
        return out

    def log_pdf(self, x: np.ndarray, log_comp: np.ndarray | None = None) -> np.ndarray:
        """Mixture log-density per row."""
        return logsumexp_rows(self.log_components(x) if log_comp is None else log_comp)

    @staticmethod
    def responsibilities(log_comp: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", under="ignore"):
            r = np.exp(log_comp - logsumexp_rows(log_comp)[:, None])
        return np.nan_to_num(r, nan=1.0 / max(log_comp.shape[1], 1))

    # -- DynEM ---------------------------------------------------------------------------------
    @property
    def horizon(self) -> int:
        """Rows of a sequence that can still weigh more than 1e-17 of the newest."""
        return int(math.ceil(math.log(1e-17) / math.log1p(-self.gamma))) + 1

    def update(self, x: np.ndarray, log_comp: np.ndarray | None = None) -> None:
        """One online-EM step per row of ``x``, in row order (see the class docstring)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.dim)
        m = x.shape[0]
        if m == 0:
            return
        keep = min(m, self.horizon)
        xk = x[m - keep:] - self.offset
        lc = self.log_components(x[m - keep:]) if log_comp is None else np.asarray(log_comp)[m - keep:]
        r = self.responsibilities(lc)
        log_decay = math.log1p(-self.gamma)
        ages = np.arange(keep - 1, -1, -1, dtype=np.float64)
        a = self.gamma * np.exp(ages * log_decay)  # weight of each kept row after the whole sequence
        alpha = math.exp(m * log_decay)  # what is left of the old statistics
        wr = r * a[:, None]  # (keep, K)
        self.s0 = alpha * self.s0 + wr.sum(axis=0)
        self.s1 = alpha * self.s1 + wr.T @ xk
        s2 = np.empty_like(self.s2)
        with _one_blas_thread():
            for k in range(self.k):
                s2[k] = (xk * wr[:, k:k + 1]).T @ xk
        self.s2 = alpha * self.s2 + s2
        self._m_step()
        self.n_updates += 1
        self.n_samples += m

    def _m_step(self) -> None:
        total = self.s0.sum()
        ok = self.s0 > 1e-100 * max(total, 1e-300)
        if ok.any():
            mu = self.s1[ok] / self.s0[ok, None]
            cov = self.s2[ok] / self.s0[ok, None, None] - np.einsum("ki,kj->kij", mu, mu)
            good = np.isfinite(mu).all(axis=1) & np.isfinite(cov).all(axis=(1, 2))
            idx = np.flatnonzero(ok)[good]
            self.means_c[idx] = mu[good]
            self.covs[idx] = self._floor_cov(cov[good])
        # components with no mass keep their last mean/covariance and get weight ~0
        self.weights = self.s0 / total
        self._refresh()

    # -- snapshots -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"k": self.k, "dim": self.dim, "gamma": self.gamma, "cov_floor": self.cov_floor,
                "pdf_floor": self.pdf_floor, "offset": self.offset.copy(), "s0": self.s0.copy(),
                "s1": self.s1.copy(), "s2": self.s2.copy(), "weights": self.weights.copy(),
                "means_c": self.means_c.copy(), "covs": self.covs.copy(), "n_updates": self.n_updates,
                "n_samples": self.n_samples, "initialized": self.initialized}

    @classmethod
    def from_state_dict(cls, d: dict) -> "OnlineGMM":
        g = cls(d["k"], d["dim"], gamma=d["gamma"], cov_floor=d["cov_floor"], pdf_floor=d["pdf_floor"])
        for name in ("offset", "s0", "s1", "s2", "weights", "means_c", "covs"):
            setattr(g, name, np.array(d[name], dtype=np.float64, copy=True))
        g.n_updates, g.n_samples, g.initialized = int(d["n_updates"]), int(d["n_samples"]), bool(d["initialized"])
        g._refresh()
        return g


def trajectory_log_density(gmm_s: OnlineGMM, gmm_c: OnlineGMM, trajs: list, *, ratio_cap: bool = False,
                           return_cache: bool = False):
    """MDPFuzz's density of each trajectory, in log space.

    ``log p(o_0 … o_T) = log p_s(o_0) + Σ_{t<T} [log p_c(o_t ‖ o_{t+1}) − log p_s(o_t)]``;
    ``ratio_cap`` caps each conditional ratio at 1 (the authors' code). With
    ``return_cache`` also returns ``(states, pairs, log_comp_s, log_comp_c, state_seg, pair_seg)``
    for a DynEM update without recomputing the densities.
    """
    n = len(trajs)
    lengths = np.array([len(t) for t in trajs], dtype=np.int64)
    if n == 0:
        empty = np.zeros(0)
        return (empty, None) if return_cache else empty
    if (lengths < 1).any():
        raise ValueError("every trajectory needs at least one observation")
    states = np.concatenate([np.asarray(t, dtype=np.float64).reshape(len(t), -1) for t in trajs])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    not_last = np.ones(states.shape[0], dtype=bool)
    not_last[ends - 1] = False
    first = np.flatnonzero(not_last)  # index of o_t for each pair (o_t, o_{t+1})
    pairs = np.concatenate([states[first], states[first + 1]], axis=1)
    lcs = gmm_s.log_components(states)
    lcc = gmm_c.log_components(pairs)
    ls = logsumexp_rows(lcs)
    lc = logsumexp_rows(lcc)
    term = lc - ls[first]
    if ratio_cap:
        term = np.minimum(term, 0.0)
    pair_seg = np.repeat(np.arange(n), lengths - 1)
    with np.errstate(invalid="ignore"):
        out = ls[starts] + np.bincount(pair_seg, weights=term, minlength=n)
    out = np.where(np.isnan(out), -np.inf, out)
    if not return_cache:
        return out
    state_seg = np.repeat(np.arange(n), lengths)
    return out, (states, pairs, lcs, lcc, state_seg, pair_seg)


class MDPFuzz(Fuzzer):
    """MDPFuzz: corpus weighted by sensitivity, kept mutants lower the return or are fresh."""

    name = "mdpfuzz"

    def __init__(self, scenario, seed: int = 0, *, gmm_k: int = 10, tau: float = 0.01, gamma: float = 0.01,
                 mutation_scale: float | None = None, twin_scale: float | None = None,
                 mutant_sensitivity: str = "twin", sensitivity_norm: bool = True,
                 budget_per_seed: int | None = None, drop_parent_on_failure: bool = False,
                 replace_parent: bool = False, keep_failing_seeds: bool = True, cov_floor: float = 1e-3,
                 init_cov: float = 1.0, pdf_floor: float = 0.0, ratio_cap: bool = False, **params):
        super().__init__(scenario, seed=seed, **params)
        self.gmm_k = int(gmm_k)
        self.tau = float(tau)
        self.gamma = float(gamma)
        self.mutation_scale = None if mutation_scale is None else float(mutation_scale)
        self.twin_scale = None if twin_scale is None else float(twin_scale)
        self.mutant_sensitivity = str(mutant_sensitivity)
        self.sensitivity_norm = bool(sensitivity_norm)
        self.budget_per_seed = None if budget_per_seed is None else int(budget_per_seed)
        self.drop_parent_on_failure = bool(drop_parent_on_failure)
        self.replace_parent = bool(replace_parent)
        self.keep_failing_seeds = bool(keep_failing_seeds)
        self.cov_floor = float(cov_floor)
        self.init_cov = float(init_cov)
        self.pdf_floor = float(pdf_floor)
        self.ratio_cap = bool(ratio_cap)
        self._check_params()
        self.log_tau = math.log(self.tau)

        self.corpus = Corpus(scenario.state_dim)
        self.gmm_s: OnlineGMM | None = None  # built on the first scored trajectory
        self.gmm_c: OnlineGMM | None = None
        self._queue: list[int] = []  # pair ids whose twin is still to be proposed (FIFO)
        self._open: dict[int, dict] = {}  # pair id -> seed/kept mutant waiting for its sensitivity
        self._next_pair = 0
        self._counters = {f"episodes_{k}": 0 for k in _KINDS}
        self._counters.update({f"failures_{k}": 0 for k in _KINDS})
        self._counters.update({"accepted": 0, "accepted_by_return": 0, "accepted_by_freshness": 0,
                               "fresh_trajectories": 0, "scored_trajectories": 0, "corpus_added": 0,
                               "corpus_removed": 0, "generations": 0})
        self._last_log_density = float("nan")

    def _check_params(self) -> None:
        def bad(msg):
            raise ValueError(f"mdpfuzz: {msg}")

        if self.gmm_k < 1:
            bad(f"gmm_k must be >= 1, got {self.gmm_k}")
        if not (self.tau > 0 and math.isfinite(self.tau)):
            bad(f"tau must be a finite number > 0, got {self.tau}")
        if not 0.0 < self.gamma < 1.0:
            bad(f"gamma must be in (0, 1), got {self.gamma}")
        for name in ("mutation_scale", "twin_scale"):
            v = getattr(self, name)
            if v is not None and not (v >= 0 and math.isfinite(v)):
                bad(f"{name} must be a finite number >= 0 or None, got {v}")
        if self.mutant_sensitivity not in ("twin", "parent"):
            bad(f"mutant_sensitivity must be 'twin' or 'parent', got {self.mutant_sensitivity!r}")
        if self.budget_per_seed is not None and self.budget_per_seed < 1:
            bad(f"budget_per_seed must be >= 1 or None, got {self.budget_per_seed}")
        if not (self.cov_floor > 0 and math.isfinite(self.cov_floor)):
            bad(f"cov_floor must be a finite number > 0, got {self.cov_floor}")
        if not (self.init_cov > 0 and math.isfinite(self.init_cov)):
            bad(f"init_cov must be a finite number > 0, got {self.init_cov}")
        if not (self.pdf_floor >= 0 and math.isfinite(self.pdf_floor)):
            bad(f"pdf_floor must be a finite number >= 0, got {self.pdf_floor}")

    # -- proposing -----------------------------------------------------------------------------
    def propose(self, n: int) -> Proposal:
        n = int(n)
        if n < 0:
            raise ValueError(f"propose: n must be >= 0, got {n}")
        sc = self.scenario
        twin_scale = self.twin_scale if self.twin_scale is not None else self.mutation_scale
        states, kinds, pairs, parents, parent_ret, delta, operators = [], [], [], [], [], [], []

        def emit(s, kind, pair, parent=-1, pret=np.nan, dn=np.nan, op=""):
            operators.append(op)
            states.append(s)
            kinds.append(kind)
            pairs.append(pair)
            parents.append(parent)
            parent_ret.append(pret)
            delta.append(dn)

        # 1. twins still owed (seeds whose twin did not fit, kept mutants)
        take, self._queue = self._queue[:n], self._queue[n:]
        if take:
            prim = np.stack([self._open[p]["state"] for p in take])
            twins = sc.mutate(prim, self.rng, twin_scale)
            for p, t in zip(take, twins):
                emit(t, "twin", p)
        r = n - len(take)
        # 2. new seeds (sampling phase, or an empty corpus) with their twins right after them
        if r > 0 and (self.phase == "sampling" or len(self.corpus) == 0):
            m = (r + 1) // 2
            seeds = sc.sample(self.rng, m)
            twins = sc.mutate(seeds[: r // 2], self.rng, twin_scale) if r // 2 else np.zeros((0, sc.state_dim))
            for i, s in enumerate(seeds):
                p = self._new_pair()
                self._open[p] = {"kind": "seed", "state": np.array(s, dtype=np.float64), "parent": -1,
                                 "ret": None, "log_density": None, "failure": None, "twin_ret": None,
                                 "twin_state": None}
                emit(s, "seed", p)
                if i < twins.shape[0]:
                    emit(twins[i], "twin", p)
                else:
                    self._queue.append(p)
        # 3. mutants of seeds chosen with probability ∝ sensitivity
        elif r > 0:
            idx = self.corpus.select(self.rng, r)
            parent_states = self.corpus.states[idx]
            ids = self.corpus.ids[idx]
            rets = self.corpus.scores["return"][idx]
            mutants, ops = self._mutate_parents(parent_states, ids, rets)
            dn = self._delta_norm(mutants, parent_states)
            for i in range(r):
                emit(mutants[i], "mutant", self._new_pair(), int(ids[i]), float(rets[i]), float(dn[i]), ops[i])
            if self.budget_per_seed is not None:
                self._spend_budget(idx)
        st = np.asarray(states, dtype=np.float64).reshape(-1, sc.state_dim)
        tags = {"kind": np.asarray(kinds, dtype="<U6"), "pair": np.asarray(pairs, dtype=np.int64),
                "parent": np.asarray(parents, dtype=np.int64),
                "parent_return": np.asarray(parent_ret, dtype=np.float64),
                "delta_norm": np.asarray(delta, dtype=np.float64),
                "operator": np.asarray(operators, dtype="<U16")}
        return Proposal(sc.validate(st) if st.shape[0] else st, tags)

    def _mutate_parents(self, parent_states: np.ndarray, ids: np.ndarray, returns: np.ndarray):
        """The mutation operator: mutants of the selected parents and, per mutant, the name of
        the operator that made it (MDPFuzz: the scenario's small Gaussian mutation)."""
        mutants = self.scenario.mutate(parent_states, self.rng, self.mutation_scale)
        return mutants, ["gaussian"] * len(mutants)

    def _new_pair(self) -> int:
        p = self._next_pair
        self._next_pair += 1
        return p

    def _delta_norm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Euclidean norm of a − b in units of the bounds' widths (fixed dimensions ignored)."""
        width = self.scenario.high - self.scenario.low
        live = width > 0
        d = (np.atleast_2d(a)[:, live] - np.atleast_2d(b)[:, live]) / width[live]
        return np.sqrt((d * d).sum(axis=1))

    def _sensitivity(self, r1: float, r2: float, delta_norm: float) -> float:
        s = abs(float(r1) - float(r2))
        if self.sensitivity_norm:
            s = s / delta_norm if delta_norm > 0 else 0.0
        return s

    def _spend_budget(self, idx: np.ndarray) -> None:
        spent = np.bincount(idx, minlength=len(self.corpus))
        left = self.corpus.scores["budget_left"] - spent
        self.corpus.scores["budget_left"] = left
        gone = self.corpus.ids[left <= 0]
        if gone.size:
            self.corpus.remove(gone)
            self._counters["corpus_removed"] += int(gone.size)

    # -- observing -----------------------------------------------------------------------------
    def observe(self, proposal: Proposal, feedback: Feedback) -> None:
        n = len(proposal)
        if "kind" not in proposal.tags or "pair" not in proposal.tags:
            raise ValueError("mdpfuzz.observe: the proposal lacks its 'kind'/'pair' tags (not made by propose)")
        if len(feedback.returns) != n or len(feedback.traj_obs) != n:
            raise ValueError(f"mdpfuzz.observe: {n} proposals but {len(feedback.returns)} episodes of feedback")
        kind, pair = proposal.tags["kind"], proposal.tags["pair"]
        returns = np.asarray(feedback.returns, dtype=np.float64)
        failure = np.asarray(feedback.failure, dtype=bool)
        self._counters["generations"] += 1
        for k in _KINDS:
            sel = kind == k
            self._counters[f"episodes_{k}"] += int(sel.sum())
            self._counters[f"failures_{k}"] += int((sel & failure).sum())

        # 1. density ("freshness") of every seed and mutant trajectory, with the GMMs as they stand
        prim = np.flatnonzero(kind != "twin")
        logd, cache = self._freshness([feedback.traj_obs[i] for i in prim])

        # 2. seeds and mutants, in proposal order
        for j, i in enumerate(prim):
            if kind[i] == "seed":
                self._seed_ran(int(pair[i]), returns[i], logd[j], failure[i])
            else:
                self._mutant_ran(proposal, i, returns[i], logd[j], failure[i])

        # 3. twins complete their seed's / mutant's record
        for i in np.flatnonzero(kind == "twin"):
            p = int(pair[i])
            rec = self._open.get(p)
            if rec is None:
                continue
            rec["twin_ret"] = float(returns[i])
            rec["twin_state"] = np.array(proposal.states[i], dtype=np.float64)
            self._maybe_finish(p)

        # 4. DynEM on the fresh trajectories (in proposal order)
        if cache is not None:
            self._dyn_em(logd, cache)

    def _freshness(self, trajs: list):
        """(log density of each trajectory, the densities' cache for DynEM); the GMMs are built
        from the first trajectories ever scored. ``(empty, None)`` without trajectories."""
        if not trajs:
            return np.zeros(0), None
        if self.gmm_s is None:
            self._init_gmms(trajs)
        logd, cache = trajectory_log_density(self.gmm_s, self.gmm_c, trajs, ratio_cap=self.ratio_cap,
                                             return_cache=True)
        self._counters["scored_trajectories"] += len(trajs)
        fin = logd[np.isfinite(logd)]
        self._last_log_density = float(fin.mean()) if fin.size else float("-inf")
        return logd, cache

    def _seed_ran(self, p: int, ret: float, log_density: float, failed: bool) -> None:
        """A seed's own episode: recorded; the seed joins the corpus once its twin ran too."""
        rec = self._open.get(p)
        if rec is None:
            return
        rec.update(ret=float(ret), log_density=float(log_density), failure=bool(failed))
        self._maybe_finish(p)

    def _mutant_ran(self, proposal: Proposal, i: int, ret: float, log_density: float, failed: bool) -> None:
        """A mutant is kept when it does not fail and lowers its parent's return or is fresh; a
        kept one waits for its sensitivity (its twin, or its parent with ``mutant_sensitivity="parent"``)."""
        p = int(proposal.tags["pair"][i])
        parent_id = int(proposal.tags["parent"][i])
        if failed:
            if self.drop_parent_on_failure:
                self._remove_ids([parent_id])
            return
        by_return = bool(ret < proposal.tags["parent_return"][i])
        fresh = bool(log_density < self.log_tau)
        if not (by_return or fresh):
            return
        self._counters["accepted"] += 1
        self._counters["accepted_by_return"] += int(by_return)
        self._counters["accepted_by_freshness"] += int(fresh)
        rec = {"kind": "mutant", "state": np.array(proposal.states[i], dtype=np.float64),
               "parent": parent_id, "ret": float(ret), "log_density": float(log_density),
               "failure": False, "twin_ret": None, "twin_state": None}
        if self.mutant_sensitivity == "parent":
            # the authors' code: the parent serves as the perturbed run (no extra episode)
            rec["twin_ret"] = float(proposal.tags["parent_return"][i])
            rec["delta_norm"] = float(proposal.tags["delta_norm"][i])
            self._open[p] = rec
            self._maybe_finish(p)
        else:
            self._open[p] = rec
            self._queue.append(p)

    def _dyn_em(self, logd: np.ndarray, cache) -> None:
        """Both mixtures learn the trajectories whose density is below τ, in proposal order."""
        fresh_rows = np.flatnonzero(logd < self.log_tau)
        self._counters["fresh_trajectories"] += int(fresh_rows.size)
        if fresh_rows.size:
            states, pairs_x, lcs, lcc, state_seg, pair_seg = cache
            ms = np.isin(state_seg, fresh_rows)
            mc = np.isin(pair_seg, fresh_rows)
            self.gmm_s.update(states[ms], lcs[ms])
            if mc.any():
                self.gmm_c.update(pairs_x[mc], lcc[mc])

    def _init_gmms(self, trajs: list) -> None:
        """K means from the first states (resp. consecutive pairs) seen; covariances init_cov·I."""
        states = np.concatenate([np.asarray(t, dtype=np.float64).reshape(len(t), -1) for t in trajs])
        d = states.shape[1]
        pairs = [np.concatenate([t[:-1], t[1:]], axis=1) for t in (np.asarray(t, dtype=np.float64) for t in trajs)
                 if len(t) > 1]
        pairs = np.concatenate(pairs) if pairs else np.concatenate([states, states], axis=1)
        kw = {"gamma": self.gamma, "cov_floor": self.cov_floor, "pdf_floor": self.pdf_floor}
        self.gmm_s = OnlineGMM(self.gmm_k, d, **kw)
        self.gmm_c = OnlineGMM(self.gmm_k, 2 * d, **kw)
        self.gmm_s.initialize(states[: self.gmm_k], cov=self.init_cov)
        self.gmm_c.initialize(pairs[: self.gmm_k], cov=self.init_cov)

    def _maybe_finish(self, p: int) -> None:
        rec = self._open[p]
        if rec["ret"] is None or rec["twin_ret"] is None:
            return
        del self._open[p]
        if rec["kind"] == "seed" and rec["failure"] and not self.keep_failing_seeds:
            return
        dn = rec.get("delta_norm")
        if dn is None:
            dn = float(self._delta_norm(rec["twin_state"], rec["state"])[0])
        sens = self._sensitivity(rec["ret"], rec["twin_ret"], dn)
        if rec["kind"] == "mutant" and self.replace_parent:
            self._remove_ids([rec["parent"]])
        scores = {"return": rec["ret"], "sensitivity": sens, "log_density": rec["log_density"],
                  "parent": float(rec["parent"])}
        if self.budget_per_seed is not None:
            scores["budget_left"] = float(self.budget_per_seed)
        self.corpus.add(rec["state"][None, :], energy=sens, **scores)
        self._counters["corpus_added"] += 1

    def _remove_ids(self, ids) -> None:
        ids = np.asarray([i for i in ids if i >= 0], dtype=np.int64)
        present = ids[self.corpus.index_of(ids) >= 0] if ids.size and len(self.corpus) else ids[:0]
        if present.size:
            self.corpus.remove(present)
            self._counters["corpus_removed"] += int(present.size)

    # -- reporting and snapshots ---------------------------------------------------------------
    def stats(self) -> dict:
        """Flat summary for logging."""
        out = {"phase": self.phase, "corpus_size": len(self.corpus),
               "mean_sensitivity": self.corpus.mean("sensitivity"),
               "max_sensitivity": float(np.nanmax(self.corpus.scores["sensitivity"]))
               if len(self.corpus) and np.isfinite(self.corpus.scores["sensitivity"]).any() else float("nan"),
               "mean_return": self.corpus.mean("return"),
               "pending_twins": len(self._queue), "awaiting_sensitivity": len(self._open),
               "gmm_updates": self.gmm_s.n_updates if self.gmm_s is not None else 0,
               "gmm_samples": self.gmm_s.n_samples if self.gmm_s is not None else 0,
               "last_mean_log_density": self._last_log_density}
        out.update(self._counters)
        return out

    def state_dict(self) -> dict:
        d = super().state_dict()
        d.update({"corpus": self.corpus.state_dict(),
                  "gmm_s": None if self.gmm_s is None else self.gmm_s.state_dict(),
                  "gmm_c": None if self.gmm_c is None else self.gmm_c.state_dict(),
                  "queue": list(self._queue), "open": copy.deepcopy(self._open), "next_pair": self._next_pair,
                  "counters": dict(self._counters), "last_log_density": self._last_log_density})
        return d

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.corpus.load_state_dict(state["corpus"])
        self.gmm_s = None if state["gmm_s"] is None else OnlineGMM.from_state_dict(state["gmm_s"])
        self.gmm_c = None if state["gmm_c"] is None else OnlineGMM.from_state_dict(state["gmm_c"])
        self._queue = [int(p) for p in state["queue"]]
        self._open = copy.deepcopy(state["open"])
        self._next_pair = int(state["next_pair"])
        self._counters = dict(state["counters"])
        self._last_log_density = float(state["last_log_density"])
