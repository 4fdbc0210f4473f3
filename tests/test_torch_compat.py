"""``workers.torch_compat``: each fallback (a torch without the private name) gives what the
private API gives, bit for bit, so that GMT's AdamW and the row-wise interpreter do not change
with the torch version."""

from __future__ import annotations

import warnings

import pytest
import torch

from workers import torch_compat

OPS = {  # name -> (call, the private function it stands for)
    "lerp_": (lambda ts, a, b: torch_compat.lerp_(ts, a, 0.1), "_foreach_lerp_"),
    "mul_": (lambda ts, a, b: torch_compat.mul_(ts, 0.999), "_foreach_mul_"),
    "div_": (lambda ts, a, b: torch_compat.div_(ts, 0.3), "_foreach_div_"),
    "add_": (lambda ts, a, b: torch_compat.add_(ts, 1e-8), "_foreach_add_"),
    "addcmul_": (lambda ts, a, b: torch_compat.addcmul_(ts, a, b, 0.001), "_foreach_addcmul_"),
    "addcdiv_": (lambda ts, a, b: torch_compat.addcdiv_(ts, a, b, -1e-3), "_foreach_addcdiv_"),
    "sqrt": (lambda ts, a, b: torch_compat.sqrt(ts), "_foreach_sqrt"),
}


def _tensors(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(shape, generator=g) + 0.1 for shape in ((7, 5), (5,), (3, 4, 2))]


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_foreach_fallback_gives_the_private_kernels_values(name, monkeypatch):
    call, private = OPS[name]
    assert hasattr(torch, private)  # the fast path exists in this torch: the comparison means something
    fast, slow = _tensors(0), _tensors(0)
    a, b = _tensors(1), _tensors(2)
    fast_out = call(fast, a, b)
    monkeypatch.delattr(torch, private)
    slow_out = call(slow, a, b)
    if fast_out is None:  # in place: the tensors themselves
        fast_out, slow_out = fast, slow
        assert not all(torch.equal(x, y) for x, y in zip(fast, _tensors(0)))  # the operation changed them
    assert len(fast_out) == len(slow_out) == 3
    for x, y in zip(fast_out, slow_out):
        assert torch.equal(x, y)


def test_gmts_adamw_takes_the_same_steps_without_the_private_kernels(monkeypatch):
    from orchestrator.fuzzers.gmt import AdamW

    def train() -> list:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        opt = AdamW(net.parameters(), lr=1e-2)
        x = torch.rand(16, 4, generator=torch.Generator().manual_seed(1))
        for _ in range(5):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
        return [p.detach().clone() for p in net.parameters()]

    fast = train()
    for name in [n for n in dir(torch) if n.startswith("_foreach_")]:
        monkeypatch.delattr(torch, name)
    slow = train()
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


SCHEMAS = [
    "aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
    "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",
    "aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
    "aten::clamp_(Tensor(a!) self, Scalar? min=None, Scalar? max=None) -> Tensor(a!)",
    "aten::softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",
    "aten::permute(Tensor(a) self, int[] dims) -> Tensor(a)",
    "aten::full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None) -> Tensor",
    "aten::sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
]


def test_the_schema_fallback_reads_what_parse_schema_reads(monkeypatch):
    with warnings.catch_warnings():  # torch.jit.trace is deprecated in torch 2.13; the zoo's graphs are traced
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(lambda x: torch.nn.functional.softmax(x.mean(dim=1, keepdim=True) - x, dim=-1),
                                 torch.rand(3, 4))
    schemas = SCHEMAS + [n.schema() for n in traced.inlined_graph.nodes() if n.kind().startswith("aten::")]
    want = [torch_compat.schema_arguments(s) for s in schemas]
    assert ("dtype" in want[0][1]) and want[1] == (3, []) and want[6][1] == ["dtype", "layout", "device", "pin_memory"]
    monkeypatch.delattr(torch._C, "parse_schema")
    assert [torch_compat.schema_arguments(s) for s in schemas] == want
