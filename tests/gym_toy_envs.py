"""Small Gymnasium environments for tests/test_gym_scenario.py: one well-behaved (settable through
``reset(options=...)``, deterministic, with an ``info`` key), and the faulty ones the trust checks
must refuse (state that cannot be set, global randomness, a stale observation, copies that share
state). Named in tests as ``gym:tests.gym_toy_envs:ClassName``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Walk1D(gym.Env):
    """A point on a line pushed left/right; ``info["fell"]`` when |x| > 1 (the episode ends there).
    The reset seed draws a drift; ``reset(options={"state": [x, v]})`` starts it at (x, v)."""

    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 30):
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.max_steps = max_steps
        self.s = np.zeros(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.drift = float(self.np_random.uniform(-0.01, 0.01))
        self.s = np.array(options["state"], dtype=np.float64) if options and "state" in options else \
            self.np_random.uniform(-0.1, 0.1, size=2)
        self.t = 0
        return self.s.astype(np.float32), {}

    def step(self, action):
        self.s[1] += (0.05 if int(action) == 1 else -0.05) + self.drift
        self.s[0] += 0.1 * self.s[1]
        self.t += 1
        fell = bool(abs(self.s[0]) > 1.0)
        return self.s.astype(np.float32), -abs(float(self.s[0])), fell, self.t >= self.max_steps, {"fell": fell}


class Unsettable(Walk1D):
    """Keeps its state in ``s``: the classic-control setter writes ``unwrapped.state``, which it never reads."""


class Noisy(Walk1D):
    """Draws from numpy's global random state: the same seed does not give the same episode."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        self.s[0] += np.random.normal(scale=1e-3)
        return self.s.astype(np.float32), r, term, trunc, info


class SharedState(Walk1D):
    """Every copy pushes one class-level counter, which reset() zeroes: alone, an episode is deterministic;
    beside other copies in lockstep it is not the same episode."""

    pushes = 0

    def reset(self, *, seed=None, options=None):
        SharedState.pushes = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        SharedState.pushes += 1
        self.s[1] += 1e-4 * (SharedState.pushes % 7)
        return super().step(action)


def stale_reset_to(env, state, seed):
    """A setter that sets the state but returns the observation of the plain reset."""
    obs, _ = env.reset(seed=int(seed))
    env.unwrapped.s = np.array(state, dtype=np.float64)
    return obs


def observe(env):
    return env.unwrapped.s.astype(np.float32)


def state_of(env):
    return env.unwrapped.s.copy()


def far_out(obs, reward, terminated, truncated, info):
    """A failure oracle as a function: the point got beyond 0.8."""
    return bool(abs(obs[0]) > 0.8)


def broken_state_of(env):
    """A state reader with a bug."""
    raise RuntimeError("no state here")
