"""LLMTester's tables in a report: per scenario, the safety methods' failures and distinct failure
states (Table II: # Entire / # Initial / # Terminal) beside the paper's
(``experiments/papers/llmtester.yaml``), what the LLM cost (calls, tokens, invalid replies), the
LLM calls the multi-scale strategy saved (Section IV-E, Fig. 10), and LLMTester against the best
other method with Mann–Whitney U and Cohen's d over runs.

A unit is one safety run (:func:`~orchestrator.analysis.sections.safety_units`); every cell says
its n. The paper gives one number per cell (no spread, no number of runs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import yaml

from orchestrator.analysis import stats
from orchestrator.analysis.document import Doc
from orchestrator.analysis.sections import NA_FEW, _mean, _p, _vals, cell, safety_units
from workers.resources import resource

PAPER_FILE = resource("papers", "llmtester.yaml")
METRICS = (("failures", "failures"), ("states_entire", "# entire"), ("states_initial", "# initial"),
           ("states_terminal", "# terminal"))
PAPER_KEYS = {"failures": "failures", "states_entire": "entire", "states_initial": "initial",
              "states_terminal": "terminal"}
OURS = "llmtester"
ABLATION = "llmtester w/o ms"


def load_paper() -> dict:
    return yaml.safe_load(PAPER_FILE.read_text()) if PAPER_FILE.is_file() else {}


def method_order(methods) -> list[str]:
    first = (OURS, ABLATION, "mdpfuzz", "random")
    return sorted(set(methods), key=lambda m: (first.index(m) if m in first else len(first), m))


def table2_units(runs: pd.DataFrame, scenario: str) -> pd.DataFrame:
    """The distinct safety runs of ``scenario`` that say their method (empty when none)."""
    if "safety_method" not in runs:
        return runs.iloc[0:0]
    units = safety_units(runs, scenario)
    return units[units["safety_method"].notna()]


def _col(units: pd.DataFrame, name: str) -> pd.Series:
    return units[name] if name in units else pd.Series([np.nan] * len(units), index=units.index)


def section_table2(doc: Doc, data, scenario: str, paper: dict) -> bool:
    """The Table II layout for ``scenario`` when the paper has the scenario or LLMTester ran on it;
    returns whether it wrote anything."""
    units = table2_units(data["runs"], scenario)
    p2 = (paper.get("table2") or {}).get(scenario) or {}
    if units.empty or not (p2 or units["safety_method"].str.startswith(OURS).any()):
        return False
    methods = method_order(units["safety_method"])
    doc.h("Safety testing in LLMTester's layout (Table II, Fig. 10)", 3)
    tests = sorted({int(e) for e in _vals(units["safety_episodes"])})
    ptests = ((paper.get("table1") or {}).get(scenario) or {}).get("tests")
    grids = sorted({str(g) for g in _col(units, "states_grid").dropna()})
    intervals = sorted({int(i) for i in _vals(_col(units, "states_intervals"))})
    doc.p(f"{len(units)} safety run(s); tests per run: {', '.join(map(str, tests)) or 'n/a'}"
          + (f" (paper: {ptests})" if ptests else "") + "; distinct states on a "
          + (" and ".join(grids) or "not recorded") + " grid of "
          + (", ".join(map(str, intervals)) or "?") + " intervals per observation dimension"
          + (" (the same bounds for every run, so counts compare)" if grids == ["fixed"] else
             " (fitted to each run's own failures: counts of two runs are on different grids)" if "fitted" in grids
             else "") + ". Paper: " + (paper.get("source", "n/a") + ", one run per cell" if p2 else "no numbers for "
                                      "this scenario") + ".")
    rows = []
    for m in methods:
        u = units[units["safety_method"] == m]
        row = [m]
        for k, _ in METRICS:
            pv = (p2.get(m) or {}).get(PAPER_KEYS[k])
            row += [cell(_col(u, k), why_empty="not recorded"), "" if pv is None else str(pv)]
        calls = _vals(_col(u, "llm_calls"))
        llm = m.startswith(OURS)
        row += [cell(calls, why_empty="not recorded", digits=0) if llm else "–",
                cell(_col(u, "llm_tokens"), why_empty="not recorded", digits=0) if llm else "–",
                _share(_col(u, "llm_invalid_share"), calls) if llm else "–",
                cell(_col(u, "safety_wall_seconds"), why_empty="not recorded", digits=0)]
        rows.append(row)
    headers = ["method"] + [h for _, label in METRICS for h in (label, "paper")] + [
        "LLM calls", "LLM tokens", "invalid replies", "wall (s)"]
    doc.table(headers, rows, caption=f"{scenario}: failures and distinct failure states per method (Table II layout)")
    doc.note("Cells: mean ± 95% CI margin over the method's safety runs, n = runs. # entire / # initial / # terminal: "
             "distinct grid cells of every observation of the failing episodes, of their initial and of their final "
             "observations. Invalid replies: replies without a usable scenario, as a share of all replies (pooled over "
             "the runs); each such test fell back to a random mutation. \"–\": the method calls no LLM.")
    _per_run(doc, units, scenario, methods)
    _operators(doc, units, scenario, methods)
    _versus_best(doc, units, scenario, methods)
    _calls_saved(doc, units, scenario, paper)
    return True


def _per_run(doc: Doc, units: pd.DataFrame, scenario: str, methods: list[str], most: int = 40) -> None:
    """One row per run: the spread behind each mean (LLMTester's adaptive threshold can take two
    seeds of one campaign to opposite regimes)."""
    if len(units) > most:
        return

    def num(v) -> str:
        return "–" if v is None or v != v else f"{float(v):.0f}"

    rows = []
    for m in methods:
        u = units[units["safety_method"] == m].sort_values("seed")
        for _, r in u.iterrows():
            llm = m.startswith(OURS)
            rows.append([m, str(r["seed"]), num(r["failures"]), num(r.get("states_entire")), num(r.get("states_initial")),
                         num(r.get("states_terminal")), num(r.get("llm_calls")) if llm else "–",
                         num(r.get("llm_usable")) if llm else "–", num(r.get("llm_unchanged")) if llm else "–",
                         _alpha(r.get("llm_alpha_final")) if llm and m != ABLATION else "–",
                         num(r.get("safety_wall_seconds"))])
    doc.table(["method", "seed", "failures", "# entire", "# initial", "# terminal", "LLM calls", "usable replies",
               "replies = seed", "α at the end", "wall (s)"], rows, align="lrrrrrrrrrr", caption=f"{scenario}: every run")
    doc.note("Usable replies: a valid scenario came back (the others fell back to a random mutation); replies = seed: "
             "usable, and the seed itself as printed in the prompt (small models copy it). α: the multi-scale threshold "
             "after the last generation (percent of the database counted as high-potential, whose seeds get a random "
             "mutation instead of the LLM; Eq. 6 moves it after each failure); \"–\" for w/o ms, which asks the LLM "
             "for every fuzzing test and never uses α.")


def _alpha(v) -> str:
    return "–" if v is None or v != v else f"{float(v):.3g}"


OPERATORS = (("llm_scenarios", "llm_scenario_failures", "the LLM's scenario"),
             ("random_mutations", "random_mutation_failures", "random mutation (multi-scale)"),
             ("llm_fallbacks", "llm_fallback_failures", "random mutation replacing an unusable reply"))


def _operators(doc: Doc, units: pd.DataFrame, scenario: str, methods: list[str]) -> None:
    """Which operator made the failing fuzzing tests, pooled over the runs that recorded it: does
    the LLM's scenario fail more often than a random mutation?"""
    rows, missing = [], 0
    for m in (m for m in methods if m.startswith(OURS)):
        u = units[units["safety_method"] == m]
        known = u[_col(u, "llm_scenario_failures").notna()]
        missing += len(u) - len(known)
        for tests_col, fail_col, label in OPERATORS if not known.empty else ():
            tests, fails = sum(_vals(known[tests_col])), sum(_vals(known[fail_col]))
            rate = f"{100.0 * fails / tests:.1f}%" if tests else "–"
            rows.append([m, label, f"{tests:.0f}", f"{fails:.0f}", rate, str(len(known))])
    if rows:
        doc.table(["method", "operator that made the test", "fuzzing tests", "failures", "failure rate", "runs"], rows,
                  align="llrrrr", caption=f"{scenario}: failing fuzzing tests by the operator that made them (pooled)")
        doc.note("Tests of the fuzzing phase only (MDPFuzz's twins, which measure sensitivity, and the sampling phase "
                 "are under no operator)." + (f" {missing} LLMTester run(s) predate this record and are left out."
                                              if missing else ""))


def _share(shares: pd.Series, calls: list[float]) -> str:
    s = _vals(shares)
    if not s:
        return "n/a (not recorded)"
    if len(s) == len(calls) and sum(calls) > 0:
        return f"{100.0 * sum(a * b for a, b in zip(s, calls)) / sum(calls):.1f}%"
    return f"{100.0 * float(np.mean(s)):.1f}%"


def _versus_best(doc: Doc, units: pd.DataFrame, scenario: str, methods: list[str]) -> None:
    others = [m for m in methods if not m.startswith(OURS)]
    if OURS not in methods or not others:
        return
    rows = []
    for k, label in METRICS:
        vals = {m: _vals(_col(units[units["safety_method"] == m], k)) for m in [OURS, *others]}
        name, best = stats.best_baseline({m: _mean(vals[m]) for m in others})
        if not name or not vals[OURS]:
            continue
        a, b = vals[OURS], vals[name]
        if min(len(a), len(b)) >= 2:
            u, p = stats.mann_whitney(a, b)
            d = stats.cohens_d(a, b)
            ucell, pcell, dcell = f"{u:.1f}", _p(p), f"{d:.2f}" if np.isfinite(d) else "n/a (no spread)"
        else:
            ucell = pcell = dcell = NA_FEW
        ratio = f"{_mean(a) / best:.2f}×" if best else "n/a (best other is 0)"
        rows.append([label, name, cell(a), cell(b), ratio, ucell, pcell, dcell])
    if rows:
        doc.table(["metric", "best other method", "LLMTester", "best other", "ratio", "Mann–Whitney U",
                   "p (two-sided)", "Cohen's d"], rows, align="llrrrrrr",
                  caption=f"{scenario}: LLMTester against the best other method on each metric (runs as samples)")
        doc.note(f"{NA_FEW}: U, p and Cohen's d need at least two runs on each side. The ablation (w/o ms) is not a "
                 "baseline here; it is compared in the calls-saved line below.")


def _calls_saved(doc: Doc, units: pd.DataFrame, scenario: str, paper: dict) -> None:
    ms = _vals(_col(units[units["safety_method"] == OURS], "llm_calls"))
    wo = _vals(_col(units[units["safety_method"] == ABLATION], "llm_calls"))
    pv = (paper.get("calls_saved_pct") or {}).get(scenario)
    if ms and wo and _mean(wo) > 0:
        saved = 100.0 * (1.0 - _mean(ms) / _mean(wo))
        doc.p(f"LLM calls saved by the multi-scale strategy: {saved:.1f}% ({_mean(ms):.0f} calls per run with it, "
              f"n={len(ms)}; {_mean(wo):.0f} without, n={len(wo)})" + (f"; paper: {pv}%." if pv is not None else "."))
    elif ms and pv is not None:
        doc.p(f"LLM calls saved by the multi-scale strategy: n/a (no `multi_scale: false` run); paper: {pv}%.")
