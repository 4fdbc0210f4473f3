"""LLMTester's loop end to end, against an OpenAI-compatible endpoint: Table II / Fig. 7 / Fig. 10.

    python benchmarks/llmtester_local.py [--profile local|results|smoke] [--scenario Acrobot-v1]
        [--aut zoo:Acrobot-v1] [--episodes 600] [--seeds 0 1] [--base-url URL --model NAME]
        [--out runs/llmtester-local]

Runs Random, MDPFuzz, LLMTester and LLMTester without the multi-scale strategy ("ours w/o ms")
with equal budgets and prints, per method (mean ± 95% CI margin over seeds): failures, failure
rate, distinct entire / initial / terminal failure states (grid of 10 intervals per dimension),
LLM calls, and the share of calls the multi-scale strategy saved against "w/o ms". The sweep
(method x seed) is the grid ``experiments/benchmarks/llmtester_local.yaml``, run through the
grid machinery with the options above as overrides of the profile.

Without ``--base-url`` the LLM is deltarl's test double (``tests/llm_server.py``): a local HTTP
server that answers every prompt in the requested format with the seed moved by a prompt-hashed
pseudo-random step. It measures the machinery (prompting, parsing, rate limiting, feedback,
multi-scale bookkeeping, LLM calls per test), not what a real model would find: a real model's
numbers need ``--base-url`` and ``--model`` (key from ``$OPENAI_API_KEY`` or ``--api-key-env``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import grid_runs
from orchestrator.campaign.grid import load_grid
from tests.llm_server import LLMStubServer

GRID = "llmtester_local"
METHODS = ["random", "mdpfuzz", "llmtester", "llmtester w/o ms"]


def label(fuzzer: str, params: dict | None) -> str:
    return fuzzer + (" w/o ms" if (params or {}).get("multi_scale") is False else "")


def method(campaign) -> str:
    """The table row a campaign of the grid belongs to."""
    return label(campaign.safety.fuzzer, campaign.safety.params)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="local", help="the grid file's profile (local, results, smoke)")
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--aut", default=None)
    ap.add_argument("--methods", nargs="+", default=None, help=f"default: {' '.join(repr(m) for m in METHODS)}")
    ap.add_argument("--episodes", type=int, default=None, help="episodes per campaign (default: the profile's)")
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the profile's")
    ap.add_argument("--generation-size", type=int, default=None)
    ap.add_argument("--alpha", type=float, default=None, help="LLMTester's multi-scale parameters (default: the grid's)")
    ap.add_argument("--beta", type=float, default=None)
    ap.add_argument("--delta", type=float, default=None)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY")
    ap.add_argument("--rpm", type=float, default=None, help="LLM requests per minute (default: the grid's)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", default=None, help="grid output root (default: the grid file's)")
    return ap.parse_args(argv)


def method_axis(args) -> list[dict]:
    """The grid file's method axis, restricted to --methods, LLMTester's parameters overridden."""
    axis = load_grid(grid_runs.grid_file(GRID), profile=args.profile)["axes"]["method"]
    by_label = {label(m["safety.fuzzer"], m.get("safety.params")): copy.deepcopy(m) for m in axis}
    unknown = [m for m in args.methods or () if m not in by_label]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown[0]!r}; known: {', '.join(map(repr, by_label))}")
    chosen = [by_label[m] for m in args.methods or by_label]
    for m in chosen:
        if m["safety.fuzzer"] == "llmtester":
            m["safety.params"].update({k: v for k, v in (("alpha", args.alpha), ("beta", args.beta),
                                                            ("delta", args.delta)) if v is not None})
    return chosen


def load(args, base_url: str, model: str) -> dict:
    grid = grid_runs.load(GRID, args.profile, out=args.out, settings={
        "scenario": args.scenario, "aut": args.aut, "workers": args.workers,
        "safety.budget": {"episodes": args.episodes} if args.episodes else None,
        "safety.generation_size": args.generation_size,
        "llm.model": model, "llm.api_key_env": args.api_key_env, "llm.requests_per_minute": args.rpm,
    }, axes={"method": method_axis(args), "seed": args.seeds})
    # after the output folder is named: the test double listens on a new port every time
    grid["base"]["llm"]["base_url"] = base_url
    return grid


def collect(runs) -> dict[str, list[dict]]:
    """Per method, each seed's safety summary with the last row of its timeline (LLM calls, tests)."""
    rows: dict[str, list[dict]] = {}
    for name, group in grid_runs.group(runs, method).items():
        for c, run in group:
            s = run.summary("safety")
            last = pd.read_parquet(run.timeline_parquet("safety")).iloc[-1].to_dict()
            s["timeline_last"] = {k: (v.item() if hasattr(v, "item") else v) for k, v in last.items()}
            rows.setdefault(name, []).append(s)
            fs = s["failure_states"]
            print(f"{name} seed {c.seed}: {s['failures']} failures, entire/initial/terminal "
                  f"{fs['entire']}/{fs['initial']}/{fs['terminal']}, "
                  f"{s['timeline_last'].get('llm_calls', 0)} LLM calls, {s['wall_seconds']:.0f} s", file=sys.stderr)
    return rows


def print_table(grid: dict, rows: dict[str, list[dict]], endpoint: str) -> None:
    base, cell = grid["base"], grid_runs.cell
    print(f"{base['scenario']}, AUT {base['aut']}, {base['safety']['budget']['episodes']} episodes per campaign "
          f"({base['safety']['sampling_fraction']:.0%} sampling), generations of {base['safety']['generation_size']}, "
          f"seeds {grid['axes']['seed']}; LLM: {endpoint}\n")
    print("| method | failures | failure rate | # entire | # initial | # terminal | LLM calls | LLM tokens | wall (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, ss in rows.items():
        calls = [s["timeline_last"].get("llm_calls", 0) or 0 for s in ss]
        toks = [s["timeline_last"].get("llm_tokens", 0) or 0 for s in ss]
        fs = [s["failure_states"] for s in ss]
        print(f"| {name} | {cell([s['failures'] for s in ss])} | {cell([s['failure_rate'] for s in ss], 3)} | "
              f"{cell([f['entire'] for f in fs])} | {cell([f['initial'] for f in fs])} | "
              f"{cell([f['terminal'] for f in fs])} | {cell(calls)} | {cell(toks, 0)} | "
              f"{cell([s['wall_seconds'] for s in ss], 0)} |")
    if "llmtester" in rows and "llmtester w/o ms" in rows:
        with_ms = sum(s["timeline_last"]["llm_calls"] for s in rows["llmtester"])
        without = sum(s["timeline_last"]["llm_calls"] for s in rows["llmtester w/o ms"])
        tests = sum(s["timeline_last"]["fuzz_tests"] for s in rows["llmtester"])
        print(f"\nLLM calls saved by the multi-scale strategy: {100 * (1 - with_ms / max(1, without)):.1f}% "
              f"({with_ms} calls with it, {without} without; {tests} fuzzing tests with it)")


def main(argv=None) -> int:
    args = parse(argv)
    with contextlib.ExitStack() as stack:
        if args.base_url:
            base_url, model, endpoint = args.base_url, args.model, f"{args.model} at {args.base_url}"
        else:
            srv = stack.enter_context(LLMStubServer(step=0.15))
            base_url, model, endpoint = srv.base_url, "deltarl-stub", "the local test double (tests/llm_server.py)"
        grid = load(args, base_url, model)
        rows = collect(grid_runs.run(grid))
    print_table(grid, rows, endpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
