"""PyTorch's private APIs that deltarl uses, all in this one module.

* the ``torch._foreach_*`` list operations, one kernel launch (on a GPU) or one C++ loop (on a CPU)
  for a whole list of tensors: GMT's AdamW (:class:`orchestrator.fuzzers.gmt.AdamW`) steps with
  them because the stock optimizer's Python overhead outweighs the tiny denoiser's own work;
* ``torch._C.parse_schema``, which reads an operator's schema (its arguments, which of them are
  keyword-only) for the row-wise TorchScript interpreter (:mod:`workers.policies.rowwise`).

Each function says what it was checked against (torch 2.13.0 here; ``pyproject.toml`` allows
torch >= 2.5, where all of them exist) and what it does without the private name: the
``_foreach`` fallbacks loop over the tensors with the public in-place method of the same
operation, which is what the CPU ``_foreach`` kernels do themselves (the same values, bit for bit:
``tests/test_torch_compat.py``); the schema fallback reads the schema's text. Only this module may
spell ``torch._``.
"""

from __future__ import annotations

import torch


def _foreach(name: str):
    return getattr(torch, f"_foreach_{name}", None)


def lerp_(tensors: list, ends: list, weight: float) -> None:
    """``t.lerp_(end, weight)`` for each pair (``torch._foreach_lerp_``; checked against 2.13.0)."""
    fn = _foreach("lerp_")
    if fn is not None:
        fn(tensors, ends, weight)
        return
    for t, e in zip(tensors, ends):
        t.lerp_(e, weight)


def mul_(tensors: list, scalar: float) -> None:
    """``t.mul_(scalar)`` for each tensor (``torch._foreach_mul_``; checked against 2.13.0)."""
    fn = _foreach("mul_")
    if fn is not None:
        fn(tensors, scalar)
        return
    for t in tensors:
        t.mul_(scalar)


def div_(tensors: list, scalar: float) -> None:
    """``t.div_(scalar)`` for each tensor (``torch._foreach_div_``; checked against 2.13.0)."""
    fn = _foreach("div_")
    if fn is not None:
        fn(tensors, scalar)
        return
    for t in tensors:
        t.div_(scalar)


def add_(tensors: list, scalar: float) -> None:
    """``t.add_(scalar)`` for each tensor (``torch._foreach_add_``; checked against 2.13.0)."""
    fn = _foreach("add_")
    if fn is not None:
        fn(tensors, scalar)
        return
    for t in tensors:
        t.add_(scalar)


def addcmul_(tensors: list, tensors1: list, tensors2: list, value: float) -> None:
    """``t.addcmul_(a, b, value=value)`` for each triple (``torch._foreach_addcmul_``; checked
    against 2.13.0)."""
    fn = _foreach("addcmul_")
    if fn is not None:
        fn(tensors, tensors1, tensors2, value)
        return
    for t, a, b in zip(tensors, tensors1, tensors2):
        t.addcmul_(a, b, value=value)


def addcdiv_(tensors: list, tensors1: list, tensors2: list, value: float) -> None:
    """``t.addcdiv_(a, b, value=value)`` for each triple (``torch._foreach_addcdiv_``; checked
    against 2.13.0)."""
    fn = _foreach("addcdiv_")
    if fn is not None:
        fn(tensors, tensors1, tensors2, value)
        return
    for t, a, b in zip(tensors, tensors1, tensors2):
        t.addcdiv_(a, b, value=value)


def sqrt(tensors: list) -> list:
    """``[t.sqrt() for t in tensors]`` (``torch._foreach_sqrt``; checked against 2.13.0)."""
    fn = _foreach("sqrt")
    if fn is not None:
        return fn(tensors)
    return [t.sqrt() for t in tensors]


def schema_arguments(schema: str) -> tuple[int, list[str]]:
    """``(number of arguments, names of the keyword-only ones, in order)`` of an operator schema
    such as ``aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor``.

    ``torch._C.parse_schema`` (checked against 2.13.0). Fallback: the schema's text, split at
    the top-level commas of its argument list; the arguments after a bare ``*`` are keyword-only
    (TorchScript's schema grammar)."""
    parse = getattr(getattr(torch, "_C", None), "parse_schema", None)
    if parse is not None:
        args = parse(schema).arguments
        return len(args), [a.name for a in args if a.kwarg_only]
    inner = schema[schema.index("(") + 1:]
    depth, part, parts = 0, "", []
    for ch in inner:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(part.strip())
            part = ""
        else:
            part += ch
    if part.strip():
        parts.append(part.strip())
    kw_only = "*" in parts
    names = [p.split("=", 1)[0].split()[-1] for p in parts if p != "*"]
    kw = names[parts.index("*"):] if kw_only else []
    return len(names), kw
