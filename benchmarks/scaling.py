"""Scaling of a safety campaign over Ray rollout workers: episodes/s with 1 and 2 workers (and
in-process, 0, as the baseline of the same script), and the share of wall time spent outside
rollouts (fuzzer, Parquet writes, snapshots, MLflow): the target is <= 10% at default sizes.

    python benchmarks/scaling.py --scenario CartPole-v1 --aut zoo:CartPole-v1 --episodes 2000

Prints a Markdown table. Run it on an otherwise idle machine: Ray workers run at low priority.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.campaign.config import campaign_from_dict
from orchestrator.campaign.safety import run_safety
from orchestrator.cluster.lifecycle import start_ray


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="CartPole-v1")
    ap.add_argument("--aut", default="zoo:CartPole-v1")
    ap.add_argument("--fuzzer", default="curefuzz")
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--generation-size", type=int, default=64)
    args = ap.parse_args(argv)
    start_ray()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in [int(x) for x in args.workers.split(",")]:
            c = campaign_from_dict({"name": f"scaling-w{w}", "scenario": args.scenario, "aut": args.aut,
                                    "workers": w, "output": f"{tmp}/w{w}", "mlflow": True,
                                    "safety": {"fuzzer": args.fuzzer, "budget": {"episodes": args.episodes},
                                               "generation_size": args.generation_size}})
            s = run_safety(c, progress=False)
            rows.append((w, s["episodes"] / s["wall_seconds"], 1 - s["rollout_seconds"] / s["wall_seconds"],
                         s["wall_seconds"]))
    base = rows[0][1]
    print(f"### {args.fuzzer} on {args.scenario} ({args.aut}), {args.episodes} episodes, generation size "
          f"{args.generation_size}\n")
    print("| rollout workers | episodes/s | vs first row | wall time outside rollouts | wall (s) |\n|---:|---:|---:|---:|---:|")
    for w, eps, out, wall in rows:
        print(f"| {w if w else '0 (in-process)'} | {eps:.1f} | {eps / base:.2f}x | {100 * out:.1f}% | {wall:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
