"""Table 1 / Fig. 4 of the Delta paper from challenger cards: challenger returns beside the AUT's
and training times, over the safety runs (datasets D) given.

    python benchmarks/challenger_table.py runs/safety-comparison-2000/CartPole-v1-curefuzz-s*

For each algorithm: the mean over datasets of the challenger's mean return (100 episodes each)
with the 95% CI margin across datasets, its share of the AUT's mean return, its success rate,
and the median training time beside the AUT's (the paper reports medians for Fig. 4). Writes
``experiments/results/challengers-<scenario>.md`` and a bar chart ``.png`` of training times.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from orchestrator.analysis.stats import mean_ci

    runs = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    cards = [json.loads(p.read_text()) for r in runs for p in sorted(r.glob("challengers/*/card.json"))]
    if not cards:
        print("no challenger cards under the given run folders", file=sys.stderr)
        return 2
    scenario = cards[0]["scenario"]
    aut = [c["aut"] for c in cards if c.get("aut")]
    aut_ret = np.array([a["evaluation"]["mean_return"] for a in aut])
    aut_time = next((a["training_wall_seconds"] for a in aut if a.get("training_wall_seconds")), None)
    lines = [f"### Challengers on {scenario}: {len(runs)} datasets D (safety runs), 100 evaluation episodes each", "",
             "| agent | mean return ± 95% CI (over datasets) | per dataset | % of AUT | success rate | training time (median) |",
             "|---|---:|---|---:|---:|---:|"]
    m, h = mean_ci(aut_ret) if aut_ret.size > 1 else (float(aut_ret.mean()), 0.0)
    lines.append(f"| AUT ({aut[0]['policy']}) | {m:.1f} ± {h:.1f} | | 100 | "
                 f"{100 * np.mean([a['evaluation']['success_rate'] for a in aut]):.0f}% | "
                 f"{aut_time:.0f} s |" if aut_time else "")
    times = {"AUT": aut_time or float("nan")}
    for algo in ("bc", "bcq", "cql"):
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
                     f"{f'{100 * np.mean(ratio):.1f}' if ratio else 'n/a (returns < 0)'} | {100 * np.mean([c['evaluation']['success_rate'] for c in cs]):.0f}% | "
                     f"{t:.0f} s |")
    md = "\n".join(lines)
    print(md)
    out = Path(__file__).resolve().parents[1] / "experiments" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"challengers-{scenario}.md").write_text(md + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3))
    ax.bar(list(times), list(times.values()), color=["#555"] + ["#4a7"] * (len(times) - 1))
    ax.set_ylabel("training time (s)")
    ax.set_title(f"{scenario}: AUT vs challengers (Fig. 4)")
    fig.tight_layout()
    fig.savefig(out / f"challengers-{scenario}.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
