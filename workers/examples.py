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
