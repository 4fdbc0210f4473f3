"""The LLM stack against a real local OpenAI-compatible HTTP server (tests/llm_server.py):
prompt template and reply parsing, retries on 429/5xx/hangs, fatal errors, the shared rate
limiter across 4 Ray actors, LLMTester's multi-scale strategy, and the whole loop as a campaign."""

from __future__ import annotations

import json
import os.path
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs import SCENARIOS, get_scenario
from orchestrator.campaign.config import CampaignError, load_campaign
from orchestrator.cluster.llm_pool import LocalLLMPool
from orchestrator.fuzzers import make_fuzzer
from orchestrator.fuzzers.llm_prompt import (
    ReplyError,
    ScenarioInfo,
    build_messages,
    parse_reply,
)
from tests.llm_server import LLMStubServer
from workers.llm import LLMConfig, LLMConfigError, LLMFatalError, RateLimiter

BALANCER = "python:workers.examples:cartpole_balancer"


def cfg(server, **kw):
    base = dict(base_url=server.base_url, model="stub-model", api_key_env="DELTARL_TEST_LLM_KEY",
                requests_per_minute=6000, max_concurrent=4, timeout_s=1.0, backoff_s=0.05, max_retries=3)
    base.update(kw)
    return LLMConfig(**base)


def ask(pool, n=1, state=None):
    sc = get_scenario("CartPole-v1")
    s = np.zeros(4) if state is None else state
    msgs = build_messages(sc, ScenarioInfo.load(sc), s, 42.0, [], [])
    return pool.generate([{"request_id": f"r{i}", "messages": msgs} for i in range(n)])


# -- prompt and parsing -----------------------------------------------------------------------


def test_prompt_follows_the_papers_template():
    sc = get_scenario("CartPole-v1")
    msgs = build_messages(sc, ScenarioInfo.load(sc), np.array([0.01, -0.02, 0.03, 0.04]), 123.0,
                          ["Insufficient challenge: ..."], ["tilt the pole"])
    system, user = msgs[0]["content"], msgs[1]["content"]
    assert msgs[0]["role"] == "system" and "test scenario generator" in system and "fails" in system
    for section in ("### Overview", "### Entity Information", "### State Description", "### Constraints",
                    "### Seed Scenario", "### Testing Feedback", "### Expert Experience", "Scenario Analysis",
                    "Evolution Prediction", "Challenge Analysis", "Plan Execution", "Explanation", "NEW_STATE:"):
        assert section in user, section
    assert '"theta": 0.03' in user and "123" in user and "tilt the pole" in user and "Insufficient challenge" in user
    assert "valid range [-0.05, 0.05]" in user  # the bounds come from the scenario itself
    # a scenario without an information file still gets a complete prompt
    hop = get_scenario("Hopper-v5")
    text = build_messages(hop, ScenarioInfo.load(hop), hop.sample(np.random.default_rng(0), 1)[0], None, [], [])[1]
    assert "### Overview" in text["content"] and "rootz" in text["content"]


@pytest.mark.parametrize("layout", ["paper", "shared_first"])
def test_prompt_layout_decides_what_the_requests_of_a_generation_share(layout):
    """``prompt_layout``: the requests of one generation differ only in their seed. With the paper's
    order (Fig. 4: seed, feedback, expert) they share nothing after the scenario information; with
    ``shared_first`` the feedback and the expert experience come before the seed, so everything but
    the seed and the output section is a prefix that a server's cache can reuse. Both layouts carry
    the same lines."""
    from orchestrator.fuzzers import Feedback
    from workers.policies import load_policy
    from workers.rollout import rollout

    sc = get_scenario("CartPole-v1")
    pol = load_policy(BALANCER, sc)
    f = make_fuzzer("llmtester", sc, seed=0, multi_scale=False, t_r=-1.0, prompt_layout=layout)
    generations: list[list[str]] = []

    def generate(requests):  # every call fails: the seeds fall back to random mutation
        generations.append([r["messages"][1]["content"] for r in requests])
        return [{"ok": False, "error": "offline"} for _ in requests]

    f.attach_llm(generate)
    for g in range(5):
        if g == 2:
            f.start_phase("fuzzing")
        p = f.propose(4)
        f.observe(p, Feedback.from_result(rollout(sc, {"aut": pol}, p.states, seed=g, max_steps=50)))
    assert generations and all(len(texts) >= 2 for texts in generations)
    f._bad.append("Insufficient challenge: a line every request of the generation quotes")
    calls = len(generations)
    p = f.propose(4)
    assert len(generations) == calls + 1
    texts = generations[-1]
    assert len(set(texts)) > 1  # different seeds
    shared = os.path.commonprefix(texts)
    feedback_line = "- Insufficient challenge: a line every request of the generation quotes"
    assert all(feedback_line in t for t in texts)
    if layout == "paper":
        assert "### Seed Scenario" in shared and "### Testing Feedback" not in shared and feedback_line not in shared
    else:
        assert feedback_line in shared and "### Expert Experience" in shared
        for t in texts:  # what is left to evaluate per request: the seed and the output section
            tail = t[len(shared):]
            assert "### Testing Feedback" not in tail and "### Expert Experience" not in tail
            assert t.index("### Seed Scenario") > t.index("### Expert Experience") > t.index("### Testing Feedback")
    # the same content in either order
    other = build_messages(sc, f.info, p.states[0], 1.0, [feedback_line[2:]], f.expert, output="text",
                           layout="shared_first" if layout == "paper" else "paper")[1]["content"]
    mine = build_messages(sc, f.info, p.states[0], 1.0, [feedback_line[2:]], f.expert, output="text",
                          layout=layout)[1]["content"]
    assert other != mine and sorted(other.splitlines()) == sorted(mine.splitlines())


def test_an_unknown_prompt_layout_is_refused_by_name():
    sc = get_scenario("CartPole-v1")
    with pytest.raises(ValueError, match="prompt_layout must be one of paper, shared_first, got 'seed_last'"):
        make_fuzzer("llmtester", sc, seed=0, prompt_layout="seed_last")
    with pytest.raises(ValueError, match="layout must be one of paper, shared_first"):
        build_messages(sc, ScenarioInfo.load(sc), np.zeros(4), 1.0, [], [], layout="reversed")


def test_reply_parsing_and_its_errors():
    sc = get_scenario("CartPole-v1")
    good = 'analysis...\nNEW_STATE: {"x": 0.01, "x_dot": -0.02, "theta": 0.03, "theta_dot": 0.0}'
    np.testing.assert_allclose(parse_reply(good, sc), [0.01, -0.02, 0.03, 0.0])
    # no marker: the last JSON object with all names (e.g. in a ```json block)
    block = 'Plan...\n```json\n{"x": 0.0, "x_dot": 0.0, "theta": 0.04, "theta_dot": 0.01}\n```'
    np.testing.assert_allclose(parse_reply(block, sc), [0.0, 0.0, 0.04, 0.01])
    cases = [("", "empty"), ("the pole will fall", "no machine-readable state"),
             ('NEW_STATE: {"x": 0.01, "x_dot": 0, "theta": 0}', "lacked theta_dot"),
             ('NEW_STATE: {"x": 0.01, "x_dot": 0, "theta": 0, "theta_dot": 0, "y": 1}', "unknown keys y"),
             ('NEW_STATE: {"x": "left", "x_dot": 0, "theta": 0, "theta_dot": 0}', "'x' must be a number"),
             ('NEW_STATE: {"x": 3.0, "x_dot": 0, "theta": 0, "theta_dot": 0}', "invalid scenario.*outside"),
             ('NEW_STATE: {"x": NaN, "x_dot": 0, "theta": 0, "theta_dot": 0}', "invalid scenario.*non-finite")]
    for text, msg in cases:
        with pytest.raises(ReplyError, match=msg):
            parse_reply(text, sc)


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_has_a_prompt_whose_answer_parses(name):
    """Round trip on every registered scenario: the prompt describes all state values with their
    ranges, the test double answers from it, and the answer parses into a valid state."""
    from tests.llm_server import answer, scripted_state

    sc = get_scenario(name)
    info = ScenarioInfo.load(sc)  # the YAML file, when there is one, has only known keys
    seed = sc.sample(np.random.default_rng(0), 1)[0]
    msgs = build_messages(sc, info, seed, -1.0, [], info.expert)
    for n in sc.state_names:
        assert f"- {n}:" in msgs[1]["content"]
    state = parse_reply(answer(scripted_state(msgs[1]["content"], 0.1)), sc)
    assert state.shape == (sc.state_dim,) and np.all(state >= sc.low) and np.all(state <= sc.high)
    assert info.overview and info.system_under_test


# -- the client: retries, timeouts, fatal errors, no key in the record ------------------------


@pytest.mark.slow
def test_429_500_and_a_hang_are_retried(tmp_path):
    with LLMStubServer(script=["429", "500", "hang"], hang_s=30.0) as srv:
        pool = LocalLLMPool(cfg(srv), tmp_path / "llm")
        try:
            t0 = time.monotonic()
            (reply,) = ask(pool)
        finally:
            pool.close()
        assert reply["ok"] and reply["attempts"] == 4 and "NEW_STATE" in reply["text"]
        assert srv.actions() == ["429", "500", "hang", "ok"]
        t = [r["t"] for r in srv.requests]
        assert t[1] - t[0] >= 0.2 * 0.9  # Retry-After: 0.2 honoured
        assert t[3] - t[2] >= 1.0 * 0.9  # the hang ran into llm.timeout_s = 1
        assert time.monotonic() - t0 < 20.0  # ... and was not waited out (the hang lasts 30 s)
    audit = pd.read_parquet(tmp_path / "llm")
    assert len(audit) == 1 and audit["attempts"][0] == 4 and "Seed Scenario" in audit["messages"][0]


def test_retries_exhausted_is_a_reply_not_a_crash():
    with LLMStubServer(default="500") as srv:
        pool = LocalLLMPool(cfg(srv, max_retries=2))
        try:
            (reply,) = ask(pool)
        finally:
            pool.close()
    assert not reply["ok"] and reply["attempts"] == 3 and "HTTP 500" in reply["error"] and "after 3 attempts" in reply["error"]
    assert len(srv.requests) == 3


def test_a_reply_that_is_not_utf8_is_a_counted_failed_call_never_a_traceback():
    """Bytes that are not UTF-8 (a 200 whose chat completion holds Latin-1 and a stray 0xff) make
    a failed call, retried like any body that is not a chat completion, counted by LLMTester,
    whose seed falls back to the random mutation."""
    sc = get_scenario("CartPole-v1")
    with LLMStubServer(script=["not_utf8", "not_utf8", "json"], step=0.05) as srv:
        pool = LocalLLMPool(cfg(srv, max_concurrent=1, max_retries=0))
        f = make_fuzzer("llmtester", sc, seed=0, multi_scale=False)
        f.attach_llm(pool.generate, structured=True, reasoning=True)
        try:
            (reply,) = ask(pool)
            states = sc.sample(np.random.default_rng(0), 2)
            out, ops = f._mutate_parents(states, np.arange(2), np.full(2, 100.0))
        finally:
            pool.close()
    assert not reply["ok"] and reply["status"] == 200
    assert "not UTF-8 text (byte 0xe9 at offset" in reply["error"], reply["error"]
    s = f.stats()
    assert s["llm_calls"] == 2 and s["llm_failed"] == 1 and s["llm_usable"] == 1
    assert ops == ["llm_fallback", "llm"] and np.all(out >= sc.low) and np.all(out <= sc.high)


def test_the_call_deadline_ends_a_call_to_a_server_that_never_answers():
    """A server that accepts and never answers: the call ends at llm.call_deadline_s (1.5 s, less
    than one attempt's llm.timeout_s), counting attempts, retries and backoffs together, as a
    failed reply that names the setting."""
    with LLMStubServer(default="hang", hang_s=60.0) as srv:
        pool = LocalLLMPool(cfg(srv, timeout_s=30.0, max_retries=5, call_deadline_s=1.5, phase_deadline_s=None))
        try:
            (reply,) = ask(pool)
        finally:
            pool.close()
    assert not reply["ok"] and reply["attempts"] == 1 and len(srv.requests) == 1
    assert "no answer within the call's deadline (llm.call_deadline_s = 1.5 s)" in reply["error"], reply["error"]
    assert reply["latency_s"] < 30.0  # it did not wait for the attempt's timeout, let alone the server


def test_the_phase_deadline_stops_a_phase_whose_calls_get_no_answer():
    """llm.phase_deadline_s: once the calls of a pool (a campaign phase) have had no answer for
    that long, the phase stops with one message (LLMFatalError: exit 2 in the CLI); every answer
    starts the count again, and a call is cut to the time left to the phase."""
    with LLMStubServer(script=["ok"], default="hang", hang_s=60.0) as srv:
        pool = LocalLLMPool(cfg(srv, timeout_s=30.0, max_retries=5, call_deadline_s=120.0, phase_deadline_s=2.0))
        try:
            (first,) = ask(pool)
            assert first["ok"] and pool.silent_since is None  # an answer: nothing counted
            with pytest.raises(LLMFatalError) as stop:
                ask(pool, n=2)
        finally:
            pool.close()
    message = str(stop.value)
    assert f"the LLM endpoint {srv.base_url} gave no answer in 2 s, the longest a phase waits" in message, message
    assert "(llm.phase_deadline_s; last: no reply within" in message and "the phase stopped" in message
    assert "nothing was committed yet" in message  # a pool without a run folder
    assert srv.actions() == ["ok", "hang", "hang"]  # each call cut to the phase's 2 s: one attempt each


def test_deadlines_are_validated():
    for name, value in (("call_deadline_s", 0), ("call_deadline_s", float("nan")), ("call_deadline_s", float("inf")),
                        ("phase_deadline_s", -1.0), ("phase_deadline_s", float("nan"))):
        with pytest.raises(LLMConfigError, match=f"llm.{name} has an impossible value"):
            LLMConfig(base_url="http://127.0.0.1:1/v1", model="m", **{name: value}).check()
    assert LLMConfig(base_url="http://127.0.0.1:1/v1", model="m", phase_deadline_s=None).check()


HANG_CAMPAIGN = """
scenario: CartPole-v1
aut: "{aut}"
workers: 0
seed: 3
output: {out}
mlflow: false
safety:
  fuzzer: llmtester
  params: {{multi_scale: false}}
  budget: {{episodes: 64}}
  sampling_fraction: 0.25
  generation_size: 8
llm: {{requests_per_minute: 6000, timeout_s: 30, max_retries: 3, backoff_s: 0.01, call_deadline_s: 60,
      phase_deadline_s: 3}}
"""


@pytest.mark.campaign
def test_a_server_that_stops_answering_ends_the_phase_with_exit_2_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    """`deltarl run` against a server that answers the first generation's calls, then accepts and
    never answers: the phase stops at llm.phase_deadline_s (3 s, not 4 attempts of 30 s per call)
    with one message and exit 2, the run keeps what it committed, and `--resume` against a server
    that answers finishes it (the endpoint comes from DELTARL_LLM_BASE_URL, as a moved server's would)."""
    from orchestrator.cli import main

    out = tmp_path / "run"
    camp = tmp_path / "c.yaml"
    camp.write_text(HANG_CAMPAIGN.format(aut=BALANCER, out=out))
    monkeypatch.setenv("DELTARL_LLM_MODEL", "stub")
    with LLMStubServer(script=["json"] * 8, default="hang", hang_s=30.0, step=0.05) as srv:
        monkeypatch.setenv("DELTARL_LLM_BASE_URL", srv.base_url)
        t0 = time.monotonic()
        code = main(["run", str(camp), "--quiet"])
        took = time.monotonic() - t0
        _, err = capsys.readouterr()
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"deltarl: error: the LLM endpoint {srv.base_url} gave no answer in 3 s"), lines[0]
    assert lines[0].endswith(f"the run keeps what it committed: continue it with: deltarl run --resume {out}")
    assert took < 4 * 30.0  # ended by the phase's deadline, not by the calls' attempts
    with LLMStubServer(default="json", step=0.05) as srv:
        monkeypatch.setenv("DELTARL_LLM_BASE_URL", srv.base_url)
        code = main(["run", "--resume", str(out), "--quiet"])
        _, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] >= 64 and summary["llm_usable"] > 0


def test_a_wrong_key_is_fatal_and_never_echoed(monkeypatch):
    monkeypatch.setenv("DELTARL_TEST_LLM_KEY", "sk-deltarl-SECRET-0001")
    with LLMStubServer(default="401") as srv:
        pool = LocalLLMPool(cfg(srv))
        try:
            with pytest.raises(LLMFatalError, match="HTTP 401.*DELTARL_TEST_LLM_KEY") as info:
                ask(pool)
        finally:
            pool.close()
    assert "SECRET" not in str(info.value)
    assert srv.requests[0]["has_auth"] and len(srv.requests) == 1  # not retried


def test_no_endpoint_names_the_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("DELTARL_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("DELTARL_LLM_MODEL", raising=False)
    with pytest.raises(LLMConfigError, match="llm.base_url and llm.model missing.*DELTARL_LLM_BASE_URL"):
        LLMConfig().check()
    p = tmp_path / "c.yaml"
    p.write_text(f"scenario: CartPole-v1\naut: {BALANCER}\noutput: {tmp_path}/out\nworkers: 0\n"
                 f"safety: {{fuzzer: llmtester, budget: {{episodes: 10}}}}\n")
    # no endpoint: the local model, and when it is not installed one message naming the fix
    monkeypatch.setenv("DELTARL_LOCAL_LLM_MODEL", str(tmp_path / "missing.gguf"))
    with pytest.raises(CampaignError, match=r"safety.fuzzer: llmtester asks an LLM.*deltarl\[local-llm\].*base_url and model"):
        load_campaign(p)
    monkeypatch.delenv("DELTARL_LOCAL_LLM_MODEL")
    # only half an endpoint is an error, not the local model
    p2 = tmp_path / "half.yaml"
    p2.write_text(p.read_text() + "llm: {base_url: 'http://127.0.0.1:1/v1'}\n")
    with pytest.raises(CampaignError, match="safety.fuzzer: llmtester asks an LLM.*llm.model missing"):
        load_campaign(p2)
    p.write_text(p.read_text() + "llm: {base_url: 'http://127.0.0.1:1/v1', model: m, api_key_env: sk-abc123}\n")
    with pytest.raises(CampaignError, match="api_key_env must be the NAME of an environment variable.*not the key itself"):
        load_campaign(p)
    # the environment variables are enough
    monkeypatch.setenv("DELTARL_LLM_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("DELTARL_LLM_MODEL", "m")
    p.write_text(p.read_text().split("llm:")[0])
    assert load_campaign(p).safety.fuzzer == "llmtester"


# -- the rate limiter ----------------------------------------------------------------------------


@pytest.mark.slow
def test_rate_limiter_buckets_in_process():
    import asyncio

    async def go():
        lim = RateLimiter(requests_per_minute=600, tokens_per_minute=6000, max_concurrent=2)  # 10 req/s, 100 tok/s
        t0 = time.monotonic()
        grants = []
        for _ in range(5):
            tk = await lim.acquire(1)
            grants.append(time.monotonic() - t0)
            await lim.release(tk, 1, 200)
        gaps = np.diff(grants)
        assert gaps.min() >= 0.1 * 0.9  # one request per 0.1 s
        # tokens: 6000 available at once, then a 300-token call must wait ~3 s worth of refill
        tk = await lim.acquire(5990)
        await lim.release(tk, 5990, 200)
        t1 = time.monotonic()
        tk = await lim.acquire(300)
        assert time.monotonic() - t1 >= 2.5
        await lim.release(tk, None, 429, retry_after=0.3)
        t2 = time.monotonic()
        tk = await lim.acquire(0)
        assert time.monotonic() - t2 >= 0.3 * 0.9  # a 429 pauses every caller
        await lim.release(tk)
        assert lim.throttled == 1 and lim.in_flight == 0

    asyncio.run(go())


@pytest.mark.ray
def test_rate_limit_holds_across_four_actors(ray_cluster):
    """4 generator actors, 16 concurrent calls, one limiter at 240 requests/min: the limiter grants
    them at least 0.25 s apart and the server sees them arrive at that pace."""
    import ray

    from orchestrator.cluster.llm_pool import RayLLMPool

    with LLMStubServer() as srv:
        pool = RayLLMPool(cfg(srv, requests_per_minute=240, max_concurrent=8, actors=4))
        try:
            t0 = time.monotonic()
            replies = ask(pool, n=16)
            took = time.monotonic() - t0
            lim = pool.limiter_stats()
            grants = ray.get(pool.limiter.recent_grants.remote())
        finally:
            pool.close()
    assert all(r["ok"] for r in replies) and len(srv.requests) == 16
    # at the limiter: every grant at least 60/240 s after the previous one
    assert np.diff(np.sort(grants)).min() >= 0.25 * 0.95
    # at the server: a request may be delayed in transit (a busy 2-core machine), so the margin
    # is taken over windows of 8 gaps: no 9 requests arrive within less than 8 x 0.25 s - 0.4 s
    # (without the limiter all 16 would arrive within a few milliseconds)
    arrivals = np.sort([r["t"] for r in srv.requests])
    window = arrivals[8:] - arrivals[:-8]
    assert window.min() >= 8 * 0.25 - 0.4, np.diff(arrivals)
    assert arrivals[-1] - arrivals[0] >= 15 * 0.25 * 0.9
    assert took < 15  # the calls did run concurrently through 4 actors
    assert lim["granted"] == 16 and lim["max_in_flight"] >= 1


# -- LLMTester's multi-scale strategy --------------------------------------------------------------


def test_multi_scale_sends_only_low_potential_seeds_to_the_llm():
    sc = get_scenario("CartPole-v1")
    f = make_fuzzer("llmtester", sc, seed=0, alpha=20.0)
    rets = np.arange(100, dtype=float)  # potentials -0 .. -99
    f.corpus.add(sc.sample(np.random.default_rng(0), 100), energy=np.ones(100), **{
        "return": rets, "sensitivity": np.ones(100), "log_density": np.zeros(100), "parent": -np.ones(100)})
    high = f.high_potential(rets)
    assert high.sum() == 20 and high[:20].all()  # the 20% lowest returns are near failure
    f.alpha = 0.0
    assert not f.high_potential(rets).any()  # alpha -> 0: the generator is the LLM alone
    g = make_fuzzer("llmtester", sc, seed=0, multi_scale=False)
    g.corpus = f.corpus
    assert not g.high_potential(rets).any()


def test_alpha_adapts_as_eq_6():
    f = make_fuzzer("llmtester", get_scenario("CartPole-v1"), seed=0, alpha=20.0, beta=0.5, delta=0.1)
    def fail_at(tests, fails):
        f._update_alpha(tests, fails)
        return f.alpha

    assert fail_at(10, 1) == 20.0  # the first failure sets f = 0.1
    assert fail_at(20, 2) == 20.0  # 0.1: within ±δ
    assert fail_at(40, 3) == 10.0  # 0.075 < 0.9·0.1 -> α·β
    assert fail_at(41, 4) == 20.0  # 0.098 > 1.1·0.075 -> α/β
    f.alpha = 80.0
    assert fail_at(42, 10) == 100.0  # capped at 100 percent


def test_multi_scale_parameters_default_to_table_i_per_scenario():
    from orchestrator.fuzzers.llmtester import TABLE_I

    assert TABLE_I == {"ACASXu": (25.0, 0.7, 0.1), "BipedalWalker": (10.0, 0.7, 0.1), "CoopNavi": (20.0, 0.5, 0.1)}
    for name, want in TABLE_I.items():
        f = make_fuzzer("llmtester", get_scenario(name), seed=0)
        assert (f.alpha, f.beta, f.delta) == want, name
    f = make_fuzzer("llmtester", get_scenario("ACASXu"), seed=0, beta=0.5)  # a given value wins
    assert (f.alpha, f.beta, f.delta) == (25.0, 0.5, 0.1)
    f = make_fuzzer("llmtester", get_scenario("CartPole-v1"), seed=0)  # not in Table I
    assert (f.alpha, f.beta, f.delta) == (20.0, 0.5, 0.1)


@pytest.mark.slow
def test_bad_case_feedback_reaches_the_next_prompt():
    """Algorithm 1's testing feedback F: a malformed reply (invalidity), a far jump (excessive
    modification) and a scenario that did not lower the reward (insufficient challenge) each
    become a line under "Testing Feedback" in the prompts of the next generation, verbatim."""
    from orchestrator.fuzzers import Feedback
    from workers.policies import load_policy
    from workers.rollout import rollout

    sc = get_scenario("CartPole-v1")
    pol = load_policy(BALANCER, sc)  # 500 from every start: no LLM scenario lowers the reward
    with LLMStubServer(script=["malformed", "far"], step=0.05) as srv:
        pool = LocalLLMPool(cfg(srv, max_concurrent=1))
        prompts: list[list[str]] = []

        def generate(requests):
            prompts.append([r["messages"][1]["content"] for r in requests])
            return pool.generate(requests)

        # no multi-scale (every seed goes to the LLM); t_r = -1: a reward that did not fall by 1 is
        # an insufficient challenge
        f = make_fuzzer("llmtester", sc, seed=0, multi_scale=False, t_r=-1.0, feedback_size=10)
        f.attach_llm(generate)
        new_lines = []
        try:
            for g in range(10):
                if g == 2:
                    f.start_phase("fuzzing")
                before = list(f._bad)
                calls = len(prompts)
                p = f.propose(2)
                res = rollout(sc, {"aut": pol}, p.states, seed=g, max_steps=100)
                f.observe(p, Feedback.from_result(res))
                if len(prompts) > calls:
                    new_lines.append((len(prompts) - 1, [b for b in f._bad if b not in before]))
        finally:
            pool.close()
    assert len(prompts) >= 3  # three generations asked the LLM
    assert "- none yet" in prompts[0][0]  # the first prompt has no feedback
    kinds = set()
    for k, (_call, lines) in enumerate(new_lines[:-1]):
        nxt = prompts[new_lines[k + 1][0]]
        for line in lines:
            kinds.add(line.split(":")[0])
            for text in nxt:  # every later request carries it, under its heading
                head = text.index("### Testing Feedback")
                assert f"- {line}" in text[head:text.index("### Expert Experience")]
    assert kinds == {"Invalidity", "Excessive modification", "Insufficient challenge"}, kinds


def test_failures_are_counted_by_the_operator_that_made_the_test():
    """Does the LLM's scenario fail more often than a random mutation? Each failing fuzzing test
    is counted under its operator (the LLM's scenario, the multi-scale random mutation, the random
    mutation replacing an unusable reply); twins and seeds under none. The generator answers
    usable and unusable replies in turn; the feedback fails a chosen set of tests."""
    import json as _json

    from orchestrator.fuzzers import Feedback
    from orchestrator.fuzzers.llmtester import FAILURES_BY_OPERATOR

    sc = get_scenario("CartPole-v1")
    turn = {"n": 0}

    def generate(requests):
        out = []
        for _request in requests:  # one reply each, by turn
            turn["n"] += 1
            state = dict(zip(sc.state_names, (0.01 * (turn["n"] % 5), 0.0, 0.0, 0.0)))
            text = _json.dumps({"new_state": state}) if turn["n"] % 3 else "no state here"
            out.append({"ok": True, "text": text, "prompt_tokens": 10, "completion_tokens": 5})
        return out

    f = make_fuzzer("llmtester", sc, seed=0, alpha=50.0)
    f.attach_llm(generate)
    rng = np.random.default_rng(3)
    want = dict.fromkeys(FAILURES_BY_OPERATOR.values(), 0)
    for g in range(12):
        if g == 2:
            f.start_phase("fuzzing")
        p = f.propose(8)
        n = len(p.states)
        failure = rng.random(n) < 0.4
        returns = np.where(failure, 5.0, 50.0) + rng.random(n)
        for i in np.flatnonzero(failure):
            if p.tags["kind"][i] == "mutant":
                want[FAILURES_BY_OPERATOR[str(p.tags["operator"][i])]] += 1
        f.observe(p, Feedback(returns=returns, lengths=np.where(failure, 5, 50), terminated=failure.copy(),
                              failure=failure, traj_obs=[np.zeros((2, 4))] * n))
    s = f.stats()
    got = {k: s[k] for k in want}
    assert got == want and all(v > 0 for v in want.values()), (got, want)


# -- the whole loop -----------------------------------------------------------------------------


def _campaign(tmp_path, srv, workers, budget=96, extra=""):
    p = tmp_path / "llm.yaml"
    p.write_text(f"""
name: llm-loop
scenario: CartPole-v1
aut: {BALANCER}
workers: {workers}
output: {tmp_path / 'run'}
mlflow: true
safety:
  fuzzer: llmtester
  params: {{alpha: 20.0, beta: 0.5, delta: 0.1, amplitude: 0.3}}
  budget: {{episodes: {budget}}}
  sampling_fraction: 0.25
  generation_size: 12
llm:
  base_url: {srv.base_url}
  model: stub-model
  api_key_env: DELTARL_TEST_LLM_KEY
  requests_per_minute: 3000
  max_concurrent: 4
  actors: 2
  timeout_s: 1.0
  backoff_s: 0.05
{extra}""")
    return load_campaign(p)


@pytest.mark.ray
def test_llmtester_campaign_against_the_local_server(tmp_path, ray_cluster, monkeypatch):
    """The whole generate-test-feedback loop on Ray actors, with malformed replies, 429s, a 500,
    an out-of-bounds state, a far jump and a hang in the script: the campaign completes, counts
    them, feeds them back, audits every call, and no file holds the API key."""
    from orchestrator.campaign.pipeline import run_campaign

    secret = "sk-deltarl-SECRET-7f3a9"
    monkeypatch.setenv("DELTARL_TEST_LLM_KEY", secret)
    script = ["malformed", "429", "out_of_bounds", "far", "500", "hang", "malformed", "bad_body"]
    with LLMStubServer(script=script, step=0.5, hang_s=2.5, expected_key=secret) as srv:
        c = _campaign(tmp_path, srv, workers=1)
        c.scenario_overrides = {}
        out = run_campaign(c, progress=False)
    s = out["safety"]
    assert s["episodes"] == 96
    run = Path(c.output)
    timeline = pd.read_parquet(run / "timeline.parquet")
    last = timeline.iloc[-1]
    assert last["llm_calls"] > 0 and last["llm_tokens"] > 0
    # every new scenario of the fuzzing phase was made by one operator (the rest of its 72 episodes
    # are MDPFuzz's twins that measure sensitivity)
    assert last["llm_calls"] + last["random_mutations"] == last["fuzz_tests"] and 0 < last["fuzz_tests"] <= 72
    assert last["llm_bad_cases"] >= 3  # malformed x2, out of bounds, far
    assert last["llm_fallbacks"] >= 3
    audit = pd.read_parquet(run / "llm")
    assert len(audit) == last["llm_calls"]
    assert audit["attempts"].sum() == len(srv.requests)  # every HTTP request accounted for
    assert audit["ok"].all()  # 429/500/hang/bad body were retried to success
    assert all(r["key_ok"] for r in srv.requests)  # the key reached the server ...
    for f in run.rglob("*"):  # ... and nowhere else
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    camp = json.loads((run / "campaign.json").read_text())
    assert camp["llm"]["api_key_env"] == "DELTARL_TEST_LLM_KEY" and "SECRET" not in json.dumps(camp)
    # MLflow got the LLM figures
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and runs[0].data.metrics["llm_calls"] == last["llm_calls"]


@pytest.mark.campaign
def test_llmtester_as_an_optimality_fuzzer(tmp_path):
    """Under the differential oracle (AUT vs a challenger from the same LLM-made states)."""
    from orchestrator.campaign.pipeline import run_campaign

    with LLMStubServer(step=0.3) as srv:
        p = tmp_path / "opt.yaml"
        p.write_text(f"""
scenario: CartPole-v1
aut: random:3
workers: 0
output: {tmp_path / 'run'}
mlflow: false
safety: null
optimality:
  fuzzer: llmtester
  challenger: "{BALANCER}"
  budget: {{episodes: 48}}
  sampling_fraction: 0.25
  generation_size: 12
llm: {{base_url: "{srv.base_url}", model: stub, requests_per_minute: 6000, timeout_s: 2}}
""")
        out = run_campaign(load_campaign(p), progress=False)
    o = out["optimality"]
    assert o["cases"] == 48 and o["bugs"] > 0  # the balancer beats a random AUT almost everywhere
    timeline = pd.read_parquet(tmp_path / "run" / "optimality_timeline.parquet")
    assert timeline["llm_calls"].iloc[-1] > 0
    assert len(pd.read_parquet(tmp_path / "run" / "llm")) == timeline["llm_calls"].iloc[-1]


@pytest.mark.slow
def test_an_endpoint_that_is_not_there_stops_with_a_clear_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on this port now
    pool = LocalLLMPool(LLMConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1,
                                  backoff_s=0.01, timeout_s=1.0))
    try:
        # what the person can do next: no run folder here, so nothing to resume (a run that committed a
        # generation is told `deltarl run --resume RUN`: the never-answering server's test)
        with pytest.raises(LLMFatalError, match=f"cannot reach the LLM endpoint http://127.0.0.1:{port}/v1.*"
                                                f"nothing was committed yet: run the campaign again"):
            ask(pool, n=2)
    finally:
        pool.close()


# -- replies of small and large models: constrained JSON, tolerant parsing, invalid replies counted --


def test_tolerant_parsing_of_what_models_write():
    """Fences, prose around the JSON, trailing commas, single quotes, numbers as strings, keys in
    another case, the state under new_state (the JSON replies with reasoning fields): all parse."""
    from orchestrator.fuzzers.llm_prompt import reply_schema

    sc = get_scenario("CartPole-v1")
    want = [0.01, -0.02, 0.03, 0.0]
    good = [
        'Sure!\n```json\n{"x": 0.01, "x_dot": -0.02, "theta": 0.03, "theta_dot": 0.0,}\n```\nGood luck.',
        "{'x': 0.01, 'x_dot': -0.02, 'theta': 0.03, 'theta_dot': 0}",
        '{"x": "0.01", "x_dot": "-0.02", "theta": 0.03, "theta_dot": 0}',
        '{"X": 0.01, "X_dot": -0.02, "Theta": 0.03, "Theta_dot": 0}',
        '{"scenario_analysis": "tilted", "plan": "more {tilt}", "new_state": '
        '{"x": 0.01, "x_dot": -0.02, "theta": 0.03, "theta_dot": 0}}',
        'NEW_STATE: {"NEW_STATE": {"x": 0.01, "x_dot": -0.02, "theta": 0.03, "theta_dot": 0}}',
        '{"reply": {"analysis": "x", "result": {"x": 0.01, "x_dot": -0.02, "theta": 0.03, "theta_dot": 0}}}',
    ]
    for text in good:
        np.testing.assert_allclose(parse_reply(text, sc), want, err_msg=text)
    # the schemas a request carries: the state alone, or the reasoning steps and new_state
    s = reply_schema(sc, reasoning=False)
    assert s["required"] == list(sc.state_names) and s["additionalProperties"] is False
    r = reply_schema(sc, reasoning=True)
    assert list(r["properties"])[-1] == "new_state" and r["properties"]["new_state"] == s
    bad = [('{"x": 1e999, "x_dot": 0, "theta": 0, "theta_dot": 0}', "invalid scenario"),
           ('{"x": ' + "9" * 400 + ', "x_dot": 0, "theta": 0, "theta_dot": 0}', "invalid scenario"),
           ('{"x": [1], "x_dot": 0, "theta": 0, "theta_dot": 0}', "must be a number"),
           ('{"x": 0.01, "x_dot": 0}', "lacked theta, theta_dot"),
           ("{{{{ ]]] NEW_STATE: {", "no machine-readable state")]
    for text, msg in bad:
        with pytest.raises(ReplyError, match=msg):
            parse_reply(text, sc)
    rng = np.random.default_rng(0)  # whatever comes back: a state or a ReplyError, nothing else
    alphabet = list('{}[]":,0123456789.-eE xNEW_STATEnew_state\'`\ntheta_dot')
    for _ in range(300):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 80))))
        try:
            parse_reply(text, sc)
        except ReplyError:
            pass


def test_integer_states_are_listed_in_the_schema_and_printed_as_integers():
    """BipedalWalker's obstacle kinds: the reply schema allows 1, 2 and 3 only (a constrained model
    cannot write 0.2 or 3.5), the prompt shows the seed as integers; real-valued states stay numbers."""
    from orchestrator.fuzzers.llm_prompt import reply_schema, state_json

    bw = get_scenario("BipedalWalker")
    s = reply_schema(bw, reasoning=False)
    assert all(v == {"type": "integer", "enum": [1, 2, 3]} for v in s["properties"].values())
    assert len(s["properties"]) == 15 and reply_schema(bw, reasoning=True)["properties"]["new_state"] == s
    seed = np.array([1, 2, 3] * 5, dtype=np.float64)
    shown = json.loads(state_json(bw, seed))
    assert list(shown.values()) == [1, 2, 3] * 5 and '"obstacle_1": 1,' in state_json(bw, seed)
    np.testing.assert_array_equal(parse_reply(state_json(bw, seed), bw), seed)
    cp = get_scenario("CartPole-v1")
    assert all(v == {"type": "number"} for v in reply_schema(cp, reasoning=False)["properties"].values())
    assert json.loads(state_json(cp, np.array([0.5, 0.0, -0.01, 1.0]))) == {"x": 0.5, "x_dot": 0.0, "theta": -0.01,
                                                                            "theta_dot": 1.0}


@pytest.mark.slow
def test_response_format_auto_steps_down_to_what_the_server_takes(tmp_path):
    """``response_format: auto`` sends OpenAI's json_schema; a server that refuses it (as
    llama-cpp-python's does, with HTTP 500) gets llama.cpp's json_object + schema from then on, and
    one that refuses both gets plain text; no retry budget is spent on the refusals."""
    from orchestrator.fuzzers.llm_prompt import reply_schema

    sc = get_scenario("CartPole-v1")
    msgs = build_messages(sc, ScenarioInfo.load(sc), np.zeros(4), 1.0, [], [], output="json")
    reqs = [{"request_id": f"r{i}", "messages": msgs, "schema": reply_schema(sc, False)} for i in range(3)]
    for rejected, final in (((), "json_schema"), (("json_schema",), "json_object"),
                            (("json_schema", "json_object"), "text")):
        with LLMStubServer(default="json", reject_formats=rejected) as srv:
            pool = LocalLLMPool(cfg(srv, max_concurrent=1, max_retries=0), tmp_path / final)
            try:
                replies = pool.generate(reqs)
            finally:
                pool.close()
        assert all(r["ok"] for r in replies) and [r["response_format"] for r in replies] == [final] * 3
        assert [r["format"] for r in srv.requests if r["action"] != "rejected"] == [final] * 3
        sent = srv.requests[0]
        assert sent["format"] == "json_schema"
        for r in replies:
            parse_reply(r["text"], sc)
    # a format named explicitly is not stepped down: the refusal is an error like any other
    with LLMStubServer(default="json", reject_formats=("json_schema",)) as srv:
        pool = LocalLLMPool(cfg(srv, max_retries=0, response_format="json_schema"))
        try:
            (reply,) = pool.generate(reqs[:1])
        finally:
            pool.close()
    assert not reply["ok"] and "HTTP 500" in reply["error"]
    with pytest.raises(LLMConfigError, match="response_format.*one of auto, json_schema, json_object, text"):
        LLMConfig(base_url="http://x/v1", model="m", response_format="yaml").check()


def test_invalid_replies_are_counted_and_logged_never_a_crash(tmp_path, caplog):
    """Every reply is a usable state or an invalid reply: counted (unparseable or out of bounds),
    logged with its request id, fed back, and the seed falls back to the random mutation."""
    import logging

    sc = get_scenario("CartPole-v1")
    script = ["malformed", "garbage", "fenced", "nested", "json", "out_of_bounds", "bad_body", "ok"]
    with LLMStubServer(script=script, step=0.05) as srv:
        pool = LocalLLMPool(cfg(srv, max_concurrent=1, max_retries=0))
        f = make_fuzzer("llmtester", sc, seed=0, multi_scale=False)
        f.attach_llm(pool.generate, structured=True, reasoning=True)
        try:
            with caplog.at_level(logging.WARNING, logger="deltarl.llm"):
                states = sc.sample(np.random.default_rng(0), len(script))
                out, ops = f._mutate_parents(states, np.arange(len(script)), np.full(len(script), 100.0))
        finally:
            pool.close()
    s = f.stats()
    assert s["llm_calls"] == 8 and s["llm_failed"] == 1  # the bad body, after its (0) retries
    assert s["llm_unparseable"] == 2 and s["llm_invalid"] == 1  # malformed, garbage; out of bounds
    assert s["llm_usable"] == 4  # fenced, nested, json, ok
    assert ops.count("llm") == 4 and ops.count("llm_fallback") == 4
    assert np.all(out >= sc.low) and np.all(out <= sc.high)
    logged = [r.getMessage() for r in caplog.records if "invalid LLM reply" in r.getMessage()]
    assert len(logged) == 3 and "g0-r0-seed0" in logged[0] and "llm_unparseable" in logged[0]
    assert sum(b.startswith("Invalidity") for b in f._bad) == 3
    # the requests asked for JSON with the schema of the reasoning steps and the state
    assert all(r["format"] == "json_schema" for r in srv.requests)


@pytest.mark.campaign
def test_the_local_model_server_is_stopped_on_ctrl_c(tmp_path, monkeypatch):
    """A campaign without an endpoint starts the local model's server for the phase (here the test
    double in its place) and stops it when the phase ends, also when Ctrl-C interrupts it."""
    from orchestrator.campaign.pipeline import run_campaign
    from orchestrator.fuzzers.llmtester import LLMTester
    from workers import local_llm

    events = []

    class FakeServer:  # what LocalLLMServer does, around the test double
        def __init__(self, log_path=None, **kw):
            self.srv = LLMStubServer(default="json", step=0.05, reject_formats=("json_schema",))
            self.base_url, self.model = self.srv.base_url, local_llm.MODEL_ALIAS

        def start(self):
            events.append("start")
            self.srv.__enter__()
            return self

        def stop(self):
            events.append("stop")
            self.srv.__exit__(None, None, None)

    monkeypatch.setattr(local_llm, "LocalLLMServer", FakeServer)
    monkeypatch.setattr(local_llm, "check_installed", lambda: tmp_path / "model.gguf")
    for var in ("DELTARL_LLM_BASE_URL", "DELTARL_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    calls = {"n": 0}
    real = LLMTester._mutate_parents

    def interrupted(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(LLMTester, "_mutate_parents", interrupted)
    p = tmp_path / "c.yaml"
    p.write_text(f"scenario: CartPole-v1\naut: {BALANCER}\nworkers: 0\noutput: {tmp_path / 'run'}\nmlflow: false\n"
                 f"safety: {{fuzzer: llmtester, params: {{multi_scale: false}}, budget: {{episodes: 40}}, "
                 f"sampling_fraction: 0.2, generation_size: 8}}\n")
    with pytest.raises(KeyboardInterrupt):
        run_campaign(load_campaign(p), progress=False)
    assert events == ["start", "stop"]
    audit = pd.read_parquet(tmp_path / "run" / "llm")
    assert len(audit) > 0 and (audit["model"] == local_llm.MODEL_ALIAS).all()
    assert (audit["response_format"] == "json_object").all()  # the local model's setting, not auto
