"""Methods measured against ground truth (issue 51): recall, cases to first hit, precision and
coverage curves of the failures and bugs a method reports on a planted-defect agent
(``planted:SPEC``, workers/policies/planted.py), instead of saturated bug counts.

The input is one table of test cases, in the order each method ran them::

    method, seed, case (0, 1, ... per method and seed), region (-1: outside every planted region),
    flagged (the case was reported: a failure in the safety phase, a bug in the optimality phase),
    natural (for flagged cases outside the regions: the base agent alone is flagged there too)

:func:`cases_from_run` builds it from a run folder (the AUT's episodes in ``episode_id`` order);
the functions below are pure, so the tests feed them synthetic records.

* **recall**: the share of planted regions (of the kinds that count for the phase) with at least
  one flagged case;
* **cases to first hit**: per region, the 1-based position of the first flagged case inside it
  (None when none);
* **precision**: flagged cases inside a planted region over all flagged cases; the flagged cases
  outside are split into *natural* (the base agent is flagged from that state too: a real defect
  that was not planted) and *unexplained*;
* **coverage curve**: regions found after each number of cases.

:func:`miss_probability` is what a uniform sampler should do: a region holding a share ``v`` of
the reset distribution is missed by ``n`` independent draws with probability ``(1 - v) ** n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from orchestrator.analysis.stats import mann_whitney, mean_ci

RECORD_COLUMNS = ("method", "seed", "case", "region", "flagged", "natural")


@dataclass(frozen=True)
class RegionInfo:
    index: int
    name: str
    kind: str  # fail | slow
    volume: float  # share of the reset distribution inside the region


def check_records(records: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"ground-truth records need the columns {', '.join(RECORD_COLUMNS)}; "
                         f"missing {', '.join(missing)}")
    return records.sort_values(["method", "seed", "case"], kind="stable").reset_index(drop=True)


def region_volumes(spec, n: int = 200_000, seed: int = 0) -> np.ndarray:
    """Monte Carlo share of the scenario's reset distribution in each region (seeded)."""
    states = spec.scenario.sample(np.random.default_rng(seed), n)
    reg = spec.region_of_initial(states)
    return np.array([(reg == i).mean() for i in range(len(spec.regions))])


def region_infos(spec, n: int = 200_000, seed: int = 0) -> list[RegionInfo]:
    vol = region_volumes(spec, n, seed)
    return [RegionInfo(i, r.name, r.kind, float(vol[i])) for i, r in enumerate(spec.regions)]


def miss_probability(volume: float, n: int) -> float:
    """The chance that ``n`` independent draws from the reset distribution miss a region holding
    a share ``volume`` of it."""
    return float((1.0 - volume) ** n)


def first_hits(records: pd.DataFrame, regions: list[RegionInfo]) -> pd.DataFrame:
    """One row per (method, seed, region): the 1-based case of the first flagged case inside the
    region (NaN: never), and how many flagged cases fell inside it."""
    records = check_records(records)
    rows = []
    for (method, seed), g in records.groupby(["method", "seed"], sort=True):
        hit = g[g.flagged.astype(bool)]
        for r in regions:
            inside = hit[hit.region == r.index]
            rows.append({"method": method, "seed": seed, "region": r.name, "kind": r.kind,
                         "first_hit": float(inside.case.min() + 1) if len(inside) else math.nan,
                         "flagged_inside": int(len(inside))})
    return pd.DataFrame(rows)


def per_run(records: pd.DataFrame, regions: list[RegionInfo], kinds=("fail", "slow"),
            narrow_below: float | None = None) -> pd.DataFrame:
    """Recall and precision of each (method, seed), over the regions of ``kinds``; with
    ``narrow_below`` also ``recall_narrow``: recall over the counted regions whose share of the
    reset distribution is below it (NaN when there is none)."""
    records = check_records(records)
    counted = [r for r in regions if r.kind in kinds]
    if not counted:
        raise ValueError(f"no planted region of kind {', '.join(kinds)}")
    idx = {r.index for r in counted}
    narrow = {r.index for r in counted if narrow_below is not None and r.volume < narrow_below}
    rows = []
    for (method, seed), g in records.groupby(["method", "seed"], sort=True):
        flagged = g[g.flagged.astype(bool)]
        found = set(flagged.region[flagged.region.isin(idx)].unique().tolist())
        inside = int(flagged.region.isin(idx).sum())
        other_planted = int(((flagged.region >= 0) & ~flagged.region.isin(idx)).sum())
        outside = flagged[flagged.region < 0]
        natural = int(outside.natural.fillna(False).astype(bool).sum())
        n_flag = len(flagged)
        rows.append({
            "method": method, "seed": seed, "cases": int(len(g)), "flagged": n_flag,
            "regions_found": len(found), "regions": len(counted), "recall": len(found) / len(counted),
            "inside": inside, "inside_other_kind": other_planted, "outside_natural": natural,
            "outside_unexplained": int(len(outside) - natural),
            # precision: what was planted (of any kind) over all reported; NaN when nothing was reported
            "precision": (inside + other_planted) / n_flag if n_flag else math.nan,
        })
        if narrow_below is not None:
            rows[-1]["recall_narrow"] = len(found & narrow) / len(narrow) if narrow else math.nan
    return pd.DataFrame(rows)


def coverage_curves(records: pd.DataFrame, regions: list[RegionInfo], points=None,
                    kinds=("fail", "slow")) -> pd.DataFrame:
    """Regions found (of ``kinds``) after each number of cases in ``points`` (default: every case
    count of the longest run, thinned to at most 200 points), per (method, seed)."""
    records = check_records(records)
    idx = [r.index for r in regions if r.kind in kinds]
    if points is None:
        longest = int(records.groupby(["method", "seed"]).case.max().max() + 1) if len(records) else 0
        points = np.unique(np.linspace(1, max(longest, 1), min(200, max(longest, 1))).astype(int))
    points = np.asarray(points, dtype=int)
    rows = []
    for (method, seed), g in records.groupby(["method", "seed"], sort=True):
        hits = g[g.flagged.astype(bool) & g.region.isin(idx)]
        first = hits.groupby("region").case.min().to_numpy() + 1  # 1-based case of each region's first hit
        for p in points:
            rows.append({"method": method, "seed": seed, "cases": int(p), "regions_found": int((first <= p).sum())})
    return pd.DataFrame(rows)


def summary(runs: pd.DataFrame, hits: pd.DataFrame) -> pd.DataFrame:
    """Per method: recall, precision (mean and 95% CI margin over seeds) and the median cases to
    first hit over the (seed, region) pairs that were hit, with how many were."""
    rows = []
    for method, g in runs.groupby("method", sort=True):
        rec, rec_m = mean_ci(g.recall.to_numpy(dtype=float))
        prec_vals = g.precision.dropna().to_numpy(dtype=float)
        prec, prec_m = mean_ci(prec_vals) if len(prec_vals) else (math.nan, math.nan)
        h = hits[hits.method == method]
        got = h.first_hit.dropna()
        rows.append({"method": method, "seeds": int(g.seed.nunique()), "recall": rec, "recall_ci": rec_m,
                     "precision": prec, "precision_ci": prec_m,
                     "median_first_hit": float(got.median()) if len(got) else math.nan,
                     "hit_pairs": f"{len(got)} of {len(h)}",
                     "flagged": float(g.flagged.mean()), "outside_unexplained": int(g.outside_unexplained.sum())})
        if "recall_narrow" in g.columns:
            vals = g.recall_narrow.dropna().to_numpy(dtype=float)
            rows[-1]["recall_narrow"], rows[-1]["recall_narrow_ci"] = mean_ci(vals) if len(vals) else (math.nan, math.nan)
    return pd.DataFrame(rows)


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjustment of a family of p-values (name -> p): adjusted p per name."""
    items = sorted(((p, k) for k, p in pvalues.items() if p is not None and not math.isnan(p)))
    m = len(items)
    out, running = {}, 0.0
    for i, (p, k) in enumerate(items):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    for k in pvalues:
        out.setdefault(k, math.nan)
    return out


def compare(runs: pd.DataFrame, reference: str, metrics=("recall", "precision")) -> pd.DataFrame:
    """Mann-Whitney U (two-sided) of ``reference`` against every other method on each metric over
    seeds, with Holm's correction over the whole family (every method x metric)."""
    ref = runs[runs.method == reference]
    rows, ps = [], {}
    for method, g in runs.groupby("method", sort=True):
        if method == reference:
            continue
        for m in metrics:
            a, b = ref[m].dropna().to_numpy(float), g[m].dropna().to_numpy(float)
            if len(a) < 2 or len(b) < 2:
                p = math.nan
            elif np.ptp(np.concatenate([a, b])) == 0:
                p = 1.0
            else:
                p = mann_whitney(a, b)[1]
            ps[(method, m)] = p
            rows.append({"reference": reference, "method": method, "metric": m,
                         "reference_mean": float(a.mean()) if len(a) else math.nan,
                         "method_mean": float(b.mean()) if len(b) else math.nan, "p": p})
    adj = holm(ps)
    for r in rows:
        r["p_holm"] = adj[(r["method"], r["metric"])]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# from run folders
# ---------------------------------------------------------------------------------------------
def cases_from_run(run_dir, spec, phase: str) -> pd.DataFrame:
    """A run's test cases of ``phase`` ("safety" or "optimality") in the order they ran: one row
    per case (its initial state, its region, flagged: a failure of the AUT / a bug), natural
    left empty (:func:`mark_natural` fills it)."""
    from orchestrator.analysis.run_reader import Run
    from orchestrator.runs.layout import SAFETY_PHASES
    from orchestrator.runs.store import RunStore

    run = Run.load(run_dir)
    phases = list(SAFETY_PHASES) if phase == "safety" else ["optimality"]
    flag = "failure" if phase == "safety" else "bug"
    eps = RunStore.open(run.dir).read_episodes(phase=phases, role="aut",
                                               columns=["episode_id", "phase", "iteration", "state_index",
                                                        "initial_state", "return", flag])
    if eps.empty:
        return pd.DataFrame(columns=[*RECORD_COLUMNS, "initial_state"])
    eps = eps.sort_values("episode_id", kind="stable")
    if "phase" not in eps.columns:
        eps["phase"] = phase
    g = eps.groupby(["phase", "iteration", "state_index"], sort=False)
    first = g.episode_id.min().sort_values()
    cases = g.agg(initial_state=("initial_state", "first"), flagged=(flag, "any"),
                  aut_return=("return", "mean")).loc[first.index]
    states = np.stack(cases.initial_state.to_numpy()).astype(float)
    method = (run.safety_method if phase == "safety" else run.optimality_method) or "?"
    return pd.DataFrame({
        "method": method, "seed": run.seed, "case": np.arange(len(cases)),
        "region": spec.region_of_initial(states), "flagged": cases.flagged.to_numpy(dtype=bool),
        "natural": pd.array([pd.NA] * len(cases), dtype="boolean"),
        "aut_return": cases.aut_return.to_numpy(dtype=float), "initial_state": list(states),
    })


def mark_natural(records: pd.DataFrame, judge) -> pd.DataFrame:
    """Fill ``natural`` for the flagged cases outside every region: ``judge(states) -> bool``
    (e.g. the base agent fails from the state, or a challenger beats it there)."""
    out = records.copy()
    rows = np.flatnonzero(out.flagged.to_numpy(bool) & (out.region.to_numpy() < 0))
    nat = out["natural"].astype("boolean")
    if rows.size:
        states = np.stack(out.initial_state.iloc[rows].to_numpy()).astype(float)
        nat.iloc[rows] = np.asarray(judge(states), dtype=bool)
    out["natural"] = nat
    return out
