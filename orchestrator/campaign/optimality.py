"""Optimality testing (Delta phase 3): differential fuzzing of AUT vs challenger.

    run_optimality(campaign)               # in campaign.output, after safety and challenger
    run_optimality(campaign, resume=True)  # continue from the last generation snapshot

The phase runs in the generation loop (:mod:`orchestrator.campaign.generations`); what it adds:
both agents run from the proposed states (``repeats`` rollouts each, with the same episode
seeds: common random numbers) → the oracle judges every state
(:mod:`orchestrator.fuzzers.oracles`) → the fuzzer observes (Delta reads both agents; a safety
fuzzer used as a baseline reads the AUT's episodes only) → the episodes of both roles go to the
run's Parquet store (phase ``optimality``, ``bug`` flag per episode) → ``bugs.parquet``, written
whole before each snapshot (``snapshots/opt-NNNNNN.pkl``).

The budget counts *test cases* (initial states), each run by both agents (``repeats`` times
each). A bug row holds the initial state, both (mean) returns, the p-value (statistical
oracle), the generation's seed and the state's index in it (``deltarl replay`` re-runs it with
exactly these episode seeds), the episode ids of both agents' trajectories in the store, and
both policies' sha256.

Metrics (Tables 2–4): bugs, distinct bugs (grid cells of the bug initial states, the
scenario's intervals), distance (mean pairwise Euclidean distance between bug initial states in
raw state units, the paper's scale) and ``distance_normalized`` (the same after min–max
normalising every dimension by the scenario's initial-state bounds). A fuzzer that reports
decision shares (Delta: how often each energy term decided the chosen seed) adds them to the
summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from orchestrator.campaign.confirm import Confirmer
from orchestrator.campaign.generations import (
    LoopState,
    Phase,
    Verdict,
    WorkUnit,
    committed_by,
    inference_alone,
    restore,
    run_phase,
)
from orchestrator.campaign.llm_service import phase_services
from orchestrator.fuzzers import Feedback, make_fuzzer
from orchestrator.fuzzers.oracles import bug_distance, bug_distance_normalized, make_oracle
from orchestrator.runs.files import new_run_id
from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import RunStore, StoreError
from workers.policies import shared_policy

PHASE = "optimality"
BUG_COLUMNS = ("bug_id", "generation", "state_index", "gen_seed", "aut_return", "ca_return", "p_value",
               "batched_aut_return", "batched_ca_return", "aut_episode_id", "ca_episode_id", "aut_sha256", "ca_sha256",
               "wall_time")
FLAKY_COLUMNS = ("generation", "state_index", "gen_seed", "aut_return", "ca_return", "p_value", "batched_aut_return",
                 "batched_ca_return", "batched_p_value", "wall_time")


@dataclass
class OptimalityState(LoopState):
    bugs: list = field(default_factory=list)  # one dict per confirmed bug (both agents acting alone)
    flaky: list = field(default_factory=list)  # candidates that were no bug alone (flaky_bugs.parquet)
    confirm_seconds: float = 0.0

    @property
    def cases(self) -> int:
        return self.done


def metrics(scenario, bug_states: np.ndarray, distance: bool = True) -> dict:
    """Bugs, distinct bugs and (unless ``distance=False``: O(bugs²), left to the summary) distance
    in raw state units and ``distance_normalized`` (min–max by the initial-state bounds)."""
    n = int(bug_states.shape[0])
    out = {"bugs": n, "distinct_bugs": scenario.count_distinct(bug_states) if n else 0}
    if distance:
        out["distance"] = bug_distance(bug_states)
        out["distance_normalized"] = bug_distance_normalized(bug_states, scenario.low, scenario.high)
    return out


def _returns_matrix(result, n: int, repeats: int):
    """(n, repeats) returns of each role, by state index and repeat."""
    idx = result.state_index - result.state_index.min()
    out = {}
    for role in ("aut", "challenger"):
        m = np.full((n, repeats), np.nan)
        sel = np.asarray(result.role) == role
        m[idx[sel], result.repeat[sel]] = result.returns[sel]
        out[role] = m
    return out["aut"], out["challenger"]


@dataclass(frozen=True, eq=False)
class DifferentialVerdict(Verdict):
    """One unit's differential verdicts: the oracle on the batched returns gives candidates, each
    confirmed (or not) with both agents acting alone; ``feedback`` flags the confirmed bugs."""

    r_aut: np.ndarray  # (n, repeats) batched returns of the AUT, by state and repeat
    r_ca: np.ndarray  # (n, repeats) the challenger's
    candidates: np.ndarray  # state indices the oracle flagged on the batched returns
    candidate_p: np.ndarray  # (n,) the oracle's p-value per state (batched)
    confirmed: np.ndarray  # (len(candidates),) bool: a bug with both agents acting alone
    p_alone: np.ndarray  # (len(candidates),) the oracle's p-value on the returns acting alone
    aut_alone: np.ndarray  # (len(candidates), repeats) the AUT's returns acting alone
    ca_alone: np.ndarray  # (len(candidates), repeats) the challenger's
    confirm_seconds: float  # spent confirming

    def bugs(self, n: int) -> np.ndarray:
        """(n,) bool: the confirmed bugs by state index."""
        bug = np.zeros(n, bool)
        bug[self.candidates[self.confirmed]] = True
        return bug


class OptimalityPhase(Phase):
    name = PHASE
    unit = "case"
    count_name = "cases"
    state_class = OptimalityState

    def __init__(self, *args, oracle, ca_uri: str, **kw):
        super().__init__(*args, **kw)
        self.oracle, self.ca_uri = oracle, ca_uri
        self.repeats = oracle.repeats

    def judge(self, states, result, gen_seed: int) -> DifferentialVerdict:
        """The oracle on the batched returns gives candidates; each is confirmed with both agents
        acting alone (:mod:`orchestrator.campaign.confirm`) and only confirmed bugs count."""
        n = len(states)
        r_aut, r_ca = _returns_matrix(result, n, self.repeats)
        cand_bug, cand_p = self.oracle.judge(r_aut, r_ca)
        cand = np.flatnonzero(cand_bug)
        confirmer = Confirmer(self.scenario, self.policies, acted_alone=inference_alone(self.spec, self.scenario))
        ok, p_alone, a_alone, c_alone = confirmer.bugs(states, cand, gen_seed, self.repeats, self.oracle, r_aut, r_ca)
        bug = np.zeros(n, bool)
        bug[cand[ok]] = True
        return DifferentialVerdict(feedback=Feedback.from_differential(result, n, bug=bug), r_aut=r_aut, r_ca=r_ca,
                                   candidates=cand, candidate_p=cand_p, confirmed=ok, p_alone=p_alone,
                                   aut_alone=a_alone, ca_alone=c_alone, confirm_seconds=confirmer.seconds)

    def record(self, st: OptimalityState, unit: WorkUnit, result, verdict: DifferentialVerdict) -> dict:
        """Both agents' episodes to the store (confirmed bugs flagged); each candidate a bug row or
        a flaky one."""
        v, states = verdict, unit.states
        st.confirm_seconds += v.confirm_seconds
        hashes = self.policy_hashes
        ep_bug = v.bugs(len(states))[result.state_index - result.state_index.min()]  # the store flags confirmed bugs only
        ids = self.store.write(result, phase=PHASE, fuzzer=self.spec.fuzzer, iteration=st.generation,
                               wall_time=st.elapsed, policy_sha256=hashes, bug=ep_bug)
        first = {(str(result.role[e]), int(result.state_index[e])): int(ids[e])
                 for e in np.flatnonzero(result.repeat == 0)}
        for k, i in enumerate(v.candidates):
            row = {"generation": st.generation, "state_index": int(i), "gen_seed": unit.gen_seed,
                   "state": states[i].tolist(), "aut_return": float(v.aut_alone[k].mean()),
                   "ca_return": float(v.ca_alone[k].mean()), "p_value": float(v.p_alone[k]),
                   "batched_aut_return": float(v.r_aut[i].mean()), "batched_ca_return": float(v.r_ca[i].mean()),
                   "wall_time": st.elapsed}
            if v.confirmed[k]:
                st.bugs.append({**row, "bug_id": len(st.bugs), "aut_episode_id": first[("aut", int(i))],
                                "ca_episode_id": first[("challenger", int(i))], "aut_sha256": hashes.get("aut", ""),
                                "ca_sha256": hashes.get("challenger", "")})
            else:
                st.flaky.append({**row, "batched_p_value": float(v.candidate_p[i])})
        m = metrics(self.scenario, self._bug_states(st), distance=False)  # distance waits for the summary
        return {"bugs": m["bugs"], "distinct_bugs": m["distinct_bugs"], "flaky": len(st.flaky),
                "mean_aut_return": float(v.r_aut.mean()), "mean_ca_return": float(v.r_ca.mean())}

    def _bug_states(self, st: OptimalityState) -> np.ndarray:
        return np.array([b["state"] for b in st.bugs]).reshape(-1, self.scenario.state_dim)

    def commit(self, st: OptimalityState) -> None:
        names = list(self.scenario.state_names)
        if st.bugs:
            self.run.write_verdicts(self.run.bugs_parquet, st.bugs, BUG_COLUMNS, names)
        if st.flaky:
            self.run.write_verdicts(self.run.flaky_parquet(PHASE), st.flaky, FLAKY_COLUMNS, names)

    def gauges(self, row: dict) -> dict:
        return {"bugs": row["bugs"]}

    def postfix(self, row: dict) -> dict:
        return {"bugs": row["bugs"], "distinct": row["distinct_bugs"]}

    def mlflow_params(self) -> dict:
        return {"challenger": self.run.stored(self.ca_uri)}

    def mlflow_tags(self) -> dict:
        return {"oracle": self.oracle.kind}

    def summarize(self, st: OptimalityState) -> dict:
        m = metrics(self.scenario, self._bug_states(st))
        spec, c, oracle = self.spec, self.campaign, self.oracle
        summary = {
            "campaign": c.name, "scenario": self.scenario.name, "aut": c.aut, "challenger": self.run.stored(self.ca_uri),
            "fuzzer": spec.fuzzer, "params": spec.params, "oracle": oracle.kind, "repeats": oracle.repeats,
            "delta": spec.delta, "alpha": getattr(oracle, "alpha", None), "seed": c.seed,
            "cases": st.done, "sampling_cases": st.sampling_done, "generations": st.generation,
            "wall_seconds": st.elapsed, "rollout_seconds": st.rollout_seconds, **m, "flaky_bugs": len(st.flaky),
            "confirm_seconds": st.confirm_seconds,
            **self.executor_info,
            "grid_intervals": self.scenario.grid_intervals,
            "distance_units": "raw initial-state units (the paper's scale)",
            "distance_normalization": "distance_normalized: min-max by the scenario's initial-state bounds, "
                                      "zero-width dimensions dropped",
            "bug_rate": m["bugs"] / st.done if st.done else float("nan"),
            "generation_size": spec.generation_size, "sampling_fraction": spec.sampling_fraction,
            # Delta: per energy term, the share of seed draws it decided (absent for other fuzzers)
            **{k: v for k, v in self.fuzzer.stats().items() if k.startswith("decision_share_")},
        }
        self.run.write_json(self.run.summary_json(PHASE), summary)
        if st.timeline:
            self.run.write_table(self.run.timeline_parquet(PHASE),
                                 pa.Table.from_pandas(pd.DataFrame(st.timeline), preserve_index=False))
        return summary


def run_optimality(campaign, *, resume: bool = False, progress: bool = True, scenario=None,
                   replay: dict | None = None) -> dict:
    """Run (or resume) the optimality phase of ``campaign``; returns its summary. ``replay``: as
    :func:`~orchestrator.campaign.safety.run_safety`'s."""
    spec = campaign.optimality
    scenario = scenario if scenario is not None else campaign.build_scenario()
    run = RunFolder(campaign.output)
    ca_uri = run.challenger_uri(campaign)
    policies = {"aut": shared_policy(campaign.aut, scenario), "challenger": shared_policy(ca_uri, scenario)}
    oracle = make_oracle(spec.oracle, scenario, delta=spec.delta, repeats=spec.repeats, alpha=spec.alpha)
    fuzzer = make_fuzzer(spec.fuzzer, scenario, seed=campaign.seed, **spec.params)
    if run.store_json.is_file():
        store = RunStore.open(run.root)
    else:
        store = RunStore.create(run.root, scenario, run_id=new_run_id(campaign.name))
        run.write_campaign(campaign)
    if resume:
        st = restore(run, PHASE, fuzzer, OptimalityState, committed=committed_by(run, "safety"))
    else:
        if run.has_phase(PHASE):
            raise StoreError(f"{run.root} already holds an optimality phase; resume it with --resume")
        st = OptimalityState()
    phase = OptimalityPhase(campaign, spec, scenario, run, store, fuzzer, {"aut": campaign.aut, "challenger": ca_uri},
                            policies, oracle=oracle, ca_uri=ca_uri, services=phase_services(fuzzer, campaign, run.root))
    return run_phase(phase, st, resume=resume, progress=progress, replay=replay)


