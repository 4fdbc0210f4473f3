"""ACAS Xu as MDPFuzz defines it: a two-aircraft horizontal encounter on a collision course.

The setting of MDPFuzz (ISSTA 2022), its replicability study and LLMTester's Table II; the
peers' files and lines are in ``shared/research/acasxu-bipedal-vs-mdpfuzz.md`` and the choices
in ``docs/scenarios.md`` (section ACASXu). Units: feet, seconds, radians; angles are
counter-clockwise from the +x axis.

* **Initial state** (4 values, the peers' ``[acas_speed, x2, y2, auto_theta]``): the ownship's
  speed, the intruder's position relative to the ownship, the intruder's heading. The ownship
  starts at the origin heading north (π/2).
* **The intruder's speed is derived, not chosen**: by the law of sines, the speed at which a
  straight-flying intruder reaches the point where the ownship's straight path crosses its own
  at the same time as the ownship (:func:`intruder_motion`). Every initial state is therefore
  an exact collision course for an ownship that never turns; a negative solution flips the
  heading by π (the same motion), and the peers' special cases (x = 0, equal headings) are kept.
* **Valid** (the peers' ``verify``): the derived speed lies in [0, 1200] ft/s and a constant
  strong-left or a constant strong-right turn for the whole episode keeps the separation at the
  sampled positions (start included) at or above 200 ft (:meth:`AcasXu.escapable`).
* **Dynamics.** 100 steps of ``DT`` = 0.1 s. Every step the policy picks one of 5 advisories:
  0 clear-of-conflict (straight), 1 weak left (+1.5°/s), 2 weak right (−1.5°/s), 3 strong left
  (+3°/s), 4 strong right (−3°/s). The ownship first turns by rate × DT (heading wrapped to
  [−π, π)), then moves along its new heading (explicit Euler, as the peers); the intruder flies
  straight at its derived speed.
* **Observation**: the 5 ACAS Xu inputs ρ (separation), θ (bearing of the intruder relative to
  the ownship's heading), ψ (intruder heading relative to the ownship's), v_own, v_int, plus the
  previous advisory (0..4; 0 at the start), which selects the network.
* **Reward and oracle** (the peers' executor): the episode always runs all 100 steps. Step k
  (1..100) pays ``0.99^(100 − k) · (ρ_k / 60261 − 100·[ρ_k < 200])``, so the return is the peers'
  ``r ← 0.99·r + ρ/60261, minus 100 at every step below 200 ft``. A collision is ρ < 200 ft at
  any of the 100 post-step positions; at the last step the episode *terminates* iff it collided
  at some step (else it is truncated), so ``is_failure = terminated``.

``AcasXuEnv`` is the scalar, single-episode reference (plain Python on numpy float64 scalars),
registered with gymnasium as ``deltarl/ACASXu-v1``; ``_AcasXuSim`` the batched numpy simulator.
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

ENV_ID = "deltarl/ACASXu-v1"
DT = 0.1  # seconds per step
N_STEPS = 100
NMAC_FT = 200.0  # collision: separation below this
RHO_SCALE = 60261.0  # the peers' reward normaliser (and the largest initial range)
RHO_MIN = 1000.0  # the smallest initial range of the reset distribution
OWN_SPEED_RANGE = (10.0, 1100.0)
VINT_MAX = 1200.0  # the largest valid derived intruder speed (the networks' input range)
OWN_HEADING0 = np.pi / 2  # the ownship starts heading north
HEADING_LOW = -np.pi / 2  # intruder headings are kept in [-π/2, 3π/2): the sampler's range
GAMMA = 0.99  # the peers' discount of the per-step reward
COLLISION_PENALTY = 100.0  # subtracted at every step below 200 ft
# advisory -> turn rate [rad/s]: COC, weak left, weak right, strong left, strong right
TURN_RATES = np.array([0.0, 1.5, -1.5, 3.0, -3.0]) * (np.pi / 180.0)
ADVISORIES = ("COC", "weak left", "weak right", "strong left", "strong right")
# MDPFuzz's mutation: ± U(5) ft/s ownship speed, ± U(5) ft in x and y, ± U(0.2) rad heading
MUTATION_STEP = np.array([5.0, 5.0, 5.0, 0.2])
TWO_PI = 2.0 * np.pi


def _wrap(a):
    """Angle to [-π, π): a − 2π·floor((a + π) / 2π); same operations on scalars and arrays."""
    return a - TWO_PI * np.floor((a + np.pi) / TWO_PI)


def wrap_heading(h):
    """Intruder heading to [−π/2, 3π/2) (the same direction)."""
    return h - TWO_PI * np.floor((h - HEADING_LOW) / TWO_PI)


_DISCOUNTS: dict[int, np.ndarray] = {}


def step_weights(n_steps: int) -> np.ndarray:
    """``w[k − 1] = 0.99^(n_steps − k)``: the weight of step k's reward, so that the undiscounted
    return equals the peers' recursively discounted reward."""
    n = int(n_steps)
    if n not in _DISCOUNTS:
        _DISCOUNTS[n] = np.power(GAMMA, np.arange(n - 1, -1, -1, dtype=np.float64))
    return _DISCOUNTS[n]


def intruder_motion(states):
    """Per initial state (own_speed, x, y, heading): the intruder's derived speed and the heading
    it flies (heading + π where the law of sines gives a negative speed). Arrays of shape (n,).

    With the ownship at the origin heading π/2 at speed v, α the bearing of the intruder relative
    to the ownship's heading and h the intruder's heading, ``v_int = v·sin α / sin(α + π/2 − h)``
    (triangle ownship start / intruder start / crossing point). The peers' special cases: x = 0
    gives v/2 (intruder ahead) or min(2v, 1600) (behind); h = π/2 gives v. Non-finite results
    (parallel courses) are invalid (:meth:`AcasXu.valid`)."""
    s = np.asarray(states, dtype=np.float64).reshape(-1, 4)
    v, x, y, h = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
    alpha = _wrap(np.arctan2(y, x) - OWN_HEADING0)
    with np.errstate(divide="ignore", invalid="ignore"):
        vint = v * np.sin(alpha) / np.sin(alpha + OWN_HEADING0 - h)
    vint = np.where(h == OWN_HEADING0, v, vint)
    vint = np.where(x == 0.0, np.where(y > 0.0, v / 2.0, np.minimum(2.0 * v, 1600.0)), vint)
    neg = vint < 0.0
    return np.where(neg, -vint, vint), np.where(neg, h + np.pi, h)


def _obs_parts(ox, oy, oh, ix, iy, ih):
    """(rho, theta, psi) of the intruder seen from the ownship."""
    dx = ix - ox
    dy = iy - oy
    rho = np.sqrt(dx * dx + dy * dy)
    theta = _wrap(np.arctan2(dy, dx) - oh)
    psi = _wrap(ih - oh)
    return rho, theta, psi


def _reward(rho, hit, w):
    return np.where(hit, rho / RHO_SCALE - COLLISION_PENALTY, rho / RHO_SCALE) * w


# ---------------------------------------------------------------------------------------------
# the reference environment (one episode, scalars)
# ---------------------------------------------------------------------------------------------


class AcasXuEnv(gym.Env):
    """One ACAS Xu encounter (see the module docstring). ``reset(options={"state": s})`` starts
    it in initial state ``s`` = (own_speed, x, y, heading); without it, a state is drawn from
    :meth:`AcasXu.sample` with the reset seed."""

    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = N_STEPS):
        self.observation_space = gym.spaces.Box(
            low=np.array([0.0, -np.pi, -np.pi, 0.0, 0.0, 0.0], dtype=np.float32),
            high=np.array([np.inf, np.pi, np.pi, np.inf, np.inf, 4.0], dtype=np.float32),
            dtype=np.float32,
        )
        self.action_space = gym.spaces.Discrete(5)
        self.max_steps = int(max_steps)
        self._scenario = AcasXu(max_steps=self.max_steps)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options and "state" in options:
            state = np.asarray(options["state"], dtype=np.float64).reshape(-1)
            if state.shape != (4,) or not np.all(np.isfinite(state)):
                raise ValueError(f"an ACAS Xu state is 4 finite numbers (own_speed, x, y, heading), got {state}")
        else:
            state = self._scenario.sample(self.np_random, 1)[0]
        vint, hint = intruder_motion(state[None, :])
        self.v_own = np.float64(state[0])
        self.v_int = np.float64(vint[0])
        self.ox = np.float64(0.0)
        self.oy = np.float64(0.0)
        self.oh = np.float64(OWN_HEADING0)
        self.ix = np.float64(state[1])
        self.iy = np.float64(state[2])
        self.ih = np.float64(hint[0])
        self.ivx = self.v_int * np.cos(self.ih) * DT
        self.ivy = self.v_int * np.sin(self.ih) * DT
        self.prev = 0
        self.k = 0
        self.collided = False
        return self._obs(), {}

    def _obs(self):
        rho, theta, psi = _obs_parts(self.ox, self.oy, self.oh, self.ix, self.iy, self.ih)
        self.rho = rho
        return np.array([rho, theta, psi, self.v_own, self.v_int, float(self.prev)], dtype=np.float32)

    def step(self, action):
        a = int(action)
        if not 0 <= a < 5:
            raise ValueError(f"ACAS Xu advisory must be in 0..4, got {action!r}")
        self.oh = _wrap(self.oh + TURN_RATES[a] * DT)
        self.ox = self.ox + self.v_own * np.cos(self.oh) * DT
        self.oy = self.oy + self.v_own * np.sin(self.oh) * DT
        self.ix = self.ix + self.ivx
        self.iy = self.iy + self.ivy
        self.prev = a
        obs = self._obs()
        self.k += 1
        hit = bool(self.rho < NMAC_FT)
        self.collided = self.collided or hit
        w = step_weights(self.max_steps)[min(self.k, self.max_steps) - 1]
        reward = float(_reward(self.rho, hit, w))
        terminated = self.k >= self.max_steps and self.collided
        truncated = self.k >= self.max_steps and not self.collided
        return obs, reward, terminated, truncated, {"rho": float(self.rho), "collision": hit, "collided": self.collided}


# no TimeLimit wrapper: the env ends its episodes itself (terminated iff it collided, else truncated)
gym.register(id=ENV_ID, entry_point="envs.acasxu:AcasXuEnv")


# ---------------------------------------------------------------------------------------------
# the batched simulator
# ---------------------------------------------------------------------------------------------


class _AcasXuSim(BatchSimulator):
    def _reset(self, states, seeds):
        n = states.shape[0]
        s = states.astype(np.float64, copy=True)
        self.v_int, self.ih = intruder_motion(s)
        self.v_own = s[:, 0]
        self.ix = s[:, 1].copy()
        self.iy = s[:, 2].copy()
        self.ox = np.zeros(n)
        self.oy = np.zeros(n)
        self.oh = np.full(n, OWN_HEADING0)
        self.ivx = self.v_int * np.cos(self.ih) * DT
        self.ivy = self.v_int * np.sin(self.ih) * DT
        self.prev = np.zeros(n, dtype=np.int64)
        self.rho = np.zeros(n)
        self.collided = np.zeros(n, dtype=bool)
        self.weights = step_weights(self.max_steps)
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
        oh = _wrap(self.oh[live] + TURN_RATES[a] * DT)
        v = self.v_own[live]
        self.ox[live] = self.ox[live] + v * np.cos(oh) * DT
        self.oy[live] = self.oy[live] + v * np.sin(oh) * DT
        self.oh[live] = oh
        self.ix[live] = self.ix[live] + self.ivx[live]
        self.iy[live] = self.iy[live] + self.ivy[live]
        self.prev[live] = a
        obs = self._obs(live)
        rho = self.rho[live]
        hit = rho < NMAC_FT
        self.collided[live] |= hit
        k = self.t[live] + 1  # the step being taken (BatchSimulator counts it after _step)
        out = StepBatch(
            obs=obs,
            reward=np.zeros(n),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
        )
        out.reward[live] = _reward(rho, hit, self.weights[np.minimum(k, self.max_steps) - 1])
        out.terminated[live] = (k >= self.max_steps) & self.collided[live]
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
    """MDPFuzz's ACAS Xu encounter (module docstring): ownship speed, intruder position and
    heading; the intruder's speed follows (a collision course). ``sample`` is the peers'
    sampler, ``mutate`` their ±5 ft / ±5 ft/s / ±0.2 rad operator, validity their ``verify``."""

    name: str = "ACASXu"
    env_id: str = ENV_ID
    state_names: tuple = ("own_speed", "x", "y", "heading")
    state_meaning: tuple = (
        "ownship speed [ft/s] (the ownship starts at the origin heading +y, i.e. pi/2)",
        "intruder x relative to the ownship [ft]",
        "intruder y relative to the ownship [ft]",
        "intruder heading [rad, ccw from +x]; its speed is derived so that it meets a straight-flying ownship",
    )
    low: np.ndarray = field(default_factory=lambda: np.array([OWN_SPEED_RANGE[0], -RHO_SCALE, -RHO_SCALE, HEADING_LOW]))
    high: np.ndarray = field(
        default_factory=lambda: np.array([OWN_SPEED_RANGE[1], RHO_SCALE, RHO_SCALE, HEADING_LOW + TWO_PI]))
    obs_dim: int = 6
    action: ActionSpec = field(default_factory=lambda: ActionSpec("discrete", 5))
    max_steps: int = N_STEPS
    grid_intervals: int = 5
    # mutate(): the step half-widths are scale x MUTATION_STEP (1.0 = MDPFuzz's operator)
    mutation_scale: float = 1.0
    mutation_tries: int = 51  # draws per mutant before falling back to the parent (the original's 51)
    failure_rule: str = "separation < 200 ft at any of the 100 post-step positions (steps of 0.1 s)"
    version: str = "3"
    # valid = the peers' verify: derived intruder speed in [0, 1200] and escapable by a constant
    # strong turn; False tests every state in the bounds (NaN speeds still cannot be simulated)
    require_valid: bool = True
    _checking: bool = field(default=False, repr=False, compare=False)
    # digests of the last state batches found valid: a generation's states are validated
    # several times (proposal, campaign loop, simulator reset) and the check costs a simulation
    _valid_seen: list = field(default_factory=list, repr=False, compare=False)

    # -- the initial-state space -------------------------------------------------------------
    def sample(self, rng, n):
        """The peers' sampler, vectorised: ownship speed U(10, 1100); intruder range U(1000,
        60261) at a bearing U(−π, π); heading uniform between "pointing at the ownship's start"
        and "parallel to the ownship" (π/2). Invalid draws (:meth:`valid`) are redrawn."""
        n = int(n)
        out = np.zeros((0, 4))
        while out.shape[0] < n:
            m = max(2 * (n - out.shape[0]), 16)
            speed = rng.uniform(OWN_SPEED_RANGE[0], OWN_SPEED_RANGE[1], size=m)
            rho = rng.uniform(RHO_MIN, RHO_SCALE, size=m)
            bearing = rng.uniform(-np.pi, np.pi, size=m)
            x = rho * np.cos(bearing)
            y = rho * np.sin(bearing)
            at_ownship = np.arcsin(-y / np.hypot(x, y))
            at_ownship = np.where(x > 0, np.pi - at_ownship, at_ownship)
            heading = rng.uniform(np.minimum(at_ownship, OWN_HEADING0), np.maximum(at_ownship, OWN_HEADING0))
            cand = np.stack([speed, x, y, wrap_heading(heading)], axis=1)
            cand = np.clip(cand, self.low, self.high)
            out = np.concatenate([out, cand[self.valid(cand)]])
        return out[:n]

    def sample_uniform(self, rng, n):
        """Uniform over the bounds, invalid draws redrawn (``require_valid``)."""
        n = int(n)
        out = np.zeros((0, 4))
        while out.shape[0] < n:
            cand = rng.uniform(self.low, self.high, size=(max(2 * (n - out.shape[0]), 16), 4))
            out = np.concatenate([out, cand[self.valid(cand)] if self.require_valid else cand])
        return out[:n]

    def mutate(self, states, rng, scale=None):
        """MDPFuzz's operator: own speed ± U(5) ft/s, x and y ± U(5) ft, heading ± U(0.2) rad
        (times ``scale``, default :attr:`mutation_scale` = 1), heading wrapped, speed and
        position clipped to the bounds. The intruder's speed is re-derived from the mutant, so
        it stays on a collision course. An invalid mutant is redrawn (up to ``mutation_tries``
        draws in all, the original's re-verification), then replaced by its parent."""
        states = self.validate(states)
        scale = self.mutation_scale if scale is None else float(scale)
        if not np.isfinite(scale) or scale < 0:
            raise ScenarioError(f"mutation scale must be a finite number >= 0, got {scale!r}")
        step = scale * MUTATION_STEP

        def draw(src):
            m = src + rng.uniform(-1.0, 1.0, size=src.shape) * step
            m[:, 3] = wrap_heading(m[:, 3])
            return np.clip(m, self.low, self.high)

        out = draw(states)
        if not self.require_valid or len(out) == 0:
            return out
        bad = np.flatnonzero(~self.valid(out))
        for _ in range(max(self.mutation_tries - 1, 0)):
            if bad.size == 0:
                break
            out[bad] = draw(states[bad])
            bad = bad[~self.valid(out[bad])]
        out[bad] = states[bad]
        return out

    def project(self, states):
        """The nearest valid states to arbitrary vectors: clip, wrap the heading; an intruder
        faster than 1200 ft/s slows down with the ownship (the derived speed is proportional to
        the ownship's); an inescapable intruder moves outwards along its bearing (× 1.25 per
        try); what is still invalid after that becomes a far, slow, valid encounter."""
        out = np.asarray(states, dtype=np.float64).reshape(-1, 4).copy()
        out[:, 3] = wrap_heading(np.where(np.isfinite(out[:, 3]), out[:, 3], OWN_HEADING0))
        out = np.clip(np.nan_to_num(out), self.low, self.high)
        if not self.require_valid or len(out) == 0:
            return out
        vint, _ = intruder_motion(out)
        fast = np.isfinite(vint) & (vint > VINT_MAX)
        out[fast, 0] = np.maximum(out[fast, 0] * (0.99 * VINT_MAX / vint[fast]), self.low[0])
        for _ in range(40):
            bad = np.flatnonzero(~self.valid(out))
            if bad.size == 0:
                break
            xy = out[bad, 1:3]
            far = np.where(np.abs(xy).sum(axis=1, keepdims=True) > 0, xy * 1.25, np.array([[0.0, RHO_SCALE]]))
            out[bad, 1:3] = np.clip(far, self.low[1:3], self.high[1:3])
        bad = ~self.valid(out)
        out[bad] = _FALLBACK
        return out

    # -- validity ----------------------------------------------------------------------------
    def speed_ok(self, states) -> np.ndarray:
        """Per state: is the derived intruder speed finite and in [0, 1200] ft/s?"""
        vint, _ = intruder_motion(states)
        return np.isfinite(vint) & (vint >= 0.0) & (vint <= VINT_MAX)

    def escapable(self, states) -> np.ndarray:
        """Per state: does a constant strong-left or a constant strong-right turn for the whole
        episode keep the separation at or above 200 ft at the start and at every step? (the
        peers' check; states whose derived speed is not finite count as not escapable)"""
        states = Scenario.validate(self, states)
        n = len(states)
        if n == 0:
            return np.zeros(0, dtype=bool)
        vint, _ = intruder_motion(states)
        finite = np.isfinite(vint)
        self._checking = True
        try:  # both manoeuvres in one lockstep batch: rows 0..n-1 turn left, n..2n-1 right
            sim = self.simulator(2 * n)
            sim.reset_to(np.concatenate([states, states]))
            hit = sim.rho < NMAC_FT
            act = np.repeat(np.array([3, 4], dtype=np.int64), n)
            with np.errstate(invalid="ignore"):
                while not sim.done.all():
                    sim.step(act)
                    hit |= sim.rho < NMAC_FT
        finally:
            self._checking = False
        return finite & (~hit[:n] | ~hit[n:])

    def valid(self, states) -> np.ndarray:
        """The peers' ``verify`` per state: derived speed in [0, 1200] and escapable."""
        states = Scenario.validate(self, states)
        if len(states) == 0:
            return np.zeros(0, dtype=bool)
        return self.speed_ok(states) & self.escapable(states)

    def validate(self, states, *, atol=1e-9):
        """The bounds, then (``require_valid``) the peers' validity: an encounter no turn can
        escape is not a test of the agent, nor is an intruder faster than the networks know."""
        arr = super().validate(states, atol=atol)
        if self._checking or not len(arr):
            return arr
        if not self.require_valid:
            vint, _ = intruder_motion(arr)
            if not np.all(np.isfinite(vint)):
                i = int(np.flatnonzero(~np.isfinite(vint))[0])
                raise InvalidStateError(
                    f"{self.name}: initial state #{i} has no intruder speed that meets the ownship (parallel "
                    f"courses, heading {arr[i, 3]:.4g} rad); change the heading")
            return arr
        import hashlib

        digest = hashlib.blake2b(arr.tobytes(), digest_size=16).digest() + bytes(str(arr.shape), "ascii")
        if digest in self._valid_seen:
            return arr
        speed = self.speed_ok(arr)
        if not speed.all():
            i = int(np.flatnonzero(~speed)[0])
            vint, _ = intruder_motion(arr[i : i + 1])
            raise InvalidStateError(
                f"{self.name}: initial state #{i}: the intruder would need {float(vint[0]):.6g} ft/s to meet the "
                f"ownship (valid: 0..1200 ft/s; the speed is derived from own_speed, x, y and heading). Lower "
                f"own_speed or turn the intruder's heading towards the ownship (or set require_valid: false)")
        bad = np.flatnonzero(~self.escapable(arr))
        if bad.size:
            i = int(bad[0])
            raise InvalidStateError(
                f"{self.name}: initial state #{i} cannot be escaped: even a constant strong turn of the "
                f"ownship collides (intruder at x = {arr[i, 1]:.0f} ft, y = {arr[i, 2]:.0f} ft); move the intruder "
                f"further away or change its heading (or set require_valid: false to test such states)")
        self._valid_seen[:] = (self._valid_seen + [digest])[-8:]
        return arr

    # -- simulation --------------------------------------------------------------------------
    def simulator(self, batch_size):
        return _AcasXuSim(self, batch_size)

    def reference_env(self, **kwargs):
        import gymnasium as gym

        kwargs.setdefault("max_steps", self.max_steps)
        return gym.make(self.env_id, **kwargs)

    def reference_reset_to(self, env, state, seed=0):
        obs, _ = env.reset(seed=int(seed), options={"state": np.asarray(state, dtype=np.float64)})
        return obs

    def is_failure(self, returns, lengths, terminated):
        return np.asarray(terminated, dtype=bool)

    def diversity_bounds(self):
        """Table II's grid over the observation (ρ, θ, ψ, v_own, v_int, previous advisory): ρ over
        the initial ranges [0, 60261] ft (farther falls into the last part), the angles over
        [−π, π], the speeds over their valid ranges, the advisory over 0..4."""
        return (np.array([0.0, -np.pi, -np.pi, OWN_SPEED_RANGE[0], 0.0, 0.0]),
                np.array([RHO_SCALE, np.pi, np.pi, OWN_SPEED_RANGE[1], VINT_MAX, 4.0]))


# a valid encounter far from everything (project's last resort): ownship 500 ft/s, intruder
# 50000 ft ahead on the ownship's left, heading between "at the ownship" and parallel
_FALLBACK = np.array([500.0, -30000.0, 40000.0, -0.3])
