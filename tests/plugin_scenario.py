"""A plug-in scenario written the way an external-simulator adapter is (docs/scenarios.md,
"Plugging in a simulator"): the simulator is a separate object per episode reached through a
client API (here a toy 2-D point robot that must stay off a wall); the adapter only translates
initial states, actions and observations. Used by tests/test_plugin_scenario.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from envs.base import ActionSpec, BatchSimulator, Scenario, StepBatch


class ToySimClient:
    """Stands in for a remote simulator client (e.g. ``carla.Client``): one episode at a time."""

    def __init__(self):
        self.pos = np.zeros(2)
        self.vel = np.zeros(2)

    def spawn(self, pos, vel):
        self.pos, self.vel = np.array(pos, float), np.array(vel, float)

    def apply_control(self, accel):
        self.vel = 0.9 * self.vel + 0.1 * np.asarray(accel, float)
        self.pos = self.pos + 0.1 * self.vel

    def sensors(self):
        return np.concatenate([self.pos, self.vel]).astype(np.float32)

    def collided(self):
        return bool(self.pos[0] > 1.0)  # the wall at x = 1


class _ToyBatch(BatchSimulator):
    def __init__(self, scenario, batch_size):
        super().__init__(scenario, batch_size)
        self.clients = [ToySimClient() for _ in range(batch_size)]

    def _reset(self, states, seeds):
        for c, s in zip(self.clients, states):
            c.spawn(s[:2], s[2:])
        return np.stack([c.sensors() for c in self.clients[: self.n]])

    def _step(self, actions, live):
        n = self.n
        obs = np.zeros((n, 4), np.float32)
        rew, term = np.zeros(n), np.zeros(n, bool)
        for i in live:
            c = self.clients[i]
            c.apply_control(np.asarray(actions[i], float).reshape(2))
            obs[i] = c.sensors()
            term[i] = c.collided()
            rew[i] = -1.0 if term[i] else 0.1
        return StepBatch(obs=obs, reward=rew, terminated=term, truncated=np.zeros(n, bool))


@dataclass
class ToyRobot(Scenario):
    name: str = "ToyRobot"
    env_id: str = ""
    state_names: tuple = ("x", "y", "vx", "vy")
    state_meaning: tuple = ("position x (m)", "position y (m)", "velocity x (m/s)", "velocity y (m/s)")
    low: np.ndarray = field(default_factory=lambda: np.array([-0.5, -0.5, -1.0, -1.0]))
    high: np.ndarray = field(default_factory=lambda: np.array([0.5, 0.5, 1.0, 1.0]))
    obs_dim: int = 4
    action: ActionSpec = field(default_factory=lambda: ActionSpec("continuous", shape=(2,), low=-np.ones(2),
                                                                   high=np.ones(2)))
    max_steps: int = 40
    failure_rule: str = "the robot hits the wall at x = 1"

    def sample(self, rng, n):
        return rng.uniform(self.low, self.high, size=(n, 4))

    def simulator(self, batch_size):
        return _ToyBatch(self, batch_size)

    def reference_reset_to(self, env, state, seed=0):
        raise NotImplementedError("the toy simulator has no gymnasium reference")

    def is_failure(self, returns, lengths, terminated):
        return np.asarray(terminated, bool)


def push_right(obs):
    """A black-box agent that drifts right: it hits the wall from fast, far-right starts."""
    obs = np.asarray(obs)
    return np.tile(np.array([[0.25, 0.0]], np.float32), (len(obs), 1))
