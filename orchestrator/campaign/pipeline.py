"""A campaign end to end: safety → challenger → optimality, in one run folder.

    results = run_campaign(load_campaign("experiments/quickstart.yaml"))
    print(summary_table(results))

Each phase runs when the campaign has its section; ``resume=True`` continues the run folder:
a finished phase is not redone (a finished safety or optimality phase is read back, an
interrupted one picks up from its last generation snapshot, a challenger with a card is kept).
The folder's lock is held throughout: one process writes a run folder at a time.
"""

from __future__ import annotations

import errno
import shutil

from orchestrator.campaign.challenger import run_challenger_phase
from orchestrator.campaign.config import CampaignError
from orchestrator.campaign.generations import committed_anywhere
from orchestrator.campaign.optimality import run_optimality
from orchestrator.campaign.safety import run_safety
from orchestrator.cluster.executor import WorkersError, check_workers
from orchestrator.runs.files import unlink_quiet
from orchestrator.runs.identity import (
    check_identity,
    identity_path,
    plain,
    read_identity,
    record_identity,
)
from orchestrator.runs.layout import PHASE_SECTIONS, RunFolder
from orchestrator.runs.mlflow_ui import ui_lines
from orchestrator.runs.parquet import deltarl_version
from orchestrator.runs.store import StoreError, atomic_write_bytes, drop_uncommitted
from workers.policies import PolicyError, shared_policy


def run_campaign(campaign, *, resume: bool = False, progress: bool = True) -> dict:
    """Run ``campaign``'s phases in its run folder, holding the folder's lock throughout (one
    writer per folder). The folder must be new or empty, or (``resume``) hold this campaign, or
    hold a run of the same scenario, AUT and seed without the phases this campaign adds
    (:meth:`RunFolder.claim`). A new run that fails before its first snapshot leaves nothing.

    Before any work: the rollout actors asked for must fit the CPUs (:func:`check_workers`), and
    the AUT and a named challenger must load and fit the scenario. The run's identity (AUT and
    challenger sha256, seed, scenario and overrides, each phase's settings, deltarl's version:
    :mod:`orchestrator.runs.identity`) is recorded at the start; a resume (or a phase added)
    whose identity differs is refused with one message naming what changed, nothing written."""
    scenario = campaign.build_scenario()  # built once (validation built it already), reused by every phase
    try:
        check_workers(campaign.workers)
    except WorkersError as exc:
        raise CampaignError(str(exc)) from None
    identity = campaign_identity(campaign, scenario)  # loads the AUT and a named challenger: errors come now
    run = RunFolder(campaign.output)
    try:
        with run.lock("deltarl run --resume" if resume else "deltarl run"):
            before = run.campaign_json.read_bytes() if run.has_campaign() else None
            ident_before = identity_path(run.root).read_bytes() if identity_path(run.root).is_file() else None
            mode = run.claim(campaign.to_dict(), resume=resume)
            try:
                _record(run, identity, mode)
                out = _run_phases(campaign, run, scenario, resume=resume, progress=progress)
            except Exception:
                _undo(run, campaign, mode, before, ident_before)
                raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            then = (f"continue with: deltarl run --resume {run.root}" if run.has_campaign()
                    else "run the campaign again (nothing of it was kept)")
            raise StoreError(f"the disk holding {run.root} is full ({exc.strerror}: {exc.filename or run.root}); "
                             f"free some space, then {then}") from None
        raise
    return out


def campaign_identity(campaign, scenario) -> dict:
    """What the run's record comes from (:mod:`orchestrator.runs.identity`): the AUT's sha256 is
    the loaded policy's (every episode's ``policy_sha256``), and so is a named challenger's."""
    aut = shared_policy(campaign.aut, scenario)  # a policy that does not load or fit: clear error, nothing written
    phases = {}
    if campaign.safety is not None:
        phases["safety"] = _search_settings(campaign.safety)
    if campaign.challenger is not None:
        ch = campaign.challenger
        phases["challenger"] = {"algos": list(ch.algos), "preset": ch.preset, "steps": ch.steps}
    if campaign.optimality is not None:
        o = campaign.optimality
        phases["optimality"] = {**_search_settings(o), "oracle": o.oracle, "delta": o.delta, "repeats": o.repeats,
                                "alpha": o.alpha, "challenger": o.challenger}
        if o.challenger:  # a named policy (else the run trains it: its card names its data and settings)
            try:
                ca = shared_policy(o.challenger, scenario)
            except PolicyError as exc:  # before the safety phase, not after it
                raise PolicyError(f"optimality.challenger: {exc}") from None
            phases["optimality"]["challenger_sha256"] = getattr(ca, "sha256", "") or ""
    return {"deltarl_version": deltarl_version(), "scenario": campaign.scenario,
            "scenario_overrides": dict(campaign.scenario_overrides or {}), "aut": campaign.aut,
            "aut_sha256": getattr(aut, "sha256", "") or "", "seed": campaign.seed, "batch_size": campaign.batch_size,
            "phases": phases}


def _search_settings(spec) -> dict:
    """A search phase's settings that shape its record (its budget only says where it stops)."""
    return {"fuzzer": spec.fuzzer, "params": dict(spec.params or {}), "sampling_fraction": spec.sampling_fraction,
            "generation_size": spec.generation_size, "execution": spec.execution, "corpus": spec.corpus,
            "inference": spec.inference}


def _record(run: RunFolder, identity: dict, mode: str) -> None:
    """Check the run's recorded identity (a resume, a phase added) and record it (a new run, a
    phase added, a run from before identities were recorded)."""
    want = plain(identity) if mode == "new" else check_identity(run.root, identity, resume=mode == "resume")
    have = read_identity(run.root)
    if have is None or {k: v for k, v in have.items() if k != "identity_version"} != want:
        record_identity(run.root, want)


def _run_phases(campaign, run: RunFolder, scenario, *, resume: bool, progress: bool) -> dict:
    out = {"campaign": campaign.name, "output": str(run.root), "safety": run.summary("safety"),
           "challengers": run.cards(), "optimality": run.summary("optimality")}
    if campaign.safety is not None and not (resume and run.finished("safety")):
        out["safety"] = run_safety(campaign, resume=resume, progress=progress, scenario=scenario)
    if campaign.challenger is not None:
        out["challengers"] = run_challenger_phase(campaign, resume=resume, progress=progress)
    if campaign.optimality is not None and not (resume and run.finished("optimality")):
        out["optimality"] = run_optimality(campaign, resume=resume, progress=progress, scenario=scenario)
    run.write_json(run.results_json, out)  # strict JSON: NaN (no bugs, no distance) is null
    return out


def _undo(run: RunFolder, campaign, mode: str, before: bytes | None, ident_before: bytes | None = None) -> None:
    """After a failure before anything was committed: a new run leaves its folder as it found
    it (empty), a phase added to a run gives the run its campaign.json (and identity) back."""
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
        if ident_before is None:
            unlink_quiet(identity_path(run.root))
        else:
            atomic_write_bytes(identity_path(run.root), ident_before)


def summary_table(results: dict, *, mlflow: bool = True) -> str:
    """The campaign's headline figures as a Markdown table, plus where its files are (the MLflow
    line only when the campaign logged to MLflow)."""
    s, o = results.get("safety"), results.get("optimality")
    rows = _phase_rows(results) + _llm_rows(s, o)
    lines = ["| phase | work | result |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    flaky = bool((s and s.get("flaky_failures")) or (o and o.get("flaky_bugs")))
    notes = ["", "Failures and bugs are confirmed with each agent acting alone (one observation per call, as "
             "deployed); candidates that held only in the batched search are counted as flaky: the agent is "
             "near-tied at those states."] if flaky else []
    return "\n".join(lines + [""] + _file_lines(results, flaky, mlflow=mlflow) + notes)


def _phase_rows(results: dict) -> list[tuple[str, str, str]]:
    """(phase, work, result) of safety, each challenger and optimality."""
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
        dist = "n/a" if o.get("distance") is None or o["distance"] != o["distance"] else f"{o['distance']:.3f}"
        rows.append(("optimality", f"{o['fuzzer']} ({o['oracle']} oracle), {o['cases']} test cases, {o['wall_seconds']:.0f} s",
                     f"{o['bugs']} bugs in {o['distinct_bugs']} distinct cells, distance {dist}"
                     f"{_flaky(o.get('flaky_bugs'))}"))
    return rows


def _llm_rows(s: dict | None, o: dict | None) -> list[tuple[str, str, str]]:
    """An LLM-guided fuzzer's row per phase: did the LLM do its part?"""
    rows = []
    for name, r in (("safety", s), ("optimality", o)):
        if r and r.get("llm_calls") is not None:
            none = " (NONE: every LLM seed fell back to random mutation)" if r.get("llm_no_usable_scenario") else ""
            tokens = r.get("llm_prompt_tokens", 0) + r.get("llm_completion_tokens", 0)
            share = r.get("llm_invalid_share")
            invalid = "" if share is None or share != share else f", {share:.0%} of replies invalid"
            rows.append((f"{name} LLM", f"{r['llm_calls']} calls, {tokens} tokens",
                         f"{r['llm_usable']} usable scenarios{none}{invalid}"))
    return rows


def _file_lines(results: dict, flaky: bool, *, mlflow: bool = True) -> list[str]:
    """Where the run's files are, and which executor ran each phase and why."""
    s, o = results.get("safety"), results.get("optimality")
    run = RunFolder(results["output"])
    root = run.root
    files = [f"run folder        {root}",
             f"episodes (D)      {root / 'steps'}/*.parquet, {root / 'episodes'}/*.parquet"]
    if s and s["failures"]:
        files.append(f"failures          {run.failures_parquet}  (deltarl replay {root} ID --failure)")
    if o and o["bugs"]:
        files.append(f"bugs              {run.bugs_parquet}  (deltarl replay {root} BUG_ID [--video])")
    if flaky:
        files.append(f"flaky candidates  {root}/flaky_*.parquet  (held in the batched search, not alone)")
    for name, summary in (("safety", s), ("optimality", o)):
        files += _executor_lines(name, summary)
    files += _acted_lines((("safety", s), ("optimality", o)))
    for c in results.get("challengers") or []:
        if c.get("placement"):
            files.append(f"{c['config']['algo'] + ' trained':<18}{c['placement']}")
    files.append(f"summary           {run.results_json}")
    if mlflow:
        files.append("MLflow            " + "\n".join(ui_lines(root / "mlflow.db")))
    return files


def _executor_lines(name: str, summary: dict | None) -> list[str]:
    if not (summary and summary.get("executor")):
        return []
    why = f" ({summary['executor_reason']})" if summary.get("executor_reason") else ""
    return [f"{name + ' ran':<18}{summary['executor']}{why}"]


def _acted_lines(phases) -> list[str]:
    """How the agents acted, once for the phases that acted alike, in a few words (the reasons
    behind ``inference: auto`` are in docs/verdicts.md, not repeated per run)."""
    acted: dict[str, list[str]] = {}
    for name, summary in phases:
        mode = (summary or {}).get("inference")
        if not mode:
            continue
        how = ("every agent acting alone" if mode == "alone" else "batched, candidates re-run alone")
        auto = (summary.get("inference_reason") or "inference: auto").startswith("inference: auto")
        how += " (inference: auto)" if auto else " (set in the campaign)"
        acted.setdefault(how, []).append(name)
    return [f"{' and '.join(names) + ' acted' if len(acted) > 1 else 'agents acted':<18}{how}"
            for how, names in acted.items()]


def _flaky(n) -> str:
    return f" (+{n} flaky)" if n else ""
