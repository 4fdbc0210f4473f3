"""Fuzzers: one file per method, each reading like its paper's algorithm.

``make_fuzzer(name, scenario, seed, **params)`` builds one; ``FUZZERS`` lists the names.
"""

from __future__ import annotations

import importlib
import inspect

from orchestrator.fuzzers.base import Feedback, Fuzzer, Proposal
from orchestrator.fuzzers.corpus import Corpus

_REGISTRY = {
    "random": "orchestrator.fuzzers.random_testing:RandomTesting",
    "mdpfuzz": "orchestrator.fuzzers.mdpfuzz:MDPFuzz",
    "curefuzz": "orchestrator.fuzzers.curefuzz:CureFuzz",
    "gmt": "orchestrator.fuzzers.gmt:GMT",
    "llmtester": "orchestrator.fuzzers.llmtester:LLMTester",  # needs an LLM endpoint (campaign `llm:`)
    "delta": "orchestrator.fuzzers.delta:Delta",  # optimality testing only (needs the challenger)
}
FUZZERS = tuple(_REGISTRY)


class FuzzerError(ValueError):
    """Unknown fuzzer or bad fuzzer parameters."""


def fuzzer_class(name: str):
    key = str(name).lower()
    if key not in _REGISTRY:
        raise FuzzerError(f"unknown fuzzer {name!r}; known fuzzers: {', '.join(FUZZERS)}")
    module, cls = _REGISTRY[key].split(":")
    return getattr(importlib.import_module(module), cls)


def fuzzer_params(name: str) -> list[str]:
    """The parameter names ``make_fuzzer(name, ...)`` accepts: the keyword parameters of each
    ``__init__`` along the class's MRO, down to the base ``Fuzzer`` (which refuses the rest)."""
    names: set[str] = set()
    for klass in fuzzer_class(name).__mro__:
        if klass is Fuzzer or "__init__" not in vars(klass):
            continue
        sig = inspect.signature(vars(klass)["__init__"])
        names |= {p.name for p in sig.parameters.values()
                  if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", "scenario", "seed")}
    return sorted(names)


def make_fuzzer(name: str, scenario, seed: int = 0, **params) -> Fuzzer:
    cls = fuzzer_class(name)
    try:
        return cls(scenario, seed=seed, **params)
    except FuzzerError:
        raise
    except (TypeError, ValueError) as exc:  # an unknown parameter, or a value the fuzzer refuses
        msg = str(exc)
        raise FuzzerError(msg if msg.startswith(f"{cls.name}:") else f"fuzzer {name}: {msg}") from exc


__all__ = ["Corpus", "Feedback", "Fuzzer", "FuzzerError", "FUZZERS", "Proposal", "fuzzer_class", "fuzzer_params", "make_fuzzer"]
