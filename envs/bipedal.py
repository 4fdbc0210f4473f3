"""BipedalWalker (hardcore terrain) with the obstacle sequence as the initial state.

The MDPFuzz family of tools (MDPFuzz, CureFuzz, GMT, SeqDivFuzz, the ISSTA'24 replication)
test a BipedalWalkerHardcore agent by fuzzing the *terrain*: the initial state is a vector of
15 obstacle kinds, each 1 = STUMP, 2 = STAIRS or 3 = PIT, consumed in order (cycling) whenever
the terrain generator would draw a random obstacle after a stretch of grass.

Environment (:class:`BipedalWalkerObstacles`, registered as ``deltarl/BipedalWalkerObstacles-v0``):
a subclass of gymnasium 1.0.0's ``BipedalWalker(hardcore=True)``. Differences, all deliberate:

* ``reset(seed=s, options={"obstacles": seq})`` builds the terrain with the obstacle kinds of
  ``seq`` (15 values in {1, 2, 3}, in order, cycling when the course holds more than 15
  obstacles: a 200-tile course holds ~13 on average, up to ~30 when all are short stumps).
  Without ``options`` the kinds are 15 uniform draws from the env's RNG (the reset
  distribution, what :meth:`BipedalWalker.sample` draws and what training sees).
* Everything else random — grass roughness, grass lengths, stump sizes, stair direction /
  step count, pit widths, clouds and the hull's initial push U(-5, 5) — comes from
  ``np_random`` seeded by ``reset(seed=...)``, with the *same distributions as gymnasium*.
  Unlike gymnasium, the terrain generator draws all of its random numbers up front, a fixed
  number of them whatever the obstacle kinds are (one roughness value per tile; per obstacle
  slot one grass length, one stump size, one pit width, one stair direction, width and step
  count). So the RNG stream does not depend on the kinds: for one seed, two sequences that
  differ at position k give terrains that agree up to obstacle k, and the hull gets the same
  push. ``(state, seed)`` fully determines the episode.
* A fresh Box2D world at every reset. gymnasium keeps one world across resets; its leftover
  broad-phase state changes the solver's order of operations, so the same terrain, seed and
  actions gave a different trajectory after ~8 earlier episodes in the same env (found by the
  conformance test). With a fresh world an episode does not depend on what ran before.
* The "reached the end of the course" termination is removed (as in all the peer tools):
  ``terminated`` now means exactly gymnasium's ``game_over`` (the hull touched the ground) or
  ``x < 0``, both with reward -100. A walker that runs past the end keeps going (off the
  course: no more ground, no failure) until the step limit.

The episode seed: :class:`BatchSimulator` seeds come from the rollout engine (a hash of the
campaign seed, the state index and the repeat), so by default the same obstacle sequence meets
different obstacle sizes and pushes in different episodes: the scenario is ``stochastic`` (the
statistical oracle applies). Set ``terrain_seed`` (e.g. ``get_scenario("BipedalWalker",
terrain_seed=0)``) to use that one seed for every episode, as the replication does (it
re-seeds the RNG with a fixed seed at each reset): then the obstacle sequence alone determines
the episode and the scenario is not stochastic.

Simulation: Box2D cannot be vectorised; :class:`BipedalSim` keeps one env per episode and steps
each live one in a Python loop (~0.4 ms per step on one idle core). Observations are float32 (24,),
actions Box(4) in [-1, 1] (converted to float64 before stepping, as the conformance test does
for the reference env).

Failure oracle: the walker fell. ``terminated`` before the step limit means game_over (hull on
the ground) or walked backwards off the start (x < 0); both end the episode with reward -100,
and nothing else terminates an episode, so ``is_failure = terminated``.

Step limit: ``max_steps = 600`` by default (LLMTester's Table I; MDPFuzz uses 1000, CureFuzz
and the replication 300, gymnasium's TimeLimit 2000). The course is ~89 m long; how many
obstacles an episode meets depends on the walker's speed (gymnasium's 2000 steps are sized to
cross it), and shorter caps leave the later positions of the sequence untested. Set
``max_steps`` to change it: the reference env's TimeLimit follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from envs.base import (
    ActionSpec,
    BatchSimulator,
    InvalidStateError,
    Scenario,
    ScenarioError,
    StepBatch,
)

ENV_ID = "deltarl/BipedalWalkerObstacles-v0"
N_OBSTACLES = 15
STUMP, STAIRS, PIT = 1, 2, 3
GRASS = 0  # the terrain generator's state between obstacles
KIND_NAMES = {STUMP: "STUMP", STAIRS: "STAIRS", PIT: "PIT"}


def _env_class():
    """The gymnasium env class (defined lazily: importing Box2D only when needed)."""
    global _ENV_CLASS
    if _ENV_CLASS is not None:
        return _ENV_CLASS
    from gymnasium.envs.box2d import bipedal_walker as bw

    class BipedalWalkerObstacles(_ObstacleCourse, bw.BipedalWalker):
        """gymnasium's BipedalWalker (hardcore) whose obstacle kinds are given (module docs)."""

    _ENV_CLASS = BipedalWalkerObstacles
    return _ENV_CLASS


class _ObstacleCourse:
    """What :class:`BipedalWalkerObstacles` changes in gymnasium's ``BipedalWalker`` (a mixin:
    :func:`_env_class` puts it before the gymnasium class, which is imported lazily)."""

    def __init__(self, render_mode=None, hardcore: bool = True):
        super().__init__(render_mode=render_mode, hardcore=True)
        self.obstacle_sequence = np.full(N_OBSTACLES, STUMP, dtype=np.int64)
        self.obstacles: list[dict] = []  # what the last terrain holds, in order

    def reset(self, *, seed=None, options=None):
        import Box2D
        from gymnasium.envs.box2d import bipedal_walker as bw

        # seed np_random here (gymnasium's reset seeds it again with the same seed: no-op
        # for the stream, since super().reset(seed=None) keeps the generator)
        if seed is not None:
            super(bw.BipedalWalker, self).reset(seed=seed)
            seed = None
        # always draw the default sequence, so the stream after it does not depend on
        # whether options were given: reset(seed=s) == reset(seed=s, options=<its draw>)
        drawn = self.np_random.integers(1, 4, size=N_OBSTACLES)
        seq = drawn if not options or options.get("obstacles") is None else options["obstacles"]
        self.obstacle_sequence = check_sequence(seq)
        # a fresh Box2D world: a reused one keeps broad-phase proxies and contact order from
        # the previous episode, which changes the solver's order of operations, so the same
        # (state, seed) would give a different trajectory depending on what ran before
        self._destroy()
        self.world = Box2D.b2World()
        return super().reset(seed=None, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if terminated and not (self.game_over or self.hull.position[0] < 0):
            terminated = False  # reached the end of the course: not an end here (module docs)
        return obs, reward, terminated, truncated, info

    # -- the terrain ---------------------------------------------------------------------------
    def _generate_terrain(self, hardcore):
        """gymnasium's generator, with the kinds from ``obstacle_sequence`` and every other
        random number drawn up front (a fixed count: the stream does not depend on kinds)."""
        from gymnasium.envs.box2d import bipedal_walker as bw

        draws = _TerrainDraws.draw(self.np_random, bw.TERRAIN_LENGTH, bw.TERRAIN_GRASS)
        self.terrain = []
        self.terrain_x = []
        self.terrain_y = []
        self.obstacles = []
        self._lay_tiles(bw, draws)
        self._add_grass_edges(bw.TERRAIN_LENGTH)

    def _lay_tiles(self, bw, draws: "_TerrainDraws") -> None:
        """Walk the course tile by tile: grass, then the next obstacle of the sequence, then
        grass again; obstacles become Box2D polygons, every tile gets its ground height."""
        c = _TerrainCursor(y=bw.TERRAIN_HEIGHT, counter=bw.TERRAIN_STARTPAD)
        for i in range(bw.TERRAIN_LENGTH):
            x = i * bw.TERRAIN_STEP
            self.terrain_x.append(x)
            if c.oneshot:
                self._start_obstacle(bw, c, draws, i, x)
            else:
                self._follow_ground(bw, c, draws, i)
            c.oneshot = False
            self.terrain_y.append(c.y)
            c.counter -= 1
            if c.counter == 0:
                if c.state == GRASS:  # an obstacle: the next kind of the sequence
                    c.k += 1
                    c.state = int(self.obstacle_sequence[c.k % N_OBSTACLES])
                    c.counter = 1  # overwritten by the obstacle's own length next tile
                else:
                    c.state = GRASS
                    c.counter = int(draws.grass_len[c.k])
                c.oneshot = True

    def _follow_ground(self, bw, c: "_TerrainCursor", draws: "_TerrainDraws", i: int) -> None:
        """The ground height of a tile inside a stretch (grass, pit or stairs; a stump is flat)."""
        TS, TH = bw.TERRAIN_STEP, bw.TERRAIN_HEIGHT
        if c.state == GRASS:
            c.velocity = 0.8 * c.velocity + 0.01 * np.sign(TH - c.y)
            if i > bw.TERRAIN_STARTPAD:
                c.velocity += draws.rough[i] / bw.SCALE
            c.y += c.velocity
        elif c.state == PIT:
            c.y = c.original_y
            if c.counter > 1:
                c.y -= 4 * TS
        elif c.state == STAIRS:
            s = c.stair_steps * c.stair_width - c.counter - c.stair_height
            n = s / c.stair_width
            c.y = c.original_y + (n * c.stair_height) * TS

    def _start_obstacle(self, bw, c: "_TerrainCursor", draws: "_TerrainDraws", i: int, x: float) -> None:
        """The first tile of a stretch: an obstacle's polygons and length (nothing for grass)."""
        TS, y, k = bw.TERRAIN_STEP, c.y, c.k
        if c.state == PIT:
            c.counter = int(draws.pit_len[k])
            poly = [(x, y), (x + TS, y), (x + TS, y - 4 * TS), (x, y - 4 * TS)]
            self._add_poly(poly)
            self._add_poly([(p[0] + TS * c.counter, p[1]) for p in poly])
            self.obstacles.append(dict(kind=PIT, tile=i, x=x, width=c.counter))
            c.counter += 2
            c.original_y = y
        elif c.state == STUMP:
            size = c.counter = int(draws.stump_size[k])
            self._add_poly([(x, y), (x + size * TS, y), (x + size * TS, y + size * TS), (x, y + size * TS)])
            self.obstacles.append(dict(kind=STUMP, tile=i, x=x, size=size))
        elif c.state == STAIRS:
            c.stair_height = height = +1 if draws.stair_up[k] else -1
            c.stair_width = width = int(draws.stair_width[k])
            c.stair_steps = steps = int(draws.stair_steps[k])
            c.original_y = y
            for s in range(steps):
                self._add_poly([
                    (x + (s * width) * TS, y + (s * height) * TS),
                    (x + ((1 + s) * width) * TS, y + (s * height) * TS),
                    (x + ((1 + s) * width) * TS, y + (-1 + s * height) * TS),
                    (x + (s * width) * TS, y + (-1 + s * height) * TS),
                ])
            self.obstacles.append(dict(kind=STAIRS, tile=i, x=x, steps=steps, width=width, direction=height))
            c.counter = steps * width

    def _add_poly(self, poly) -> None:
        self.fd_polygon.shape.vertices = poly
        t = self.world.CreateStaticBody(fixtures=self.fd_polygon)
        t.color1, t.color2 = (255, 255, 255), (153, 153, 153)
        self.terrain.append(t)

    def _add_grass_edges(self, length: int) -> None:
        """The ground itself: one edge body per tile, and the polygons gymnasium renders."""
        self.terrain_poly = []
        for i in range(length - 1):
            poly = [(self.terrain_x[i], self.terrain_y[i]), (self.terrain_x[i + 1], self.terrain_y[i + 1])]
            self.fd_edge.shape.vertices = poly
            t = self.world.CreateStaticBody(fixtures=self.fd_edge)
            color = (76, 255 if i % 2 == 0 else 204, 76)
            t.color1 = color
            t.color2 = color
            self.terrain.append(t)
            color = (102, 153, 76)
            poly += [(poly[1][0], 0), (poly[0][0], 0)]
            self.terrain_poly.append((poly, color))
        self.terrain.reverse()


@dataclass
class _TerrainDraws:
    """Every random number of one terrain, drawn up front in a fixed order and count."""

    rough: np.ndarray  # grass roughness, per tile
    grass_len: np.ndarray  # grass after obstacle k
    pit_len: np.ndarray
    stump_size: np.ndarray
    stair_up: np.ndarray
    stair_width: np.ndarray
    stair_steps: np.ndarray

    @classmethod
    def draw(cls, rng, length: int, grass: int) -> "_TerrainDraws":
        rough = rng.uniform(-1, 1, size=length)
        slots = length  # an upper bound on the number of obstacles (each is >= 1 tile)
        grass_len = rng.integers(grass / 2, grass, size=slots)
        pit_len = rng.integers(3, 5, size=slots)
        stump_size = rng.integers(1, 3, size=slots)
        stair_up = rng.random(size=slots) > 0.5
        stair_width = rng.integers(4, 5, size=slots)
        stair_steps = rng.integers(3, 5, size=slots)
        return cls(rough, grass_len, pit_len, stump_size, stair_up, stair_width, stair_steps)


@dataclass
class _TerrainCursor:
    """Where the terrain walk is: the stretch's kind and tiles left, ground height and slope,
    the current obstacle ``k`` and what its later tiles need (pit floor, stair geometry)."""

    y: float
    counter: int
    state: int = GRASS
    velocity: float = 0.0
    oneshot: bool = False
    k: int = -1  # index of the current obstacle
    stair_steps: int = 0
    stair_width: int = 0
    stair_height: int = 0
    original_y: float = 0


_ENV_CLASS = None


def make_env(**kwargs):
    """The gymnasium env (entry point of ``deltarl/BipedalWalkerObstacles-v0``)."""
    return _env_class()(**kwargs)


def register() -> None:
    import gymnasium as gym

    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="envs.bipedal:make_env", max_episode_steps=2000)


def check_sequence(seq) -> np.ndarray:
    """An obstacle sequence as int64 (15,), or :class:`InvalidStateError` saying why."""
    arr = np.asarray(seq, dtype=np.float64).reshape(-1)
    if arr.shape != (N_OBSTACLES,) or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)) or np.any(
        (arr < 1) | (arr > 3)
    ):
        raise InvalidStateError(f"an obstacle sequence is {N_OBSTACLES} integers in {{1, 2, 3}}, got {seq!r}")
    return arr.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# The batched simulator
# ---------------------------------------------------------------------------------------------


class BipedalSim(BatchSimulator):
    """One BipedalWalkerObstacles env per episode, each live one stepped in turn."""

    def __init__(self, scenario: "BipedalWalker", batch_size: int):
        super().__init__(scenario, batch_size)
        self.envs: list = []

    def _reset(self, states, seeds):
        n = states.shape[0]
        cls = _env_class()
        while len(self.envs) < n:
            self.envs.append(cls())
        obs = np.zeros((n, 24), dtype=np.float32)
        for i in range(n):
            o, _ = self.envs[i].reset(seed=self.scenario.episode_seed(seeds[i]),
                                      options={"obstacles": states[i]})
            obs[i] = o
        self.obs = obs
        return obs.copy()

    def _step(self, actions, live):
        n = self.n
        a = np.asarray(actions, dtype=np.float64)
        if a.shape != (n, 4):
            raise ScenarioError(f"{self.scenario.name}: actions must have shape ({n}, 4), got {a.shape}")
        if not np.all(np.isfinite(a[live])):
            raise ScenarioError(f"{self.scenario.name}: actions must be finite")
        out = StepBatch(obs=self.obs, reward=np.zeros(n), terminated=np.zeros(n, dtype=bool),
                        truncated=np.zeros(n, dtype=bool))
        for i in live.tolist():
            o, r, te, _, _ = self.envs[i].step(a[i])
            out.obs[i] = o
            out.reward[i] = r
            out.terminated[i] = te
        self.obs = out.obs.copy()
        return out


# ---------------------------------------------------------------------------------------------
# The scenario
# ---------------------------------------------------------------------------------------------


@dataclass
class BipedalWalker(Scenario):
    """BipedalWalker hardcore; the initial state is the obstacle sequence (module docs).

    ``mutate`` is the peer tools' operator (MDPFuzz's ``clip((s + 1) mod 4, 1, 3)`` on a
    Bernoulli mask): each position independently with probability ``p = min(scale, 1)`` (default
    ``mutation_scale`` 0.1, the peers' Bernoulli(0.1)) moves one step along the cycle
    1 → 2 → 3 → 1 (stump → stairs → pit → stump). ``mutation_operator = "either"`` instead moves
    a chosen position to either other kind, uniformly (+1 or +2 mod 3). ``mutation_nonnull``
    redraws a mutant identical to its parent (the replication's guard; off by default, as in the
    original fuzzing phase, where ≈ 21% of the mutants equal their parent).
    """

    name: str = "BipedalWalker"
    env_id: str = ENV_ID
    state_names: tuple = tuple(f"obstacle_{k + 1}" for k in range(N_OBSTACLES))
    state_meaning: tuple = tuple(
        f"kind of the {k + 1}{'st' if k == 0 else 'nd' if k == 1 else 'rd' if k == 2 else 'th'} obstacle "
        f"on the course: 1 stump, 2 stairs, 3 pit" for k in range(N_OBSTACLES)
    )
    low: np.ndarray = field(default_factory=lambda: np.full(N_OBSTACLES, 1.0))
    high: np.ndarray = field(default_factory=lambda: np.full(N_OBSTACLES, 3.0))
    obs_dim: int = 24
    action: ActionSpec = field(
        default_factory=lambda: ActionSpec("continuous", shape=(4,), low=-np.ones(4, np.float32), high=np.ones(4, np.float32))
    )
    max_steps: int = 600
    grid_intervals: int = 3  # one cell per obstacle kind
    mutation_scale: float = 0.1  # the per-position change probability
    mutation_operator: str = "cycle"  # "cycle": 1 -> 2 -> 3 -> 1 (the peers'); "either": +1 or +2 mod 3
    mutation_nonnull: bool = False  # redraw mutants equal to their parent (the replication's guard)
    failure_rule: str = "the walker fell (hull touched the ground) or walked off the start (x < 0): terminated, reward -100"
    stochastic: bool = True  # obstacle sizes and the initial push follow the episode seed
    integer_states: bool = True  # obstacle kinds 1, 2, 3 (an LLM's reply schema lists them)
    inference_default: str = "alone"
    inference_why: str = ("Box2D amplifies the last-bit differences of batched actions over 600 steps, so batched "
                          "episodes say little about the deployed agent (docs/verdicts.md); a Box2D step costs many "
                          "times a policy row acted alone")
    terrain_seed: int | None = None  # one seed for every episode: then the state alone decides

    def __post_init__(self):
        self.stochastic = self.terrain_seed is None

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "terrain_seed":
            super().__setattr__("stochastic", value is None)

    def episode_seed(self, seed) -> int:
        return int(seed) if self.terrain_seed is None else int(self.terrain_seed)

    # -- the initial-state space (integers) --------------------------------------------------
    def sample(self, rng, n):
        """Uniform kinds, as the env's own reset (and the peers' ``randint(1, 4, 15)``)."""
        return rng.integers(1, 4, size=(n, N_OBSTACLES)).astype(np.float64)

    def sample_uniform(self, rng, n):
        return self.sample(rng, n)

    def mutate(self, states, rng, scale=None):
        states = self.validate(states)
        scale = self.mutation_scale if scale is None else float(scale)
        if not np.isfinite(scale) or scale < 0:
            raise ScenarioError(f"mutation scale must be a finite number >= 0, got {scale!r}")
        if self.mutation_operator not in ("cycle", "either"):
            raise ScenarioError(f"{self.name}: mutation_operator must be 'cycle' or 'either', got {self.mutation_operator!r}")
        p = min(scale, 1.0)
        kinds = states.astype(np.int64) - 1

        def draw(k):
            flip = rng.random(k.shape) < p
            if self.mutation_operator == "cycle":
                shift = np.ones(k.shape, dtype=np.int64)
            else:
                shift = rng.integers(1, 3, size=k.shape)  # +1 or +2 mod 3: one of the other kinds
            return np.where(flip, (k + shift) % 3, k)

        out = draw(kinds)
        if self.mutation_nonnull and p > 0:
            same = np.flatnonzero((out == kinds).all(axis=1))
            for _ in range(1000):
                if same.size == 0:
                    break
                out[same] = draw(kinds[same])
                same = same[(out[same] == kinds[same]).all(axis=1)]
        return (out + 1).astype(np.float64)

    def project(self, states):
        """Arbitrary vectors (e.g. GMT's generated ones) to the nearest obstacle kinds."""
        return np.clip(np.rint(np.asarray(states, dtype=np.float64)), self.low, self.high)

    def validate(self, states, *, atol=1e-9):
        arr = super().validate(states, atol=atol)
        frac = np.abs(arr - np.round(arr)) > atol
        if frac.any():
            i, j = np.argwhere(frac)[0]
            raise InvalidStateError(
                f"{self.name}: initial state #{i} has '{self.state_names[j]}' = {arr[i, j]:.6g}, not an "
                f"integer; each value is an obstacle kind: 1 stump, 2 stairs, 3 pit"
            )
        return np.round(arr)

    # -- simulation --------------------------------------------------------------------------
    def simulator(self, batch_size):
        return BipedalSim(self, batch_size)

    def reference_env(self, **kwargs):
        import gymnasium as gym

        register()
        kwargs.setdefault("max_episode_steps", self.max_steps)
        return gym.make(self.env_id, **kwargs)

    def reference_reset_to(self, env, state, seed=0):
        obs, _ = env.reset(seed=self.episode_seed(seed), options={"obstacles": self.validate(state)[0]})
        return obs

    def is_failure(self, returns, lengths, terminated):
        return np.asarray(terminated, dtype=bool)

    def diversity_bounds(self):
        """Table II's grid: gymnasium's declared observation bounds (hull angle and joint angles
        ±π, velocities ±5, leg contacts [0, 5], lidar [−1, 1])."""
        return _OBS_LOW.copy(), _OBS_HIGH.copy()


# gymnasium BipedalWalker's observation_space
_OBS_HIGH = np.array([np.pi, 5, 5, 5, np.pi, 5, np.pi, 5, 5, np.pi, 5, np.pi, 5, 5] + [1] * 10, dtype=np.float64)
_OBS_LOW = np.where(np.isin(np.arange(24), [8, 13]), 0.0, -_OBS_HIGH)  # the leg contacts start at 0

register()
