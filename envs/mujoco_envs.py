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


@dataclass(frozen=True)
class WindModel:
    """Horizontal wind force on a body: ``F_t = mean + std · g_t`` newtons along +x (world).

    ``g_t`` is a stationary AR(1) (discretized Ornstein-Uhlenbeck) gust with unit variance and
    correlation time ``tau`` seconds: ``g_0 = ε_0``, ``g_t = ρ g_{t-1} + sqrt(1-ρ²) ε_t`` with
    ``ρ = exp(-dt/tau)`` (``tau = 0``: independent draws every step), ``ε_t`` from
    :func:`wind_normals` (the episode's seed, step t). The force is held constant over the
    ``frame_skip`` physics substeps of an environment step.
    """

    mean: float
    std: float
    tau: float
    dt: float

    @property
    def rho(self) -> float:
        return float(np.exp(-self.dt / self.tau)) if self.tau > 0 else 0.0

    @property
    def innovation(self) -> float:
        return float(np.sqrt(1.0 - self.rho**2))

    def force(self, gust):
        return self.mean + self.std * gust


class _WindStreams:
    """Per-episode gust state for a batch; values depend only on (seed, step index)."""

    def __init__(self, wind: WindModel, seeds: np.ndarray):
        self.wind = wind
        self.seeds = np.asarray(seeds, dtype=np.int64).copy()
        n = self.seeds.shape[0]
        self.eps = np.zeros((n, WIND_CHUNK))
        self.chunk = np.full(n, -1, dtype=np.int64)
        self.gust = np.zeros(n)

    def advance(self, idx: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Gust values for episodes ``idx`` at their step ``t`` (each called once per step)."""
        c = t // WIND_CHUNK
        stale = np.flatnonzero(self.chunk[idx] != c)
        for j in stale:  # once every WIND_CHUNK steps per episode
            i = idx[j]
            self.eps[i] = wind_normals(self.seeds[i], c[j])
            self.chunk[i] = c[j]
        eps = self.eps[idx, t % WIND_CHUNK]
        g = np.where(t == 0, eps, self.wind.rho * self.gust[idx] + self.wind.innovation * eps)
        self.gust[idx] = g
        return g


# ---------------------------------------------------------------------------------------------
# The batched simulator
# ---------------------------------------------------------------------------------------------


class _BatchBackend:
    """All episodes' integration states in one mujoco.batch.Batch (stepped in C)."""

    def __init__(self, model, nsim: int, nthread: int, wind_body: int | None):
        self.batch = _mjbatch.Batch(model, nsim=nsim, nthread=nthread)
        self.qpos = self.batch.bind("qpos")  # live views of the state rows
        self.qvel = self.batch.bind("qvel")
        self.ctrl = self.batch.bind("ctrl")
        self.xfrc = self.batch.bind("xfrc_applied") if wind_body is not None else None
        self.wind_body = wind_body

    def reset(self, n: int, qpos: np.ndarray, qvel: np.ndarray) -> None:
        ids = np.arange(n, dtype=np.int32)
        # mj_resetData: time 0, zero controls/forces/warm-start; then the given qpos/qvel
        self.batch.reset(None if n == self.batch.nsim else ids, stage=mujoco.mjtStage.mjSTAGE_NONE)
        self.qpos[:n] = qpos
        self.qvel[:n] = qvel

    def step(self, live: np.ndarray, ctrl: np.ndarray, wind: np.ndarray | None, nstep: int) -> None:
        self.ctrl[live] = ctrl
        if wind is not None:
            self.xfrc[live, self.wind_body, 0] = wind
        ids = None if live.size == self.batch.nsim else live.astype(np.int32)
        self.batch.step(ids, nstep=nstep)


class _LoopBackend:
    """One MjData per episode, stepped in a Python loop (MuJoCo < 4.0, or for cross-checks)."""

    def __init__(self, model, nsim: int, nthread: int, wind_body: int | None):
        self.model = model
        self.datas = [mujoco.MjData(model) for _ in range(nsim)]
        self.qpos = np.zeros((nsim, model.nq))
        self.qvel = np.zeros((nsim, model.nv))
        self.wind_body = wind_body

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
                d.xfrc_applied[self.wind_body, 0] = wind[j]
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
        wind_body = self.model.body(scenario.wind_body).id if self.wind is not None else None
        cls = _BatchBackend if backend == "batch" else _LoopBackend
        self._be = cls(self.model, max(self.batch_size, 1), int(nthread), wind_body)
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
        as ``data.xfrc_applied[torso, 0]`` before each step, keyed by the seed of ``reset``."""

        def __init__(self, env, wind: WindModel, body: str = "torso"):
            super().__init__(env)
            self.wind = wind
            self.body_id = env.unwrapped.model.body(body).id
            self._seed = 0
            self._t = 0
            self._eps = None
            self._chunk = -1
            self._gust = 0.0
            self.last_force = 0.0

        def reset(self, *, seed=None, options=None):
            out = self.env.reset(seed=seed, options=options)
            self._seed = 0 if seed is None else int(seed)
            self._t, self._chunk, self._gust = 0, -1, 0.0
            return out

        def step(self, action):
            t = self._t
            c = t // WIND_CHUNK
            if c != self._chunk:
                self._eps, self._chunk = wind_normals(self._seed, c), c
            eps = self._eps[t % WIND_CHUNK]
            w = self.wind
            self._gust = eps if t == 0 else w.rho * self._gust + w.innovation * eps
            self.last_force = w.force(self._gust)
            self.env.unwrapped.data.xfrc_applied[self.body_id, 0] = self.last_force
            self._t += 1
            return self.env.step(action)

    return HopperWindWrapper


@dataclass
class HopperNoise(Hopper):
    """Hopper-v5 in gusty wind: a random horizontal force on the torso at every step.

    Wind model (see :class:`WindModel`): the force ``F_t = wind_mean + wind_std · g_t`` newtons
    acts along world +x (positive: pushes forward) at the torso's centre of mass
    (``data.xfrc_applied[torso, 0]``), constant over the 4 physics substeps of step t.
    ``g_t`` is a unit-variance Gaussian AR(1) gust with correlation time ``wind_tau`` seconds,
    driven by standard normals from a Philox stream keyed by the episode's seed (the
    ``seeds`` given to ``reset_to``) and the step index only: an episode's wind does not
    depend on the other episodes of its batch, and the same seed gives the same episode.

    Defaults ``wind_std = 3 N``, ``wind_tau = 0.1 s``, ``wind_mean = 0``, calibrated with linear
    ARS hopping policies (48-64 episodes from the reset distribution, 1000 steps): a policy
    trained without wind (return 3320, no failures in calm air) fails 25% of its episodes at
    3 N (62% at 5 N, 92% at 10 N), while the same policy fine-tuned in the wind keeps hopping
    (tuned at 5 N: return ~3100, 3-6% failures at 3 N; ~30% at 5 N, ~60% at 8 N). The default wind
    perturbs a good hopper noticeably, hopping through it is learnable, and a good agent's
    baseline failure rate stays low enough for a statistical oracle. For scale: the hopper
    weighs 155 N (15.8 kg); the torso-angle limit is 0.2 rad.
    """

    name: str = "Hopper-Noise"
    env_id: str = "Hopper-v5"
    stochastic: bool = True
    wind_mean: float = 0.0  # N, along +x
    wind_std: float = 3.0  # N, stationary standard deviation of the force
    wind_tau: float = 0.1  # s, gust correlation time (0: independent draws every step)

    def wind_model(self, dt):
        for k in ("wind_mean", "wind_std", "wind_tau"):
            v = float(getattr(self, k))
            if not np.isfinite(v) or (k != "wind_mean" and v < 0):
                raise ScenarioError(f"{self.name}: {k} must be a finite number{' >= 0' if k != 'wind_mean' else ''}, got {v!r}")
        return WindModel(float(self.wind_mean), float(self.wind_std), float(self.wind_tau), float(dt))

    def reference_env(self, **kwargs):
        import gymnasium as gym

        env = gym.make("Hopper-v5", **kwargs)
        dt = env.unwrapped.dt
        return _wind_wrapper_class()(env, self.wind_model(dt), self.wind_body)
