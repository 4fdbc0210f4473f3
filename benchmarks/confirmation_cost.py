"""What sound verdicts cost: the time spent re-running candidate failures and bugs with each agent
acting alone, as a share of each phase's wall time, on the quick start and on a Hopper campaign.

    python benchmarks/confirmation_cost.py                 # quick start (as shipped) + Hopper
    python benchmarks/confirmation_cost.py --quick         # smaller budgets

Each campaign runs once, in this process's Python (``deltarl run``); the phases' summaries hold
``confirm_seconds`` beside ``wall_seconds`` (the baseline: the same phase's own time). Prints one
table; docs/verdicts.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

HOPPER = {
    "name": "confirm-hopper", "scenario": "Hopper-v5", "aut": "zoo:Hopper-v5", "seed": 0, "workers": 0,
    "mlflow": False,
    "safety": {"fuzzer": "curefuzz", "budget": {"episodes": 256}, "generation_size": 64},
    "challenger": {"algos": ["bc"], "steps": 5000, "eval_episodes": 10},
    "optimality": {"fuzzer": "delta", "budget": {"episodes": 128}, "generation_size": 64},
}


def _run(campaign: dict, out: Path) -> dict:
    f = out.with_suffix(".yaml")
    f.write_text(yaml.safe_dump(campaign))
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(f), "--out", str(out), "--quiet",
                          "--no-dashboard"], cwd=REPO, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"{campaign['name']} failed:\n{res.stderr[-3000:]}")
    return json.loads((out / "results.json").read_text())


def _rows(name: str, results: dict) -> list[str]:
    out = []
    for phase, key, flaky in (("safety", "failures", "flaky_failures"), ("optimality", "bugs", "flaky_bugs")):
        s = results.get(phase)
        if not s:
            continue
        share = s["confirm_seconds"] / s["wall_seconds"] if s["wall_seconds"] else float("nan")
        n = s["episodes"] if phase == "safety" else s["cases"]
        out.append(f"| {name} | {phase} | {n} | {s[key]} | {s[flaky]} | {s['wall_seconds']:.1f} | "
                   f"{s['confirm_seconds']:.1f} | {100 * share:.1f}% |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="quarter budgets")
    args = ap.parse_args()
    quick = yaml.safe_load((REPO / "experiments" / "quickstart.yaml").read_text())
    hopper = json.loads(json.dumps(HOPPER))
    if args.quick:
        for c in (quick, hopper):
            for ph in ("safety", "optimality"):
                c[ph]["budget"]["episodes"] = max(64, c[ph]["budget"]["episodes"] // 4)
    lines = ["| campaign | phase | states | confirmed | flaky | phase wall (s) | confirmation (s) | share |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, c in (("quick start", quick), ("Hopper-v5", hopper)):
            lines += _rows(name, _run(c, Path(tmp) / name.replace(" ", "-")))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
