"""LLMTester's prompt layouts against the local model: what one generation of requests costs.

    python benchmarks/llm_prompt_layout.py [--scenario BipedalWalker] [--requests 8] [--feedback 5]
        [--threads N] [--out FILE.md]

The requests of one LLMTester generation differ only in their seed: the scenario information,
the testing feedback (the last ``feedback_size`` bad cases) and the expert experience are the
same. llama-cpp-python's server keeps the last prompt's KV cache and evaluates only the tokens
after the longest common prefix (``benchmarks/llm_prefix_cache.py``). With the paper's order
(Fig. 4: Seed Scenario, Testing Feedback, Expert Experience; ``prompt_layout: paper``, the
default) the prompts diverge at the seed, so every request re-reads the feedback; with
``prompt_layout: shared_first`` (feedback, expert experience, then the seed) only the seed and
the output section are new after the generation's first request.

The script starts the local server as a campaign does (``workers.local_llm``), sends one
warm-up request (so the scenario information is cached, as it is in a running campaign), then
one generation of ``--requests`` prompts per layout, one at a time and streamed, as a campaign
with the local model sends them: JSON constrained by the reply schema, ``--feedback`` bad cases
of the fuzzer's "insufficient challenge" form, seeds from the scenario's reset distribution
(seed 0), the same seeds for both layouts. It prints one row per layout: seconds for the whole
generation, for its first request and for the later ones (mean), the time to the first reply
token of the later requests (prompt processing), prompt and reply tokens, the share of valid
replies, and the generation's time relative to the paper's layout (measured in the same run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm_local_model import one, print_table, prompt_tokens  # noqa: E402

from envs import get_scenario  # noqa: E402
from orchestrator.fuzzers.llm_prompt import (  # noqa: E402
    PROMPT_LAYOUTS,
    ReplyError,
    ScenarioInfo,
    build_messages,
    parse_reply,
    reply_schema,
)
from orchestrator.fuzzers.llmtester import insufficient_challenge  # noqa: E402
from workers.llm import LLMConfig  # noqa: E402
from workers.local_llm import LocalLLMServer  # noqa: E402


def bad_cases(sc, rng: np.random.Generator, n: int) -> list[str]:
    """``n`` feedback lines as the fuzzer writes an insufficient challenge."""
    states = sc.sample(rng, n)
    old, new = rng.uniform(-100, 250, n), rng.uniform(-100, 250, n)
    return [insufficient_challenge(sc, s, min(a, b), max(a, b)) for s, a, b in zip(states, old, new)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="BipedalWalker")
    ap.add_argument("--requests", type=int, default=8, help="requests in the generation (default 8)")
    ap.add_argument("--feedback", type=int, default=5, help="bad cases quoted in the prompts (default 5, "
                    "LLMTester's feedback_size)")
    ap.add_argument("--threads", type=int, default=None, help="server threads (default: the campaign's default)")
    ap.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    args = ap.parse_args(argv)
    if args.requests < 2:
        ap.error("--requests must be at least 2 (the first request of a generation is not cached)")

    sc = get_scenario(args.scenario)
    info = ScenarioInfo.load(sc)
    rng = np.random.default_rng(0)
    seeds = sc.sample(rng, args.requests + 1)
    feedback = bad_cases(sc, rng, args.feedback)
    schema = reply_schema(sc, reasoning=False)
    max_tokens = LLMConfig().max_tokens
    load0 = os.getloadavg()[0]
    rows = []
    with LocalLLMServer(threads=args.threads) as srv:
        one(srv.port, srv.model, build_messages(sc, info, seeds[-1], 50.0, feedback, info.expert, output="json"),
            schema, max_tokens)  # warm-up: a campaign's server holds the scenario information already
        for layout in PROMPT_LAYOUTS:
            res = []
            for s in seeds[:-1]:
                msgs = build_messages(sc, info, s, 50.0, feedback, info.expert, output="json", layout=layout)
                r = one(srv.port, srv.model, msgs, schema, max_tokens)
                try:
                    parse_reply(r["text"], sc)
                    r["valid"] = True
                except ReplyError:
                    r["valid"] = False
                res.append(r)
                print(f"  {layout}: {r['seconds']:.1f} s (first token {r['ttft']:.1f} s), {r['tokens']} tokens",
                      file=sys.stderr, flush=True)
            later = res[1:]
            rows.append({"layout": layout, "n": len(res), "generation s": sum(r["seconds"] for r in res),
                         "first request s": res[0]["seconds"],
                         "later requests s": statistics.mean(r["seconds"] for r in later),
                         "later first token s": statistics.mean(r["ttft"] for r in later),
                         "prompt tok": 0, "reply tok": statistics.mean(r["tokens"] for r in res),
                         "valid": sum(r["valid"] for r in res) / len(res)})
        for row in rows:  # counted after the timing, so that the counting requests leave the cache alone
            row["prompt tok"] = prompt_tokens(srv.port, srv.model, build_messages(
                sc, info, seeds[0], 50.0, feedback, info.expert, output="json", layout=row["layout"]))
        threads = srv.threads
    base = rows[0]["generation s"]
    for row in rows:
        row["vs paper"] = row["generation s"] / base
    fmt = {"generation s": "{:.1f}", "first request s": "{:.1f}", "later requests s": "{:.1f}",
           "later first token s": "{:.1f}", "reply tok": "{:.0f}", "valid": "{:.0%}", "vs paper": "{:.2f}"}
    note = (f"{args.scenario}, {args.feedback} bad cases of feedback, SmolLM2-135M-Instruct Q4_1, llama-cpp-python "
            f"server with {threads} thread(s), JSON replies constrained by the schema, temperature 0.7, "
            f"{os.cpu_count()} CPUs, 1-minute load average {load0:.1f} at the start and {os.getloadavg()[0]:.1f} "
            f"at the end; `python benchmarks/llm_prompt_layout.py {' '.join(sys.argv[1:])}`".rstrip())
    print_table(rows, fmt, note, args.out, numbers_right=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
