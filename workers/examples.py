"""Small black-box agents, usable as ``python:workers.examples:NAME`` policy URIs.

They show the black-box interface (deltarl needs only actions, never weights) and give the
quick start something to test before a trained zoo agent is at hand.
"""

from __future__ import annotations

import numpy as np


def cartpole_balancer(obs: np.ndarray) -> np.ndarray:
    """CartPole-v1: push towards the side the pole falls to (angle + 0.5·angular velocity),
    with a weak cart-centering term. Balances most starts; some drift off the track."""
    obs = np.asarray(obs, dtype=np.float64)
    score = obs[:, 2] + 0.5 * obs[:, 3] + 0.01 * obs[:, 0] + 0.05 * obs[:, 1]
    return (score > 0).astype(np.int64)


def mountaincar_energy(obs: np.ndarray) -> np.ndarray:
    """MountainCar-v0: push in the direction of motion (pumps energy into the swing)."""
    obs = np.asarray(obs, dtype=np.float64)
    return np.where(obs[:, 1] >= 0, 2, 0).astype(np.int64)


def acrobot_swing(obs: np.ndarray) -> np.ndarray:
    """Acrobot-v1: torque in the direction of the first link's angular velocity."""
    obs = np.asarray(obs, dtype=np.float64)
    return np.where(obs[:, 4] >= 0, 2, 0).astype(np.int64)


def coopnavi_greedy(obs: np.ndarray, gain: float = 4.0, damping: float = 2.0) -> np.ndarray:
    """CoopNavi (centralised, obs (n, 42), action (n, 6)): every agent drives to its own
    landmark with a PD law. Landmarks are assigned greedily: the closest remaining
    agent-landmark pair first, until each agent has one ("go to the nearest free landmark").
    No collision avoidance: agents whose paths cross may collide."""
    obs = np.asarray(obs, dtype=np.float64).reshape(-1, 3, 14)
    vel = obs[:, :, 0:2]
    rel = obs[:, :, 4:10].reshape(-1, 3, 3, 2)  # (n, agent, landmark, xy): landmark - agent
    dist = np.sqrt(np.sum(rel * rel, axis=3))
    n = len(obs)
    target = np.zeros((n, 3), dtype=np.int64)
    rows = np.arange(n)
    d = dist.copy()
    for _ in range(3):
        k = np.argmin(d.reshape(n, 9), axis=1)
        agent, lm = k // 3, k % 3
        target[rows, agent] = lm
        d[rows, agent, :] = np.inf
        d[rows, :, lm] = np.inf
    goal = rel[rows[:, None], np.arange(3)[None, :], target]  # (n, 3, 2)
    u = np.clip(gain * goal - damping * vel, -1.0, 1.0)
    return u.reshape(n, 6).astype(np.float32)
