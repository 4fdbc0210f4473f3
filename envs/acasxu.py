"""ACAS Xu: a two-aircraft horizontal encounter, the ownship steered by collision advisories.

The setting of MDPFuzz / CureFuzz / LLMTester (see ``docs/scenarios.md``, section ACASXu, for
what we keep from them and what we change). Units: feet, seconds, radians; angles are
counter-clockwise from the +x axis.

* The ownship starts at the origin heading north (+y, heading π/2) at ``own_speed`` ft/s.
* The intruder starts at (``x``, ``y``) with heading ``heading`` and speed ``speed`` and flies
  straight at constant speed.
* Every step (``DT`` = 0.1 s, 100 steps) the policy picks one of 5 advisories: 0 clear-of-
  conflict (fly straight), 1 weak left (+1.5°/s), 2 weak right (−1.5°/s), 3 strong left
  (+3°/s), 4 strong right (−3°/s). The ownship turns at that rate during the step; its position
  advances along the heading at mid-step (a second-order accurate, straight-segment update).
* Observation (what makes a stateless policy possible): the 5 ACAS Xu inputs ρ (separation, ft),
  θ (bearing of the intruder relative to the ownship's heading), ψ (intruder heading relative
  to the ownship's heading), v_own, v_int, plus the previous advisory (0..4; 0 at the start),
  which selects the ACAS Xu network.
* Reward per step: ρ/60261 after the step (the peers' term), or −100 at the step with a
  collision. Collision (the failure oracle): the separation drops below 200 ft at any time in
  the step (both aircraft move on straight segments within a step, so the minimum over the
  step is exact); the episode then terminates. Hence ``terminated`` ⇔ collision.

``AcasXuEnv`` is the scalar, single-episode reference (plain Python on numpy float64 scalars),
registered with gymnasium as ``deltarl/ACASXu-v0``; ``_AcasXuSim`` the batched numpy simulator.
Both do the same float64 operations in the same order, so they agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from envs.base import (
    ActionSpec,
    BatchSimulator,
    InvalidStateError,
    Scenario,
    ScenarioError,
    StepBatch,
)

ENV_ID = "deltarl/ACASXu-v0"
DT = 0.1  # seconds per step
N_STEPS = 100
NMAC_FT = 200.0  # collision: separation below this
RHO_SCALE = 60261.0  # the peers' reward normaliser (also the ACAS Xu input range of rho)
OWN_HEADING0 = np.pi / 2  # the ownship starts heading north
# advisory -> turn rate [rad/s]: COC, weak left, weak right, strong left, strong right
TURN_RATES = np.array([0.0, 1.5, -1.5, 3.0, -3.0]) * (np.pi / 180.0)
ADVISORIES = ("COC", "weak left", "weak right", "strong left", "strong right")
COLLISION_REWARD = -100.0
TWO_PI = 2.0 * np.pi


def _wrap(a):
    """Angle to [-π, π): a − 2π·floor((a + π) / 2π); same operations on scalars and arrays."""
    return a - TWO_PI * np.floor((a + np.pi) / TWO_PI)


def _min_sep_sq(dx0, dy0, dx1, dy1):
    """Squared minimum distance to the origin on the segment from (dx0, dy0) to (dx1, dy1)."""
    ex = dx1 - dx0
    ey = dy1 - dy0
    ee = ex * ex + ey * ey
    pe = dx0 * ex + dy0 * ey
    t = np.minimum(np.maximum(-pe / np.where(ee > 0.0, ee, 1.0), 0.0), 1.0)
    t = np.where(ee > 0.0, t, 0.0)
    cx = dx0 + t * ex
    cy = dy0 + t * ey
    return cx * cx + cy * cy


def _obs_parts(ox, oy, oh, ix, iy, ih):
    """(rho, theta, psi) of the intruder seen from the ownship."""
    dx = ix - ox
    dy = iy - oy
    rho = np.sqrt(dx * dx + dy * dy)
    theta = _wrap(np.arctan2(dy, dx) - oh)
    psi = _wrap(ih - oh)
    return rho, theta, psi


# ---------------------------------------------------------------------------------------------
# the reference environment (one episode, scalars)
# ---------------------------------------------------------------------------------------------


class AcasXuEnv(gym.Env):
    """One ACAS Xu encounter (see the module docstring). ``reset(options={"state": s})`` starts
    it in initial state ``s`` = (speed, x, y, heading, own_speed); without it, a state is drawn
    from :meth:`AcasXu.sample` with the reset seed."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = gym.spaces.Box(
            low=np.array([0.0, -np.pi, -np.pi, 0.0, 0.0, 0.0], dtype=np.float32),
            high=np.array([np.inf, np.pi, np.pi, np.inf, np.inf, 4.0], dtype=np.float32),
            dtype=np.float32,
        )
        self.action_space = gym.spaces.Discrete(5)
        self._scenario = AcasXu()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options and "state" in options:
            state = np.asarray(options["state"], dtype=np.float64).reshape(-1)
            if state.shape != (5,) or not np.all(np.isfinite(state)):
                raise ValueError(f"an ACAS Xu state is 5 finite numbers (speed, x, y, heading, own_speed), got {state}")
        else:
            state = self._scenario.sample(self.np_random, 1)[0]
        v_int, x, y, h, v_own = (np.float64(v) for v in state)
        self.v_own = v_own
        self.v_int = v_int
        self.ox = np.float64(0.0)
        self.oy = np.float64(0.0)
        self.oh = np.float64(OWN_HEADING0)
        self.ix = x
        self.iy = y
        self.ih = h
        self.ivx = v_int * np.cos(h) * DT
        self.ivy = v_int * np.sin(h) * DT
        self.prev = 0
        return self._obs(), {}

    def _obs(self):
        rho, theta, psi = _obs_parts(self.ox, self.oy, self.oh, self.ix, self.iy, self.ih)
        self.rho = rho
        return np.array([rho, theta, psi, self.v_own, self.v_int, float(self.prev)], dtype=np.float32)

    def step(self, action):
        a = int(action)
        if not 0 <= a < 5:
            raise ValueError(f"ACAS Xu advisory must be in 0..4, got {action!r}")
        dx0 = self.ix - self.ox
        dy0 = self.iy - self.oy
        hd = TURN_RATES[a] * DT
        hm = self.oh + 0.5 * hd
        self.ox = self.ox + self.v_own * np.cos(hm) * DT
        self.oy = self.oy + self.v_own * np.sin(hm) * DT
        self.oh = self.oh + hd
        self.ix = self.ix + self.ivx
        self.iy = self.iy + self.ivy
        self.prev = a
        obs = self._obs()
        collided = bool(_min_sep_sq(dx0, dy0, self.ix - self.ox, self.iy - self.oy) < NMAC_FT * NMAC_FT)
        reward = COLLISION_REWARD if collided else float(self.rho / RHO_SCALE)
        return obs, reward, collided, False, {"rho": float(self.rho), "collision": collided}


gym.register(id=ENV_ID, entry_point="envs.acasxu:AcasXuEnv", max_episode_steps=N_STEPS)


# ---------------------------------------------------------------------------------------------
# the batched simulator
# ---------------------------------------------------------------------------------------------


class _AcasXuSim(BatchSimulator):
    def _reset(self, states, seeds):
        n = states.shape[0]
        s = states.astype(np.float64, copy=True)
        self.v_int = s[:, 0]
        self.ix = s[:, 1].copy()
        self.iy = s[:, 2].copy()
        self.ih = s[:, 3]
        self.v_own = s[:, 4]
        self.ox = np.zeros(n)
        self.oy = np.zeros(n)
        self.oh = np.full(n, OWN_HEADING0)
        self.ivx = self.v_int * np.cos(self.ih) * DT
        self.ivy = self.v_int * np.sin(self.ih) * DT
        self.prev = np.zeros(n, dtype=np.int64)
        self.rho = np.zeros(n)
        return self._obs(np.arange(n))

    def _obs(self, idx):
        rho, theta, psi = _obs_parts(self.ox[idx], self.oy[idx], self.oh[idx], self.ix[idx], self.iy[idx], self.ih[idx])
        self.rho[idx] = rho
        obs = np.zeros((self.n, 6), dtype=np.float32)
        obs[idx] = np.stack([rho, theta, psi, self.v_own[idx], self.v_int[idx], self.prev[idx].astype(np.float64)], axis=1)
        return obs

    def _step(self, actions, live):
        n = self.n
        a = _check_advisories(actions, live, self.scenario.name)
        ox, oy, oh = self.ox[live], self.oy[live], self.oh[live]
        ix, iy = self.ix[live], self.iy[live]
        dx0 = ix - ox
        dy0 = iy - oy
        hd = TURN_RATES[a] * DT
        hm = oh + 0.5 * hd
        v = self.v_own[live]
        ox = ox + v * np.cos(hm) * DT
        oy = oy + v * np.sin(hm) * DT
        oh = oh + hd
        ix = ix + self.ivx[live]
        iy = iy + self.ivy[live]
        self.ox[live], self.oy[live], self.oh[live] = ox, oy, oh
        self.ix[live], self.iy[live] = ix, iy
        self.prev[live] = a
        obs = self._obs(live)
        collided = _min_sep_sq(dx0, dy0, ix - ox, iy - oy) < NMAC_FT * NMAC_FT
        out = StepBatch(
            obs=obs,
            reward=np.zeros(n),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
        )
        out.reward[live] = np.where(collided, COLLISION_REWARD, self.rho[live] / RHO_SCALE)
        out.terminated[live] = collided
        return out


def _check_advisories(actions, live, name):
    a = np.asarray(actions).reshape(-1)[live]
    if a.size and not np.issubdtype(a.dtype, np.integer) and not np.all(a == np.round(a)):
        raise ScenarioError(f"{name}: advisories must be integers 0..4, got {a[:5]}")
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() > 4):
        raise ScenarioError(f"{name}: advisories must be in 0..4, got {a.min()}..{a.max()}")
    return a


# ---------------------------------------------------------------------------------------------
# the scenario
# ---------------------------------------------------------------------------------------------


@dataclass
class AcasXu(Scenario):
    """Intruder speed, relative position and heading, and the ownship's speed (fixed at 800 ft/s
    by default; widen its bounds to fuzz it). The reset distribution is the peers' sampler:
    speed U(10, 1100), range U(1000, 60261) at a uniform bearing, heading converging on the
    ownship ± π/4 (see :meth:`sample`), kept only when a constant strong turn avoids the
    collision."""

    name: str = "ACASXu"
    env_id: str = ENV_ID
    state_names: tuple = ("speed", "x", "y", "heading", "own_speed")
    state_meaning: tuple = (
        "intruder speed [ft/s]",
        "intruder x relative to the ownship [ft] (ownship at the origin heading +y)",
        "intruder y relative to the ownship [ft]",
        "intruder heading [rad, ccw from +x; the ownship heads pi/2]",
        "ownship speed [ft/s]",
    )
    low: np.ndarray = field(default_factory=lambda: np.array([10.0, -RHO_SCALE, -RHO_SCALE, -np.pi, 800.0]))
    high: np.ndarray = field(default_factory=lambda: np.array([1100.0, RHO_SCALE, RHO_SCALE, np.pi, 800.0]))
    obs_dim: int = 6
    action: ActionSpec = field(default_factory=lambda: ActionSpec("discrete", 5))
    max_steps: int = N_STEPS
    grid_intervals: int = 5
    mutation_scale: float = 0.02
    failure_rule: str = "separation < 200 ft at any time within 100 steps of 0.1 s (the episode terminates)"
    version: str = "2"
    # valid = escapable: a constant strong turn avoids the collision (the peers' check, and
    # LLMTester's "unsolvable even by an optimal policy"); False tests every state in the bounds
    require_escapable: bool = True
    _checking: bool = field(default=False, repr=False, compare=False)
    # digests of the last state batches found escapable: a generation's states are validated
    # several times (proposal, campaign loop, simulator reset) and the check costs a simulation
    _escapable_seen: list = field(default_factory=list, repr=False, compare=False)

    def sample(self, rng, n):
        """The peers' sampler, vectorised: intruder speed U(10, 1100), range ρ U(1000, 60261) at
        bearing U(−π, π); heading towards the ownship's start + U(−π/4, π/4) (our stand-in for
        the peers' heading bounds); the ownship speed is the region's low bound (800). States
        where neither a constant strong-left nor a constant strong-right turn avoids the
        collision are redrawn (the peers' validity check)."""
        n = int(n)
        out = np.zeros((0, self.state_dim))
        while out.shape[0] < n:
            m = max(2 * (n - out.shape[0]), 16)
            speed = rng.uniform(10.0, 1100.0, size=m)
            rho = rng.uniform(1000.0, RHO_SCALE, size=m)
            bearing = rng.uniform(-np.pi, np.pi, size=m)
            x = rho * np.cos(bearing)
            y = rho * np.sin(bearing)
            heading = _wrap(bearing + np.pi + rng.uniform(-np.pi / 4, np.pi / 4, size=m))
            own = rng.uniform(self.low[4], self.high[4], size=m)
            cand = np.clip(np.stack([speed, x, y, heading, own], axis=1), self.low, self.high)
            out = np.concatenate([out, cand[self.escapable(cand)]])
        return out[:n]

    def escapable(self, states) -> np.ndarray:
        """Per state: does a constant strong-left or a constant strong-right turn for the whole
        episode keep the separation at or above 200 ft? (the peers' validity check)"""
        states = Scenario.validate(self, states)
        n = len(states)
        if n == 0:
            return np.zeros(0, dtype=bool)
        self._checking = True
        try:  # both manoeuvres in one lockstep batch: rows 0..n-1 turn left, n..2n-1 right
            sim = self.simulator(2 * n)
            sim.reset_to(np.concatenate([states, states]))
            hit = np.zeros(2 * n, dtype=bool)
            act = np.repeat(np.array([3, 4], dtype=np.int64), n)
            while not sim.done.all():
                hit |= sim.step(act).terminated
        finally:
            self._checking = False
        return ~hit[:n] | ~hit[n:]

    def validate(self, states, *, atol=1e-9):
        """The bounds, then (``require_escapable``) escapability: an encounter that no turn can
        escape is not a test of the agent."""
        arr = super().validate(states, atol=atol)
        if self.require_escapable and not self._checking and len(arr):
            import hashlib

            digest = hashlib.blake2b(arr.tobytes(), digest_size=16).digest() + bytes(str(arr.shape), "ascii")
            if digest in self._escapable_seen:
                return arr
            bad = np.flatnonzero(~self.escapable(arr))
            if bad.size:
                i = int(bad[0])
                raise InvalidStateError(
                    f"{self.name}: initial state #{i} cannot be escaped: even a constant strong turn of the "
                    f"ownship collides (intruder at x = {arr[i, 1]:.0f} ft, y = {arr[i, 2]:.0f} ft); move the intruder "
                    f"further away or change its heading (or set require_escapable: false to test such states)")
            self._escapable_seen[:] = (self._escapable_seen + [digest])[-8:]
        return arr

    def _keep_escapable(self, out, fallback, redraw=None, tries: int = 20):
        if not self.require_escapable or len(out) == 0:
            return out
        bad = np.flatnonzero(~self.escapable(out))
        for _ in range(tries if redraw is not None else 0):
            if bad.size == 0:
                break
            out[bad] = redraw(bad)
            bad = bad[~self.escapable(out[bad])]
        out[bad] = fallback[bad]
        return out

    def mutate(self, states, rng, scale=None):
        """The base mutation; a mutant that cannot be escaped is redrawn (20 tries, as the peers
        retry their mutation), then replaced by its parent."""
        states = self.validate(states)
        out = super().mutate(states, rng, scale)
        return self._keep_escapable(out, states, lambda idx: super(AcasXu, self).mutate(states[idx], rng, scale))

    def sample_uniform(self, rng, n):
        n = int(n)
        out = np.zeros((0, self.state_dim))
        while out.shape[0] < n:
            cand = rng.uniform(self.low, self.high, size=(max(2 * (n - out.shape[0]), 16), self.state_dim))
            if self.require_escapable:
                cand = cand[self.escapable(cand)]
            out = np.concatenate([out, cand])
        return out[:n]

    def project(self, states):
        """Clip into the bounds, then move inescapable intruders outwards along their bearing
        (× 1.25 per try) until a turn escapes them."""
        out = np.clip(np.asarray(states, dtype=np.float64), self.low, self.high)
        if not self.require_escapable:
            return out
        for _ in range(40):
            bad = np.flatnonzero(~self.escapable(out))
            if bad.size == 0:
                break
            xy = out[bad, 1:3]
            far = np.where(np.abs(xy).sum(axis=1, keepdims=True) > 0, xy * 1.25, np.array([[0.0, RHO_SCALE]]))
            out[bad, 1:3] = np.clip(far, self.low[1:3], self.high[1:3])
        return out

    def simulator(self, batch_size):
        return _AcasXuSim(self, batch_size)

    def reference_reset_to(self, env, state, seed=0):
        obs, _ = env.reset(seed=int(seed), options={"state": np.asarray(state, dtype=np.float64)})
        return obs

    def is_failure(self, returns, lengths, terminated):
        return np.asarray(terminated, dtype=bool)
