"""Safety testing comparison: failures and distinct failures of the four fuzzers, equal budgets.

    python benchmarks/safety_comparison.py [--profile local|results|smoke] [--scenario CartPole-v1]
        [--aut zoo:CartPole-v1] [--episodes 1000] [--seeds 0 1 2] [--workers 0] [--out runs/safety-comparison]

The sweep (one safety campaign per fuzzer x seed, the same episode budget, sampling fraction
and generation size) is the grid ``experiments/benchmarks/safety_comparison.yaml``; this script
runs it through the grid machinery (every campaign a Ray task, finished ones skipped) with the
options above as overrides of the profile, and prints a Markdown table: mean ± 95% CI margin over
seeds of the number of failures and of distinct failures (grid cells), and the wall time. Each
campaign's run folder (Parquet, timeline, summary) stays under --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import grid_runs

GRID = "safety_comparison"
FUZZERS = ["random", "mdpfuzz", "curefuzz", "gmt"]


def method(campaign) -> str:
    """The table row a campaign of the grid belongs to."""
    return campaign.safety.fuzzer


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="local", help="the grid file's profile (local, results, smoke)")
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--aut", default=None)
    ap.add_argument("--fuzzers", nargs="+", default=None, help=f"default: {' '.join(FUZZERS)}")
    ap.add_argument("--episodes", type=int, default=None, help="episodes per campaign (default: the profile's)")
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the profile's")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--generation-size", type=int, default=None)
    ap.add_argument("--out", default=None, help="grid output root (default: the grid file's)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    grid = grid_runs.load(GRID, args.profile, out=args.out, settings={
        "scenario": args.scenario, "aut": args.aut, "workers": args.workers,
        "safety.budget": {"episodes": args.episodes} if args.episodes else None,
        "safety.generation_size": args.generation_size,
    }, axes={"safety.fuzzer": args.fuzzers, "seed": args.seeds})
    rows = {}
    for name, runs in grid_runs.group(grid_runs.run(grid), method).items():
        rows[name] = [r.summary("safety") for _, r in runs]
        for (c, _), s in zip(runs, rows[name]):
            print(f"{name} seed {c.seed}: {s['failures']} failures, {s['distinct_failures']} distinct, "
                  f"{s['wall_seconds']:.0f} s", file=sys.stderr)

    base, cell = grid["base"], grid_runs.cell
    print(f"{base['scenario']}, AUT {base['aut']}, {base['safety']['budget']['episodes']} episodes per campaign "
          f"({base['safety']['sampling_fraction']:.0%} sampling), generations of {base['safety']['generation_size']}, "
          f"seeds {grid['axes']['seed']}\n")
    print("| fuzzer | failures | distinct failures | wall time (s) |")
    print("|---|---:|---:|---:|")
    for name, ss in rows.items():
        print(f"| {name} | {cell([s['failures'] for s in ss])} | {cell([s['distinct_failures'] for s in ss])} | "
              f"{cell([s['wall_seconds'] for s in ss], 0, margin=False)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
