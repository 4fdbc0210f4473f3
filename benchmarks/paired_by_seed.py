"""Delta against each other method, paired by seed, from a report's data.

In a Delta grid every method of one scenario and seed shares the safety run (the record D), the
challenger trained on it and the sampled initial corpus: the seed is a block. Bug counts vary far
more between seeds (another D, another challenger) than between methods, which the unpaired
Mann–Whitney test of the report cannot separate. This script prints, per scenario, metric and
method, Delta's difference to the method in each seed, how many seeds Delta led, and two paired
tests: the t-test on the differences and the Wilcoxon signed-rank test (two-sided; with n pairs
its smallest possible p is 2 / 2^n, 0.125 for 4 seeds, 0.0625 for 5).

    .venv/bin/python benchmarks/paired_by_seed.py experiments/results/delta-paper-cases-rq2-rq3 \
        --sampling-cases 1250
    .venv/bin/python benchmarks/paired_by_seed.py experiments/results/delta-paper-cases-rq1 --challengers

``--sampling-cases N`` adds "fuzzing bugs": the bugs found after the first N test cases (the
initial corpus drawn from the reset distribution, the same draws for most methods of one seed),
read from the run's timeline: the part of the count the search itself is responsible for.

Every number it prints comes from the report_data folder given; nothing is re-run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def paired(delta: pd.Series, other: pd.Series) -> dict:
    from scipy.stats import ttest_rel, wilcoxon

    both = pd.concat([delta.rename("d"), other.rename("o")], axis=1).dropna()
    diff = (both["d"] - both["o"]).to_numpy(dtype=float)
    out = {"n": len(diff), "diff": diff, "lead": int((diff > 0).sum()), "tie": int((diff == 0).sum())}
    out["rel"] = float(np.mean(diff / np.where(both["o"] != 0, both["o"], np.nan))) if len(diff) else float("nan")
    if len(diff) >= 2 and np.any(diff != 0):
        out["t_p"] = float(ttest_rel(both["d"], both["o"]).pvalue) if np.std(diff) > 0 else float("nan")
        out["w_p"] = float(wilcoxon(both["d"], both["o"]).pvalue)
    else:
        out["t_p"] = out["w_p"] = float("nan")
    return out


def fmt(v: float, digits: int = 3) -> str:
    return "—" if v != v else f"{v:.{digits}f}"


def main(argv=None) -> int:
    from orchestrator.analysis.sections import METRICS, done_runs, method_order, optimality_units

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a folder with report_data/ (a committed report)")
    ap.add_argument("--challengers", action="store_true",
                    help="compare Delta's runs by challenger instead (RQ1, Table 2): BCQ, the paper's choice, "
                         "against each other challenger, paired by seed (one safety run, one D per seed)")
    ap.add_argument("--sampling-cases", type=int, default=None,
                    help="also compare the bugs found after this many test cases (the sampling phase's end)")
    args = ap.parse_args(argv)
    runs = done_runs(pd.read_parquet(Path(args.folder) / "report_data" / "runs.parquet"))
    metrics = METRICS
    if args.sampling_cases:
        tl = pd.read_parquet(Path(args.folder) / "report_data" / "timelines.parquet")
        tl = tl[tl["phase"] != "safety"].sort_values("x")
        at = {c: float(g.loc[g["x"] <= args.sampling_cases, "bugs"].max()) for c, g in tl.groupby("campaign")}
        runs = runs.assign(fuzzing_bugs=runs["bugs"] - runs["campaign"].map(at))
        metrics = METRICS[:1] + (("fuzzing_bugs", f"fuzzing bugs (after {args.sampling_cases} cases)"),) + METRICS[1:]
    ref = "delta"
    if args.challengers:  # Delta only; its runs named by their challenger, BCQ the reference
        runs = runs[runs["method"] == "delta"].assign(method=lambda d: d["challenger_algo"].str.upper())
        ref = "BCQ"
        print(f"### Delta with BCQ against Delta with each other challenger, paired by seed ({args.folder})\n")
        print("diff: BCQ minus the challenger, per seed (in seed order); led: seeds where BCQ had more; mean rel.: "
              "mean of diff / challenger; p: paired t-test and Wilcoxon signed-rank, two-sided (— : no spread or n < 2)\n")
    else:
        print(f"### Delta against each method, paired by seed ({args.folder})\n")
        print("diff: Delta minus the method, per seed (in seed order); led: seeds where Delta had more; mean rel.: "
              "mean of diff / method; p: paired t-test and Wilcoxon signed-rank, two-sided (— : no spread or n < 2)\n")
    for scenario in sorted(runs["scenario"].unique()):
        units = optimality_units(runs, scenario)
        seeds = sorted(units["seed"].unique())
        names = sorted(units["method"].unique()) if args.challengers else method_order(units["method"])
        by = {m: units[units["method"] == m].set_index("seed") for m in names}
        if ref not in by:
            continue
        print(f"#### {scenario} (seeds {', '.join(map(str, seeds))})\n")
        print("| metric | method | diff per seed | led | mean rel. | p (t) | p (Wilcoxon) |")
        print("|---|---|---|---:|---:|---:|---:|")
        for key, label in metrics:
            for m, g in by.items():
                if m == ref:
                    continue
                r = paired(by[ref][key], g[key])
                digits = 3 if key == "distance" else 0
                diffs = ", ".join(f"{x:+.{digits}f}" for x in r["diff"])
                tied = f" ({r['tie']} tied)" if r["tie"] else ""
                print(f"| {label} | {m} | {diffs} | {r['lead']} of {r['n']}{tied} | {r['rel']:+.1%} "
                      f"| {fmt(r['t_p'])} | {fmt(r['w_p'])} |")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
