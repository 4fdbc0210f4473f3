"""Exporters: a seeded MLP as TorchScript or ONNX with deltarl metadata (benchmarks, tests and
examples use them to make policies of a known shape).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import warnings

import numpy as np
import torch

from workers.policies.base import (
    _META_NAME,
)

log = logging.getLogger(__name__)


def _mlp_weights(obs_dim: int, out_dim: int, hidden, seed: int):
    """[(W (out, in) float32, b (out,) float32), ...] from ``numpy.random.default_rng(seed)``.

    Hidden layers: He-normal weights (std sqrt(2 / fan_in)); output layer: std 1 / sqrt(fan_in),
    so the outputs are O(1) and vary with the observation (a random Q-network uses every
    action instead of one dominated by the biases). Biases are small, U(-0.05, 0.05).
    """
    rng = np.random.default_rng(seed)
    sizes = [int(obs_dim), *[int(h) for h in hidden], int(out_dim)]
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        gain = 1.0 if i == len(sizes) - 2 else 2.0
        w = (rng.standard_normal(size=(fan_out, fan_in)) * np.sqrt(gain / fan_in)).astype(np.float32)
        b = rng.uniform(-0.05, 0.05, size=(fan_out,)).astype(np.float32)
        layers.append((w, b))
    return layers


def _squash_params(out_dim, discrete, action_low, action_high):
    """(scale, offset) float32 arrays so that action = offset + scale * tanh(y); None if discrete."""
    if discrete:
        return None
    low = -1.0 if action_low is None else action_low
    high = 1.0 if action_high is None else action_high
    low = np.broadcast_to(np.asarray(low, dtype=np.float32), (out_dim,))
    high = np.broadcast_to(np.asarray(high, dtype=np.float32), (out_dim,))
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high >= low)):
        raise ValueError("action_low/action_high must be finite with high >= low")
    scale = ((high - low) / 2.0).astype(np.float32)
    offset = ((high + low) / 2.0).astype(np.float32)
    return scale, offset, low, high


def _meta_json(obs_dim, out_dim, discrete, sq) -> str:
    if discrete:
        meta = {"kind": "discrete", "obs_dim": int(obs_dim), "n": int(out_dim)}
    else:
        meta = {"kind": "continuous", "obs_dim": int(obs_dim), "shape": [int(out_dim)],
                "low": [float(v) for v in sq[2]], "high": [float(v) for v in sq[3]]}
    return json.dumps(meta)


class _MLP(torch.nn.Module):
    def __init__(self, layers, squash):
        super().__init__()
        self.net = torch.nn.Sequential()
        for i, (w, b) in enumerate(layers):
            lin = torch.nn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w))
                lin.bias.copy_(torch.from_numpy(b))
            self.net.append(lin)
            if i < len(layers) - 1:
                self.net.append(torch.nn.ReLU())
        self.squash = squash is not None
        scale, offset = (squash[0], squash[1]) if squash is not None else (np.ones(1, np.float32), np.zeros(1, np.float32))
        self.register_buffer("scale", torch.from_numpy(np.array(scale, dtype=np.float32)))
        self.register_buffer("offset", torch.from_numpy(np.array(offset, dtype=np.float32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)
        if self.squash:
            y = self.offset + self.scale * torch.tanh(y)
        return y


def _build_mlp(obs_dim, out_dim, hidden, seed, discrete, action_low, action_high):
    layers = _mlp_weights(obs_dim, out_dim, hidden, seed)
    sq = _squash_params(int(out_dim), discrete, action_low, action_high)
    model = _MLP(layers, sq).eval()
    return model, layers, sq


def export_mlp_torchscript(path, obs_dim: int, out_dim: int, hidden=(256, 256), seed: int = 0,
                           discrete: bool = True, action_low=None, action_high=None) -> str:
    """Write a TorchScript MLP with seeded random weights to ``path``; return the path.

    Hidden layers use ReLU. Discrete: the output is ``out_dim`` Q-values (argmax = action).
    Continuous: ``offset + scale * tanh(y)``, i.e. actions inside ``[action_low, action_high]``
    (default ``[-1, 1]``). The action space is stored as metadata, so the file also loads
    without a scenario.
    """
    model, _, sq = _build_mlp(obs_dim, out_dim, hidden, seed, discrete, action_low, action_high)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit")
        scripted = torch.jit.script(model)
        torch.jit.save(scripted, path, _extra_files={_META_NAME: _meta_json(obs_dim, out_dim, discrete, sq)})
    return path


def export_mlp_onnx(path, obs_dim: int, out_dim: int, hidden=(256, 256), seed: int = 0,
                    discrete: bool = True, action_low=None, action_high=None) -> str:
    """The same network as :func:`export_mlp_torchscript` (same seed → same weights) as ONNX.

    Uses ``torch.onnx.export`` when ``onnxscript`` (needed by torch's exporter) is installed;
    otherwise builds the graph (Gemm/Relu[/Tanh/Mul/Add]) with ``onnx.helper`` from the same
    weights. Input ``obs`` (batch, obs_dim) float32, output ``out`` (batch, out_dim).
    """
    import onnx

    model, layers, sq = _build_mlp(obs_dim, out_dim, hidden, seed, discrete, action_low, action_high)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    meta = _meta_json(obs_dim, out_dim, discrete, sq)
    proto = None
    if importlib.util.find_spec("onnxscript") is not None:
        try:
            prog = torch.onnx.export(
                model, (torch.zeros(2, int(obs_dim)),), input_names=["obs"], output_names=["out"],
                dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True, external_data=False,
            )
            proto = prog.model_proto
        except Exception as exc:  # noqa: BLE001 - fall back to the hand-built graph
            log.debug("torch.onnx.export failed (%s: %s): the hand-built ONNX graph is written", type(exc).__name__, exc)
            proto = None
    if proto is None:
        proto = _onnx_graph(layers, sq, int(obs_dim), int(out_dim))
    entry = proto.metadata_props.add()
    entry.key, entry.value = _META_NAME, meta
    onnx.checker.check_model(proto)
    onnx.save(proto, path)
    return path


def _onnx_graph(layers, sq, obs_dim, out_dim):
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    cur = "obs"
    for i, (w, b) in enumerate(layers):
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(layers) - 1
        out = "out" if (last and sq is None) else f"h{i}"
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"b{i}"], [out], transB=1))
        cur = out
        if not last:
            nodes.append(helper.make_node("Relu", [cur], [f"r{i}"]))
            cur = f"r{i}"
    if sq is not None:
        inits += [numpy_helper.from_array(np.asarray(sq[0], np.float32), "scale"),
                  numpy_helper.from_array(np.asarray(sq[1], np.float32), "offset")]
        nodes += [helper.make_node("Tanh", [cur], ["t"]),
                  helper.make_node("Mul", ["t", "scale"], ["ts"]),
                  helper.make_node("Add", ["ts", "offset"], ["out"])]
    graph = helper.make_graph(
        nodes, "deltarl_mlp",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", out_dim])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="deltarl")
    model.ir_version = 8
    return model
