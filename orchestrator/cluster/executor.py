"""The one executor: run initial states with a set of policies, in this process or on N Ray
rollout actors, and get back the same :class:`~workers.rollout.RolloutResult`.

    with Executor(scenario, {"aut": uri}, workers=0) as ex:      # in this process, no Ray
        result = ex.run(states, seed=7)
    with Executor(scenario, {"aut": uri}, workers=2) as ex:      # two Ray actors
        for offset, part in ex.stream(states, seed=7): ...       # parts as they finish

Every caller (the CLI's ``rollout``, both campaign phases, repair's re-evaluation and the
benchmarks) goes through here, so there is one chunking rule (:func:`chunk_size`) and one place
that starts Ray. Episode seeds and state indices are global, so the union of the parts equals
one in-process call whatever the chunking.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from workers.rollout import RolloutResult, RolloutWorker


def chunk_size(n: int, workers: int, batch_size: int) -> int:
    """States per Ray task: two tasks per actor for a generation (so a slow chunk does not hold a
    whole actor's share), never more than four batches (so large runs stream), never below one."""
    return max(1, min(4 * batch_size, -(-n // (2 * max(1, workers)))))


class Executor:
    """Runs policies (``{role: uri}``) from initial states: ``workers`` = 0 in this process, else
    on that many Ray rollout actors (a local cluster is started unless one is running).
    ``policies`` (optional, ``{role: Policy}``) reuses policies this process already loaded."""

    def __init__(self, scenario, uris: dict[str, str], *, workers: int = 0, batch_size: int = 256,
                 scenario_overrides: dict | None = None, policies: dict | None = None, dashboard: bool = False):
        self.workers = int(workers)
        self.batch_size = int(batch_size)
        self.startup_seconds = 0.0
        overrides = dict(scenario_overrides or {})
        if self.workers == 0:
            self.local = RolloutWorker(scenario.name, uris, scenario_overrides=overrides, batch_size=batch_size,
                                       scenario_obj=scenario, policies=policies)
            self.policy_hashes = self.local.policy_hashes()
            self.pool = None
        else:
            import time

            from orchestrator.cluster.driver import RolloutPool, start_ray

            t0 = time.perf_counter()
            start_ray(num_cpus=max(self.workers, os.cpu_count() or 1), dashboard=dashboard)
            self.pool = RolloutPool(scenario.name, uris, workers=self.workers, batch_size=batch_size,
                                    scenario_overrides=overrides)
            self.policy_hashes = dict(self.pool.policy_hashes)
            self.startup_seconds = time.perf_counter() - t0

    @property
    def kind(self) -> str:
        return "in-process" if self.workers == 0 else f"ray x{self.workers}"

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

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
