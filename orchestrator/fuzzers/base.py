"""The fuzzer interface: propose initial states, observe what the AUT did from them.

A campaign runs a fuzzer in *generations*: ``proposal = fuzzer.propose(n)`` → the runner rolls the
AUT out from ``proposal.states`` (in-process or on Ray, in chunks with several in flight) →
``fuzzer.observe(proposal, feedback)``. ``n = 1`` is the serial algorithm of the papers; larger
``n`` runs n proposals of one generation in parallel (each chosen from the corpus as it stood at
the start of the generation).

Phases (Delta paper, Sec. 5 RQ1): the runner calls ``fuzzer.start_phase("sampling")`` and then
``fuzzer.start_phase("fuzzing")``. In the sampling phase a fuzzer builds its initial corpus
(typically from ``scenario.sample``); in the fuzzing phase it selects, mutates and keeps.
Every episode of both phases is an AUT trajectory recorded in the run's Parquet store (dataset D).

A fuzzer may propose auxiliary episodes (e.g. MDPFuzz's perturbed twin of a seed to measure
sensitivity): it tags them in ``Proposal.tags`` and pairs them up in ``observe``. They are AUT
trajectories like any other and count against the episode budget.

Determinism: a fuzzer draws randomness only from ``self.rng`` (and torch generators seeded from
it), so the same seed gives the same campaign; ``state_dict()`` / ``load_state_dict()`` capture
everything (corpus, models, optimizer state, RNG state) so that a resumed campaign continues
exactly as the uninterrupted one would.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np

from envs.base import Scenario


@dataclass
class Proposal:
    """One generation's initial states and per-state tags (parent ids, kinds, ...)."""

    states: np.ndarray  # (n, d) float64, valid for the scenario
    tags: dict[str, np.ndarray] = field(default_factory=dict)  # each (n,)

    def __len__(self) -> int:
        return int(self.states.shape[0])


@dataclass
class Feedback:
    """What the AUT did from each proposed state (episode order = proposal order).

    ``traj_obs[i]`` is the (T_i, obs_dim) float32 array of observations of episode i (the
    states the AUT visited, initial observation first, final observation last).
    """

    returns: np.ndarray  # (n,) float64
    lengths: np.ndarray  # (n,) int64
    terminated: np.ndarray  # (n,) bool
    failure: np.ndarray  # (n,) bool: the scenario's safety oracle
    traj_obs: list  # n arrays (T_i + 1, obs_dim)
    # optimality testing: the challenger from the same states (None in the safety phase)
    ca_returns: np.ndarray | None = None  # (n,) float64
    ca_traj_obs: list | None = None  # n arrays
    bug: np.ndarray | None = None  # (n,) bool: the optimality oracle's verdict

    @staticmethod
    def _trajectories(result) -> list:
        ends = np.cumsum(result.lengths)
        starts = ends - result.lengths
        return [np.concatenate([result.obs[a:b], result.final_obs[i:i + 1]], axis=0)
                for i, (a, b) in enumerate(zip(starts, ends))]

    @classmethod
    def from_result(cls, result) -> "Feedback":
        """Build from a :class:`workers.rollout.RolloutResult` of one role, one repeat."""
        return cls(returns=np.asarray(result.returns, np.float64), lengths=np.asarray(result.lengths),
                   terminated=np.asarray(result.terminated, bool), failure=np.asarray(result.failure, bool),
                   traj_obs=cls._trajectories(result))

    @classmethod
    def from_differential(cls, result, n: int, bug: np.ndarray | None = None) -> "Feedback":
        """Build from a run of roles ``aut`` and ``challenger`` from ``n`` states (any number of
        repeats): returns are means over the repeats, trajectories those of repeat 0; the AUT's
        fields are the usual ones, the challenger's go to ``ca_*``."""
        traj = cls._trajectories(result)
        idx = np.asarray(result.state_index) - (int(result.state_index.min()) if result.n_episodes else 0)

        def per_state(role):
            mine = np.asarray(result.role) == role
            counts = np.bincount(idx[mine], minlength=n)
            if counts.shape[0] != n or np.any(counts == 0):
                raise ValueError(f"differential feedback: role {role!r} lacks episodes for some of the {n} states")
            mean = np.bincount(idx[mine], weights=result.returns[mine], minlength=n) / counts
            first = np.flatnonzero(mine & (np.asarray(result.repeat) == 0))
            first = first[np.argsort(idx[first], kind="stable")]  # one per state, in proposal order
            return mean, first

        aut_mean, a0 = per_state("aut")
        ca_mean, c0 = per_state("challenger")
        return cls(returns=aut_mean, lengths=np.asarray(result.lengths)[a0],
                   terminated=np.asarray(result.terminated, bool)[a0], failure=np.asarray(result.failure, bool)[a0],
                   traj_obs=[traj[i] for i in a0], ca_returns=ca_mean, ca_traj_obs=[traj[i] for i in c0],
                   bug=None if bug is None else np.asarray(bug, bool))


class Fuzzer(abc.ABC):
    """Base class: holds the scenario, the RNG and the phase; subclasses implement the paper."""

    name: str = ""
    # capabilities, declared by each method (the campaign checks and the phases read these)
    needs_llm: bool = False  # asks an LLM for new states: the phase attaches an LLM pool
    needs_challenger: bool = False  # reads the challenger's episodes: optimality testing only
    # proposals per generation of an optimality phase whose campaign leaves generation_size unset
    default_generation_size: int = 64

    def stats(self) -> dict:
        """Per-generation counters a method reports beside the phase's own (e.g. LLM calls)."""
        return {}

    def __init__(self, scenario: Scenario, seed: int = 0, **params):
        if params:
            raise TypeError(f"{self.name or type(self).__name__}: unknown parameters {sorted(params)}")
        self.scenario = scenario
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.phase = "sampling"

    def start_phase(self, phase: str) -> None:
        if phase not in ("sampling", "fuzzing"):
            raise ValueError(f"unknown phase {phase!r}")
        self.phase = phase

    @abc.abstractmethod
    def propose(self, n: int) -> Proposal:
        """n initial states to run next."""

    @abc.abstractmethod
    def observe(self, proposal: Proposal, feedback: Feedback) -> None:
        """Learn from the AUT's episodes from ``proposal.states``."""

    def state_dict(self) -> dict:
        """Everything needed to continue identically (picklable)."""
        return {"rng": self.rng.bit_generator.state, "phase": self.phase}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.phase = state["phase"]
