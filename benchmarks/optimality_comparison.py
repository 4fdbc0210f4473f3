"""RQ2/RQ3 of the Delta paper at equal test-case budgets: Delta vs the safety fuzzers as
baselines under the same challenger and oracle (Table 3), and Delta's ablations (Table 4).

    python benchmarks/optimality_comparison.py --scenario CartPole-v1 --aut zoo:CartPole-v1 \\
        --challenger runs/.../challengers/bcq/model.d3 --budget 1000 --seeds 5

Every (configuration, seed) is an optimality-only campaign in this process (``workers: 0``;
run one scenario per process to use several cores), written under ``--runs`` and skipped when
its summary exists (the script resumes). Prints a Markdown table: mean ± 95% CI margin (t) over
the seeds of bugs, distinct bugs and distance, and the two-sided Mann–Whitney U p-value of
Delta against the best baseline (by mean) for each metric; writes it with the raw per-run
figures to ``--results`` (JSON and Markdown).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = {  # name -> (fuzzer, params)
    "delta": ("delta", {}),
    "mdpfuzz": ("mdpfuzz", {}),
    "curefuzz": ("curefuzz", {}),
    "gmt": ("gmt", {}),
    "random": ("random", {}),
    "delta w/o diversity": ("delta", {"without": ["diversity"]}),
    "delta w/o regret": ("delta", {"without": ["regret"]}),
    "delta w/o inconsistency": ("delta", {"without": ["inconsistency"]}),
}
BASELINES = ("mdpfuzz", "curefuzz", "gmt", "random")
METRICS = ("bugs", "distinct_bugs", "distance")


def run_one(args, config: str, seed: int) -> dict:
    from orchestrator.campaign.config import campaign_from_dict
    from orchestrator.campaign.optimality import run_optimality

    fuzzer, params = CONFIGS[config]
    out = Path(args.runs) / args.scenario / f"{config.replace(' ', '_').replace('/', '')}-s{seed}"
    if (out / "optimality_summary.json").is_file():
        return json.loads((out / "optimality_summary.json").read_text())
    if out.exists():
        import shutil

        shutil.rmtree(out)  # an interrupted run: start it again
    c = campaign_from_dict({
        "name": f"{args.scenario}-{config}-s{seed}", "scenario": args.scenario, "aut": args.aut, "seed": seed,
        "workers": 0, "output": str(out), "mlflow": False, "safety": None,
        "optimality": {"fuzzer": fuzzer, "params": params, "challenger": args.challenger,
                       "budget": {"episodes": args.budget}, "generation_size": args.generation_size,
                       "sampling_fraction": args.sampling_fraction}})
    return run_optimality(c, progress=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--aut", required=True)
    ap.add_argument("--challenger", required=True)
    ap.add_argument("--budget", type=int, default=1000, help="test cases per run")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--generation-size", type=int, default=64)
    ap.add_argument("--sampling-fraction", type=float, default=0.1)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--runs", default="runs/optimality-comparison")
    ap.add_argument("--results", default="experiments/results")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from orchestrator.analysis.stats import mean_ci

    configs = args.configs.split(",")
    raw: dict[str, list[dict]] = {}
    for config in configs:
        for seed in range(args.seeds):
            t = time.perf_counter()
            s = run_one(args, config, seed)
            raw.setdefault(config, []).append({k: s[k] for k in (*METRICS, "cases", "wall_seconds")} | {"seed": seed})
            print(f"{config:24s} seed {seed}: {s['bugs']:5d} bugs, {s['distinct_bugs']:4d} distinct, "
                  f"distance {s['distance']:.3f} ({time.perf_counter() - t:.0f} s)", flush=True)

    from scipy.stats import mannwhitneyu

    def vals(config, m):
        return np.array([r[m] for r in raw[config]], dtype=float)

    table = {}
    for config in configs:
        row = {}
        for m in METRICS:
            v = vals(config, m)
            v = v[np.isfinite(v)]
            mean, margin = mean_ci(v) if v.size else (float("nan"), float("nan"))
            row[m] = {"mean": mean, "ci95": margin}
        table[config] = row
    tests = {}
    if "delta" in raw:
        for m in METRICS:
            base = [b for b in BASELINES if b in raw]
            if not base:
                continue
            best = max(base, key=lambda b: np.nanmean(vals(b, m)))
            a, b = vals("delta", m), vals(best, m)
            a, b = a[np.isfinite(a)], b[np.isfinite(b)]
            p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue) if a.size and b.size else float("nan")
            tests[m] = {"best_baseline": best, "p_value": p}

    lines = [f"### {args.scenario}: {args.budget} test cases per run, {args.seeds} seeds",
             "", f"AUT `{args.aut}`, challenger `{args.challenger}`, differential oracle (δ = 0), "
             f"generation size {args.generation_size}, sampling fraction {args.sampling_fraction}.", "",
             "| method | bugs | distinct bugs | distance |", "|---|---:|---:|---:|"]
    for config in configs:
        r = table[config]
        lines.append(f"| {config} | " + " | ".join(
            f"{r[m]['mean']:.1f} ± {r[m]['ci95']:.1f}" if m != "distance" else f"{r[m]['mean']:.3f} ± {r[m]['ci95']:.3f}"
            for m in METRICS) + " |")
    if tests:
        lines.append("| Mann–Whitney p (Delta vs best baseline) | " + " | ".join(
            f"{tests[m]['p_value']:.3f} (vs {tests[m]['best_baseline']})" if m in tests else "" for m in METRICS) + " |")
    md = "\n".join(lines)
    print(md)
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    stem = f"optimality-{args.scenario}"
    (res / f"{stem}.json").write_text(json.dumps({"args": vars(args), "table": table, "tests": tests, "runs": raw},
                                                 indent=2, default=float))
    (res / f"{stem}.md").write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
