"""RQ2/RQ3 of the Delta paper at equal test-case budgets: Delta vs the safety fuzzers as
baselines under the same challenger and oracle (Table 3), and Delta's ablations (Table 4).

    python benchmarks/optimality_comparison.py [--profile local|smoke] [--scenario CartPole-v1] \\
        [--aut zoo:CartPole-v1] [--challenger runs/.../challengers/bcq/model.d3] [--budget 1000] [--seeds 5]

The sweep (configuration x seed) is the grid ``experiments/benchmarks/optimality_comparison.yaml``,
run through the grid machinery (every campaign a Ray task in ``workers: 0`` mode, written under
``--runs``; a rerun skips finished campaigns). Without ``--challenger`` every campaign records a
CureFuzz dataset D and trains a BCQ challenger on it (once per seed: the grid's challenger cache);
with it, the campaigns are optimality-only against that challenger. Prints a Markdown table: mean
± 95% CI margin (t) over the seeds of bugs, distinct bugs and distance, and the two-sided
Mann–Whitney U p-value of Delta against the best baseline (by mean) for each metric; writes it
with the raw per-run figures to ``--results`` (JSON and Markdown).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import mannwhitneyu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import grid_runs
from orchestrator.analysis.stats import mean_ci
from orchestrator.campaign.grid import load_grid

GRID = "optimality_comparison"
CONFIGS = ["delta", "mdpfuzz", "curefuzz", "gmt", "random",
           "delta w/o diversity", "delta w/o regret", "delta w/o inconsistency"]
BASELINES = ("mdpfuzz", "curefuzz", "gmt", "random")
METRICS = ("bugs", "distinct_bugs", "distance")


def label(fuzzer: str, params: dict | None) -> str:
    without = (params or {}).get("without")
    return f"{fuzzer} w/o {', '.join(without)}" if without else fuzzer


def method(campaign) -> str:
    """The table row a campaign of the grid belongs to."""
    return label(campaign.optimality.fuzzer, campaign.optimality.params)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="local", help="the grid file's profile (local, smoke)")
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--aut", default=None)
    ap.add_argument("--challenger", default=None,
                    help="a challenger policy URI: optimality-only campaigns (default: BCQ trained per seed)")
    ap.add_argument("--budget", type=int, default=None, help="test cases per run (default: the profile's)")
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds, 0..N-1 (default: the profile's)")
    ap.add_argument("--generation-size", type=int, default=None)
    ap.add_argument("--sampling-fraction", type=float, default=None)
    ap.add_argument("--configs", default=None, help=f"comma-separated, default: {','.join(CONFIGS)}")
    ap.add_argument("--runs", default=None, help="grid output root (default: the grid file's)")
    ap.add_argument("--results", default="experiments/results")
    return ap.parse_args(argv)


def load(args) -> dict:
    return grid_runs.load(GRID, args.profile, out=args.runs, settings={
        "scenario": args.scenario, "aut": args.aut, "optimality.challenger": args.challenger,
        "optimality.budget": {"episodes": args.budget} if args.budget else None,
        "optimality.generation_size": args.generation_size, "optimality.sampling_fraction": args.sampling_fraction,
    }, axes={"seed": range(args.seeds) if args.seeds else None, "method": select(args.configs, args.profile)},
        drop=("safety", "challenger") if args.challenger else ())


def select(configs: str | None, profile: str | None) -> list[dict] | None:
    """The method axis of the grid file, restricted to ``configs`` (in that order)."""
    if not configs:
        return None
    axis = load_grid(grid_runs.grid_file(GRID), profile=profile)["axes"]["method"]
    by_label = {label(m["optimality.fuzzer"], m.get("optimality.params")): m for m in axis}
    unknown = [c for c in configs.split(",") if c not in by_label]
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown[0]!r}; known: {', '.join(by_label)}")
    return [by_label[c] for c in configs.split(",")]


def statistics(raw: dict[str, list[dict]]) -> tuple[dict, dict]:
    """Mean and CI margin per configuration and metric; Mann–Whitney of Delta vs the best baseline."""
    def vals(config, m):
        v = np.array([r[m] for r in raw[config]], dtype=float)
        return v[np.isfinite(v)]

    table = {}
    for config in raw:
        table[config] = {}
        for m in METRICS:
            mean, margin = mean_ci(vals(config, m)) if vals(config, m).size else (float("nan"), float("nan"))
            table[config][m] = {"mean": mean, "ci95": margin}
    tests = {}
    base = [b for b in BASELINES if b in raw]
    if "delta" in raw and base:
        for m in METRICS:
            best = max(base, key=lambda b: np.nanmean(vals(b, m)) if vals(b, m).size else -np.inf)
            a, b = vals("delta", m), vals(best, m)
            p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue) if a.size and b.size else float("nan")
            tests[m] = {"best_baseline": best, "p_value": p}
    return table, tests


def markdown(grid: dict, table: dict, tests: dict) -> str:
    o, seeds = grid["base"]["optimality"], grid["axes"]["seed"]
    ch = o.get("challenger") or (f"BCQ trained on each seed's CureFuzz D "
                                 f"({grid['base']['safety']['budget']['episodes']} episodes)")
    lines = [f"### {grid['base']['scenario']}: {o['budget']['episodes']} test cases per run, {len(seeds)} seeds",
             "", f"AUT `{grid['base']['aut']}`, challenger `{ch}`, {o.get('oracle', 'auto')} oracle "
             f"(δ = {o.get('delta', 0.0)}), generation size {o['generation_size']}, sampling fraction "
             f"{o['sampling_fraction']}.", "",
             "| method | bugs | distinct bugs | distance |", "|---|---:|---:|---:|"]
    for config, r in table.items():
        lines.append(f"| {config} | " + " | ".join(
            f"{r[m]['mean']:.1f} ± {r[m]['ci95']:.1f}" if m != "distance" else f"{r[m]['mean']:.3f} ± {r[m]['ci95']:.3f}"
            for m in METRICS) + " |")
    if tests:
        lines.append("| Mann–Whitney p (Delta vs best baseline) | " + " | ".join(
            f"{tests[m]['p_value']:.3f} (vs {tests[m]['best_baseline']})" if m in tests else "" for m in METRICS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    grid = load(args)
    raw: dict[str, list[dict]] = {}
    for config, runs in grid_runs.group(grid_runs.run(grid), method).items():
        for c, r in runs:
            s = r.summary("optimality")
            raw.setdefault(config, []).append({k: s[k] for k in (*METRICS, "cases", "wall_seconds")} | {"seed": c.seed})
            print(f"{config:24s} seed {c.seed}: {s['bugs']:5d} bugs, {s['distinct_bugs']:4d} distinct, "
                  f"distance {s['distance']:.3f} ({s['wall_seconds']:.0f} s)", file=sys.stderr)
    table, tests = statistics(raw)
    md = markdown(grid, table, tests)
    print(md)
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    stem = f"optimality-{grid['base']['scenario']}"
    (res / f"{stem}.json").write_text(json.dumps({"args": vars(args), "grid": grid["output"], "table": table,
                                                  "tests": tests, "runs": raw}, indent=2, default=float))
    (res / f"{stem}.md").write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
