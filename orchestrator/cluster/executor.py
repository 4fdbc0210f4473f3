"""The one executor: run initial states with a set of policies, in this process or on N Ray
rollout actors, and get back the same :class:`~workers.rollout.RolloutResult`.

    with Executor(scenario, {"aut": uri}, workers=0) as ex:      # in this process, no Ray
        result = ex.run(states, seed=7)
    with Executor(scenario, {"aut": uri}, workers=2) as ex:      # two Ray actors
        for offset, part in ex.stream(states, seed=7): ...       # parts as they finish
        ex.submit("a", states, seed=7); ex.submit("b", more, seed=8)  # steady state (async campaigns):
        key, result = ex.next_result()                           # whichever finished first

Every caller (the CLI's ``rollout``, both campaign phases, repair's re-evaluation and the
benchmarks) goes through here, so there is one chunking rule (:func:`chunk_size`), one rule for
``workers: auto`` (:func:`plan_workers`; a campaign phase asks :func:`phase_workers`, the CLI
:func:`resolve_workers`) and one place that starts Ray. Episode seeds and state
indices are global, so the union of the parts equals one in-process call whatever the chunking.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from typing import Iterator

import numpy as np

from orchestrator.runs.files import StoreError
from workers.rollout import RolloutResult, RolloutWorker

# -- workers: auto ------------------------------------------------------------------------------
# Ray pays when the work it takes off this process outweighs its start-up. Measured on the
# project's 2-core machine (docs/scaling.md, docs/performance.md): the in-process engine runs
# ~130 CartPole episodes/s per core inside a fuzzing campaign; a fresh local cluster with two
# actors takes 15-20 s to start, joining a running one (deltarl ray up) a few seconds for the
# actors; and on 2 cores two actors beside the driver were slower than one process (85.9 vs
# 128.7 episodes/s). Hence:
AUTO_MIN_CPUS = 4  # fewer cores: the actors would share them with the driver and Ray's own processes
AUTO_EPISODES_PER_SECOND = 130.0  # in-process rate the estimate assumes (CartPole, one core)
AUTO_STARTUP_SECONDS = {"start": 20.0, "join": 5.0}  # a fresh local cluster + actors / actors on a running one
AUTO_PAYOFF = 2.0  # Ray when the phase's in-process estimate is at least this many start-ups


def plan_workers(workers, *, episodes: int | None = None, seconds: float | None = None, cpus: int | None = None,
                 cluster: dict | None = None) -> tuple[int, str]:
    """``(rollout actors, why)`` for a phase: ``workers`` as set (an integer), or for ``"auto"``:

    * in this process when the machine (or the running cluster) has fewer than
      :data:`AUTO_MIN_CPUS` CPUs;
    * in this process when the phase's work, estimated in-process at
      :data:`AUTO_EPISODES_PER_SECOND` (``episodes`` = every episode it will run, all roles and
      repeats; or its ``seconds`` budget), is under :data:`AUTO_PAYOFF` times Ray's start-up
      (:data:`AUTO_STARTUP_SECONDS`: 20 s to start a local cluster, 5 s when ``cluster`` is a
      running one to join), i.e. under 40 s (about 5,200 episodes), or 10 s (1,300) to join;
    * otherwise on ``CPUs - 1`` actors (one core stays with the driver).

    ``cpus`` defaults to this process's usable cores (the running cluster's CPUs when known)."""
    if not (isinstance(workers, str) and workers.lower() == "auto"):
        n = int(workers)
        return n, f"workers: {n} as set"
    if cpus is None:
        cpus = int((cluster or {}).get("num_cpus") or 0) or usable_cpus()
    mode = "join" if cluster else "start"
    startup = AUTO_STARTUP_SECONDS[mode]
    if cpus < AUTO_MIN_CPUS:
        return 0, f"auto: {cpus} CPUs < {AUTO_MIN_CPUS}, Ray actors would share the driver's cores"
    if seconds is not None and episodes is None:
        estimate, what = float(seconds), f"a {seconds:g} s budget"
    else:
        estimate, what = (episodes or 0) / AUTO_EPISODES_PER_SECOND, f"{episodes} episodes"
    where = f"joining the running cluster at {cluster['address']}" if cluster else "starting a local cluster"
    if estimate < AUTO_PAYOFF * startup:
        return 0, (f"auto: {what} ≈ {estimate:.0f} s in-process < {AUTO_PAYOFF:g} × {startup:.0f} s of Ray "
                   f"start-up ({where})")
    n = max(1, cpus - 1)
    return n, f"auto: {what} ≈ {estimate:.0f} s in-process ≥ {AUTO_PAYOFF:g} × {startup:.0f} s start-up, {cpus} CPUs ({where})"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class WorkersError(StoreError):
    """More rollout actors asked for than the CPUs that would run them. A :class:`StoreError`
    (a ``ValueError``) so that every command, ``rollout --workers N`` included, reports it as bad
    input (one message, exit 2) through the error types the CLI already knows."""


def worker_cpus() -> tuple[int | None, str]:
    """``(CPUs, where)`` that rollout actors would run on: the Ray cluster this process is in or
    would join (its CPUs; None when the cluster does not say), else this machine's usable cores."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        import ray

        return int(ray.cluster_resources().get("CPU", 0)) or None, "this process's Ray cluster"
    from orchestrator.cluster.lifecycle import running_cluster

    cluster = running_cluster()
    if cluster is not None:
        n = cluster.get("num_cpus")
        return (int(n) if n else None), f"the running Ray cluster at {cluster['address']}"
    return usable_cpus(), "this machine (usable cores)"


def check_workers(workers) -> None:
    """Refuse (:class:`WorkersError`) ``workers: N`` above the CPUs that would run the actors
    (:func:`worker_cpus`), before Ray starts: each actor takes a CPU, so more of them would
    wait for ever, or (as Ray once started them) overload the machine. ``auto`` and 0 pass."""
    if isinstance(workers, str) or int(workers) <= usable_cpus():
        return  # auto decides within the CPUs; N <= this machine's cores fits anywhere it runs
    cpus, where = worker_cpus()
    if cpus is not None and int(workers) > cpus:
        raise WorkersError(f"workers: {int(workers)} rollout actors, but {where} has {cpus} CPU"
                           f"{'s' if cpus != 1 else ''}: give at most {cpus} (each actor takes one CPU), or "
                           f"workers: auto")


def resolve_workers(workers, *, episodes: int | None = None, seconds: float | None = None) -> tuple[int, str]:
    """:func:`plan_workers` with this machine's facts: its usable cores, and a running Ray
    cluster to join (``RAY_ADDRESS``, ``deltarl ray up``, ``ray start --head``, or Ray already
    initialised in this process, e.g. in a Ray Job or a grid task)."""
    if not (isinstance(workers, str) and workers.lower() == "auto"):
        return plan_workers(workers)
    cluster = None
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        import ray

        cluster = {"address": "this process's cluster", "num_cpus": int(ray.cluster_resources().get("CPU", 0))}
    else:
        from orchestrator.cluster.lifecycle import running_cluster

        cluster = running_cluster()
    return plan_workers(workers, episodes=episodes, seconds=seconds, cluster=cluster)


def phase_workers(workers, budget, *, done: int = 0, elapsed: float = 0.0,
                  episodes_per_case: int = 1) -> tuple[int, str]:
    """``(rollout actors, why)`` for a campaign phase that has run ``done`` episodes (test cases)
    and ``elapsed`` seconds of its ``budget`` (``.episodes``, ``.seconds``): ``workers: auto``
    decides by the work left (every episode it will run: ``episodes_per_case`` per test case,
    all roles and repeats), as :func:`resolve_workers`."""
    episodes = None if budget.episodes is None else max(0, budget.episodes - done) * episodes_per_case
    seconds = None if budget.seconds is None else max(0.0, budget.seconds - elapsed)
    return resolve_workers(workers, episodes=episodes, seconds=seconds)


def chunk_size(n: int, workers: int, batch_size: int) -> int:
    """States per Ray task: two tasks per actor for a generation (so a slow chunk does not hold a
    whole actor's share), never more than four batches (so large runs stream), never below one."""
    return max(1, min(4 * batch_size, -(-n // (2 * max(1, workers)))))


class Executor:
    """Runs policies (``{role: uri}``) from initial states: ``workers`` = 0 in this process, else
    on that many Ray rollout actors (a local cluster is started unless one is running).
    ``policies`` (optional, ``{role: Policy}``) reuses policies this process already loaded.
    ``reason`` says why this executor was chosen (phase summaries print it beside :attr:`kind`);
    ``name`` names the Ray actors (``<name>/rollout-<i>``, e.g. ``quickstart/safety/rollout-0``)."""

    def __init__(self, scenario, uris: dict[str, str], *, workers: int = 0, batch_size: int = 256,
                 scenario_overrides: dict | None = None, policies: dict | None = None, dashboard: bool | None = None,
                 reason: str = "", name: str | None = None, worker_cls=None, alone: bool = False):
        """``worker_cls``: a :class:`~workers.rollout.RolloutWorker` subclass to run instead (the
        async scaling benchmark injects per-episode delays with one). ``alone``: every policy call
        sees one observation (a phase's ``inference: alone``; its episodes are the agent as deployed)."""
        self.workers = int(workers)
        self.alone = bool(alone)
        self.reason = reason
        self.batch_size = int(batch_size)
        self.startup_seconds = 0.0
        self._queued: OrderedDict = OrderedDict()  # in-process steady state: key -> submitted work, FIFO
        overrides = dict(scenario_overrides or {})
        if self.workers == 0:
            self.local = (worker_cls or RolloutWorker)(scenario.name, uris, scenario_overrides=overrides,
                                                       batch_size=batch_size, scenario_obj=scenario, policies=policies,
                                                       alone=self.alone)
            self.policy_hashes = self.local.policy_hashes()
            self.pool = None
        else:
            import time

            from orchestrator.cluster.lifecycle import start_ray
            from orchestrator.cluster.pool import RolloutPool

            check_workers(self.workers)  # before Ray starts
            t0 = time.perf_counter()
            start_ray(num_cpus=max(self.workers, os.cpu_count() or 1), dashboard=dashboard)
            self.pool = RolloutPool(scenario.name, uris, workers=self.workers, batch_size=batch_size,
                                    scenario_overrides=overrides, name=name, worker_cls=worker_cls, alone=self.alone)
            self.policy_hashes = dict(self.pool.policy_hashes)
            self.startup_seconds = time.perf_counter() - t0

    @property
    def kind(self) -> str:
        return "in-process" if self.workers == 0 else f"ray x{self.workers}"

    def describe(self) -> dict:
        """What ran and why, for a phase summary."""
        return {"executor": self.kind, "executor_reason": self.reason, "inference": "alone" if self.alone else "batched",
                "executor_startup_seconds": round(self.startup_seconds, 3)}

    def stream(self, states: np.ndarray, *, seed: int, repeats: int = 1, max_steps: int | None = None,
               chunk: int | None = None) -> Iterator[tuple[int, RolloutResult]]:
        """``(offset, result)`` for chunks of ``states`` as they finish (in-process: in order)."""
        states = np.asarray(states, dtype=np.float64)
        n = states.shape[0]
        if self.pool is None:
            step = int(chunk or self.batch_size)
            for lo in range(0, n, step):
                yield lo, self.local.run(states[lo:lo + step], seed=seed, repeats=repeats, max_steps=max_steps,
                                         state_offset=lo)
            return
        step = int(chunk or chunk_size(n, self.workers, self.batch_size))
        yield from self.pool.map(states, seed=seed, chunk=step, repeats=repeats, max_steps=max_steps)

    def run(self, states: np.ndarray, *, seed: int, repeats: int = 1, max_steps: int | None = None) -> RolloutResult:
        """All episodes of ``states`` as one result, in state order."""
        if self.pool is None:  # one call: the worker batches by batch_size itself
            return self.local.run(states, seed=seed, repeats=repeats, max_steps=max_steps)
        parts = sorted(self.stream(states, seed=seed, repeats=repeats, max_steps=max_steps), key=lambda p: p[0])
        return RolloutResult.concat([r for _, r in parts])

    # -- steady state (async campaigns) ---------------------------------------------------------
    @property
    def window(self) -> int:
        """Units of work an async campaign keeps in flight: two per rollout actor (one running,
        one queued behind it, so an actor never waits for the driver), two in this process (the
        same code path; the work then runs in submission order when asked for)."""
        return 2 * max(1, self.workers)

    def unit_size(self, generation_size: int) -> int:
        """States per unit of an async campaign: the chunk a generation of ``generation_size``
        would be cut into (:func:`chunk_size`), so both modes hand an actor the same amount."""
        return chunk_size(int(generation_size), self.workers, self.batch_size)

    def submit(self, key, states: np.ndarray, *, seed: int, repeats: int = 1, max_steps: int | None = None) -> None:
        """Start running ``states`` (one result for all of them, state indices from 0) under
        ``key`` (any hashable, unique among the work in flight). Ray: on the actor with the
        fewest units in flight; in-process: queued, run when :meth:`next_result` asks for it."""
        states = np.asarray(states, dtype=np.float64)
        if self.pool is None:
            if key in self._queued:
                raise ValueError(f"work {key!r} is already in flight")
            self._queued[key] = (states, int(seed), int(repeats), max_steps)
            return
        self.pool.submit(key, states, seed=seed, repeats=repeats, max_steps=max_steps)

    @property
    def in_flight(self) -> int:
        return len(self._queued) if self.pool is None else self.pool.units_in_flight

    def next_result(self, key=None) -> tuple:
        """``(key, result)`` of submitted work: the first to finish (in-process: the oldest), or
        the one under ``key`` (a replay in a recorded order). Each submission is returned once."""
        if self.pool is not None:
            return self.pool.next_result(key)
        if not self._queued:
            raise ValueError("no work in flight")
        if key is None:
            key = self._next_local_key()
        states, seed, repeats, max_steps = self._queued.pop(key)
        return key, self.local.run(states, seed=seed, repeats=repeats, max_steps=max_steps)

    def _next_local_key(self):
        """The in-process unit to run next: the oldest (tests replace this to finish work in
        another order, as actors would)."""
        return next(iter(self._queued))

    def call_workers(self, method: str, *args) -> list:
        """``method(*args)`` of every rollout worker (one in-process), e.g. a benchmark's counters."""
        return [getattr(self.local, method)(*args)] if self.pool is None else self.pool.call(method, *args)

    def close(self) -> None:
        self._queued.clear()
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
