"""Random Network Distillation (Burda et al., 2019): a novelty score for the states an AUT visits.

Two MLPs of the same shape read a (normalised) state: the *target* T has random weights that
never change; the *predictor* P is trained to reproduce T's output on the states seen so far.
The novelty of a state is the prediction error ``‖T(s) − P(s)‖²`` (squared L2 norm over the
output units): low where P has been trained (and, since both nets are continuous functions, near
such states), high in unexplored regions. A trajectory's novelty is the mean over its states
(Delta paper, Eq. 3; CureFuzz's curiosity).

Inputs are standardised with running statistics of every state passed to
:meth:`RND.update_normalizer` (mean/variance over all states ever seen, merged exactly, so the
mapping settles as data accumulates), then clipped to ``±clip``: the same network works for
CartPole's metre-scale and Hopper's velocity-scale observations.

Determinism: the weights are drawn from a ``torch.Generator`` seeded with ``seed`` and the
minibatches from a ``numpy`` generator seeded with it too; nothing touches torch's global RNG.
:meth:`state_dict` holds the weights, the Adam state, the normaliser and the minibatch RNG, so a
restored RND continues exactly. Pure CPU, float32; ``torch.set_num_threads`` is the caller's.
The predictor's gradient and its Adam update are written out by hand (see :meth:`RND.train`):
for a network this small the autograd/optimizer overhead would cost more than the arithmetic.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import torch
import torch.nn.functional as F

_CHUNK = 65536  # rows per forward pass when scoring many states


def evenly_spaced(trajectories, max_states: int) -> list:
    """Each trajectory thinned to at most ``max_states`` rows, evenly spaced along it with the
    first and the last kept (``max_states <= 0``: unchanged). Consecutive states of a control
    episode are strongly correlated, so the mean novelty of the thinned trajectory estimates
    the mean over all its states at a fraction of the cost."""
    out = []
    for t in trajectories:
        t = np.asarray(t)
        if max_states > 0 and t.shape[0] > max_states:
            t = t[_spaced_index(t.shape[0], int(max_states))]
        out.append(t)
    return out


@functools.lru_cache(maxsize=4096)
def _spaced_index(length: int, k: int) -> np.ndarray:
    idx = np.round(np.linspace(0, length - 1, k)).astype(np.int64)
    idx.flags.writeable = False  # shared by the cache
    return idx


def _as_hidden(hidden) -> tuple[int, ...]:
    if isinstance(hidden, (int, np.integer)):
        hidden = (int(hidden),)
    hidden = tuple(int(h) for h in hidden)
    if not hidden or min(hidden) < 1:
        raise ValueError(f"RND hidden sizes must be positive integers, got {hidden!r}")
    return hidden


class RND:
    """Fixed random target MLP, trainable predictor MLP, running input normalisation.

    ``input_dim``: state (observation) size. ``hidden``: hidden layer sizes of both nets (ReLU),
    ``out_dim``: embedding size. ``lr``: Adam learning rate of the predictor. ``l2``: coefficient
    of the L2 penalty ``Σ‖θ‖²`` on the predictor's parameters (CureFuzz regularises the
    predictor to keep it from overfitting). ``batch_size``: states per training step (drawn
    uniformly from the states given to :meth:`train`). ``clip``: normalised inputs are clipped
    to ``±clip``. ``seed``: integer seed of the weights and the minibatch draws.
    """

    def __init__(self, input_dim: int, *, hidden=(64,), out_dim: int = 16, lr: float = 1e-3,
                 l2: float = 1e-4, batch_size: int = 1024, clip: float = 5.0, seed: int = 0):
        self.input_dim = int(input_dim)
        self.hidden = _as_hidden(hidden)
        self.out_dim = int(out_dim)
        self.lr, self.l2, self.clip = float(lr), float(l2), float(clip)
        self.batch_size = int(batch_size)
        if self.input_dim < 1 or self.out_dim < 1 or self.batch_size < 1:
            raise ValueError("RND needs input_dim, out_dim and batch_size >= 1")
        if not (self.lr > 0 and self.l2 >= 0 and self.clip > 0):
            raise ValueError("RND needs lr > 0, l2 >= 0, clip > 0")
        self.seed = int(seed)
        gen = torch.Generator().manual_seed(self.seed)
        sizes = (self.input_dim, *self.hidden, self.out_dim)
        # target: He-normal weights, biases U(-1, 1) so its ReLU kinks cut through the
        # (standardised) data region; fixed for ever (plain tensors, no gradient)
        self.target = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            w = torch.randn(fan_out, fan_in, generator=gen) * np.sqrt(2.0 / fan_in)
            b = torch.rand(fan_out, generator=gen) * 2.0 - 1.0
            self.target += [w, b]
        # predictor: same shape, PyTorch's default Linear initialisation U(±1/sqrt(fan_in))
        self.predictor = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / np.sqrt(fan_in)
            w = (torch.rand(fan_out, fan_in, generator=gen) * 2.0 - 1.0) * bound
            b = (torch.rand(fan_out, generator=gen) * 2.0 - 1.0) * bound
            self.predictor += [w, b]
        # Adam state of the predictor (first and second moments, step count)
        self._adam_m = [torch.zeros_like(p) for p in self.predictor]
        self._adam_v = [torch.zeros_like(p) for p in self.predictor]
        self._adam_t = 0
        self.rng = np.random.default_rng(self.seed)
        # running normaliser (float64, exact merge of batch moments)
        self.count = 0
        self.mean = np.zeros(self.input_dim)
        self.m2 = np.zeros(self.input_dim)  # sum of squared deviations
        self.train_steps = 0
        self.last_loss = float("nan")

    # -- normalisation ---------------------------------------------------------------------
    def update_normalizer(self, states) -> None:
        """Merge the mean/variance of ``states`` (k, input_dim) into the running statistics."""
        x = self._check(states).astype(np.float64, copy=False)
        k = x.shape[0]
        if k == 0:
            return
        bmean = x.mean(axis=0)
        bm2 = ((x - bmean) ** 2).sum(axis=0)
        n = self.count + k
        delta = bmean - self.mean
        self.mean = self.mean + delta * (k / n)
        self.m2 = self.m2 + bm2 + delta ** 2 * (self.count * k / n)
        self.count = n

    @property
    def std(self) -> np.ndarray:
        if self.count < 2:
            return np.ones(self.input_dim)
        return np.sqrt(np.maximum(self.m2 / self.count, 1e-8))

    def normalize(self, states) -> np.ndarray:
        """``clip((s − mean) / std, ±clip)`` as float32 (identity before any statistics)."""
        x = self._check(states)
        if self.count == 0:
            return np.clip(x, -self.clip, self.clip).astype(np.float32)
        z = (x - self.mean) / self.std
        return np.clip(z, -self.clip, self.clip).astype(np.float32)

    # -- networks ----------------------------------------------------------------------------
    @staticmethod
    def _mlp(params, x: torch.Tensor) -> torch.Tensor:
        n_layers = len(params) // 2
        for i in range(n_layers):
            x = F.linear(x, params[2 * i], params[2 * i + 1])
            if i < n_layers - 1:
                x = torch.relu_(x)  # in place (a fresh tensor; no autograd here): the same values
        return x

    def _check(self, states) -> np.ndarray:
        x = np.asarray(states)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise ValueError(f"RND expects states of shape (k, {self.input_dim}), got {np.shape(states)}")
        return x

    def novelty(self, states) -> np.ndarray:
        """Per-state prediction error ``‖T(s) − P(s)‖²``, shape (k,), float64."""
        z = self.normalize(states)
        out = np.empty(z.shape[0])
        with torch.no_grad():
            for lo in range(0, z.shape[0], _CHUNK):
                x = torch.from_numpy(z[lo:lo + _CHUNK])
                err = self._mlp(self.target, x) - self._mlp(self.predictor, x)
                out[lo:lo + _CHUNK] = (err * err).sum(dim=1).double().numpy()
        return out

    def trajectory_novelty(self, trajectories) -> np.ndarray:
        """Mean per-state novelty of each trajectory (a list of (T_i, input_dim) arrays), one
        batched pass over all their states; an empty trajectory scores NaN."""
        trajectories = list(trajectories)
        if not trajectories:
            return np.zeros(0)
        lengths = np.array([np.shape(t)[0] for t in trajectories], dtype=np.int64)
        if lengths.sum() == 0:
            return np.full(len(trajectories), np.nan)
        return self.stacked_novelty(np.concatenate([self._check(t) for t in trajectories if len(t)], axis=0),
                                    lengths)

    def stacked_novelty(self, states, lengths) -> np.ndarray:
        """:meth:`trajectory_novelty` of trajectories given as one array of their states, one
        trajectory after the other, and their ``lengths`` (bit for bit the same: a caller that
        keeps its trajectories stacked saves concatenating them on every call)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.sum() == 0:
            return np.full(len(lengths), np.nan)
        per_state = self.novelty(states)
        sums = np.add.reduceat(per_state, np.concatenate([[0], np.cumsum(lengths)[:-1]])[lengths > 0])
        out = np.full(len(lengths), np.nan)
        out[lengths > 0] = sums / lengths[lengths > 0]
        return out

    # -- training ----------------------------------------------------------------------------
    def train(self, states, steps: int = 1) -> float:
        """``steps`` Adam steps on the predictor, each on ``batch_size`` states drawn uniformly
        (with replacement) from ``states`` (all of them when there are fewer); loss = mean
        squared error over the output units + ``l2``·Σ‖θ‖². Returns the last step's loss.

        The gradient is written out by hand (a small MLP) and Adam is applied in place: the
        same arithmetic as ``torch.optim.Adam`` on the autograd gradient, at a fraction of the
        per-step overhead, which dominates for networks this small."""
        z = self.normalize(states)
        k = z.shape[0]
        if k == 0 or steps < 1:
            return self.last_loss
        zt = torch.from_numpy(z)
        n_layers = len(self.predictor) // 2
        b1, b2, eps = 0.9, 0.999, 1e-8
        with torch.no_grad():
            full_target = self._mlp(self.target, zt) if k <= self.batch_size else None
            for step in range(int(steps)):
                if full_target is not None:
                    x, y = zt, full_target
                else:
                    idx = torch.from_numpy(self.rng.integers(0, k, size=self.batch_size))
                    x = zt[idx]
                    y = self._mlp(self.target, x)
                # forward, keeping each layer's input and pre-activation
                inputs, pre, h = [], [], x
                for i in range(n_layers):
                    inputs.append(h)
                    h = torch.addmm(self.predictor[2 * i + 1], h, self.predictor[2 * i].t())
                    if i < n_layers - 1:
                        pre.append(h)
                        h = torch.relu(h)
                err = h - y
                if step == steps - 1:  # report the last step's loss (before its update)
                    loss = float((err * err).mean())
                    if self.l2 > 0:
                        loss += self.l2 * float(sum((p * p).sum() for p in self.predictor))
                # backward
                g = err * (2.0 / err.numel())
                grads = [None] * len(self.predictor)
                for i in reversed(range(n_layers)):
                    grads[2 * i] = g.t() @ inputs[i]
                    grads[2 * i + 1] = g.sum(dim=0)
                    if i > 0:
                        g = (g @ self.predictor[2 * i]) * (pre[i - 1] > 0)
                # Adam (with the L2 term's gradient 2·l2·θ added to the loss gradient)
                self._adam_t += 1
                c1 = 1.0 - b1 ** self._adam_t
                c2 = 1.0 - b2 ** self._adam_t
                for p, gr, m, v in zip(self.predictor, grads, self._adam_m, self._adam_v):
                    if self.l2 > 0:
                        gr = gr.add(p, alpha=2.0 * self.l2)
                    m.mul_(b1).add_(gr, alpha=1.0 - b1)
                    v.mul_(b2).addcmul_(gr, gr, value=1.0 - b2)
                    p.addcdiv_(m, (v / c2).sqrt_().add_(eps), value=-self.lr / c1)
                self.train_steps += 1
        self.last_loss = loss
        return loss

    # -- snapshots ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "config": {"input_dim": self.input_dim, "hidden": self.hidden, "out_dim": self.out_dim,
                       "lr": self.lr, "l2": self.l2, "batch_size": self.batch_size, "clip": self.clip,
                       "seed": self.seed},
            "target": [t.detach().clone() for t in self.target],
            "predictor": [p.detach().clone() for p in self.predictor],
            "optimizer": {"step": self._adam_t, "m": [m.clone() for m in self._adam_m],
                          "v": [v.clone() for v in self._adam_v]},
            "rng": copy.deepcopy(self.rng.bit_generator.state),
            "count": self.count, "mean": self.mean.copy(), "m2": self.m2.copy(),
            "train_steps": self.train_steps, "last_loss": self.last_loss,
        }

    def load_state_dict(self, d: dict) -> None:
        cfg = d["config"]
        if (cfg["input_dim"], tuple(cfg["hidden"]), cfg["out_dim"]) != (self.input_dim, self.hidden, self.out_dim):
            raise ValueError(f"RND snapshot of shape {cfg['input_dim']}-{cfg['hidden']}-{cfg['out_dim']} does not "
                             f"fit this RND ({self.input_dim}-{self.hidden}-{self.out_dim})")
        with torch.no_grad():
            for t, s in zip(self.target, d["target"]):
                t.copy_(s)
            for p, s in zip(self.predictor, d["predictor"]):
                p.copy_(s)
            for m, s in zip(self._adam_m, d["optimizer"]["m"]):
                m.copy_(s)
            for v, s in zip(self._adam_v, d["optimizer"]["v"]):
                v.copy_(s)
        self._adam_t = int(d["optimizer"]["step"])
        self.rng.bit_generator.state = copy.deepcopy(d["rng"])
        self.count, self.mean, self.m2 = int(d["count"]), d["mean"].copy(), d["m2"].copy()
        self.train_steps, self.last_loss = int(d["train_steps"]), float(d["last_loss"])
