"""The ground-truth report of a grid run on planted-defect agents (issue 51)::

    python -m orchestrator.analysis.groundtruth_report runs/grids/groundtruth-failures/local \\
        [MORE_GRID_FOLDERS ...] --out experiments/results/groundtruth-failures [--phase safety|optimality] \\
        [--method LABEL ...] [--reference LABEL] [--narrow SHARE] [--add REPORT_FOLDER]

It reads every run folder under the grid outputs whose AUT is a ``planted:`` agent (several
folders: e.g. a grid's ``local`` profile and a profile that ran more seeds beside it; one
(spec, method, seed) found twice is an error; ``--method`` keeps only those methods, labelled as
in the report, e.g. ``delta w/o regret``), builds the
ordered test cases of the phase (:func:`orchestrator.analysis.groundtruth.cases_from_run`), checks
each reported case outside the planted regions against the base agent alone (safety: the base
fails from that state too; optimality: the base's return from it equals the AUT's recorded
return, so the bug is the base's), and writes to ``--out``: ``records.parquet`` (one row per test
case), ``runs.parquet`` (recall, precision per method and seed), ``first_hits.parquet``,
``coverage.parquet``, ``comparisons.parquet``, ``regions.parquet`` (each region's share of the
reset distribution and the chance that a uniform sampler with the run's budget misses it),
``coverage-<scenario>.png`` and ``report.md``, which opens with the recall / precision / cases to
first hit table per method. Every figure of report.md is computed from these Parquet files.

``--add REPORT_FOLDER``: the test cases of a report this command wrote (its ``records.parquet``)
join the runs read, so a method run later (LLMTester) is added to a committed report whose run
folders are no longer on the machine; its sources stay named in the new report.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.analysis import groundtruth as gt
from orchestrator.analysis.markdown import table_lines

KINDS = {"safety": ("fail",), "optimality": ("fail", "slow")}


class ReportError(ValueError):
    """Input the report cannot be made from (one line naming the fix; exit 2)."""


def _method(run, phase: str) -> str:
    return (run.safety_method if phase == "safety" else run.optimality_method) or "?"


def _planted_runs(roots, phase: str, methods=None):
    from orchestrator.analysis.run_reader import Run, find_runs

    out, seen = [], {}
    for root in roots:
        for d in find_runs(Path(root)):
            run = Run.load(d)
            aut = run.aut or ""
            have = run.safety if phase == "safety" else run.optimality
            if not (aut.startswith("planted:") and have) or (methods and _method(run, phase) not in methods):
                continue
            key = (aut, _method(run, phase), run.seed)
            if key in seen:
                raise ReportError(f"{seen[key]} and {run.dir} both hold {key[1]} seed {key[2]} on {aut}; "
                                  "give grid folders whose runs differ (e.g. not a profile that reran seeds of another)")
            seen[key] = run.dir
            out.append(run)
    return out


def _judge(spec, phase: str, records: pd.DataFrame):
    """natural = the base agent alone is flagged from the state too (see the module docstring)."""
    from workers.policies import load_policy
    from workers.rollout import rollout

    base = load_policy(spec.base, spec.scenario, device="cpu")

    def judge(states):
        res = rollout(spec.scenario, base, states)
        if phase == "safety":
            return res.failure
        rows = records[records.flagged & (records.region < 0)]
        return np.isclose(res.returns, rows.aut_return.to_numpy(float))

    return judge


def earlier(report: Path, methods=None, phase: str | None = None) -> tuple[pd.DataFrame, list[str]]:
    """The test cases of a report folder this module wrote and the sources its report names."""
    import re

    path = report / "records.parquet"
    if not path.is_file():
        raise ReportError(f"--add {report}: holds no records.parquet; give a folder this report wrote (its --out)")
    records = pd.read_parquet(path)
    need = {"scenario", "spec", "method", "seed", "case", "region", "flagged", "natural", "initial_state", "run"}
    if need - set(records.columns):
        raise ReportError(f"--add {report}: records.parquet lacks {sorted(need - set(records.columns))[0]!r}; "
                          "make that report again with this version")
    if methods:
        records = records[records.method.isin(methods)]
    text = (report / "report.md").read_text(encoding="utf-8") if (report / "report.md").is_file() else ""
    title = text.splitlines()[0] if text else ""
    if phase and title and f"({phase} phase)" not in title:
        raise ReportError(f"--add {report}: its report is of another phase ({title.removeprefix('# ')}); "
                          f"give a report of the {phase} phase, or --phase to match it")
    line = next((x for x in text.splitlines() if x.startswith("From ")), "")
    sources = re.findall(r"`([^`]+)`", line.split(" by `python", 1)[0]) or [f"the records of {report}"]
    return records.reset_index(drop=True), sources


def collect(roots, phase: str, methods=None, before: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict]:
    """The test cases of the planted runs under ``roots`` and the specs they name; ``before``:
    test cases of an earlier report (:func:`earlier`) to put ahead of them."""
    from workers.policies.planted import load_spec

    roots = [roots] if isinstance(roots, (str, Path)) else list(roots)
    parts, specs = [], {}
    for run in _planted_runs(roots, phase, methods):
        target = run.aut.split(":", 1)[1]
        spec = specs.get(target) or load_spec(target)
        specs[target] = spec
        recs = gt.cases_from_run(run.dir, spec, phase)
        if recs.empty:
            continue
        recs = gt.mark_natural(recs, _judge(spec, phase, recs))
        recs.insert(0, "scenario", spec.scenario_name)
        recs.insert(1, "spec", target)
        recs["run"] = run.dir.name
        parts.append(recs)
    if not parts:
        which = f" of {', '.join(methods)}" if methods else ""
        raise ReportError(f"no run{which} with a planted: AUT and a {phase} phase under "
                          f"{', '.join(map(str, roots))}; give a grid's output folder (and --phase optimality for bugs)")
    records = pd.concat(parts, ignore_index=True)
    if before is not None:
        keys = ["spec", "method", "seed"]
        both = before[keys].drop_duplicates().merge(records[keys].drop_duplicates())
        if len(both):
            spec, method, seed = both.iloc[0]
            raise ReportError(f"--add: the report already holds {method} seed {seed} on planted:{spec}; "
                              "give only the runs it lacks")
        for target in before.spec.unique():
            specs[target] = specs.get(target) or load_spec(target)
        records = pd.concat([before, records], ignore_index=True)
    missing = sorted(set(methods or ()) - set(records.method))
    if missing:
        raise ReportError(f"--method {missing[0]!r}: no such run under {', '.join(map(str, roots))}; "
                          f"methods there: {', '.join(sorted(records.method.unique()))}")
    return records, specs


def markdown_table(headers, rows) -> str:
    return "\n".join(table_lines(headers, rows))


def _fmt(x, digits=2):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def analyse(records: pd.DataFrame, specs: dict, phase: str, volume_samples: int = 200_000,
            reference: str | None = None, narrow: float | None = None):
    """The report's tables. ``reference``: the method compared against every other (default: the
    best by mean recall, per scenario); ``narrow``: also recall over the regions whose share of
    the reset distribution is below it (``recall_narrow``), compared too."""
    kinds = KINDS[phase]
    metrics = ("recall", "recall_narrow", "precision") if narrow is not None else ("recall", "precision")
    out = {k: [] for k in ("runs", "first_hits", "coverage", "comparisons", "regions")}
    for target, spec in specs.items():
        recs = records[records.spec == target]
        if recs.empty:
            continue
        infos = gt.region_infos(spec, n=volume_samples, seed=0)
        budget = int(recs.groupby(["method", "seed"]).case.max().max() + 1)
        counted = [r for r in infos if r.kind in kinds]
        for r in infos:
            out["regions"].append({"scenario": spec.scenario_name, "region": r.name, "kind": r.kind,
                                   "counted": r.kind in kinds, "volume": r.volume, "budget": budget,
                                   "uniform_miss": gt.miss_probability(r.volume, budget)})
        runs = gt.per_run(recs, counted, kinds=kinds, narrow_below=narrow)
        hits = gt.first_hits(recs, counted)
        cov = gt.coverage_curves(recs, counted, kinds=kinds)
        if reference is not None and reference not in set(runs.method):
            raise ReportError(f"--reference {reference!r}: no such method on {spec.scenario_name}; "
                              f"methods: {', '.join(sorted(runs.method.unique()))}")
        best = reference or runs.groupby("method").recall.mean().idxmax()
        cmp_ = gt.compare(runs, best, metrics=metrics)
        for df in (runs, hits, cov, cmp_):
            df.insert(0, "scenario", spec.scenario_name)
        out["runs"].append(runs)
        out["first_hits"].append(hits)
        out["coverage"].append(cov)
        out["comparisons"].append(cmp_)
    res = {k: (pd.concat(v, ignore_index=True) if v and isinstance(v[0], pd.DataFrame) else pd.DataFrame(v))
           for k, v in out.items()}
    # Holm over the whole family (every scenario x method x metric), as the grid file states
    c = res["comparisons"]
    if len(c):
        adj = gt.holm({i: p for i, p in c.p.items()})
        c["p_holm"] = [adj[i] for i in c.index]
    return res


def _coverage_png(cov: pd.DataFrame, scenario: str, n_regions: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for method, g in cov.groupby("method"):
        m = g.groupby("cases").regions_found.mean()
        ax.step(m.index, m.to_numpy(), where="post", label=method)
    ax.set_xlabel("test cases")
    ax.set_ylabel(f"planted regions found (of {n_regions}), mean over seeds")
    ax.set_title(f"{scenario}: regions found vs test cases")
    ax.set_ylim(0, n_regions + 0.2)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, records: pd.DataFrame, res: dict, phase: str, root, *, reference: str | None = None,
          narrow: float | None = None) -> Path:
    roots = [root] if isinstance(root, (str, Path)) else list(root)
    out.mkdir(parents=True, exist_ok=True)
    rec = records.copy()
    rec["initial_state"] = rec.initial_state.map(lambda a: np.asarray(a, float).tolist())
    rec["natural"] = rec.natural.astype("boolean")
    rec.to_parquet(out / "records.parquet", index=False)
    for k, df in res.items():
        df.to_parquet(out / f"{k}.parquet", index=False)
    what = "failures (safety phase)" if phase == "safety" else "bugs (optimality phase)"
    lines = [f"# Ground truth: {what} on planted-defect agents", "",
             f"From {', '.join(f'`{r}`' for r in roots)} by `python -m orchestrator.analysis.groundtruth_report` (issue 51; "
             "docs/ground-truth.md). Every figure below is computed from the Parquet files beside "
             "this report. Recall: share of the planted regions with at least one reported case; "
             "precision: reported cases inside a planted region over all reported; first hit: the "
             "1-based test case of a region's first reported case (median over the (seed, region) "
             "pairs hit); outside: reported cases outside every region, *natural* when the base agent "
             "alone is flagged there too."
             + (f" Narrow regions: those holding less than {100 * narrow:g}% of the reset distribution."
                if narrow is not None else ""), ""]
    for scenario, runs in res["runs"].groupby("scenario", sort=False):
        hits = res["first_hits"][res["first_hits"].scenario == scenario]
        summ = gt.summary(runs, hits)
        regs = res["regions"][(res["regions"].scenario == scenario) & res["regions"].counted]
        lines += [f"## {scenario}", "",
                  f"{runs.seed.nunique()} seeds, {int(runs.cases.max())} test cases per run, "
                  f"{len(regs)} planted regions counted ({', '.join(regs.kind.unique())}).", ""]
        has_narrow = "recall_narrow" in summ.columns
        rows = [[r.method, str(r.seeds), f"{_fmt(r.recall)} ± {_fmt(r.recall_ci)}"]
                + ([f"{_fmt(r.recall_narrow)} ± {_fmt(r.recall_narrow_ci)}"] if has_narrow else [])
                + [f"{_fmt(r.precision)} ± {_fmt(r.precision_ci)}", _fmt(r.median_first_hit, 0), r.hit_pairs,
                   _fmt(r.flagged, 1), str(r.outside_unexplained)] for r in summ.itertuples()]
        lines += [markdown_table(["method", "seeds", "recall (mean ± 95% CI)"]
                                 + (["recall, narrow regions"] if has_narrow else [])
                                 + ["precision (mean ± 95% CI)", "median cases to first hit", "(seed, region) pairs hit",
                                    "reported per run", "outside, unexplained"], rows), ""]
        # per region: how often each method found it, against a uniform sampler's expectation
        reg_rows = []
        for r in regs.itertuples():
            h = hits[hits.region == r.region]
            per = ", ".join(f"{m} {int(g.first_hit.notna().sum())}/{len(g)}" for m, g in h.groupby("method"))
            reg_rows.append([r.region, r.kind, f"{100 * r.volume:.2f}%", f"{r.uniform_miss:.2f}", per])
        lines += [f"*{scenario}: each region, its share of the reset distribution, the chance that "
                  f"{int(regs.budget.max())} uniform draws miss it, and the runs of each method that found it*", "",
                  markdown_table(["region", "kind", "share", "uniform miss", "found by (runs)"], reg_rows), ""]
        cov = res["coverage"][res["coverage"].scenario == scenario]
        png = out / f"coverage-{scenario}.png"
        _coverage_png(cov, scenario, len(regs), png)
        lines += [f"![coverage]({png.name})", ""]
        cmp_ = res["comparisons"][res["comparisons"].scenario == scenario]
        if len(cmp_):
            who = f"{reference} (stated before the run)" if reference else "the best method by recall"
            lines += [f"*{scenario}: {who} against each other method (Mann–Whitney U, "
                      "two-sided, over seeds; Holm over every comparison of this report)*", "",
                      markdown_table(["reference", "method", "metric", "reference mean", "method mean", "p", "p (Holm)"],
                                     [[r.reference, r.method, r.metric, _fmt(r.reference_mean), _fmt(r.method_mean),
                                       _fmt(r.p, 3), _fmt(r.p_holm, 3)] for r in cmp_.itertuples()]), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.analysis.groundtruth_report",
                                 description="Recall, precision, cases to first hit and coverage curves "
                                             "of a grid run on planted-defect agents")
    ap.add_argument("roots", type=Path, nargs="+", metavar="root",
                    help="a grid's output folder (or one run folder); several: their runs together")
    ap.add_argument("--out", type=Path, required=True, help="folder for report.md and its Parquet data")
    ap.add_argument("--phase", choices=["safety", "optimality"], default="safety")
    ap.add_argument("--method", action="append", dest="methods", metavar="LABEL",
                    help="keep only this method (repeatable), labelled as in the report, e.g. 'delta w/o regret'")
    ap.add_argument("--reference", metavar="LABEL",
                    help="compare this method against every other (default: the best by mean recall)")
    ap.add_argument("--narrow", type=float, metavar="SHARE",
                    help="also recall over the regions holding less than SHARE (0-1) of the reset distribution")
    ap.add_argument("--add", type=Path, metavar="REPORT_FOLDER",
                    help="also the test cases of a report this command wrote (its --out), e.g. to add a "
                         "method to a committed report whose run folders are gone")
    args = ap.parse_args(argv)
    for r in args.roots:
        if not r.exists():
            print(f"no such folder: {r}; give a grid's output folder", file=sys.stderr)
            return 2
    if args.narrow is not None and not 0 < args.narrow <= 1:
        print(f"--narrow {args.narrow}: give a share of the reset distribution in (0, 1], e.g. 0.05", file=sys.stderr)
        return 2
    try:
        before, sources = earlier(args.add, args.methods, args.phase) if args.add else (None, [])
        records, specs = collect(args.roots, args.phase, args.methods, before=before)
        sources += map(str, args.roots)
        res = analyse(records, specs, args.phase, reference=args.reference, narrow=args.narrow)
    except ReportError as exc:
        print(exc, file=sys.stderr)
        return 2
    path = write(args.out, records, res, args.phase, sources, reference=args.reference, narrow=args.narrow)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
