"""What an LLM-guided fuzzer (LLMTester) adds to a fuzzing phase, as a
:class:`~orchestrator.campaign.generations.PhaseService` the phase brings to the generic loop:

* at the start, the campaign's LLM pool attached to the fuzzer
  (:func:`orchestrator.cluster.llm_pool.attach_llm`: generator actors on Ray when the rollouts
  run there), closed at the end;
* after each unit, the LLM columns of the timeline (calls, tokens, fallbacks, the threshold α);
* in the summary, how many LLM calls gave a usable scenario: a method whose every call fell
  back to random mutation must not look like a working one.

The safety and optimality phases ask :func:`phase_services` for the services of their fuzzer
(none for the other fuzzers), so the loop itself knows nothing of LLMs.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.campaign.generations import PhaseService
from orchestrator.cluster.llm_pool import attach_llm, llm_metrics


def phase_services(fuzzer, campaign, run_dir: Path) -> list[PhaseService]:
    """The services a phase with ``fuzzer`` brings to the loop."""
    return [LLMService(fuzzer, campaign, run_dir)] if fuzzer.needs_llm else []


class LLMService(PhaseService):
    """An LLM-guided fuzzer's LLM pool and figures (see the module docstring)."""

    def __init__(self, fuzzer, campaign, run_dir: Path):
        self.fuzzer, self.campaign, self.run_dir = fuzzer, campaign, run_dir
        self.pool = None

    def start(self, workers: int) -> None:
        self.pool = attach_llm(self.fuzzer, self.campaign, self.run_dir, use_ray=workers > 0)

    def unit_columns(self) -> dict:
        return llm_metrics(self.fuzzer)

    def summary_figures(self) -> dict:
        s = self.fuzzer.stats()
        calls, usable = int(s.get("llm_calls", 0)), int(s.get("llm_usable", 0))
        answered = int(s.get("llm_ok", 0))  # calls that came back with a reply (the others failed after retries)
        invalid = int(s.get("llm_unparseable", 0)) + int(s.get("llm_invalid", 0))
        return {"llm_calls": calls, "llm_usable": usable, "llm_fallbacks": int(s.get("llm_fallbacks", 0)),
                "llm_failed": int(s.get("llm_failed", 0)), "llm_unparseable": int(s.get("llm_unparseable", 0)),
                "llm_invalid": int(s.get("llm_invalid", 0)), "llm_replies": answered, "llm_invalid_replies": invalid,
                # share of the replies without a usable state (unparseable or outside the scenario's bounds)
                "llm_invalid_share": invalid / answered if answered else float("nan"),
                "llm_unchanged": int(s.get("llm_unchanged", 0)),
                # which operator made the failing fuzzing tests (tests: llm_usable, random_mutations,
                # llm_fallbacks): does the LLM's scenario fail more often than a random mutation?
                "llm_scenario_failures": int(s.get("llm_scenario_failures", 0)),
                "random_mutations": int(s.get("random_mutations", 0)),
                "random_mutation_failures": int(s.get("random_mutation_failures", 0)),
                "llm_fallback_failures": int(s.get("llm_fallback_failures", 0)),
                "llm_prompt_tokens": int(s.get("llm_prompt_tokens", 0)),
                "llm_completion_tokens": int(s.get("llm_completion_tokens", 0)),
                "llm_no_usable_scenario": calls > 0 and usable == 0}

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()
