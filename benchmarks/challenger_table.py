"""Table 1 / Fig. 4 of the Delta paper from challenger cards: challenger returns beside the AUT's
and training times, over datasets D (safety runs).

    python benchmarks/challenger_table.py [--profile local|smoke] [--seeds 0 1 2] [--episodes 2000] [--steps N]
    python benchmarks/challenger_table.py runs/safety-comparison-2000/CartPole-v1-curefuzz-s*

Without run folders it runs the grid ``experiments/benchmarks/challenger_table.yaml`` through the
grid machinery (one campaign per seed: CureFuzz safety testing records D, then BC, BCQ and CQL
train on it and are evaluated beside the AUT), the options overriding the profile; with run
folders it reads the cards already in them. For each algorithm: the mean over datasets of the
challenger's mean return with the 95% CI margin across datasets, its share of the AUT's mean
return, its success rate, and the median training time beside the AUT's (the paper reports
medians for Fig. 4). Writes ``<results>/challengers-<scenario>.md`` and a bar chart ``.png`` of
training times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import grid_runs
from orchestrator.analysis.stats import mean_ci

GRID = "challenger_table"
ALGOS = ("bc", "bcq", "cql")


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run folders with challengers/*/card.json (default: run the grid)")
    ap.add_argument("--profile", default="local", help="the grid file's profile (local, smoke)")
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--aut", default=None)
    ap.add_argument("--episodes", type=int, default=None, help="safety episodes per dataset D (default: the profile's)")
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="one dataset D per seed (default: the profile's)")
    ap.add_argument("--algos", nargs="+", default=None, choices=ALGOS)
    ap.add_argument("--steps", type=int, default=None, help="gradient steps (default: the profile's, else the preset's)")
    ap.add_argument("--eval-episodes", type=int, default=None)
    ap.add_argument("--out", default=None, help="grid output root (default: the grid file's)")
    ap.add_argument("--results", default=str(Path(__file__).resolve().parents[1] / "experiments" / "results"))
    return ap.parse_args(argv)


def run_grid_folders(args) -> list[Path]:
    grid = grid_runs.load(GRID, args.profile, out=args.out, settings={
        "scenario": args.scenario, "aut": args.aut,
        "safety.budget": {"episodes": args.episodes} if args.episodes else None,
        "challenger.algos": args.algos, "challenger.steps": args.steps,
        "challenger.eval_episodes": args.eval_episodes,
    }, axes={"seed": args.seeds})
    return [r.root for _, r in grid_runs.run(grid)]


def table(runs: list[Path], cards: list[dict]) -> tuple[str, dict]:
    """The Markdown table and the training times (AUT first) for the chart."""
    scenario = cards[0]["scenario"]
    aut = [c["aut"] for c in cards if c.get("aut")]
    aut_ret = np.array([a["evaluation"]["mean_return"] for a in aut])
    aut_time = next((a["training_wall_seconds"] for a in aut if a.get("training_wall_seconds")), None)
    lines = [f"### Challengers on {scenario}: {len(runs)} datasets D (safety runs), "
             f"{cards[0]['evaluation']['episodes']} evaluation episodes each", "",
             "| agent | mean return ± 95% CI (over datasets) | per dataset | % of AUT | success rate | training time (median) |",
             "|---|---:|---|---:|---:|---:|"]
    m, h = mean_ci(aut_ret) if aut_ret.size > 1 else (float(aut_ret.mean()), 0.0)
    lines.append(f"| AUT ({aut[0]['policy']}) | {m:.1f} ± {h:.1f} | | 100 | "
                 f"{100 * np.mean([a['evaluation']['success_rate'] for a in aut]):.0f}% | "
                 + (f"{aut_time:.0f} s |" if aut_time else "n/a |"))
    times = {"AUT": aut_time or float("nan")}
    for algo in ALGOS:
        cs = [c for c in cards if c["config"]["algo"] == algo]
        if not cs:
            continue
        r = np.array([c["evaluation"]["mean_return"] for c in cs])
        m, h = mean_ci(r) if r.size > 1 else (float(r[0]), 0.0)  # one dataset: no spread to report
        ratio = [c["return_vs_aut"]["ratio"] for c in cs if c.get("return_vs_aut") and c["return_vs_aut"]["ratio"]]
        t = float(np.median([c["training_wall_seconds"] for c in cs]))
        times[algo.upper()] = t
        lines.append(f"| {algo.upper()} ({cs[0]['algorithm']}) | {m:.1f} ± {h:.1f} | "
                     f"{', '.join(f'{x:.1f}' for x in r)} | "
                     f"{f'{100 * np.mean(ratio):.1f}' if ratio else 'n/a (returns < 0)'} | "
                     f"{100 * np.mean([c['evaluation']['success_rate'] for c in cs]):.0f}% | {t:.0f} s |")
    return "\n".join(lines), times


def chart(scenario: str, times: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(4.5, 3))
    ax.bar(list(times), list(times.values()), color=["#555"] + ["#4a7"] * (len(times) - 1))
    ax.set_ylabel("training time (s)")
    ax.set_title(f"{scenario}: AUT vs challengers (Fig. 4)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse(argv)
    runs = [Path(p) for p in args.runs] or run_grid_folders(args)
    cards = [json.loads(p.read_text()) for r in runs for p in sorted(r.glob("challengers/*/card.json"))]
    if not cards:
        print("no challenger cards under the given run folders", file=sys.stderr)
        return 2
    md, times = table(runs, cards)
    print(md)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    scenario = cards[0]["scenario"]
    (out / f"challengers-{scenario}.md").write_text(md + "\n")
    chart(scenario, times, out / f"challengers-{scenario}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
