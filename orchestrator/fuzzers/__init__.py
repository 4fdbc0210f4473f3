"""Fuzzers: one file per method, each reading like its paper's algorithm.

``make_fuzzer(name, scenario, seed, **params)`` builds one; ``FUZZERS`` lists the names.
"""

from __future__ import annotations

import importlib

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


def make_fuzzer(name: str, scenario, seed: int = 0, **params) -> Fuzzer:
    cls = fuzzer_class(name)
    try:
        return cls(scenario, seed=seed, **params)
    except TypeError as exc:
        raise FuzzerError(f"fuzzer {name}: {exc}") from exc


__all__ = ["Corpus", "Feedback", "Fuzzer", "FuzzerError", "FUZZERS", "Proposal", "fuzzer_class", "make_fuzzer"]
