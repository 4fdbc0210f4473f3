"""Why the statistical oracle finds few bugs on Hopper-Noise: each test case's rollouts, case by case.

Delta's Table 7 judges a test case (an initial state) by 5 rollouts of the AUT and 5 of the
challenger in the wind and a one-sided Mann-Whitney U test (challenger greater, alpha 0.05). This
script reads the optimality phase's episodes of each campaign and measures how far the challenger
is from beating the AUT there: on how many cases its mean return is above the AUT's, on how many
it is ahead in most of the 25 (challenger, AUT) pairs of rollouts, the p-values, and the rollouts'
spread against the wind's: if the initial state made no difference to an agent, its case means
would vary by the rollouts' own standard deviation over sqrt(5) and no more ("wind alone"). With 5
rollouts each, p < 0.05 needs the challenger ahead in at least 21 of the 25 pairs (U >= 21:
p = 12/252 = 0.048; U = 20: p = 19/252 = 0.075).

Two steps, so that every printed number traces to a committed file:

    # 1. from run folders (which stay out of git): one <campaign>.cases.csv per campaign
    .venv/bin/python benchmarks/table7_margins.py --extract runs/grids/delta-table7/local/delta-table7-0* \\
        --out experiments/results/delta-table7-hopper-noise-summaries
    # 2. the table, from the CSV files alone
    .venv/bin/python benchmarks/table7_margins.py experiments/results/delta-table7-hopper-noise-summaries

A CSV row is one test case: its generation and index, then the AUT's and the challenger's
returns of its rollouts (one decimal). The p-values are recomputed by the campaign's own oracle
(``StatisticalOracle`` of ``orchestrator/fuzzers/oracles.py`` with the run's repeats, alpha and
delta); the table's "bugs" column must equal the campaign's own
count in its ``optimality_summary.json``, which the script checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from orchestrator.fuzzers.oracles import StatisticalOracle  # noqa: E402


def extract(run_dir: Path, out: Path) -> Path | None:
    summary = run_dir / "optimality_summary.json"
    if not summary.exists():
        return None
    eps = pd.concat([pd.read_parquet(f) for f in sorted((run_dir / "episodes").glob("*.parquet"))],
                    ignore_index=True)
    eps = eps[eps.phase == "optimality"]
    rows = []
    for (it, idx), g in eps.groupby(["iteration", "state_index"], sort=True):
        row = {"iteration": int(it), "state_index": int(idx)}
        for role, short in (("aut", "aut"), ("challenger", "ca")):
            r = g[g.role == role].sort_values("repeat")["return"].to_numpy()
            for k, v in enumerate(r):
                row[f"{short}_{k}"] = round(float(v), 1)
        rows.append(row)
    path = out / f"{run_dir.name}.cases.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def table(folder: Path) -> str:
    lines = ["| campaign | fuzzer | challenger (seed) | cases | AUT mean | challenger mean | cases CA mean > AUT mean "
             "| cases CA ahead in most pairs (U > 12.5 of 25) | smallest p | bugs (p < 0.05) "
             "| sd of the AUT's case means (wind alone) | CA - AUT per case: mean, sd (wind alone) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for csv in sorted(folder.glob("*.cases.csv")):
        name = csv.name.split(".")[0]
        summary = json.loads((folder / f"{name}.optimality_summary.json").read_text())
        df = pd.read_csv(csv)
        a = df[[c for c in df.columns if c.startswith("aut_")]].to_numpy()
        c = df[[c for c in df.columns if c.startswith("ca_")]].to_numpy()
        oracle = StatisticalOracle(repeats=summary["repeats"], alpha=summary["alpha"], delta=summary["delta"])
        is_bug, p = oracle.judge(a, c)
        u = np.array([(ci[:, None] > ai[None, :]).sum() + 0.5 * (ci[:, None] == ai[None, :]).sum()
                      for ai, ci in zip(a, c)])
        bugs = int(is_bug.sum())
        if bugs != summary["bugs"]:
            sys.exit(f"{name}: {bugs} cases with p < {oracle.alpha:g} here, {summary['bugs']} bugs in its "
                     f"optimality_summary.json")
        algo = Path(summary["challenger"]).parent.name.upper()
        n = a.shape[1]
        d = c.mean(1) - a.mean(1)
        # what the case means would vary by if the initial state made no difference: the rollouts'
        # own variance (the wind's) over n
        aut_noise = np.sqrt(a.var(1, ddof=1).mean() / n)
        d_noise = np.sqrt((a.var(1, ddof=1).mean() + c.var(1, ddof=1).mean()) / n)
        lines.append(
            f"| {name} | {summary['fuzzer']} | {algo} ({summary['seed']}) | {len(df)} | {a.mean():.1f} | {c.mean():.1f} "
            f"| {(c.mean(1) > a.mean(1)).sum()} ({(c.mean(1) > a.mean(1)).mean():.0%}) | {(u > 12.5).sum()} "
            f"| {p.min():.4f} | {bugs} | {a.mean(1).std(ddof=1):.1f} ({aut_noise:.1f}) "
            f"| {d.mean():.1f}, {d.std(ddof=1):.1f} ({d_noise:.1f}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", help="a folder of <campaign>.cases.csv and <campaign>.optimality_summary.json")
    ap.add_argument("--extract", nargs="+", metavar="RUN_DIR", help="campaign run folders to extract cases from")
    ap.add_argument("--out", help="where --extract writes (and copies each optimality_summary.json)")
    args = ap.parse_args(argv)
    if args.extract:
        if not args.out:
            ap.error("--extract needs --out")
        out = Path(args.out)
        for d in map(Path, args.extract):
            path = extract(d, out)
            if path:
                (out / f"{d.name}.optimality_summary.json").write_text((d / "optimality_summary.json").read_text())
                print(f"wrote {path}")
        folder = out
    elif args.folder:
        folder = Path(args.folder)
    else:
        ap.error("give a folder, or --extract RUN_DIR... --out FOLDER")
    print(table(folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
