"""THE generation loop: every fuzzing phase (safety, optimality, and repair's re-evaluation,
which is a safety phase against AUT-Improved) runs here. A phase supplies only what differs,
the way d3rlpy's algorithms share one fitter and supply their loss:

    class MyPhase(Phase):
        name = "safety"                      # the store phase family, snapshot prefix, MLflow experiment
        def judge(self, states, result, gen_seed): ...  # -> a Verdict: the fuzzer's Feedback (and the phase's verdicts)
        def record(self, st, unit, result, verdict): ...  # store writes, counters -> metrics row
        def summarize(self, st): ...         # summary files -> the summary dict

One generation: ``fuzzer.propose(n)`` → the scenario validates the states (a
:class:`~orchestrator.campaign.units.WorkUnit`: proposals, states, seed ``generation_seed``) →
the executor runs the phase's policies from them (``repeats`` each) → ``phase.judge`` →
``fuzzer.observe`` → ``phase.record`` (Parquet) → a timeline row → ``phase.commit`` (files such
as ``bugs.parquet``) → a snapshot → MLflow, Ray metrics, the progress bar (:class:`Reporter`).
:class:`PhaseRun` holds what a run of the loop opens: the executor (its workers: the one
``workers: auto`` rule, :func:`~orchestrator.cluster.executor.phase_workers`), the corpus actor,
and the phase's services (:class:`PhaseService`: an LLM-guided fuzzer's LLM pool, which adds its
columns to the timeline and its figures to the summary; :mod:`orchestrator.campaign.llm_service`).
The loop itself knows of no particular fuzzer.

Snapshots (``snapshots/<prefix>-NNNNNN.pkl``, written whole) hold the fuzzer's state, the loop
state and the Parquet part files committed so far (the store's
:func:`~orchestrator.runs.store.committed_parts`); ``resume`` deletes the parts written after the
last snapshot (:func:`~orchestrator.runs.store.drop_uncommitted`: a generation cut short, or every
part of the phase when it was killed before its first snapshot), restores both states and
continues: with an episode budget the resumed run
reaches exactly the result of an uninterrupted one with the same seed. A damaged newest
snapshot falls back to the previous one (two are kept), with a message.
The sampling phase spends ``sampling_fraction`` of the budget (episodes or seconds) on the
initial corpus.

``execution: async`` (per phase; the default ``sync`` is the loop above) removes the barrier:
:mod:`orchestrator.campaign.async_loop` keeps a window of small units in flight and applies each
result as it arrives (the Parquet record is the same; ``iteration`` = the unit's number); the order
it applied them is recorded (:meth:`RunFolder.applied_order_parquet`) and ``replay=`` runs a
campaign in a recorded order: with an episode budget it gives the same proposals and verdicts.
Snapshots (every ``generation_size`` results) also hold the units in flight (as dicts of their
fields; a snapshot of a version whose units differ is refused with a message); a resumed run
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

from orchestrator.campaign.async_loop import applied_order, corpus_place, run_async, write_applied_order
from orchestrator.campaign.config import set_values
from orchestrator.campaign.units import (
    Verdict,
    WorkUnit,
    apply_unit,
    generation_seed,
    next_generation_size,
    propose_unit,
)
from orchestrator.cluster.corpus_actor import RemoteFuzzer
from orchestrator.cluster.executor import Executor, phase_workers
from orchestrator.cluster.progress import CampaignMetrics
from orchestrator.runs import tracking
from orchestrator.runs.files import damaged_error, damaged_parts
from orchestrator.runs.layout import SNAPSHOT_PREFIX, RunFolder
from orchestrator.runs.progress_lines import progress_bar
from orchestrator.runs.store import StoreError, atomic_write_bytes, committed_parts, drop_uncommitted

__all__ = ["LoopState", "Phase", "PhaseService", "Verdict", "WorkUnit", "applied_order", "generation_seed",
           "run_phase", "snapshot", "restore"]


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
    in_flight: list = field(default_factory=list)  # WorkUnits issued but not applied (a resume submits them again)
    applied: list = field(default_factory=list)  # one row per applied unit, in the order applied
    window: int = 0  # units kept in flight (fixed at the phase's start: a replay needs the same)
    unit_size: int = 0  # proposals per unit (fixed at the phase's start, likewise)

    def __post_init__(self):
        # a snapshot holds the units in flight as dicts of their fields (dataclasses.asdict)
        self.in_flight = [WorkUnit.of(u) for u in self.in_flight]


class PhaseService:
    """Something a phase brings to the loop beside its fuzzer, e.g. an LLM-guided fuzzer's LLM
    (:mod:`orchestrator.campaign.llm_service`). The loop starts it once it knows where the
    rollouts run, adds its columns to each timeline row and its figures to the summary, and
    closes it at the end (also when the phase fails)."""

    def start(self, workers: int) -> None:
        """Start what the phase needs (``workers``: the phase's Ray rollout actors, 0 in-process)."""

    def unit_columns(self) -> dict:
        """Timeline columns after each applied unit (after the phase's own)."""
        return {}

    def summary_figures(self) -> dict:
        """Entries added to the phase's summary (after the phase's own; written with it)."""
        return {}

    def close(self) -> None:
        """Stop what :meth:`start` started (called once, also after a failed start)."""


class Phase(abc.ABC):
    """What one fuzzing phase adds to the loop."""

    name: str = ""  # "safety" | "optimality"
    unit: str = "ep"  # progress-bar unit of the budget
    count_name: str = "episodes"  # the timeline column of ``LoopState.done``
    repeats: int = 1  # rollouts per policy and state
    state_class = LoopState

    def __init__(self, campaign, spec, scenario, run: RunFolder, store, fuzzer, uris: dict, policies: dict,
                 services: list[PhaseService] | tuple = ()):
        self.campaign, self.spec, self.scenario = campaign, spec, scenario
        self.run, self.store, self.fuzzer = run, store, fuzzer
        self.uris, self.policies = uris, policies
        self.services = list(services)
        self.policy_hashes: dict = {}
        self.executor_info: dict = {}  # which executor ran the phase and why (the summary has it)

    @abc.abstractmethod
    def judge(self, states, result, gen_seed: int) -> Verdict:
        """The phase's verdict on a unit's result: the fuzzer's
        :class:`~orchestrator.fuzzers.base.Feedback` (and what :meth:`record` needs)."""

    @abc.abstractmethod
    def record(self, st, unit: WorkUnit, result, verdict: Verdict) -> dict:
        """Write the unit to the store and update ``st``; the phase's timeline columns."""

    @abc.abstractmethod
    def summarize(self, st) -> dict:
        """Write the phase's summary files; return the summary."""

    @abc.abstractmethod
    def commit(self, st) -> None:
        """Write the files the phase writes whole before each snapshot (its verdicts)."""

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


# -- snapshots ---------------------------------------------------------------------------------
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
    return _loop_state(state_class, state, run)


def _loop_state(state_class, state, run: RunFolder):
    """The loop state a snapshot holds (a dict of its fields)."""
    if not isinstance(state, dict):
        return state
    try:
        return state_class(**state)
    except TypeError as exc:  # fields of another deltarl version (e.g. units in flight without a field)
        raise StoreError(f"the newest snapshot in {run.snapshots} cannot be read ({type(exc).__name__}: "
                         f"{str(exc)[:160]}); it was written by another deltarl version or is damaged") from exc


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


# -- the loop ----------------------------------------------------------------------------------
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
    mode = execution_mode(phase.spec)
    if replay is not None and mode != "async":
        raise ValueError("replay: only an async phase has an applied order to follow")
    phase.fuzzer.start_phase(st.phase)
    mlrun = phase.mlflow_run(resume)
    try:
        with PhaseRun(phase, st, executor, mode=mode, replay=replay) as run:
            summary = run.loop(mlrun, progress=progress)
    except BaseException:
        if mlrun:
            mlrun.end("FAILED")
        raise
    if mlrun:
        mlrun.log_metrics(mlflow_metrics({k: v for k, v in summary.items() if isinstance(v, (int, float))}), step=st.done)
        mlrun.log_artifact(phase.run.summary_json(phase.name))
        mlrun.end()  # waits until MLflow has everything (a failed MLflow only warns)
    return summary


class PhaseRun:
    """One run of a phase's loop and what it holds while it runs: the phase's services, the
    executor (unless the caller owns one) and, for ``corpus: actor``, the corpus actor. A
    context manager: entering opens them in that order, leaving closes them in reverse."""

    def __init__(self, phase: Phase, st: LoopState, executor: Executor | None, *, mode: str, replay: dict | None):
        self.phase, self.st, self.mode, self.replay = phase, st, mode, replay
        self.executor, self.own = executor, executor is None
        self.local_fuzzer, self.remote = phase.fuzzer, None

    def __enter__(self) -> "PhaseRun":
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self) -> None:
        phase = self.phase
        inference, inference_why = inference_mode(phase.spec, phase.scenario)
        workers, why = self._workers(inference)
        for service in phase.services:  # e.g. an LLM-guided fuzzer's LLM pool (on Ray when the rollouts are)
            service.start(workers)
        if self.own:
            c = phase.campaign
            self.executor = Executor(phase.scenario, phase.uris, workers=workers, batch_size=c.batch_size,
                                     scenario_overrides=c.scenario_overrides, policies=phase.policies, reason=why,
                                     name=f"{c.name}/{phase.name}", alone=inference == "alone")
        phase.policy_hashes = self.executor.policy_hashes
        phase.executor_info = self.executor.describe()
        phase.executor_info["inference_reason"] = inference_why
        if self.mode == "async":
            self._open_async()

    def _workers(self, inference: str) -> tuple[int, str]:
        """The phase's rollout actors and why: by ``workers`` (``auto``: the work left in the
        budget, :func:`~orchestrator.cluster.executor.phase_workers`), or the caller's executor's."""
        phase, ex = self.phase, self.executor
        if self.own:
            return phase_workers(phase.campaign.workers, phase.spec.budget, done=self.st.done,
                                 elapsed=self.st.elapsed, episodes_per_case=phase.episodes_run(1))
        if ex.alone != (inference == "alone"):
            raise ValueError(f"the phase asks for inference: {phase.spec.inference}, the executor given runs "
                             f"{'alone' if ex.alone else 'batched'}")
        return ex.workers, ex.reason or "the caller's executor"

    def _open_async(self) -> None:
        """The window and unit size (fixed at the phase's start, or the replayed run's) and where
        the corpus lives (``corpus: actor``: the phase's fuzzer is the actor's until the summary)."""
        phase, st, ex, replay = self.phase, self.st, self.executor, self.replay
        if not st.window:
            st.window = int(replay["window"]) if replay is not None else ex.window
            st.unit_size = int(replay["unit_size"]) if replay is not None else ex.unit_size(phase.spec.generation_size)
        phase.executor_info.update(execution="async", window=st.window, unit_size=st.unit_size)
        place, why_place = corpus_place(phase.spec, ex)
        phase.executor_info.update(corpus=place, corpus_reason=why_place)
        if place == "actor":
            self.remote = phase.fuzzer = RemoteFuzzer(self.local_fuzzer, name=f"{phase.campaign.name}/{phase.name}/corpus")

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
            self.phase.fuzzer = self.local_fuzzer
        if self.own and self.executor is not None:
            self.executor.close()
        for service in self.phase.services:
            service.close()

    def loop(self, mlrun, *, progress: bool) -> dict:
        """Apply generations (units) until the budget is spent; the phase's summary."""
        phase, st, executor = self.phase, self.st, self.executor
        reporter = Reporter(phase, st, mlrun, progress=progress, held=self.mode == "async")
        t_start = time.perf_counter() - st.elapsed
        try:
            if self.mode == "async":
                phase.store.hold()
                run_async(phase, st, executor, t_start, reporter.after, self.replay)
            else:
                while (n := next_generation_size(phase.spec, st.done, st, phase.fuzzer)) is not None:
                    reporter.after(_one_generation(phase, st, n, executor, t_start), n)
            return self._summary()
        finally:
            reporter.close()

    def _summary(self) -> dict:
        """The phase's summary with its services' figures (rewritten when they add any); the
        corpus actor's final state goes back to the driver's fuzzer (a later phase reads it)."""
        phase, remote = self.phase, self.remote
        if remote is not None:
            phase.executor_info.update(corpus_restores=remote.restores, corpus_seconds=round(remote.corpus_seconds, 3))
        summary = phase.summarize(self.st)
        figures = {}
        for service in phase.services:
            figures.update(service.summary_figures())
        if figures:
            summary = {**summary, **figures}
            phase.run.write_json(phase.run.summary_json(phase.name), summary)
        if remote is not None:
            self.local_fuzzer.load_state_dict(remote.state_dict())
        return summary


class Reporter:
    """What follows each applied generation (async: each unit): the progress bar, and with
    ``save`` the phase's commit, a snapshot and the reports to MLflow and Ray. An async phase
    (``held``: its store holds the rows between snapshots) saves at its snapshots only, so the
    episodes applied since the last one are reported together."""

    def __init__(self, phase: Phase, st: LoopState, mlrun, *, progress: bool, held: bool):
        self.phase, self.st, self.mlrun, self.held = phase, st, mlrun, held
        spec = phase.spec
        self.budget_n, self.budget_s = spec.budget.episodes, spec.budget.seconds
        self.ray_metrics = CampaignMetrics(phase.campaign.name, phase.name)
        desc = f"{phase.name} {spec.fuzzer} {phase.scenario.name}"
        # a bar on a terminal; in a log a line per tenth of the budget or 30 s (runs/progress_lines.py)
        self.bar = progress_bar(self.budget_n or self.budget_s, initial=st.done if self.budget_n else st.elapsed,
                                unit=phase.unit if self.budget_n else "s", desc=desc, enabled=progress)
        self.unreported = 0  # episodes (test cases) applied since the last report

    def after(self, row: dict, n: int, save: bool = True) -> None:
        self.unreported += n
        if save:
            self._save()
            self._report(row, self.unreported)
            self.unreported = 0
        if save:  # before the update: a line written by it shows the latest counts
            self.bar.set_postfix(**self.phase.postfix(row), phase=self.st.phase)
        self.bar.update(n if self.budget_n else self.st.elapsed - self.bar.n)

    def _save(self) -> None:
        phase, st = self.phase, self.st
        if self.held:
            phase.store.flush()  # the units applied since the last snapshot, as one part
            write_applied_order(phase, st)
        phase.commit(st)
        snapshot(phase.run, phase.name, phase.fuzzer, st)

    def _report(self, row: dict, n: int) -> None:
        phase, st = self.phase, self.st
        if self.mlrun:
            self.mlrun.log_metrics(mlflow_metrics({k: v for k, v in row.items() if k not in ("generation", "phase")}),
                                   step=st.done)
        done = (f"{st.done}/{self.budget_n} {phase.count_name}" if self.budget_n
                else f"{st.elapsed:.0f}/{self.budget_s:g} s")
        self.ray_metrics.update(episodes=phase.episodes_run(n), progress=done, **phase.gauges(row))

    def close(self) -> None:
        self.bar.close()


def _one_generation(phase: Phase, st: LoopState, n: int, executor: Executor, t_start: float) -> dict:
    unit = propose_unit(phase, st, n)
    t_roll = time.perf_counter()
    result = executor.run(unit.states, seed=unit.gen_seed, repeats=phase.repeats)
    st.rollout_seconds += time.perf_counter() - t_roll
    row = apply_unit(phase, st, unit, result, t_start)
    st.generation += 1
    return row
