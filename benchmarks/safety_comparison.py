"""Safety testing comparison: failures and distinct failures of the four fuzzers, equal budgets.

    python benchmarks/safety_comparison.py [--scenario CartPole-v1] [--aut zoo:CartPole-v1]
        [--episodes 1000] [--seeds 0 1 2] [--workers 0] [--out runs/safety-comparison]

Runs one safety campaign per (fuzzer, seed) with the same episode budget, sampling fraction and
generation size, and prints a Markdown table: mean ± 95% CI margin over seeds of the number of
failures and of distinct failures (grid cells), and the wall time. Each campaign's run folder
(Parquet, timeline, summary) stays under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="CartPole-v1")
    ap.add_argument("--aut", default="zoo:CartPole-v1")
    ap.add_argument("--fuzzers", nargs="+", default=["random", "mdpfuzz", "curefuzz", "gmt"])
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--generation-size", type=int, default=64)
    ap.add_argument("--out", default="runs/safety-comparison")
    args = ap.parse_args()

    from orchestrator.analysis.stats import mean_ci
    from orchestrator.campaign.config import (
        Budget,
        Campaign,
        SafetySpec,
        validate_campaign,
    )
    from orchestrator.campaign.safety import run_safety

    rows = {}
    for fz in args.fuzzers:
        for seed in args.seeds:
            out = Path(args.out) / f"{args.scenario}-{fz}-s{seed}"
            if (out / "summary.json").is_file():
                s = json.loads((out / "summary.json").read_text())
            else:
                c = Campaign(scenario=args.scenario, aut=args.aut, output=str(out), name=f"{fz}-s{seed}", seed=seed,
                             workers=args.workers, mlflow=False,
                             safety=SafetySpec(fuzzer=fz, budget=Budget(episodes=args.episodes),
                                               generation_size=args.generation_size))
                validate_campaign(c)
                s = run_safety(c, progress=False)
            rows.setdefault(fz, []).append(s)
            print(f"{fz} seed {seed}: {s['failures']} failures, {s['distinct_failures']} distinct, "
                  f"{s['wall_seconds']:.0f} s", file=sys.stderr, flush=True)

    print(f"{args.scenario}, AUT {args.aut}, {args.episodes} episodes per campaign "
          f"(a quarter sampling), generations of {args.generation_size}, seeds {args.seeds}\n")
    print("| fuzzer | failures | distinct failures | wall time (s) |")
    print("|---|---:|---:|---:|")
    for fz, ss in rows.items():
        f, fm = mean_ci([s["failures"] for s in ss])
        d, dm = mean_ci([s["distinct_failures"] for s in ss])
        w, _ = mean_ci([s["wall_seconds"] for s in ss])
        print(f"| {fz} | {f:.1f} ± {fm:.1f} | {d:.1f} ± {dm:.1f} | {w:.0f} |")


if __name__ == "__main__":
    main()
