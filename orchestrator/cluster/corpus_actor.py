"""``corpus: actor``: the fuzzer of an async phase held by a Ray actor, and the driver's stand-in
for it with restore-on-death (:mod:`orchestrator.campaign.async_loop` explains the design; Ray stays
in ``orchestrator/cluster/``)."""

from __future__ import annotations

import logging
import pickle
import sys
import time

import numpy as np

log = logging.getLogger(__name__)

CORPUS_RESTORE_ATTEMPTS = 3  # new actors tried, one after the other, before a restore gives up


# -- the corpus actor ------------------------------------------------------------------------------
class FuzzerHost:
    """A fuzzer behind a Ray actor: built from the pickled fuzzer, it answers the calls the phase
    loop makes (``propose``, ``observe``, ``start_phase``, ``state_dict``, ``load_state_dict``,
    ``stats``) in the order a caller sends them."""

    def __init__(self, blob: bytes):
        self.fuzzer = pickle.loads(blob)

    def ping(self) -> bool:
        return True

    def propose(self, n: int):
        return self.fuzzer.propose(int(n))

    def observe(self, proposal, feedback) -> None:
        self.fuzzer.observe(proposal, feedback)

    def start_phase(self, phase: str) -> None:
        self.fuzzer.start_phase(phase)

    def state_dict(self) -> dict:
        return self.fuzzer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.fuzzer.load_state_dict(state)

    def stats(self) -> dict:
        return self.fuzzer.stats()


class RemoteFuzzer:
    """The driver's stand-in for a fuzzer held by a corpus actor: the methods the phase loop
    calls (``propose``, ``observe``, ``start_phase``, ``state_dict``, ``load_state_dict``,
    ``stats``), forwarded to the actor, with restore-on-death (module docstring)."""

    def __init__(self, fuzzer, name: str | None = None):
        self.name, self.needs_llm = fuzzer.name, fuzzer.needs_llm
        self.needs_challenger = fuzzer.needs_challenger
        self._blob = pickle.dumps(fuzzer)  # the fuzzer as the phase began (resumed or fresh)
        self._base: dict | None = None  # its state at the last snapshot (None: the blob as it is)
        self._journal: list = []  # (method, args, proposed states) of each call made since then, in order
        self._pending: list = []  # results of calls not waited for (observe)
        self._actor_name = name
        self.restores = 0
        self.restore_mismatches = 0  # replayed proposals that differed (a nondeterministic fuzzer)
        self.corpus_seconds = 0.0  # driver time spent waiting on the actor
        self._actor = self._start()

    def _start(self):
        import ray

        from orchestrator.cluster.pool import corpus_actor_class, named_actor

        actor = named_actor(corpus_actor_class(FuzzerHost), self._actor_name).remote(self._blob)
        if self._base is not None:
            actor.load_state_dict.remote(self._base)
        ray.get(actor.ping.remote())
        return actor

    def _restore(self, upto: int) -> None:
        """A new actor from the last snapshot, with the first ``upto`` journal calls made again."""
        import ray
        from ray.exceptions import RayActorError

        for attempt in range(CORPUS_RESTORE_ATTEMPTS):
            try:
                self._actor = self._start()
                refs = [(getattr(self._actor, m).remote(*args), states) for m, args, states in self._journal[:upto]]
                for ref, states in refs:
                    out = ray.get(ref)
                    if states is not None and not np.array_equal(out.states, states):
                        self.restore_mismatches += 1
                break
            except RayActorError:
                if attempt == CORPUS_RESTORE_ATTEMPTS - 1:
                    raise
        self._pending = []
        self.restores += 1
        if self.restore_mismatches:
            print(f"deltarl: warning: the restored corpus actor proposed other states than before "
                  f"({self.restore_mismatches} proposals): the fuzzer is not deterministic in its calls",
                  file=sys.stderr)

    def _call(self, method: str, *args, mutates: bool = True, wait: bool = True):
        import ray
        from ray.exceptions import RayActorError

        if mutates:
            self._journal.append([method, args, None])
        t0 = time.perf_counter()
        try:
            while True:
                try:
                    ref = getattr(self._actor, method).remote(*args)
                    if not wait:
                        self._pending.append(ref)
                        return None
                    out = ray.get([*self._pending, ref])[-1]  # an earlier observe's error surfaces here
                    self._pending = []
                    return out
                except RayActorError:
                    self._restore(len(self._journal) - (1 if mutates else 0))
        finally:
            self.corpus_seconds += time.perf_counter() - t0

    def propose(self, n: int):
        proposal = self._call("propose", int(n))
        self._journal[-1][2] = np.asarray(proposal.states)  # a restore checks the replayed proposals
        return proposal

    def observe(self, proposal, feedback) -> None:
        self._call("observe", proposal, feedback, wait=False)

    def start_phase(self, phase: str) -> None:
        self._call("start_phase", phase, wait=False)

    def load_state_dict(self, state: dict) -> None:
        self._call("load_state_dict", state)
        self._base, self._journal = state, []

    def state_dict(self) -> dict:
        """The fuzzer's state (a snapshot): the restore point from now on."""
        state = self._call("state_dict", mutates=False)
        self._base, self._journal = state, []
        return state

    def stats(self) -> dict:
        return self._call("stats", mutates=False)

    def close(self) -> None:
        import ray

        try:
            ray.kill(self._actor)
        except Exception as exc:  # noqa: BLE001 - already gone, or Ray already shut down: nothing to end
            log.debug("corpus actor %s not killed: %s: %s", self._actor_name, type(exc).__name__, exc)
