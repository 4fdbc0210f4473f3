"""LLMTester (paper: "Exploring Critical Testing Scenarios for Decision-Making Policies: An LLM
Approach"): an LLM proposes more critical scenarios from a seed, testing feedback and expert
experience; a multi-scale strategy leaves the near-failure seeds to small random mutations.

The paper's framework, as deltarl runs it (``n = 1`` is the serial algorithm):

*Scenario database and evaluation* (Sec. III-A). The paper recommends MDPFuzz's evaluation, so
LLMTester is MDPFuzz with another mutation operator: the database is sampled from the
environment's reset distribution with a perturbed twin per seed; a seed is selected with
probability ∝ its sensitivity ρ = |r_seed − r_δ| (Eq. 1); a new scenario that does not fail is
kept when it lowers the return or its trajectory is fresh under the GMMs; failures are results.

*Multi-scale generation* (Sec. III-C, Algorithm 1, Eqs. 3-6). The potential of a scenario is
P(s) = −r_s. A selected seed whose potential is in the top ``alpha`` percent of the database
(P_s ≥ Percentile(P_D, 100 − α) and above the lowest potential, the high-potential set H) gets a random mutation
s + U(−a, a) (a = ``amplitude`` × the width of each dimension's bounds, clipped to the
bounds); every other seed goes to the LLM: s_new = G_env(s_seed, F, E) (Eq. 2). After each new
failure the failure rate f' of the tests so far is compared with f, the rate when α last
changed: α ← αβ when f' < (1 − δ) f, α ← α / β when f' > (1 + δ) f (Eq. 6; f is set at the
first failure). ``multi_scale = False`` is the paper's "ours w/o ms" ablation (LLM only).
α, β and δ default to Table I's values for the paper's scenarios (``TABLE_I``: ACAS Xu 25 / 0.7 /
0.1, BipedalWalker 10 / 0.7 / 0.1, CoopNavi 20 / 0.5 / 0.1), else 20 / 0.5 / 0.1.

*LLM-based generator* (Sec. III-B). The prompt is ``orchestrator.fuzzers.llm_prompt``'s template; the
reply's ``NEW_STATE`` is parsed and validated. Bad cases become the testing feedback F of later
prompts (the last ``feedback_size``): *insufficient challenge* (r_new − r_seed > ``t_r``),
*invalidity* (a reply without a usable state, or a state outside the bounds) and *excessive
modification* (‖s_new − s_seed‖ > ``t_s``, the norm in units of each dimension's width).
``prompt_layout = "shared_first"`` moves the seed after the feedback and the expert experience,
which every request of a generation shares, so a server's prefix cache reuses them (a speed
option; ``"paper"``, Fig. 4's order, is the default). A
reply that gives no valid state, or a call that failed after its retries, still spends its test:
the seed gets the random mutation instead (operator ``llm_fallback``), so a bad reply costs a
call, never the campaign.

The LLM itself is outside: :meth:`LLMTester.attach_llm` takes a function from a list of
requests (``request_id``, ``messages``) to a list of replies (``LLMReply.to_dict()``); a
campaign attaches ``orchestrator.cluster.llm_pool``'s pool of rate-limited Ray actors. Replies of a
real model are not reproducible; everything else (selection, random mutations, α) is drawn
from ``self.rng`` and snapshotted as for every fuzzer.
"""

from __future__ import annotations

import logging
import math
from collections import deque

import numpy as np

from envs.base import Scenario
from orchestrator.fuzzers.base import Feedback, Proposal
from orchestrator.fuzzers.llm_prompt import (
    PROMPT_LAYOUTS,
    ReplyError,
    ScenarioInfo,
    build_messages,
    parse_reply,
    reply_schema,
    state_json,
)
from orchestrator.fuzzers.mdpfuzz import MDPFuzz
from workers.llm import LLMFatalError

log = logging.getLogger("deltarl.llm")
LOGGED_INVALID = 5  # invalid replies logged as warnings per fuzzer (the rest at debug level; all are counted)

LLM_COUNTERS = ("llm_calls", "llm_ok", "llm_usable", "llm_failed", "llm_unparseable", "llm_invalid", "llm_excessive",
                "llm_insufficient", "llm_fallbacks", "random_mutations", "llm_prompt_tokens",
                "llm_completion_tokens", "alpha_updates", "llm_unchanged", "llm_scenario_failures",
                "random_mutation_failures", "llm_fallback_failures")
# which operator made a failing fuzzing test: the LLM's scenario, the multi-scale random
# mutation, or the random mutation that replaced an unusable reply
FAILURES_BY_OPERATOR = {"llm": "llm_scenario_failures", "random": "random_mutation_failures",
                        "llm_fallback": "llm_fallback_failures"}


# Table I of the paper: the multi-scale parameters (alpha, beta, delta) per scenario
TABLE_I = {"ACASXu": (25.0, 0.7, 0.1), "BipedalWalker": (10.0, 0.7, 0.1), "CoopNavi": (20.0, 0.5, 0.1)}
DEFAULT_MULTI_SCALE = (20.0, 0.5, 0.1)


def insufficient_challenge(scenario: Scenario, state, r_seed: float, r_new: float) -> str:
    """The bad case of an LLM scenario that did not lower the policy's return (Sec. III-B's first
    criterion), as the testing feedback quotes it."""
    return (f"Insufficient challenge: the scenario {state_json(scenario, state)} raised the policy's reward from "
            f"{r_seed:.4g} to {r_new:.4g}; modify the seed so the reward falls.")


class LLMNotAttachedError(RuntimeError):
    """The fuzzer was asked for LLM mutations without an LLM attached."""


class LLMTester(MDPFuzz):
    """LLMTester: MDPFuzz's database and evaluation, LLM generation with multi-scale mutation."""

    name = "llmtester"
    needs_llm = True

    def __init__(self, scenario: Scenario, seed: int = 0, *, alpha: float | None = None, beta: float | None = None,
                 delta: float | None = None, amplitude: float | None = None, multi_scale: bool = True, t_r: float = 0.0,
                 t_s: float = 0.5, feedback_size: int = 5, expert: list | None = None, prompt_layout: str = "paper",
                 **mdpfuzz_params):
        super().__init__(scenario, seed=seed, **mdpfuzz_params)
        table = TABLE_I.get(scenario.name, DEFAULT_MULTI_SCALE)
        alpha, beta, delta = (table[i] if v is None else v for i, v in enumerate((alpha, beta, delta)))
        self.alpha = float(alpha)  # percent of the database counted as high-potential
        self.beta = float(beta)
        self.delta = float(delta)
        self.amplitude = float(scenario.mutation_scale if amplitude is None else amplitude)
        self.multi_scale = bool(multi_scale)
        self.t_r = float(t_r)
        self.t_s = float(t_s)
        self.feedback_size = int(feedback_size)
        if prompt_layout not in PROMPT_LAYOUTS:
            raise ValueError(f"llmtester: prompt_layout must be one of {', '.join(PROMPT_LAYOUTS)}, got "
                             f"{prompt_layout!r} (paper: Fig. 4's order; shared_first: the seed last, for prefix caches)")
        self.prompt_layout = prompt_layout
        for name, ok in (("alpha", 0.0 <= self.alpha <= 100.0), ("beta", 0.0 < self.beta < 1.0),
                         ("delta", 0.0 <= self.delta < 1.0), ("amplitude", 0.0 <= self.amplitude < math.inf),
                         ("t_s", self.t_s > 0), ("feedback_size", self.feedback_size >= 0),
                         ("t_r", math.isfinite(self.t_r))):
            if not ok:
                raise ValueError(f"llmtester: {name} has an impossible value {getattr(self, name)!r} "
                                 f"(alpha in [0, 100], beta in (0, 1), delta in [0, 1), t_s > 0)")
        self.info = ScenarioInfo.load(scenario)
        self.expert = list(self.info.expert if expert is None else expert)
        self._generate = None
        self._bad: deque = deque(maxlen=max(1, self.feedback_size))
        self._last_rate: float | None = None
        self._counters.update({k: 0 for k in LLM_COUNTERS})
        self._gen = 0
        self.max_consecutive_failures: int | None = None  # llm.max_consecutive_failures (attach_llm)
        self._failed_in_a_row = 0  # LLM calls in a row that gave no usable scenario
        self._last_problem = ""
        self.structured = False  # replies as JSON constrained by reply_schema (attach_llm)
        self.reasoning = True

    # -- the LLM, attached by the campaign ------------------------------------------------------
    def attach_llm(self, generate, max_consecutive_failures: int | None = None, structured: bool = False,
                   reasoning: bool = True) -> None:
        """``generate(requests) -> replies``: requests are dicts with ``request_id``, ``messages``
        and (``structured``) ``schema``; replies are ``LLMReply.to_dict()`` dicts in the same order.
        ``structured``: the prompt asks for a JSON reply and the request carries its schema
        (``llm_prompt.reply_schema``, with the reasoning steps as fields when ``reasoning``); else the
        paper's text format. With ``max_consecutive_failures`` = N, N calls in a row without a usable
        scenario (a failed call, a reply without a valid state) stop the campaign with :class:`LLMFatalError`."""
        self._generate = generate
        self.max_consecutive_failures = max_consecutive_failures
        self.structured = bool(structured)
        self.reasoning = bool(reasoning)

    # -- Algorithm 1: multi-scale generation ----------------------------------------------------
    def high_potential(self, returns: np.ndarray) -> np.ndarray:
        """Which of the seeds (by their returns) are in H: P_s ≥ Percentile(P_D, 100 − α)."""
        returns = np.asarray(returns, dtype=np.float64)
        if not self.multi_scale or self.alpha <= 0 or len(self.corpus) == 0:
            return np.zeros(returns.shape, dtype=bool)
        potentials = -np.asarray(self.corpus.scores["return"], dtype=np.float64)
        threshold = np.percentile(potentials, 100.0 - self.alpha)
        # ties: a seed with the database's lowest potential is never high-potential (a database
        # whose returns are all equal has no near-failure scenario to refine)
        return (-returns >= threshold) & (-returns > potentials.min())

    def random_mutation(self, states: np.ndarray) -> np.ndarray:
        """Eq. 5's small-scale branch: s + U(−a, a) per dimension, kept inside the bounds
        (integer-valued scenarios use their own mutation operator)."""
        sc = self.scenario
        if type(sc).mutate is not Scenario.mutate:
            return sc.mutate(states, self.rng, self.amplitude)
        a = self.amplitude * (sc.high - sc.low)
        return np.clip(states + self.rng.uniform(-1.0, 1.0, size=states.shape) * a, sc.low, sc.high)

    def _mutate_parents(self, parent_states, ids, returns):
        high = self.high_potential(returns)
        out = np.array(parent_states, dtype=np.float64, copy=True)
        ops = np.full(len(out), "random", dtype="<U16")
        # random mutation for every seed first (one draw per generation, fallback included), so the
        # RNG stream does not depend on what the LLM replies
        randomized = self.random_mutation(out) if len(out) else out
        llm_rows = np.flatnonzero(~high)
        if llm_rows.size:
            if self._generate is None:
                raise LLMNotAttachedError("llmtester needs an LLM: the campaign attaches one from its `llm:` section "
                                          "(base_url, model); in code call fuzzer.attach_llm(generate)")
            feedback = list(self._bad)
            output = ("json_reasoning" if self.reasoning else "json") if self.structured else "text"
            schema = reply_schema(self.scenario, self.reasoning) if self.structured else None
            requests = [{"request_id": f"g{self._gen}-r{j}-seed{int(ids[i])}",
                         "messages": build_messages(self.scenario, self.info, parent_states[i], float(returns[i]),
                                                    feedback, self.expert, output=output, layout=self.prompt_layout)}
                        for j, i in enumerate(llm_rows)]
            if schema is not None:
                for r in requests:
                    r["schema"] = schema
            replies = self._generate(requests)
            if len(replies) != len(requests):
                raise RuntimeError(f"llmtester: asked {len(requests)} generations, got {len(replies)} replies")
            self._counters["llm_calls"] += len(requests)
            for i, req, reply in zip(llm_rows, requests, replies):
                self._counters["llm_prompt_tokens"] += int(reply.get("prompt_tokens") or 0)
                self._counters["llm_completion_tokens"] += int(reply.get("completion_tokens") or 0)
                state = self._accept_reply(reply, parent_states[i], req["request_id"])
                if state is None:
                    self._counters["llm_fallbacks"] += 1
                    out[i], ops[i] = randomized[i], "llm_fallback"
                    self._failed_in_a_row += 1
                else:
                    self._counters["llm_usable"] += 1
                    out[i], ops[i] = state, "llm"
                    self._failed_in_a_row = 0
                limit = self.max_consecutive_failures
                if limit and self._failed_in_a_row >= limit:
                    raise LLMFatalError(
                        f"llmtester: {self._failed_in_a_row} LLM calls in a row gave no usable scenario (last: "
                        f"{self._last_problem[:200]}); stopped by llm.max_consecutive_failures: {limit}. Check the "
                        f"endpoint and the model, then continue the run with `deltarl run --resume RUN_DIR`")
        rand_rows = np.flatnonzero(high)
        out[rand_rows] = randomized[rand_rows]
        self._counters["random_mutations"] += int(rand_rows.size)
        self._gen += 1
        return out, list(ops)

    def _accept_reply(self, reply: dict, seed_state: np.ndarray, request_id: str = ""):
        """The reply's state, or None (the bad case is recorded as feedback, counted and logged)."""
        if not reply.get("ok"):
            self._counters["llm_failed"] += 1
            self._last_problem = f"the call failed: {reply.get('error') or 'no reply'}"
            return None
        self._counters["llm_ok"] += 1
        try:
            state = parse_reply(reply.get("text", ""), self.scenario)
        except Exception as exc:  # ReplyError, or anything a strange reply provokes: never a crash
            if not isinstance(exc, ReplyError):
                exc = ReplyError(f"the reply could not be read ({type(exc).__name__}: {str(exc)[:100]})")
            key = "llm_invalid" if str(exc).startswith("invalid scenario") else "llm_unparseable"
            self._counters[key] += 1
            self._last_problem = f"an unusable reply: {exc}"
            self._bad.append(f"Invalidity: for seed {state_json(self.scenario, seed_state)} your reply was "
                             f"unusable: {exc}.")
            n = self._counters["llm_invalid"] + self._counters["llm_unparseable"]
            log.log(logging.WARNING if n <= LOGGED_INVALID else logging.DEBUG,
                    "llmtester: invalid LLM reply %s (%s, %d so far%s): %s; reply: %r", request_id or "?", key, n,
                    "; the next ones at debug level" if n == LOGGED_INVALID else "", exc,
                    str(reply.get("text", ""))[:160])
            return None
        moved = float(self._delta_norm(state, seed_state)[0])
        width = np.asarray(self.scenario.high, dtype=np.float64) - np.asarray(self.scenario.low, dtype=np.float64)
        if np.all(np.abs(state - np.asarray(seed_state, dtype=np.float64)) <= 1e-5 * width + 1e-12):
            self._counters["llm_unchanged"] += 1  # valid, but the seed itself (as printed: small models copy it)
        if moved > self.t_s:
            self._counters["llm_excessive"] += 1
            self._bad.append(f"Excessive modification: from seed {state_json(self.scenario, seed_state)} you "
                             f"proposed {state_json(self.scenario, state)}, a change of {moved:.3g} (in units of "
                             f"the valid ranges) > {self.t_s:g}; stay closer to the seed.")
        return state

    # -- observing: bad cases of the LLM's scenarios, adaptive threshold ------------------------
    def observe(self, proposal: Proposal, feedback: Feedback) -> None:
        super().observe(proposal, feedback)
        tags = proposal.tags
        returns = np.asarray(feedback.returns, dtype=np.float64)
        failure = np.asarray(feedback.failure, dtype=bool)
        mutants = np.flatnonzero(tags["kind"] == "mutant")
        # MDPFuzz's observe has counted this generation's mutants (the fuzzing tests) and their
        # failures; Algorithm 1 looks at the failure rate as each new failure arrives
        tests = self._counters["episodes_mutant"] - mutants.size
        fails = self._counters["failures_mutant"] - int(failure[mutants].sum())
        for i in mutants:
            tests += 1
            if tags["operator"][i] == "llm" and not failure[i]:
                gain = returns[i] - tags["parent_return"][i]
                if gain > self.t_r:
                    self._counters["llm_insufficient"] += 1
                    self._bad.append(insufficient_challenge(self.scenario, proposal.states[i],
                                                            tags["parent_return"][i], returns[i]))
            if failure[i]:
                fails += 1
                op = FAILURES_BY_OPERATOR.get(str(tags["operator"][i]))
                if op:
                    self._counters[op] += 1
                if self.multi_scale:
                    self._update_alpha(tests, fails)

    def _update_alpha(self, tests: int, fails: int) -> None:
        """Algorithm 1's Update_parameters (Eq. 6), after a new failure: ``fails`` of ``tests``
        fuzzing tests so far failed."""
        rate = fails / max(1, tests)
        if self._last_rate is None:
            self._last_rate = rate
        elif rate < (1.0 - self.delta) * self._last_rate:
            self.alpha *= self.beta
            self._last_rate = rate
            self._counters["alpha_updates"] += 1
        elif rate > (1.0 + self.delta) * self._last_rate:
            self.alpha = min(100.0, self.alpha / self.beta)
            self._last_rate = rate
            self._counters["alpha_updates"] += 1

    # -- reporting and snapshots ---------------------------------------------------------------
    def stats(self) -> dict:
        out = super().stats()
        out["alpha"] = self.alpha
        out["last_failure_rate"] = float("nan") if self._last_rate is None else self._last_rate
        out["fuzz_tests"] = self._counters["episodes_mutant"]
        out["llm_share"] = self._counters["llm_calls"] / max(1, out["fuzz_tests"])
        return out

    def state_dict(self) -> dict:
        d = super().state_dict()
        d["llmtester"] = {"alpha": self.alpha, "last_rate": self._last_rate, "bad": list(self._bad), "gen": self._gen,
                          "failed_in_a_row": self._failed_in_a_row}
        return d

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        mine = state["llmtester"]
        self.alpha = float(mine["alpha"])
        self._last_rate = mine["last_rate"]
        self._bad = deque(mine["bad"], maxlen=max(1, self.feedback_size))
        self._gen = int(mine["gen"])
        self._failed_in_a_row = int(mine.get("failed_in_a_row", 0))
        for k in LLM_COUNTERS:  # snapshots of older deltarl versions lack the newer counters
            self._counters.setdefault(k, 0)
