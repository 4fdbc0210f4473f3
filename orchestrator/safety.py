"""Safety testing (Delta phase 1): fuzz the AUT for failures and record every trajectory (dataset D).

    run_safety(campaign)               # a new run in campaign.output
    run_safety(campaign, resume=True)  # continue from the last generation snapshot

Generations: ``fuzzer.propose(n)`` → the AUT runs from the proposed states (in this process, or
on the Ray ``RolloutPool`` in chunks with several in flight) → ``fuzzer.observe`` → the episodes
are written to the run's Parquet store (phase ``sampling`` or ``fuzzing``, the fuzzer's name,
the generation as iteration) → metrics → a snapshot. The sampling phase spends
``sampling_fraction`` of the budget (episodes or seconds) on the initial corpus.

Snapshots (``snapshots/gen-NNNNNN.pkl``, written whole) hold the fuzzer's state, the counters and
the list of Parquet part files committed so far. ``resume`` deletes part files written after the
last snapshot (a generation cut short), restores the fuzzer and continues: with an episode budget
the resumed run reaches exactly the result of an uninterrupted one with the same seed.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestrator.store import atomic_write_bytes, atomic_write_table

SAFETY_PHASES = ("sampling", "fuzzing")  # the store phases that make up dataset D


@dataclass
class SafetyState:
    generation: int = 0
    episodes: int = 0
    sampling_episodes: int = 0
    elapsed: float = 0.0
    phase: str = "sampling"
    failures: int = 0
    failure_states: list = field(default_factory=list)  # initial states of failing episodes
    rollout_seconds: float = 0.0  # wall time spent waiting for rollouts (the rest is overhead)
    timeline: list = field(default_factory=list)  # one row per generation


class _Executor:
    """Runs the AUT from initial states: in-process (workers = 0) or on the Ray pool."""

    def __init__(self, campaign, scenario, uris: dict | None = None):
        self.workers = campaign.workers
        uris = uris or {"aut": campaign.aut}
        if self.workers == 0:
            from workers.rollout import RolloutWorker

            self.local = RolloutWorker(scenario.name, uris, scenario_overrides=campaign.scenario_overrides,
                                       batch_size=campaign.batch_size)
            self.policy_hashes = self.local.policy_hashes()
        else:
            from orchestrator.driver import RolloutPool, start_ray

            start_ray(num_cpus=max(self.workers, os.cpu_count() or 1))
            self.pool = RolloutPool(scenario.name, uris, workers=self.workers, batch_size=campaign.batch_size,
                                    scenario_overrides=campaign.scenario_overrides)
            self.policy_hashes = dict(self.pool.policy_hashes)
        self.policy_hash = self.policy_hashes["aut"]

    def run(self, states: np.ndarray, seed: int, repeats: int = 1):
        from workers.rollout import RolloutResult

        if self.workers == 0:
            return self.local.run(states, seed=seed, repeats=repeats)
        chunk = max(1, -(-len(states) // (2 * self.workers)))
        parts = sorted(self.pool.map(states, seed=seed, chunk=chunk, repeats=repeats), key=lambda p: p[0])
        return RolloutResult.concat([r for _, r in parts])

    def close(self):
        if self.workers:
            self.pool.shutdown()


def _committed(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for d in ("steps", "episodes") for p in (run_dir / d).glob("*.parquet"))


def _snapshot(run_dir: Path, fuzzer, st, store, keep: int = 2, prefix: str = "gen") -> None:
    snap_dir = run_dir / "snapshots"
    snap_dir.mkdir(exist_ok=True)
    blob = pickle.dumps({"fuzzer": fuzzer.state_dict(), "state": st, "committed": _committed(run_dir)})
    atomic_write_bytes(snap_dir / f"{prefix}-{st.generation:06d}.pkl", blob)
    for old in sorted(snap_dir.glob(f"{prefix}-*.pkl"))[:-keep]:
        old.unlink()


def _restore(run_dir: Path, fuzzer, prefix: str = "gen", fresh=None, committed: list[str] | None = None):
    """Load the newest ``prefix`` snapshot into ``fuzzer`` and delete the part files written after
    it; without a snapshot, return ``fresh()`` and keep only ``committed`` parts (when given)."""
    snaps = sorted((run_dir / "snapshots").glob(f"{prefix}-*.pkl"))
    if not snaps:
        if committed is not None:
            _drop_uncommitted(run_dir, set(committed))
        return (fresh or SafetyState)()
    snap = pickle.loads(snaps[-1].read_bytes())
    _drop_uncommitted(run_dir, set(snap["committed"]))
    fuzzer.load_state_dict(snap["fuzzer"])
    return snap["state"]


def _drop_uncommitted(run_dir: Path, keep: set) -> None:
    for d in ("steps", "episodes"):  # part files of a generation that never got its snapshot
        for p in (run_dir / d).glob("*.parquet"):
            if str(p.relative_to(run_dir)) not in keep:
                p.unlink()


def next_generation_size(spec, done: int, st, fuzzer) -> int | None:
    """The size of the next generation under ``spec``'s budget after ``done`` episodes (test
    cases) and ``st.elapsed`` seconds, or None when the budget is spent. Moves ``st`` and the
    fuzzer to the fuzzing phase once the sampling share of the budget is spent."""
    b = spec.budget
    left = None if b.episodes is None else b.episodes - done
    if (left is not None and left <= 0) or (b.seconds is not None and st.elapsed >= b.seconds):
        return None
    sampling_n = int(round(spec.sampling_fraction * b.episodes)) if b.episodes else None
    sampling_s = spec.sampling_fraction * b.seconds if b.seconds else None
    if st.phase == "sampling" and ((sampling_n is not None and done >= sampling_n)
                                   or (sampling_s is not None and st.elapsed >= sampling_s)):
        st.phase = "fuzzing"
        fuzzer.start_phase("fuzzing")
    n = spec.generation_size
    if st.phase == "sampling" and sampling_n is not None:
        n = min(n, sampling_n - done)
    return n if left is None else min(n, left)


def run_safety(campaign, *, resume: bool = False, progress: bool = True) -> dict:
    """Run (or resume) the safety phase of ``campaign``; returns the summary."""
    from tqdm import tqdm

    from envs import get_scenario
    from orchestrator import tracking
    from orchestrator.fuzzers import Feedback, make_fuzzer
    from orchestrator.store import RunStore, StoreError
    from workers.policies import load_policy

    scenario = get_scenario(campaign.scenario, **campaign.scenario_overrides)
    spec = campaign.safety
    run_dir = Path(campaign.output)
    load_policy(campaign.aut, scenario)  # a policy that does not load or fit: clear error, nothing written
    fuzzer = make_fuzzer(spec.fuzzer, scenario, seed=campaign.seed, **spec.params)

    if resume:
        if not (run_dir / "campaign.json").is_file():
            raise StoreError(f"{run_dir} holds no campaign to resume (campaign.json missing)")
        store = RunStore.open(run_dir)
        st = _restore(run_dir, fuzzer)
    else:
        store = RunStore.create(run_dir, scenario, run_id=f"{campaign.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        atomic_write_bytes(run_dir / "campaign.json", json.dumps(campaign.to_dict(), indent=2).encode())
        st = SafetyState()
    fuzzer.start_phase(st.phase)

    budget_eps, budget_s = spec.budget.episodes, spec.budget.seconds
    mlrun = None
    if campaign.mlflow:
        mlrun = tracking.start_run(run_dir, "safety", f"{campaign.name}-{spec.fuzzer}",
                                   params={"campaign": campaign.to_dict(), "resume": resume},
                                   tags={"deltarl.kind": "safety", "scenario": scenario.name, "fuzzer": spec.fuzzer})
    from orchestrator.llm_pool import attach_llm, llm_metrics

    llm_pool = attach_llm(fuzzer, campaign, run_dir)  # LLM-guided fuzzers only
    executor = _Executor(campaign, scenario)
    from orchestrator.driver import CampaignMetrics

    ray_metrics = CampaignMetrics(campaign.name, "safety")
    bar = tqdm(total=budget_eps or budget_s, initial=st.episodes if budget_eps else st.elapsed,
               unit="ep" if budget_eps else "s", desc=f"{spec.fuzzer} {scenario.name}", disable=not progress)
    t_start = time.perf_counter() - st.elapsed
    try:
        while True:
            n = next_generation_size(spec, st.episodes, st, fuzzer)
            if n is None:
                break
            proposal = fuzzer.propose(n)
            states = scenario.validate(proposal.states)
            gen_seed = campaign.seed * 1_000_003 + st.generation
            t_roll = time.perf_counter()
            result = executor.run(states, seed=gen_seed)
            st.rollout_seconds += time.perf_counter() - t_roll
            fuzzer.observe(proposal, Feedback.from_result(result))
            st.elapsed = time.perf_counter() - t_start
            store.write(result, phase=st.phase, fuzzer=spec.fuzzer, iteration=st.generation,
                        wall_time=st.elapsed, policy_sha256=executor.policy_hash)
            k = len(proposal)
            st.episodes += k
            if st.phase == "sampling":
                st.sampling_episodes += k
            fails = result.failure
            st.failures += int(fails.sum())
            st.failure_states.extend(states[fails].tolist())
            distinct = scenario.count_distinct(np.asarray(st.failure_states)) if st.failure_states else 0
            row = {"generation": st.generation, "phase": st.phase, "episodes": st.episodes, "wall_time": st.elapsed,
                   "failures": st.failures, "distinct_failures": distinct,
                   "mean_return": float(result.returns.mean())}
            row.update(llm_metrics(fuzzer))
            st.timeline.append(row)
            st.generation += 1
            _snapshot(run_dir, fuzzer, st, store)
            if mlrun:
                tracking.log_metrics(mlrun, {k: v for k, v in row.items() if k not in ("generation", "phase")},
                                     step=st.episodes)
            ray_metrics.update(episodes=k, failures=st.failures)
            bar.update(k if budget_eps else st.elapsed - bar.n)
            bar.set_postfix(failures=st.failures, distinct=distinct, phase=st.phase)
    except BaseException:
        if mlrun:
            tracking.end_run(mlrun, "FAILED")
        raise
    finally:
        bar.close()
        executor.close()
        if llm_pool is not None:
            llm_pool.close()

    summary = summarize(run_dir, scenario, st, campaign)
    if mlrun:
        tracking.log_artifact(mlrun, run_dir / "summary.json")
        tracking.end_run(mlrun)
    return summary


def summarize(run_dir: Path, scenario, st: SafetyState, campaign) -> dict:
    """Write ``summary.json`` and ``timeline.parquet`` (failures over time) whole."""
    import pandas as pd
    import pyarrow as pa

    distinct = scenario.count_distinct(np.asarray(st.failure_states)) if st.failure_states else 0
    summary = {
        "campaign": campaign.name,
        "scenario": scenario.name,
        "aut": campaign.aut,
        "fuzzer": campaign.safety.fuzzer,
        "seed": campaign.seed,
        "episodes": st.episodes,
        "sampling_episodes": st.sampling_episodes,
        "generations": st.generation,
        "wall_seconds": st.elapsed,
        "rollout_seconds": getattr(st, "rollout_seconds", 0.0),
        "failures": st.failures,
        "distinct_failures": distinct,
        "grid_intervals": scenario.grid_intervals,
        "failure_rate": st.failures / st.episodes if st.episodes else float("nan"),
    }
    from orchestrator.diversity import failure_diversity

    # LLMTester's Table II: distinct entire / initial / terminal states of the failures (N = 10)
    summary["failure_states"] = failure_diversity(run_dir, intervals=10)
    atomic_write_bytes(run_dir / "summary.json", json.dumps(summary, indent=2).encode())
    atomic_write_table(run_dir / "timeline.parquet",
                       pa.Table.from_pandas(pd.DataFrame(st.timeline), preserve_index=False))
    return summary
