"""LLMTester's loop end to end, against an OpenAI-compatible endpoint: Table II / Fig. 7 / Fig. 10.

    python benchmarks/llmtester_local.py [--scenario Acrobot-v1] [--aut zoo:Acrobot-v1]
        [--episodes 600] [--seeds 0 1] [--base-url URL --model NAME] [--out runs/llmtester-local]

Runs Random, MDPFuzz, LLMTester and LLMTester without the multi-scale strategy ("ours w/o ms")
with equal budgets and prints, per method (mean ± 95% CI margin over seeds): failures, failure
rate, distinct entire / initial / terminal failure states (grid of 10 intervals per dimension),
LLM calls, and the share of calls the multi-scale strategy saved against "w/o ms".

Without ``--base-url`` the LLM is deltarl's test double (``tests/llm_server.py``): a local HTTP
server that answers every prompt in the requested format with the seed moved by a prompt-hashed
pseudo-random step. It measures the machinery (prompting, parsing, rate limiting, feedback,
multi-scale bookkeeping, LLM calls per test), not what a real model would find: a real model's
numbers need ``--base-url`` and ``--model`` (key from ``$OPENAI_API_KEY`` or ``--api-key-env``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METHODS = {"random": ("random", {}), "mdpfuzz": ("mdpfuzz", {}), "llmtester": ("llmtester", {}),
           "llmtester w/o ms": ("llmtester", {"multi_scale": False})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="Acrobot-v1")
    ap.add_argument("--aut", default="zoo:Acrobot-v1")
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--episodes", type=int, default=600)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--generation-size", type=int, default=24)
    ap.add_argument("--alpha", type=float, default=20.0)
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY")
    ap.add_argument("--rpm", type=float, default=600.0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--out", default="runs/llmtester-local")
    args = ap.parse_args()

    from orchestrator.analysis.stats import mean_ci
    from orchestrator.campaign.config import (
        Budget,
        Campaign,
        SafetySpec,
        validate_campaign,
    )
    from orchestrator.campaign.safety import run_safety
    from workers.llm import LLMConfig

    stack = contextlib.ExitStack()
    if args.base_url:
        base_url, model, endpoint = args.base_url, args.model, f"{args.model} at {args.base_url}"
    else:
        from tests.llm_server import LLMStubServer

        srv = stack.enter_context(LLMStubServer(step=0.15))
        base_url, model, endpoint = srv.base_url, "deltarl-stub", "the local test double (tests/llm_server.py)"
    llm = LLMConfig(base_url=base_url, model=model, api_key_env=args.api_key_env, requests_per_minute=args.rpm,
                    max_concurrent=8, actors=2)
    rows = {}
    with stack:
        for name in args.methods:
            fz, params = METHODS[name]
            if fz == "llmtester":
                params = {"alpha": args.alpha, "beta": args.beta, "delta": args.delta, **params}
            for seed in args.seeds:
                out = Path(args.out) / f"{args.scenario}-{name.replace(' ', '').replace('/', '')}-s{seed}"
                if (out / "summary.json").is_file():
                    s = json.loads((out / "summary.json").read_text())
                    s["timeline_last"] = json.loads((out / "last_row.json").read_text())
                else:
                    c = Campaign(scenario=args.scenario, aut=args.aut, output=str(out), name=f"{name}-s{seed}",
                                 seed=seed, workers=args.workers, mlflow=False, llm=llm,
                                 safety=SafetySpec(fuzzer=fz, params=params, budget=Budget(episodes=args.episodes),
                                                   generation_size=args.generation_size))
                    validate_campaign(c)
                    s = run_safety(c, progress=False)
                    import pandas as pd

                    last = pd.read_parquet(out / "timeline.parquet").iloc[-1].to_dict()
                    s["timeline_last"] = {k: (v.item() if hasattr(v, "item") else v) for k, v in last.items()}
                    (out / "last_row.json").write_text(json.dumps(s["timeline_last"]))
                rows.setdefault(name, []).append(s)
                fs = s["failure_states"]
                print(f"{name} seed {seed}: {s['failures']} failures, entire/initial/terminal "
                      f"{fs['entire']}/{fs['initial']}/{fs['terminal']}, "
                      f"{s['timeline_last'].get('llm_calls', 0)} LLM calls, {s['wall_seconds']:.0f} s",
                      file=sys.stderr, flush=True)

    def cell(values, digits=1):
        m, h = mean_ci(values)
        return f"{m:.{digits}f}" + ("" if h != h else f" ± {h:.{digits}f}")

    print(f"{args.scenario}, AUT {args.aut}, {args.episodes} episodes per campaign (a quarter sampling), "
          f"generations of {args.generation_size}, seeds {args.seeds}; LLM: {endpoint}\n")
    print("| method | failures | failure rate | # entire | # initial | # terminal | LLM calls | LLM tokens | wall (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, ss in rows.items():
        calls = [s["timeline_last"].get("llm_calls", 0) or 0 for s in ss]
        toks = [s["timeline_last"].get("llm_tokens", 0) or 0 for s in ss]
        print(f"| {name} | {cell([s['failures'] for s in ss])} | {cell([s['failure_rate'] for s in ss], 3)} | "
              f"{cell([s['failure_states']['entire'] for s in ss])} | {cell([s['failure_states']['initial'] for s in ss])} "
              f"| {cell([s['failure_states']['terminal'] for s in ss])} | {cell(calls)} | {cell(toks, 0)} | "
              f"{cell([s['wall_seconds'] for s in ss], 0)} |")
    if "llmtester" in rows and "llmtester w/o ms" in rows:
        with_ms = sum(s["timeline_last"]["llm_calls"] for s in rows["llmtester"])
        without = sum(s["timeline_last"]["llm_calls"] for s in rows["llmtester w/o ms"])
        tests = sum(s["timeline_last"]["fuzz_tests"] for s in rows["llmtester"])
        print(f"\nLLM calls saved by the multi-scale strategy: {100 * (1 - with_ms / max(1, without)):.1f}% "
              f"({with_ms} calls with it, {without} without; {tests} fuzzing tests with it)")


if __name__ == "__main__":
    main()
