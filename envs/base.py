"""The scenario interface: an environment seen as a space of initial states.

A :class:`Scenario` knows

* the initial-state vector (names, meaning, bounds of the valid initial-state region),
* how to sample it from the environment's own reset distribution,
* how to mutate it (small per-dimension perturbation kept inside the region),
* how to validate it (finite, inside the bounds),
* how to put a simulator into that state (:meth:`Scenario.simulator` returns a batched
  simulator; :meth:`Scenario.reference_env` / :meth:`Scenario.reference_reset_to` do the
  same with the reference gymnasium environment, used by the conformance tests),
* the safety oracle of the Delta paper (:meth:`Scenario.is_failure`),
* the grid used to count distinct bugs (:meth:`Scenario.grid_cells`).

Nothing here imports Ray.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np


class ScenarioError(ValueError):
    """Bad input for a scenario: unknown name, invalid initial state, mismatched shapes."""


class InvalidStateError(ScenarioError):
    """An initial state that is NaN/inf, has the wrong shape, or lies outside the bounds."""


@dataclass(frozen=True)
class ActionSpec:
    """What a policy must return for this scenario."""

    kind: str  # "discrete" or "continuous"
    n: int = 0  # number of discrete actions
    shape: tuple[int, ...] = ()  # continuous action shape
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"

    @property
    def size(self) -> int:
        """d3rlpy's ``action_size``: number of actions (discrete) or action dimension."""
        return self.n if self.discrete else int(np.prod(self.shape))

    def describe(self) -> str:
        if self.discrete:
            return f"Discrete({self.n})"
        return f"Box{self.shape} in [{float(np.min(self.low)):g}, {float(np.max(self.high)):g}]"


@dataclass
class StepBatch:
    """What a batched simulator returns from one lockstep step (arrays of length B).

    Entries of episodes that were already done before the step are zero/False and must be
    ignored by the caller (``BatchSimulator.done`` tells which ones are live).
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


class BatchSimulator(abc.ABC):
    """B episodes in lockstep. The one place that knows the environment's internals.

    ``reset_to(states)`` puts episode i into initial state ``states[i]`` and returns the first
    observations. ``step(actions)`` advances every live episode by one environment step with
    ``actions[i]`` (entries of finished episodes are ignored) and returns a :class:`StepBatch`.
    An episode is done once it terminated or reached ``max_steps`` (truncation).
    """

    def __init__(self, scenario: "Scenario", batch_size: int):
        self.scenario = scenario
        self.batch_size = int(batch_size)
        self.max_steps = scenario.max_steps
        self.t = np.zeros(self.batch_size, dtype=np.int64)
        self.done = np.ones(self.batch_size, dtype=bool)
        self.n = 0  # number of episodes in the current batch (<= batch_size)

    def reset_to(self, states: np.ndarray, seeds: np.ndarray | None = None) -> np.ndarray:
        states = self.scenario.validate(states)
        n = states.shape[0]
        if n > self.batch_size:
            raise ScenarioError(f"{n} initial states for a simulator of batch size {self.batch_size}")
        if seeds is None:
            seeds = np.zeros(n, dtype=np.int64)
        self.n = n
        self.t = np.zeros(n, dtype=np.int64)
        self.done = np.zeros(n, dtype=bool)
        return self._reset(states, np.asarray(seeds, dtype=np.int64))

    def step(self, actions: np.ndarray) -> StepBatch:
        live = np.flatnonzero(~self.done)
        out = self._step(actions, live)
        self.t[live] += 1
        out.terminated[self.done] = False
        out.truncated[:] = False
        out.truncated[live] = (self.t[live] >= self.max_steps) & ~out.terminated[live]
        self.done |= out.terminated | out.truncated
        return out

    @abc.abstractmethod
    def _reset(self, states: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        """Set the n episodes to ``states``; return observations (n, obs_dim)."""

    @abc.abstractmethod
    def _step(self, actions: np.ndarray, live: np.ndarray) -> StepBatch:
        """Advance the episodes with indices ``live``; return arrays of length n."""


def grid_index(x: np.ndarray, low: np.ndarray, high: np.ndarray, intervals: int) -> np.ndarray:
    """Part index per value: each dimension of [low, high] cut into ``intervals`` equal parts
    (values on the upper edge go to the last part; a dimension with low == high is one part)."""
    width = np.where(high > low, high - low, 1.0)
    idx = np.floor((x - low) / width * intervals).astype(np.int64)
    return np.clip(idx, 0, intervals - 1)


def count_distinct_rows(cells: np.ndarray) -> int:
    """Number of distinct rows (grid cells) in ``cells``."""
    return 0 if len(cells) == 0 else int(np.unique(cells, axis=0).shape[0])


@dataclass
class Scenario(abc.ABC):
    """An environment seen as a space of initial states (see the module docstring)."""

    name: str = ""
    env_id: str = ""  # the reference gymnasium id
    state_names: tuple[str, ...] = ()
    state_meaning: tuple[str, ...] = ()
    low: np.ndarray = field(default_factory=lambda: np.zeros(0))  # bounds of the initial-state region
    high: np.ndarray = field(default_factory=lambda: np.zeros(0))
    obs_dim: int = 0
    action: ActionSpec = field(default_factory=lambda: ActionSpec("discrete", 2))
    max_steps: int = 0
    grid_intervals: int = 5  # per initial-state dimension, for distinct-bug counting
    mutation_scale: float = 0.05  # std of the mutation as a fraction of (high - low)
    failure_rule: str = ""
    stochastic: bool = False  # needs repeats + a statistical oracle
    integer_states: bool = False  # every initial-state value is an integer (e.g. BipedalWalker's obstacle kinds)
    # what ``inference: auto`` (the default) picks, and why (docs/verdicts.md): "alone" where a
    # simulator step costs many times a policy row, so acting alone costs little and nothing is re-run
    inference_default: str = "batched"
    inference_why: str = ("a simulator step costs about as much as a policy call: the search acts in batches and "
                          "re-runs its candidates alone")
    version: str = "1"  # bumped when dynamics, bounds or oracle change (bugs store it)

    # -- the initial-state space -------------------------------------------------------------
    @property
    def state_dim(self) -> int:
        return len(self.state_names)

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n initial states from the environment's own reset distribution, shape (n, d)."""

    def sample_uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n initial states uniform over the bounds (what fuzzers use to seed a corpus)."""
        return rng.uniform(self.low, self.high, size=(n, self.state_dim))

    def mutate(self, states: np.ndarray, rng: np.random.Generator, scale: float | None = None) -> np.ndarray:
        """Add a small Gaussian perturbation per dimension (std = scale × width), then clip.

        ``scale`` defaults to :attr:`mutation_scale`. The result stays inside the bounds, hence
        valid. Dimensions with zero width (fixed by the environment) stay fixed.
        """
        states = self.validate(states)
        scale = self.mutation_scale if scale is None else float(scale)
        if not np.isfinite(scale) or scale < 0:
            raise ScenarioError(f"mutation scale must be a finite number >= 0, got {scale!r}")
        width = self.high - self.low
        noisy = states + rng.normal(size=states.shape) * (scale * width)
        return np.clip(noisy, self.low, self.high)

    def project(self, states: np.ndarray) -> np.ndarray:
        """The nearest valid initial states to arbitrary vectors (what a generator such as GMT's
        diffusion model produces): clipped into the bounds here; scenarios with integer or
        otherwise constrained states override it (e.g. rounding to obstacle kinds)."""
        return np.clip(np.asarray(states, dtype=np.float64), self.low, self.high)

    def validate(self, states: np.ndarray, *, atol: float = 1e-9) -> np.ndarray:
        """Return ``states`` as float64 (n, d) or raise :class:`InvalidStateError` saying why."""
        arr = np.asarray(states, dtype=np.float64)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.state_dim:
            raise InvalidStateError(
                f"{self.name}: an initial state has {self.state_dim} values "
                f"({', '.join(self.state_names)}); got an array of shape {np.shape(states)}"
            )
        bad = ~np.isfinite(arr)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise InvalidStateError(
                f"{self.name}: initial state #{i} has a non-finite value ({arr[i, j]}) for "
                f"'{self.state_names[j]}'; every value must be a finite number"
            )
        out = (arr < self.low - atol) | (arr > self.high + atol)
        if out.any():
            i, j = np.argwhere(out)[0]
            raise InvalidStateError(
                f"{self.name}: initial state #{i} has '{self.state_names[j]}' = {arr[i, j]:.6g}, "
                f"outside the valid initial-state region [{self.low[j]:.6g}, {self.high[j]:.6g}]; "
                f"see `deltarl scenarios` for the bounds"
            )
        return np.clip(arr, self.low, self.high)

    # -- simulation --------------------------------------------------------------------------
    @abc.abstractmethod
    def simulator(self, batch_size: int) -> BatchSimulator:
        """A batched simulator for up to ``batch_size`` episodes in lockstep."""

    def reference_env(self, **kwargs):
        """The reference gymnasium environment (unwrapped of the time limit: we count steps)."""
        import gymnasium as gym

        return gym.make(self.env_id, **kwargs)

    @abc.abstractmethod
    def reference_reset_to(self, env, state: np.ndarray, seed: int = 0) -> np.ndarray:
        """Reset the reference env and put it into ``state``; return the first observation."""

    # -- oracles and metrics -----------------------------------------------------------------
    @abc.abstractmethod
    def is_failure(self, returns: np.ndarray, lengths: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        """The Delta paper's safety oracle, per episode."""

    def grid_cells(self, states: np.ndarray, intervals: int | None = None) -> np.ndarray:
        """Grid cell index per state: each dimension cut into ``intervals`` equal parts of the
        bounds (values on the upper edge go to the last part). Returns (n, d) int64 indices."""
        k = self.grid_intervals if intervals is None else int(intervals)
        return grid_index(np.asarray(states, dtype=np.float64).reshape(-1, self.state_dim), self.low, self.high, k)

    def count_distinct(self, states: np.ndarray, intervals: int | None = None) -> int:
        """Number of distinct grid cells holding at least one of ``states``."""
        return count_distinct_rows(self.grid_cells(states, intervals)) if len(states) else 0

    def diversity_bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Fixed (low, high) per observation dimension for LLMTester's Table II counts of
        distinct failure states (:mod:`orchestrator.analysis.diversity`), the same grid for every
        method and run; None (the default): each run's grid is fitted to its own failures."""
        return None

    def describe(self) -> dict:
        return {
            "name": self.name,
            "env_id": self.env_id,
            "state": [
                {"name": n, "meaning": m, "low": float(lo), "high": float(hi)}
                for n, m, lo, hi in zip(self.state_names, self.state_meaning, self.low, self.high)
            ],
            "obs_dim": self.obs_dim,
            "action": self.action.describe(),
            "max_steps": self.max_steps,
            "failure": self.failure_rule,
            "grid_intervals": self.grid_intervals,
            "stochastic": self.stochastic,
            "version": self.version,
        }
