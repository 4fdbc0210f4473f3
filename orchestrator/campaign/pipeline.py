"""A campaign end to end: safety → challenger → optimality, in one run folder.

    results = run_campaign(load_campaign("experiments/quickstart.yaml"))
    print(summary_table(results))

Each phase runs when the campaign has its section; ``resume=True`` continues the run folder:
a finished phase is not redone (safety and optimality pick up from their last generation
snapshot and stop at once when their budget is spent, a challenger with a card is kept).
"""

from __future__ import annotations

from orchestrator.campaign.challenger import run_challenger_phase
from orchestrator.campaign.optimality import run_optimality
from orchestrator.campaign.safety import run_safety
from orchestrator.runs.layout import RunFolder


def run_campaign(campaign, *, resume: bool = False, progress: bool = True) -> dict:
    scenario = campaign.build_scenario()  # built once (validation built it already), reused by every phase
    run = RunFolder(campaign.output)
    out = {"campaign": campaign.name, "output": str(run.root), "safety": None, "challengers": [],
           "optimality": None}
    if campaign.safety is not None:
        out["safety"] = run_safety(campaign, resume=resume, progress=progress, scenario=scenario)
    if campaign.challenger is not None:
        out["challengers"] = run_challenger_phase(campaign, resume=resume, progress=progress)
    if campaign.optimality is not None:
        opt_resume = resume and run.has_phase("optimality")
        out["optimality"] = run_optimality(campaign, resume=opt_resume, progress=progress, scenario=scenario)
    run.write_json(run.results_json, out)
    return out


def summary_table(results: dict) -> str:
    """The campaign's headline figures as a Markdown table, plus where its files are."""
    rows = []
    s = results.get("safety")
    if s:
        rows.append(("safety", f"{s['fuzzer']}, {s['episodes']} episodes, {s['wall_seconds']:.0f} s",
                     f"{s['failures']} failures in {s['distinct_failures']} distinct cells{_flaky(s.get('flaky_failures'))}"))
    for c in results.get("challengers") or []:
        ev, aut = c["evaluation"], (c.get("aut") or {}).get("evaluation")
        vs = f" vs AUT {aut['mean_return']:.1f} ± {aut['ci95_margin']:.1f}" if aut else ""
        rows.append((f"challenger {c['config']['algo']}",
                     f"{c['steps']} steps on {c['dataset']['transitions']} transitions, {c['training_wall_seconds']:.0f} s",
                     f"return {ev['mean_return']:.1f} ± {ev['ci95_margin']:.1f}{vs} ({ev['episodes']} episodes)"))
    o = results.get("optimality")
    if o:
        dist = "n/a" if o["distance"] != o["distance"] else f"{o['distance']:.3f}"
        rows.append(("optimality", f"{o['fuzzer']} ({o['oracle']} oracle), {o['cases']} test cases, {o['wall_seconds']:.0f} s",
                     f"{o['bugs']} bugs in {o['distinct_bugs']} distinct cells, distance {dist}"
                     f"{_flaky(o.get('flaky_bugs'))}"))
    lines = ["| phase | work | result |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    run = RunFolder(results["output"])
    root = run.root
    files = [f"run folder        {root}",
             f"episodes (D)      {root / 'steps'}/*.parquet, {root / 'episodes'}/*.parquet"]
    if s and s["failures"]:
        files.append(f"failures          {run.failures_parquet}  (deltarl replay {root} ID --failure)")
    if o and o["bugs"]:
        files.append(f"bugs              {run.bugs_parquet}  (deltarl replay {root} BUG_ID)")
    if (s and s.get("flaky_failures")) or (o and o.get("flaky_bugs")):
        files.append(f"flaky candidates  {root}/flaky_*.parquet  (held in the batched search, not alone)")
    files += [f"summary           {run.results_json}",
              f"MLflow            mlflow ui --backend-store-uri sqlite:///{root.resolve() / 'mlflow.db'}"]
    notes = ["", "Failures and bugs are confirmed with each agent acting alone (one observation per call, as "
             "deployed); candidates that held only in the batched search are counted as flaky: the agent is "
             "near-tied at those states."] if (s and s.get("flaky_failures")) or (o and o.get("flaky_bugs")) else []
    return "\n".join(lines + [""] + files + notes)


def _flaky(n) -> str:
    return f" (+{n} flaky)" if n else ""
