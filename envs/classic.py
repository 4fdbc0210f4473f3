"""Classic-control scenarios as vectorized numpy: CartPole-v1, MountainCar-v0, Acrobot-v1.

Each batched simulator repeats gymnasium 1.0.0's arithmetic in float64, in the same order, on
arrays of episodes instead of one episode: the conformance tests step it beside the reference
environment started in the same state.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from envs.base import ActionSpec, BatchSimulator, Scenario, ScenarioError, StepBatch


def _set_state(env, state, seed) -> None:
    """Reset a classic-control reference env, then overwrite its simulator state."""
    env.reset(seed=int(seed))
    env.unwrapped.state = np.asarray(state, dtype=np.float64).copy()


def _check_discrete(actions: np.ndarray, live: np.ndarray, n: int, name: str) -> np.ndarray:
    a = np.asarray(actions).reshape(-1)
    al = a[live]
    if al.size and (not np.issubdtype(al.dtype, np.integer) and not np.all(al == np.round(al))):
        raise ScenarioError(f"{name}: discrete actions must be integers, got {al[:5]}")
    al = al.astype(np.int64)
    if al.size and (al.min() < 0 or al.max() >= n):
        raise ScenarioError(f"{name}: actions must be in 0..{n - 1}, got {al.min()}..{al.max()}")
    return al


# ---------------------------------------------------------------------------------------------
# CartPole-v1
# ---------------------------------------------------------------------------------------------


class _CartPoleSim(BatchSimulator):
    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold = 12 * 2 * np.pi / 360
    x_threshold = 2.4

    def _reset(self, states, seeds):
        self.state = states.copy()
        return self.state.astype(np.float32)

    def _step(self, actions, live):
        n = self.n
        a = _check_discrete(actions, live, 2, self.scenario.name)
        x, x_dot, theta, theta_dot = self.state[live].T
        force = np.where(a == 1, self.force_mag, -self.force_mag)
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        # euler integration (gymnasium's default kinematics_integrator)
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state[live] = np.stack([x, x_dot, theta, theta_dot], axis=1)
        term = (x < -self.x_threshold) | (x > self.x_threshold) | (theta < -self.theta_threshold) | (
            theta > self.theta_threshold
        )
        out = StepBatch(
            obs=self.state.astype(np.float32),
            reward=np.zeros(n),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
        )
        out.reward[live] = 1.0  # gymnasium 1.0 (sutton_barto_reward=False): 1 per step, also the last
        out.terminated[live] = term
        return out


@dataclass
class CartPole(Scenario):
    """Cart position/velocity, pole angle/angular velocity; reset draws U(-0.05, 0.05) each."""

    name: str = "CartPole-v1"
    env_id: str = "CartPole-v1"
    state_names: tuple = ("x", "x_dot", "theta", "theta_dot")
    state_meaning: tuple = (
        "cart position [m]",
        "cart velocity [m/s]",
        "pole angle from upright [rad]",
        "pole angular velocity [rad/s]",
    )
    low: np.ndarray = field(default_factory=lambda: np.full(4, -0.05))
    high: np.ndarray = field(default_factory=lambda: np.full(4, 0.05))
    obs_dim: int = 4
    action: ActionSpec = field(default_factory=lambda: ActionSpec("discrete", 2))
    max_steps: int = 500
    grid_intervals: int = 5
    failure_rule: str = "pole > 12 deg or |x| > 2.4 before 500 steps"

    def sample(self, rng, n):
        return rng.uniform(-0.05, 0.05, size=(n, 4))

    def simulator(self, batch_size):
        return _CartPoleSim(self, batch_size)

    def reference_reset_to(self, env, state, seed=0):
        _set_state(env, state, seed)
        return np.array(env.unwrapped.state, dtype=np.float32)  # the observation is the state

    def is_failure(self, returns, lengths, terminated):
        return np.asarray(terminated, dtype=bool) & (np.asarray(lengths) < self.max_steps)


# ---------------------------------------------------------------------------------------------
# MountainCar-v0
# ---------------------------------------------------------------------------------------------


class _MountainCarSim(BatchSimulator):
    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.5
    goal_velocity = 0.0
    force = 0.001
    gravity = 0.0025

    def _reset(self, states, seeds):
        self.state = states.copy()
        return self.state.astype(np.float32)

    def _step(self, actions, live):
        n = self.n
        a = _check_discrete(actions, live, 3, self.scenario.name)
        position, velocity = self.state[live].T
        velocity = velocity + (a - 1) * self.force + np.cos(3 * position) * (-self.gravity)
        velocity = np.clip(velocity, -self.max_speed, self.max_speed)
        position = position + velocity
        position = np.clip(position, self.min_position, self.max_position)
        velocity = np.where((position == self.min_position) & (velocity < 0), 0.0, velocity)
        self.state[live] = np.stack([position, velocity], axis=1)
        out = StepBatch(
            obs=self.state.astype(np.float32),
            reward=np.zeros(n),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
        )
        out.reward[live] = -1.0
        out.terminated[live] = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        return out


@dataclass
class MountainCar(Scenario):
    """Car position and velocity; reset draws position U(-0.6, -0.4) with velocity 0.

    The velocity is part of the state vector so that users (or an LLM) can widen its bounds,
    but by default its region is the single value 0, as in the environment's reset.
    """

    name: str = "MountainCar-v0"
    env_id: str = "MountainCar-v0"
    state_names: tuple = ("position", "velocity")
    state_meaning: tuple = ("car position on the track [m]", "car velocity [m/step]")
    low: np.ndarray = field(default_factory=lambda: np.array([-0.6, 0.0]))
    high: np.ndarray = field(default_factory=lambda: np.array([-0.4, 0.0]))
    obs_dim: int = 2
    action: ActionSpec = field(default_factory=lambda: ActionSpec("discrete", 3))
    max_steps: int = 200
    grid_intervals: int = 100
    failure_rule: str = "goal not reached within 200 steps"

    def sample(self, rng, n):
        pos = rng.uniform(-0.6, -0.4, size=n)
        return np.stack([pos, np.zeros(n)], axis=1)

    def simulator(self, batch_size):
        return _MountainCarSim(self, batch_size)

    def reference_reset_to(self, env, state, seed=0):
        _set_state(env, state, seed)
        return np.array(env.unwrapped.state, dtype=np.float32)  # the observation is the state

    def is_failure(self, returns, lengths, terminated):
        return ~np.asarray(terminated, dtype=bool)


# ---------------------------------------------------------------------------------------------
# Acrobot-v1
# ---------------------------------------------------------------------------------------------


class _AcrobotSim(BatchSimulator):
    dt = 0.2
    LINK_LENGTH_1 = 1.0
    LINK_MASS_1 = 1.0
    LINK_MASS_2 = 1.0
    LINK_COM_POS_1 = 0.5
    LINK_COM_POS_2 = 0.5
    LINK_MOI = 1.0
    MAX_VEL_1 = 4 * np.pi
    MAX_VEL_2 = 9 * np.pi
    AVAIL_TORQUE = np.array([-1.0, 0.0, +1.0])

    def _reset(self, states, seeds):
        self.state = states.copy()
        return self._obs()

    def _obs(self):
        s = self.state
        return np.stack(
            [np.cos(s[:, 0]), np.sin(s[:, 0]), np.cos(s[:, 1]), np.sin(s[:, 1]), s[:, 2], s[:, 3]], axis=1
        ).astype(np.float32)

    def _dsdt(self, y):
        # y: (m, 5) = theta1, theta2, dtheta1, dtheta2, torque ("book" dynamics)
        m1, m2 = self.LINK_MASS_1, self.LINK_MASS_2
        l1 = self.LINK_LENGTH_1
        lc1, lc2 = self.LINK_COM_POS_1, self.LINK_COM_POS_2
        I1 = I2 = self.LINK_MOI
        g = 9.8
        a = y[:, 4]
        theta1, theta2, dtheta1, dtheta2 = y[:, 0], y[:, 1], y[:, 2], y[:, 3]
        # gymnasium squares numpy scalars with C pow(), which can differ from x*x by an ulp
        # (numpy's array power takes a squaring fast path): use pow() to stay bit-exact
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * np.cos(theta2)) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * np.cos(theta2)) + I2
        phi2 = m2 * lc2 * g * np.cos(theta1 + theta2 - np.pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * _pow2(dtheta2) * np.sin(theta2)
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * np.sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * np.cos(theta1 - np.pi / 2)
            + phi2
        )
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * _pow2(dtheta1) * np.sin(theta2) - phi2) / (
            m2 * lc2**2 + I2 - _pow2(d2) / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return np.stack([dtheta1, dtheta2, ddtheta1, ddtheta2, np.zeros_like(a)], axis=1)

    def _step(self, actions, live):
        n = self.n
        a = _check_discrete(actions, live, 3, self.scenario.name)
        y0 = np.concatenate([self.state[live], self.AVAIL_TORQUE[a][:, None]], axis=1)
        # one RK4 step over [0, dt], exactly as gymnasium's rk4(derivs, y0, [0, dt])
        dt = self.dt
        dt2 = dt / 2.0
        k1 = self._dsdt(y0)
        k2 = self._dsdt(y0 + dt2 * k1)
        k3 = self._dsdt(y0 + dt2 * k2)
        k4 = self._dsdt(y0 + dt * k3)
        ns = (y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4))[:, :4]
        ns[:, 0] = _wrap(ns[:, 0], -np.pi, np.pi)
        ns[:, 1] = _wrap(ns[:, 1], -np.pi, np.pi)
        ns[:, 2] = np.minimum(np.maximum(ns[:, 2], -self.MAX_VEL_1), self.MAX_VEL_1)
        ns[:, 3] = np.minimum(np.maximum(ns[:, 3], -self.MAX_VEL_2), self.MAX_VEL_2)
        self.state[live] = ns
        term = -np.cos(ns[:, 0]) - np.cos(ns[:, 1] + ns[:, 0]) > 1.0
        out = StepBatch(
            obs=self._obs(),
            reward=np.zeros(n),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
        )
        out.reward[live] = np.where(term, 0.0, -1.0)
        out.terminated[live] = term
        return out


def _pow2(x: np.ndarray) -> np.ndarray:
    """x**2 through C pow(), elementwise, as numpy does for float64 scalars."""
    return np.fromiter(map(math.pow, x.tolist(), itertools.repeat(2.0)), dtype=np.float64, count=x.size)


def _wrap(x: np.ndarray, m: float, M: float) -> np.ndarray:
    """gymnasium's ``wrap`` (repeated subtraction/addition of M - m), vectorized."""
    diff = M - m
    x = x.copy()
    while True:
        hi = x > M
        if not hi.any():
            break
        x[hi] = x[hi] - diff
    while True:
        lo = x < m
        if not lo.any():
            break
        x[lo] = x[lo] + diff
    return x


@dataclass
class Acrobot(Scenario):
    """Both link angles and angular velocities; reset draws U(-0.1, 0.1) each.

    The policy sees [cos θ1, sin θ1, cos θ2, sin θ2, θ̇1, θ̇2]; the state vector holds the
    angles behind that observation.
    """

    name: str = "Acrobot-v1"
    env_id: str = "Acrobot-v1"
    state_names: tuple = ("theta1", "theta2", "dtheta1", "dtheta2")
    state_meaning: tuple = (
        "angle of the first link from hanging down [rad]",
        "angle of the second link relative to the first [rad]",
        "angular velocity of the first link [rad/s]",
        "angular velocity of the second link [rad/s]",
    )
    low: np.ndarray = field(default_factory=lambda: np.full(4, -0.1))
    high: np.ndarray = field(default_factory=lambda: np.full(4, 0.1))
    obs_dim: int = 6
    action: ActionSpec = field(default_factory=lambda: ActionSpec("discrete", 3))
    max_steps: int = 500
    grid_intervals: int = 5
    failure_rule: str = "return < -100"

    def sample(self, rng, n):
        return rng.uniform(-0.1, 0.1, size=(n, 4))

    def simulator(self, batch_size):
        return _AcrobotSim(self, batch_size)

    def reference_reset_to(self, env, state, seed=0):
        _set_state(env, state, seed)
        return env.unwrapped._get_ob()

    def is_failure(self, returns, lengths, terminated):
        return np.asarray(returns, dtype=np.float64) < -100
