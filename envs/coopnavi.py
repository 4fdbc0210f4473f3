"""CoopNavi: MPE's ``simple_spread`` (3 agents cover 3 landmarks), one centralised controller.

The setting of MDPFuzz / CureFuzz / LLMTester (see ``docs/scenarios.md``, section CoopNavi).

Physics (OpenAI's multiagent-particle-envs, ``simple_spread``): 3 agents (discs of radius
``AGENT_SIZE`` = 0.15, mass 1, movable, colliding) and 3 landmarks (fixed, not colliding) in the
plane. One step (dt = 0.1):

1. control force per agent ``u_i = 5 · clip(a_i, −1, 1)`` (MPE's continuous action with
   sensitivity 5; MPE's 5-vector ``[noop, left, right, down, up]`` gives ``u_x = right − left``,
   here the policy outputs ``u_x`` and ``u_y`` directly);
2. contact force for every agent pair (a, b), a < b, in that order:
   ``f = 100 · δ / ‖δ‖ · logaddexp(0, −(‖δ‖ − 0.3) / 1e-3) · 1e-3`` with ``δ = p_a − p_b``,
   added to a, subtracted from b (contact force 1e2, contact margin 1e-3);
3. integration, ``integrator = "openai"`` (default, the original MPE the peers' MADDPG agents ran
   in): ``v ← 0.75 v; v ← v + (f / m) dt; p ← p + v dt``. ``integrator = "mpe2"`` is the order of
   PettingZoo's MPE / ``mpe2``: ``p ← p + v dt; v ← 0.75 v; v ← v + (f / m) dt``.

Observation (float32, 42 = 3 × 14): for agent i = 0, 1, 2 in turn, MPE's observation of agent i
without its communication part (``silent`` agents: always zeros): own velocity (2), own position
(2), landmark j − own position for j = 0, 1, 2 (6), agent j − own position for the other agents
j in increasing order (4).

Reward (shared, after the step): ``−Σ_landmarks min_agents ‖p_agent − p_landmark‖ − (number of
agent pairs closer than 0.3)``, i.e. MPE's global reward with −1 per colliding pair.

Episode and failure oracle: every episode runs 25 steps (MPE's ``max_episode_len``). At the last
step it *terminates* (``terminated = True``) iff it failed, else it is truncated. Failed =
(a) more than 5 collisions, counted as in MDPFuzz: per step, the number of agent pairs closer
than 0.3, summed over the episode; or (b) after the last step some landmark has no agent within
``COVER_RADIUS`` = 0.1 (MPE's "occupied landmark" threshold, ``mpe2``'s capture radius). So
``is_failure = terminated``. No early termination: it would cut the negative per-step rewards
short and make crashing attractive to the agent being trained.

Initial state (12 values in [−1, 1]): x, y of agents 0..2 then of landmarks 0..2; velocities start
at 0. Valid (the peers' check): agents at least 1.1 · (0.15 + 0.15) = 0.33 apart, landmarks at
least 0.15 apart. ``validate`` rejects the others with a message; ``sample`` (MPE's reset:
uniform positions in [−1, 1]², rejection-sampled) and ``mutate`` produce only valid states.

:class:`CoopNaviEnv` is the single-episode reference (MPE's per-entity loops on numpy 2-vectors),
registered with gymnasium as ``deltarl/CoopNavi-v0``; ``_CoopNaviSim`` the batched simulator.
Both do the same float64 operations in the same order, so they agree bit for bit; the tests
check :class:`CoopNaviEnv` against ``mpe2``'s ``simple_spread_v3``.
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

ENV_ID = "deltarl/CoopNavi-v0"
N_AGENTS = 3
N_LANDMARKS = 3
AGENT_SIZE = 0.15
MASS = 1.0
DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 1e2
CONTACT_MARGIN = 1e-3
SENSITIVITY = 5.0  # MPE's default acceleration for a continuous action of 1
MAX_STEPS = 25
AGENT_MIN_SEP = 1.1 * (AGENT_SIZE + AGENT_SIZE)  # validity: 0.33
LANDMARK_MIN_SEP = 0.15  # validity
COVER_RADIUS = 0.1
MAX_COLLISIONS = 5
INTEGRATORS = ("openai", "mpe2")
PAIRS = ((0, 1), (0, 2), (1, 2))  # MPE's entity-pair loop order (landmarks do not collide)
OBS_PER_AGENT = 14


def _check_integrator(integrator: str) -> str:
    if integrator not in INTEGRATORS:
        raise ScenarioError(f"CoopNavi integrator must be one of {', '.join(INTEGRATORS)}, got {integrator!r}")
    return integrator


def validity_violations(states: np.ndarray) -> list[str | None]:
    """Per state (rows of 12 values): None when valid, else why not (the first violated rule)."""
    s = np.asarray(states, dtype=np.float64).reshape(-1, 2 * (N_AGENTS + N_LANDMARKS))
    pos = s.reshape(-1, N_AGENTS + N_LANDMARKS, 2)
    out: list[str | None] = [None] * len(s)
    checks = [("agents", 0, AGENT_MIN_SEP, "1.1 × the sum of their radii 0.15 + 0.15, so that they do not start "
                                             "overlapping or in contact")]
    checks.append(("landmarks", N_AGENTS, LANDMARK_MIN_SEP, "so that they are distinct targets"))
    for what, off, min_sep, why in checks:
        for a, b in PAIRS:
            d = np.sqrt(np.sum(np.square(pos[:, off + a] - pos[:, off + b]), axis=1))
            for i in np.flatnonzero(d < min_sep):
                if out[i] is None:
                    out[i] = (f"{what[:-1]}s {a} and {b} are {d[i]:.4g} apart; {what} must be at least "
                              f"{min_sep:.4g} apart ({why})")
    return out


def is_valid(states: np.ndarray) -> np.ndarray:
    """Boolean mask: which states satisfy the peers' validity constraints (bounds not checked)."""
    s = np.asarray(states, dtype=np.float64).reshape(-1, 2 * (N_AGENTS + N_LANDMARKS))
    pos = s.reshape(-1, N_AGENTS + N_LANDMARKS, 2)
    ok = np.ones(len(s), dtype=bool)
    for off, min_sep in ((0, AGENT_MIN_SEP), (N_AGENTS, LANDMARK_MIN_SEP)):
        for a, b in PAIRS:
            ok &= np.sqrt(np.sum(np.square(pos[:, off + a] - pos[:, off + b]), axis=1)) >= min_sep
    return ok


# ---------------------------------------------------------------------------------------------
# the reference environment: MPE's per-entity loops
# ---------------------------------------------------------------------------------------------


class CoopNaviEnv(gym.Env):
    """One CoopNavi episode (see the module docstring). ``reset(options={"state": s})`` starts it
    in initial state ``s`` (12 positions, velocities 0); without it a valid state is drawn from
    the reset distribution with the reset seed. ``info`` reports this step's colliding pairs, the
    episode's collision count and the number of covered landmarks."""

    metadata = {"render_modes": []}

    def __init__(self, integrator: str = "openai", max_steps: int = MAX_STEPS, cover_radius: float = COVER_RADIUS,
                 max_collisions: int = MAX_COLLISIONS):
        self.integrator = _check_integrator(integrator)
        self.max_steps = int(max_steps)
        self.cover_radius = float(cover_radius)
        self.max_collisions = int(max_collisions)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(N_AGENTS * OBS_PER_AGENT,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2 * N_AGENTS,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options and "state" in options:
            state = np.asarray(options["state"], dtype=np.float64).reshape(-1)
            if state.shape != (12,) or not np.all(np.isfinite(state)):
                raise ValueError(f"a CoopNavi state is 12 finite numbers (agents' then landmarks' x, y), got {state}")
        else:
            state = CoopNavi().sample(self.np_random, 1)[0]
        self.agent_pos = [state[2 * i: 2 * i + 2].copy() for i in range(N_AGENTS)]
        self.agent_vel = [np.zeros(2) for _ in range(N_AGENTS)]
        self.landmark_pos = [state[6 + 2 * j: 8 + 2 * j].copy() for j in range(N_LANDMARKS)]
        self.t = 0
        self.collisions = 0
        return self._obs(), {}

    def _obs(self):
        parts = []
        for i in range(N_AGENTS):
            p = self.agent_pos[i]
            parts += [self.agent_vel[i], p]
            parts += [lm - p for lm in self.landmark_pos]
            parts += [self.agent_pos[j] - p for j in range(N_AGENTS) if j != i]
        return np.concatenate(parts).astype(np.float32)

    @staticmethod
    def _dist(p, q):
        return np.sqrt(np.sum(np.square(p - q)))

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
        if a.shape != (2 * N_AGENTS,):
            raise ValueError(f"a CoopNavi action is 6 numbers (force x, y per agent), got shape {np.shape(action)}")
        # control forces, then contact forces pair by pair (MPE's apply_action/environment_force)
        force = [a[2 * i: 2 * i + 2] * SENSITIVITY for i in range(N_AGENTS)]
        for i, j in PAIRS:
            delta = self.agent_pos[i] - self.agent_pos[j]
            dist = self._dist(self.agent_pos[i], self.agent_pos[j])
            dist_min = AGENT_SIZE + AGENT_SIZE
            penetration = np.logaddexp(0, -(dist - dist_min) / CONTACT_MARGIN) * CONTACT_MARGIN
            f = CONTACT_FORCE * delta / dist * penetration
            force[i] = f + force[i]
            force[j] = -f + force[j]
        for i in range(N_AGENTS):
            if self.integrator == "openai":
                self.agent_vel[i] = self.agent_vel[i] * (1 - DAMPING)
                self.agent_vel[i] = self.agent_vel[i] + (force[i] / MASS) * DT
                self.agent_pos[i] = self.agent_pos[i] + self.agent_vel[i] * DT
            else:
                self.agent_pos[i] = self.agent_pos[i] + self.agent_vel[i] * DT
                self.agent_vel[i] = self.agent_vel[i] * (1 - DAMPING)
                self.agent_vel[i] = self.agent_vel[i] + (force[i] / MASS) * DT
        self.t += 1
        # reward: MPE's global reward, then -1 per colliding pair
        reward = 0.0
        covered = 0
        for lm in self.landmark_pos:
            m = min(self._dist(p, lm) for p in self.agent_pos)
            reward -= m
            covered += int(m < self.cover_radius)
        hits = sum(int(self._dist(self.agent_pos[i], self.agent_pos[j]) < AGENT_SIZE + AGENT_SIZE) for i, j in PAIRS)
        reward = float(reward) - hits
        self.collisions += hits
        last = self.t >= self.max_steps
        failed = last and (self.collisions > self.max_collisions or covered < N_LANDMARKS)
        info = {"collisions": hits, "collisions_total": self.collisions, "covered": covered}
        return self._obs(), reward, bool(failed), bool(last and not failed), info


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="envs.coopnavi:CoopNaviEnv")


# ---------------------------------------------------------------------------------------------
# the batched simulator
# ---------------------------------------------------------------------------------------------


class _CoopNaviSim(BatchSimulator):
    """B episodes in lockstep: positions/velocities (n, 3, 2), landmarks (n, 3, 2)."""

    def _reset(self, states, seeds):
        n = len(states)
        self.pos = states[:, : 2 * N_AGENTS].reshape(n, N_AGENTS, 2).copy()
        self.vel = np.zeros((n, N_AGENTS, 2))
        self.lm = states[:, 2 * N_AGENTS:].reshape(n, N_LANDMARKS, 2).copy()
        self.collisions = np.zeros(n, dtype=np.int64)  # per episode, so far
        self.covered = np.zeros(n, dtype=np.int64)  # landmarks covered after the last step
        return self._obs(np.arange(n))

    def _obs(self, idx):
        pos, vel, lm = self.pos[idx], self.vel[idx], self.lm[idx]
        blocks = []
        for i in range(N_AGENTS):
            p = pos[:, i]
            blocks += [vel[:, i], p]
            blocks += [lm[:, j] - p for j in range(N_LANDMARKS)]
            blocks += [pos[:, j] - p for j in range(N_AGENTS) if j != i]
        return np.concatenate(blocks, axis=1).astype(np.float32)

    def _step(self, actions, live):
        sc = self.scenario
        n = self.n
        a = np.asarray(actions, dtype=np.float64)
        if a.shape != (n, 2 * N_AGENTS):
            raise ScenarioError(f"{sc.name}: actions have shape ({n}, 6) (force x, y per agent), got {np.shape(actions)}")
        a = np.clip(a[live], -1.0, 1.0).reshape(-1, N_AGENTS, 2)
        pos, vel = self.pos[live], self.vel[live]
        force = [a[:, i] * SENSITIVITY for i in range(N_AGENTS)]
        for i, j in PAIRS:
            delta = pos[:, i] - pos[:, j]
            dist = np.sqrt(np.sum(np.square(delta), axis=1))[:, None]
            dist_min = AGENT_SIZE + AGENT_SIZE
            penetration = np.logaddexp(0, -(dist - dist_min) / CONTACT_MARGIN) * CONTACT_MARGIN
            f = CONTACT_FORCE * delta / dist * penetration
            force[i] = f + force[i]
            force[j] = -f + force[j]
        force = np.stack(force, axis=1)
        if sc.integrator == "openai":
            vel = vel * (1 - DAMPING)
            vel = vel + (force / MASS) * DT
            pos = pos + vel * DT
        else:
            pos = pos + vel * DT
            vel = vel * (1 - DAMPING)
            vel = vel + (force / MASS) * DT
        self.pos[live], self.vel[live] = pos, vel
        lm = self.lm[live]
        d = np.sqrt(np.sum(np.square(pos[:, None, :, :] - lm[:, :, None, :]), axis=3))  # (m, landmark, agent)
        m = d.min(axis=2)
        reward = np.zeros(len(live))
        for j in range(N_LANDMARKS):
            reward = reward - m[:, j]
        hits = np.zeros(len(live), dtype=np.int64)
        for i, j in PAIRS:
            hits += np.sqrt(np.sum(np.square(pos[:, i] - pos[:, j]), axis=1)) < AGENT_SIZE + AGENT_SIZE
        self.collisions[live] += hits
        covered = (m < sc.cover_radius).sum(axis=1)
        self.covered[live] = covered
        last = self.t[live] + 1 >= self.max_steps
        failed = last & ((self.collisions[live] > sc.max_collisions) | (covered < N_LANDMARKS))
        out = StepBatch(obs=np.zeros((n, N_AGENTS * OBS_PER_AGENT), dtype=np.float32), reward=np.zeros(n),
                        terminated=np.zeros(n, dtype=bool), truncated=np.zeros(n, dtype=bool))
        out.obs[live] = self._obs(live)
        out.reward[live] = reward - hits
        out.terminated[live] = failed
        return out


# ---------------------------------------------------------------------------------------------
# the scenario
# ---------------------------------------------------------------------------------------------


def _names():
    names, meaning = [], []
    for kind, k in (("agent", N_AGENTS), ("landmark", N_LANDMARKS)):
        for i in range(k):
            for ax in ("x", "y"):
                names.append(f"{kind}{i}_{ax}")
                meaning.append(f"{ax} position of {kind} {i} (start; velocities start at 0)")
    return tuple(names), tuple(meaning)


@dataclass
class CoopNavi(Scenario):
    """MPE simple_spread with a centralised policy (see the module docstring)."""

    name: str = "CoopNavi"
    env_id: str = ENV_ID
    state_names: tuple = field(default_factory=lambda: _names()[0])
    state_meaning: tuple = field(default_factory=lambda: _names()[1])
    low: np.ndarray = field(default_factory=lambda: np.full(12, -1.0))
    high: np.ndarray = field(default_factory=lambda: np.full(12, 1.0))
    obs_dim: int = N_AGENTS * OBS_PER_AGENT
    action: ActionSpec = field(
        default_factory=lambda: ActionSpec("continuous", shape=(6,), low=np.full(6, -1.0), high=np.full(6, 1.0))
    )
    max_steps: int = MAX_STEPS
    grid_intervals: int = 2  # per coordinate: which half; a cell = the quadrant of each of the 6 entities
    mutation_scale: float = 0.015  # std 0.03 (width 2): the spread of the peers' U(-0.05, 0.05)
    failure_rule: str = (
        "after 25 steps: more than 5 collisions (agent pairs closer than 0.3, summed over steps) or a "
        "landmark with no agent within 0.1 (the episode then terminates at step 25)"
    )
    version: str = "1"
    integrator: str = "openai"  # or "mpe2" (PettingZoo's integration order)
    cover_radius: float = COVER_RADIUS
    max_collisions: int = MAX_COLLISIONS
    max_redraws: int = 20  # mutate: redraws of an invalid mutant before keeping the parent

    def sample(self, rng, n):
        """MPE's reset (every coordinate uniform in [−1, 1]), invalid draws rejected."""
        n = int(n)
        out = np.zeros((0, self.state_dim))
        while out.shape[0] < n:
            m = max(2 * (n - out.shape[0]), 16)
            cand = rng.uniform(self.low, self.high, size=(m, self.state_dim))
            out = np.concatenate([out, cand[is_valid(cand)]])
        return out[:n]

    def sample_uniform(self, rng, n):
        """Uniform over the bounds, restricted to valid states: the same as :meth:`sample`."""
        return self.sample(rng, n)

    def mutate(self, states, rng, scale=None):
        """The base Gaussian mutation, clipped to the bounds; a mutant that breaks validity is
        redrawn (up to ``max_redraws`` times), then replaced by its parent."""
        states = self.validate(states)
        out = super().mutate(states, rng, scale)
        bad = np.flatnonzero(~is_valid(out))
        for _ in range(self.max_redraws):
            if bad.size == 0:
                break
            out[bad] = super().mutate(states[bad], rng, scale)
            bad = bad[~is_valid(out[bad])]
        out[bad] = states[bad]
        return out

    def project(self, states):
        """Clip into the bounds, then push overlapping agents (landmarks) apart along the line
        between them until every pair is valid: the nearest valid layout a generator's
        vector maps to (deterministic; coincident pairs separate along x)."""
        out = np.clip(np.asarray(states, dtype=np.float64), self.low, self.high)
        pos = out.reshape(len(out), N_AGENTS + N_LANDMARKS, 2)
        for _ in range(200):
            bad = ~is_valid(out)
            if not bad.any():
                break
            for off, min_sep in ((0, AGENT_MIN_SEP * 1.001), (N_AGENTS, LANDMARK_MIN_SEP * 1.001)):
                for a, b in PAIRS:
                    d = pos[:, off + b] - pos[:, off + a]
                    dist = np.sqrt(np.sum(d * d, axis=1))
                    close = bad & (dist < min_sep)
                    if not close.any():
                        continue
                    u = np.where(dist[:, None] > 1e-12, d / np.maximum(dist, 1e-12)[:, None], [1.0, 0.0])
                    push = 0.5 * (min_sep - dist)[:, None] * u
                    pos[close, off + a] -= push[close]
                    pos[close, off + b] += push[close]
            np.clip(out, self.low, self.high, out=out)
        return out

    def validate(self, states, *, atol=1e-9):
        arr = super().validate(states, atol=atol)
        _check_integrator(self.integrator)
        for i, why in enumerate(validity_violations(arr)):
            if why is not None:
                raise InvalidStateError(f"{self.name}: initial state #{i} is invalid: {why}")
        return arr

    def simulator(self, batch_size):
        _check_integrator(self.integrator)
        return _CoopNaviSim(self, batch_size)

    def reference_env(self, **kwargs):
        kw = dict(integrator=self.integrator, max_steps=self.max_steps, cover_radius=self.cover_radius,
                  max_collisions=self.max_collisions)
        kw.update(kwargs)
        return gym.make(self.env_id, **kw)

    def reference_reset_to(self, env, state, seed=0):
        obs, _ = env.reset(seed=int(seed), options={"state": np.asarray(state, dtype=np.float64)})
        return obs

    def is_failure(self, returns, lengths, terminated):
        return np.asarray(terminated, dtype=bool)

    def diversity_bounds(self):
        """Table II's grid, per agent: own velocity ±1.5, own position ±2, landmarks and other
        agents relative to it ±3 (positions start in [−1, 1]; 2000 episodes of uniformly random
        forces, the most violent case, stay within these bounds for 99.8% of the values)."""
        per_agent = np.array([1.5] * 2 + [2.0] * 2 + [3.0] * 6 + [3.0] * 4)
        high = np.tile(per_agent, N_AGENTS)
        return -high, high
