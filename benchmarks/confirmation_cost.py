"""What sound verdicts cost, as a share of each phase's wall time, both ways of reaching the
agent as deployed (docs/verdicts.md):

* ``inference: batched`` (the default): the search acts in batches; candidate failures and bugs
  are re-run with each agent acting alone before they count. Cost: the phase's ``confirm_seconds``.
* ``inference: alone``: every policy call of the phase sees one observation, so nothing is re-run.
  Cost: the extra inference time, ``rollout_seconds - steps x (the batched run's rollout seconds
  per episode step)``, against the same campaign run batched in this script (per step, because the
  two searches propose different states and Hopper's episodes differ in length).

Campaigns: the quick start as shipped; Hopper-v5 with the project's SAC (``zoo:Hopper-v5``, which
fails from most initial states: the costliest case for re-running), batched and alone; Walker2d-v5
with the rl-baselines3-zoo SAC from ``../shared/data/rlzoo`` (100% success: failures are rare), when
that folder is there. A campaign run both ways trains its challenger once: the ``alone`` run tests
against the ``batched`` run's challenger.

    python benchmarks/confirmation_cost.py                 # everything (~10-20 min on 2 cores)
    python benchmarks/confirmation_cost.py --quick         # quarter budgets
    python benchmarks/confirmation_cost.py --only hopper   # one campaign (quickstart|hopper|walker2d)

Each campaign runs once, in this process's Python (``deltarl run``); the phases' summaries hold
``confirm_seconds``, ``rollout_seconds`` and ``wall_seconds``. Prints one table with the machine's
load average; experiments/results/confirmation-cost.md and docs/verdicts.md quote it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]

HOPPER = {
    "name": "confirm-hopper", "scenario": "Hopper-v5", "aut": "zoo:Hopper-v5", "seed": 0, "workers": 0,
    "mlflow": False,
    "safety": {"fuzzer": "curefuzz", "budget": {"episodes": 256}, "generation_size": 64},
    "challenger": {"algos": ["bc"], "steps": 5000, "eval_episodes": 10},
    "optimality": {"fuzzer": "delta", "budget": {"episodes": 128}, "generation_size": 64},
}
WALKER_AUT = REPO.parent / "shared" / "data" / "rlzoo" / "sac" / "Walker2d-v3_1"
WALKER2D = {**HOPPER, "name": "confirm-walker2d", "scenario": "Walker2d-v5", "aut": f"rlzoo:{WALKER_AUT}"}


def _with_inference(campaign: dict, mode: str) -> dict:
    c = json.loads(json.dumps(campaign))
    c["name"] = f"{c['name']}-{mode}"
    for ph in ("safety", "optimality"):
        c[ph]["inference"] = mode
    return c


def _run(campaign: dict, out: Path) -> dict:
    f = out.with_suffix(".yaml")
    f.write_text(yaml.safe_dump(campaign))
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(f), "--out", str(out), "--quiet",
                          "--no-dashboard"], cwd=REPO, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"{campaign['name']} failed:\n{res.stderr[-3000:]}")
    return json.loads((out / "results.json").read_text())


def _steps(results: dict, run_dir: Path) -> dict:
    """Episode steps each phase ran, both roles: its episodes are those its fuzzer wrote (the
    campaigns here give the two phases different fuzzers)."""
    eps = pd.read_parquet(run_dir / "episodes", columns=["fuzzer", "length"])
    return {ph: int(eps.loc[eps["fuzzer"] == results[ph]["fuzzer"], "length"].sum())
            for ph in ("safety", "optimality") if results.get(ph)}


def _rows(name: str, mode: str, results: dict, steps: dict, batched: dict | None) -> list[str]:
    """Table rows of one campaign; ``batched``: per phase, the batched run's rollout seconds per
    step (the baseline an ``alone`` run's extra inference time is measured against)."""
    out = []
    for phase, key, flaky in (("safety", "failures", "flaky_failures"), ("optimality", "bugs", "flaky_bugs")):
        s = results.get(phase)
        if not s:
            continue
        if mode == "batched":
            cost = s["confirm_seconds"]
        else:
            cost = s["rollout_seconds"] - steps[phase] * batched[phase] if batched else float("nan")
        share = cost / s["wall_seconds"] if s["wall_seconds"] else float("nan")
        n = s["episodes"] if phase == "safety" else s["cases"]
        out.append(f"| {name} | {mode} | {phase} | {n} | {steps[phase]} | {s[key]} | {s[flaky]} | {s['wall_seconds']:.1f} | "
                   f"{s['rollout_seconds']:.1f} | {cost:.1f} | {100 * share:.1f}% |")
    return out


def _per_step(results: dict, steps: dict) -> dict:
    return {ph: results[ph]["rollout_seconds"] / max(1, n) for ph, n in steps.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="quarter budgets")
    ap.add_argument("--only", choices=["quickstart", "hopper", "walker2d"], default=None, help="one campaign")
    args = ap.parse_args()
    quick = yaml.safe_load((REPO / "experiments" / "quickstart.yaml").read_text())
    plan = [("quickstart", "quick start", quick, ("batched",)),
            ("hopper", "Hopper-v5 (zoo SAC)", json.loads(json.dumps(HOPPER)), ("batched", "alone"))]
    if WALKER_AUT.is_dir():
        plan.append(("walker2d", "Walker2d-v5 (rl-zoo SAC)", json.loads(json.dumps(WALKER2D)), ("batched",)))
    else:
        print(f"(no {WALKER_AUT}: the Walker2d row is left out)")
    if args.only:
        plan = [p for p in plan if p[0] == args.only]
    if args.quick:
        for _, _, c, _ in plan:
            for ph in ("safety", "optimality"):
                c[ph]["budget"]["episodes"] = max(64, c[ph]["budget"]["episodes"] // 4)
    load0 = os.getloadavg()[0]
    lines = ["| campaign | inference | phase | states | episode steps | confirmed | flaky | phase wall (s) | "
             "rollouts (s) | cost of verdicts (s) | share |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for key, name, c, modes in plan:
            baseline, trained = None, None
            for mode in modes:
                out = Path(tmp) / f"{key}-{mode}"
                run = _with_inference(c, mode) if key != "quickstart" else c
                if trained:  # the second run tests against the first run's challenger (one training, one opponent)
                    run.pop("challenger", None)
                    run["optimality"]["challenger"] = trained
                res = _run(run, out)
                if res.get("optimality") and not trained:
                    trained = res["optimality"]["challenger"]
                    if not Path(trained).is_absolute():
                        trained = str(out / trained)
                steps = _steps(res, out)
                lines += _rows(name, mode, res, steps, baseline)
                if mode == "batched":
                    baseline = _per_step(res, steps)
    print(f"{os.cpu_count()} CPUs; load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
