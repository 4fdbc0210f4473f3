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
the last snapshot (a generation cut short, or every part of the phase when it was killed before
its first snapshot), restores both states and continues: with an episode budget the resumed run
reaches exactly the result of an uninterrupted one with the same seed. A damaged newest
snapshot falls back to the previous one (two are kept), with a message.
The sampling phase spends ``sampling_fraction`` of the budget (episodes or seconds) on the
initial corpus.

``execution: async`` (per phase; the default ``sync`` is the loop above) removes the barrier:
:mod:`orchestrator.campaign.async_loop` keeps a window of small units in flight and applies each
result as it arrives (the Parquet record is the same; ``iteration`` = the unit's number); the order
it applied them is recorded (:meth:`RunFolder.applied_order_parquet`) and ``replay=`` runs a
campaign in a recorded order: with an episode budget it gives the same proposals and verdicts.
Snapshots (every ``generation_size`` results) also hold the units in flight; a resumed run
submits them again first. ``corpus: actor`` puts the fuzzer in a Ray actor, restored from the
last snapshot when it dies.
"""

from __future__ import annotations

import abc
import dataclasses
import pickle
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from orchestrator.campaign.async_loop import applied_order, corpus_place, run_async, write_applied_order
from orchestrator.campaign.config import set_values
from orchestrator.campaign.units import apply_unit, generation_seed, next_generation_size, propose_unit
from orchestrator.cluster.corpus_actor import RemoteFuzzer
from orchestrator.cluster.driver import CampaignMetrics
from orchestrator.cluster.executor import Executor, resolve_workers
from orchestrator.cluster.llm_pool import attach_llm
from orchestrator.runs import tracking
from orchestrator.runs.files import damaged_error, damaged_parts
from orchestrator.runs.layout import SNAPSHOT_PREFIX, RunFolder
from orchestrator.runs.store import StoreError, atomic_write_bytes

__all__ = ["LoopState", "Phase", "applied_order", "generation_seed", "run_phase", "snapshot", "restore"]

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
    # execution: async (empty in sync runs)
    in_flight: list = field(default_factory=list)  # units issued but not applied (a resume submits them again)
    applied: list = field(default_factory=list)  # one row per applied unit, in the order applied
    window: int = 0  # units kept in flight (fixed at the phase's start: a replay needs the same)
    unit_size: int = 0  # proposals per unit (fixed at the phase's start, likewise)


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
        self.executor_info: dict = {}  # which executor ran the phase and why (the summary has it)

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
        """Start this phase's MLflow run (None when the campaign has MLflow off). It is written by
        a separate process (:class:`~orchestrator.runs.tracking.AsyncRun`): the phase does not wait
        for MLflow to start, and :func:`run_phase` flushes it at the end."""
        if not self.campaign.mlflow:
            return None
        return tracking.AsyncRun(self.run.root, self.name, f"{self.campaign.name}-{self.spec.fuzzer}",
                                 params=set_values({"campaign": self.campaign.to_dict(), "resume": resume,
                                                    **self.mlflow_params()}),
                                 tags={"deltarl.kind": self.name, "scenario": self.scenario.name,
                                       "fuzzer": self.spec.fuzzer, **self.mlflow_tags()})

    def mlflow_params(self) -> dict:
        return {}

    def mlflow_tags(self) -> dict:
        return {}


# MLflow's charts show sections named by a metric's prefix ("findings/...") alphabetically, before
# the unprefixed "Model metrics": what a phase found goes first, over the episodes (test cases) run
FINDINGS = ("failures", "distinct_failures", "bugs", "distinct_bugs")


def mlflow_metrics(metrics: dict) -> dict:
    """A phase's metrics as MLflow gets them: failures and bugs (and their distinct cells) in the
    ``findings/`` section, the rest as they are."""
    return {f"findings/{k}" if k in FINDINGS else k: v for k, v in metrics.items()}


# -- budget ------------------------------------------------------------------------------------
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
        snap = pickle.loads(path.read_bytes())
        if not isinstance(snap, dict) or not {"fuzzer", "state", "committed"} <= set(snap):
            raise ValueError("not a deltarl generation snapshot")
        return snap
    except Exception as exc:  # noqa: BLE001 - a snapshot of another deltarl version or a damaged file
        raise StoreError(f"snapshot {path} cannot be read ({type(exc).__name__}: {str(exc)[:160]}); it was written "
                         f"by another deltarl version or is damaged") from exc


def newest_snapshot(run: RunFolder, phase: str) -> dict | None:
    """The newest readable snapshot of ``phase`` (None when it has none). A damaged newest one
    (truncated by a full disk, a copy cut short) falls back to the one before, with a message on
    stderr; when none can be read: :class:`StoreError`."""
    snaps = run.snapshot_files(phase)
    errors = []
    for path in reversed(snaps):
        try:
            snap = _load_snapshot(path)
        except StoreError as exc:
            errors.append(str(exc))
            continue
        if errors:
            print(f"deltarl: warning: {errors[0]}; resuming from the previous snapshot {path.name} (its generation "
                  f"is run again)", file=sys.stderr)
        return snap
    if errors:
        raise StoreError(f"no snapshot of the {phase} phase in {run.snapshots} can be read ({errors[0]}): the run "
                         f"cannot be resumed; start it anew in another folder")
    return None


def restore(run: RunFolder, phase: str, fuzzer, state_class, committed: list[str] | None = None):
    """The newest readable snapshot of ``phase`` into ``fuzzer``; part files written after it are
    deleted: every part that no phase's newest snapshot committed (and that is not in
    ``committed``). Without a snapshot of ``phase`` (a kill before its first one): a fresh state,
    and the phase's parts are gone. The parts kept must be readable (:class:`StoreError` naming
    the damaged ones)."""
    snap = newest_snapshot(run, phase)
    keep = set(committed or [])
    for other in SNAPSHOT_PREFIX:  # what any phase committed stays (a finished phase's parts too)
        other_snap = snap if other == phase else newest_snapshot(run, other)
        if other_snap is not None:
            keep |= set(other_snap["committed"])
    drop_uncommitted(run.root, keep)
    bad = damaged_parts(run.root / name for name in sorted(keep))
    if bad:
        raise damaged_error(bad, f"run {run.root}")
    if snap is None:
        return state_class()
    fuzzer.load_state_dict(snap["fuzzer"])
    state = snap["state"]
    return state_class(**state) if isinstance(state, dict) else state


def committed_anywhere(run: RunFolder) -> set:
    """The part files that some phase's newest snapshot committed (a finished phase's parts
    stay when a later phase is restored)."""
    keep = set()
    for phase in SNAPSHOT_PREFIX:
        snap = newest_snapshot(run, phase)
        if snap is not None:
            keep |= set(snap["committed"])
    return keep


def committed_by(run: RunFolder, phase: str) -> list[str]:
    """The part files ``phase`` had committed at its last snapshot (none: [])."""
    snap = newest_snapshot(run, phase)
    return snap["committed"] if snap is not None else []


def drop_uncommitted(run_dir: Path, keep: set) -> None:
    for d in ("steps", "episodes"):  # part files of a generation that never got its snapshot
        for p in (run_dir / d).glob("*.parquet"):
            if str(p.relative_to(run_dir)) not in keep:
                p.unlink()


# -- the loop ----------------------------------------------------------------------------------
def plan_executor(phase: Phase, st: LoopState) -> tuple[int, str]:
    """The phase's rollout actors and why (``workers: auto``: by the work left in its budget)."""
    b = phase.spec.budget
    episodes = None if b.episodes is None else phase.episodes_run(max(0, b.episodes - st.done))
    seconds = None if b.seconds is None else max(0.0, b.seconds - st.elapsed)
    return resolve_workers(phase.campaign.workers, episodes=episodes, seconds=seconds)


def inference_mode(spec, scenario) -> tuple[str, str]:
    """The phase's inference ("batched" or "alone") and why. ``alone``: every observation of the
    phase is acted on as if alone, so its episodes are the agents as deployed and candidates need
    no re-run (orchestrator.campaign.confirm); ``auto`` (the default) takes the scenario's
    ``inference_default`` (alone for MuJoCo and Box2D, batched for the others)."""
    mode = getattr(spec, "inference", "auto") or "auto"
    if mode != "auto":
        return mode, f"inference: {mode} in the campaign"
    return (getattr(scenario, "inference_default", "batched"),
            f"inference: auto, {getattr(scenario, 'name', 'the scenario')}: {getattr(scenario, 'inference_why', '')}")


def inference_alone(spec, scenario) -> bool:
    return inference_mode(spec, scenario)[0] == "alone"


def execution_mode(spec) -> str:
    return getattr(spec, "execution", "sync") or "sync"


def run_phase(phase: Phase, st: LoopState, *, resume: bool = False, progress: bool = True,
              executor: Executor | None = None, replay: dict | None = None) -> dict:
    """Run ``phase`` from ``st`` until its budget is spent; write its summary and return it.
    ``executor``: one the caller owns (left open; benchmarks reuse one across runs).
    ``replay`` (async only, :func:`applied_order`): apply the units in that recorded order."""
    campaign, spec, fuzzer = phase.campaign, phase.spec, phase.fuzzer
    fuzzer.start_phase(st.phase)
    mlrun = phase.mlflow_run(resume)
    llm_pool = None
    own = executor is None
    inference, inference_why = inference_mode(spec, phase.scenario)
    try:
        if own:
            workers, why = plan_executor(phase, st)
        else:
            workers, why = executor.workers, executor.reason or "the caller's executor"
            if executor.alone != (inference == "alone"):
                raise ValueError(f"the phase asks for inference: {spec.inference}, the executor given runs "
                                 f"{'alone' if executor.alone else 'batched'}")
        llm_pool = attach_llm(fuzzer, campaign, phase.run.root, use_ray=workers > 0)  # LLM-guided fuzzers only
        if own:
            executor = Executor(phase.scenario, phase.uris, workers=workers, batch_size=campaign.batch_size,
                                scenario_overrides=campaign.scenario_overrides, policies=phase.policies, reason=why,
                                name=f"{campaign.name}/{phase.name}", alone=inference == "alone")
    except BaseException:
        if llm_pool is not None:
            llm_pool.close()
        if mlrun:
            mlrun.end("FAILED")
        raise
    phase.policy_hashes = executor.policy_hashes
    phase.executor_info = executor.describe()
    phase.executor_info["inference_reason"] = inference_why
    mode = execution_mode(spec)
    if replay is not None and mode != "async":
        raise ValueError("replay: only an async phase has an applied order to follow")
    if mode == "async":
        if not st.window:
            st.window = int(replay["window"]) if replay is not None else executor.window
            st.unit_size = int(replay["unit_size"]) if replay is not None else executor.unit_size(spec.generation_size)
        phase.executor_info.update(execution="async", window=st.window, unit_size=st.unit_size)
    local_fuzzer, remote = fuzzer, None
    if mode == "async":
        place, why_place = corpus_place(spec, executor)
        phase.executor_info.update(corpus=place, corpus_reason=why_place)
        if place == "actor":  # the phase's fuzzer is the corpus actor's from here to the summary
            remote = phase.fuzzer = RemoteFuzzer(fuzzer, name=f"{campaign.name}/{phase.name}/corpus")
    ray_metrics = CampaignMetrics(campaign.name, phase.name)
    budget_n, budget_s = spec.budget.episodes, spec.budget.seconds
    desc = f"{'' if phase.name == 'safety' else phase.name + ' '}{spec.fuzzer} {phase.scenario.name}"
    bar = tqdm(total=budget_n or budget_s, initial=st.done if budget_n else st.elapsed,
               unit=phase.unit if budget_n else "s", desc=desc, disable=not progress)
    t_start = time.perf_counter() - st.elapsed

    unreported = [0]  # async: episodes applied since the last report

    def after(row: dict, n: int, save: bool = True) -> None:
        """What follows each applied generation (async: each unit; ``save``: commit, snapshot and
        the reports to MLflow and Ray, which an async phase makes at its snapshots only)."""
        unreported[0] += n
        row_n = n
        if not save:
            bar.update(n if budget_n else st.elapsed - bar.n)
            return
        n, unreported[0] = unreported[0], 0
        if mode == "async":
            phase.store.flush()  # the units applied since the last snapshot, as one part
            write_applied_order(phase, st)
        phase.commit(st)
        snapshot(phase.run, phase.name, phase.fuzzer, st)
        if mlrun:
            mlrun.log_metrics(mlflow_metrics({k: v for k, v in row.items() if k not in ("generation", "phase")}),
                              step=st.done)
        done = f"{st.done}/{budget_n} {phase.count_name}" if budget_n else f"{st.elapsed:.0f}/{budget_s:g} s"
        ray_metrics.update(episodes=phase.episodes_run(n), progress=done, **phase.gauges(row))
        bar.update(row_n if budget_n else st.elapsed - bar.n)
        bar.set_postfix(**phase.postfix(row), phase=st.phase)

    try:
        if mode == "async":
            phase.store.hold()
            run_async(phase, st, executor, t_start, after, replay)
        else:
            while (n := next_generation_size(spec, st.done, st, fuzzer)) is not None:
                after(_one_generation(phase, st, n, executor, t_start), n)
        if remote is not None:
            phase.executor_info.update(corpus_restores=remote.restores, corpus_seconds=round(remote.corpus_seconds, 3))
        summary = _with_llm_figures(phase, phase.summarize(st))
        if remote is not None:  # the driver's fuzzer takes the actor's final state (a later phase reads it)
            local_fuzzer.load_state_dict(remote.state_dict())
    except BaseException:
        if mlrun:
            mlrun.end("FAILED")
        raise
    finally:
        bar.close()
        if remote is not None:
            remote.close()
            phase.fuzzer = local_fuzzer
        if own:
            executor.close()
        if llm_pool is not None:
            llm_pool.close()
    if mlrun:
        mlrun.log_metrics(mlflow_metrics({k: v for k, v in summary.items() if isinstance(v, (int, float))}), step=st.done)
        mlrun.log_artifact(phase.run.summary_json(phase.name))
        mlrun.end()  # waits until MLflow has everything (a failed MLflow only warns)
    return summary


def _with_llm_figures(phase: Phase, summary: dict) -> dict:
    """An LLM-guided fuzzer's summary says how many LLM calls gave a usable scenario: a method
    whose every call fell back to random mutation must not look like a working one."""
    if not phase.fuzzer.needs_llm:
        return summary
    s = phase.fuzzer.stats()
    calls, usable = int(s.get("llm_calls", 0)), int(s.get("llm_usable", 0))
    answered = int(s.get("llm_ok", 0))  # calls that came back with a reply (the others failed after retries)
    invalid = int(s.get("llm_unparseable", 0)) + int(s.get("llm_invalid", 0))
    summary = {**summary, "llm_calls": calls, "llm_usable": usable, "llm_fallbacks": int(s.get("llm_fallbacks", 0)),
               "llm_failed": int(s.get("llm_failed", 0)), "llm_unparseable": int(s.get("llm_unparseable", 0)),
               "llm_invalid": int(s.get("llm_invalid", 0)), "llm_replies": answered, "llm_invalid_replies": invalid,
               # share of the replies without a usable state (unparseable or outside the scenario's bounds)
               "llm_invalid_share": invalid / answered if answered else float("nan"),
               "llm_unchanged": int(s.get("llm_unchanged", 0)),
               # which operator made the failing fuzzing tests (tests: llm_usable, random_mutations,
               # llm_fallbacks): does the LLM's scenario fail more often than a random mutation?
               "llm_scenario_failures": int(s.get("llm_scenario_failures", 0)),
               "random_mutations": int(s.get("random_mutations", 0)),
               "random_mutation_failures": int(s.get("random_mutation_failures", 0)),
               "llm_fallback_failures": int(s.get("llm_fallback_failures", 0)),
               "llm_prompt_tokens": int(s.get("llm_prompt_tokens", 0)),
               "llm_completion_tokens": int(s.get("llm_completion_tokens", 0)),
               "llm_no_usable_scenario": calls > 0 and usable == 0}
    phase.run.write_json(phase.run.summary_json(phase.name), summary)
    return summary


def _one_generation(phase: Phase, st: LoopState, n: int, executor: Executor, t_start: float) -> dict:
    unit = propose_unit(phase, st, n)
    t_roll = time.perf_counter()
    result = executor.run(unit["states"], seed=unit["gen_seed"], repeats=phase.repeats)
    st.rollout_seconds += time.perf_counter() - t_roll
    row = apply_unit(phase, st, unit, result, t_start)
    st.generation += 1
    return row
