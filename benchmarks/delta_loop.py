"""Throughput of Delta's loop (issue #17): the Algorithm 1 loop at batched speed against the loop
before it, in one script, on the same AUT, challenger, scenario, budget and seeds.

    python benchmarks/delta_loop.py [--scenario Acrobot-v1] [--aut zoo:Acrobot-v1] [--challenger URI] \\
        [--budget 1000] [--seeds 1] [--loops old,new,new-gen64]

Loops (``benchmarks/delta_setup.py``): ``old`` = literal Eq. 7, one RND step per 8 test cases,
generations of 64, 10 % sampling; ``new`` = the defaults (normalised energy, RND steps on every
evaluated trajectory, energies refreshed every generation of 8, 25 % sampling); ``new-gen64`` =
the new fuzzer in generations of 64. Each run is a whole optimality phase (both agents' rollouts,
the oracle, confirmation of candidates, Parquet writes, a snapshot per generation) in this process
with one torch thread. Without ``--challenger`` a BCQ challenger is trained once on a 600-episode
CureFuzz safety campaign of the AUT (cached under ``--runs``).

Prints a Markdown table: test cases per CPU second of this process (mean over the seeds; on a
shared machine wall time depends on the other jobs, CPU time much less; on an idle core the two
agree), the ratio to ``old``, test cases per wall second, generations, bugs, and each energy
term's decision share. Bugs are confirmed with each agent acting alone, one observation per call
(``orchestrator/campaign/confirm.py``), so a loop that finds more bugs also spends more time
confirming them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.delta_setup import LOOPS, ensure_challenger, optimality_campaign, run_fresh  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="Acrobot-v1")
    ap.add_argument("--aut", default=None, help="default: zoo:<scenario>")
    ap.add_argument("--challenger", default=None, help="a policy URI (default: BCQ trained on the AUT's D)")
    ap.add_argument("--budget", type=int, default=1000, help="test cases per run")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--loops", default=",".join(LOOPS))
    ap.add_argument("--runs", default="runs/bench-delta")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    aut = args.aut or f"zoo:{args.scenario}"
    root = Path(args.runs)
    challenger = args.challenger
    if challenger is None:
        challenger, prep = ensure_challenger(args.scenario, aut, root)
        print(f"challenger {challenger} (prepared in {prep['prepare_seconds']:.0f} s)", file=sys.stderr)
    loops = [x.strip() for x in args.loops.split(",") if x.strip()]
    rows = {name: [] for name in loops}
    for seed in range(args.seeds):
        for name in loops:  # interleaved: a load change on a shared machine hits every loop alike
            spec = LOOPS[name]
            c = optimality_campaign(args.scenario, aut, challenger, root / f"loop-{args.scenario}-{name}-s{seed}",
                                    params=spec["params"], budget=args.budget, seed=seed,
                                    generation_size=spec["generation_size"],
                                    sampling_fraction=spec["sampling_fraction"])
            cpu0 = time.process_time()
            s = run_fresh(c)
            s["cpu_seconds"] = time.process_time() - cpu0
            rows[name].append(s)
            print(f"{name} seed {seed}: {s['cases']} cases in {s['wall_seconds']:.1f} s, {s['bugs']} bugs",
                  file=sys.stderr)

    def rate(runs, key="cpu_seconds"):
        return float(np.mean([r["cases"] / r[key] for r in runs]))

    base = rate(rows["old"]) if "old" in rows else None
    print(f"\n{args.scenario}, AUT `{aut}`, challenger `{challenger}`, {args.budget} test cases per run, "
          f"{args.seeds} seed(s), one torch thread, in-process rollouts\n")
    print("| loop | generation size | sampling | energy | RND updates | test cases per CPU s | vs old | "
          "test cases per wall s | generations | CPU s | bugs | share D | share A | share 1−I |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, runs in rows.items():
        spec = LOOPS[name]
        p = {"energy": "normalized", "rnd_update": "trajectory", "rnd_updates_per_episode": 1.0} | spec["params"]
        upd = (f"{p['rnd_updates_per_episode']:g} per trajectory" if p["rnd_update"] == "trajectory"
               else f"{p['rnd_updates_per_episode']:g} per case, pooled")
        r = rate(runs)

        def mean(key, runs=runs):
            v = [x.get(key, float("nan")) for x in runs]
            return float(np.mean(v))

        print(f"| {name} | {spec['generation_size']} | {spec['sampling_fraction']:.2f} | {p['energy']} | {upd} | "
              f"{r:.1f} | {(r / base if base else float('nan')):.2f} | {rate(runs, 'wall_seconds'):.1f} | "
              f"{mean('generations'):.0f} | {mean('cpu_seconds'):.1f} | {mean('bugs'):.1f} | "
              f"{mean('decision_share_diversity'):.2f} | "
              f"{mean('decision_share_regret'):.2f} | {mean('decision_share_inconsistency'):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
