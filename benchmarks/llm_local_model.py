"""SmolLM2-135M-Instruct (the local model) with LLMTester's prompts: speed and valid replies.

    python benchmarks/llm_local_model.py [--scenarios CartPole-v1 Acrobot-v1] [--requests 8]
        [--modes json json_reasoning text] [--threads N] [--max-tokens 256] [--out FILE.md]

Starts the local server (``workers.local_llm``, as a campaign does), sends ``--requests`` LLMTester
prompts per scenario and reply mode, one at a time, streamed, seeds drawn from the scenario's
reset distribution (seed 0), and prints one row per mode and scenario:

* ``json``: the JSON state alone, constrained by the schema (llama.cpp's ``json_object`` +
  ``schema``), what a campaign with the local model sends;
* ``json_reasoning``: the paper's six reasoning steps as JSON string fields, then ``new_state``,
  constrained by the schema (what ``reasoning: true`` sends);
* ``text``: the paper's format unconstrained (reasoning under headings, then ``NEW_STATE: {...}``).

Columns: seconds per request (mean), time to the first token (prompt processing), generation
tokens/s (reply tokens after the first / the time they took), prompt tokens, reply tokens, the
share of replies cut by ``--max-tokens``, and the share that gave a valid state (parsed and
inside the bounds), an out-of-bounds state, no state at all, and a state equal to the seed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs import get_scenario  # noqa: E402
from orchestrator.fuzzers.llm_prompt import ReplyError, ScenarioInfo, build_messages, parse_reply, reply_schema  # noqa: E402
from workers.local_llm import LocalLLMServer  # noqa: E402


def one(port: int, model: str, messages: list, schema: dict | None, max_tokens: int) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "stream": True}
    if schema is not None:
        body["response_format"] = {"type": "json_object", "schema": schema}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, chunks, text, finish = None, 0, [], None
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        d = json.loads(line[5:])
        if not d.get("choices"):
            continue
        c = d["choices"][0]
        finish = c.get("finish_reason") or finish
        piece = (c.get("delta") or {}).get("content")
        if piece:
            chunks += 1  # llama-cpp-python streams one token per chunk
            text.append(piece)
            ttft = ttft if ttft is not None else time.monotonic() - t0
    total = time.monotonic() - t0
    conn.close()
    return {"seconds": total, "ttft": ttft if ttft is not None else total, "tokens": chunks, "text": "".join(text),
            "cut": finish == "length"}


def prompt_tokens(port: int, model: str, messages: list) -> int:
    """Prompt tokens as the server counts them (a 1-token non-streamed request)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": model, "messages": messages, "max_tokens": 1}),
                 {"Content-Type": "application/json"})
    usage = json.loads(conn.getresponse().read()).get("usage") or {}
    conn.close()
    return int(usage.get("prompt_tokens") or 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", default=["CartPole-v1"])
    ap.add_argument("--requests", type=int, default=8, help="requests per scenario and mode (default 8)")
    ap.add_argument("--modes", nargs="+", default=["json", "json_reasoning", "text"],
                    choices=["json", "json_reasoning", "text"])
    ap.add_argument("--threads", type=int, default=None, help="server threads (default: the campaign's default)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    args = ap.parse_args(argv)

    import os

    load0 = os.getloadavg()[0]  # the machine is shared: the numbers depend on what else runs
    rows = []
    with LocalLLMServer(threads=args.threads) as srv:
        for name in args.scenarios:
            sc = get_scenario(name)
            info = ScenarioInfo.load(sc)
            seeds = sc.sample(np.random.default_rng(0), args.requests)
            for mode in args.modes:
                schema = None if mode == "text" else reply_schema(sc, reasoning=mode == "json_reasoning")
                res = []
                for s in seeds:
                    msgs = build_messages(sc, info, s, 50.0, [], info.expert, output=mode)
                    r = one(srv.port, srv.model, msgs, schema, args.max_tokens)
                    try:
                        state = parse_reply(r["text"], sc)
                        r["verdict"] = "valid"
                        width = sc.high - sc.low
                        r["unchanged"] = bool(np.all(np.abs(state - s) <= 1e-5 * width + 1e-12))
                    except ReplyError as exc:
                        r["verdict"] = "out of bounds" if str(exc).startswith("invalid scenario") else "no state"
                        r["unchanged"] = False
                    res.append(r)
                    print(f"  {name} {mode}: {r['seconds']:.1f} s, {r['tokens']} tokens, {r['verdict']}", file=sys.stderr,
                          flush=True)
                ptok = prompt_tokens(srv.port, srv.model, build_messages(sc, info, seeds[0], 50.0, [], info.expert,
                                                                         output=mode))
                gen = [(r["tokens"] - 1) / (r["seconds"] - r["ttft"]) for r in res if r["tokens"] > 1
                       and r["seconds"] > r["ttft"]]
                n = len(res)
                rows.append({"scenario": name, "mode": mode, "n": n,
                             "s/request": statistics.mean(r["seconds"] for r in res),
                             "first token s": statistics.mean(r["ttft"] for r in res),
                             "gen tok/s": statistics.median(gen) if gen else float("nan"),
                             "prompt tok": ptok, "reply tok": statistics.mean(r["tokens"] for r in res),
                             "cut": sum(r["cut"] for r in res) / n,
                             "valid": sum(r["verdict"] == "valid" for r in res) / n,
                             "out of bounds": sum(r["verdict"] == "out of bounds" for r in res) / n,
                             "no state": sum(r["verdict"] == "no state" for r in res) / n,
                             "= seed": sum(r["unchanged"] for r in res) / n})
        threads = srv.threads
    fmt = {"s/request": "{:.1f}", "first token s": "{:.1f}", "gen tok/s": "{:.1f}", "reply tok": "{:.0f}",
           "cut": "{:.0%}", "valid": "{:.0%}", "out of bounds": "{:.0%}", "no state": "{:.0%}", "= seed": "{:.0%}"}
    note = (f"SmolLM2-135M-Instruct Q4_1, llama-cpp-python 0.3.36, {threads} server thread(s), max_tokens "
            f"{args.max_tokens}, temperature 0.7, {os.cpu_count()} CPUs, 1-minute load average "
            f"{load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end; `python benchmarks/llm_local_model.py "
            f"{' '.join(sys.argv[1:])}`".rstrip())
    print_table(rows, fmt, note, args.out)
    return 0


def print_table(rows: list[dict], fmt: dict, note: str, out: str | None, numbers_right: bool = False) -> None:
    """Print ``rows`` as a markdown table (``fmt``: a format per column, ``str`` for the others),
    then ``note``; also write both to ``out`` when given. ``numbers_right``: every column after
    the first right-aligned."""
    head = list(rows[0])
    align = "|---|" + "---:|" * (len(head) - 1) if numbers_right else "|" + "---|" * len(head)
    lines = ["| " + " | ".join(head) + " |", align]
    for r in rows:
        lines.append("| " + " | ".join(fmt.get(k, "{}").format(r[k]) for k in head) + " |")
    table = "\n".join(lines)
    print(table + "\n\n" + note)
    if out:
        Path(out).write_text(table + "\n\n" + note + "\n")


if __name__ == "__main__":
    sys.exit(main())
