"""The ACAS Xu DNN agent under test, batched in numpy.

``python:workers.acasxu_policy:AcasXuDNN`` (or ``python:workers/acasxu_policy.py:AcasXuDNN``)
is a stateless policy for the ``ACASXu`` scenario. An observation row is
(ρ, θ, ψ, v_own, v_int, previous advisory); the action is the advisory 0..4 (COC, weak left,
weak right, strong left, strong right).

The 45 public ``run2a`` networks (``ACASXU_run2a_<prev 1..5>_<tau 1..9>_batch_2000.onnx``) are
read with ``onnx.numpy_helper`` from ``$DELTARL_ACASXU_DIR``, by default the
``shared/data/acasxu`` folder next to the repository root. Each is a 5-50-50-50-50-50-50-5 ReLU
MLP (``MatMul(W, x) + B``) in float32. Per row, the network of the previous advisory (and of
``tau``: by default tau index 1, the ``<prev>_2`` files, the set MDPFuzz and LLMTester load with
``read_onnx(prev, 2)``) scores the 5 advisories; the advisory taken is the argmin.

Input normalisation: the ONNX files hold no normalisation nodes or metadata (checked by
:func:`load_networks`: the graph must be exactly MatMul/Add/Relu), so the standard ACAS Xu
constants of the network release are used: ``(x − MEANS) / RANGES`` with means
(19791.091, 0, 0, 650, 600) and ranges (60261, 2π, 2π, 1100, 1200). The output scaling of the
release (a positive affine map) does not change the argmin and is not applied. The peers run a
network at every step whatever the separation; ``coc_beyond`` (off by default) instead answers
clear-of-conflict beyond a separation without running a network.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController

from workers.resources import acasxu_dir

MEANS = np.array([19791.091, 0.0, 0.0, 650.0, 600.0], dtype=np.float32)
RANGES = np.array([60261.0, 6.28318530718, 6.28318530718, 1100.0, 1200.0], dtype=np.float32)
RHO_MAX = 60760.0  # the networks' input domain of rho (the coc_beyond option's usual value)
TAU = 1  # the default tau index: the <prev>_2 files, MDPFuzz's set
N_PREV, N_TAU, N_LAYERS = 5, 9, 7
_OPS = ["MatMul", "Add", "Relu"] * (N_LAYERS - 1) + ["MatMul", "Add"]


class AcasXuError(FileNotFoundError):
    """The ACAS Xu networks cannot be found or read."""


def default_dir() -> Path:
    """``$DELTARL_ACASXU_DIR``, else the networks beside the checkout (:func:`workers.resources.acasxu_dir`)."""
    return acasxu_dir()


def network_path(directory: Path, prev: int, tau: int) -> Path:
    """File of the network for previous advisory ``prev`` (0..4) and tau index ``tau`` (0..8)."""
    return Path(directory) / f"ACASXU_run2a_{prev + 1}_{tau + 1}_batch_2000.onnx"


def _read_mlp(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    g = model.graph
    ops = [n.op_type for n in g.node]
    if ops != _OPS:
        raise AcasXuError(f"{path}: expected the ACAS Xu MLP (MatMul/Add/Relu x6, MatMul/Add), found nodes {ops}")
    init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    layers = []
    for k in range(N_LAYERS):
        mm, add = g.node[3 * k], g.node[3 * k + 1]
        w, b = init[mm.input[0]], init[add.input[1]]
        layers.append((np.asarray(w, dtype=np.float32), np.asarray(b, dtype=np.float32)))
    return layers


def load_networks(directory: str | Path | None = None):
    """The 45 networks as stacked weights: a list of 7 ``(W, B)`` with W of shape
    (5, 9, out, in) and B (5, 9, out), indexed [prev advisory, tau]."""
    d = Path(directory) if directory is not None else default_dir()
    if not d.is_dir():
        raise AcasXuError(
            f"ACAS Xu networks not found: {d} is not a directory. Set DELTARL_ACASXU_DIR to the folder "
            f"holding ACASXU_run2a_<prev>_<tau>_batch_2000.onnx (default: {_default_text()})"
        )
    missing = [network_path(d, p, t).name for p in range(N_PREV) for t in range(N_TAU)
               if not network_path(d, p, t).is_file()]
    if missing:
        raise AcasXuError(
            f"ACAS Xu networks missing in {d}: {len(missing)} of 45 files, e.g. {missing[0]}. Set "
            f"DELTARL_ACASXU_DIR to the folder holding all 45 (default: {_default_text()})"
        )
    nets = [[_read_mlp(network_path(d, p, t)) for t in range(N_TAU)] for p in range(N_PREV)]
    return [
        (np.stack([np.stack([nets[p][t][k][0] for t in range(N_TAU)]) for p in range(N_PREV)]),
         np.stack([np.stack([nets[p][t][k][1] for t in range(N_TAU)]) for p in range(N_PREV)]))
        for k in range(N_LAYERS)
    ]


def _default_text() -> str:
    return f"$DELTARL_ACASXU_DIR or {acasxu_dir()}"


class AcasXuDNN:
    """The ACAS Xu DNN policy: ``act(obs)`` maps (n, 6) observations to (n,) advisories.

    ``directory``: where the 45 ONNX files are (default :func:`default_dir`). ``tau``: the tau
    index of the networks used (default 1 = the ``<prev>_2`` files, MDPFuzz's set; 0 = the
    ``<prev>_1`` files). ``coc_beyond``: separation above which the advisory is COC without
    consulting a network (default None: always consult, as the peers).
    """

    def __init__(self, directory: str | Path | None = None, tau: int = TAU, coc_beyond: float | None = None,
                 blas_threads: int | None = 1):
        if not 0 <= int(tau) < N_TAU:
            raise ValueError(f"tau index must be in 0..{N_TAU - 1}, got {tau}")
        self.directory = Path(directory) if directory is not None else default_dir()
        self.all_layers = load_networks(self.directory)
        self.tau = int(tau)
        self.coc_beyond = coc_beyond
        # the layers are small (50x50): BLAS threads only add synchronisation, and on a busy
        # machine spinning threads made a rollout 10x slower; None leaves BLAS alone
        self.blas_threads = blas_threads
        self._blas = ThreadpoolController() if blas_threads is not None else None
        # the networks in use, per layer: W transposed (5 prev, in, out) and B (5 prev, out)
        self.layers = [(np.ascontiguousarray(np.swapaxes(w[:, self.tau], 1, 2)), b[:, self.tau].copy())
                       for w, b in self.all_layers]

    def scores(self, inputs: np.ndarray, prev: np.ndarray, tau: int | None = None) -> np.ndarray:
        """Raw network outputs (n, 5) for un-normalised ACAS inputs (n, 5) = (ρ, θ, ψ, v_own,
        v_int), each row through the network of its previous advisory ``prev`` (n,) in 0..4
        (and of tau index ``tau``, default the agent's)."""
        layers = self.layers
        if tau is not None and int(tau) != self.tau:
            layers = [(np.swapaxes(w[:, int(tau)], 1, 2), b[:, int(tau)]) for w, b in self.all_layers]
        x = (np.asarray(inputs, dtype=np.float32) - MEANS) / RANGES
        prev = np.asarray(prev, dtype=np.int64)
        if self._blas is None:
            return self._forward(layers, x, prev)
        with self._blas.limit(limits=self.blas_threads, user_api="blas"):
            return self._forward(layers, x, prev)

    @staticmethod
    def _forward(layers, x, prev):
        out = np.empty((x.shape[0], 5), dtype=np.float32)
        for p in np.unique(prev):
            rows = np.flatnonzero(prev == p)
            h = x[rows]
            for k, (w, b) in enumerate(layers):
                h = h @ w[p] + b[p]
                if k < N_LAYERS - 1:
                    h = np.maximum(h, 0.0)
            out[rows] = h
        return out

    def act(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.float32).reshape(-1, 6)
        prev = np.rint(obs[:, 5]).astype(np.int64)
        if prev.size and (prev.min() < 0 or prev.max() > 4):
            raise ValueError(f"previous advisory (observation column 5) must be in 0..4, got {prev.min()}..{prev.max()}")
        a = np.argmin(self.scores(obs[:, :5], prev), axis=1).astype(np.int64)
        if self.coc_beyond is not None:
            a[obs[:, 0] > self.coc_beyond] = 0
        return a


class AlwaysCOC:
    """A baseline that never manoeuvres (clear-of-conflict every step)."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(np.asarray(obs).reshape(-1, 6)), dtype=np.int64)


def export_torchscript(path: str | Path, directory: str | Path | None = None, tau: int = TAU,
                       coc_beyond: float | None = None) -> Path:
    """Write the agent as a TorchScript module (``policy.pt`` of the zoo entry, so that
    ``zoo:ACASXu`` resolves): (n, 6) float32 observations -> (n,) int64 advisories, the same
    networks, normalisation and COC rule as :class:`AcasXuDNN`."""
    import json

    import torch

    agent = AcasXuDNN(directory, tau=tau, coc_beyond=coc_beyond)

    class _AcasXuModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for k, (w, b) in enumerate(agent.layers):
                self.register_buffer(f"w{k}", torch.from_numpy(np.ascontiguousarray(w)))
                self.register_buffer(f"b{k}", torch.from_numpy(np.ascontiguousarray(b)))
            self.register_buffer("means", torch.from_numpy(MEANS.copy()))
            self.register_buffer("ranges", torch.from_numpy(RANGES.copy()))
            self.rho_max = float(coc_beyond) if coc_beyond is not None else float("inf")

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            x = (obs[:, :5] - self.means) / self.ranges
            prev = torch.round(obs[:, 5]).long()
            ws = [self.w0, self.w1, self.w2, self.w3, self.w4, self.w5, self.w6]
            bs = [self.b0, self.b1, self.b2, self.b3, self.b4, self.b5, self.b6]
            scores = torch.zeros(obs.shape[0], 5, dtype=obs.dtype, device=obs.device)
            for p in range(5):
                rows = torch.nonzero(prev == p).squeeze(1)
                h = x.index_select(0, rows)
                for k in range(7):
                    h = h @ ws[k][p] + bs[k][p]
                    if k < 6:
                        h = torch.relu(h)
                scores.index_copy_(0, rows, h)
            a = torch.argmin(scores, dim=1)
            return torch.where(obs[:, 0] > self.rho_max, torch.zeros_like(a), a)

    import warnings

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"kind": "discrete", "obs_dim": 6, "n": 5})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit")
        scripted = torch.jit.script(_AcasXuModule().eval())
        torch.jit.save(scripted, str(path), _extra_files={"deltarl.json": meta})
    return path
