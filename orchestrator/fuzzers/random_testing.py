"""Random testing: every episode starts from a fresh sample of the scenario's reset distribution."""

from __future__ import annotations

from orchestrator.fuzzers.base import Feedback, Fuzzer, Proposal


class RandomTesting(Fuzzer):
    """No corpus, no guidance: the baseline every guided fuzzer must beat."""

    name = "random"

    def propose(self, n: int) -> Proposal:
        return Proposal(self.scenario.sample(self.rng, int(n)))

    def observe(self, proposal: Proposal, feedback: Feedback) -> None:
        pass
