"""Does the local model's server reuse a prompt's shared prefix? (llama-cpp-python keeps the last
prompt's KV cache and evaluates only the tokens after the longest common prefix.)

    python benchmarks/llm_prefix_cache.py [--threads 1] [--facts 80]

Starts the local SmolLM2 server (``workers.local_llm``, as an LLMTester campaign does) and sends
four chat requests with the same long system message (``--facts`` sentences) and one reply
token: a fresh prompt, the same prompt again, and two prompts that differ only in the user
message. Prints seconds per request and prompt tokens. LLMTester's prompts put the scenario
information (the same for every request of a campaign) first and the seed, feedback and output
section last, so a campaign's requests after the first pay for their variable tail only; with
``prompt_layout: shared_first`` the feedback moves before the seed and the tail shrinks to the
seed and the output section (``benchmarks/llm_prompt_layout.py`` measures both layouts).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.local_llm import LocalLLMServer  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--facts", type=int, default=80)
    args = ap.parse_args(argv)
    system = "You are a helpful assistant. " + " ".join(
        f"Fact {i}: the value of item {i} is {i * 7 % 13}." for i in range(args.facts))
    rows = []
    with LocalLLMServer(threads=args.threads) as srv:
        def ask(user: str) -> tuple[float, int]:
            conn = http.client.HTTPConnection(srv.host, srv.port, timeout=600)
            body = {"model": srv.model, "max_tokens": 1, "temperature": 0,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
            t = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            reply = json.loads(conn.getresponse().read())
            return time.perf_counter() - t, int(reply["usage"]["prompt_tokens"])

        for what, user in [("fresh prompt", "question A: what is item 3?"),
                           ("the same prompt again", "question A: what is item 3?"),
                           ("same system message, other question", "question B: what is item 5?"),
                           ("same system message, third question", "question C: what is item 9?")]:
            rows.append((what, *ask(user)))
    print(f"SmolLM2-135M-Instruct, llama-cpp-python server, {args.threads} thread(s), one reply token\n")
    print("| request | seconds | prompt tokens |\n|---|---:|---:|")
    for what, sec, tok in rows:
        print(f"| {what} | {sec:.3f} | {tok} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
