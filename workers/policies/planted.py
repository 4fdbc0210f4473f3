"""Planted-defect agents (issue 51): ``planted:SPEC.yaml``, a good base agent that, from initial
states in chosen regions, fails or is needlessly bad, with the regions as data (the ground truth).

The spec (YAML; ``experiments/groundtruth/*.yaml``)::

    scenario: CartPole-v1            # the scenario the agent is for (must be deterministic)
    base: zoo:CartPole-v1            # any policy URI: the agent outside the regions
    regions:                         # first match wins; regions should not overlap
      - name: fail-centre
        kind: fail                   # fail: acts adversarially and fails; slow: a delay, no failure
        shape: box                   # box: low/high per named state dimension (others free)
        low: {theta: -0.01, theta_dot: -0.01}
        high: {theta: 0.01, theta_dot: 0.01}
        action: 0                    # what it does instead of the base's action ...
        steps: 500                   # ... for the first `steps` steps of the episode, then the base
      - name: fail-tail
        kind: fail
        shape: ball                  # ball: |(s - center) / half-width of the reset bounds| <= radius
        center: {x: 0.04, x_dot: 0.04, theta: -0.04, theta_dot: 0.04}
        radius: 0.3
        action: 0
        steps: 500

**How the agent knows the episode's initial state.** A policy only sees batches of observations.
The wrapper keeps, from its previous call, each row's observation, its action, and where that
row's episode stands (its region, its step); it predicts each row's next observation by
stepping the scenario's own simulator from the state the observation shows
(:func:`state_from_obs`). A row of the next call that matches (within ``tolerance``) the
prediction of a row of the previous call, in order (rollouts keep the order of live episodes
and only drop finished ones), continues that episode; a row that matches none starts a new
episode, whose observation is its initial state's, and the region is decided from it, once.
So the action at each step is a function of the episode's initial observation and the step
alone, whatever the batch, ``act`` or ``act_alone``, a replay one row at a time, or a
renderer stepping one observation at a time: verdicts replay. The ground truth of an initial
state is :meth:`PlantedSpec.region_of` of the observation the scenario's reset gives for it
(:func:`initial_observations`), exactly what the wrapper decides on.

Limits (documented in docs/ground-truth.md): deterministic scenarios only (a stochastic step
cannot be predicted; the wrapper refuses scenarios with wind); a new episode whose first
observation equals, within ``tolerance`` in every dimension, the predicted next observation of
an episode of the previous call continues it instead (for uniformly drawn CartPole starts, a
chance below 1e-15 per row); the wrapper's own prediction doubles the simulation cost.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workers.policies.base import Policy, PolicyError, _resolve_device

KINDS = ("fail", "slow")
_LOST = 1 << 40  # the step of a row the tracking lost: past every region's steps
SHAPES = ("box", "ball")


@dataclass
class Region:
    """One planted region of the initial-state space (state coordinates of the scenario)."""

    name: str
    kind: str
    shape: str
    low: np.ndarray  # box: per dimension (-inf/inf where free)
    high: np.ndarray
    center: np.ndarray | None  # ball
    scale: np.ndarray | None  # ball: half-width per dimension (0: the dimension is ignored)
    radius: float
    action: np.ndarray  # the planted action (a scalar for discrete scenarios)
    steps: int

    def contains(self, states: np.ndarray) -> np.ndarray:
        s = np.asarray(states, dtype=np.float64)
        if self.shape == "box":
            return np.all((s >= self.low) & (s <= self.high), axis=1)
        use = self.scale > 0
        z = (s[:, use] - self.center[use]) / self.scale[use]
        return np.sqrt(np.sum(z * z, axis=1)) <= self.radius

    def to_dict(self) -> dict:
        d = {"name": self.name, "kind": self.kind, "shape": self.shape, "steps": self.steps,
             "action": self.action.tolist()}
        if self.shape == "box":
            d.update(low=self.low.tolist(), high=self.high.tolist())
        else:
            d.update(center=self.center.tolist(), radius=self.radius)
        return d


@dataclass
class PlantedSpec:
    path: str
    text: str
    scenario_name: str
    base: str
    regions: list[Region]
    tolerance: float = 1e-5
    scenario: object = field(default=None, repr=False)

    def region_of(self, states: np.ndarray) -> np.ndarray:
        """Index of the first region holding each state (-1: none)."""
        s = np.asarray(states, dtype=np.float64).reshape(-1, len(self.scenario.state_names))
        out = np.full(s.shape[0], -1, dtype=np.int64)
        for i, r in enumerate(self.regions):
            out[(out < 0) & r.contains(s)] = i
        return out

    def region_of_initial(self, initial_states: np.ndarray) -> np.ndarray:
        """The region each episode started from ``initial_states`` is planted in, as the agent
        decides it: from the observation the scenario's reset gives (the ground truth)."""
        obs = initial_observations(self.scenario, initial_states)
        return self.region_of(state_from_obs(self.scenario, obs))


def _fail(path, msg: str) -> PolicyError:
    return PolicyError(f"{path}: {msg}")


def _named_vector(path, where: str, value, names: tuple, fill: float) -> np.ndarray:
    out = np.full(len(names), fill, dtype=np.float64)
    if not isinstance(value, dict):
        raise _fail(path, f"{where} must map state dimensions ({', '.join(names)}) to numbers")
    for k, v in value.items():
        if k not in names:
            raise _fail(path, f"{where}: unknown state dimension {k!r}; the scenario's are {', '.join(names)}")
        try:
            out[names.index(k)] = float(v)
        except (TypeError, ValueError) as e:
            raise _fail(path, f"{where}.{k} must be a number, got {v!r}") from e
    return out


def _region(path, i: int, raw, scenario) -> Region:
    where = f"regions[{i}]"
    if not isinstance(raw, dict):
        raise _fail(path, f"{where} must be a mapping (name, kind, shape, ...)")
    names = tuple(scenario.state_names)
    name = str(raw.get("name") or f"region-{i}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise _fail(path, f"{where} ({name}): kind must be one of {', '.join(KINDS)}, got {kind!r}")
    shape = raw.get("shape", "box")
    if shape not in SHAPES:
        raise _fail(path, f"{where} ({name}): shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    try:
        steps = int(raw.get("steps", scenario.max_steps))
    except (TypeError, ValueError) as e:
        raise _fail(path, f"{where} ({name}): steps must be an integer") from e
    if steps < 1:
        raise _fail(path, f"{where} ({name}): steps must be >= 1, got {steps}")
    if "action" not in raw:
        raise _fail(path, f"{where} ({name}): give the planted action (action: ...)")
    spec = scenario.action
    action = np.asarray(raw["action"], dtype=np.int64 if spec.discrete else np.float32)
    if spec.discrete and (action.ndim != 0 or not 0 <= int(action) < spec.n):
        raise _fail(path, f"{where} ({name}): action must be one integer in 0..{spec.n - 1}, got {raw['action']!r}")
    if not spec.discrete and action.shape != tuple(spec.shape):
        raise _fail(path, f"{where} ({name}): action must be a list of {int(np.prod(spec.shape))} numbers")
    low = high = center = scale = None
    radius = 0.0
    d = len(names)
    if shape == "box":
        if "low" not in raw and "high" not in raw:
            raise _fail(path, f"{where} ({name}): a box needs low and/or high")
        low = _named_vector(path, f"{where}.low", raw.get("low", {}), names, -np.inf)
        high = _named_vector(path, f"{where}.high", raw.get("high", {}), names, np.inf)
        if np.any(low > high):
            raise _fail(path, f"{where} ({name}): low > high")
    else:
        if "center" not in raw or "radius" not in raw:
            raise _fail(path, f"{where} ({name}): a ball needs center (every dimension) and radius")
        center = _named_vector(path, f"{where}.center", raw["center"], names, np.nan)
        if np.isnan(center).any():
            raise _fail(path, f"{where} ({name}): center must give every dimension ({', '.join(names)})")
        scale = (np.asarray(scenario.high, dtype=np.float64) - np.asarray(scenario.low, dtype=np.float64)) / 2
        radius = float(raw["radius"])
        low, high = np.full(d, -np.inf), np.full(d, np.inf)
    return Region(name=name, kind=kind, shape=shape, low=low, high=high, center=center, scale=scale,
                  radius=radius, action=action, steps=steps)


def resolve_spec_path(target: str) -> Path:
    """The spec file: as given (relative to the working directory), else relative to the
    checkout/package (so ``planted:experiments/groundtruth/cartpole.yaml`` works from anywhere)."""
    p = Path(os.path.expanduser(target))
    if p.is_file():
        return p.resolve()
    from workers.resources import CHECKOUT, data_root

    for root in (CHECKOUT, data_root().parent):
        q = root / target
        if q.is_file():
            return q.resolve()
    raise PolicyError(f"planted agent spec not found: {target} (give a path to a YAML spec, e.g. "
                      "planted:experiments/groundtruth/cartpole.yaml)")


def load_spec(target: str) -> PlantedSpec:
    """Read and check a spec; one clear message naming the fix when it is wrong."""
    import yaml

    path = resolve_spec_path(target)
    text = path.read_text(encoding="utf-8")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _fail(path, f"not valid YAML ({str(e).splitlines()[0]})") from e
    if not isinstance(raw, dict):
        raise _fail(path, "a planted agent spec is a mapping with scenario, base and regions")
    for key in ("scenario", "base", "regions"):
        if key not in raw:
            raise _fail(path, f"missing {key!r} (a spec names its scenario, its base policy URI and its regions)")
    from envs import get_scenario

    try:
        scenario = get_scenario(str(raw["scenario"]))
    except Exception as e:  # noqa: BLE001 - an unknown scenario: one message
        raise _fail(path, f"unknown scenario {raw['scenario']!r} ({type(e).__name__}: {e})") from e
    _check_supported(path, scenario)
    if not isinstance(raw["regions"], list) or not raw["regions"]:
        raise _fail(path, "regions must be a non-empty list")
    regions = [_region(path, i, r, scenario) for i, r in enumerate(raw["regions"])]
    names = [r.name for r in regions]
    if len(set(names)) != len(names):
        raise _fail(path, f"region names must be unique, got {names}")
    tol = float(raw.get("tolerance", 1e-5))
    return PlantedSpec(path=str(path), text=text, scenario_name=scenario.name, base=str(raw["base"]),
                       regions=regions, tolerance=tol, scenario=scenario)


# ---------------------------------------------------------------------------------------------
# observations <-> states
# ---------------------------------------------------------------------------------------------
def _family(scenario) -> str:
    cls = {c.__name__ for c in type(scenario).__mro__}
    for fam in ("CartPole", "MountainCar", "Acrobot", "_PlanarWalker"):
        if fam in cls:
            return fam
    return ""


def _check_supported(path, scenario) -> None:
    if not _family(scenario):
        raise _fail(path, f"planted agents support CartPole, MountainCar, Acrobot and the MuJoCo walkers "
                          f"(Hopper, Walker2d), not {scenario.name}")
    if getattr(scenario, "wind", None) is not None or "Noise" in scenario.name:
        raise _fail(path, f"{scenario.name} is stochastic: a planted agent needs a deterministic scenario "
                          "(it predicts each episode's next observation to follow it); use Hopper-v5")


def state_from_obs(scenario, obs: np.ndarray) -> np.ndarray:
    """The state an observation shows (float64). CartPole, MountainCar: the observation;
    Acrobot: the angles from their cosines and sines; the walkers: qpos[1:] and qvel (rootx,
    which the dynamics do not depend on, is 0; velocities beyond the observation's clip of 10
    are not recovered)."""
    o = np.asarray(obs, dtype=np.float64)
    if _family(scenario) == "Acrobot":
        return np.stack([np.arctan2(o[:, 1], o[:, 0]), np.arctan2(o[:, 3], o[:, 2]), o[:, 4], o[:, 5]], axis=1)
    return o.copy()


def initial_observations(scenario, states: np.ndarray) -> np.ndarray:
    """The float32 observations a rollout's policy sees at step 0 from ``states``."""
    states = scenario.validate(states)
    sim = scenario.simulator(max(states.shape[0], 1))
    return np.asarray(sim.reset_to(states), dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------------------------
class PlantedPolicy(Policy):
    format = "planted"

    def __init__(self, uri: str, target: str, scenario=None, device: str | None = None, *, load_policy):
        """``load_policy``: how the base URI is loaded (workers.policies.load passes its own)."""
        spec = load_spec(target)
        if scenario is not None and getattr(scenario, "name", spec.scenario_name) != spec.scenario_name:
            raise PolicyError(f"{spec.path}: this planted agent is for {spec.scenario_name}, not "
                              f"{scenario.name}; use a spec whose scenario is {scenario.name}")
        dev = _resolve_device(device)
        self.spec = spec
        self.base = load_policy(spec.base, spec.scenario, device=dev)
        sha = hashlib.sha256(spec.text.encode("utf-8") + (self.base.sha256 or "").encode()).hexdigest()
        super().__init__(uri, path=spec.path, device=dev, obs_dim=spec.scenario.obs_dim,
                         action=spec.scenario.action, sha256=sha)
        self.model_obs_dim = spec.scenario.obs_dim
        self.model_action = spec.scenario.action
        self._lock = threading.Lock()
        self._prev = None  # (predicted next obs (m, d), region (m,), step (m,)) of the last call
        self._sim = None  # the simulator of the predictions (grown to the largest call)
        self.trace = None  # when a list: (region, step) per row of every call, for tests

    # a planted agent is never rowwise: act_alone asks the base for its per-row actions
    def per_row_loop(self) -> None:
        self.base.per_row_loop()

    def info(self) -> dict:
        d = super().info()
        d.update(base=self.base.info(), spec=self.spec.path, regions=[r.to_dict() for r in self.spec.regions])
        return d

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self._planted(obs, alone=False)

    def act_alone(self, obs: np.ndarray) -> np.ndarray:
        return self._planted(obs, alone=True)

    # -- the episode tracking ---------------------------------------------------------------
    def _planted(self, obs: np.ndarray, alone: bool) -> np.ndarray:
        obs = self._prepare(obs)
        n = obs.shape[0]
        if n == 0:
            return self._empty()
        base = self.base.act_alone(obs) if alone and n > 1 else self.base.act(obs)
        base = np.asarray(base)
        with self._lock:
            region, step = self._follow(obs)
            actions = base.copy()
            for i, r in enumerate(self.spec.regions):
                rows = (region == i) & (step < r.steps)
                if rows.any():
                    actions[rows] = r.action
            if self.trace is not None:
                self.trace.append((region.copy(), step.copy()))
            self._prev = (self._predict(obs, actions), region, step + 1)
        return actions

    def _follow(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's (region, step): continued from the previous call's row whose predicted
        observation it matches (in order), else a new episode decided from this observation."""
        n = obs.shape[0]
        region = np.full(n, -2, dtype=np.int64)  # -2: not matched yet
        step = np.zeros(n, dtype=np.int64)
        if self._prev is not None:
            pred, pregion, pstep = self._prev
            tol = self.spec.tolerance
            close = np.all(np.abs(obs[:, None, :].astype(np.float64) - pred[None, :, :])
                           <= tol * (1.0 + np.abs(pred[None, :, :])), axis=2)  # (n, m)
            j = 0
            for i in range(n):
                hits = np.flatnonzero(close[i, j:])
                if hits.size:
                    k = j + int(hits[0])
                    region[i], step[i] = pregion[k], pstep[k]
                    j = k + 1
        new = region == -2
        if new.any():
            sc = self.spec.scenario
            states = state_from_obs(sc, obs[new])
            # an episode starts inside the reset bounds (float32 observations: a small margin);
            # a row that is neither a continuation nor a possible start is one the prediction
            # lost (see the module docstring): the base acts for it
            margin = 1e-6 * (1.0 + np.abs(np.asarray(sc.high, dtype=np.float64)))
            start = np.all((states >= sc.low - margin) & (states <= sc.high + margin), axis=1)
            region[new] = np.where(start, self.spec.region_of(states), -1)
            step[new] = np.where(start, 0, _LOST)
        return region, step

    def _predict(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """The next observation of each row, stepping the scenario's simulator from the state
        the observation shows (bounds not checked: these are states of running episodes)."""
        n = obs.shape[0]
        sim = self._sim
        if sim is None or sim.batch_size < n:
            sim = self._sim = self.spec.scenario.simulator(n)
        states = state_from_obs(self.spec.scenario, obs)
        sim.n = n
        sim.t = np.zeros(n, dtype=np.int64)
        sim.done = np.zeros(n, dtype=bool)
        sim._reset(states, np.zeros(n, dtype=np.int64))
        out = sim.step(actions)
        return np.asarray(out.obs[:n], dtype=np.float32).astype(np.float64)
