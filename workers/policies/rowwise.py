"""Many observations in one call, each row computed exactly as when it is alone (issue #15).

A deployed agent acts on one observation at a time, and a verdict must be about that agent
(docs/verdicts.md). Computing the rows of a batch one call each is exact but pays torch's per-call
cost on every row (44 us for the zoo Hopper agent); a batched call is cheap but not the same
computation: ``aten::linear`` on ``(n, k)`` runs a matrix-matrix kernel whose sums are ordered
differently from the matrix-vector kernel a single row gets, so actions differ in their last bits.

:class:`RowwiseGraph` runs a traced TorchScript graph (a TorchScript agent, d3rlpy's greedy graph,
an SB3 policy's ``_predict`` traced in memory) on many rows with every ``aten::linear`` done as a
batched matrix product of ``n`` one-row products (``baddbmm`` of ``(n, 1, k)`` rows by the
weights): on this CPU that is the one-row kernel per row, bit for bit, except for tiny layers
(in x out under about 400: 64 -> 4, 4 -> 64), which get one ``addmv`` per row, as a one-row
``linear`` does; each layer's way is chosen by comparison at load (:class:`_RowwiseLinear`). Every other
operation of the graph works per element or per row. The rows go through in chunks of fixed
sizes (:data:`CHUNKS`, 8 to 64 rows, the cheapest cover of the rows; the last chunk padded with
zero rows), so the kernels only ever see shapes that were checked.

Nothing is assumed: :func:`rowwise_or_none` accepts a graph only if, for every chunk size, the
chunked result equals the model called on each row by itself, bit for bit, on probe batches
(random rows at two scales, so every position of a chunk is compared). A graph that fails the
check, uses an operation outside the interpreter (control flow, calls) or mixes rows is refused,
and the policy keeps its exact per-row loop. The check is strong evidence, not a proof: kernels
are chosen by shape (which the chunks fix), but an element-wise kernel whose vector and scalar
paths differ only on rare values could slip through; ``deltarl replay`` therefore always acts
through the per-row loop (``Policy.per_row_loop()``), an independent check of every verdict.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from workers import torch_compat

log = logging.getLogger(__name__)

CHUNKS = (8, 16, 32, 64)  # the only batch shapes a rowwise graph ever computes (each checked at load)
ALONE_BELOW = 3  # fewer rows than this: the per-row calls themselves (cheaper than a padded chunk)
CALL_ROWS = 7  # a chunk's fixed cost in rows (measured on the zoo Hopper and CartPole graphs: a chunk
#               of s rows costs about 30 + 4.4 s us, so a call is worth about 7 padded rows)


def _plans(top: int) -> list[tuple[int, ...]]:
    """For r = 0..top rows, the chunk sizes (from :data:`CHUNKS`) that cover them at the least
    cost ``calls * CALL_ROWS + rows computed`` (padding included)."""
    best: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for r in range(1, top + 1):
        best.append(min(((cost + CALL_ROWS + size, plan + (size,))
                         for size in CHUNKS for cost, plan in [best[max(r - size, 0)]]), key=lambda t: t[0]))
    return [plan for _, plan in best]


_PLANS = _plans(CHUNKS[-1])


class Unsupported(Exception):
    """The graph has an operation the interpreter does not run (the policy keeps its loop)."""


class _RowwiseLinear:
    """``aten::linear`` with each row's result the one-row call's. Two ways, chosen per chunk size
    on the first call (the load-time check) by comparing with ``F.linear`` on each row: a batched
    matrix product of one-row products (``baddbmm``; the one-row kernel per row where the layer is
    not tiny), else one ``addmv`` per row (what a one-row ``linear`` runs; layers like 64 -> 4)."""

    def __init__(self):
        self.way: dict[int, str] = {}

    def __call__(self, x, weight, bias=None):
        if x.dim() != 2:
            raise Unsupported(f"aten::linear on a {x.dim()}-D input")
        n = x.shape[0]
        way = self.way.get(n)
        if way is None:
            want = torch.cat([torch.nn.functional.linear(x[j:j + 1].clone(), weight, bias) for j in range(n)])
            for way in ("bmm", "mv"):
                if torch.equal(self._run(way, x, weight, bias), want):
                    break
            else:
                raise Unsupported(f"a {tuple(weight.shape)} linear layer with no row-exact batched form")
            self.way[n] = way
        return self._run(way, x, weight, bias)

    @staticmethod
    def _run(way, x, weight, bias):
        n = x.shape[0]
        if way == "mv":
            if bias is None:
                return torch.stack([torch.mv(weight, x[j]) for j in range(n)])
            return torch.stack([torch.addmv(bias, weight, x[j]) for j in range(n)])
        w = weight.t().unsqueeze(0).expand(n, -1, -1)
        if bias is None:
            return torch.bmm(x.unsqueeze(1), w).squeeze(1)
        return torch.baddbmm(bias.expand(n, 1, -1), x.unsqueeze(1), w).squeeze(1)


# operations that would mix rows or order sums by batch shape (a plain matrix product): refused
_REFUSED = {"aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::einsum",
            "aten::conv1d", "aten::conv2d", "aten::_convolution", "aten::batch_norm"}


def _aten_op(node):
    """The overload a node's schema names, called with its keyword-only arguments by name
    (resolved once, not at each call)."""
    n_args, kw = torch_compat.schema_arguments(node.schema())
    name = node.schema().split("(", 1)[0]  # e.g. "aten::mean.dim"
    base, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, base.split("::", 1)[1]), overload or "default")
    if not kw:
        return op
    npos = n_args - len(kw)

    def call(*args):
        return op(*args[:npos], **dict(zip(kw, args[npos:])))
    return call


class RowwiseGraph:
    """A traced TorchScript graph interpreted op by op, ``aten::linear`` done row by row (module
    docstring). ``owner`` is the ScriptModule whose graph takes ``self`` first (None for a traced
    function). Call it on a tensor of rows; returns what the graph returns for those rows."""

    def __init__(self, graph, owner=None, alone=None):
        g = graph  # inlined (``inlined_graph``): no calls left
        self.alone = alone  # the model on one row (what the check compared with; it takes batches of 1-2 rows)
        ins = list(g.inputs())
        self._self = ins[0] if owner is not None else None
        if owner is not None:
            ins = ins[1:]
        if len(ins) != 1:
            raise Unsupported(f"a graph of {len(ins)} inputs")
        self._input, self._owner = ins[0], owner
        self._steps = []  # (function, input values, output values, unpack)
        self._consts = {}
        for node in g.nodes():
            kind = node.kind()
            outs = list(node.outputs())
            if kind == "prim::Constant":
                self._consts[outs[0]] = outs[0].toIValue()
            elif kind == "prim::GetAttr":
                attr = node.s("name")
                self._steps.append((lambda obj, _a=attr: getattr(obj, _a), list(node.inputs()), outs, False))
            elif kind == "prim::ListConstruct":
                self._steps.append((lambda *xs: list(xs), list(node.inputs()), outs, False))
            elif kind == "prim::TupleConstruct":
                self._steps.append((lambda *xs: tuple(xs), list(node.inputs()), outs, False))
            elif kind in ("prim::TupleUnpack", "prim::ListUnpack"):
                self._steps.append((lambda xs: tuple(xs), list(node.inputs()), outs, True))
            elif kind in ("prim::NumToTensor", "aten::Int", "aten::Float"):  # a size carried as a number
                self._steps.append((lambda v: v if isinstance(v, (int, float)) else v.item(), list(node.inputs()),
                                    outs, False))
            elif kind == "aten::size":
                self._steps.append((lambda x, *d: x.size(*d), list(node.inputs()), outs, False))
            elif kind == "aten::linear":
                self._steps.append((_RowwiseLinear(), list(node.inputs()), outs, False))
            elif kind in _REFUSED or not kind.startswith("aten::"):
                raise Unsupported(kind)
            else:
                try:
                    op = _aten_op(node)
                except (AttributeError, RuntimeError) as e:
                    raise Unsupported(f"{kind} ({e})") from e
                self._steps.append((op, list(node.inputs()), outs, len(outs) > 1))
        self._outputs = list(g.outputs())

    def run(self, x: torch.Tensor):
        """The graph on ``x`` as one chunk (its rows computed as the interpreter computes them)."""
        env = dict(self._consts)
        env[self._input] = x
        if self._self is not None:
            env[self._self] = self._owner
        for fn, ins, outs, unpack in self._steps:
            y = fn(*[env[v] for v in ins])
            if unpack:
                for o, v in zip(outs, y):
                    env[o] = v
            else:
                env[outs[0]] = y
        out = [env[v] for v in self._outputs]
        return out[0] if len(out) == 1 else tuple(out)

    def __call__(self, x: torch.Tensor):
        """All rows of ``x`` in chunks of :data:`CHUNKS` (zero rows pad the last); the model itself
        (``alone``) takes the rows of a batch too small for a chunk."""
        n = x.shape[0]
        if n < ALONE_BELOW and self.alone is not None:
            return _stack([self.alone(x[j:j + 1].clone()) for j in range(n)])
        full = (n // CHUNKS[-1]) * CHUNKS[-1]
        sizes = [CHUNKS[-1]] * (n // CHUNKS[-1]) + sorted(_PLANS[n - full], reverse=True)
        parts, i = [], 0
        for size in sizes:
            take = min(size, n - i)
            chunk = x[i:i + take]
            if take < size:
                chunk = torch.cat([chunk, chunk.new_zeros((size - take, *chunk.shape[1:]))])
            parts.append(_slice(self.run(chunk), take))
            i += take
        return _stack(parts)


def _slice(y, k):
    if isinstance(y, torch.Tensor):
        return y[:k]
    return tuple(_slice(v, k) for v in y)


def _stack(parts):
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts) if len(parts) > 1 else first
    return tuple(_stack([p[i] for p in parts]) for i in range(len(first)))


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(_equal(x, y) for x, y in zip(a, b))
    return False


def rowwise_or_none(graph, alone, obs_shape, owner=None, dtype=torch.float32) -> RowwiseGraph | None:
    """A :class:`RowwiseGraph` of ``graph`` if, for every chunk size, it gives what ``alone`` (the
    model called on a batch of one, as deployed) gives on each row of probe batches, bit for bit;
    else None. ``graph``: a traced module's or function's ``inlined_graph``; ``obs_shape``: one
    observation's shape."""
    if os.environ.get("DELTARL_ROWWISE", "1") == "0":  # the escape hatch: every policy keeps its per-row loop
        return None
    try:
        rw = RowwiseGraph(graph, owner, alone)
    except Unsupported:
        return None
    except Exception as exc:  # noqa: BLE001 - a graph the interpreter cannot read keeps the loop
        log.debug("graph not interpreted row-wise (%s: %s): the per-row loop", type(exc).__name__, exc)
        return None
    rng = np.random.default_rng(0)
    try:
        with torch.inference_mode():
            for size in CHUNKS:
                for scale in (1.0, 10.0):
                    probe = torch.from_numpy(rng.normal(scale=scale, size=(size, *obs_shape)).astype(np.float32))
                    probe = probe.to(dtype)
                    got = rw.run(probe)
                    want = _stack([alone(probe[j:j + 1].clone()) for j in range(size)])
                    if not _equal(got, want):
                        return None
    except Exception as exc:  # noqa: BLE001 - an operation that fails at run time: the loop
        log.debug("row-wise graph failed on its probes (%s: %s): the per-row loop", type(exc).__name__, exc)
        return None
    return rw
