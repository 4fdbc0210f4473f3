"""Corpus cost vs corpus size: the time the corpus side of a campaign (the fuzzer object: in the
driver, or in the corpus actor with ``corpus: actor``) spends per result, as the corpus grows.

For each fuzzer with a corpus (mdpfuzz, curefuzz, delta, gmt; llmtester is MDPFuzz's corpus
plus LLM calls, random has none) and each corpus size (default 100, 1,000, 10,000 seeds):

1. a fresh fuzzer (CartPole-v1, seed 0) builds its corpus in the sampling phase from synthetic
   feedback until it holds the size (GMT: its training set of executed cases);
2. in the fuzzing phase, ``--units`` units of ``--unit-size`` proposals each are proposed and
   observed, with synthetic but realistic feedback: a random walk from each proposed state of
   20-200 steps (the episode), returns = the length, failure when shorter than 40 steps, and for
   Delta a challenger's episode of its own (a bug when the challenger does better);
3. the table gives the milliseconds per result of ``propose`` (selection, mutation) and of
   ``observe`` (scores, admission, energy refresh), the corpus size after the units, and for
   Delta the share of observe spent refreshing the diversity of every seed (Eq. 3 with the
   updated predictor).

Only the fuzzer is timed (the feedback is built outside the timers); one process, torch on one
thread. Delta runs three ways (``--delta-refresh``, default all): ``rebuild``, the former code
(every seed's trajectory concatenated anew for the refresh after each observe), ``stacked``, the
default now (the trajectories kept stacked as seeds join, an in-place ReLU in the RND's forward
pass): the two must propose bit-for-bit the same states (checked here: the run stops if they
differ); and ``stacked, every 8`` (``diversity_refresh_every: 8``, opt-in): the refresh after
every 8th observe only, which bounds its amortised cost by corpus/8 at the price of stale
diversities (other proposals: an approximation, not the paper's algorithm).

    .venv/bin/python benchmarks/corpus_cost.py                     # sizes 100, 1000, 10000
    .venv/bin/python benchmarks/corpus_cost.py --sizes 100 1000 --fuzzers delta --units 10

Prints a Markdown table (and the machine's load average before and after). No assertion on any
time: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FUZZERS = ("mdpfuzz", "curefuzz", "delta", "gmt")


def corpus_size(fuzzer) -> int:
    if hasattr(fuzzer, "corpus"):
        return len(fuzzer.corpus)
    return int(fuzzer.data_x.shape[0])  # GMT: the executed cases it trains on


def feedback(proposal, rng, obs_dim: int, differential: bool):
    """Synthetic feedback for ``proposal`` (see the module docstring)."""
    from orchestrator.fuzzers import Feedback

    n = len(proposal)

    def episodes():
        lengths = rng.integers(20, 201, size=n)
        trajs = []
        for i, t in enumerate(lengths):
            start = np.resize(proposal.states[i], obs_dim)
            walk = np.cumsum(0.02 * rng.standard_normal((int(t) + 1, obs_dim)), axis=0)
            trajs.append((start + walk).astype(np.float32))
        return lengths, trajs

    lengths, trajs = episodes()
    returns = lengths.astype(np.float64)
    fb = Feedback(returns=returns, lengths=lengths, terminated=lengths < 200, failure=lengths < 40, traj_obs=trajs)
    if differential:
        ca_lengths, ca_trajs = episodes()
        fb.ca_returns, fb.ca_traj_obs = ca_lengths.astype(np.float64), ca_trajs
        fb.bug = fb.ca_returns > returns
    return fb


class Timer:
    """Wraps ``obj.name`` and adds the seconds of the calls for which ``when(args)`` holds."""

    def __init__(self, obj, name: str, when=lambda *a: True):
        self.seconds, real = 0.0, getattr(obj, name)

        def timed(*args, **kw):
            t0 = time.perf_counter()
            try:
                return real(*args, **kw)
            finally:
                if when(*args):
                    self.seconds += time.perf_counter() - t0

        setattr(obj, name, timed)


DELTA_MODES = {"rebuild": {"diversity_refresh": "rebuild"}, "stacked": {"diversity_refresh": "stacked"},
               "stacked, every 8": {"diversity_refresh": "stacked", "diversity_refresh_every": 8}}


def build(name: str, size: int, scenario, seed: int, refresh: str | None):
    from orchestrator.fuzzers import make_fuzzer

    params = DELTA_MODES[refresh] if refresh else {}
    fz = make_fuzzer(name, scenario, seed=seed, **params)
    rng = np.random.default_rng(seed + 1)
    differential = fz.needs_challenger
    fz.start_phase("sampling")
    chunk = 500
    for _ in range(10 * size // chunk + 20):
        if corpus_size(fz) >= size:
            break
        p = fz.propose(min(chunk, max(16, size - corpus_size(fz))))
        fz.observe(p, feedback(p, rng, scenario.obs_dim, differential))
    fz.start_phase("fuzzing")
    return fz, rng


def measure(name: str, size: int, args, scenario, refresh: str | None = None) -> dict:
    fz, rng = build(name, size, scenario, args.seed, refresh)
    built = corpus_size(fz)
    diversity = None
    if name == "delta":  # the refresh of every seed's diversity (Eq. 3 under the updated predictor)
        diversity = Timer(fz, "_corpus_diversity")
    t_prop = t_obs = 0.0
    results, proposals = 0, []
    for _ in range(args.units):
        t0 = time.perf_counter()
        p = fz.propose(args.unit_size)
        t_prop += time.perf_counter() - t0
        fb = feedback(p, rng, scenario.obs_dim, fz.needs_challenger)
        t0 = time.perf_counter()
        fz.observe(p, fb)
        t_obs += time.perf_counter() - t0
        results += len(p)
        proposals.append(p.states)
    row = {"fuzzer": name + (f" ({refresh})" if refresh else ""), "size": size, "built": built,
           "after": corpus_size(fz), "propose_ms": 1e3 * t_prop / results, "observe_ms": 1e3 * t_obs / results,
           "proposals": np.concatenate(proposals)}
    row["total_ms"] = row["propose_ms"] + row["observe_ms"]
    row["refresh_share"] = None if diversity is None else diversity.seconds / t_obs
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--fuzzers", nargs="+", default=list(FUZZERS), choices=FUZZERS)
    ap.add_argument("--units", type=int, default=20, help="units proposed and observed per measurement")
    ap.add_argument("--unit-size", type=int, default=8, help="proposals per unit (8: Delta's generation)")
    ap.add_argument("--delta-refresh", choices=("all", *DELTA_MODES), default="all",
                    help="Delta's diversity refresh: rebuild (the former code), stacked (the default now), "
                         "'stacked, every 8' (bounded, approximate; opt-in), or all three")
    ap.add_argument("--scenario", default="CartPole-v1")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch

    from envs import get_scenario

    torch.set_num_threads(1)
    scenario = get_scenario(args.scenario)
    load0 = os.getloadavg()
    rows = []
    for name in args.fuzzers:
        for size in args.sizes:
            if name == "delta":
                modes = list(DELTA_MODES) if args.delta_refresh == "all" else [args.delta_refresh]
                got = {m: measure(name, size, args, scenario, refresh=m) for m in modes}
                if {"rebuild", "stacked"} <= set(got) and not np.array_equal(got["rebuild"]["proposals"],
                                                                             got["stacked"]["proposals"]):
                    raise SystemExit(f"delta at {size} seeds: the rebuilt and the stacked refresh proposed "
                                     f"different states; they must be the same")
                rows += got.values()
            else:
                rows.append(measure(name, size, args, scenario))
            print(f"# {rows[-1]['fuzzer']} {size}: {rows[-1]['total_ms']:.3f} ms/result", file=sys.stderr, flush=True)
    load1 = os.getloadavg()

    print(f"Corpus cost per result ({args.scenario}, {args.units} units of {args.unit_size} proposals per "
          f"measurement, torch on 1 thread; load average {load0[0]:.2f} before, {load1[0]:.2f} after)\n")
    print("| fuzzer | corpus size (target) | seeds before → after | propose ms/result | observe ms/result "
          "| total ms/result | diversity refresh share of observe |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        share = "" if r["refresh_share"] is None else f"{100 * r['refresh_share']:.0f} %"
        print(f"| {r['fuzzer']} | {r['size']:,} | {r['built']:,} → {r['after']:,} | {r['propose_ms']:.3f} | "
              f"{r['observe_ms']:.3f} | {r['total_ms']:.3f} | {share} |")


if __name__ == "__main__":
    main()
