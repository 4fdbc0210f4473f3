"""The sections of a report, drawn from :class:`~orchestrator.analysis.report_data.ReportData`:
each appends headings, tables, notes and figures to a :class:`~orchestrator.analysis.document.Doc`,
beside the paper's numbers (``paper``: ``experiments/papers/delta.yaml``).

Statistics are over independent units only: an optimality run is one unit; a safety run or a
challenger shared by several campaigns (every method of one environment and seed in a grid) is
one unit, however many campaigns list it (``safety_key``, the agents' ``key``). Every cell says
its n; an effect size (Mann–Whitney U, Cohen's d) is given only where both sides have at least
two runs; every "n/a" says why.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from orchestrator.analysis import stats
from orchestrator.analysis.behaviour import TAUS
from orchestrator.analysis.document import Doc
from orchestrator.analysis.figures import (
    fig_dendrogram,
    fig_over_time,
    fig_returns_scatter,
    fig_runs_by_method,
    fig_state_heatmap,
    varying_dims,
)

NOT_IN_RUN = "not in this run"
BASELINES = ("mdpfuzz", "curefuzz", "gmt", "random")
METRICS = (("bugs", "bugs"), ("distinct_bugs", "distinct bugs"), ("distance", "distance"))
NA_FEW = "n/a (n<2)"  # an effect size or a test needs two runs on each side


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:80] or "fig"


def _vals(values) -> list[float]:
    out = []
    for x in values:
        try:
            f = float(x)
        except (TypeError, ValueError):
            continue
        if f == f:
            out.append(f)
    return out


def _plain(v: float, digits=None) -> str:
    return str(int(v)) if float(v).is_integer() and digits is None else stats.format_cell(v, digits=digits)


def cell(values, *, why_empty: str = "no run", digits=None, improvement: float | None = None) -> str:
    """Mean ± 95% CI margin over the runs, with their n: ``28.0 ± 11.4 (n=3)``; one run: its
    value (``n=1``); none: ``n/a (<why_empty>)``."""
    v = _vals(values)
    if not v:
        return f"n/a ({why_empty})"
    extra = f", {improvement:+.1f}%" if improvement is not None and improvement == improvement else ""
    if len(v) == 1:
        return f"{_plain(v[0], digits)} (n=1{extra})"
    m, c = stats.mean_ci(v)
    return f"{stats.format_cell(m, c, digits=digits)} (n={len(v)}{extra})"


def _mean(values) -> float:
    v = _vals(values)
    return float(np.mean(v)) if v else float("nan")


def _paper_cell(v, improvement: float | None = None) -> str:
    if not v:
        return ""
    return stats.format_cell(float(v[0]), float(v[1]), improvement_pct=improvement)


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


# -- units ---------------------------------------------------------------------------------------
def done_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"].fillna("done") == "done"] if "status" in runs else runs


def optimality_units(runs: pd.DataFrame, scenario: str) -> pd.DataFrame:
    r = done_runs(runs)
    return r[(r["scenario"] == scenario) & r["method"].notna()]


def comparable(units: pd.DataFrame) -> tuple[pd.DataFrame | None, str | None]:
    """The runs that compare methods under one challenger (Tables 3 and 4, the answer): with
    several challenger algorithms, the one the baselines ran against (the paper's Table 3: BCQ);
    ``(None, None)`` when only Delta ran, with several challengers (then Table 2 is the comparison)."""
    algos = units["challenger_algo"].dropna().unique()
    if len(algos) <= 1:
        return units, None
    others = units[units["method"] != "delta"]["challenger_algo"].dropna()
    if others.empty:
        return None, None
    algo = str(others.mode().iloc[0])
    return units[units["challenger_algo"] == algo], algo


def safety_units(runs: pd.DataFrame, scenario: str) -> pd.DataFrame:
    """One row per distinct safety run of ``scenario`` (copies shared by several campaigns once)."""
    r = done_runs(runs)
    r = r[(r["scenario"] == scenario) & r["safety_key"].notna()]
    return r.drop_duplicates("safety_key")


def agent_units(agents: pd.DataFrame, scenario: str, role: str) -> pd.DataFrame:
    """One row per unit: the AUT's evaluation once; one challenger per dataset D (safety run) and
    algorithm: copies listed by several campaigns count once, and two trainings on the same D (a
    challenger retrained instead of taken from the grid's cache) are averaged into that unit."""
    if agents.empty:
        return agents
    a = agents[(agents["scenario"] == scenario) & (agents["role"] == role)]
    a = a.drop_duplicates(["key", "mean_return", "success_rate", "episodes", "training_wall_seconds"])
    rows = []
    for key, g in a.groupby("key", sort=False):
        known = g[g["success_rate"].notna() & g["episodes"].notna()]
        eps = float(known["episodes"].astype(float).sum()) if not known.empty else float("nan")
        succ = float(sum(float(r) * float(e) for r, e in zip(known["success_rate"], known["episodes"])))
        rows.append({"scenario": scenario, "role": role, "algo": g["algo"].iloc[0], "key": key,
                     "mean_return": _mean(g["mean_return"]),
                     "ci95_margin": _f(g["ci95_margin"].iloc[0]) if len(g) == 1 else float("nan"),
                     "success_rate": succ / eps if eps == eps and eps > 0 else float("nan"),
                     "episodes": eps, "training_wall_seconds": _mean(g["training_wall_seconds"]),
                     "trainings": len(g)})
    return pd.DataFrame(rows)


def method_order(methods) -> list[str]:
    return sorted(set(methods), key=lambda m: (m != "delta", "w/o" in m, m))


def _distance_why(units: pd.DataFrame) -> str:
    return "no run with ≥ 2 bugs" if units["bugs"].fillna(0).max() < 2 else "not recorded"


# -- the answer first ---------------------------------------------------------------------------
def section_answer(doc: Doc, data, paper: dict) -> bool:
    """Delta against the best baseline on every scenario, ours and the paper's, in one table."""
    runs = data["runs"]
    rows = []
    p3 = paper.get("table3") or {}
    for sc in sorted(runs["scenario"].dropna().unique()):
        units, _ = comparable(optimality_units(runs, sc))
        if units is None:
            continue
        methods = [m for m in method_order(units["method"]) if "w/o" not in m]
        if "delta" not in methods or len(methods) < 2:
            continue
        others = [m for m in methods if m != "delta"]
        for k, label in METRICS[:2]:
            by = {m: _vals(units.loc[units["method"] == m, k]) for m in methods}
            best, bmean = stats.best_baseline({m: _mean(by[m]) for m in others})
            if best is None:
                continue
            dmean = _mean(by["delta"])
            u, p = stats.mann_whitney(by["delta"], by[best])
            pv = _p(p) if min(len(by["delta"]), len(by[best])) >= 2 and p == p else NA_FEW
            pt = (p3.get(sc) or {}).get(k) or {}
            pb, pbv = stats.best_baseline({b: v[0] for b, v in pt.items() if b != "delta"})
            pd_ = pt.get("delta")
            paper_cell = (f"{_plain(pd_[0])} vs {pb} {_plain(pbv)}: {_delta_pct(pd_[0], pbv)}"
                          if pd_ and pb else "n/a (not in the paper)")
            rows.append([sc, label, cell(by["delta"]), f"{best} {cell(by[best])}", _delta_pct(dmean, bmean), pv,
                         paper_cell])
    if not rows:
        return False
    doc.h("The answer: does Delta find more bugs than the baselines?", 2)
    doc.table(["scenario", "metric", "Delta", "best baseline", "Delta vs it", "p (Mann–Whitney)",
               "the paper: Delta vs its best baseline"], rows, align="llrrrrr",
              caption="Optimality bugs found by Delta and by the best of the baselines: ours (mean ± 95% CI over "
                      "independent runs, n runs each) and the paper's (means over its 5 runs of two hours)")
    doc.note("n: optimality runs (seeds) per method. p: two-sided Mann–Whitney U test of Delta against that "
             f"baseline over the runs; {NA_FEW}: the test needs two runs on each side. Counts depend on the budget "
             "(ours: the test cases per run in the tables below; the paper: two hours): compare the direction "
             "of \"Delta vs it\", not the counts. The paper's CIs are in the per-scenario tables below.")
    return True


def section_answer_challengers(doc: Doc, data, paper: dict) -> bool:
    """RQ1's answer, for runs of Delta alone with several challengers: on every scenario, the bugs
    each challenger finds (mean ± CI over seeds), which finds most, and the paper's ranking."""
    runs = data["runs"]
    rows = []
    p2 = paper.get("table2") or {}
    for sc in sorted(runs["scenario"].dropna().unique()):
        units = optimality_units(runs, sc)
        delta = units[units["method"] == "delta"]
        algos = sorted({a for a in delta["challenger_algo"].dropna()})
        if len(algos) < 2:
            continue
        by = {a: _vals(delta.loc[delta["challenger_algo"] == a, "bugs"]) for a in algos}
        means = {a: _mean(v) for a, v in by.items()}
        ours = max(means, key=lambda a: means[a] if means[a] == means[a] else -np.inf)
        rest = [a for a in algos if a != ours]
        second = max(rest, key=lambda a: means[a] if means[a] == means[a] else -np.inf)
        _, p = stats.mann_whitney(by[ours], by[second])
        pv = _p(p) if min(len(by[ours]), len(by[second])) >= 2 and p == p else NA_FEW
        pb = {a: ((p2.get(sc) or {}).get("bugs") or {}).get(a) for a in algos}
        pb = {a: v[0] if isinstance(v, (list, tuple)) else v for a, v in pb.items() if v is not None}
        theirs = max(pb, key=pb.get).upper() if pb else "n/a (not in the paper)"
        found = sum(means[a] > 0 for a in algos)
        most = ours.upper() if means[ours] > means[second] else "none" if not found else "a tie"
        rows.append([sc, "yes" if found == len(algos) else "no" if not found else "not with every challenger",
                     ", ".join(f"{a.upper()} {cell(by[a])}" for a in algos), most,
                     f"{ours.upper()} vs {second.upper()}: {pv}", theirs])
    if not rows:
        return False
    doc.h("The answer: does Delta find optimality bugs, and with which challenger most?", 2)
    doc.table(["scenario", "bugs found", "bugs per run by challenger (mean ± 95% CI, n seeds)", "most bugs",
               "p (Mann–Whitney, the two best)", "most bugs in the paper"], rows, align="llllll",
              caption="Delta's optimality bugs with each offline challenger (Table 2): ours over independent seeds "
                      "and the paper's ranking")
    doc.note("n: seeds per challenger; the runs of one seed share their safety run (dataset D), so the unit is "
             f"the seed, not the campaign. p: two-sided Mann–Whitney U test over the seeds; {NA_FEW}: the test "
             "needs two seeds on each side. Counts depend on the budget (the paper ran two hours): compare the "
             "ranking, not the counts.")
    return True


def _delta_pct(ours: float, best: float) -> str:
    imp = stats.improvement(ours, best)
    if imp != imp:
        return "n/a (baseline 0)" if best == 0 else "n/a (no runs)"
    return f"{imp:+.1f}%"


def figure_runs(doc: Doc, data, scenario: str) -> bool:
    """The key plot that needs no more than the runs table: each run's bugs and distinct bugs, per method."""
    units = optimality_units(data["runs"], scenario)
    if units.empty:
        return False
    if units["challenger_algo"].dropna().nunique() > 1:  # several challengers: one column per method and challenger
        units = units.assign(method=units["method"] + " / " + units["challenger_algo"].fillna("?").str.upper())
    methods = method_order(units["method"])
    values = {label: {m: _vals(units.loc[units["method"] == m, k]) for m in methods} for k, label in METRICS[:2]}
    doc.figure(_safe(f"runs-{scenario}"), fig_runs_by_method(values, [label for _, label in METRICS[:2]],
                                                              f"{scenario}: bugs per run"),
               f"{scenario}: the bugs of every optimality run (dots; the line: the method's mean), n runs per method")
    return True


def _method_challenger(units: pd.DataFrame) -> pd.Series:
    """Each run's method, with its challenger (``delta / BCQ``) when the runs test several: runs that
    differ only in the challenger share a safety run, so they are not independent of each other."""
    if "challenger_algo" in units and units["challenger_algo"].dropna().nunique() > 1:
        return units["method"] + " / " + units["challenger_algo"].fillna("?").str.upper()
    return units["method"]


def figure_bugs_over_time(doc: Doc, data, scenario: str) -> bool:
    """The key plot: bugs and distinct bugs over the test cases, one line per method (mean of its runs)."""
    series = _timeline_series(data, scenario, "optimality")
    if not series:
        return False
    cols = ("bugs", "distinct_bugs")
    per_challenger = any(" / " in label for label, _, _ in series)
    doc.figure(_safe(f"optimality-over-time-{scenario}"),
               fig_over_time(_mean_lines(series, cols), "test cases", [c.replace("_", " ") for c in cols],
                             f"{scenario}: bugs over time"),
               f"{scenario}: bugs and distinct bugs over the test cases of the optimality phase (mean over each "
               + ("method's runs, one line per challenger: n in the legend counts seeds)" if per_challenger
                  else "method's runs, n in the legend)"))
    return True


# -- Tables 2-4 -----------------------------------------------------------------------------------
def _method_table(doc: Doc, units: pd.DataFrame, scenario: str, methods: list[str], paper_tab: dict, caption: str,
                  compare: list[str], percentages: bool = True, each: bool = False) -> None:
    """Rows = methods; per metric our cell (with n) and the paper's; then Delta against the best
    of ``compare`` on each metric, or (``each``) against every one of them (the ablations: does
    removing a term change a metric?)."""
    vals = {m: {k: _vals(units.loc[units["method"] == m, k]) for k, _ in METRICS} for m in methods}
    best = {k: stats.best_baseline({m: _mean(vals[m][k]) for m in compare}) for k, _ in METRICS}
    rows = []
    for m in methods:
        row = [m]
        for k, _ in METRICS:
            imp = pimp = None
            mean = _mean(vals[m][k])
            if percentages and m == "delta" and best[k][0] and mean > best[k][1]:
                imp = stats.improvement(mean, best[k][1])  # printed only where Delta is best, as the paper does
            pv = (paper_tab.get(k) or {}).get(m)
            if percentages and m == "delta" and pv:
                pbest = stats.best_baseline({b: v[0] for b, v in (paper_tab.get(k) or {}).items() if b != "delta"})
                if pbest[0] and pv[0] > pbest[1]:
                    pimp = stats.improvement(pv[0], pbest[1])
            why = _distance_why(units[units["method"] == m]) if k == "distance" else "no run"
            row += [cell(vals[m][k], why_empty=why, improvement=imp), _paper_cell(pv, pimp)]
        rows.append(row)
    headers = ["method"]
    for _, label in METRICS:
        headers += [label, "paper"]
    doc.table(headers, rows, caption=caption)
    doc.note("Cells: mean ± 95% CI margin over the method's optimality runs, n = runs (one value when n=1). "
             "Distance: mean distance between a run's bugs, defined for runs with at least two bugs (so its n can be "
             "smaller); \"n/a (no run with ≥ 2 bugs)\": no run of the method has two bugs. Paper: 5 runs of two hours.")
    if "delta" not in methods or not any(best[k][0] for k, _ in METRICS):
        return
    crows = []
    for k, label in METRICS:
        names = [m for m in compare if vals[m][k]] if each else [best[k][0]] if best[k][0] else []
        for name in names:
            a, b = vals["delta"][k], vals[name][k]
            if not a:
                crows.append([label, name, "n/a (no Delta run)", cell(b), "", "", "", ""])
                continue
            both = min(len(a), len(b)) >= 2
            u, p = stats.mann_whitney(a, b)
            d = stats.cohens_d(a, b)
            if not both:
                dcell = ucell = pcell = NA_FEW
            else:
                ucell, pcell = f"{u:.1f}", _p(p)
                dcell = f"{d:.2f}" if np.isfinite(d) else "n/a (no spread)"
            crows.append([label, name, cell(a), cell(b), _delta_pct(_mean(a), _mean(b)), ucell, pcell, dcell])
    other = "other method" if each else "best other method"
    doc.table(["metric", other, "Delta", "other" if each else "best other",
               "Delta vs other" if each else "Delta vs best other", "Mann–Whitney U", "p (two-sided)", "Cohen's d"],
              crows, align="llrrrrrr",
              caption=(f"{scenario}: Delta against each of them on each metric (runs as samples)" if each else
                       f"{scenario}: Delta against the best of the others on each metric (runs as samples)"))
    doc.note(f"{NA_FEW}: U, p and Cohen's d need at least two runs on each side. \"n/a (no spread)\": every run of "
             "both methods gave the same value except for the difference of the means, so the pooled standard "
             "deviation is 0 and d is not finite.")


def section_optimality(doc: Doc, data, scenario: str, paper: dict) -> None:
    units = optimality_units(data["runs"], scenario)
    doc.h("Optimality testing (Delta Tables 2–4)", 3)
    if units.empty:
        doc.p(f"Optimality testing: {NOT_IN_RUN}.")
        return
    all_units = units
    units, algo = comparable(all_units)
    if units is None:
        units = all_units.iloc[0:0]
    methods = method_order(units["method"])
    main = [m for m in methods if "w/o" not in m]
    ablations = [m for m in methods if m == "delta" or "w/o" in m]
    p3 = (paper.get("table3") or {}).get(scenario) or {}
    p4 = (paper.get("table4") or {}).get(scenario) or {}
    cases = sorted({int(c) for c in _vals(all_units["cases"])})
    oracles = sorted({str(o) for o in all_units["oracle"].dropna()}) or ["not recorded"]
    doc.p(f"{len(all_units)} optimality run(s); test cases per run: {', '.join(map(str, cases)) or 'n/a'}; oracle: "
          f"{', '.join(oracles)}. The paper's runs had a two-hour budget each, so its counts are on another scale."
          + (f" Methods are compared under the {algo.upper()} challenger the baselines ran against "
             f"({len(all_units) - len(units)} Delta run(s) with other challengers are in the Table 2 layout)."
             if algo else "")
          + (" Only Delta ran, with several challengers: the comparison is the Table 2 layout." if not main else ""))
    if main:
        _method_table(doc, units, scenario, main, p3,
                      f"{scenario}: Delta against the baselines (Table 3 layout; percentage: improvement over the "
                      f"best baseline where Delta is best)", [m for m in main if m != "delta"])
    if len(ablations) > 1:
        _method_table(doc, units, scenario, ablations, p4, f"{scenario}: Delta against its ablations (Table 4 layout)",
                      [m for m in ablations if m != "delta"], percentages=False, each=True)
    _energy_shares(doc, units, scenario)
    delta = all_units[all_units["method"] == "delta"]
    algos = sorted({a for a in delta["challenger_algo"].dropna()})
    if len(algos) > 1:
        p2 = (paper.get("table2") or {}).get(scenario) or {}
        rows = []
        for a in algos:
            rs = delta[delta["challenger_algo"] == a]
            row = [a.upper()]
            for k, _ in METRICS:
                why = _distance_why(rs) if k == "distance" else "no run"
                row += [cell(rs[k], why_empty=why), _paper_cell((p2.get(k) or {}).get(a))]
            rows.append(row)
        headers = ["challenger"] + [h for _, lab in METRICS for h in (lab, "paper")]
        doc.table(headers, rows, caption=f"{scenario}: Delta's bugs by challenger algorithm (Table 2 layout)")


def _energy_shares(doc: Doc, units: pd.DataFrame, scenario: str) -> None:
    """How often each term of Delta's energy decided a seed selection (removing it would have
    chosen another seed), per Delta variant: the evidence that every term enters the search."""
    from orchestrator.analysis.report_data import ENERGY_TERMS

    cols = [f"decision_share_{t}" for t in ENERGY_TERMS]
    if not set(cols) <= set(units.columns):
        return  # data from before the shares were recorded
    rows = []
    for m in method_order(units["method"]):
        rs = units[units["method"] == m]
        if rs[cols].isna().all().all():
            continue
        rows.append([m] + [cell(rs[c], digits=3) for c in cols])
    if rows:
        doc.table(["method", *ENERGY_TERMS], rows,
                  caption=f"{scenario}: share of Delta's seed selections each energy term decided")
        doc.note("A term decides a selection when the energy without it would have chosen another seed; a removed "
                 "term decides none. Mean ± 95% CI over runs (n).")


# -- Table 1 and the safety phase ------------------------------------------------------------------
def section_table1(doc: Doc, data, scenario: str, paper: dict) -> None:
    """AUT and challengers (Table 1): mean return ± CI, success rate, training time; safety failures."""
    doc.h("AUT, challengers and safety testing (Delta Table 1, Fig. 4)", 3)
    p1 = (paper.get("table1") or {}).get(scenario) or {}
    agents = data["agents"]
    auts = agent_units(agents, scenario, "aut")
    chs = agent_units(agents, scenario, "challenger")
    safety = safety_units(data["runs"], scenario)
    if auts.empty and chs.empty and safety.empty:
        doc.p(f"Challengers and safety testing: {NOT_IN_RUN}.")
        return
    rows = []
    aut_name = next(iter(data["runs"].loc[data["runs"]["scenario"] == scenario, "aut"].dropna()), "AUT")
    if not auts.empty:
        a = auts.iloc[0]
        eps = a["episodes"]
        if len(auts) > 1:  # evaluated from different starts in different cards: over those evaluations
            ret = cell(auts["mean_return"]) + " evaluations"
        else:
            ret = stats.format_cell(float(a["mean_return"]), _f(a["ci95_margin"]))
            ret += f" ({int(eps)} episodes)" if _f(eps) == _f(eps) else ""
        ps = p1.get("aut_success")
        rows.append([f"AUT ({aut_name})", ret, _paper_cell(p1.get("aut")), _rate(auts),
                     f"{ps[0]:.1f} [{ps[1]:.1f}, {ps[2]:.1f}]" if ps else ""])
    else:
        rows.append([f"AUT ({aut_name})", "n/a (no evaluation card)", _paper_cell(p1.get("aut")), "n/a (no card)", ""])
    for algo in sorted(chs["algo"].dropna().unique()) if not chs.empty else []:
        u = chs[chs["algo"] == algo]
        rows.append([algo.upper(), cell(u["mean_return"]), _paper_cell(p1.get(algo)), _rate(u), ""])
    if auts.empty and chs.empty:
        doc.p(f"Challengers: {NOT_IN_RUN if data.from_runs else 'not in the data behind this report'} (no card).")
    elif len(rows) > 1 or not auts.empty:
        doc.table(["agent", "mean return ± 95% CI", "paper", "success rate % [Wilson 95%]", "paper"], rows,
                  caption=f"{scenario}: returns of the AUT and of the offline challengers trained on its test record D")
        doc.note("AUT: one evaluation (its episodes; the same starts in every card, so counted once). Challengers: "
                 "mean ± CI over the distinct trained challengers (n; one per safety run, however many campaigns "
                 "used it), each the mean of its evaluation episodes; success rate pooled over their episodes. "
                 "\"n/a (not recorded)\": the data behind this report does not hold the challengers' success counts.")
    _training_time(doc, auts, chs, scenario, aut_name)
    if not safety.empty:
        srows = []
        by = "safety_method" if "safety_method" in safety and safety["safety_method"].notna().all() else "safety_fuzzer"
        for fz, ss in safety.groupby(by, dropna=False):  # LLMTester w/o ms apart from LLMTester
            srows.append([str(fz), ", ".join(str(int(e)) for e in sorted(set(_vals(ss["safety_episodes"])))),
                          cell(ss["failures"]), cell(ss["distinct_failures"]),
                          _paper_cell(p1.get("safety_failures")) if fz == "curefuzz" else ""])
        doc.table(["safety fuzzer", "episodes per run", "failures", "distinct failures",
                   "paper failures (CureFuzz, 2 h)"], srows,
                  caption=f"{scenario}: safety failures of the AUT (mean ± 95% CI over distinct safety runs)")
        shared = int(done_runs(data["runs"]).query("scenario == @scenario")["safety_key"].notna().sum())
        if shared > len(safety):
            doc.note(f"{shared} campaigns ran {len(safety)} distinct safety runs (the same scenario, AUT, seed and "
                     f"settings give the same run): each is counted once, n = {len(safety)}.")


def _f(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _rate(units: pd.DataFrame) -> str:
    known = units[units["success_rate"].notna() & units["episodes"].notna()] if not units.empty else units
    if known.empty:
        return "n/a (not recorded)"
    succ = int(sum(round(float(r) * float(e)) for r, e in zip(known["success_rate"], known["episodes"])))
    n = int(sum(float(e) for e in known["episodes"]))
    return stats.format_rate(succ, n)


def _training_time(doc: Doc, auts: pd.DataFrame, chs: pd.DataFrame, scenario: str, aut: str) -> None:
    """Fig. 4: training time of the AUT and the median of each challenger algorithm (distinct trainings)."""
    if chs.empty or chs["training_wall_seconds"].dropna().empty:
        return
    aut_s = _f(auts["training_wall_seconds"].dropna().iloc[0]) if not auts.empty and \
        auts["training_wall_seconds"].notna().any() else float("nan")
    rows = [[f"AUT ({aut})", "1", f"{aut_s:.0f}" if aut_s == aut_s else "n/a (not on its card)", ""]]
    for algo, u in chs.groupby("algo"):
        secs = _vals(u["training_wall_seconds"])
        if not secs:
            continue
        med = float(np.median(secs))
        rows.append([str(algo).upper(), str(len(secs)), f"{med:.0f}",
                     f"{100 * med / aut_s:.1f}%" if aut_s == aut_s else "n/a (AUT time unknown)"])
    doc.table(["agent", "trainings", "wall seconds (median)", "of the AUT's"], rows, align="lrrr",
              caption=f"{scenario}: training time of the AUT and of the challengers (Delta Fig. 4; wall time on "
                      f"the machine that trained each, shared cores included)")


# -- behaviour clusters ---------------------------------------------------------------------------
def section_behaviour(doc: Doc, data, scenario: str, paper: dict) -> None:
    doc.h("Behaviour clustering (Delta Sec. 6.1, Table 6)", 3)
    b = data["behaviour"]
    b = b[b["scenario"] == scenario] if not b.empty else b
    if b.empty:
        if data.from_runs:
            doc.p(f"Behaviour clustering: {NOT_IN_RUN} (no bugs.parquet: no optimality bugs were found or recorded).")
        else:
            doc.p("Behaviour clustering: not in the data behind this report (it needs the runs' steps/).")
        return
    p6 = (paper.get("table6") or {}).get(scenario) or {}
    groups = _behaviour_groups(b, data["runs"])
    rows = [[f"{t:.2f}", *[cell(g.loc[np.isclose(g["tau"], t), "clusters"]) for g in groups.values()],
             _paper_cell(p6.get(f"{t:.2f}"))] for t in TAUS]
    per_run = b.drop_duplicates("campaign")
    sampled, total = int(per_run["n"].sum()), int(per_run["total"].sum())
    methods = ", ".join(sorted(per_run["method"].dropna().unique()))
    doc.p(f"The AUT's trajectories from the bug-triggering initial states of {len(per_run)} run(s) ({methods}): "
          f"{sampled} trajectories" + (f" (a seeded sample of {total} bugs)" if sampled < total else "")
          + f", states z-scored per dimension, multivariate DTW, {per_run['linkage'].iloc[0]}-linkage agglomerative "
          f"clustering; clusters counted at τ · d_max.")
    heads = ["behaviour clusters (ours, mean ± 95% CI over seeds)" if name is None else f"ours, {name} challenger"
             for name in groups]
    doc.table(["τ", *heads, "paper (Delta)"], rows,
              caption=f"{scenario}: behavioural patterns of the AUT on bug-triggering states (Table 6 layout"
                      + ("; one column per challenger: runs with another challenger share their safety run, so "
                         "the independent unit is the seed" if len(groups) > 1 else "") + ")")
    singletons = []
    for _, r in per_run.iterrows():
        runb = b[b["campaign"] == r["campaign"]]
        if (runb["clusters"] == r["n"]).all() and r["n"] > 1:
            singletons.append(f"{r['campaign']} ({int(r['n'])} trajectories; closest pair merged at "
                              f"{r['min_merge']:.3g} > 0.3 · d_max = {0.3 * r['d_max']:.3g})")
    if singletons:
        doc.note("Where the count equals the number of trajectories at every τ, every trajectory is its own "
                 "cluster: even the two closest trajectories are further apart than the largest cut (0.3 · d_max), "
                 "so the AUT behaves differently on each bug (few bugs, far apart): " + "; ".join(singletons) + ".")
    if per_run["n"].min() <= 1:
        doc.note("A run with a single bug trajectory has one cluster at every τ.")
    links = data["dendrograms"]
    links = links[links["scenario"] == scenario] if not links.empty else links
    if not links.empty:
        camp = links["campaign"].iloc[0]
        z = links[links["campaign"] == camp][["a", "b", "dist", "count"]].to_numpy(dtype=float)
        rb = b[b["campaign"] == camp]
        counts = {float(t): int(c) for t, c in zip(rb["tau"], rb["clusters"])}
        d_max = float(rb["d_max"].iloc[0])
        doc.figure(_safe(f"dendrogram-{scenario}-{camp}"),
                   fig_dendrogram(z, counts, d_max, str(rb["linkage"].iloc[0]), f"{camp}: {len(z) + 1} AUT trajectories "
                                  f"on bugs"),
                   f"Dendrogram of the AUT's trajectories on the bugs of {camp} (d_max = {d_max:.2f}; dashed: cuts "
                   f"at τ · d_max)")


def _behaviour_groups(b: pd.DataFrame, runs: pd.DataFrame) -> dict:
    """The behaviour rows per challenger (``{"BCQ": rows, ...}``) when the runs test several, else
    ``{None: rows}``: a mean over runs that share a safety run would count one seed several times."""
    algo = dict(zip(runs["campaign"], runs["challenger_algo"])) if "challenger_algo" in runs else {}
    names = b["campaign"].map(algo)
    if names.dropna().nunique() <= 1:
        return {None: b}
    names = names.fillna("?").str.upper()
    return {n: b[names == n] for n in sorted(names.unique())}


# -- figures --------------------------------------------------------------------------------------
def _timeline_series(data, scenario: str, phase: str) -> list[tuple[str, np.ndarray, dict]]:
    """(label, x, {column: y}) per distinct unit: an optimality run, or a distinct safety run."""
    tl = data["timelines"]
    if tl.empty:
        return []
    runs = done_runs(data["runs"])
    runs = runs[runs["scenario"] == scenario]
    if phase == "safety":
        keep = runs.dropna(subset=["safety_key"]).drop_duplicates("safety_key")
        label = dict(zip(keep["campaign"], keep["safety_fuzzer"]))
        cols = ("failures", "distinct_failures")
    else:  # the unit is the seed: runs that share a safety run but test other challengers are lines of their own
        keep = runs.dropna(subset=["method"])
        label = dict(zip(keep["campaign"], _method_challenger(keep)))
        cols = ("bugs", "distinct_bugs")
    out = []
    for camp, g in tl[(tl["phase"] == phase) & tl["campaign"].isin(list(label))].groupby("campaign", sort=True):
        g = g.sort_values("x")
        out.append((str(label[camp]), g["x"].to_numpy(float), {c: g[c].to_numpy(float) for c in cols if c in g}))
    return out


def _mean_lines(series: list, ycols) -> dict:
    """One line per method: the mean over its runs on the union of their x values (step-interpolated;
    a shorter run does not count past its end); the label says n."""
    lines = {}
    labels = sorted({s[0] for s in series}, key=lambda m: (m != "delta", m))
    for label in labels:
        group = [s for s in series if s[0] == label]
        x = np.unique(np.concatenate([g[1] for g in group]))
        name = f"{label} (n={len(group)})"
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
                with np.errstate(all="ignore"):
                    lines[name][c.replace("_", " ")] = (x, np.nanmean(np.vstack(ys), axis=0))
    return lines


def _states(df: pd.DataFrame) -> np.ndarray:
    return np.stack([np.asarray(s, dtype=float) for s in df["initial_state"]])


def section_figures(doc: Doc, data, scenario: str, sc_obj) -> None:
    """Failures over time, bugs and failures over the initial-state grid, AUT vs challenger returns."""
    doc.h("Figures", 3)
    said = []
    series = _timeline_series(data, scenario, "safety")
    if series:
        cols = ("failures", "distinct_failures")
        doc.figure(_safe(f"safety-over-time-{scenario}"),
                   fig_over_time(_mean_lines(series, cols), "episodes", [c.replace("_", " ") for c in cols],
                                 f"{scenario}: failures over time"),
                   f"{scenario}: failures and distinct failures over the episodes of the safety phase (mean over the "
                   f"distinct safety runs, n in the legend)")
    else:
        said.append(f"safety timeline: {_missing(data)}")
    units = optimality_units(data["runs"], scenario)
    focus = units[units["method"] == "delta"] if (units["method"] == "delta").any() else units
    who = ", ".join(method_order(focus["method"])) if not focus.empty else ""
    bl = data["bug_list"]
    bl = bl[bl["campaign"].isin(focus["campaign"])] if not bl.empty else bl
    dims = varying_dims(sc_obj) if sc_obj is not None else []
    if sc_obj is not None and not bl.empty:
        st = _states(bl)
        doc.figure(_safe(f"bugs-grid-{scenario}"),
                   fig_state_heatmap(st, sc_obj, f"{scenario}: {len(st)} bugs of {len(focus)} run(s) ({who})", "bugs"),
                   f"{scenario}: bug initial states over the {_dims_text(sc_obj, dims)}, on the distinct-bug grid, "
                   f"{len(focus)} optimality run(s) of {who}")
    else:
        said.append(f"bugs over the initial-state grid: {'no bugs' if data.has('bug_list') else _missing(data)}")
    fl = data["failure_list"]
    fl = fl[fl["safety_key"].isin(safety_units(data["runs"], scenario)["safety_key"])] if not fl.empty else fl
    if sc_obj is not None and not fl.empty:
        st = _states(fl)
        nsr = fl["safety_key"].nunique()
        doc.figure(_safe(f"failures-grid-{scenario}"),
                   fig_state_heatmap(st, sc_obj, f"{scenario}: {len(st)} safety failures of {nsr} run(s)", "failures"),
                   f"{scenario}: initial states of the AUT's safety failures over the {_dims_text(sc_obj, dims)} "
                   f"({nsr} distinct safety run(s), each counted once)")
    elif not safety_units(data["runs"], scenario).empty:
        said.append(f"failures over the initial-state grid: {'no failures' if data.has('failure_list') else _missing(data)}")
    cases = data["cases"]
    cases = cases[cases["campaign"].isin(focus["campaign"])] if not cases.empty else cases
    if not cases.empty:
        doc.figure(_safe(f"returns-{scenario}"),
                   fig_returns_scatter(cases["aut_return"].to_numpy(float), cases["ca_return"].to_numpy(float),
                                       cases["bug"].to_numpy(bool), f"{scenario}: AUT vs challenger per test case"),
                   f"{scenario}: AUT and challenger returns from the same initial states ({len(cases)} test cases of "
                   f"{who}; above the dashed line the challenger did better)")
    elif not focus.empty:
        said.append(f"AUT vs challenger returns: {_missing(data)}")
    if said:
        doc.p("; ".join(said) + ".")


def _dims_text(sc, dims) -> str:
    names = list(sc.state_names)
    if len(dims) >= 2:
        return f"first two initial-state dimensions that vary ({names[dims[0]]}, {names[dims[1]]})"
    if len(dims) == 1:
        return f"one initial-state dimension that varies ({names[dims[0]]})"
    return "initial states"


def _missing(data) -> str:
    return NOT_IN_RUN if data.from_runs else "not in the data behind this report"


# -- bugs you can see ----------------------------------------------------------------------------
def section_videos(doc: Doc, data, scenario: str, gifs: dict) -> None:
    """The top bugs of the scenario, the AUT's and the challenger's episodes side by side."""
    v = data["videos"]
    v = v[v["scenario"] == scenario] if not v.empty else v
    if v.empty:
        return
    doc.h("Bugs you can see", 3)
    doc.p("The bugs where the challenger beat the AUT by the most, replayed in the scenario's reference gymnasium "
          "environment from the recorded initial state and episode seed, each agent acting alone (left: the AUT, "
          "right: the challenger; `deltarl replay RUN BUG_ID --video` renders any bug).")
    missing = []
    for _, r in v.iterrows():
        data_bytes = gifs.get(r["file"])
        if data_bytes is None:
            missing.append(str(r["file"]))
            continue
        doc.animation(r["file"].rsplit(".", 1)[0],
                      data_bytes, f"{scenario}, {r['campaign']}, bug {int(r['bug_id'])}: AUT {r['aut_return']:.1f} "
                      f"in {int(r['aut_length'])} steps, challenger {r['ca_return']:.1f} in {int(r['ca_length'])} steps")
    if missing:
        doc.note(f"Not found beside this report: {', '.join(missing)}.")


# -- the run and the raw table -------------------------------------------------------------------
def section_single(doc: Doc, data) -> None:
    """The headline table of one run (the phases it ran)."""
    r = data["runs"].iloc[0]
    agents = data["agents"]
    rows = []
    if pd.notna(r.get("safety_key")):
        f, e = int(r["failures"]), int(r["safety_episodes"])
        fl = r.get("flaky_failures")
        rows.append(["safety", f"{r['safety_fuzzer']}, {e} episodes",
                     f"{f} failures in {int(r['distinct_failures'])} distinct cells (failure rate {100 * f / max(e, 1):.1f}%)"
                     + (f"; {int(fl)} flaky" if _f(fl) == _f(fl) and fl else "")])
    else:
        rows.append(["safety", NOT_IN_RUN, ""])
    chs = agents[agents["role"] == "challenger"] if not agents.empty else agents
    for _, c in chs.iterrows():
        secs = _f(c["training_wall_seconds"])
        rows.append([f"challenger {c['algo']}", f"trained in {secs:.0f} s" if secs == secs else "trained",
                     f"return {stats.format_cell(_f(c['mean_return']), _f(c['ci95_margin']))} "
                     f"({int(_f(c['episodes']))} episodes)"])
    if chs.empty:
        rows.append(["challenger", NOT_IN_RUN, ""])
    if pd.notna(r.get("method")):
        b, n = int(r["bugs"]), int(r["cases"])
        fb = r.get("flaky_bugs")
        dist = "n/a (fewer than 2 bugs)" if _f(r["distance"]) != _f(r["distance"]) else f"{_f(r['distance']):.3f}"
        rows.append(["optimality", f"{r['method']} ({r['oracle']} oracle), {n} test cases",
                     f"{b} bugs in {int(r['distinct_bugs'])} distinct cells, distance {dist}, bug rate "
                     f"{100 * b / max(n, 1):.1f}%" + (f"; {int(fb)} flaky" if _f(fb) == _f(fb) and fb else "")])
    else:
        rows.append(["optimality", NOT_IN_RUN, ""])
    doc.table(["phase", "work", "result"], rows, caption="The run's phases", align="lll")
    flaky = sum(int(_f(x)) for x in (r.get("flaky_failures"), r.get("flaky_bugs")) if _f(x) == _f(x))
    if flaky:
        doc.note(f"{flaky} candidates flipped under batching: they failed (or lost to the challenger) in the batched "
                 f"search but not with the agent acting alone, one observation at a time. They are not counted: the "
                 f"agent is near-tied at those states (flaky_failures.parquet, flaky_bugs.parquet).")


RAW_COLUMNS = (("campaign", "campaign"), ("scenario", "scenario"), ("aut", "AUT"), ("method", "method"),
               ("challenger_algo", "challenger"), ("seed", "seed"), ("status", "status"),
               ("safety_fuzzer", "safety fuzzer"), ("safety_episodes", "safety episodes"), ("failures", "failures"),
               ("distinct_failures", "distinct failures"), ("challenger_return", "challenger return"),
               ("oracle", "oracle"), ("cases", "test cases"), ("bugs", "bugs"), ("distinct_bugs", "distinct bugs"),
               ("distance", "distance"))


def _raw(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, (float, np.floating)):
        return str(int(v)) if float(v).is_integer() else (f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}")
    if isinstance(v, (np.integer,)):
        return str(int(v))
    return str(v)


def section_all_runs(doc: Doc, data) -> None:
    """Every campaign, one row each, plain columns; columns equal in every row go into the caption."""
    runs = data["runs"]
    doc.h(f"All runs ({len(runs)} campaigns)", 2)
    cols = [(k, label) for k, label in RAW_COLUMNS if k in runs and runs[k].notna().any()]
    same, varying = [], []
    if "aut" in runs and runs["scenario"].nunique() > 1 and runs.groupby("scenario")["aut"].nunique().max() == 1:
        cols = [(k, label) for k, label in cols if k != "aut"]  # one AUT per scenario: said once, in the caption
        same.append("AUT " + ", ".join(f"{a}" for a in sorted(runs["aut"].dropna().unique())) + " (one per scenario)")
    for k, label in cols:
        vals = {_raw(v) for v in runs[k]}
        if len(vals) == 1 and k not in ("campaign", "method", "bugs"):
            same.append(f"{label} {vals.pop()}")
        else:
            varying.append((k, label))
    rows = [[_raw(r[k]) for k, _ in varying] for _, r in runs.iterrows()]
    align = "".join("l" if k in ("campaign", "scenario", "aut", "method", "challenger_algo", "status",
                                 "safety_fuzzer", "oracle") else "r" for k, _ in varying)
    doc.table([label for _, label in varying], rows, align=align,
              caption="One row per campaign, as run (copies of a shared safety run or challenger repeat its numbers)"
                      + (f"; in every row: {', '.join(same)}" if same else ""))
    doc.note("Empty distance: fewer than two bugs in that run. The statistics above count each distinct safety run "
             "and challenger once.")
    failed = runs[runs["status"].fillna("done") != "done"] if "status" in runs else runs.iloc[0:0]
    for _, r in failed.iterrows():
        doc.p(f"{r['campaign']} failed: {r.get('error') or 'no error recorded'}.")
