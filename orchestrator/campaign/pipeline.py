"""A campaign end to end: safety → challenger → optimality, in one run folder.

    results = run_campaign(load_campaign("experiments/quickstart.yaml"))
    print(summary_table(results))

Each phase runs when the campaign has its section; ``resume=True`` continues the run folder:
a finished phase is not redone (a finished safety or optimality phase is read back, an
interrupted one picks up from its last generation snapshot, a challenger with a card is kept).
The folder's lock is held throughout: one process writes a run folder at a time.
"""

from __future__ import annotations

import shutil

from orchestrator.campaign.challenger import run_challenger_phase
from orchestrator.campaign.generations import committed_anywhere, drop_uncommitted
from orchestrator.campaign.optimality import run_optimality
from orchestrator.campaign.safety import run_safety
from orchestrator.runs.layout import PHASE_SECTIONS, RunFolder
from orchestrator.runs.mlflow_ui import ui_lines
from orchestrator.runs.store import atomic_write_bytes


def run_campaign(campaign, *, resume: bool = False, progress: bool = True) -> dict:
    """Run ``campaign``'s phases in its run folder, holding the folder's lock throughout (one
    writer per folder). The folder must be new or empty, or (``resume``) hold this campaign, or
    hold a run of the same scenario, AUT and seed without the phases this campaign adds
    (:meth:`RunFolder.claim`). A new run that fails before its first snapshot leaves nothing."""
    scenario = campaign.build_scenario()  # built once (validation built it already), reused by every phase
    run = RunFolder(campaign.output)
    with run.lock("deltarl run --resume" if resume else "deltarl run"):
        before = run.campaign_json.read_bytes() if run.has_campaign() else None
        mode = run.claim(campaign.to_dict(), resume=resume)
        try:
            out = _run_phases(campaign, run, scenario, resume=resume, progress=progress)
        except Exception:
            _undo(run, campaign, mode, before)
            raise
    return out


def _run_phases(campaign, run: RunFolder, scenario, *, resume: bool, progress: bool) -> dict:
    out = {"campaign": campaign.name, "output": str(run.root), "safety": run.summary("safety"),
           "challengers": run.cards(), "optimality": run.summary("optimality")}
    if campaign.safety is not None and not (resume and run.finished("safety")):
        out["safety"] = run_safety(campaign, resume=resume, progress=progress, scenario=scenario)
    if campaign.challenger is not None:
        out["challengers"] = run_challenger_phase(campaign, resume=resume, progress=progress)
    if campaign.optimality is not None and not (resume and run.finished("optimality")):
        out["optimality"] = run_optimality(campaign, resume=resume, progress=progress, scenario=scenario)
    run.write_json(run.results_json, out)
    return out


def _undo(run: RunFolder, campaign, mode: str, before: bytes | None) -> None:
    """After a failure before anything was committed: a new run leaves its folder as it found
    it (empty), a phase added to a run gives the run its campaign.json back."""
    added = [p for p in PHASE_SECTIONS if getattr(campaign, p) is not None]
    if any(run.has_phase(p) for p in ("safety", "optimality") if p in added) or (
            "challenger" in added and run.challenger_cards()):
        return  # a generation (or a challenger) is committed: the run is resumable, keep it
    if mode == "new":
        for name in run.entries():
            path = run.root / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    elif mode == "add" and before is not None:
        drop_uncommitted(run.root, committed_anywhere(run))  # parts of the added phase's first generation
        atomic_write_bytes(run.campaign_json, before)


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
    for name, r in (("safety", s), ("optimality", o)):
        if r and r.get("llm_calls") is not None:  # an LLM-guided fuzzer: did the LLM do its part?
            none = " (NONE: every LLM seed fell back to random mutation)" if r.get("llm_no_usable_scenario") else ""
            tokens = r.get("llm_prompt_tokens", 0) + r.get("llm_completion_tokens", 0)
            share = r.get("llm_invalid_share")
            invalid = "" if share is None or share != share else f", {share:.0%} of replies invalid"
            rows.append((f"{name} LLM", f"{r['llm_calls']} calls, {tokens} tokens",
                         f"{r['llm_usable']} usable scenarios{none}{invalid}"))
    lines = ["| phase | work | result |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    run = RunFolder(results["output"])
    root = run.root
    files = [f"run folder        {root}",
             f"episodes (D)      {root / 'steps'}/*.parquet, {root / 'episodes'}/*.parquet"]
    if s and s["failures"]:
        files.append(f"failures          {run.failures_parquet}  (deltarl replay {root} ID --failure)")
    if o and o["bugs"]:
        files.append(f"bugs              {run.bugs_parquet}  (deltarl replay {root} BUG_ID [--video])")
    if (s and s.get("flaky_failures")) or (o and o.get("flaky_bugs")):
        files.append(f"flaky candidates  {root}/flaky_*.parquet  (held in the batched search, not alone)")
    for name, summary in (("safety", s), ("optimality", o)):
        if summary and summary.get("executor"):
            why = f" ({summary['executor_reason']})" if summary.get("executor_reason") else ""
            files.append(f"{name + ' ran':<18}{summary['executor']}{why}")
            if summary.get("inference"):
                acted = ("every agent acting alone" if summary["inference"] == "alone"
                         else "batched, candidates re-run alone")
                how = summary.get("inference_reason") or f"inference: {summary['inference']}"
                files.append(f"{name + ' acted':<18}{acted} ({how})")
    for c in results.get("challengers") or []:
        if c.get("placement"):
            files.append(f"{c['config']['algo'] + ' trained':<18}{c['placement']}")
    files += [f"summary           {run.results_json}",
              "MLflow            " + "\n".join(ui_lines(root / "mlflow.db"))]
    notes = ["", "Failures and bugs are confirmed with each agent acting alone (one observation per call, as "
             "deployed); candidates that held only in the batched search are counted as flaky: the agent is "
             "near-tied at those states."] if (s and s.get("flaky_failures")) or (o and o.get("flaky_bugs")) else []
    return "\n".join(lines + [""] + files + notes)


def _flaky(n) -> str:
    return f" (+{n} flaky)" if n else ""
