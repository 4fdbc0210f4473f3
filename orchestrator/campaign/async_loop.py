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
models, RNG) lives in a Ray actor (:class:`~orchestrator.cluster.corpus_actor.FuzzerHost`); the driver
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

from orchestrator.campaign.units import WorkUnit, apply_unit, next_generation_size, propose_unit
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
class UnitsInFlight:
    """The units an async phase has in flight (by number) and the proposals it has issued (those
    applied and those in flight): what the budget of the next unit is counted against."""

    def __init__(self, phase, st, executor):
        self.phase, self.st, self.executor = phase, st, executor
        self.units: dict = {}
        for unit in st.in_flight:  # a resumed run: the units issued before the snapshot run again
            self._submit(unit)
        self.issued = st.done + sum(u.n for u in self.units.values())

    def _submit(self, unit: WorkUnit) -> None:
        self.executor.submit(unit.generation, unit.states, seed=unit.gen_seed, repeats=self.phase.repeats)
        self.units[unit.generation] = unit

    def fill(self) -> None:
        """New units from the corpus as it now stands until the window is full (or the budget,
        or the sampling barrier, says wait)."""
        phase, st = self.phase, self.st
        while len(self.units) < st.window:
            n = next_generation_size(phase.spec, self.issued, st, phase.fuzzer, size=st.unit_size,
                                     flying=len(self.units))
            if not n:
                break
            unit = propose_unit(phase, st, n)
            st.generation += 1
            self._submit(unit)
            self.issued += n
        st.in_flight = list(self.units.values())

    def pop(self, generation: int) -> WorkUnit:
        return self.units.pop(generation)


def run_async(phase, st, executor, t_start: float, after, replay: dict | None) -> None:
    """The steady-state loop (``execution: async``): see the module's docstring. ``after(row, n,
    save=)`` follows each applied unit (``save``: a snapshot is due)."""
    order = None if replay is None else list(replay["order"])
    flight = UnitsInFlight(phase, st, executor)
    flight.fill()
    while flight.units:
        key = _replayed_key(order, st, flight.units)
        t_roll = time.perf_counter()
        g, result = executor.next_result(key)
        st.rollout_seconds += time.perf_counter() - t_roll
        unit = flight.pop(g)
        row = apply_unit(phase, st, unit, result, t_start)
        st.applied.append({"applied": len(st.applied), "generation": int(g), "gen_seed": int(unit.gen_seed),
                           phase.count_name: int(unit.n), "phase": unit.phase, "window": int(st.window),
                           "unit_size": int(st.unit_size), "wall_time": float(st.elapsed)})
        flight.fill()
        after(row, unit.n, save=_snapshot_due(phase.spec, st, unit, flight.units))


def _replayed_key(order: list | None, st, flying: dict):
    """The unit to apply next in a replay (its recorded order); None without one (whichever
    finishes first)."""
    if order is None:
        return None
    k = len(st.applied)
    key = order[k] if k < len(order) else None
    if key is None or key not in flying:
        raise StoreError(f"replay: the recorded order has unit {'none' if key is None else key} next ({k} applied), "
                         f"but the units in flight are {sorted(flying)}: the replayed campaign differs from the "
                         f"recorded one (budget, window, seed)")
    return key


def _snapshot_due(spec, st, unit: WorkUnit, flying: dict) -> bool:
    """A snapshot every ``generation_size`` results (and after the last unit)."""
    g_size = max(1, int(spec.generation_size))
    return not flying or st.done // g_size > (st.done - unit.n) // g_size


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
