"""N copies of a Gymnasium environment stepped in lockstep: the generic :class:`BatchSimulator`.

Each episode of a batch has its own environment copy (taken from the scenario's pool, given
back when the simulator is dropped, so copies are made once per process). ``reset_to`` puts copy
i into initial state i through the spec's setter; ``step`` calls ``env.step`` on every live copy
with its action and reads the failure oracle per step. The rollout around it
(:func:`workers.rollout.rollout`) makes one batched policy call per step for all live episodes,
exactly as for the hand-written simulators.

What the simulator reports, per step (so that ``Scenario.is_failure`` sees only returns, lengths
and ``terminated``, as for every scenario):

* ``terminated``: the failure event of the oracle: the environment's own ``terminated`` for the
  ``terminated`` and ``return_below`` oracles; ``info[KEY]`` true, a reward below the threshold
  or the user function's verdict for the others (the episode ends there);
* ``truncated``: the episode ended without that event: the environment truncated it (its own
  time limit, e.g. highway-env's duration), or it terminated for another reason (a MiniGrid goal
  reached under an ``info`` oracle), or deltarl's ``max_steps`` was reached.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from envs.base import BatchSimulator, ScenarioError, StepBatch


class EnvPool:
    """Environment copies of one scenario, made on demand and reused (a simulator takes k, gives
    them back when it is garbage-collected)."""

    def __init__(self, make):
        self._make = make
        self._free: list = []
        self._lock = threading.Lock()

    def take(self, k: int) -> list:
        with self._lock:
            got, self._free = self._free[:k], self._free[k:]
        return got + [self._make() for _ in range(k - len(got))]

    def give(self, envs: list) -> None:
        with self._lock:
            self._free.extend(envs)

    def close(self) -> None:
        with self._lock:
            envs, self._free = self._free, []
        for e in envs:
            e.close()


def flat(obs, obs_dim: int, name: str) -> np.ndarray:
    a = np.asarray(obs, dtype=np.float32).reshape(-1)
    if a.size != obs_dim:
        raise ScenarioError(f"{name}: an observation has {a.size} values where the observation space says "
                            f"{obs_dim}; check the spec's wrappers and the setter's returned observation")
    return a


class GymBatch(BatchSimulator):
    def __init__(self, scenario, batch_size: int):
        super().__init__(scenario, batch_size)
        self.envs = scenario.pool.take(self.batch_size)
        weakref.finalize(self, scenario.pool.give, self.envs)

    def _reset(self, states, seeds):
        sc = self.scenario
        n = states.shape[0]
        obs = np.zeros((n, sc.obs_dim), dtype=np.float32)
        for i in range(n):
            obs[i] = flat(sc.setter.reset_to(self.envs[i], states[i], int(seeds[i])), sc.obs_dim, sc.name)
        return obs

    def _step(self, actions, live):
        sc = self.scenario
        n = self.n
        out = StepBatch(obs=np.zeros((n, sc.obs_dim), dtype=np.float32), reward=np.zeros(n),
                        terminated=np.zeros(n, dtype=bool), truncated=np.zeros(n, dtype=bool))
        for i in live:
            o, r, term, trunc, info = self.envs[i].step(sc.env_action(actions[i]))
            out.obs[i] = flat(o, sc.obs_dim, sc.name)
            out.reward[i] = float(r)
            event, ended = sc.step_verdict(o, float(r), bool(term), bool(trunc), info)
            out.terminated[i] = event
            out.truncated[i] = ended  # read by step() below: the env ended the episode without the event
        return out

    def step(self, actions: np.ndarray) -> StepBatch:
        live = np.flatnonzero(~self.done)
        out = self._step(actions, live)
        self.t[live] += 1
        out.terminated[self.done] = False
        env_ended = out.truncated.copy()
        out.truncated[:] = False
        out.truncated[live] = ((self.t[live] >= self.max_steps) | env_ended[live]) & ~out.terminated[live]
        self.done |= out.terminated | out.truncated
        return out
