"""``execution: async``: the steady-state loop of a fuzzing phase (no generation barrier), and
``corpus: actor``, its corpus in a Ray actor (:mod:`orchestrator.campaign.generations` runs both).

The loop keeps ``executor.window`` units in flight (two per rollout actor), each unit a small
generation of ``executor.unit_size(generation_size)`` proposals with its own number and seed;
whenever a unit finishes (whichever first), its result is judged, observed and recorded at once
and the freed slot gets a new proposal from the corpus as it now stands. The budget is honoured
exactly (units are cut to what is left), the Parquet record is the same (``iteration`` = the
unit's number; the rows of the units applied between two snapshots are written as one part when
the snapshot is taken: ``RunStore.hold``); the one barrier left is the end of the sampling phase
(no fuzzing proposal before every sampling result is in). Which unit finished first is the only
nondeterminism, so the loop records the order it applied them (:func:`applied_order`) and
``replay=`` follows a recorded order: with an episode budget it gives the same proposals and
verdicts. In-process (``workers: 0``) the same loop runs the units in submission order.

``corpus: actor`` (async phases with Ray rollout actors): the fuzzer object (corpus, energies,
models, RNG) lives in a Ray actor (:class:`~orchestrator.fuzzers.corpus.FuzzerHost`); the driver
holds a :class:`~orchestrator.cluster.corpus_actor.RemoteFuzzer` in its place, which sends the results to the actor (without waiting:
an actor runs one caller's calls in the order sent) and gets the proposals from it. The handle
keeps every call made since the last snapshot (``state_dict``, which the phase takes every
``generation_size`` results). When the actor dies (a killed process, a lost node) a new one is
started from that snapshot and the calls are made again in the same order: fuzzers are
deterministic in their calls, so the restored corpus is exactly the one before the kill and the
run continues as an uninterrupted one would (its replay gives the same verdicts).
"""

from __future__ import annotations

import time

from orchestrator.campaign.units import apply_unit, next_generation_size, propose_unit
from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import StoreError


def corpus_place(spec, executor) -> tuple[str, str]:
    """Where an async phase keeps its corpus, and why: ``actor`` only when set (``corpus:
    actor``) and the rollouts run on Ray."""
    if (getattr(spec, "corpus", "driver") or "driver") != "actor":
        return "driver", "corpus: driver (the default)"
    if executor.workers == 0:
        return "driver", "corpus: actor, but the rollouts run in this process (workers: 0): no Ray"
    return "actor", "corpus: actor as set"


# -- the loop ---------------------------------------------------------------------------------------
def run_async(phase, st, executor, t_start: float, after, replay: dict | None) -> None:
    """The steady-state loop (``execution: async``): see the module's docstring."""
    spec = phase.spec
    unit = st.unit_size
    order = None if replay is None else list(replay["order"])
    flying: dict = {}
    for u in st.in_flight:  # a resumed run: the units issued before the snapshot run again
        executor.submit(u["generation"], u["states"], seed=u["gen_seed"], repeats=phase.repeats)
        flying[u["generation"]] = u
    issued = st.done + sum(u["n"] for u in flying.values())

    def fill() -> None:
        nonlocal issued
        while len(flying) < st.window:
            n = next_generation_size(spec, issued, st, phase.fuzzer, size=unit, flying=len(flying))
            if not n:
                break
            u = propose_unit(phase, st, n)
            st.generation += 1
            executor.submit(u["generation"], u["states"], seed=u["gen_seed"], repeats=phase.repeats)
            flying[u["generation"]] = u
            issued += n
        st.in_flight = list(flying.values())

    fill()
    while flying:
        key = None
        if order is not None:
            if len(st.applied) >= len(order) or order[len(st.applied)] not in flying:
                raise StoreError(f"replay: the recorded order has unit {order[len(st.applied)] if len(st.applied) < len(order) else 'none'} "
                                 f"next ({len(st.applied)} applied), but the units in flight are {sorted(flying)}: "
                                 f"the replayed campaign differs from the recorded one (budget, window, seed)")
            key = order[len(st.applied)]
        t_roll = time.perf_counter()
        g, result = executor.next_result(key)
        st.rollout_seconds += time.perf_counter() - t_roll
        u = flying.pop(g)
        row = apply_unit(phase, st, u, result, t_start)
        st.applied.append({"applied": len(st.applied), "generation": int(g), "gen_seed": int(u["gen_seed"]),
                           phase.count_name: int(u["n"]), "phase": u["phase"], "window": int(st.window),
                           "unit_size": int(st.unit_size),
                           "wall_time": float(st.elapsed)})
        fill()
        g_size = max(1, int(spec.generation_size))
        save = not flying or st.done // g_size > (st.done - u["n"]) // g_size
        after(row, u["n"], save=save)


def write_applied_order(phase, st) -> None:
    import pandas as pd
    import pyarrow as pa

    phase.run.write_table(phase.run.applied_order_parquet(phase.name),
                          pa.Table.from_pandas(pd.DataFrame(st.applied), preserve_index=False))


def applied_order(run_dir, phase: str = "safety") -> dict:
    """The recorded order of an async phase in ``run_dir``: ``{"order": [unit numbers], "window",
    "unit_size"}`` (what ``run_phase(..., replay=)`` follows)."""
    import pyarrow.parquet as pq

    path = RunFolder(run_dir).applied_order_parquet(phase)
    if not path.is_file():
        raise StoreError(f"{path} does not exist: only a phase run with execution: async records its applied order")
    t = pq.read_table(path).to_pydict()
    window, unit = set(t["window"]), set(t["unit_size"])
    if len(window) != 1 or len(unit) != 1:
        raise StoreError(f"{path}: the window or unit size changed within the run ({sorted(window)}, {sorted(unit)})")
    return {"order": [int(g) for g in t["generation"]], "window": int(window.pop()), "unit_size": int(unit.pop())}
