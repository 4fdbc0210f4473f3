"""MuJoCo scenarios: Hopper-v5, Walker2d-v5 and Hopper-Noise (Hopper-v5 with random wind).

One file on purpose: the batched simulator, the wind model and the three scenarios repeat
gymnasium's ``MujocoEnv`` arithmetic together and are checked together, step for step, against
the reference environments.

The initial-state vector of a planar walker is ``qpos[1:]`` followed by ``qvel``: every
generalized coordinate except ``rootx`` (the horizontal position, set to 0: neither the
observation nor the reward depends on it) and every generalized velocity. Its bounds are
``init ± reset_noise_scale``, the support of gymnasium's own reset distribution, which draws
every coordinate uniformly from that box; :meth:`sample` draws from it too. Widen the region by
setting ``reset_noise_scale`` (the bounds follow).

Simulation: :class:`MujocoSim` steps B episodes in lockstep and repeats gymnasium 1.0.0's
``MujocoEnv.step`` exactly. The physics state of an episode is MuJoCo's integration state
(``mjSTATE_INTEGRATION``: time, qpos, qvel, controls, applied forces and the solver
warm-start ``qacc_warmstart``, which gymnasium's ``MjData`` carries from step to step); all B
states live in a :class:`mujoco.batch.Batch` (MuJoCo >= 4.0) and advance with ``frame_skip``
calls to ``mj_step`` per environment step, in C, with no per-episode Python. Observation,
reward and termination are computed vectorized in numpy from the resulting ``qpos``/``qvel``
with gymnasium's arithmetic in gymnasium's order. The batch is bit-identical to one
``MjData`` per episode (MuJoCo documents it, the conformance tests check it against the
reference environments). With an older MuJoCo (no ``mujoco.batch``) the simulator falls back to
one ``MjData`` per episode stepped in a Python loop (``backend="loop"``), same results, slower.

Why not ``mujoco.rollout``: it takes an initial warm-start but does not return the final one,
so restarting it every environment step drops the warm-start and drifts from gymnasium (~1e-9
after 100 steps, then chaotically). Speed (one thread, Hopper, mixed random/PD actions):
~170 µs per episode-step at B=64..256, 97% of it inside MuJoCo's ``mj_step``, against ~360 µs
for gymnasium's ``env.step``.

Things gymnasium does that do not touch the state, hence are not repeated: the ``mj_forward``
of ``set_state`` and the ``mj_rnePostConstraint`` after each step (both compute derived
quantities only; ``mj_step`` recomputes everything it needs from the integration state).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import mujoco
import numpy as np

from envs.base import ActionSpec, BatchSimulator, Scenario, ScenarioError, StepBatch

try:  # MuJoCo >= 4.0
    from mujoco import batch as _mjbatch
except ImportError:  # pragma: no cover - exercised only with an older MuJoCo
    _mjbatch = None

# gymnasium MujocoEnv.step constants shared by Hopper-v5 and Walker2d-v5 (their defaults)
FRAME_SKIP = 4
FORWARD_REWARD_WEIGHT = 1.0
CTRL_COST_WEIGHT = 1e-3
HEALTHY_REWARD = 1.0
OBS_VEL_CLIP = 10.0

_MODELS: dict = {}  # xml file -> MjModel (loaded once per process)


def _gym_assets_dir() -> str:
    import gymnasium.envs.mujoco as gm

    return os.path.join(os.path.dirname(gm.__file__), "assets")


def load_model(xml_file: str):
    """The MjModel gymnasium builds for ``xml_file`` (one of its assets), cached."""
    model = _MODELS.get(xml_file)
    if model is None:
        model = mujoco.MjModel.from_xml_path(os.path.join(_gym_assets_dir(), xml_file))
        _MODELS[xml_file] = model
    return model


# ---------------------------------------------------------------------------------------------
# Wind (Hopper-Noise)
# ---------------------------------------------------------------------------------------------

WIND_CHUNK = 256  # steps of standard normals drawn at once per episode


def wind_normals(seed: int, chunk: int) -> np.ndarray:
    """Standard normals ``ε_t`` for steps ``t`` in ``[chunk·256, (chunk+1)·256)`` of the episode
    whose seed is ``seed``: a Philox-4x64 stream keyed by the seed, its counter starting at
    ``chunk`` in the third word (so chunks never overlap). A pure function of (seed, step)."""
    key = int(seed) & 0xFFFFFFFFFFFFFFFF
    bitgen = np.random.Philox(key=key, counter=np.array([0, 0, int(chunk), 0], dtype=np.uint64))
    return np.random.Generator(bitgen).standard_normal(WIND_CHUNK)


def wind_uniforms(seed: int, chunk: int) -> np.ndarray:
    """Uniform draws ``u_t`` in [-1, 1) for steps ``t`` in ``[chunk·256, (chunk+1)·256)`` of the
    episode whose seed is ``seed``, from the same keyed Philox stream as :func:`wind_normals` (a
    scenario uses one of the two)."""
    key = int(seed) & 0xFFFFFFFFFFFFFFFF
    bitgen = np.random.Philox(key=key, counter=np.array([0, 0, int(chunk), 0], dtype=np.uint64))
    return np.random.Generator(bitgen).uniform(-1.0, 1.0, WIND_CHUNK)


WIND_KINDS = ("walk", "ar1")


@dataclass(frozen=True)
class WindModel:
    """Horizontal force along world +x on the walker's bodies, constant over the ``frame_skip``
    physics substeps of an environment step, drawn from the episode's keyed stream (its seed and
    the step index only). Two processes (``kind``):

    * ``"walk"`` — the stochastic MuJoCo of Rigter et al. (1R2R, NeurIPS 2023), which the Delta
      paper cites for Hopper-Noise: a bounded random walk, ``W_0 = 0`` at reset, then before every
      step ``W_t = clip(W_{t-1} + u_t · step · limit, -limit, limit)`` with ``u_t ~ U(-1, 1)``
      (:func:`wind_uniforms`); the force is ``F_t = mean + W_t``. 1R2R's moderate noise is
      ``limit`` 2.5 N, ``step`` 0.1 (its high noise: 5 N).
    * ``"ar1"`` — a stationary Gaussian AR(1) (discretized Ornstein-Uhlenbeck) gust:
      ``F_t = mean + std · g_t``, ``g_0 = ε_0``, ``g_t = ρ g_{t-1} + sqrt(1-ρ²) ε_t`` with
      ``ρ = exp(-dt/tau)`` (``tau = 0``: independent draws every step), ``ε_t`` from
      :func:`wind_normals`.
    """

    mean: float
    std: float
    tau: float
    dt: float
    kind: str = "ar1"
    limit: float = 0.0
    step: float = 0.0

    @property
    def rho(self) -> float:
        return float(np.exp(-self.dt / self.tau)) if self.tau > 0 else 0.0

    @property
    def innovation(self) -> float:
        return float(np.sqrt(1.0 - self.rho**2))

    def draws(self, seed: int, chunk: int) -> np.ndarray:
        return wind_uniforms(seed, chunk) if self.kind == "walk" else wind_normals(seed, chunk)

    def advance(self, prev, draw, first):
        """The process's next state from the previous one (``first``: the episode's first step)."""
        if self.kind == "walk":
            start = np.where(first, 0.0, prev)
            return np.clip(start + draw * (self.step * self.limit), -self.limit, self.limit)
        return np.where(first, draw, self.rho * prev + self.innovation * draw)

    def force(self, state):
        return self.mean + (state if self.kind == "walk" else self.std * state)


class _WindStreams:
    """Per-episode wind state for a batch; values depend only on (seed, step index)."""

    def __init__(self, wind: WindModel, seeds: np.ndarray):
        self.wind = wind
        self.seeds = np.asarray(seeds, dtype=np.int64).copy()
        n = self.seeds.shape[0]
        self.draws = np.zeros((n, WIND_CHUNK))
        self.chunk = np.full(n, -1, dtype=np.int64)
        self.state = np.zeros(n)

    def advance(self, idx: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Process state (gust or walk) for episodes ``idx`` at their step ``t`` (each called once per step)."""
        c = t // WIND_CHUNK
        stale = np.flatnonzero(self.chunk[idx] != c)
        for j in stale:  # once every WIND_CHUNK steps per episode
            i = idx[j]
            self.draws[i] = self.wind.draws(self.seeds[i], c[j])
            self.chunk[i] = c[j]
        g = self.wind.advance(self.state[idx], self.draws[idx, t % WIND_CHUNK], t == 0)
        self.state[idx] = g
        return g


# ---------------------------------------------------------------------------------------------
# The batched simulator
# ---------------------------------------------------------------------------------------------


def wind_body_ids(model, which: str) -> np.ndarray:
    """Ids of the bodies the wind pushes: ``"all"`` (every body but the world, as 1R2R) or one
    body's name (e.g. ``"torso"``)."""
    if which == "all":
        return np.arange(1, model.nbody)
    try:
        return np.array([model.body(which).id])
    except KeyError as exc:
        names = ", ".join(model.body(i).name for i in range(1, model.nbody))
        raise ScenarioError(f"wind_body: no body {which!r}; use 'all' or one of {names}") from exc


class _BatchBackend:
    """All episodes' integration states in one mujoco.batch.Batch (stepped in C)."""

    def __init__(self, model, nsim: int, nthread: int, wind_bodies: np.ndarray | None):
        self.batch = _mjbatch.Batch(model, nsim=nsim, nthread=nthread)
        self.qpos = self.batch.bind("qpos")  # live views of the state rows
        self.qvel = self.batch.bind("qvel")
        self.ctrl = self.batch.bind("ctrl")
        self.xfrc = self.batch.bind("xfrc_applied") if wind_bodies is not None else None
        self.wind_bodies = wind_bodies

    def reset(self, n: int, qpos: np.ndarray, qvel: np.ndarray) -> None:
        ids = np.arange(n, dtype=np.int32)
        # mj_resetData: time 0, zero controls/forces/warm-start; then the given qpos/qvel
        self.batch.reset(None if n == self.batch.nsim else ids, stage=mujoco.mjtStage.mjSTAGE_NONE)
        self.qpos[:n] = qpos
        self.qvel[:n] = qvel

    def step(self, live: np.ndarray, ctrl: np.ndarray, wind: np.ndarray | None, nstep: int) -> None:
        self.ctrl[live] = ctrl
        if wind is not None:
            self.xfrc[live[:, None], self.wind_bodies[None, :], 0] = wind[:, None]
        ids = None if live.size == self.batch.nsim else live.astype(np.int32)
        self.batch.step(ids, nstep=nstep)


class _LoopBackend:
    """One MjData per episode, stepped in a Python loop (MuJoCo < 4.0, or for cross-checks)."""

    def __init__(self, model, nsim: int, nthread: int, wind_bodies: np.ndarray | None):
        self.model = model
        self.datas = [mujoco.MjData(model) for _ in range(nsim)]
        self.qpos = np.zeros((nsim, model.nq))
        self.qvel = np.zeros((nsim, model.nv))
        self.wind_bodies = wind_bodies

    def reset(self, n: int, qpos: np.ndarray, qvel: np.ndarray) -> None:
        for i in range(n):
            d = self.datas[i]
            mujoco.mj_resetData(self.model, d)
            d.qpos[:] = qpos[i]
            d.qvel[:] = qvel[i]
        self.qpos[:n] = qpos
        self.qvel[:n] = qvel

    def step(self, live: np.ndarray, ctrl: np.ndarray, wind: np.ndarray | None, nstep: int) -> None:
        mj_step, m = mujoco.mj_step, self.model
        for j, i in enumerate(live.tolist()):
            d = self.datas[i]
            d.ctrl[:] = ctrl[j]
            if wind is not None:
                d.xfrc_applied[self.wind_bodies, 0] = wind[j]
            mj_step(m, d, nstep=nstep)
            self.qpos[i] = d.qpos
            self.qvel[i] = d.qvel


class MujocoSim(BatchSimulator):
    """B episodes of a planar MuJoCo walker in lockstep (see the module docstring).

    ``nthread``: threads of the MuJoCo batch (1: the calling thread only, the default, as the
    engine runs one simulator per worker process; 0: all CPUs). Results do not depend on it. ``backend``: ``"batch"`` (default when MuJoCo has
    ``mujoco.batch``) or ``"loop"``.
    """

    def __init__(self, scenario: "_PlanarWalker", batch_size: int, nthread: int = 1, backend: str | None = None):
        super().__init__(scenario, batch_size)
        self.model = load_model(scenario.xml_file)
        self.nq, self.nv, self.nu = self.model.nq, self.model.nv, self.model.nu
        self.dt = self.model.opt.timestep * FRAME_SKIP  # gymnasium's MujocoEnv.dt
        backend = backend or ("batch" if _mjbatch is not None else "loop")
        if backend == "batch" and _mjbatch is None:
            raise ScenarioError("backend 'batch' needs mujoco >= 4.0 (mujoco.batch); use backend='loop'")
        if backend not in ("batch", "loop"):
            raise ScenarioError(f"unknown MuJoCo backend {backend!r}; use 'batch' or 'loop'")
        self.backend_name = backend
        self.wind = scenario.wind_model(self.dt)
        wind_bodies = wind_body_ids(self.model, scenario.wind_body) if self.wind is not None else None
        cls = _BatchBackend if backend == "batch" else _LoopBackend
        self._be = cls(self.model, max(self.batch_size, 1), int(nthread), wind_bodies)
        self._streams = None

    # gymnasium: _get_obs = concat(qpos[1:], clip(qvel, -10, 10))
    def _obs(self, n: int) -> np.ndarray:
        qpos, qvel = self._be.qpos[:n], self._be.qvel[:n]
        return np.concatenate([qpos[:, 1:], np.clip(qvel, -OBS_VEL_CLIP, OBS_VEL_CLIP)], axis=1)

    def _reset(self, states, seeds):
        n = states.shape[0]
        nq1 = self.nq - 1
        qpos = np.concatenate([np.zeros((n, 1)), states[:, :nq1]], axis=1)
        self._be.reset(n, qpos, states[:, nq1:])
        if self.wind is not None:
            self._streams = _WindStreams(self.wind, seeds)
        return self._obs(n)

    def _step(self, actions, live):
        n = self.n
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim == 1 and self.nu == 1:
            a = a[:, None]
        if a.ndim != 2 or a.shape[1] != self.nu or a.shape[0] < n:
            raise ScenarioError(
                f"{self.scenario.name}: actions must have shape ({n}, {self.nu}), got {np.shape(actions)}"
            )
        al = a[live]
        x_before = self._be.qpos[live, 0]
        wind = None
        if self.wind is not None:
            wind = self.wind.force(self._streams.advance(live, self.t[live]))
        self._be.step(live, al, wind, FRAME_SKIP)
        qpos, qvel = self._be.qpos[live], self._be.qvel[live]
        x_velocity = (qpos[:, 0] - x_before) / self.dt
        healthy = self.scenario.is_healthy(qpos, qvel)
        # gymnasium: (forward_reward + healthy_reward) - ctrl_cost, in this order
        forward_reward = FORWARD_REWARD_WEIGHT * x_velocity
        healthy_reward = healthy * HEALTHY_REWARD
        ctrl_cost = CTRL_COST_WEIGHT * np.sum(np.square(al), axis=1)
        out = StepBatch(
            obs=self._obs(n),
            reward=np.zeros(n),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
        )
        out.reward[live] = (forward_reward + healthy_reward) - ctrl_cost
        out.terminated[live] = ~healthy
        return out


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------


def _joint_meaning(joint: str) -> tuple[str, str]:
    """(position meaning, velocity meaning) of a walker joint."""
    if joint == "rootx":
        return "torso x position [m]", "torso x velocity (forward) [m/s]"
    if joint == "rootz":
        return "torso z position (height) [m]", "torso z velocity [m/s]"
    if joint == "rooty":
        return "torso pitch angle [rad]", "torso pitch angular velocity [rad/s]"
    part, side = joint.replace("_joint", ""), ""
    if part.endswith("_left"):
        part, side = part[: -len("_left")], "left "
    what = {"thigh": "hip (thigh)", "leg": "knee (leg)", "foot": "ankle (foot)"}.get(part, part)
    return f"{side}{what} joint angle [rad]", f"{side}{what} joint angular velocity [rad/s]"


def _state_layout(joints: tuple[str, ...]):
    pos = joints[1:]  # rootx excluded
    names = tuple(pos) + tuple(f"v_{j}" for j in joints)
    meaning = tuple(_joint_meaning(j)[0] for j in pos) + tuple(_joint_meaning(j)[1] for j in joints)
    return names, meaning


_HOPPER_JOINTS = ("rootx", "rootz", "rooty", "thigh_joint", "leg_joint", "foot_joint")
_WALKER_JOINTS = _HOPPER_JOINTS + ("thigh_left_joint", "leg_left_joint", "foot_left_joint")
_HOPPER_NAMES, _HOPPER_MEANING = _state_layout(_HOPPER_JOINTS)
_WALKER_NAMES, _WALKER_MEANING = _state_layout(_WALKER_JOINTS)


@dataclass
class _PlanarWalker(Scenario):
    """Shared by the MuJoCo walkers: state = qpos[1:] + qvel, bounds = init ± reset_noise_scale."""

    xml_file: str = ""
    init_qpos: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the model's qpos0
    reset_noise_scale: float = 5e-3  # gymnasium's default; the half-width of the region
    max_steps: int = 1000
    grid_intervals: int = 5
    failure_rule: str = "unhealthy termination within 1000 steps"
    wind_body: str = "torso"
    inference_default: str = "alone"
    inference_why: str = ("a MuJoCo step costs many times a policy row acted alone, and a weak agent makes most "
                          "episodes candidates: acting alone costs less than re-running them")

    def __post_init__(self):
        self._set_bounds()

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "reset_noise_scale" and "init_qpos" in self.__dict__:
            self._set_bounds()  # e.g. get_scenario("Hopper-v5", reset_noise_scale=0.1)

    def _set_bounds(self):
        s = float(self.reset_noise_scale)
        if not np.isfinite(s) or s < 0:
            raise ScenarioError(f"{self.name}: reset_noise_scale must be a finite number >= 0, got {s!r}")
        nq = len(self.init_qpos)
        center = np.concatenate([np.asarray(self.init_qpos, dtype=np.float64)[1:], np.zeros(nq)])
        self.low = center - s
        self.high = center + s

    @property
    def nq(self) -> int:
        return len(self.init_qpos)

    def sample(self, rng, n):
        # gymnasium's reset_model: qpos/qvel = init + U(-scale, scale) per coordinate
        return rng.uniform(self.low, self.high, size=(n, self.state_dim))

    def wind_model(self, dt: float) -> WindModel | None:
        return None

    def simulator(self, batch_size, nthread: int = 1, backend: str | None = None):
        return MujocoSim(self, batch_size, nthread=nthread, backend=backend)

    def split_state(self, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(qpos, qvel) of one initial state, rootx = 0."""
        state = self.validate(state)[0]
        nq1 = self.nq - 1
        return np.concatenate([[0.0], state[:nq1]]), state[nq1:].copy()

    def reference_reset_to(self, env, state, seed=0):
        qpos, qvel = self.split_state(state)
        env.reset(seed=int(seed))
        env.unwrapped.set_state(qpos, qvel)
        return env.unwrapped._get_obs()

    def is_healthy(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def is_failure(self, returns, lengths, terminated):
        # terminated = unhealthy before the step limit (truncation is not a termination)
        return np.asarray(terminated, dtype=bool).copy()


@dataclass
class Hopper(_PlanarWalker):
    """Hopper-v5: torso height/pitch, 3 joint angles and the 6 velocities (11 values).

    Healthy (gymnasium v5): 0.7 < z, |pitch| < 0.2 and every value of qpos[2:], qvel in
    (-100, 100); an unhealthy state ends the episode (a failure).
    """

    name: str = "Hopper-v5"
    env_id: str = "Hopper-v5"
    xml_file: str = "hopper.xml"
    init_qpos: np.ndarray = field(default_factory=lambda: np.array([0.0, 1.25, 0.0, 0.0, 0.0, 0.0]))
    state_names: tuple = _HOPPER_NAMES
    state_meaning: tuple = _HOPPER_MEANING
    obs_dim: int = 11
    action: ActionSpec = field(
        default_factory=lambda: ActionSpec("continuous", shape=(3,), low=-np.ones(3, np.float32), high=np.ones(3, np.float32))
    )

    def is_healthy(self, qpos, qvel):
        z, angle = qpos[:, 1], qpos[:, 2]
        rest = np.concatenate([qpos[:, 2:], qvel], axis=1)  # state_vector()[2:]
        healthy_state = np.all((-100.0 < rest) & (rest < 100.0), axis=1)
        return healthy_state & (0.7 < z) & (z < np.inf) & (-0.2 < angle) & (angle < 0.2)


@dataclass
class Walker2d(_PlanarWalker):
    """Walker2d-v5: torso height/pitch, 6 joint angles and the 9 velocities (17 values).

    Healthy (gymnasium v5): 0.8 < z < 2.0 and -1 < pitch < 1.
    """

    name: str = "Walker2d-v5"
    env_id: str = "Walker2d-v5"
    xml_file: str = "walker2d_v5.xml"
    init_qpos: np.ndarray = field(default_factory=lambda: np.array([0.0, 1.25] + [0.0] * 7))
    state_names: tuple = _WALKER_NAMES
    state_meaning: tuple = _WALKER_MEANING
    obs_dim: int = 17
    action: ActionSpec = field(
        default_factory=lambda: ActionSpec("continuous", shape=(6,), low=-np.ones(6, np.float32), high=np.ones(6, np.float32))
    )

    def is_healthy(self, qpos, qvel):
        z, angle = qpos[:, 1], qpos[:, 2]
        return (0.8 < z) & (z < 2.0) & (-1.0 < angle) & (angle < 1.0)


@functools.lru_cache(maxsize=None)
def _wind_wrapper_class():
    import gymnasium as gym

    class HopperWindWrapper(gym.Wrapper):
        """The reference Hopper-Noise: Hopper-v5 plus the wind of :class:`HopperNoise`, applied
        as ``data.xfrc_applied[bodies, 0]`` before each step, keyed by the seed of ``reset``."""

        def __init__(self, env, wind: WindModel, body: str = "all"):
            super().__init__(env)
            self.wind = wind
            self.body_ids = wind_body_ids(env.unwrapped.model, body)
            self._seed = 0
            self._t = 0
            self._draws = None
            self._chunk = -1
            self._state = 0.0
            self.last_force = 0.0

        def reset(self, *, seed=None, options=None):
            out = self.env.reset(seed=seed, options=options)
            self._seed = 0 if seed is None else int(seed)
            self._t, self._chunk, self._state = 0, -1, 0.0
            return out

        def step(self, action):
            t = self._t
            c = t // WIND_CHUNK
            if c != self._chunk:
                self._draws, self._chunk = self.wind.draws(self._seed, c), c
            self._state = float(self.wind.advance(np.float64(self._state), self._draws[t % WIND_CHUNK], t == 0))
            self.last_force = float(self.wind.force(self._state))
            self.env.unwrapped.data.xfrc_applied[self.body_ids, 0] = self.last_force
            self._t += 1
            return self.env.step(action)

    return HopperWindWrapper


@dataclass
class HopperNoise(Hopper):
    """Hopper-v5 in random wind: a horizontal force on the hopper at every step.

    The Delta paper's Hopper-Noise is "a non-deterministic variant of Hopper that introduces
    random wind disturbances" and cites Luo et al. (ICLR 2025) and Rigter et al. (1R2R, NeurIPS
    2023), whose stochastic Hopper is the default here (``wind = "walk"``, :class:`WindModel`): a
    force along world +x on every body of the hopper (torso, thigh, leg, foot:
    ``data.xfrc_applied[1:, 0]``), a random walk that starts at 0 N each episode and moves by
    U(-1, 1) · ``wind_step`` · ``wind_limit`` per step, clipped to ±``wind_limit`` (1R2R's
    moderate noise: 2.5 N, step 0.1; its high noise: ``wind_limit`` 5). The draws come from a
    Philox stream keyed by the episode's seed (the ``seeds`` given to ``reset_to``) and the step
    index only: an episode's wind does not depend on the other episodes of its batch, and the
    same seed gives the same episode.

    ``wind = "ar1"`` is deltarl's earlier model (before 2026-12-03), kept for comparison: a
    stationary Gaussian AR(1) gust on one body (``wind_body = "torso"``),
    ``F_t = wind_mean + wind_std · g_t`` with correlation time ``wind_tau`` (3 N, 0.1 s), which
    linear ARS hopping policies failed under in 25% of starts (trained in calm air) and 3-6%
    (fine-tuned in wind). For scale: the hopper weighs 155 N (15.8 kg); the torso-angle limit is
    0.2 rad.
    """

    name: str = "Hopper-Noise"
    env_id: str = "Hopper-v5"
    stochastic: bool = True
    wind: str = "walk"  # "walk" (1R2R's bounded random walk) | "ar1" (a Gaussian AR(1) gust)
    wind_body: str = "all"  # "all" bodies (1R2R) or one body's name, e.g. "torso"
    wind_mean: float = 0.0  # N, along +x (added to either process)
    wind_limit: float = 2.5  # N, walk: |W_t| <= limit (1R2R moderate noise 2.5, high 5)
    wind_step: float = 0.1  # walk: the largest change per step, as a fraction of the limit
    wind_std: float = 3.0  # N, ar1: stationary standard deviation of the force
    wind_tau: float = 0.1  # s, ar1: gust correlation time (0: independent draws every step)

    def wind_model(self, dt):
        if self.wind not in WIND_KINDS:
            raise ScenarioError(f"{self.name}: wind must be one of {', '.join(WIND_KINDS)}, got {self.wind!r}")
        for k in ("wind_mean", "wind_std", "wind_tau", "wind_limit", "wind_step"):
            v = float(getattr(self, k))
            if not np.isfinite(v) or (k != "wind_mean" and v < 0):
                raise ScenarioError(f"{self.name}: {k} must be a finite number{' >= 0' if k != 'wind_mean' else ''}, got {v!r}")
        return WindModel(float(self.wind_mean), float(self.wind_std), float(self.wind_tau), float(dt),
                         kind=self.wind, limit=float(self.wind_limit), step=float(self.wind_step))

    def reference_env(self, **kwargs):
        import gymnasium as gym

        env = gym.make("Hopper-v5", **kwargs)
        dt = env.unwrapped.dt
        return _wind_wrapper_class()(env, self.wind_model(dt), self.wind_body)
