"""THE generation loop: every fuzzing phase (safety, optimality, and repair's re-evaluation,
which is a safety phase against AUT-Improved) runs here. A phase supplies only what differs,
the way d3rlpy's algorithms share one fitter and supply their loss:

    class MyPhase(Phase):
        name = "safety"                      # the store phase family, snapshot prefix, MLflow experiment
        def judge(self, states, result, gen_seed): ...  # -> the fuzzer's Feedback (and the phase's verdicts)
        def record(self, st, states, result, gen_seed): ...  # store writes, counters -> metrics row
        def summarize(self, st): ...         # summary files -> the summary dict

One generation: ``fuzzer.propose(n)`` → the scenario validates the states → the executor runs the
phase's policies from them (``repeats`` each, seeds ``generation_seed``) → ``phase.judge`` →
``fuzzer.observe`` → ``phase.record`` (Parquet) → a timeline row → ``phase.commit`` (files such
as ``bugs.parquet``) → a snapshot → MLflow, Ray metrics, the progress bar.

Snapshots (``snapshots/<prefix>-NNNNNN.pkl``, written whole) hold the fuzzer's state, the loop
state and the Parquet part files committed so far; ``resume`` deletes the parts written after
the last snapshot (a generation cut short), restores both states and continues: with an episode
budget the resumed run reaches exactly the result of an uninterrupted one with the same seed.
The sampling phase spends ``sampling_fraction`` of the budget (episodes or seconds) on the
initial corpus.
"""

from __future__ import annotations

import abc
import dataclasses
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from orchestrator.cluster.driver import CampaignMetrics
from orchestrator.cluster.executor import Executor
from orchestrator.cluster.llm_pool import attach_llm, llm_metrics
from orchestrator.runs import tracking
from orchestrator.runs.layout import SNAPSHOT_PREFIX, RunFolder
from orchestrator.runs.store import StoreError, atomic_write_bytes

# each phase draws its episode seeds from its own stream of the campaign seed
SEED_STREAM = {"safety": 0, "optimality": 500_000}


def generation_seed(campaign_seed: int, phase: str, generation: int) -> int:
    """The seed of one generation's episodes (``deltarl replay`` re-runs a bug with it)."""
    return int(campaign_seed) * 1_000_003 + SEED_STREAM[phase] + int(generation)


@dataclass
class LoopState:
    """The loop's counters (a phase's state adds its own fields)."""

    generation: int = 0
    done: int = 0  # episodes (safety) or test cases (optimality) run
    sampling_done: int = 0
    elapsed: float = 0.0
    phase: str = "sampling"
    rollout_seconds: float = 0.0  # wall time spent waiting for rollouts (the rest is overhead)
    timeline: list = field(default_factory=list)  # one row per generation


class Phase(abc.ABC):
    """What one fuzzing phase adds to the loop."""

    name: str = ""  # "safety" | "optimality"
    unit: str = "ep"  # progress-bar unit of the budget
    count_name: str = "episodes"  # the timeline column of ``LoopState.done``
    repeats: int = 1  # rollouts per policy and state
    state_class = LoopState

    def __init__(self, campaign, spec, scenario, run: RunFolder, store, fuzzer, uris: dict, policies: dict):
        self.campaign, self.spec, self.scenario = campaign, spec, scenario
        self.run, self.store, self.fuzzer = run, store, fuzzer
        self.uris, self.policies = uris, policies
        self.policy_hashes: dict = {}

    @abc.abstractmethod
    def judge(self, states, result, gen_seed: int):
        """The fuzzer's :class:`~orchestrator.fuzzers.base.Feedback` for this generation."""

    @abc.abstractmethod
    def record(self, st, states, result, gen_seed: int) -> dict:
        """Write the generation to the store and update ``st``; the phase's timeline columns."""

    @abc.abstractmethod
    def summarize(self, st) -> dict:
        """Write the phase's summary files; return the summary."""

    def commit(self, st) -> None:
        """Files the phase writes whole before each snapshot."""

    def episodes_run(self, n: int) -> int:
        return n * self.repeats * len(self.uris)

    def gauges(self, row: dict) -> dict:
        """Ray gauges (``failures`` / ``bugs``) from a timeline row."""
        return {}

    def postfix(self, row: dict) -> dict:
        return {}

    def mlflow_run(self, resume: bool):
        """Start this phase's MLflow run (None when the campaign has MLflow off)."""
        if not self.campaign.mlflow:
            return None
        return tracking.start_run(self.run.root, self.name, f"{self.campaign.name}-{self.spec.fuzzer}",
                                  params={"campaign": self.campaign.to_dict(), "resume": resume, **self.mlflow_params()},
                                  tags={"deltarl.kind": self.name, "scenario": self.scenario.name,
                                        "fuzzer": self.spec.fuzzer, **self.mlflow_tags()})

    def mlflow_params(self) -> dict:
        return {}

    def mlflow_tags(self) -> dict:
        return {}


# -- budget ------------------------------------------------------------------------------------
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


# -- snapshots ---------------------------------------------------------------------------------
def committed_parts(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for d in ("steps", "episodes") for p in (run_dir / d).glob("*.parquet"))


def snapshot(run: RunFolder, phase: str, fuzzer, st: LoopState, keep: int = 2) -> None:
    run.snapshots.mkdir(exist_ok=True)
    blob = pickle.dumps({"fuzzer": fuzzer.state_dict(), "state": dataclasses.asdict(st),
                         "committed": committed_parts(run.root)})
    atomic_write_bytes(run.snapshots / f"{SNAPSHOT_PREFIX[phase]}-{st.generation:06d}.pkl", blob)
    for old in run.snapshot_files(phase)[:-keep]:
        old.unlink()


def _load_snapshot(path: Path) -> dict:
    try:
        return pickle.loads(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - a snapshot of another deltarl version or a damaged file
        raise StoreError(f"snapshot {path} cannot be read ({type(exc).__name__}: {exc}); it was written by another "
                         f"deltarl version or is damaged: start the run anew") from exc


def restore(run: RunFolder, phase: str, fuzzer, state_class, committed: list[str] | None = None):
    """The newest snapshot of ``phase`` into ``fuzzer``; part files written after it are deleted.
    Without a snapshot: a fresh state, keeping only ``committed`` parts (when given)."""
    snaps = run.snapshot_files(phase)
    if not snaps:
        if committed is not None:
            drop_uncommitted(run.root, set(committed))
        return state_class()
    snap = _load_snapshot(snaps[-1])
    drop_uncommitted(run.root, set(snap["committed"]))
    fuzzer.load_state_dict(snap["fuzzer"])
    state = snap["state"]
    return state_class(**state) if isinstance(state, dict) else state


def committed_by(run: RunFolder, phase: str) -> list[str]:
    """The part files ``phase`` had committed at its last snapshot (none: [])."""
    snaps = run.snapshot_files(phase)
    return _load_snapshot(snaps[-1])["committed"] if snaps else []


def drop_uncommitted(run_dir: Path, keep: set) -> None:
    for d in ("steps", "episodes"):  # part files of a generation that never got its snapshot
        for p in (run_dir / d).glob("*.parquet"):
            if str(p.relative_to(run_dir)) not in keep:
                p.unlink()


# -- the loop ----------------------------------------------------------------------------------
def run_phase(phase: Phase, st: LoopState, *, resume: bool = False, progress: bool = True) -> dict:
    """Run ``phase`` from ``st`` until its budget is spent; write its summary and return it."""
    campaign, spec, fuzzer = phase.campaign, phase.spec, phase.fuzzer
    fuzzer.start_phase(st.phase)
    mlrun = phase.mlflow_run(resume)
    llm_pool = attach_llm(fuzzer, campaign, phase.run.root)  # LLM-guided fuzzers only
    executor = Executor(phase.scenario, phase.uris, workers=campaign.workers, batch_size=campaign.batch_size,
                        scenario_overrides=campaign.scenario_overrides, policies=phase.policies)
    phase.policy_hashes = executor.policy_hashes
    ray_metrics = CampaignMetrics(campaign.name, phase.name)
    budget_n, budget_s = spec.budget.episodes, spec.budget.seconds
    desc = f"{'' if phase.name == 'safety' else phase.name + ' '}{spec.fuzzer} {phase.scenario.name}"
    bar = tqdm(total=budget_n or budget_s, initial=st.done if budget_n else st.elapsed,
               unit=phase.unit if budget_n else "s", desc=desc, disable=not progress)
    t_start = time.perf_counter() - st.elapsed
    try:
        while (n := next_generation_size(spec, st.done, st, fuzzer)) is not None:
            row = _one_generation(phase, st, n, executor, t_start)
            phase.commit(st)
            snapshot(phase.run, phase.name, fuzzer, st)
            if mlrun:
                tracking.log_metrics(mlrun, {k: v for k, v in row.items() if k not in ("generation", "phase")},
                                     step=st.done)
            ray_metrics.update(episodes=phase.episodes_run(n), **phase.gauges(row))
            bar.update(n if budget_n else st.elapsed - bar.n)
            bar.set_postfix(**phase.postfix(row), phase=st.phase)
    except BaseException:
        if mlrun:
            tracking.end_run(mlrun, "FAILED")
        raise
    finally:
        bar.close()
        executor.close()
        if llm_pool is not None:
            llm_pool.close()
    summary = phase.summarize(st)
    if mlrun:
        tracking.log_metrics(mlrun, {k: v for k, v in summary.items() if isinstance(v, (int, float))}, step=st.done)
        tracking.log_artifact(mlrun, phase.run.summary_json(phase.name))
        tracking.end_run(mlrun)
    return summary


def _one_generation(phase: Phase, st: LoopState, n: int, executor: Executor, t_start: float) -> dict:
    proposal = phase.fuzzer.propose(n)
    states = phase.scenario.validate(proposal.states)
    gen_seed = generation_seed(phase.campaign.seed, phase.name, st.generation)
    t_roll = time.perf_counter()
    result = executor.run(states, seed=gen_seed, repeats=phase.repeats)
    st.rollout_seconds += time.perf_counter() - t_roll
    phase.fuzzer.observe(proposal, phase.judge(states, result, gen_seed))
    st.elapsed = time.perf_counter() - t_start
    metrics = phase.record(st, states, result, gen_seed)
    st.done += n
    if st.phase == "sampling":
        st.sampling_done += n
    row = {"generation": st.generation, "phase": st.phase, phase.count_name: st.done, "wall_time": st.elapsed,
           **metrics, **llm_metrics(phase.fuzzer)}
    st.timeline.append(row)
    st.generation += 1
    return row
