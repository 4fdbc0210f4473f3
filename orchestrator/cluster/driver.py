"""The Ray edge: start (or join) a cluster and keep a pool of rollout actors busy.

Everything below this module runs without Ray. ``start_ray()`` gives the embedded default
(``ray.init(address="local")``: a real single-node cluster, dashboard off unless asked) or
joins ``RAY_ADDRESS``/``address`` when given. ``RolloutPool`` spreads chunks of initial
states over ``RolloutWorker`` actors with several chunks in flight per actor (``ray.wait``).
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from orchestrator.fuzzers.corpus import Corpus
from workers.rollout import RolloutResult, RolloutWorker


def start_ray(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool = False,
              namespace: str | None = None, object_store_bytes: int | None = 1 << 30) -> dict:
    """Initialise Ray once per process; returns the cluster resources."""
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, namespace=namespace, logging_level="WARNING")
        else:
            if not dashboard:
                # a loopback-only cluster without the dashboard needs no token (Ray >= 2.59
                # turns token auth on by default for local clusters)
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count(),
                include_dashboard=dashboard,
                dashboard_host="127.0.0.1",
                namespace=namespace,
                logging_level="WARNING",
                object_store_memory=object_store_bytes,
            )
    return ray.cluster_resources()


def rollout_actor_class(num_gpus: float = 0.0, num_cpus: float = 1.0, max_restarts: int = 3,
                        max_task_retries: int = 3):
    """The Ray actor wrapping :class:`~workers.rollout.RolloutWorker`.

    A dead actor is restarted (``max_restarts``) and the batches it had in flight are run again
    on the new one (``max_task_retries``). A batch is a pure function of its states and seeds,
    and the driver writes a generation only once all its batches are back, so a crash neither
    loses nor duplicates episodes."""
    import ray

    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts,
                      max_task_retries=max_task_retries)(RolloutWorker)



def corpus_actor_class():
    """``orchestrator.fuzzers.corpus.Corpus`` as a Ray actor (no CPU reserved: it only holds state)."""
    import ray

    return ray.remote(num_cpus=0)(Corpus)



class RolloutPool:
    """``workers`` rollout actors, each holding the scenario and the loaded policies."""

    def __init__(self, scenario: str, policy_uris: dict[str, str], *, workers: int = 2, batch_size: int = 256,
                 scenario_overrides: dict | None = None, in_flight: int = 2, device: str | None = None):
        import ray

        if workers < 1:
            raise ValueError(f"a rollout pool needs at least one worker, got {workers}")
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        # GPUs present: share them between the rollout actors for batched inference
        num_gpus = min(0.25, gpus / workers) if gpus > 0 else 0.0
        actor_cls = rollout_actor_class(num_gpus=num_gpus)
        self.batch_size = int(batch_size)
        self.in_flight = max(1, int(in_flight))
        self.actors = [
            actor_cls.remote(scenario, policy_uris, scenario_overrides=scenario_overrides, device=device,
                             batch_size=batch_size)
            for _ in range(workers)
        ]
        ray.get([a.ping.remote() for a in self.actors])  # surface load errors now, not mid-run
        self.policy_hashes = ray.get(self.actors[0].policy_hashes.remote())

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

        def submit(actor):
            lo, part = todo.pop()
            ref = actor.run.remote(part, roles=roles, repeats=repeats, seed=seed, max_steps=max_steps,
                                   state_offset=lo)
            pending[ref] = (actor, lo)

        for _ in range(self.in_flight):
            for actor in self.actors:
                if todo:
                    submit(actor)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                actor, lo = pending.pop(ref)
                result = ray.get(ref)
                if todo:
                    submit(actor)
                yield lo, result

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


class CampaignMetrics:
    """Campaign progress as Ray custom metrics (``ray.util.metrics``, exported to Prometheus and
    shown by the dashboard's metrics view): ``deltarl_episodes`` (counter), ``deltarl_failures``
    and ``deltarl_bugs`` (gauges), tagged with the campaign and the phase. A no-op when Ray is not
    running (in-process campaigns)."""

    def __init__(self, campaign: str, phase: str):
        self.tags = {"campaign": campaign, "phase": phase}
        self.on = False
        try:
            import ray
            from ray.util.metrics import Counter, Gauge

            if ray.is_initialized():
                keys = ("campaign", "phase")
                self.episodes = Counter("deltarl_episodes", description="episodes run", tag_keys=keys)
                self.failures = Gauge("deltarl_failures", description="safety failures so far", tag_keys=keys)
                self.bugs = Gauge("deltarl_bugs", description="optimality bugs so far", tag_keys=keys)
                self.on = True
        except Exception:  # noqa: BLE001 - metrics are an aid, never a reason to stop a campaign
            self.on = False

    def update(self, episodes: int = 0, failures: int | None = None, bugs: int | None = None) -> None:
        if not self.on:
            return
        if episodes:
            self.episodes.inc(episodes, tags=self.tags)
        if failures is not None:
            self.failures.set(failures, tags=self.tags)
        if bugs is not None:
            self.bugs.set(bugs, tags=self.tags)
