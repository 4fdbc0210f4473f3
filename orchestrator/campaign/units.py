"""One unit of a fuzzing phase's work, shared by both execution modes (``sync`` generations in
:mod:`orchestrator.campaign.generations`, ``async`` units in :mod:`orchestrator.campaign.async_loop`):
the next unit's size under the budget, the fuzzer's proposals as a unit with its episode seed, and
the unit's result applied (judged, observed, recorded)."""

from __future__ import annotations

import time

from orchestrator.cluster.llm_pool import llm_metrics
from orchestrator.fuzzers.base import Proposal

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


def propose_unit(phase, st, n: int) -> dict:
    """The fuzzer's next ``n`` proposals as a unit numbered ``st.generation`` (its seed follows)."""
    proposal = phase.fuzzer.propose(n)
    states = phase.scenario.validate(proposal.states)
    # the proposal as plain arrays (snapshots hold units in flight; dataclasses.asdict would flatten a Proposal)
    return {"generation": st.generation, "proposed": proposal.states, "tags": dict(proposal.tags),
            "states": states, "n": n, "phase": st.phase,
            "gen_seed": generation_seed(phase.campaign.seed, phase.name, st.generation)}


def apply_unit(phase, st, unit: dict, result, t_start: float) -> dict:
    """Judge, observe and record one unit's result; its timeline row. ``st.generation`` reads as
    the unit's number while the phase records it (async units finish out of order)."""
    issued, st.generation = st.generation, unit["generation"]
    try:
        gen_seed, states = unit["gen_seed"], unit["states"]
        proposal = Proposal(unit["proposed"], dict(unit["tags"]))
        phase.fuzzer.observe(proposal, phase.judge(states, result, gen_seed))
        st.elapsed = time.perf_counter() - t_start  # when its verdicts were found (the rows' wall_time)
        metrics = phase.record(st, states, result, gen_seed)
    finally:
        st.generation = issued
    st.elapsed = time.perf_counter() - t_start  # the phase's clock includes recording (confirmation re-runs)
    n = unit["n"]
    st.done += n
    if st.phase == "sampling":
        st.sampling_done += n
    row = {"generation": unit["generation"], "phase": st.phase, phase.count_name: st.done, "wall_time": st.elapsed,
           **metrics, **llm_metrics(phase.fuzzer)}
    st.timeline.append(row)
    return row
