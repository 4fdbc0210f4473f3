"""GMT — Generative Model-based Testing (Li et al., ASE 2023): a guided diffusion test generator.

One file on purpose: the small DDPM (β schedule, denoiser, sampler, AdamW) exists only for GMT,
and the module reads top to bottom like the paper's method: the model, then the guided loop.

A small DDPM (Ho et al., 2020) learns the distribution of the initial states executed so far and
generates the next ones. Its training set is weighted by GMT's guidance, the *termination-state
novelty* of each executed case: the episode's final observation falls in a cell of a grid over
the observation space (``grid_intervals`` parts per dimension); a case whose cell had been
visited ``c - 1`` times before scores ``exp(-(c - 1))`` (1 for a new cell). Optionally a
*criticality* term (1 for a failure, else 1 − the min–max normalized return) is mixed in:
``g = (w_nov·novelty + w_crit·criticality) / (w_nov + w_crit)``. Cases enter the training
minibatches with probability ∝ ``exp(guidance_scale · g)`` (reward-weighted regression), so the
model learns the executed-case distribution tilted towards high-guidance cases and generates
more initial states that lead to rarely seen outcomes (or to failures).

Loop (one ``propose`` + ``observe`` per generation):

* sampling phase: cases from ``scenario.sample`` (``init="sample"``) or uniform over the bounds
  (``init="uniform"``); executed, scored and added to the training set.
* fuzzing phase: once ``retrain_every`` new cases were observed since the last training, the
  model is trained for ``train_steps`` AdamW steps (``warmup_steps`` the first time) on the
  executed cases (the most recent ``train_window`` of them, or all), and the pool of generated
  cases is discarded; cases are then taken from the pool, refilled ``sample_batch`` at a time
  by batched ancestral sampling. A ``random_fraction`` of each generation can be fresh seed
  samples instead (off by default).

Model: ε-prediction DDPM with T = ``diffusion_steps``, ``"cosine"`` (default) or ``"linear"``
β schedule (:func:`make_betas`), denoiser = MLP on [x_t, sinusoidal embedding of t], loss
E‖ε − ε_θ(x_t, t)‖², ancestral sampling with the posterior variance β̃_t, the x_0 estimate
clipped to [-1, 1] at every step and no noise on the last step.

Representation: each initial-state dimension of nonzero width is mapped to [-1, 1] by the
scenario's bounds; zero-width dimensions (e.g. MountainCar's velocity) are not modelled and stay
at their fixed value. Generated vectors are clipped to [-1, 1], mapped back and clipped into the
bounds: proposals are always valid.

Determinism: every random draw comes from ``self.rng``: numpy draws directly, torch draws from a
``torch.Generator`` seeded from ``self.rng`` for each training round / sampling batch; the
network is initialized from such a generator too; torch runs with ``num_threads`` intra-op
threads (1 by default) during training and sampling. ``state_dict`` holds the weights, the
AdamW state, the training set and its metrics, the grid and its counts, the pool of generated
but not yet proposed cases, and the RNG.

Cost (CPU): the network is tiny, so per-op overhead dominates; a training step is a few ms, a
batch of samples ≈ T forward passes. Per episode that is about
``(train_steps·t_step + T·t_forward) / retrain_every``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time

import numpy as np
import torch
from torch import nn

from orchestrator.fuzzers.base import Feedback, Fuzzer, Proposal
from workers import torch_compat as foreach

# ---------------------------------------------------------------------------------------------
# DDPM pieces (usable on their own: the tests exercise them directly)
# ---------------------------------------------------------------------------------------------


def make_betas(schedule: str, steps: int) -> np.ndarray:
    """β_1..β_T (float64) of the ``"linear"`` or ``"cosine"`` schedule with ``steps`` = T.

    linear: Ho et al.'s 1e-4 → 0.02 over 1000 steps, rescaled by 1000/T (Nichol & Dhariwal) so
    that a short chain still ends near pure noise. cosine: Nichol & Dhariwal's
    ᾱ(t) = cos²((t/T + s)/(1 + s) · π/2) / ᾱ(0), s = 0.008, β clipped at 0.999.
    """
    steps = int(steps)
    if steps < 2:
        raise ValueError(f"diffusion_steps must be >= 2, got {steps}")
    if schedule == "linear":
        scale = 1000.0 / steps
        return np.linspace(1e-4 * scale, min(0.02 * scale, 0.999), steps, dtype=np.float64)
    if schedule == "cosine":
        s = 0.008
        t = np.arange(steps + 1, dtype=np.float64) / steps
        f = np.cos((t + s) / (1 + s) * math.pi / 2) ** 2
        abar = f / f[0]
        return np.clip(1.0 - abar[1:] / abar[:-1], 1e-8, 0.999)
    raise ValueError(f"unknown beta schedule {schedule!r}; use 'linear' or 'cosine'")


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding (Transformer style) of integer timesteps t, shape (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / max(half, 1))
    ang = t.float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.sin(ang), torch.cos(ang)], dim=1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=1)
    return emb


_ACTIVATIONS = {"relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


class NoiseMLP(nn.Module):
    """ε_θ(x_t, t): an MLP on [x_t, embed(t)] (``layers`` hidden layers of ``hidden`` units)."""

    def __init__(self, dim: int, hidden: int = 64, layers: int = 2, time_dim: int = 16, steps: int = 1000,
                 activation: str = "relu"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; use one of {sorted(_ACTIVATIONS)}")
        self.dim, self.time_dim = int(dim), int(time_dim)
        # the embeddings of t = 0..steps-1, looked up instead of recomputed (CPU op overhead)
        self.register_buffer("temb", timestep_embedding(torch.arange(int(steps)), self.time_dim), persistent=False)
        mods: list[nn.Module] = []
        width = self.dim + self.time_dim
        for _ in range(int(layers)):
            mods += [nn.Linear(width, int(hidden)), _ACTIVATIONS[activation]()]
            width = int(hidden)
        mods.append(nn.Linear(width, self.dim))
        self.net = nn.Sequential(*mods)

    def reset_parameters(self, gen: torch.Generator) -> None:
        """PyTorch's default Linear init (U(±1/√fan_in)), drawn from ``gen``."""
        with torch.no_grad():
            for m in self.net:
                if isinstance(m, nn.Linear):
                    bound = 1.0 / math.sqrt(m.in_features)
                    m.weight.uniform_(-bound, bound, generator=gen)
                    m.bias.uniform_(-bound, bound, generator=gen)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, self.temb[t]], dim=1))

    def step_biases(self) -> torch.Tensor:
        """(T, hidden): the first layer's bias plus its response to embed(t), for every t."""
        first = self.net[0]
        return torch.addmm(first.bias, self.temb, first.weight[:, self.dim:].t())

    def forward_step(self, x: torch.Tensor, step_bias: torch.Tensor) -> torch.Tensor:
        """ε_θ(x, t) for one t shared by the whole batch, given ``step_biases()[t]`` (sampling)."""
        first = self.net[0]
        h = torch.addmm(step_bias, x, first.weight[:, : self.dim].t())
        return self.net[1:](h)


class DDPM:
    """Schedule-derived constants and the three DDPM operations on an ε-predicting model."""

    def __init__(self, model: NoiseMLP, steps: int = 50, schedule: str = "cosine", clip_denoised: bool = True):
        self.model = model
        self.steps = int(steps)
        self.schedule = schedule
        self.clip_denoised = bool(clip_denoised)
        b = make_betas(schedule, steps)
        abar = np.cumprod(1.0 - b)
        abar_prev = np.concatenate([[1.0], abar[:-1]])
        f = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
        self.betas, self.alpha_bar, self.alpha_bar_prev = f(b), f(abar), f(abar_prev)
        self.sqrt_ab, self.sqrt_1m_ab = f(np.sqrt(abar)), f(np.sqrt(1.0 - abar))
        # posterior q(x_{t-1} | x_t, x_0) = N(c0·x_0 + ct·x_t, var)
        self.post_c0 = f(b * np.sqrt(abar_prev) / (1.0 - abar))
        self.post_ct = f((1.0 - abar_prev) * np.sqrt(1.0 - b) / (1.0 - abar))
        self.post_var = f(b * (1.0 - abar_prev) / (1.0 - abar))

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t ~ q(x_t | x_0) = N(√ᾱ_t x_0, (1 − ᾱ_t) I), with the given standard noise."""
        return self.sqrt_ab[t][:, None] * x0 + self.sqrt_1m_ab[t][:, None] * noise

    def fit(self, data: torch.Tensor, weights: torch.Tensor | None, steps: int, batch_size: int,
            opt: AdamW, gen: torch.Generator) -> float:
        """``steps`` optimizer steps of the simple DDPM loss E‖ε − ε_θ(x_t, t)‖², t ~ U{0..T−1},
        on minibatches drawn from ``data`` with
        probability ∝ ``weights`` (uniform when None); returns the mean loss. All random draws
        of the round are made up front in a few batched calls (CPU op overhead dominates)."""
        steps, b = int(steps), int(batch_size)
        m = steps * b
        if weights is None:
            idx = torch.randint(0, data.shape[0], (m,), generator=gen)
        else:
            idx = torch.multinomial(weights, m, replacement=True, generator=gen)
        t = torch.randint(0, self.steps, (m,), generator=gen)
        noise = torch.randn((m, data.shape[1]), generator=gen)
        inp = torch.cat([self.q_sample(data[idx], t, noise), self.model.temb[t]], dim=1)
        inp, noise = inp.view(steps, b, -1), noise.view(steps, b, -1)
        total = torch.zeros(())
        for k in range(steps):
            loss = nn.functional.mse_loss(self.model.net(inp[k]), noise[k])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach()
        return float(total) / steps

    @torch.inference_mode()
    def sample(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """Ancestral sampling x_T ~ N(0, I) → x_0 (posterior variance; no noise at the last step)."""
        n, d = int(n), self.model.dim
        x = torch.randn((n, d), generator=gen)
        noise = torch.randn((self.steps, n, d), generator=gen)
        c = [(float(self.sqrt_1m_ab[i]), 1.0 / float(self.sqrt_ab[i]), float(self.post_c0[i]),
              float(self.post_ct[i]), float(self.post_var[i]) ** 0.5) for i in range(self.steps)]
        biases = self.model.step_biases()
        for i in reversed(range(self.steps)):
            s1m, inv_sab, c0, ct, sd = c[i]
            eps = self.model.forward_step(x, biases[i])
            x0 = torch.add(x, eps, alpha=-s1m).mul_(inv_sab)
            if self.clip_denoised:
                x0.clamp_(-1.0, 1.0)
            x = x.mul_(ct).add_(x0, alpha=c0)
            if i > 0:
                x.add_(noise[i], alpha=sd)
        return x.clamp_(-1.0, 1.0).clone()


class AdamW:
    """AdamW (Loshchilov & Hutter) in a handful of list operations (:mod:`workers.torch_compat`:
    PyTorch's ``_foreach`` kernels).

    Same update as ``torch.optim.AdamW`` (decoupled weight decay, bias-corrected moments); it
    exists because the stock optimizer's per-step Python overhead is larger than a whole
    forward/backward pass of the tiny denoiser on a CPU.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        self.params = [p for p in params]
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), tuple(betas), float(eps), float(weight_decay)
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        self.t += 1
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        foreach.lerp_(self.m, grads, 1.0 - b1)
        foreach.mul_(self.v, b2)
        foreach.addcmul_(self.v, grads, grads, 1.0 - b2)
        denom = foreach.sqrt(self.v)
        foreach.div_(denom, math.sqrt(1.0 - b2**self.t))
        foreach.add_(denom, self.eps)
        if self.weight_decay:
            foreach.mul_(self.params, 1.0 - self.lr * self.weight_decay)
        foreach.addcdiv_(self.params, self.m, denom, -self.lr / (1.0 - b1**self.t))

    def state_dict(self) -> dict:
        return {"t": self.t, "m": [x.clone() for x in self.m], "v": [x.clone() for x in self.v],
                "lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay}

    def load_state_dict(self, d: dict) -> None:
        self.t = int(d["t"])
        for dst, src in zip(self.m + self.v, list(d["m"]) + list(d["v"])):
            dst.copy_(src)
        self.lr, self.betas, self.eps, self.weight_decay = d["lr"], tuple(d["betas"]), d["eps"], d["weight_decay"]


def _torch_gen(rng: np.random.Generator) -> torch.Generator:
    return torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))


@contextlib.contextmanager
def _torch_threads(n: int | None):
    """Run torch with ``n`` intra-op threads, then restore (tiny ops: extra threads only spin)."""
    if not n:
        yield
        return
    prev = torch.get_num_threads()
    if prev != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if prev != n:
            torch.set_num_threads(prev)


# ---------------------------------------------------------------------------------------------
# The fuzzer
# ---------------------------------------------------------------------------------------------


_SOURCES = ("seed", "generated", "random")


class GMT(Fuzzer):
    """Diffusion-model test generator guided by termination-state novelty (see module docstring).

    Parameters (keyword): ``init`` "sample" | "uniform" (seed cases); ``diffusion_steps`` T (50);
    ``schedule`` "cosine" | "linear"; ``hidden`` (64), ``layers`` (2 hidden layers),
    ``time_dim`` (16, timestep embedding), ``activation`` "relu" | "silu" | "tanh";
    ``lr`` (2e-3), ``weight_decay`` (0.01), ``batch_size`` (128); ``train_steps`` (16 per
    round), ``warmup_steps`` (400, first round), ``retrain_every`` (128 new cases per round),
    ``train_window`` (None = all cases); ``sample_batch`` (128); ``novelty_weight`` (1),
    ``criticality_weight`` (0), ``guidance_scale`` (3; 0 = unguided DDPM); ``grid_intervals``
    (5), ``grid_low``/``grid_high`` (None: fitted to the first observed terminal states, widened
    by ``grid_margin`` = 0.1 of their range per side); ``random_fraction`` (0);
    ``clip_denoised`` (True); ``num_threads`` (1; None leaves torch's setting alone).
    """

    name = "gmt"

    def __init__(
        self,
        scenario,
        seed: int = 0,
        *,
        init: str = "sample",
        diffusion_steps: int = 50,
        schedule: str = "cosine",
        hidden: int = 64,
        layers: int = 2,
        time_dim: int = 16,
        lr: float = 2e-3,
        weight_decay: float = 0.01,
        batch_size: int = 128,
        train_steps: int = 16,
        warmup_steps: int = 400,
        retrain_every: int = 128,
        train_window: int | None = None,
        sample_batch: int = 128,
        novelty_weight: float = 1.0,
        criticality_weight: float = 0.0,
        guidance_scale: float = 3.0,
        grid_intervals: int = 5,
        grid_low=None,
        grid_high=None,
        grid_margin: float = 0.1,
        random_fraction: float = 0.0,
        clip_denoised: bool = True,
        activation: str = "relu",
        num_threads: int | None = 1,
        **params,
    ):
        super().__init__(scenario, seed, **params)
        if init not in ("sample", "uniform"):
            raise ValueError(f"gmt: init must be 'sample' or 'uniform', got {init!r}")
        for nm, v in (("diffusion_steps", diffusion_steps), ("hidden", hidden), ("layers", layers),
                      ("time_dim", time_dim), ("batch_size", batch_size), ("retrain_every", retrain_every),
                      ("sample_batch", sample_batch), ("grid_intervals", grid_intervals)):
            if int(v) < 1:
                raise ValueError(f"gmt: {nm} must be >= 1, got {v!r}")
        if int(train_steps) < 0 or int(warmup_steps) < 0:
            raise ValueError("gmt: train_steps and warmup_steps must be >= 0")
        if not 0.0 <= float(random_fraction) <= 1.0:
            raise ValueError(f"gmt: random_fraction must be in [0, 1], got {random_fraction!r}")
        if float(novelty_weight) < 0 or float(criticality_weight) < 0 or float(guidance_scale) < 0:
            raise ValueError("gmt: novelty_weight, criticality_weight and guidance_scale must be >= 0")
        if train_window is not None and int(train_window) < 1:
            raise ValueError(f"gmt: train_window must be None or >= 1, got {train_window!r}")
        self.init = init
        self.diffusion_steps, self.schedule = int(diffusion_steps), str(schedule)
        self.lr, self.weight_decay, self.batch_size = float(lr), float(weight_decay), int(batch_size)
        self.train_steps, self.warmup_steps = int(train_steps), int(warmup_steps)
        self.retrain_every, self.sample_batch = int(retrain_every), int(sample_batch)
        self.train_window = None if train_window is None else int(train_window)
        self.novelty_weight, self.criticality_weight = float(novelty_weight), float(criticality_weight)
        self.guidance_scale = float(guidance_scale)
        self.grid_intervals, self.grid_margin = int(grid_intervals), float(grid_margin)
        self.random_fraction = float(random_fraction)
        self.num_threads = None if not num_threads else int(num_threads)

        self._set_bounds(grid_low, grid_high)
        self._build_model(hidden, layers, time_dim, activation, clip_denoised)
        self._reset_training_set()

    def _set_bounds(self, grid_low, grid_high) -> None:
        """The modelled dimensions (nonzero width) and the termination-state grid's bounds
        (given, or None until the first terminal states are seen)."""
        sc = self.scenario
        self.low = np.asarray(sc.low, dtype=np.float64)
        self.high = np.asarray(sc.high, dtype=np.float64)
        self.active = np.flatnonzero(self.high > self.low)  # modelled dimensions
        self.width = (self.high - self.low)[self.active]

        def per_obs_dim(v):
            return None if v is None else np.broadcast_to(np.asarray(v, np.float64), (sc.obs_dim,)).copy()

        self._grid_lo, self._grid_hi = per_obs_dim(grid_low), per_obs_dim(grid_high)
        if (self._grid_lo is None) != (self._grid_hi is None):
            raise ValueError("gmt: give both grid_low and grid_high, or neither")
        if self._grid_lo is not None and not np.all(self._grid_hi > self._grid_lo):
            raise ValueError("gmt: grid_high must exceed grid_low in every dimension")

    def _build_model(self, hidden: int, layers: int, time_dim: int, activation: str, clip_denoised: bool) -> None:
        """The denoiser (weights drawn from ``self.rng``), its DDPM and the AdamW optimizer."""
        self.model = NoiseMLP(max(self.active.size, 1), hidden, layers, time_dim, self.diffusion_steps, activation)
        self.model.reset_parameters(_torch_gen(self.rng))
        self.ddpm = DDPM(self.model, self.diffusion_steps, self.schedule, clip_denoised)
        self.opt = AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def _reset_training_set(self) -> None:
        """No executed cases yet: empty training set, grid counts and pool; counters at zero."""
        # training set (all executed cases), normalized active coordinates + guidance metrics
        self.data_x = np.zeros((0, self.active.size), dtype=np.float32)
        self.data_nov = np.zeros(0)
        self.data_crit = np.zeros(0)
        self.cell_counts: dict[tuple, int] = {}
        self.ret_min, self.ret_max = math.inf, -math.inf
        self.pool = np.zeros((0, self.active.size), dtype=np.float32)  # generated, not yet proposed
        self.trained_rounds = 0
        self.since_train = 0
        self.generation = 0
        self.n_failures = 0
        self.failure_cells: set = set()
        self.last_loss = float("nan")
        self.time_train = 0.0
        self.time_sample = 0.0
        self.time_observe = 0.0
        self._last_novelty = float("nan")

    # -- coordinates ---------------------------------------------------------------------------
    def _to_norm(self, states: np.ndarray) -> np.ndarray:
        s = np.asarray(states, dtype=np.float64)[:, self.active]
        return (2.0 * (s - self.low[self.active]) / self.width - 1.0).astype(np.float32)

    def _from_norm(self, z: np.ndarray) -> np.ndarray:
        n = z.shape[0]
        out = np.broadcast_to(self.low, (n, self.low.size)).copy()
        z = np.clip(np.asarray(z, dtype=np.float64), -1.0, 1.0)
        out[:, self.active] = self.low[self.active] + (z + 1.0) / 2.0 * self.width
        return self.scenario.project(np.clip(out, self.low, self.high))

    def _seed_states(self, n: int) -> np.ndarray:
        if self.init == "uniform":
            states = self.scenario.sample_uniform(self.rng, n)
        else:
            states = self.scenario.sample(self.rng, n)
        # a scenario's reset distribution may exceed bounds narrowed by the user: clip into them
        return np.clip(np.asarray(states, dtype=np.float64), self.low, self.high)

    # -- guidance -------------------------------------------------------------------------------
    def guidance(self) -> np.ndarray:
        """Guidance score g ∈ [0, 1] of every training case (weighted mean of the metrics)."""
        wsum = self.novelty_weight + self.criticality_weight
        if wsum <= 0:
            return np.zeros(self.data_nov.size)
        return (self.novelty_weight * self.data_nov + self.criticality_weight * self.data_crit) / wsum

    def training_weights(self) -> np.ndarray:
        """Sampling weight of every training case in a minibatch: ∝ exp(scale · g)."""
        g = self.guidance()
        start = 0 if self.train_window is None else max(g.size - self.train_window, 0)
        w = np.zeros(g.size)
        if g.size > start:
            w[start:] = np.exp(self.guidance_scale * (g[start:] - g[start:].max()))
        return w

    def _cells(self, obs: np.ndarray) -> np.ndarray:
        k = self.grid_intervals
        obs = np.clip(np.nan_to_num(np.asarray(obs, dtype=np.float64), nan=0.0), -1e12, 1e12)
        idx = np.floor((obs - self._grid_lo) / (self._grid_hi - self._grid_lo) * k)
        return np.clip(idx, 0, k - 1).astype(np.int64)

    def _fit_grid(self, terminal: np.ndarray) -> None:
        """Grid bounds from the first observed terminal states, widened by ``grid_margin``."""
        t = np.clip(np.nan_to_num(np.asarray(terminal, dtype=np.float64), nan=0.0), -1e12, 1e12)
        lo, hi = t.min(axis=0), t.max(axis=0)
        rng = hi - lo
        pad = np.where(rng > 1e-9, self.grid_margin * rng, np.maximum(0.1 * np.abs(lo), 1e-3))
        self._grid_lo, self._grid_hi = lo - pad, hi + pad

    # -- training / generation -----------------------------------------------------------------
    def train(self, steps: int) -> float:
        """``steps`` AdamW steps on guidance-weighted minibatches of the training set."""
        if steps <= 0 or self.data_x.shape[0] == 0 or self.active.size == 0:
            return float("nan")
        t0 = time.perf_counter()
        gen = _torch_gen(self.rng)
        x = torch.from_numpy(self.data_x)
        w = torch.from_numpy(self.training_weights())
        with _torch_threads(self.num_threads):
            self.last_loss = self.ddpm.fit(x, w, steps, self.batch_size, self.opt, gen)
        self.trained_rounds += 1
        self.since_train = 0
        self.pool = self.pool[:0]
        self.time_train += time.perf_counter() - t0
        return self.last_loss

    def generate(self, n: int) -> np.ndarray:
        """n fresh samples of the current model, in scenario coordinates (always valid)."""
        if self.active.size == 0:
            return self._from_norm(np.zeros((n, 0), np.float32))
        t0 = time.perf_counter()
        with _torch_threads(self.num_threads):
            z = self.ddpm.sample(n, _torch_gen(self.rng)).numpy()
        self.time_sample += time.perf_counter() - t0
        return self._from_norm(z)

    def _generated(self, n: int) -> np.ndarray:
        if self.active.size == 0:
            return self._from_norm(np.zeros((n, 0), np.float32))
        if self.pool.shape[0] < n:
            t0 = time.perf_counter()
            k = max(n - self.pool.shape[0], self.sample_batch)
            with _torch_threads(self.num_threads):
                z = self.ddpm.sample(k, _torch_gen(self.rng)).numpy()
            self.pool = np.concatenate([self.pool, z.astype(np.float32)])
            self.time_sample += time.perf_counter() - t0
        z, self.pool = self.pool[:n], self.pool[n:]
        return self._from_norm(z)

    # -- the Fuzzer interface --------------------------------------------------------------------
    def propose(self, n: int) -> Proposal:
        n = int(n)
        gen_no = self.generation
        self.generation += 1
        if self.phase == "sampling" or self.data_x.shape[0] == 0:
            states = self._seed_states(n)
            src = np.zeros(n, dtype=np.int64)
        else:
            if self.trained_rounds == 0 or self.since_train >= self.retrain_every:
                self.train(self.warmup_steps if self.trained_rounds == 0 else self.train_steps)
            n_rand = int(self.rng.binomial(n, self.random_fraction)) if self.random_fraction > 0 else 0
            parts, src = [], []
            if n - n_rand > 0:
                parts.append(self._generated(n - n_rand))
                src.append(np.ones(n - n_rand, dtype=np.int64))
            if n_rand > 0:
                parts.append(self._seed_states(n_rand))
                src.append(np.full(n_rand, 2, dtype=np.int64))
            states = np.concatenate(parts) if parts else np.zeros((0, self.scenario.state_dim))
            src = np.concatenate(src) if src else np.zeros(0, dtype=np.int64)
        states = self.scenario.validate(np.asarray(states, dtype=np.float64).reshape(n, self.scenario.state_dim))
        kind = np.array([_SOURCES[i] for i in src], dtype="<U9")
        return Proposal(states, {"kind": kind, "generation": np.full(n, gen_no, dtype=np.int64)})

    def observe(self, proposal: Proposal, feedback: Feedback) -> None:
        n = len(proposal)
        if n == 0:
            return
        t0 = time.perf_counter()
        terminal = np.stack([np.asarray(o, dtype=np.float64)[-1] for o in feedback.traj_obs])
        if self._grid_lo is None:
            self._fit_grid(terminal)
        cells = self._cells(terminal)
        returns = np.asarray(feedback.returns, dtype=np.float64)
        failure = np.asarray(feedback.failure, dtype=bool)
        nov = np.empty(n)
        for i in range(n):  # serial semantics: a cell's count includes earlier cases of the batch
            key = tuple(int(c) for c in cells[i])
            c = self.cell_counts.get(key, 0) + 1
            self.cell_counts[key] = c
            nov[i] = math.exp(-(c - 1))
            if failure[i]:
                self.failure_cells.add(key)
        fin = returns[np.isfinite(returns)]
        if fin.size:
            self.ret_min, self.ret_max = min(self.ret_min, fin.min()), max(self.ret_max, fin.max())
        span = self.ret_max - self.ret_min
        norm_r = (returns - self.ret_min) / span if span > 0 else np.full(n, 0.5)
        crit = np.where(failure, 1.0, 1.0 - np.clip(np.nan_to_num(norm_r, nan=0.5), 0.0, 1.0))
        self.data_x = np.concatenate([self.data_x, self._to_norm(proposal.states)])
        self.data_nov = np.concatenate([self.data_nov, nov])
        self.data_crit = np.concatenate([self.data_crit, crit])
        self.since_train += n
        self.n_failures += int(failure.sum())
        self._last_novelty = float(nov.mean())
        self.time_observe += time.perf_counter() - t0

    # -- logging / snapshots -------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "generation": self.generation,
            "phase": self.phase,
            "train_cases": int(self.data_x.shape[0]),
            "train_rounds": self.trained_rounds,
            "loss": self.last_loss,
            "terminal_cells": len(self.cell_counts),
            "failure_cells": len(self.failure_cells),
            "failures": self.n_failures,
            "mean_novelty_last": self._last_novelty,
            "mean_guidance": float(self.guidance().mean()) if self.data_nov.size else float("nan"),
            "time_train_s": self.time_train,
            "time_sample_s": self.time_sample,
            "time_observe_s": self.time_observe,
        }

    def state_dict(self) -> dict:
        d = super().state_dict()
        d.update(
            model=copy.deepcopy(self.model.state_dict()),
            opt=copy.deepcopy(self.opt.state_dict()),
            data_x=self.data_x.copy(), data_nov=self.data_nov.copy(), data_crit=self.data_crit.copy(),
            cell_counts=dict(self.cell_counts), failure_cells=set(self.failure_cells),
            ret_min=self.ret_min, ret_max=self.ret_max, pool=self.pool.copy(),
            grid_lo=None if self._grid_lo is None else self._grid_lo.copy(),
            grid_hi=None if self._grid_hi is None else self._grid_hi.copy(),
            trained_rounds=self.trained_rounds, since_train=self.since_train, generation=self.generation,
            n_failures=self.n_failures, last_loss=self.last_loss, last_novelty=self._last_novelty,
            times=(self.time_train, self.time_sample, self.time_observe),
        )
        return d

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(copy.deepcopy(state["model"]))
        self.opt.load_state_dict(copy.deepcopy(state["opt"]))
        self.data_x, self.data_nov = state["data_x"].copy(), state["data_nov"].copy()
        self.data_crit = state["data_crit"].copy()
        self.cell_counts, self.failure_cells = dict(state["cell_counts"]), set(state["failure_cells"])
        self.ret_min, self.ret_max, self.pool = state["ret_min"], state["ret_max"], state["pool"].copy()
        self._grid_lo = None if state["grid_lo"] is None else state["grid_lo"].copy()
        self._grid_hi = None if state["grid_hi"] is None else state["grid_hi"].copy()
        self.trained_rounds, self.since_train = state["trained_rounds"], state["since_train"]
        self.generation, self.n_failures = state["generation"], state["n_failures"]
        self.last_loss, self._last_novelty = state["last_loss"], state["last_novelty"]
        self.time_train, self.time_sample, self.time_observe = state["times"]
