"""The rollout pool: ``RolloutWorker`` actors kept busy with several chunks of initial states in
flight per actor (``ray.wait``), and the actor classes of the Ray edge (rollout, corpus), named
as the dashboard lists them."""

from __future__ import annotations

import logging
import time
from typing import Iterator

import numpy as np

from workers.rollout import RolloutResult, RolloutWorker

log = logging.getLogger(__name__)
# How often the pool resubmits one batch whose actor was lost, beyond Ray's own task retries, and
# the longest wait between two tries. Ray's retries run out within seconds while a lost *node*'s
# actor is "temporarily unavailable": until the head declares the node dead (its health checks,
# ~15-30 s) nothing restarts the actor. tests/test_multinode.py: a node killed under a rollout actor.
LOST_ACTOR_TRIES = 8
LOST_ACTOR_MAX_WAIT_S = 10.0


def lost_actor_errors() -> tuple:
    """Ray's errors that mean the actor, not the batch, failed: the batch can run elsewhere."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    return (ActorUnavailableError, ActorDiedError)


def rollout_actor_class(num_gpus: float = 0.0, num_cpus: float = 1.0, max_restarts: int = 3,
                        max_task_retries: int = 3, worker_cls=None):
    """The Ray actor wrapping :class:`~workers.rollout.RolloutWorker`.

    A dead actor is restarted (``max_restarts``) and the batches it had in flight are run again
    on the new one (``max_task_retries``). A batch is a pure function of its states and seeds,
    and the driver writes a generation only once all its batches are back, so a crash neither
    loses nor duplicates episodes. In an async campaign each unit's result is applied once,
    when its task returns (a rerun task returns once too). ``worker_cls``: a
    ``RolloutWorker`` subclass (benchmarks inject delays with one)."""
    import ray

    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts,
                      max_task_retries=max_task_retries)(worker_cls or RolloutWorker)


def corpus_actor_class(holder: type):
    """``holder`` (e.g. :class:`~orchestrator.fuzzers.corpus.Corpus`, or
    :class:`~orchestrator.cluster.corpus_actor.FuzzerHost`: a whole fuzzer, ``corpus: actor``) as
    a Ray actor, no CPU reserved. Ray does not restart it: a restarted one would hold a fresh
    corpus; its driver-side handle restores it from the last snapshot instead
    (:class:`~orchestrator.cluster.corpus_actor.RemoteFuzzer`)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy=on_this_node())(holder)


def on_this_node():
    """Ray's scheduling strategy for an actor that reserves no CPU but works for this process
    (a fuzzer's host, a campaign's progress): on this process's node, soft (anywhere if that node
    is gone). Without it Ray may place a zero-CPU actor on any node, a ``num-cpus 0`` head
    included, and the fuzzer's computation would run there (found by tests/test_multinode.py)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)


def named_actor(actor_cls, name: str | None):
    """``actor_cls`` with ``name`` (a free one: ``name~2``, ``~3``, ... when another actor of this
    job holds it); unnamed when ``name`` is None."""
    if not name:
        return actor_cls
    import ray

    candidate, i = name, 1
    while True:
        try:
            ray.get_actor(candidate)
        except ValueError:
            return actor_cls.options(name=candidate)
        i += 1
        candidate = f"{name}~{i}"


class RolloutPool:
    """``workers`` rollout actors, each holding the scenario and the loaded policies."""

    def __init__(self, scenario: str, policy_uris: dict[str, str], *, workers: int = 2, batch_size: int = 256,
                 scenario_overrides: dict | None = None, in_flight: int = 2, device: str | None = None,
                 name: str | None = None, worker_cls=None, num_cpus: float = 1.0, alone: bool = False):
        """``name`` (e.g. ``"quickstart/safety"``) names the actors ``<name>/rollout-<i>``, as the
        dashboard lists them; ``alone``: every policy call of the actors sees one observation."""
        import ray

        if workers < 1:
            raise ValueError(f"a rollout pool needs at least one worker, got {workers}")
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        # GPUs present: share them between the rollout actors for batched inference
        num_gpus = min(0.25, gpus / workers) if gpus > 0 else 0.0
        actor_cls = rollout_actor_class(num_gpus=num_gpus, num_cpus=num_cpus, worker_cls=worker_cls)
        self.batch_size = int(batch_size)
        self.in_flight = max(1, int(in_flight))
        self.name = name
        self.actors = [
            named_actor(actor_cls, f"{name}/rollout-{i}" if name else None).remote(
                scenario, policy_uris, scenario_overrides=scenario_overrides, device=device, batch_size=batch_size,
                alone=alone)
            for i in range(workers)
        ]
        ray.get([a.ping.remote() for a in self.actors])  # surface load errors now, not mid-run
        self.policy_hashes = ray.get(self.actors[0].policy_hashes.remote())
        self._pending: dict = {}  # steady state: ref -> (key, actor index, the call's arguments, tries)
        self._load = [0] * len(self.actors)  # units in flight per actor

    # -- steady state (async campaigns): submit units, take them back as they finish ------------
    def submit(self, key, states: np.ndarray, *, roles: list[str] | None = None, repeats: int = 1, seed: int = 0,
               max_steps: int | None = None) -> None:
        """Run ``states`` as one task under ``key`` on the actor with the fewest units in flight."""
        i = min(range(len(self.actors)), key=lambda j: self._load[j])
        args = {"initial_states": np.asarray(states, dtype=np.float64), "roles": roles, "repeats": repeats, "seed": seed,
                "max_steps": max_steps, "state_offset": 0}
        self._pending[self.actors[i].run.remote(**args)] = (key, i, args, 0)
        self._load[i] += 1

    def _lost(self, exc: Exception, tries: int, i: int, what: str) -> int:
        """After an actor was lost under a batch: the actor to resubmit it to (the next one), once
        a back-off has passed; raises when the batch has been tried :data:`LOST_ACTOR_TRIES` times."""
        if tries >= LOST_ACTOR_TRIES:
            raise exc
        log.warning("rollout actor %d lost under %s (%s), resubmitting it (try %d of %d)",
                    i, what, type(exc).__name__, tries + 1, LOST_ACTOR_TRIES)
        time.sleep(min(LOST_ACTOR_MAX_WAIT_S, 0.5 * 2 ** tries))
        return (i + 1) % len(self.actors)

    @property
    def units_in_flight(self) -> int:
        return len(self._pending)

    def next_result(self, key=None) -> tuple:
        """``(key, result)``: the first submitted unit to finish, or the one under ``key``. A unit
        whose actor died is rerun by Ray on the restarted actor (``max_task_retries``) and comes
        back once."""
        import ray

        if not self._pending:
            raise ValueError("no work in flight")
        while True:
            if key is None:
                done, _ = ray.wait(list(self._pending), num_returns=1)
                ref = done[0]
            else:
                ref = next(r for r, (k, *_) in self._pending.items() if k == key)
            k, i, args, tries = self._pending.pop(ref)
            self._load[i] -= 1
            try:
                return k, ray.get(ref)
            except lost_actor_errors() as exc:  # the same batch elsewhere: a pure function of its arguments
                j = self._lost(exc, tries, i, f"unit {k!r}")
                self._pending[self.actors[j].run.remote(**args)] = (k, j, args, tries + 1)
                self._load[j] += 1

    def map(self, states: np.ndarray, *, roles: list[str] | None = None, repeats: int = 1, seed: int = 0,
            max_steps: int | None = None, chunk: int | None = None) -> Iterator[tuple[int, RolloutResult]]:
        """Yield ``(offset, result)`` for chunks of ``states`` as they complete.

        ``offset`` is the index of the chunk's first state; episodes keep global state indices
        and seeds, so the union of the chunks equals one in-process ``rollout`` call.
        """
        import ray

        states = np.asarray(states, dtype=np.float64)
        chunk = int(chunk or max(1, self.batch_size // max(1, repeats)))
        todo = [(lo, states[lo:lo + chunk]) for lo in range(0, states.shape[0], chunk)]
        todo.reverse()
        pending: dict = {}

        def submit(i: int, lo: int, part: np.ndarray, tries: int = 0) -> None:
            ref = self.actors[i].run.remote(part, roles=roles, repeats=repeats, seed=seed, max_steps=max_steps,
                                            state_offset=lo)
            pending[ref] = (i, lo, part, tries)

        for _ in range(self.in_flight):
            for i in range(len(self.actors)):
                if todo:
                    submit(i, *todo.pop())
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i, lo, part, tries = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except lost_actor_errors() as exc:  # the same chunk elsewhere: a pure function of its states
                    submit(self._lost(exc, tries, i, f"the chunk at state {lo}"), lo, part, tries + 1)
                    continue
                if todo:
                    submit(i, *todo.pop())
                yield lo, result

    def call(self, method: str, *args) -> list:
        """``method(*args)`` on every actor (e.g. a benchmark worker's counters), in actor order."""
        import ray

        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []
        self._pending, self._load = {}, []
