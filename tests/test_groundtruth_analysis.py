"""orchestrator/analysis/groundtruth.py on synthetic records (issue 51): recall, cases to first
hit, precision with natural defects, coverage curves, Holm's correction, and a uniform sampler
that finds a wide region and misses a narrow one at the rate (1 - v) ** n. Unit tier."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis import groundtruth as gt
from workers.policies.planted import load_spec

REGIONS = [gt.RegionInfo(0, "wide", "fail", 0.2), gt.RegionInfo(1, "narrow", "fail", 0.01),
           gt.RegionInfo(2, "slow", "slow", 0.1)]


def records(rows):
    """rows: (method, seed, region, flagged, natural) in case order per (method, seed)."""
    df = pd.DataFrame(rows, columns=["method", "seed", "region", "flagged", "natural"])
    df["case"] = df.groupby(["method", "seed"]).cumcount()
    return df


def sample():
    return records([
        # method a, seed 0: hits wide at case 2 (1-based 2) and slow at case 4; one natural outside
        ("a", 0, -1, False, None), ("a", 0, 0, True, None), ("a", 0, 0, True, None),
        ("a", 0, 2, True, None), ("a", 0, -1, True, True), ("a", 0, 1, False, None),
        # method a, seed 1: hits everything; one unexplained outside
        ("a", 1, 1, True, None), ("a", 1, 0, True, None), ("a", 1, 2, True, None), ("a", 1, -1, True, False),
        # method b, seed 0: nothing flagged
        ("b", 0, 0, False, None), ("b", 0, 1, False, None), ("b", 0, -1, False, None),
    ])


def test_recall_precision_and_first_hits():
    recs = sample()
    runs = gt.per_run(recs, REGIONS).set_index(["method", "seed"])
    assert runs.loc[("a", 0), "recall"] == pytest.approx(2 / 3)
    assert runs.loc[("a", 1), "recall"] == 1.0
    assert runs.loc[("b", 0), "recall"] == 0.0
    assert runs.loc[("a", 0), "precision"] == pytest.approx(3 / 4)  # 3 inside of 4 flagged
    assert runs.loc[("a", 0), "outside_natural"] == 1 and runs.loc[("a", 0), "outside_unexplained"] == 0
    assert runs.loc[("a", 1), "outside_unexplained"] == 1
    assert math.isnan(runs.loc[("b", 0), "precision"])
    fail_only = gt.per_run(recs, REGIONS, kinds=("fail",)).set_index(["method", "seed"])
    assert fail_only.loc[("a", 0), "recall"] == 0.5 and fail_only.loc[("a", 0), "inside_other_kind"] == 1
    hits = gt.first_hits(recs, REGIONS).set_index(["method", "seed", "region"])
    assert hits.loc[("a", 0, "wide"), "first_hit"] == 2 and hits.loc[("a", 0, "wide"), "flagged_inside"] == 2
    assert hits.loc[("a", 0, "slow"), "first_hit"] == 4
    assert math.isnan(hits.loc[("a", 0, "narrow"), "first_hit"])  # sampled (case 6) but not flagged
    assert hits.loc[("a", 1, "narrow"), "first_hit"] == 1
    s = gt.summary(gt.per_run(recs, REGIONS), gt.first_hits(recs, REGIONS)).set_index("method")
    assert s.loc["a", "recall"] == pytest.approx((2 / 3 + 1) / 2)
    assert s.loc["a", "hit_pairs"] == "5 of 6" and s.loc["b", "hit_pairs"] == "0 of 3"


def test_coverage_curves_count_regions_found_by_each_case():
    cov = gt.coverage_curves(sample(), REGIONS, points=[1, 2, 3, 4, 6])
    a0 = cov[(cov.method == "a") & (cov.seed == 0)].set_index("cases").regions_found
    assert a0.to_dict() == {1: 0, 2: 1, 3: 1, 4: 2, 6: 2}
    a1 = cov[(cov.method == "a") & (cov.seed == 1)].set_index("cases").regions_found
    assert a1.to_dict() == {1: 1, 2: 2, 3: 3, 4: 3, 6: 3}
    assert (cov[cov.method == "b"].regions_found == 0).all()


def test_missing_column_is_one_clear_error():
    with pytest.raises(ValueError, match="missing natural"):
        gt.per_run(sample().drop(columns=["natural"]), REGIONS)


def test_holm_matches_the_step_down_rule():
    adj = gt.holm({"x": 0.01, "y": 0.04, "z": 0.03, "w": float("nan")})
    assert adj["x"] == pytest.approx(0.03) and adj["z"] == pytest.approx(0.06) and adj["y"] == pytest.approx(0.06)
    assert math.isnan(adj["w"])
    # a smaller p later in the order never gets a larger adjusted p than an earlier one
    adj = gt.holm({"a": 0.001, "b": 0.2, "c": 0.21})
    assert adj["a"] == pytest.approx(0.003) and adj["b"] == pytest.approx(0.4) and adj["c"] == pytest.approx(0.4)


def test_compare_separates_a_better_method_and_corrects():
    rows = []
    for s in range(5):
        rows += [("good", s, 0, True, None), ("good", s, 1, True, None)]
        rows += [("poor", s, 0, s % 2 == 0, None), ("poor", s, 1, False, None)]
    runs = gt.per_run(records(rows), REGIONS, kinds=("fail",))
    c = gt.compare(runs, "good", metrics=("recall",))
    assert len(c) == 1 and c.p.iloc[0] < 0.05 and c.p_holm.iloc[0] == pytest.approx(c.p.iloc[0])
    assert c.reference_mean.iloc[0] == 1.0 and c.method_mean.iloc[0] == pytest.approx(0.3)


@pytest.mark.slow
def test_cartpole_region_volumes_are_as_documented():
    spec = load_spec("experiments/groundtruth/cartpole.yaml")
    vol = gt.region_volumes(spec, n=200_000, seed=0)
    # 20% x 20%; 15% x 25% less the 4% of it the first region takes (first match wins);
    # a 4-ball of radius 0.3 half-widths: pi^2/2 * 0.3^4 / 2^4
    want = [0.04, 0.0375 * 0.96, math.pi ** 2 / 2 * 0.3 ** 4 / 16]
    for v, w in zip(vol, want):
        assert abs(v - w) < 4 * math.sqrt(w * (1 - w) / 200_000) + 1e-4


@pytest.mark.slow
def test_a_uniform_sampler_finds_wide_and_misses_narrow_at_the_documented_rate():
    """The planted CartPole agent fails exactly in its fail regions (test_groundtruth_planted), so
    a uniform fuzzer's failures are its draws inside them: over 400 runs of 100 cases the miss rate
    of each region matches (1 - v) ** 100 within 4 binomial standard errors."""
    spec = load_spec("experiments/groundtruth/cartpole.yaml")
    infos = gt.region_infos(spec, n=200_000, seed=1)
    rng = np.random.default_rng(2)
    n_runs, n_cases = 400, 100
    states = spec.scenario.sample(rng, n_runs * n_cases)
    region = spec.region_of_initial(states)
    recs = pd.DataFrame({"method": "uniform", "seed": np.repeat(np.arange(n_runs), n_cases),
                         "case": np.tile(np.arange(n_cases), n_runs), "region": region,
                         "flagged": region >= 0, "natural": pd.NA})
    hits = gt.first_hits(recs, infos)
    for r in infos:
        missed = hits[hits.region == r.name].first_hit.isna().mean()
        p = gt.miss_probability(r.volume, n_cases)
        assert abs(missed - p) < 4 * math.sqrt(p * (1 - p) / n_runs) + 0.01, (r.name, missed, p)
    wide, narrow = infos[0], infos[2]
    assert gt.miss_probability(wide.volume, n_cases) < 0.05 < 0.7 < gt.miss_probability(narrow.volume, n_cases)


def test_report_tables_and_figures_from_records(tmp_path):
    """groundtruth_report's analysis and report.md on synthetic records of a real spec."""
    from orchestrator.analysis import groundtruth_report as rep

    spec = load_spec("experiments/groundtruth/mountaincar.yaml")
    rng = np.random.default_rng(0)
    rows = []
    for method, seeds in (("good", range(3)), ("poor", range(3))):
        for s in seeds:
            states = spec.scenario.sample(rng, 50)
            region = spec.region_of_initial(states)
            flagged = region == 0 if method == "poor" else np.isin(region, [0, 1])
            rows.append(pd.DataFrame({"scenario": spec.scenario_name, "spec": "mc", "method": method, "seed": s,
                                      "case": np.arange(50), "region": region, "flagged": flagged,
                                      "natural": pd.NA, "aut_return": -100.0, "initial_state": list(states)}))
    records = pd.concat(rows, ignore_index=True)
    res = rep.analyse(records, {"mc": spec}, "safety", volume_samples=20_000)
    runs = res["runs"].set_index(["method", "seed"])
    found_left = records[(records.method == "good") & (records.region == 1)].groupby("seed").size()
    for s in range(3):
        assert runs.loc[("good", s), "recall"] == (1.0 if found_left.get(s, 0) else 0.5)
        assert runs.loc[("poor", s), "recall"] <= 0.5
    assert set(res["regions"].region) == {r.name for r in spec.regions}
    assert not res["regions"].set_index("region").loc["slow-right", "counted"]
    path = rep.write(tmp_path, records, res, "safety", tmp_path)
    text = path.read_text()
    assert "| good | 3 |" in text and "coverage-MountainCar-v0.png" in text
    assert (tmp_path / "coverage-MountainCar-v0.png").stat().st_size > 1000
    back = pd.read_parquet(tmp_path / "runs.parquet")
    assert len(back) == 6 and set(back.method) == {"good", "poor"}


def test_recall_over_the_narrow_regions():
    """narrow_below: recall over the counted regions holding less than that share (here 'narrow',
    1%); absent without it."""
    recs = sample()
    runs = gt.per_run(recs, REGIONS, narrow_below=0.05).set_index(["method", "seed"])
    assert runs.loc[("a", 0), "recall_narrow"] == 0.0  # sampled the narrow region, never flagged it
    assert runs.loc[("a", 1), "recall_narrow"] == 1.0 and runs.loc[("b", 0), "recall_narrow"] == 0.0
    assert "recall_narrow" not in gt.per_run(recs, REGIONS).columns
    none = gt.per_run(recs, REGIONS, narrow_below=0.001)
    assert none.recall_narrow.isna().all()
    s = gt.summary(gt.per_run(recs, REGIONS, narrow_below=0.05), gt.first_hits(recs, REGIONS)).set_index("method")
    assert s.loc["a", "recall_narrow"] == 0.5 and s.loc["b", "recall_narrow"] == 0.0


def _mc_records(spec, methods, seeds=range(3), n=50):
    rng = np.random.default_rng(0)
    rows = []
    for method, flag in methods.items():
        for s in seeds:
            states = spec.scenario.sample(rng, n)
            region = spec.region_of_initial(states)
            rows.append(pd.DataFrame({"scenario": spec.scenario_name, "spec": "mc", "method": method, "seed": s,
                                      "case": np.arange(n), "region": region, "flagged": flag(region),
                                      "natural": pd.NA, "aut_return": -100.0, "initial_state": list(states)}))
    return pd.concat(rows, ignore_index=True)


def test_report_against_a_stated_reference_with_narrow_recall(tmp_path):
    """--reference: that method against every other (not the best by recall); --narrow: recall
    over the narrow regions is a column of the table and a compared metric."""
    from orchestrator.analysis import groundtruth_report as rep

    spec = load_spec("experiments/groundtruth/mountaincar.yaml")
    records = _mc_records(spec, {"good": lambda r: r >= 0, "poor": lambda r: r == 0})
    res = rep.analyse(records, {"mc": spec}, "optimality", volume_samples=20_000, reference="poor", narrow=0.05)
    c = res["comparisons"]
    assert set(c.reference) == {"poor"} and set(c.method) == {"good"}
    assert list(c.metric) == ["recall", "recall_narrow", "precision"]
    runs = res["runs"].set_index(["method", "seed"])
    assert (runs.loc["poor"].recall_narrow == 0).all()  # poor flags only the wide fail region
    narrow_found = records[(records.method == "good") & records.region.isin([1, 3])].groupby("seed").region.nunique()
    for s in range(3):
        assert runs.loc[("good", s), "recall_narrow"] == narrow_found.get(s, 0) / 2
    text = rep.write(tmp_path, records, res, "optimality", [tmp_path / "a", tmp_path / "b"], reference="poor",
                     narrow=0.05).read_text()
    assert "recall, narrow regions" in text and "poor (stated before the run) against" in text
    assert f"`{tmp_path / 'a'}`, `{tmp_path / 'b'}`" in text
    with pytest.raises(rep.ReportError, match="--reference 'nobody'"):
        rep.analyse(records, {"mc": spec}, "optimality", volume_samples=2_000, reference="nobody")


def test_report_reads_several_grid_folders_refuses_a_run_twice_and_filters_methods(monkeypatch, tmp_path):
    """Runs of several folders together (a profile that ran more seeds beside local); the same
    (AUT, method, seed) twice is one clear error; --method keeps only those methods."""
    from types import SimpleNamespace

    from orchestrator.analysis import groundtruth_report as rep
    from orchestrator.analysis import run_reader

    def fake(folder, method, seed):
        return SimpleNamespace(dir=tmp_path / folder, aut="planted:x.yaml", seed=seed, safety=None,
                               optimality={"fuzzer": method}, optimality_method=method)

    folders = {"local": [fake("local/000", "delta", 0), fake("local/001", "random", 0)],
               "more": [fake("more/000", "delta", 3), fake("more/001", "delta w/o regret", 3)],
               "again": [fake("again/000", "delta", 0)]}
    monkeypatch.setattr(run_reader, "find_runs", lambda root: folders[Path(root).name])
    monkeypatch.setattr(run_reader.Run, "load", staticmethod(lambda d: d))
    got = rep._planted_runs([Path("local"), Path("more")], "optimality")
    assert [(r.optimality_method, r.seed) for r in got] == [("delta", 0), ("random", 0), ("delta", 3),
                                                           ("delta w/o regret", 3)]
    kept = rep._planted_runs([Path("local"), Path("more")], "optimality", methods=["delta"])
    assert [(r.optimality_method, r.seed) for r in kept] == [("delta", 0), ("delta", 3)]
    assert rep._planted_runs([Path("local")], "safety") == []  # no safety phase in these runs
    with pytest.raises(rep.ReportError, match="both hold delta seed 0"):
        rep._planted_runs([Path("local"), Path("again")], "optimality")


def test_report_cli_refuses_bad_input_with_exit_2(tmp_path, capsys):
    from orchestrator.analysis import groundtruth_report as rep

    assert rep.main([str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert rep.main([str(tmp_path), "--out", str(tmp_path / "o"), "--narrow", "5"]) == 2
    assert "--narrow 5.0" in capsys.readouterr().err
    assert rep.main([str(tmp_path), "--out", str(tmp_path / "o")]) == 2  # an empty folder: no planted runs
    assert "no run with a planted: AUT" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_llmtester_without_multi_scale_is_its_own_method(tmp_path):
    """``multi_scale: false`` (the paper's "w/o ms") is labelled apart from LLMTester, so the
    ground-truth report and Table II can read both from the same folders without a clash."""
    from orchestrator.analysis.run_reader import Run

    def run(params):
        return Run(tmp_path, {"safety": {"fuzzer": "llmtester", "params": params}}, {"fuzzer": "llmtester"}, None,
                   [], None)

    assert run({"multi_scale": False}).safety_method == "llmtester w/o ms"
    assert run({"multi_scale": True}).safety_method == "llmtester"
    assert run({}).safety_method == "llmtester"
    assert Run(tmp_path, {"safety": {"params": {"multi_scale": False}}}, {"fuzzer": "mdpfuzz"}, None, [],
               None).safety_method == "mdpfuzz"


def test_report_adds_a_method_to_a_committed_report(monkeypatch, tmp_path, capsys):
    """``--add``: a report's records.parquet joins new runs (their folders are all that is on the
    machine), the earlier sources stay named, a run it already holds or a report of the other
    phase is one clear error (exit 2)."""
    from types import SimpleNamespace

    from orchestrator.analysis import groundtruth as gt
    from orchestrator.analysis import groundtruth_report as rep

    target = "experiments/groundtruth/mountaincar.yaml"
    spec = load_spec(target)
    rng = np.random.default_rng(1)

    def cases(method, seed, n=40):
        states = spec.scenario.sample(rng, n)
        region = spec.region_of_initial(states)
        return pd.DataFrame({"method": method, "seed": seed, "case": np.arange(n), "region": region,
                             "flagged": region >= 0, "natural": pd.array([pd.NA] * n, dtype="boolean"),
                             "aut_return": -100.0, "initial_state": list(states)})

    first = pd.concat([cases("random", s).assign(scenario=spec.scenario_name, spec=target, run=f"r{s}")
                       for s in range(2)], ignore_index=True)
    committed = tmp_path / "committed"
    rep.write(committed, first, rep.analyse(first, {target: spec}, "safety", volume_samples=5_000), "safety",
              ["runs/grids/gt/local"])
    new = {"llm": [SimpleNamespace(aut=f"planted:{target}", dir=tmp_path / "llm" / f"00{s}", seed=s,
                                   safety={"fuzzer": "llmtester"}, safety_method="llmtester") for s in range(2)]}
    monkeypatch.setattr(rep, "_planted_runs", lambda roots, phase, methods=None: new[Path(roots[0]).name])
    monkeypatch.setattr(gt, "cases_from_run", lambda d, sp, phase: cases("llmtester", int(d.name[-1])))
    monkeypatch.setattr(rep, "_judge", lambda sp, phase, recs: lambda states: np.zeros(len(states), bool))
    (tmp_path / "llm").mkdir()
    out = tmp_path / "both"
    assert rep.main([str(tmp_path / "llm"), "--add", str(committed), "--out", str(out), "--phase", "safety"]) == 0
    runs = pd.read_parquet(out / "runs.parquet")
    assert sorted(zip(runs.method, runs.seed)) == [("llmtester", 0), ("llmtester", 1), ("random", 0), ("random", 1)]
    assert len(pd.read_parquet(out / "records.parquet")) == 4 * 40
    head = (out / "report.md").read_text().splitlines()[2]
    assert "`runs/grids/gt/local`" in head and f"`{tmp_path / 'llm'}`" in head, head
    # adding the same runs again, or a report of the other phase: exit 2, the report unchanged
    before = (out / "report.md").read_bytes()
    capsys.readouterr()
    assert rep.main([str(tmp_path / "llm"), "--add", str(out), "--out", str(out)]) == 2
    assert "already holds llmtester seed 0" in capsys.readouterr().err
    assert rep.main([str(tmp_path / "llm"), "--add", str(committed), "--out", str(out), "--phase", "optimality"]) == 2
    assert "another phase" in capsys.readouterr().err
    assert rep.main([str(tmp_path / "llm"), "--add", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "holds no records.parquet" in capsys.readouterr().err
    assert (out / "report.md").read_bytes() == before
