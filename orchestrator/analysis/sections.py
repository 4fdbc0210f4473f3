"""The sections of a report: each appends its headings, tables and figures to a
:class:`~orchestrator.analysis.document.Doc` for one scenario's runs, beside the paper's numbers
(``paper``: ``experiments/papers/delta.yaml``), and says "not in this run" for what is missing.
"""

from __future__ import annotations

import re

import numpy as np

from orchestrator.analysis import stats
from orchestrator.analysis.behaviour import TAUS, cluster_run
from orchestrator.analysis.document import Doc
from orchestrator.analysis.figures import fig_dendrogram, fig_over_time, fig_returns_scatter, fig_state_heatmap
from orchestrator.analysis.markdown import frame_cells
from orchestrator.analysis.run_reader import Run, bug_states, failure_states, optimality_cases, timeline

NOT_IN_RUN = "not in this run"
BASELINES = ("mdpfuzz", "curefuzz", "gmt", "random")
METRICS = (("bugs", "bugs"), ("distinct_bugs", "distinct bugs"), ("distance", "distance"))



def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:80] or "fig"


def _mean_ci(values) -> tuple[float, float]:
    v = [float(x) for x in values if x is not None and x == x]
    return stats.mean_ci(v) if v else (float("nan"), float("nan"))


def _cell(values, digits=None) -> str:
    """Mean ± 95% CI margin over runs; a single integral value prints as the integer it is."""
    v = [float(x) for x in values if x is not None and x == x]
    if len(v) == 1 and v[0].is_integer() and digits is None:
        return str(int(v[0]))
    m, c = _mean_ci(v)
    return stats.format_cell(m, c, digits=digits)


def _num(v, digits=None) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "n/a"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return stats.format_cell(float(v), digits=digits)


def _paper_cell(v) -> str:
    if not v:
        return ""
    return stats.format_cell(float(v[0]), float(v[1]))


def section_table1(doc: Doc, runs: list[Run], scenario: str, paper: dict):
    """AUT and challengers (Table 1): mean return ± CI, AUT success rate, safety failures."""
    doc.h("AUT and challengers (Delta Table 1)", 3)
    p1 = (paper.get("table1") or {}).get(scenario) or {}
    cards = [c for r in runs for c in r.challengers if c.get("evaluation")]
    safety = [r.safety for r in runs if r.safety]
    if not cards and not safety:
        doc.p(f"Challengers and safety testing: {NOT_IN_RUN}.")
        return
    rows = []
    multi = len({str(r.dir) for r in runs if r.challengers}) > 1
    note = "over datasets (runs)" if multi else "over 100 evaluation episodes"
    auts = [c["aut"]["evaluation"] for c in cards if (c.get("aut") or {}).get("evaluation")]
    if auts:
        if multi:
            ret = _cell([a["mean_return"] for a in auts])
        else:
            ret = stats.format_cell(auts[0]["mean_return"], auts[0].get("ci95_margin"))
        succ = sum(round(a["success_rate"] * a["episodes"]) for a in auts)
        n = sum(a["episodes"] for a in auts)
        ps = p1.get("aut_success")
        rows.append([f"AUT ({runs[0].aut})", ret, _paper_cell(p1.get("aut")), stats.format_rate(succ, n),
                     f"{ps[0]:.1f} [{ps[1]:.1f}, {ps[2]:.1f}]" if ps else ""])
    by_algo: dict[str, list] = {}
    for c in cards:
        by_algo.setdefault(c["config"]["algo"], []).append(c["evaluation"])
    for algo, evs in sorted(by_algo.items()):
        ret = _cell([e["mean_return"] for e in evs]) if multi else stats.format_cell(evs[0]["mean_return"],
                                                                                      evs[0].get("ci95_margin"))
        succ = sum(round(e["success_rate"] * e["episodes"]) for e in evs)
        rows.append([algo.upper(), ret, _paper_cell(p1.get(algo)),
                     stats.format_rate(succ, sum(e["episodes"] for e in evs)), ""])
    if rows:
        doc.table(["agent", f"mean return ± 95% CI ({note})", "paper", "success rate % [Wilson 95%]", "paper"], rows,
                  caption=f"{scenario}: returns of the AUT and the offline challengers trained on its test record D")
    else:
        doc.p(f"Challengers: {NOT_IN_RUN}.")
    section_training_time(doc, cards, scenario, runs[0].aut)
    if safety:
        by = {}
        for s in safety:
            by.setdefault(s["fuzzer"], []).append(s)
        srows = []
        for fz, ss in sorted(by.items()):
            srows.append([fz, str(len(ss)), f"{ss[0]['episodes']}", _cell([s["failures"] for s in ss]),
                          _cell([s["distinct_failures"] for s in ss]),
                          _paper_cell(p1.get("safety_failures")) if fz == "curefuzz" else ""])
        doc.table(["safety fuzzer", "runs", "episodes per run", "failures", "distinct failures",
                   "paper failures (CureFuzz, 2 h)"], srows,
                  caption=f"{scenario}: safety failures of the AUT (mean ± 95% CI over runs)")


def section_training_time(doc: Doc, cards: list, scenario: str, aut: str):
    """Fig. 4: training time of the AUT (its zoo card) and the median of each challenger algorithm."""
    aut_s = next((c["aut"].get("training_wall_seconds") for c in cards
                  if (c.get("aut") or {}).get("training_wall_seconds")), None)
    by_algo: dict[str, list] = {}
    for c in cards:
        if c.get("training_wall_seconds"):
            by_algo.setdefault(c["config"]["algo"], []).append(float(c["training_wall_seconds"]))
    if not by_algo:
        return
    rows = [[f"AUT ({aut})", "1", f"{aut_s:.0f}" if aut_s else "not recorded", ""]]
    for algo, secs in sorted(by_algo.items()):
        med = float(np.median(secs))
        rows.append([algo.upper(), str(len(secs)), f"{med:.0f}",
                     f"{100 * med / aut_s:.1f}%" if aut_s else ""])
    doc.table(["agent", "trainings", "wall seconds (median)", "of the AUT's"], rows, align="lrrr",
              caption=f"{scenario}: training time of the AUT and of the challengers (Delta Fig. 4; wall time on "
                      f"the machine that trained each, shared cores included)")


def _opt_table(doc: Doc, runs: list[Run], scenario: str, methods: list[str], paper_tab: dict, caption: str,
               compare: list[str], percentages: bool = True):
    """Tables 3/4: rows = methods, columns = each metric and the paper's value; Delta against the
    best of ``compare`` (improvement, Mann–Whitney p, Cohen's d)."""
    vals = {m: {k: [r.optimality.get(k) for r in runs if r.optimality_method == m] for k, _ in METRICS}
            for m in methods}
    nruns = {m: sum(1 for r in runs if r.optimality_method == m) for m in methods}
    best = {}
    for k, _ in METRICS:
        means = {m: _mean_ci(vals[m][k])[0] for m in compare if m in vals}
        best[k] = stats.best_baseline(means)
    rows = []
    for m in methods:
        row = [m, str(nruns[m])]
        for k, _ in METRICS:
            mean, ci = _mean_ci(vals[m][k])
            imp = pimp = None
            if percentages and m == "delta" and best[k][0] and mean > best[k][1]:
                imp = stats.improvement(mean, best[k][1])  # printed only where Delta is best, as the paper does
            pv = (paper_tab.get(k) or {}).get(m)
            if percentages and m == "delta" and pv:
                pbest = stats.best_baseline({b: v[0] for b, v in (paper_tab.get(k) or {}).items() if b != "delta"})
                if pbest[0] and pv[0] > pbest[1]:
                    pimp = stats.improvement(pv[0], pbest[1])
            pcell = stats.format_cell(pv[0], pv[1], improvement_pct=pimp) if pv else ""
            cell = stats.format_cell(mean, ci, improvement_pct=imp)
            if len(vals[m][k]) == 1 and imp is None:
                cell = _cell(vals[m][k])  # one run: its value as recorded (an integer count stays one)
            row += [cell, pcell]
        rows.append(row)
    headers = ["method", "runs"]
    for _, label in METRICS:
        headers += [label, "paper"]
    doc.table(headers, rows, caption=caption)
    if "delta" not in methods or not any(best[k][0] for k, _ in METRICS):
        return
    crows = []
    for k, label in METRICS:
        name = best[k][0]
        if not name:
            continue
        a = [v for v in vals["delta"][k] if v == v]
        b = [v for v in vals[name][k] if v == v]
        u, p = stats.mann_whitney(a, b)
        crows.append([label, name, _num(_mean_ci(a)[0]), _num(best[k][1]),
                      f"{stats.improvement(_mean_ci(a)[0], best[k][1]):+.1f}%", _num(u, 1),
                      "n/a" if p != p else "<0.001" if p < 0.001 else f"{p:.3f}", _num(stats.cohens_d(a, b), 2)])
    doc.table(["metric", "best other method", "Delta", "best other", "Delta vs best other", "Mann–Whitney U of Delta",
               "p (two-sided)", "Cohen's d"], crows, align="llrrrrrr",
              caption=f"{scenario}: Delta against the best of the others on each metric (runs as samples)")


def section_optimality(doc: Doc, runs: list[Run], scenario: str, paper: dict):
    opt = [r for r in runs if r.optimality]
    doc.h("Optimality testing (Delta Tables 2–4)", 3)
    if not opt:
        doc.p(f"Optimality testing: {NOT_IN_RUN}.")
        return
    methods = sorted({r.optimality_method for r in opt}, key=lambda m: (m != "delta", "w/o" in m, m))
    main = [m for m in methods if "w/o" not in m]
    ablations = [m for m in methods if m == "delta" or "w/o" in m]
    p3 = (paper.get("table3") or {}).get(scenario) or {}
    p4 = (paper.get("table4") or {}).get(scenario) or {}
    cases = sorted({r.optimality.get("cases") for r in opt})
    oracles = sorted({str(r.optimality.get("oracle")) for r in opt})
    doc.p(f"{len(opt)} optimality run(s); test cases per run: {', '.join(map(str, cases))}; oracle: "
          f"{', '.join(oracles)}. Mean ± 95% CI margin over runs; the paper's runs had a two-hour budget each, "
          f"so its counts are on another scale.")
    _opt_table(doc, opt, scenario, main, p3,
               f"{scenario}: Delta against the baselines (Table 3 layout; percentage: improvement over the best "
               f"baseline where Delta is best)", [m for m in main if m != "delta"])
    if len(ablations) > 1:
        _opt_table(doc, opt, scenario, ablations, p4, f"{scenario}: Delta against its ablations (Table 4 layout)",
                   [m for m in ablations if m != "delta"], percentages=False)
    algos = sorted({r.challenger_algo for r in opt if r.optimality_method == "delta" and r.challenger_algo})
    if len(algos) > 1:
        p2 = (paper.get("table2") or {}).get(scenario) or {}
        rows = []
        for a in algos:
            rs = [r for r in opt if r.optimality_method == "delta" and r.challenger_algo == a]
            row = [a.upper(), str(len(rs))]
            for k, _ in METRICS:
                row += [_cell([r.optimality.get(k) for r in rs]), _paper_cell((p2.get(k) or {}).get(a))]
            rows.append(row)
        headers = ["challenger", "runs"] + [h for _, lab in METRICS for h in (lab, "paper")]
        doc.table(headers, rows, caption=f"{scenario}: Delta's bugs by challenger algorithm (Table 2 layout)")


def section_behaviour(doc: Doc, runs: list[Run], scenario: str, paper: dict, max_sequences: int, figs: bool = True):
    doc.h("Behaviour clustering (Delta Sec. 6.1, Table 6)", 3)
    with_bugs = [r for r in runs if r.optimality and r.folder.bugs_parquet.is_file()]
    delta_runs = [r for r in with_bugs if r.optimality_method == "delta"]
    if not delta_runs:
        delta_runs = with_bugs  # no Delta run: the methods that found bugs
    if not delta_runs:
        doc.p(f"Behaviour clustering: {NOT_IN_RUN} (no bugs.parquet: no optimality bugs were found or recorded).")
        return
    results = []
    for r in delta_runs:
        try:
            results.append((r, cluster_run(r.dir, max_sequences=max_sequences, seed=0)))
        except Exception as exc:  # noqa: BLE001 - a run without its steps/ store
            doc.p(f"Behaviour clustering of {r.name}: {NOT_IN_RUN} ({type(exc).__name__}: {exc}).")
    results = [(r, c) for r, c in results if c.n > 0]
    if not results:
        return
    p6 = (paper.get("table6") or {}).get(scenario) or {}
    rows = []
    for t in TAUS:
        rows.append([f"{t:.2f}", _cell([c.counts[t] for _, c in results]), _paper_cell(p6.get(f"{t:.2f}"))])
    sampled = sum(c.n for _, c in results)
    total = sum(c.total for _, c in results)
    method = results[0][1].method
    doc.p(f"The AUT's trajectories from the bug-triggering initial states of {len(results)} run(s) "
          f"({', '.join(sorted({r.optimality_method for r, _ in results}))}): {sampled} trajectories"
          + (f" (a seeded sample of {total} bugs, at most {max_sequences} per run)" if sampled < total else "")
          + f", states z-scored per dimension, multivariate DTW, {method}-linkage agglomerative clustering; "
          f"clusters counted at τ · d_max.")
    doc.table(["τ", "behaviour clusters (ours, mean ± 95% CI over runs)", "paper (Delta)"], rows,
              caption=f"{scenario}: behavioural patterns of the AUT on bug-triggering states (Table 6 layout)")
    r0, c0 = results[0]
    if figs and c0.linkage is not None:
        doc.figure(_safe(f"dendrogram-{scenario}-{r0.name}"),
                   fig_dendrogram(c0, f"{r0.name}: {c0.n} AUT trajectories on bugs"),
                   f"Dendrogram of the AUT's trajectories on the bugs of {r0.name} (d_max = {c0.d_max:.2f}; "
                   f"dashed: cuts at τ · d_max)")


TIMELINES = (("safety", "episodes", ("failures", "distinct_failures"), "episodes"),  # phase, x, ys, x label
             ("optimality", "cases", ("bugs", "distinct_bugs"), "test cases"))


def _timeline_series(runs: list[Run], phase: str, xcol: str, ycols) -> list[tuple[str, np.ndarray, dict]]:
    """(method, x, {column: y}) for every run that recorded the phase's timeline."""
    series = []
    for r in runs:
        tl = timeline(r, phase)
        if tl is None or tl.empty:
            continue
        label = r.safety_method if phase == "safety" else r.optimality_method
        series.append((label, tl[xcol].to_numpy(), {c: tl[c].to_numpy() for c in ycols if c in tl}))
    return series


def _mean_lines(series: list, ycols) -> dict:
    """One line per method: the mean over its runs on the union of their x values (step-interpolated;
    a shorter run does not count past its end)."""
    lines = {}
    labels = sorted({s[0] for s in series}, key=lambda m: (m != "delta", m))
    for label in labels:
        group = [s for s in series if s[0] == label]
        x = np.unique(np.concatenate([g[1] for g in group]))
        name = label + (f" (mean of {len(group)} runs)" if len(group) > 1 else "")
        lines[name] = {}
        for c in ycols:
            ys = []
            for _, gx, gy in group:
                if c not in gy:
                    continue
                idx = np.searchsorted(gx, x, side="right") - 1
                y = np.where(idx >= 0, gy[c][np.clip(idx, 0, None)], 0).astype(float)
                y[x > gx[-1]] = np.nan  # a shorter run does not count past its end
                ys.append(y)
            if ys:
                lines[name][c.replace("_", " ")] = (x, np.nanmean(np.vstack(ys), axis=0))
    return lines


def _figures_over_time(doc: Doc, runs: list[Run], scenario: str) -> list[str]:
    """Failures and bugs over time, one line per method; returns what was missing."""
    said = []
    for phase, xcol, ycols, xlabel in TIMELINES:
        series = _timeline_series(runs, phase, xcol, ycols)
        if not series:
            said.append(f"{phase} timeline: {NOT_IN_RUN}")
            continue
        what = "failures" if phase == "safety" else "bugs"
        doc.figure(_safe(f"{phase}-over-time-{scenario}"),
                   fig_over_time(_mean_lines(series, ycols), xlabel, [c.replace("_", " ") for c in ycols],
                                 f"{scenario}: {what} over time"),
                   f"{scenario}: {what} and distinct {what} over the {xlabel} of the {phase} phase")
    return said


def _figures_over_grid(doc: Doc, runs: list[Run], focus: list[Run], scenario: str) -> list[str]:
    """Bug (of the ``focus`` runs) and failure initial states over the first two state dimensions."""
    said = []
    sc = next((r.scenario_obj() for r in runs if r.scenario_obj() is not None), None)
    states = [s for s in (bug_states(r) for r in focus) if s is not None]
    if sc is not None and states:
        st = np.concatenate(states)
        who = ", ".join(sorted({r.optimality_method for r in focus}))
        doc.figure(_safe(f"bugs-grid-{scenario}"),
                   fig_state_heatmap(st, sc, f"{scenario}: {len(st)} bugs ({who})", "bugs"),
                   f"{scenario}: bug initial states over the first two state dimensions ({sc.state_names[0]}, "
                   f"{sc.state_names[1]}), on the distinct-bug grid, {len(focus)} run(s) of {who}")
    else:
        said.append(f"bugs over the initial-state grid: {NOT_IN_RUN}" + (" (no bugs)" if focus else ""))
    fails = [s for s in (failure_states(r) for r in runs if r.safety) if s is not None]
    if sc is not None and fails:
        st = np.concatenate(fails)
        doc.figure(_safe(f"failures-grid-{scenario}"),
                   fig_state_heatmap(st, sc, f"{scenario}: {len(st)} safety failures", "failures"),
                   f"{scenario}: initial states of the AUT's safety failures over the first two state dimensions")
    return said


def _figure_returns(doc: Doc, focus: list[Run], scenario: str) -> list[str]:
    """AUT vs challenger returns per optimality test case of the ``focus`` runs."""
    cases = [c for c in (optimality_cases(r) for r in focus) if c is not None]
    if cases:
        aut = np.concatenate([c[0] for c in cases])
        ca = np.concatenate([c[1] for c in cases])
        bug = np.concatenate([c[2] for c in cases])
        doc.figure(_safe(f"returns-{scenario}"),
                   fig_returns_scatter(aut, ca, bug, f"{scenario}: AUT vs challenger per test case"),
                   f"{scenario}: AUT and challenger returns from the same initial states ({len(aut)} test cases; "
                   f"above the dashed line the challenger did better)")
    elif focus:
        return [f"AUT vs challenger returns: {NOT_IN_RUN} (no optimality episodes in the store)"]
    return []


def section_figures(doc: Doc, runs: list[Run], scenario: str):
    """Failures and bugs over time, bugs/failures over the initial-state grid, AUT vs challenger returns."""
    doc.h("Figures", 3)
    opt_runs = [r for r in runs if r.optimality]
    focus = [r for r in opt_runs if r.optimality_method == "delta"] or opt_runs
    said = _figures_over_time(doc, runs, scenario)
    said += _figures_over_grid(doc, runs, focus, scenario)
    said += _figure_returns(doc, focus, scenario)
    if said:
        doc.p("; ".join(said) + ".")


def section_single(doc: Doc, run: Run):
    """The headline table of one run (the phases it ran)."""
    rows = []
    s = run.safety
    if s:
        rows.append(["safety", f"{s['fuzzer']}, {s['episodes']} episodes, {s.get('wall_seconds', 0):.0f} s",
                     f"{s['failures']} failures in {s['distinct_failures']} distinct cells "
                     f"(failure rate {100 * s['failures'] / max(s['episodes'], 1):.1f}%)"
                     + (f"; {s['flaky_failures']} flaky" if s.get("flaky_failures") else "")])
    else:
        rows.append(["safety", NOT_IN_RUN, ""])
    for c in run.challengers:
        ev = c.get("evaluation") or {}
        rows.append([f"challenger {c['config']['algo']}", f"{c.get('steps')} steps on "
                     f"{(c.get('dataset') or {}).get('transitions')} transitions, "
                     f"{c.get('training_wall_seconds', 0):.0f} s",
                     f"return {stats.format_cell(ev.get('mean_return', float('nan')), ev.get('ci95_margin'))} "
                     f"({ev.get('episodes')} episodes)"])
    if not run.challengers:
        rows.append(["challenger", NOT_IN_RUN, ""])
    o = run.optimality
    if o:
        rows.append(["optimality", f"{run.optimality_method} ({o.get('oracle')} oracle), {o['cases']} test cases, "
                     f"{o.get('wall_seconds', 0):.0f} s",
                     f"{o['bugs']} bugs in {o['distinct_bugs']} distinct cells, distance {_num(o.get('distance'))}, "
                     f"bug rate {100 * o['bugs'] / max(o['cases'], 1):.1f}%"
                     + (f"; {o['flaky_bugs']} flaky" if o.get("flaky_bugs") else "")])
    else:
        rows.append(["optimality", NOT_IN_RUN, ""])
    doc.table(["phase", "work", "result"], rows, caption="The run's phases", align="lll")
    flaky = (s or {}).get("flaky_failures", 0) + (o or {}).get("flaky_bugs", 0)
    if flaky:
        doc.p(f"{flaky} candidates flipped under batching: they failed (or lost to the challenger) in the batched "
              f"search but not with the agent acting alone, one observation at a time. They are not counted: the "
              f"agent is near-tied at those states (flaky_failures.parquet, flaky_bugs.parquet).")


def section_grid(doc: Doc, grid_df):
    """A grid's results table as ``deltarl grid`` wrote it (one row per campaign)."""
    doc.h("Grid results (results.parquet)", 2)
    headers, rows = frame_cells(grid_df)
    doc.table(headers, rows, caption=f"{len(grid_df)} campaigns", align="l" * len(headers))
    failed = int((grid_df["status"] == "failed").sum()) if "status" in grid_df else 0
    if failed:
        doc.p(f"{failed} campaign(s) failed: their rows carry the error.")
