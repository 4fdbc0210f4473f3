"""One unit of a fuzzing phase's work, shared by both execution modes (``sync`` generations in
:mod:`orchestrator.campaign.generations`, ``async`` units in :mod:`orchestrator.campaign.async_loop`):
the next unit's size under the budget, the fuzzer's proposals as a unit with its episode seed, and
the unit's result applied (judged, observed, recorded)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from orchestrator.fuzzers.base import Feedback, Proposal

# each phase draws its episode seeds from its own stream of the campaign seed
SEED_STREAM = {"safety": 0, "optimality": 500_000}


def generation_seed(campaign_seed: int, phase: str, generation: int) -> int:
    """The seed of one generation's episodes (``deltarl replay`` re-runs a bug with it)."""
    return int(campaign_seed) * 1_000_003 + SEED_STREAM[phase] + int(generation)


def next_generation_size(spec, done: int, st, fuzzer, size: int | None = None, flying: int = 0) -> int | None:
    """The size of the next generation (or async unit: ``size``) under ``spec``'s budget after
    ``done`` episodes (test cases; in async mode, proposals issued) and ``st.elapsed`` seconds, or
    None when the budget is spent. Moves ``st`` and the fuzzer to the fuzzing phase once the
    sampling share of the budget is spent; while ``flying`` units of it are not yet applied it
    returns 0 instead (wait: fuzzing proposals need the whole initial corpus)."""
    b = spec.budget
    left = None if b.episodes is None else b.episodes - done
    if (left is not None and left <= 0) or (b.seconds is not None and st.elapsed >= b.seconds):
        return None
    sampling_n = int(round(spec.sampling_fraction * b.episodes)) if b.episodes else None
    sampling_s = spec.sampling_fraction * b.seconds if b.seconds else None
    if st.phase == "sampling" and ((sampling_n is not None and done >= sampling_n)
                                   or (sampling_s is not None and st.elapsed >= sampling_s)):
        if flying:
            return 0
        st.phase = "fuzzing"
        fuzzer.start_phase("fuzzing")
    n = spec.generation_size if size is None else size
    if st.phase == "sampling" and sampling_n is not None:
        n = min(n, sampling_n - done)
    return n if left is None else min(n, left)


@dataclass(frozen=True, eq=False)
class WorkUnit:
    """One generation (``sync``) or one unit in flight (``async``): the fuzzer's proposals, the
    states the scenario validated from them, and the seed its episodes run with. Snapshots hold
    the units in flight (as dicts of these fields: ``dataclasses.asdict`` of the loop state;
    :meth:`of` reads them back)."""

    generation: int  # the unit's number (async units finish out of order)
    proposed: np.ndarray  # the proposal's states as the fuzzer gave them (what it observes)
    tags: dict  # the proposal's per-state tags (parent ids, kinds, ...)
    states: np.ndarray  # the states the episodes start from (validated by the scenario)
    n: int  # proposals: the episodes (test cases) the unit adds to the budget
    phase: str  # "sampling" | "fuzzing": the fuzzer's phase when it proposed the unit
    gen_seed: int  # the seed of the unit's episodes (generation_seed)

    @classmethod
    def of(cls, unit) -> "WorkUnit":
        """``unit`` itself, or the unit a snapshot holds as a dict of its fields."""
        return unit if isinstance(unit, cls) else cls(**unit)

    @property
    def proposal(self) -> Proposal:
        """The proposal the fuzzer observes the unit's feedback against."""
        return Proposal(self.proposed, dict(self.tags))


@dataclass(frozen=True, eq=False)
class Verdict:
    """A phase's judgement of one unit's result (:meth:`Phase.judge`): the feedback the fuzzer
    observes; a phase whose record needs more from the judgement (the optimality phase's
    confirmed bugs) returns a subclass, which its ``record`` reads."""

    feedback: Feedback


def propose_unit(phase, st, n: int) -> WorkUnit:
    """The fuzzer's next ``n`` proposals as a unit numbered ``st.generation`` (its seed follows)."""
    proposal = phase.fuzzer.propose(n)
    states = phase.scenario.validate(proposal.states)
    # the proposal as plain arrays: a snapshot holds the unit as a dict of its fields (WorkUnit.of)
    return WorkUnit(generation=st.generation, proposed=proposal.states, tags=dict(proposal.tags), states=states, n=n,
                    phase=st.phase, gen_seed=generation_seed(phase.campaign.seed, phase.name, st.generation))


def apply_unit(phase, st, unit: WorkUnit, result, t_start: float) -> dict:
    """Judge, observe and record one unit's result; its timeline row (the phase's columns, then
    those of the phase's services). ``st.generation`` reads as the unit's number while the phase
    records it (async units finish out of order)."""
    issued, st.generation = st.generation, unit.generation
    try:
        judged = phase.judge(unit.states, result, unit.gen_seed)
        phase.fuzzer.observe(unit.proposal, judged.feedback)
        st.elapsed = time.perf_counter() - t_start  # when its verdicts were found (the rows' wall_time)
        metrics = phase.record(st, unit, result, judged)
    finally:
        st.generation = issued
    st.elapsed = time.perf_counter() - t_start  # the phase's clock includes recording (confirmation re-runs)
    st.done += unit.n
    if st.phase == "sampling":
        st.sampling_done += unit.n
    row = {"generation": unit.generation, "phase": st.phase, phase.count_name: st.done, "wall_time": st.elapsed,
           **metrics}
    for service in phase.services:
        row.update(service.unit_columns())
    st.timeline.append(row)
    return row
