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
scenario's intervals), distance (mean pairwise Euclidean distance between bug initial states
with every dimension min–max normalised by the scenario's initial-state bounds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from orchestrator.campaign.config import campaign_of_run
from orchestrator.campaign.generations import (
    LoopState,
    Phase,
    committed_by,
    restore,
    run_phase,
)
from orchestrator.fuzzers import Feedback, make_fuzzer
from orchestrator.fuzzers.oracles import bug_distance, make_oracle
from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import RunStore, StoreError
from workers.policies import load_policy
from workers.rollout import rollout

PHASE = "optimality"
BUG_COLUMNS = ("bug_id", "generation", "state_index", "gen_seed", "aut_return", "ca_return", "p_value",
               "aut_episode_id", "ca_episode_id", "aut_sha256", "ca_sha256", "wall_time")


@dataclass
class OptimalityState(LoopState):
    bugs: list = field(default_factory=list)  # one dict per bug

    @property
    def cases(self) -> int:
        return self.done


def resolve_challenger(campaign) -> str:
    return RunFolder(campaign.output).challenger_uri(campaign)


def _bug_table(bugs: list, state_names: list[str]):
    cols = {k: [b[k] for b in bugs] for k in BUG_COLUMNS}
    states = np.array([b["state"] for b in bugs], dtype=np.float64).reshape(len(bugs), len(state_names))
    table = pa.table({**cols, "initial_state": pa.array(list(states), type=pa.list_(pa.float64(), len(state_names)))})
    for j, name in enumerate(state_names):  # one plain column per state dimension, for SQL/pandas users
        table = table.append_column(f"s_{name}", pa.array(states[:, j]))
    return table


def metrics(scenario, bug_states: np.ndarray, distance: bool = True) -> dict:
    """Bugs, distinct bugs and (unless ``distance=False``: O(bugs²), left to the summary) distance."""
    n = int(bug_states.shape[0])
    out = {"bugs": n, "distinct_bugs": scenario.count_distinct(bug_states) if n else 0}
    if distance:
        out["distance"] = bug_distance(bug_states, scenario.low, scenario.high)
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


class OptimalityPhase(Phase):
    name = PHASE
    unit = "case"
    count_name = "cases"
    state_class = OptimalityState

    def __init__(self, *args, oracle, ca_uri: str, **kw):
        super().__init__(*args, **kw)
        self.oracle, self.ca_uri = oracle, ca_uri
        self.repeats = oracle.repeats
        self._verdict = None

    def judge(self, states, result):
        n = len(states)
        r_aut, r_ca = _returns_matrix(result, n, self.repeats)
        bug, pval = self.oracle.judge(r_aut, r_ca)
        self._verdict = (r_aut, r_ca, bug, pval)
        return Feedback.from_differential(result, n, bug=bug)

    def record(self, st: OptimalityState, states, result, gen_seed: int) -> dict:
        r_aut, r_ca, bug, pval = self._verdict
        hashes = self.policy_hashes
        ep_bug = bug[result.state_index - result.state_index.min()]
        ids = self.store.write(result, phase=PHASE, fuzzer=self.spec.fuzzer, iteration=st.generation,
                               wall_time=st.elapsed, policy_sha256=hashes, bug=ep_bug)
        first = {(str(result.role[e]), int(result.state_index[e])): int(ids[e])
                 for e in np.flatnonzero(result.repeat == 0)}
        for i in np.flatnonzero(bug):
            st.bugs.append({
                "bug_id": len(st.bugs), "generation": st.generation, "state_index": int(i), "gen_seed": gen_seed,
                "state": states[i].tolist(), "aut_return": float(r_aut[i].mean()), "ca_return": float(r_ca[i].mean()),
                "p_value": float(pval[i]), "aut_episode_id": first[("aut", int(i))],
                "ca_episode_id": first[("challenger", int(i))], "aut_sha256": hashes.get("aut", ""),
                "ca_sha256": hashes.get("challenger", ""), "wall_time": st.elapsed})
        m = metrics(self.scenario, self._bug_states(st), distance=False)  # distance waits for the summary
        return {"bugs": m["bugs"], "distinct_bugs": m["distinct_bugs"],
                "mean_aut_return": float(r_aut.mean()), "mean_ca_return": float(r_ca.mean())}

    def _bug_states(self, st: OptimalityState) -> np.ndarray:
        return np.array([b["state"] for b in st.bugs]).reshape(-1, self.scenario.state_dim)

    def commit(self, st: OptimalityState) -> None:
        if st.bugs:
            self.run.write_table(self.run.bugs_parquet, _bug_table(st.bugs, list(self.scenario.state_names)))

    def gauges(self, row: dict) -> dict:
        return {"bugs": row["bugs"]}

    def postfix(self, row: dict) -> dict:
        return {"bugs": row["bugs"], "distinct": row["distinct_bugs"]}

    def mlflow_params(self) -> dict:
        return {"challenger": self.ca_uri}

    def mlflow_tags(self) -> dict:
        return {"oracle": self.oracle.kind}

    def summarize(self, st: OptimalityState) -> dict:
        m = metrics(self.scenario, self._bug_states(st))
        spec, c, oracle = self.spec, self.campaign, self.oracle
        summary = {
            "campaign": c.name, "scenario": self.scenario.name, "aut": c.aut, "challenger": self.ca_uri,
            "fuzzer": spec.fuzzer, "params": spec.params, "oracle": oracle.kind, "repeats": oracle.repeats,
            "delta": spec.delta, "alpha": getattr(oracle, "alpha", None), "seed": c.seed,
            "cases": st.done, "sampling_cases": st.sampling_done, "generations": st.generation,
            "wall_seconds": st.elapsed, **m, "grid_intervals": self.scenario.grid_intervals,
            "distance_normalization": "min-max by the scenario's initial-state bounds, zero-width dimensions dropped",
            "bug_rate": m["bugs"] / st.done if st.done else float("nan"),
        }
        self.run.write_json(self.run.summary_json(PHASE), summary)
        if st.timeline:
            self.run.write_table(self.run.timeline_parquet(PHASE),
                                 pa.Table.from_pandas(pd.DataFrame(st.timeline), preserve_index=False))
        return summary


def run_optimality(campaign, *, resume: bool = False, progress: bool = True, scenario=None) -> dict:
    """Run (or resume) the optimality phase of ``campaign``; returns its summary."""
    spec = campaign.optimality
    scenario = scenario if scenario is not None else campaign.build_scenario()
    run = RunFolder(campaign.output)
    ca_uri = run.challenger_uri(campaign)
    policies = {"aut": load_policy(campaign.aut, scenario), "challenger": load_policy(ca_uri, scenario)}
    oracle = make_oracle(spec.oracle, scenario, delta=spec.delta, repeats=spec.repeats, alpha=spec.alpha)
    fuzzer = make_fuzzer(spec.fuzzer, scenario, seed=campaign.seed, **spec.params)
    if run.store_json.is_file():
        store = RunStore.open(run.root)
    else:
        store = RunStore.create(run.root, scenario, run_id=f"{campaign.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        run.write_campaign(campaign)
    if resume:
        st = restore(run, PHASE, fuzzer, OptimalityState, committed=committed_by(run, "safety"))
    else:
        if run.has_phase(PHASE):
            raise StoreError(f"{run.root} already holds an optimality phase; resume it with --resume")
        st = OptimalityState()
    phase = OptimalityPhase(campaign, spec, scenario, run, store, fuzzer, {"aut": campaign.aut, "challenger": ca_uri},
                            policies, oracle=oracle, ca_uri=ca_uri)
    return run_phase(phase, st, resume=resume, progress=progress)


def replay(run_dir: str | Path, bug_id: int) -> dict:
    """Re-run bug ``bug_id`` of the run in ``run_dir`` with its recorded episode seeds."""
    run = RunFolder(run_dir)
    bugs = run.bugs()
    if bugs is None:
        raise StoreError(f"{run.root} holds no bugs.parquet: run an optimality phase first")
    row = bugs[bugs["bug_id"] == int(bug_id)]
    if row.empty:
        raise StoreError(f"no bug {bug_id} in {run.bugs_parquet} (bug ids 0..{len(bugs) - 1})")
    row = row.iloc[0]
    campaign = campaign_of_run(run.root)
    summary = run.summary(PHASE) or {}
    scenario = campaign.build_scenario()
    ca_uri = summary.get("challenger") or run.challenger_uri(campaign)
    pols = {"aut": load_policy(campaign.aut, scenario), "challenger": load_policy(ca_uri, scenario)}
    for role, key in (("aut", "aut_sha256"), ("challenger", "ca_sha256")):
        have = getattr(pols[role], "sha256", "")
        if row[key] and have and have != row[key]:
            raise StoreError(f"the {role} policy changed since the bug was found (sha256 {have[:12]} != "
                             f"{row[key][:12]}); replay needs the same policy files")
    repeats = int(summary.get("repeats") or 1)
    state = np.asarray(row["initial_state"], dtype=np.float64)[None]
    res = rollout(scenario, pols, state, repeats=repeats, seed=int(row["gen_seed"]),
                  state_offset=int(row["state_index"]))
    aut = float(res.returns[res.role == "aut"].mean())
    ca = float(res.returns[res.role == "challenger"].mean())
    return {"bug_id": int(bug_id), "initial_state": state[0].tolist(), "state_names": list(scenario.state_names),
            "aut_return": aut, "ca_return": ca, "recorded_aut_return": float(row["aut_return"]),
            "recorded_ca_return": float(row["ca_return"]),
            "reproduced": bool(np.isclose(aut, row["aut_return"]) and np.isclose(ca, row["ca_return"]))}
