"""How an initial state is put into a Gymnasium environment (the setter protocol).

A setter has three jobs, the first required:

* ``reset_to(env, state, seed) -> observation``: reset ``env`` with ``seed`` and put it into
  ``state`` (a float64 vector in the spec's order); return the first observation, as ``env``
  (with its wrappers) would have returned it from that state;
* ``state_of(env) -> vector`` (optional): read the current initial state back (what the ``reset``
  sampler uses to draw from the environment's own reset distribution, and what the trust checks
  compare after ``reset_to``);
* ``observe(env) -> observation`` (optional): the environment's own observation of its current
  state, through its wrappers (the trust checks compare it with what ``reset_to`` returned).

Built in: ``classic-control`` (``unwrapped.state``: CartPole, MountainCar, Acrobot, Pendulum, ...),
``mujoco`` (``unwrapped.set_state(qpos, qvel)``; ``fixed_qpos: {index: value}`` keeps coordinates
such as a walker's ``rootx`` out of the state), ``reset-options`` (``env.reset(seed=,
options={key: state})``, the convention of environments that accept a start state) and
``module:reset_to`` (a user function; ``{function: m:f, state_of: m:g, observe: m:h}`` adds the
optional parts).
"""

from __future__ import annotations

import numpy as np

from envs.base import ScenarioError
from envs.gym.spec import FIX, import_target


def wrapper_chain(env) -> list:
    """The wrappers of ``env``, outermost first."""
    import gymnasium as gym

    chain, w = [], env
    while isinstance(w, gym.Wrapper):
        chain.append(w)
        w = w.env
    return chain


def wrapped_obs(env, raw):
    """``raw`` (the unwrapped environment's observation) through ``env``'s observation wrappers."""
    import gymnasium as gym

    for w in reversed(wrapper_chain(env)):
        if isinstance(w, gym.ObservationWrapper):
            raw = w.observation(raw)
    return raw


class Setter:
    kind = ""

    def reset_to(self, env, state: np.ndarray, seed: int):
        raise NotImplementedError

    def state_of(self, env) -> np.ndarray | None:
        return None

    def observe(self, env):
        return None

    def auto_state(self, env, key: str):
        """``(names, meanings, low, high)`` for ``state: auto``, or None where the family cannot say."""
        return None

    def describe(self) -> str:
        return self.kind


class ClassicControl(Setter):
    """``env.reset(seed)``, then ``env.unwrapped.state = state`` (the classic-control convention)."""

    kind = "classic-control"

    def reset_to(self, env, state, seed):
        env.reset(seed=int(seed))
        env.unwrapped.state = np.asarray(state, dtype=np.float64).copy()
        return self.observe(env)

    def state_of(self, env):
        s = getattr(env.unwrapped, "state", None)
        return None if s is None else np.asarray(s, dtype=np.float64).ravel().copy()

    def observe(self, env):
        u = env.unwrapped
        for name in ("_get_obs", "_get_ob"):
            if callable(getattr(u, name, None)):
                return wrapped_obs(env, getattr(u, name)())
        dtype = getattr(u.observation_space, "dtype", np.float32)
        return wrapped_obs(env, np.array(u.state, dtype=dtype))  # CartPole, MountainCar: the state itself

    def auto_state(self, env, key):
        env.reset(seed=0)
        s = self.state_of(env)
        if s is None:
            raise ScenarioError(f"gym:{key}: setter classic-control needs env.unwrapped.state, which "
                                f"{type(env.unwrapped).__name__} does not have; choose another setter ({FIX})")
        names = tuple(f"s{i}" for i in range(s.size))
        return names, tuple(f"env.unwrapped.state[{i}]" for i in range(s.size)), None, None


class Mujoco(Setter):
    """``env.reset(seed)``, then ``env.unwrapped.set_state(qpos, qvel)``; the state is the ``qpos``
    coordinates not in ``fixed_qpos`` followed by every ``qvel`` coordinate."""

    kind = "mujoco"

    def __init__(self, fixed_qpos: dict | None = None):
        self.fixed = {int(k): float(v) for k, v in (fixed_qpos or {}).items()}

    def _keep(self, u) -> np.ndarray:
        return np.array([i for i in range(u.model.nq) if i not in self.fixed], dtype=np.int64)

    def reset_to(self, env, state, seed):
        env.reset(seed=int(seed))
        u = env.unwrapped
        keep = self._keep(u)
        state = np.asarray(state, dtype=np.float64)
        qpos = np.array(u.init_qpos, dtype=np.float64)
        for i, v in self.fixed.items():
            qpos[i] = v
        qpos[keep] = state[:keep.size]
        u.set_state(qpos, state[keep.size:].copy())
        return self.observe(env)

    def state_of(self, env):
        u = env.unwrapped
        return np.concatenate([u.data.qpos[self._keep(u)], u.data.qvel]).astype(np.float64)

    def observe(self, env):
        return wrapped_obs(env, env.unwrapped._get_obs())

    def auto_state(self, env, key):
        import mujoco

        u = env.unwrapped
        if not hasattr(u, "model") or not hasattr(u, "set_state"):
            raise ScenarioError(f"gym:{key}: setter mujoco needs a MujocoEnv (model, set_state); "
                                f"{type(u).__name__} is not one ({FIX})")
        m = u.model
        qnames, vnames = [""] * m.nq, [""] * m.nv
        sizes = {0: (7, 6), 1: (4, 3), 2: (1, 1), 3: (1, 1)}  # free, ball, slide, hinge: (qpos, qvel) sizes
        for j in range(m.njnt):
            name = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, j) or f"joint{j}"
            nq, nv = sizes[int(m.jnt_type[j])]
            for k in range(nq):
                qnames[m.jnt_qposadr[j] + k] = name if nq == 1 else f"{name}[{k}]"
            for k in range(nv):
                vnames[m.jnt_dofadr[j] + k] = f"v_{name}" if nv == 1 else f"v_{name}[{k}]"
        keep = self._keep(u)
        names = tuple(qnames[i] for i in keep) + tuple(vnames)
        meanings = tuple(f"qpos[{i}] ({qnames[i]})" for i in keep) + tuple(f"qvel[{i}] ({n})" for i, n in enumerate(vnames))
        scale = getattr(u, "_reset_noise_scale", None)
        if scale is None:
            return names, meanings, None, None
        center = np.concatenate([np.asarray(u.init_qpos, np.float64)[keep], np.asarray(u.init_qvel, np.float64)])
        return names, meanings, center - float(scale), center + float(scale)

    def describe(self):
        return f"mujoco (fixed qpos {self.fixed})" if self.fixed else "mujoco"


class ResetOptions(Setter):
    """``env.reset(seed=seed, options={key: state})``; ``as: dict`` passes ``{name: value}``."""

    kind = "reset-options"

    def __init__(self, key: str = "state", as_: str = "vector", names=(), integer=None):
        if as_ not in ("vector", "dict"):
            raise ScenarioError(f"setter reset-options: 'as' must be vector or dict, got {as_!r}")
        self.key, self.as_, self.names, self.integer = str(key), as_, tuple(names), integer

    def reset_to(self, env, state, seed):
        state = np.asarray(state, dtype=np.float64)
        if self.as_ == "dict":
            value = {n: (int(round(v)) if self.integer is not None and self.integer[i] else float(v))
                     for i, (n, v) in enumerate(zip(self.names, state))}
        else:
            value = state.copy()
        obs, _ = env.reset(seed=int(seed), options={self.key: value})
        return obs

    def describe(self):
        return f"reset-options ({self.key}, as {self.as_})"


class Function(Setter):
    """A user function ``reset_to(env, state, seed) -> observation`` (and optional ``state_of``,
    ``observe``), each given as ``module:name``."""

    kind = "function"

    def __init__(self, reset_to: str, state_of: str | None = None, observe: str | None = None, key: str = ""):
        self.target = str(reset_to)
        self._reset = import_target(reset_to, f"gym:{key}: setter")
        self._state_of = import_target(state_of, f"gym:{key}: setter state_of") if state_of else None
        self._observe = import_target(observe, f"gym:{key}: setter observe") if observe else None

    def reset_to(self, env, state, seed):
        return self._reset(env, np.asarray(state, dtype=np.float64).copy(), int(seed))

    def state_of(self, env):
        return None if self._state_of is None else np.asarray(self._state_of(env), dtype=np.float64).ravel()

    def observe(self, env):
        return None if self._observe is None else self._observe(env)

    def describe(self):
        return self.target


BUILTIN = ("classic-control", "mujoco", "reset-options")


def make_setter(spec_setter, key: str, names=(), integer=None) -> Setter:
    """The setter a spec names (see the module docstring)."""
    if spec_setter is None:
        raise ScenarioError(f"gym:{key}: the spec names no setter; give setter: one of {', '.join(BUILTIN)} "
                            f"or module:reset_to ({FIX})")
    if isinstance(spec_setter, str):
        spec_setter = {"kind": spec_setter} if spec_setter in BUILTIN else {"function": spec_setter}
    if not isinstance(spec_setter, dict):
        raise ScenarioError(f"gym:{key}: setter must be a name or a mapping, got {spec_setter!r} ({FIX})")
    opts = dict(spec_setter)
    kind = opts.pop("kind", None) or ("function" if "function" in opts else None)
    allowed = {"classic-control": set(), "mujoco": {"fixed_qpos"}, "reset-options": {"key", "as"},
               "function": {"function", "state_of", "observe"}}
    if kind not in allowed:
        raise ScenarioError(f"gym:{key}: unknown setter {kind!r}; choose one of {', '.join(BUILTIN)} or "
                            f"{{function: module:reset_to}} ({FIX})")
    extra = sorted(set(opts) - allowed[kind])
    if extra:
        raise ScenarioError(f"gym:{key}: setter {kind} has no option {extra[0]!r}; its options: "
                            f"{', '.join(sorted(allowed[kind])) or 'none'}")
    if kind == "classic-control":
        return ClassicControl()
    if kind == "mujoco":
        return Mujoco(opts.get("fixed_qpos"))
    if kind == "reset-options":
        return ResetOptions(opts.get("key", "state"), opts.get("as", "vector"), names, integer)
    return Function(opts["function"], opts.get("state_of"), opts.get("observe"), key)


def family_setter(env) -> str | None:
    """The built-in setter that fits ``env``'s family, if any (MuJoCo, then classic control)."""
    u = env.unwrapped
    if hasattr(u, "set_state") and hasattr(u, "model") and hasattr(u, "init_qpos"):
        return "mujoco"
    if type(u).__module__.startswith("gymnasium.envs.classic_control"):
        return "classic-control"
    return None
