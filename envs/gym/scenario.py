"""``gym:<id>``: any Gymnasium environment as a :class:`~envs.base.Scenario`, from a spec (data).

The spec (:mod:`envs.gym.spec`) gives the initial-state vector, the setter (:mod:`envs.gym.setters`),
the sampler and the failure oracle; the observation and action spaces are read from the
environment. Simulation is :class:`envs.gym.simulator.GymBatch`: one environment copy per
episode, stepped in lockstep. Before the scenario is first used in a process the trust checks run
(:mod:`envs.gym.trust`): a scenario that cannot be set or is not deterministic is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from envs.base import ActionSpec, InvalidStateError, Scenario, ScenarioError
from envs.gym import spec as specs
from envs.gym.setters import family_setter, make_setter
from envs.gym.simulator import EnvPool, GymBatch

ESTIMATE_RESETS = 256  # resets drawn to estimate the bounds of an automatic state (seeds 0..255)
SAMPLERS = ("reset", "uniform")


def _import_all(modules, key: str) -> None:
    import importlib

    for m in modules or ():
        try:
            importlib.import_module(str(m))
        except ImportError as exc:
            raise ScenarioError(f"gym:{key}: cannot import {m!r} ({exc}); install it (pip install ...) here and on "
                                f"every Ray worker") from exc


def _env_class(env: str):
    """The class ``module:Class`` names, or None when ``env`` is a gymnasium id."""
    import importlib
    import inspect

    import gymnasium as gym

    module, sep, attr = env.rpartition(":")
    if not sep:
        return None
    try:
        obj = getattr(importlib.import_module(module), attr, None)
    except ImportError as exc:  # gymnasium's own "module:Env-v0" imports the module too: it would fail the same
        raise ScenarioError(f"gym:{env}: cannot import module {module!r} ({exc}); install it, or run from the folder "
                            f"that holds it (PYTHONPATH), here and on every Ray worker") from exc
    return obj if inspect.isclass(obj) and issubclass(obj, gym.Env) else None


def _action_spec(space, key: str) -> ActionSpec:
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise ScenarioError(f"gym:{key}: Discrete action spaces must start at 0 (this one starts at {space.start})")
        return ActionSpec("discrete", n=int(space.n))
    if isinstance(space, spaces.Box):
        return ActionSpec("continuous", shape=tuple(space.shape), low=np.asarray(space.low, np.float32),
                          high=np.asarray(space.high, np.float32))
    raise ScenarioError(f"gym:{key}: action space {space} is not supported (Discrete or Box); wrap the environment "
                        f"(spec wrappers: [module:Wrapper]) to flatten it")


def _obs_dim(space, key: str) -> int:
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Discrete):
        return 1
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        return int(np.prod(space.shape))
    raise ScenarioError(f"gym:{key}: observation space {type(space).__name__} is not a flat array; add a wrapper that "
                        f"makes it one (spec wrappers:, e.g. gymnasium.wrappers:FlattenObservation or minigrid.wrappers:"
                        f"ImgObsWrapper)")


@dataclass
class GymScenario(Scenario):
    """A Gymnasium environment seen as a space of initial states (see the module docstring)."""

    key: str = ""  # what follows "gym:" in the name
    spec: dict = field(default_factory=dict)
    spec_source: str = ""
    integer: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    sampler: str = "reset"
    failure_kind: str = "terminated"
    failure_arg: object = None
    bounds_estimated: bool = False
    trust_steps: int = 40
    description: str = ""
    action_dtype: str = "float32"  # a continuous action reaches the environment in its action space's dtype

    # -- building --------------------------------------------------------------------------------
    @classmethod
    def build(cls, key: str, given_spec=None) -> "GymScenario":
        spec, source = specs.load_spec(key, given_spec)
        _import_all(spec.get("imports"), key)
        self = cls(name=f"gym:{key}", key=key, spec=spec, spec_source=source)
        self.env_id = str(spec["env"])
        probe = self.make_env()
        try:
            self._read_state(probe, spec)
            self._read_spaces(probe, spec)
        finally:
            probe.close()
        self.failure_kind, self.failure_arg = specs.failure_kind(spec.get("failure"), key)
        self.failure_rule = str(spec.get("failure_rule") or specs.describe_failure(self.failure_kind, self.failure_arg,
                                                                                    self.max_steps))
        self.grid_intervals = int(spec.get("grid_intervals", 5))
        self.mutation_scale = float(spec.get("mutation_scale", 0.05))
        self.stochastic = bool(spec.get("stochastic", False))
        self.trust_steps = int(spec.get("trust_steps", 40))
        self.description = str(spec.get("description", ""))
        inference = str(spec.get("inference", "batched"))
        if inference not in ("batched", "alone"):
            raise ScenarioError(f"gym:{key}: inference must be batched or alone, got {inference!r}")
        self.inference_default = inference
        if inference == "alone":
            self.inference_why = "the spec says an environment step costs many times a policy row"
        self.version = f"gym-{specs.spec_hash(spec)}"
        return self

    def _read_spaces(self, env, spec) -> None:
        self.obs_dim = _obs_dim(env.observation_space, self.key)
        self.action = _action_spec(env.action_space, self.key)
        self.action_dtype = str(getattr(env.action_space, "dtype", None) or "float32")
        steps = spec.get("max_steps") or getattr(getattr(env, "spec", None), "max_episode_steps", None)
        if not steps:
            raise ScenarioError(f"gym:{self.key}: the environment has no max_episode_steps; give max_steps in the spec")
        self.max_steps = int(steps)

    def _read_state(self, env, spec) -> None:
        setter = spec.get("setter") or family_setter(env)
        if setter is None:
            raise ScenarioError(f"gym:{self.key}: deltarl cannot tell how to put {type(env.unwrapped).__name__} into an "
                                f"initial state: write a spec with a state and a setter ({specs.FIX})")
        spec["setter"] = setter  # the resolved setter is part of the spec (and of the version)
        state = spec.get("state", "auto")
        if state == "auto":
            names, meanings, low, high = make_setter(setter, self.key).auto_state(env, self.key) or (None,) * 4
            if names is None:
                raise ScenarioError(f"gym:{self.key}: setter {setter} cannot list the state by itself; give state: "
                                    f"[...] in the spec ({specs.FIX})")
            integer = np.zeros(len(names), dtype=bool)
        else:
            names, meanings, low, high, integer = specs.state_dims(state, self.key)
        self.state_names, self.state_meaning, self.integer = names, meanings, integer
        self.integer_states = bool(integer.size and integer.all())
        self._setter = make_setter(setter, self.key, names, integer)
        self.sampler = str(spec.get("sampler", "reset"))
        if self.sampler not in SAMPLERS and ":" not in self.sampler:
            raise ScenarioError(f"gym:{self.key}: sampler must be reset, uniform or module:function, got {self.sampler!r}")
        if self.sampler == "reset" and not self._can_read(env):
            raise ScenarioError(f"gym:{self.key}: sampler reset reads the state after the environment's own reset, "
                                f"and setter {self._setter.describe()} cannot read it: give the setter a state_of "
                                f"function, or sampler: uniform")
        if low is None:
            low, high = self._estimate_bounds(env)
            self.bounds_estimated = True
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)

    def _can_read(self, env) -> bool:
        """Whether the setter reads the state back after the environment's own reset (seed 0); a
        reader that raises is the spec's error, named."""
        env.reset(seed=0)
        try:
            return self._setter.state_of(env) is not None
        except Exception as exc:  # a user's state_of: any error, said with the fix
            raise ScenarioError(f"gym:{self.key}: setter {self._setter.describe()} failed reading the state after the "
                                f"environment's own reset ({type(exc).__name__}: {exc}); fix its state_of, or use "
                                f"sampler: uniform ({specs.FIX})") from exc

    def _estimate_bounds(self, env):
        draws = []
        for s in range(ESTIMATE_RESETS):
            env.reset(seed=s)
            draws.append(self._setter.state_of(env))
        arr = np.asarray(draws, dtype=np.float64)
        return arr.min(axis=0), arr.max(axis=0)

    # -- the environment -------------------------------------------------------------------------
    def make_env(self, **kwargs):
        """A fresh copy of the environment, with the spec's wrappers (``kwargs`` e.g. render_mode)."""
        import gymnasium as gym

        _import_all(self.spec.get("imports"), self.key)
        make = dict(self.spec.get("make") or {})
        cls = _env_class(self.env_id)
        try:
            env = cls(**make, **kwargs) if cls is not None else gym.make(self.env_id, disable_env_checker=True,
                                                                          **make, **kwargs)
        except gym.error.Error as exc:
            raise ScenarioError(f"gym:{self.key}: gymnasium cannot make {self.env_id!r} ({exc}); register it, or list the "
                                f"module that registers it under imports: in the spec ({specs.FIX})") from exc
        for w in self.spec.get("wrappers") or ():
            env = specs.import_target(w, f"gym:{self.key}: wrapper")(env)
        return env

    @property
    def pool(self) -> EnvPool:
        pool = self.__dict__.get("_pool")
        if pool is None:
            pool = self.__dict__["_pool"] = EnvPool(self.make_env)
        return pool

    @property
    def setter(self):
        s = self.__dict__.get("_setter")
        if s is None:
            s = self.__dict__["_setter"] = make_setter(self.spec["setter"], self.key, self.state_names, self.integer)
        return s

    def __getstate__(self):  # environments and imported functions stay in their process
        state = dict(self.__dict__)
        for k in ("_pool", "_setter", "failure_arg"):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.failure_kind, self.failure_arg = specs.failure_kind(self.spec.get("failure"), self.key)

    def env_action(self, a):
        if self.action.discrete:
            return int(a)
        return np.asarray(a, dtype=self.action_dtype).reshape(self.action.shape)

    # -- the initial-state space -----------------------------------------------------------------
    def _round(self, states: np.ndarray) -> np.ndarray:
        if self.integer.any():
            states = states.copy()
            states[:, self.integer] = np.round(states[:, self.integer])
        return states

    def sample(self, rng, n):
        if self.sampler == "uniform":
            return self.sample_uniform(rng, n)
        if self.sampler != "reset":
            fn = specs.import_target(self.sampler, f"{self.name}: sampler")
            return self.validate(np.asarray(fn(rng, int(n)), dtype=np.float64).reshape(int(n), self.state_dim))
        seeds = rng.integers(0, 2**31 - 1, size=int(n))
        env = self.pool.take(1)
        try:
            draws = []
            for s in seeds:
                env[0].reset(seed=int(s))
                draws.append(self.setter.state_of(env[0]))
        finally:
            self.pool.give(env)
        arr = np.asarray(draws, dtype=np.float64).reshape(int(n), self.state_dim)
        return self._round(np.clip(arr, self.low, self.high))

    def sample_uniform(self, rng, n):
        return self._round(super().sample_uniform(rng, n))

    def mutate(self, states, rng, scale=None):
        return self._round(super().mutate(states, rng, scale))

    def project(self, states):
        return self._round(super().project(np.asarray(states, dtype=np.float64).reshape(-1, self.state_dim)))

    def validate(self, states, *, atol: float = 1e-9):
        arr = super().validate(states, atol=atol)
        if self.integer.any():
            frac = np.abs(arr[:, self.integer] - np.round(arr[:, self.integer])) > atol
            if frac.any():
                i, j = np.argwhere(frac)[0]
                name = np.asarray(self.state_names)[self.integer][j]
                raise InvalidStateError(f"{self.name}: initial state #{i} has '{name}' = "
                                        f"{arr[i, np.flatnonzero(self.integer)[j]]:.6g}; it must be an integer")
        return arr

    # -- simulation ------------------------------------------------------------------------------
    def simulator(self, batch_size):
        return GymBatch(self, batch_size)

    def reference_env(self, **kwargs):
        """A copy whose observations are the flat vectors the policies see (what rendering and
        other reference-environment users step: workers/render.py)."""
        import gymnasium as gym

        env, dim = self.make_env(**kwargs), self.obs_dim

        class FlatObs(gym.ObservationWrapper):
            def __init__(self, env):
                super().__init__(env)
                self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)

            def observation(self, observation):
                return np.asarray(observation, dtype=np.float32).reshape(-1)

        return FlatObs(env)

    def reference_reset_to(self, env, state, seed=0):
        from envs.gym.simulator import flat

        return flat(self.setter.reset_to(env, self.validate(state)[0], int(seed)), self.obs_dim, self.name)

    def step_verdict(self, obs, reward: float, terminated: bool, truncated: bool, info) -> tuple[bool, bool]:
        """``(failure event, ended without it)`` of one environment step (envs/gym/simulator.py)."""
        kind, arg = self.failure_kind, self.failure_arg
        if kind in ("terminated", "not_terminated", "return_below"):
            return terminated, truncated and not terminated
        if kind == "info":
            event = bool(info.get(arg, False)) if isinstance(info, dict) else False
        elif kind == "reward_below":
            event = reward < arg
        else:
            event = bool(arg(obs, reward, terminated, truncated, info))
        return event, (terminated or truncated) and not event

    def is_failure(self, returns, lengths, terminated):
        if self.failure_kind == "terminated":  # terminated and not truncated (at the step limit both can hold)
            return np.asarray(terminated, dtype=bool) & (np.asarray(lengths) < self.max_steps)
        if self.failure_kind == "not_terminated":  # the goal (the environment's termination) not reached
            return ~np.asarray(terminated, dtype=bool)
        if self.failure_kind == "return_below":
            return np.asarray(returns, dtype=np.float64) < self.failure_arg
        return np.asarray(terminated, dtype=bool).copy()

    def describe(self) -> dict:
        d = super().describe()
        d.update({"spec": self.spec_source, "setter": self.setter.describe(), "sampler": self.sampler,
                  "bounds": "estimated from 256 resets" if self.bounds_estimated else "given",
                  "integer": [n for n, i in zip(self.state_names, self.integer) if i]})
        return d
