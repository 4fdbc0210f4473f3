"""Optimality testing (Delta phase 3): differential fuzzing of AUT vs challenger.

    run_optimality(campaign)               # in campaign.output, after safety and challenger
    run_optimality(campaign, resume=True)  # continue from the last generation snapshot

Generations, as in the safety phase: ``fuzzer.propose(n)`` → both agents run from the proposed
states (``repeats`` rollouts each, with the same episode seeds: common random numbers) → the
oracle judges every state (:mod:`orchestrator.oracles`) → ``fuzzer.observe`` (Delta reads both
agents; a safety fuzzer used as a baseline reads the AUT's episodes only) → the episodes of
both roles go to the run's Parquet store (phase ``optimality``, ``bug`` flag per episode) → a
snapshot (``snapshots/opt-NNNNNN.pkl``) and ``bugs.parquet``, both written whole.

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

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestrator.store import atomic_write_bytes, atomic_write_table

PHASE = "optimality"


@dataclass
class OptimalityState:
    generation: int = 0
    cases: int = 0  # test cases (initial states) run
    sampling_cases: int = 0
    elapsed: float = 0.0
    phase: str = "sampling"
    bugs: list = field(default_factory=list)  # one dict per bug
    timeline: list = field(default_factory=list)


def resolve_challenger(campaign) -> str:
    spec = campaign.optimality
    if spec.challenger:
        return spec.challenger
    algo = campaign.challenger.algos[0]
    path = Path(campaign.output) / "challengers" / algo / "model.d3"
    if not path.is_file():
        from orchestrator.store import StoreError

        raise StoreError(f"optimality: the {algo} challenger {path} does not exist yet; run the challenger "
                         f"phase first (deltarl run --resume {campaign.output})")
    return str(path)


def _bug_table(bugs: list, state_names: list[str]):
    import pyarrow as pa

    cols = {k: [b[k] for b in bugs] for k in ("bug_id", "generation", "state_index", "gen_seed", "aut_return",
                                               "ca_return", "p_value", "aut_episode_id", "ca_episode_id",
                                               "aut_sha256", "ca_sha256", "wall_time")}
    states = np.array([b["state"] for b in bugs], dtype=np.float64).reshape(len(bugs), len(state_names))
    table = pa.table({**cols, "initial_state": pa.array(list(states), type=pa.list_(pa.float64(), len(state_names)))})
    for j, name in enumerate(state_names):  # one plain column per state dimension, for SQL/pandas users
        table = table.append_column(f"s_{name}", pa.array(states[:, j]))
    return table


def metrics(scenario, bug_states: np.ndarray, distance: bool = True) -> dict:
    """Bugs, distinct bugs and (unless ``distance=False``: O(bugs²), left to the summary) distance."""
    from orchestrator.oracles import bug_distance

    n = int(bug_states.shape[0])
    out = {"bugs": n, "distinct_bugs": scenario.count_distinct(bug_states) if n else 0}
    if distance:
        out["distance"] = bug_distance(bug_states, scenario.low, scenario.high)
    return out


def run_optimality(campaign, *, resume: bool = False, progress: bool = True) -> dict:
    """Run (or resume) the optimality phase of ``campaign``; returns its summary."""
    from tqdm import tqdm

    from envs import get_scenario
    from orchestrator import tracking
    from orchestrator.fuzzers import Feedback, make_fuzzer
    from orchestrator.oracles import make_oracle
    from orchestrator.safety import _Executor, _restore, _snapshot, next_generation_size
    from orchestrator.store import RunStore
    from workers.policies import load_policy

    spec = campaign.optimality
    scenario = get_scenario(campaign.scenario, **campaign.scenario_overrides)
    run_dir = Path(campaign.output)
    ca_uri = resolve_challenger(campaign)
    load_policy(campaign.aut, scenario)
    load_policy(ca_uri, scenario)
    oracle = make_oracle(spec.oracle, scenario, delta=spec.delta, repeats=spec.repeats, alpha=spec.alpha)
    fuzzer = make_fuzzer(spec.fuzzer, scenario, seed=campaign.seed, **spec.params)

    if (run_dir / "store.json").is_file():
        store = RunStore.open(run_dir)
    else:
        store = RunStore.create(run_dir, scenario, run_id=f"{campaign.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        atomic_write_bytes(run_dir / "campaign.json", json.dumps(campaign.to_dict(), indent=2).encode())
    if resume:
        st = _restore(run_dir, fuzzer, prefix="opt", fresh=OptimalityState, committed=_safety_committed(run_dir))
    else:
        if list((run_dir / "snapshots").glob("opt-*.pkl")):
            from orchestrator.store import StoreError

            raise StoreError(f"{run_dir} already holds an optimality phase; resume it with --resume")
        st = OptimalityState()
    fuzzer.start_phase(st.phase)

    budget_n, budget_s = spec.budget.episodes, spec.budget.seconds
    mlrun = None
    if campaign.mlflow:
        mlrun = tracking.start_run(run_dir, "optimality", f"{campaign.name}-{spec.fuzzer}",
                                   params={"campaign": campaign.to_dict(), "challenger": ca_uri, "resume": resume},
                                   tags={"deltarl.kind": "optimality", "scenario": scenario.name,
                                         "fuzzer": spec.fuzzer, "oracle": oracle.kind})
    from orchestrator.llm_pool import attach_llm, llm_metrics

    llm_pool = attach_llm(fuzzer, campaign, run_dir)  # LLM-guided fuzzers only
    executor = _Executor(campaign, scenario, {"aut": campaign.aut, "challenger": ca_uri})
    hashes = executor.policy_hashes
    from orchestrator.driver import CampaignMetrics

    ray_metrics = CampaignMetrics(campaign.name, PHASE)
    names = list(scenario.state_names)
    bar = tqdm(total=budget_n or budget_s, initial=st.cases if budget_n else st.elapsed,
               unit="case" if budget_n else "s", desc=f"optimality {spec.fuzzer} {scenario.name}",
               disable=not progress)
    t_start = time.perf_counter() - st.elapsed
    try:
        while True:
            n = next_generation_size(spec, st.cases, st, fuzzer)
            if n is None:
                break
            proposal = fuzzer.propose(n)
            states = scenario.validate(proposal.states)
            gen_seed = campaign.seed * 1_000_003 + 500_000 + st.generation
            result = executor.run(states, seed=gen_seed, repeats=oracle.repeats)
            r_aut, r_ca = _returns_matrix(result, n, oracle.repeats)
            bug, pval = oracle.judge(r_aut, r_ca)
            fuzzer.observe(proposal, Feedback.from_differential(result, n, bug=bug))
            st.elapsed = time.perf_counter() - t_start
            ep_bug = bug[result.state_index - result.state_index.min()]
            ids = store.write(result, phase=PHASE, fuzzer=spec.fuzzer, iteration=st.generation, wall_time=st.elapsed,
                              policy_sha256=hashes, bug=ep_bug)
            first = {}
            for e in np.flatnonzero(result.repeat == 0):
                first[(str(result.role[e]), int(result.state_index[e]))] = int(ids[e])
            for i in np.flatnonzero(bug):
                st.bugs.append({
                    "bug_id": len(st.bugs), "generation": st.generation, "state_index": int(i), "gen_seed": gen_seed,
                    "state": states[i].tolist(), "aut_return": float(r_aut[i].mean()), "ca_return": float(r_ca[i].mean()),
                    "p_value": float(pval[i]), "aut_episode_id": first[("aut", int(i))],
                    "ca_episode_id": first[("challenger", int(i))], "aut_sha256": hashes.get("aut", ""),
                    "ca_sha256": hashes.get("challenger", ""), "wall_time": st.elapsed})
            st.cases += n
            if st.phase == "sampling":
                st.sampling_cases += n
            m = metrics(scenario, np.array([b["state"] for b in st.bugs]).reshape(-1, scenario.state_dim),
                        distance=False)  # per generation: the pairwise distance waits for the summary
            row = {"generation": st.generation, "phase": st.phase, "cases": st.cases, "wall_time": st.elapsed,
                   "bugs": m["bugs"], "distinct_bugs": m["distinct_bugs"],
                   "mean_aut_return": float(r_aut.mean()), "mean_ca_return": float(r_ca.mean())}
            row.update(llm_metrics(fuzzer))
            st.timeline.append(row)
            st.generation += 1
            if st.bugs:
                atomic_write_table(run_dir / "bugs.parquet", _bug_table(st.bugs, names))
            _snapshot(run_dir, fuzzer, st, store, prefix="opt")
            if mlrun:
                tracking.log_metrics(mlrun, {k: v for k, v in row.items() if k not in ("generation", "phase")},
                                     step=st.cases)
            ray_metrics.update(episodes=2 * n * oracle.repeats, bugs=m["bugs"])
            bar.update(n if budget_n else st.elapsed - bar.n)
            bar.set_postfix(bugs=m["bugs"], distinct=m["distinct_bugs"], phase=st.phase)
    except BaseException:
        if mlrun:
            tracking.end_run(mlrun, "FAILED")
        raise
    finally:
        bar.close()
        executor.close()
        if llm_pool is not None:
            llm_pool.close()

    summary = summarize(run_dir, scenario, st, campaign, ca_uri, oracle)
    if mlrun:
        tracking.log_metrics(mlrun, {k: v for k, v in summary.items() if isinstance(v, (int, float))}, step=st.cases)
        tracking.log_artifact(mlrun, run_dir / "optimality_summary.json")
        tracking.end_run(mlrun)
    return summary


def _safety_committed(run_dir: Path) -> list[str] | None:
    """Part files the safety phase committed (an optimality phase with no snapshot yet keeps these)."""
    import pickle

    snaps = sorted((run_dir / "snapshots").glob("gen-*.pkl"))
    return pickle.loads(snaps[-1].read_bytes())["committed"] if snaps else []


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


def summarize(run_dir: Path, scenario, st: OptimalityState, campaign, ca_uri: str, oracle) -> dict:
    import pandas as pd
    import pyarrow as pa

    m = metrics(scenario, np.array([b["state"] for b in st.bugs]).reshape(-1, scenario.state_dim))
    spec = campaign.optimality
    summary = {
        "campaign": campaign.name, "scenario": scenario.name, "aut": campaign.aut, "challenger": ca_uri,
        "fuzzer": spec.fuzzer, "params": spec.params, "oracle": oracle.kind, "repeats": oracle.repeats,
        "delta": spec.delta, "alpha": getattr(oracle, "alpha", None), "seed": campaign.seed,
        "cases": st.cases, "sampling_cases": st.sampling_cases, "generations": st.generation,
        "wall_seconds": st.elapsed, **m, "grid_intervals": scenario.grid_intervals,
        "distance_normalization": "min-max by the scenario's initial-state bounds, zero-width dimensions dropped",
        "bug_rate": m["bugs"] / st.cases if st.cases else float("nan"),
    }
    atomic_write_bytes(run_dir / "optimality_summary.json", json.dumps(summary, indent=2, default=float).encode())
    if st.timeline:
        atomic_write_table(run_dir / "optimality_timeline.parquet",
                           pa.Table.from_pandas(pd.DataFrame(st.timeline), preserve_index=False))
    return summary


def replay(run_dir: str | Path, bug_id: int) -> dict:
    """Re-run bug ``bug_id`` of the run in ``run_dir`` with its recorded episode seeds."""
    import pyarrow.parquet as pq

    from envs import get_scenario
    from orchestrator.campaign import campaign_from_dict
    from orchestrator.store import StoreError
    from workers.policies import load_policy
    from workers.rollout import rollout

    run_dir = Path(run_dir)
    if not (run_dir / "bugs.parquet").is_file():
        raise StoreError(f"{run_dir} holds no bugs.parquet: run an optimality phase first")
    bugs = pq.read_table(run_dir / "bugs.parquet").to_pandas()
    row = bugs[bugs["bug_id"] == int(bug_id)]
    if row.empty:
        raise StoreError(f"no bug {bug_id} in {run_dir / 'bugs.parquet'} (bug ids 0..{len(bugs) - 1})")
    row = row.iloc[0]
    campaign = campaign_from_dict(json.loads((run_dir / "campaign.json").read_text()), str(run_dir / "campaign.json"))
    campaign.output = str(run_dir)
    summary = json.loads((run_dir / "optimality_summary.json").read_text()) if (
        run_dir / "optimality_summary.json").is_file() else {}
    scenario = get_scenario(campaign.scenario, **campaign.scenario_overrides)
    ca_uri = summary.get("challenger") or resolve_challenger(campaign)
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
