"""Bug sets of optimality runs, from a report's data: how close each run came to every distinct bug
there is to find, and how much the bug sets of Delta runs with different challengers overlap.

Distinct bugs (the paper's measure: grid cells of the initial-state space holding at least one
bug) stop telling methods apart once every method finds every cell where the challenger beats the
AUT. This script reads a report's ``report_data/`` (``deltarl report`` writes it; the committed
Delta reports have it) and prints, per scenario and seed:

* the **union** of the bug cells found by any method of that seed (the same AUT, challenger and
  initial-state space), and each method's share of it at the end of its run;
* the **test cases** each method needed to reach 90% and 100% of that union (from the run's
  timeline of distinct bugs), a measure that still separates methods after saturation.

* for Delta runs of one scenario and seed that differ in their **challenger** (RQ1, Table 2):
  each run's bugs and the bugs two challengers share (the same initial state, bit for bit; the
  runs share their safety run and their sampled initial corpus).

    .venv/bin/python benchmarks/bug_sets.py experiments/results/delta-paper-cases-rq2-rq3

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


def cases_to_reach(timeline: pd.DataFrame, target: int) -> float:
    hit = timeline.loc[timeline["distinct_bugs"] >= target, "x"]
    return float(hit.iloc[0]) if len(hit) else float("nan")


def main(argv=None) -> int:
    from envs import get_scenario
    from orchestrator.analysis.sections import done_runs, optimality_units

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a folder with report_data/ (a committed report)")
    args = ap.parse_args(argv)
    data = Path(args.folder) / "report_data"
    runs = done_runs(pd.read_parquet(data / "runs.parquet"))
    bugs = pd.read_parquet(data / "bug_list.parquet")
    timelines = pd.read_parquet(data / "timelines.parquet")
    timelines = timelines[timelines["phase"] != "safety"]
    if runs["challenger_algo"].nunique() > 1:
        overlap(runs, bugs)
        return 0
    print(f"### Distinct bugs against everything there was to find ({args.folder})\n")
    print("union: bug cells found by any method of the seed; share: the method's final distinct bugs / union; "
          "90% / 100%: test cases until its distinct bugs reached 90% / all of the union (— never)\n")
    for scenario in sorted(runs["scenario"].unique()):
        units = optimality_units(runs, scenario)
        sc = get_scenario(scenario)
        rows, shares = [], {}
        for seed in sorted(units["seed"].unique()):
            seed_units = units[units["seed"] == seed]
            cells = {}
            for _, u in seed_units.iterrows():
                states = bugs.loc[bugs["campaign"] == u["campaign"], "initial_state"]
                if len(states):
                    idx = sc.grid_cells(np.stack(states.to_numpy()))
                    cells[u["campaign"]] = {tuple(r) for r in idx}
                else:
                    cells[u["campaign"]] = set()
            union = set().union(*cells.values()) if cells else set()
            for _, u in seed_units.iterrows():
                tl = timelines[timelines["campaign"] == u["campaign"]].sort_values("x")
                n = len(cells[u["campaign"]])
                share = n / len(union) if union else float("nan")
                name = u["method"]
                shares.setdefault(name, []).append(share)
                c90 = cases_to_reach(tl, int(np.ceil(0.9 * len(union)))) if union else float("nan")
                c100 = cases_to_reach(tl, len(union)) if union else float("nan")
                rows.append([seed, name, len(union), n, f"{share:.2f}",
                             "—" if c90 != c90 else f"{c90:.0f}", "—" if c100 != c100 else f"{c100:.0f}"])
        print(f"#### {scenario} ({sc.grid_intervals} intervals per dimension)\n")
        print("| seed | method | union | distinct bugs | share | cases to 90% | cases to 100% |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print("| " + " | ".join(str(x) for x in r) + " |")
        print()
        print("| method | mean share of the union | runs at 100% |")
        print("|---|---:|---:|")
        for name, s in sorted(shares.items()):
            print(f"| {name} | {np.mean(s):.3f} | {sum(x >= 1.0 for x in s)} of {len(s)} |")
        print()
    return 0


def overlap(runs: pd.DataFrame, bugs: pd.DataFrame) -> None:
    """Pairwise shared bugs of Delta runs with different challengers, per scenario and seed."""
    import itertools

    delta = runs[runs["method"] == "delta"]
    print("### Bugs shared by Delta runs with different challengers (same scenario, seed and safety run)\n")
    print("| scenario | seed | bugs per challenger | shared by each pair | Jaccard |")
    print("|---|---:|---|---|---|")
    for (scenario, seed), g in delta.groupby(["scenario", "seed"]):
        sets = {}
        for _, r in g.sort_values("challenger_algo").iterrows():
            states = bugs.loc[bugs["campaign"] == r["campaign"], "initial_state"]
            sets[r["challenger_algo"]] = {tuple(np.asarray(s, dtype=np.float64).tolist()) for s in states}
        pairs = list(itertools.combinations(sets, 2))
        shared = ", ".join(f"{a.upper()}&{b.upper()} {len(sets[a] & sets[b])}" for a, b in pairs)
        jac = ", ".join(f"{len(sets[a] & sets[b]) / max(1, len(sets[a] | sets[b])):.2f}" for a, b in pairs)
        per = ", ".join(f"{a.upper()} {len(v)}" for a, v in sets.items())
        print(f"| {scenario} | {seed} | {per} | {shared} | {jac} |")
    print()


if __name__ == "__main__":
    raise SystemExit(main())
