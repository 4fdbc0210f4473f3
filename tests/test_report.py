"""Reports: built from small real runs (no Ray), rendered by headless Chromium, made again from
the data saved beside them; the committed results reports made again from the repository.

Chromium is required: the Debian package (``apt-get update && apt-get install -y chromium``).
Without it these tests fail, naming that command.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import Browser

from orchestrator.analysis.report import NOT_IN_RUN, ReportError, write_report

REPO = Path(__file__).resolve().parents[1]
COMMITTED = ("archive/delta-local-rq1", "delta-local-rq2-rq3", "archive/delta-local-table7", "llmtester-table2",
             "archive/delta-rq1-local-CartPole-paper-aut", "delta-paper-cases-rq2-rq3", "delta-paper-cases-rq1",
             "delta-mujoco-local", "delta-table7-hopper-noise-challengers")


def look(html_file: Path, tmp: Path, *, width: int = 1280, height: int = 900) -> dict:
    """Open the report in headless Chromium as a person would, at a laptop's window size: every
    image (does it decode, its size), every table (its rows, its top on the page, whether it is
    wider than the column it sits in), the text, a screenshot of the first screen."""
    with Browser(tmp, width=width, height=height) as b:
        page = b.page(html_file.resolve().as_uri())
        images = page.images()
        tables = page.eval("""Array.from(document.querySelectorAll('table')).map(function (t) {
            var c = t.parentElement; return {rows: t.rows.length, top: t.getBoundingClientRect().top + window.scrollY,
              overflow: t.scrollWidth > c.clientWidth + 1, text: t.innerText.slice(0, 400)}; })""")
        shot = page.screenshot(tmp / "first-screen.png")
        return {"images": images, "tables": tables, "text": page.text(), "shot": shot}


def campaign(tmp: Path, name: str, *, safety: bool = True, optimality: str | None = "delta", seed: int = 0) -> Path:
    p = tmp / f"{name}.yaml"
    opt = "null" if optimality is None else f"""
  fuzzer: {optimality}
  challenger: "random:1"
  budget: {{episodes: 64}}
  generation_size: 16"""
    saf = "{fuzzer: curefuzz, budget: {episodes: 48}, generation_size: 16}" if safety else "null"
    p.write_text(f"""
name: {name}
scenario: CartPole-v1
aut: "random:0"
workers: 0
seed: {seed}
output: {tmp / name}
mlflow: false
safety: {saf}
optimality: {opt}
""")
    return p


def run(p: Path) -> dict:
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign

    return run_campaign(load_campaign(p), progress=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run with safety and optimality (a random AUT against another random policy: bugs where
    the challenger happens to last longer), one safety-only run, and a grid folder of four
    optimality runs (delta and random, two seeds) with the results.parquet that deltarl grid writes."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.grid import markdown_table, row

    tmp = tmp_path_factory.mktemp("report")
    full = run(campaign(tmp, "full"))
    assert full["optimality"]["bugs"] > 0 and full["safety"]["failures"] > 0
    run(campaign(tmp, "safety-only", optimality=None))
    grid = tmp / "grid"
    grid.mkdir()
    rows = []
    for i, (fz, seed) in enumerate((("delta", 0), ("delta", 1), ("random", 0), ("random", 1))):
        p = campaign(grid, f"g-{i:03d}", safety=False, optimality=fz, seed=seed)
        rows.append(row({"optimality.fuzzer": fz, "seed": seed}, load_campaign(p), run(p)))
    df = pd.DataFrame(rows)
    df.to_parquet(grid / "results.parquet")
    (grid / "results.md").write_text(markdown_table(df))
    return tmp


@pytest.mark.subprocess
def test_report_of_a_run_renders_in_chromium(runs, tmp_path):
    import json

    out = write_report(runs / "full", tmp_path / "out")
    md = Path(out["markdown"]).read_text()
    html = Path(out["html"]).read_text()
    summary = json.loads((runs / "full" / "optimality_summary.json").read_text())
    safety = json.loads((runs / "full" / "summary.json").read_text())
    # the run's phases first, then Table 3's layout with the paper's Delta row beside ours; n in every cell
    assert md.index("The run's phases") < md.index("Table 3 layout")
    assert (f"| delta | {summary['bugs']} (n=1) | 105.6 ± 17.7 (+46.7%) | {summary['distinct_bugs']} (n=1) | "
            f"81.0 ± 9.8 (+71.6%) |") in md
    assert f"| curefuzz | 48 | {safety['failures']} (n=1) |" in md and "77.4 ± 10.3" in md
    assert "| 0.10 |" in md and "100.2 ± 15.2" in md  # behaviour clusters beside Table 6
    assert f"Challengers: {NOT_IN_RUN} (no card)." in md
    files = {f.name for f in (tmp_path / "out" / "report_files").iterdir()}
    for name in ("safety-over-time", "optimality-over-time", "bugs-grid", "failures-grid", "returns", "dendrogram",
                 "bug-full-"):
        assert any(f.startswith(name) for f in files), name
        assert f"report_files/{name}" in md
    assert out["videos"] == 2 and sum(f.endswith(".gif") for f in files) == 2
    # self-contained: no external URL, every image inline
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", html) and "<link" not in html
    assert html.count('src="data:image/png;base64,') == 6 and html.count('src="data:image/gif;base64,') == 2
    seen = look(Path(out["html"]), tmp_path)
    assert len(seen["images"]) == out["figures"] == 8
    assert all(i["ok"] and i["w"] > 100 and i["h"] > 100 for i in seen["images"]), seen["images"]
    assert not any(t["overflow"] for t in seen["tables"]), [t["text"][:80] for t in seen["tables"] if t["overflow"]]
    assert f"{summary['bugs']} (n=1)" in seen["text"]
    from matplotlib.image import imread

    img = imread(seen["shot"])
    assert img[..., :3].std() > 0.05  # a page with content, not a blank screen
    # the data behind it, beside it
    saved = {p.name for p in (tmp_path / "out" / "report_data").iterdir()}
    assert {"runs.parquet", "bug_list.parquet", "timelines.parquet", "cases.parquet", "meta.json"} <= saved


@pytest.mark.subprocess
def test_report_degrades_gracefully_on_a_safety_only_run(runs, tmp_path):
    out = write_report(runs / "safety-only", tmp_path)
    md = Path(out["markdown"]).read_text()
    assert f"Optimality testing: {NOT_IN_RUN}." in md and f"Behaviour clustering: {NOT_IN_RUN}" in md
    assert f"| optimality | {NOT_IN_RUN} |" in md
    assert out["figures"] == 2  # failures over time and over the grid
    seen = look(Path(out["html"]), tmp_path)
    assert len(seen["images"]) == 2 and all(i["ok"] for i in seen["images"])


@pytest.mark.subprocess
def test_report_of_a_grid_leads_with_the_answer(runs, tmp_path):
    """The grid's report: the comparison with the paper on the first screen, every image loads,
    no table runs off the page, the raw per-campaign table last and plain."""
    from orchestrator.analysis.stats import mann_whitney

    out = write_report(runs / "grid", tmp_path)
    md = Path(out["markdown"]).read_text()
    df = pd.read_parquet(runs / "grid" / "results.parquet")
    d, r = df[df["optimality.fuzzer"] == "delta"], df[df["optimality.fuzzer"] == "random"]
    # the answer: Delta against the best baseline, ours (n per cell, Mann–Whitney p) and the paper's
    answer = next(ln for ln in md.splitlines() if ln.startswith("| CartPole-v1 | bugs |"))
    u, p = mann_whitney(d["bugs"], r["bugs"])
    assert "(n=2)" in answer and f"| {p:.3f} |" in answer and "105.6 vs curefuzz 72: +46.7%" in answer
    # Table 3 and the comparison: U and p as scipy gives them over the two seeds
    line = next(ln for ln in md.splitlines() if ln.startswith("| bugs | random |"))
    assert line.split(" | ")[5:7] == [f"{u:.1f}", f"{p:.3f}"]
    line = next(ln for ln in md.splitlines() if ln.startswith("| random | "))
    assert f"{r['bugs'].mean():.1f} ± " in line and "(n=2)" in line
    # Delta's energy: each term's share of the seed selections, from the runs' summaries (issue #17)
    import json

    shares = [json.loads((runs / "grid" / c / "results.json").read_text())["optimality"] for c in d["campaign"]]
    line = next(ln for ln in md.splitlines() if ln.startswith("| delta | ") and ln.count("|") == 5)
    for term, got in zip(("diversity", "regret", "inconsistency"), line.split(" | ")[1:4]):
        vals = [s[f"decision_share_{term}"] for s in shares]
        assert got.startswith(f"{np.mean(vals):.3f} ± ") and "(n=2)" in got, (term, got, vals)
    # the raw table last, no JSON in it
    assert md.index("## All runs (4 campaigns)") > md.index("Table 3 layout") and "| g-000 | delta | 0 |" in md
    assert "{" not in md[md.index("## All runs"):]
    seen = look(Path(out["html"]), tmp_path)
    first = seen["tables"][0]
    assert first["top"] < 900 and "Delta vs it" in first["text"], first  # on the first screen, without scrolling
    assert seen["images"] and all(i["ok"] and i["w"] > 100 for i in seen["images"]), seen["images"]
    assert out["videos"] == 2 and sum(i["src"].startswith("data:image/gif") for i in seen["images"]) == 2
    assert not any(t["overflow"] for t in seen["tables"]), [t["text"][:80] for t in seen["tables"] if t["overflow"]]


@pytest.mark.slow
def test_report_is_made_again_from_its_saved_data(runs, tmp_path):
    """Without the run folders: the report folder alone (report_data/, report_files/) gives the
    same tables, figures and bug videos."""
    first = write_report(runs / "grid", tmp_path / "a")
    alone = tmp_path / "alone"
    shutil.copytree(tmp_path / "a", alone)
    again = write_report(alone)
    a, b = Path(first["markdown"]).read_text(), Path(again["markdown"]).read_text()
    tables = [ln for ln in a.splitlines() if ln.startswith("|")]
    assert tables == [ln for ln in b.splitlines() if ln.startswith("|")]
    assert again["videos"] == first["videos"] == 2 and again["figures"] == first["figures"]
    assert "from the data saved beside it" in b


@pytest.mark.campaign
def test_a_saved_report_grows_with_added_run_folders(runs, tmp_path, capsys):
    """A results folder whose run folders are gone takes more runs (``deltarl report FOLDER --add
    RUN_DIR``): the saved campaigns keep their rows and bug videos, the added ones join them, adding
    the same run again replaces it (nothing counted twice), another seed of a saved campaign stays
    apart, and a folder that is not a run is refused with exit 2 and the report left as it was."""
    from orchestrator.cli import main

    write_report(runs / "grid", tmp_path / "a")
    folder = tmp_path / "folder"
    shutil.copytree(tmp_path / "a", folder)
    before = pd.read_parquet(folder / "report_data" / "runs.parquet")
    out = write_report(folder, add=[runs / "full", runs / "safety-only"])
    md = Path(out["markdown"]).read_text()
    grown = pd.read_parquet(folder / "report_data" / "runs.parquet")
    assert sorted(grown["campaign"]) == sorted([*before["campaign"], "full", "safety-only"])
    assert grown.set_index("campaign").loc[list(before["campaign"]), "bugs"].tolist() == before["bugs"].tolist()
    full = json.loads((runs / "full" / "summary.json").read_text())
    assert grown.set_index("campaign").loc["full", "failures"] == full["failures"] > 0
    assert out["videos"] == 2  # the saved videos kept
    alone = write_report(folder, tmp_path / "alone")  # the grown folder alone makes the same report
    assert Path(alone["markdown"]).read_text() == md and alone["videos"] == 2
    assert "| full |" in md and "| safety-only |" in md
    again = write_report(folder, add=[runs / "full"])  # once more: replaced, not counted twice
    assert sorted(pd.read_parquet(folder / "report_data" / "runs.parquet")["campaign"]) == sorted(grown["campaign"])
    assert [ln for ln in Path(again["markdown"]).read_text().splitlines() if ln.startswith("|")] == \
        [ln for ln in md.splitlines() if ln.startswith("|")]
    other = tmp_path / "other-seed"  # the "full" campaign with seed 1: kept apart from the saved seed 0
    p = campaign(tmp_path, "full", seed=1, optimality=None)
    p.write_text(p.read_text().replace(f"output: {tmp_path / 'full'}", f"output: {other}"))
    run(p)
    write_report(folder, add=[other])
    names = set(pd.read_parquet(folder / "report_data" / "runs.parquet")["campaign"])
    assert {"full", "full@other-seed"} <= names and len(names) == len(grown) + 1
    saved = (folder / "report.md").read_text()
    (tmp_path / "not-a-run").mkdir()
    assert main(["report", str(folder), "--add", str(tmp_path / "not-a-run")]) == 2
    assert "not a run folder" in capsys.readouterr().err and (folder / "report.md").read_text() == saved


def assert_challengers_find_other_bugs(src: Path) -> set:
    """RQ1 (issue #17): per scenario and seed, Delta ran with a BC, a BCQ and a CQL challenger on one
    safety run (one D); each found bugs, and every pair of challengers found other bug states (the
    challenger enters the search). Returns the (scenario, seed) pairs checked."""
    runs = pd.read_parquet(src / "report_data" / "runs.parquet")
    bugs = pd.read_parquet(src / "report_data" / "bug_list.parquet")
    per = {c: {tuple(s) for s in g["initial_state"]} for c, g in bugs.groupby("campaign")}
    for (scenario, seed), g in runs.groupby(["scenario", "seed"]):
        assert sorted(g["challenger_algo"]) == ["bc", "bcq", "cql"] and g["safety_key"].nunique() == 1
        sets = {a: per.get(c, set()) for a, c in zip(g["challenger_algo"], g["campaign"])}
        assert all(sets.values()), (scenario, seed)
        assert sets["bc"] != sets["bcq"] and sets["bcq"] != sets["cql"] and sets["bc"] != sets["cql"], (scenario, seed)
    return set(runs.groupby(["scenario", "seed"]).groups)


@pytest.mark.slow
@pytest.mark.parametrize("folder", COMMITTED)
def test_committed_reports_are_made_from_committed_data(folder, tmp_path):
    """``deltarl report experiments/results/<folder>`` from the repository alone gives the
    committed report, with per-seed statistics (no copies counted as runs)."""
    src = REPO / "experiments" / "results" / folder
    out = write_report(src, tmp_path)
    assert Path(out["markdown"]).read_text() == (src / "report.md").read_text()
    md = (src / "report.md").read_text()
    assert "(n=" in md
    if src.name.startswith("delta-local"):  # runs without a challenger or bug videos: said so
        assert "What this report cannot show" in md
    if folder == "llmtester-table2":  # Table II from the committed data: every ACAS Xu run, the paper beside it
        assert "| llmtester | 1 | 212 | 149 | 13 | 25 | 1600 | 1524 | 908 | 0.17 |" in md
        assert "| mdpfuzz | 313.0 ± 24.8 (n=3) | 92 |" in md
        # issue #19: LLMTester w/o ms with the local model (seeds 0, 1, then 2; added with report --add)
        assert "| llmtester w/o ms | 1 | 254 | 118 | 11 | 13 | 1777 | 1728 | 513 | – |" in md  # α unused: "–"
        assert "| llmtester w/o ms | 2 | 196 | 63 | 9 | 14 | 1694 | 1637 | 324 | – |" in md
        assert "| llmtester w/o ms | the LLM's scenario | 4924 | 391 | 7.9% | 3 |" in md
        assert "LLM calls saved by the multi-scale strategy: 65.7% (583 calls per run with it, n=3; 1699" in md
        # issue #19: LLMTester on BipedalWalker with the local model (seeds 0, 1, then 2; added with report --add)
        assert "| llmtester | 0 | 314 | 52630 | 3 | 305 | 513 | 513 | 93 | 41.6 | 8616 |" in md
        assert "| llmtester | 1 | 308 | 52169 | 3 | 307 | 727 | 727 | 131 | 29.2 | 13710 |" in md
        assert "| llmtester | 2 | 269 | 45979 | 3 | 268 | 725 | 725 | 128 | 41.6 | 13980 |" in md
        assert "| llmtester | the LLM's scenario | 1965 | 281 | 14.3% | 3 |" in md
        # three seeds each: LLMTester against MDPFuzz with a test (no difference shown)
        assert "| failures | mdpfuzz | 297.0 ± 60.7 (n=3) | 313.0 ± 24.8 (n=3) | 0.95× | 3.0 | 0.700 | -0.86 |" in md
        # ... and w/o multi-scale (every fuzzing test from the LLM; seeds 1, 0, then 2, added with report --add)
        assert "| llmtester w/o ms | 0 | 299 | 54578 | 3 | 290 | 1228 | 1228 | 210 | – | 21457 |" in md
        assert "| llmtester w/o ms | 1 | 303 | 52855 | 3 | 299 | 1218 | 1218 | 199 | – | 20988 |" in md
        assert "| llmtester w/o ms | 2 | 279 | 48238 | 3 | 276 | 1193 | 1193 | 183 | – | 27355 |" in md
        assert "| llmtester w/o ms | the LLM's scenario | 3639 | 522 | 14.3% | 3 |" in md
        assert "LLM calls saved by the multi-scale strategy: 46.0% (655 calls per run with it, n=3; 1213" in md
    if folder == "archive/delta-rq1-local-CartPole-paper-aut":
        # issue #17: with the paper-quality AUT and the normalised energy, BC, BCQ and CQL find other bugs
        rows = [ln for ln in md.splitlines() if re.match(r"\| delta-rq1-00\d \|", ln)]
        assert len(rows) == 9
        assert assert_challengers_find_other_bugs(src) == {("CartPole-v1", s) for s in range(3)}
    if folder == "delta-paper-cases-rq2-rq3":
        # issue #17's re-run: 5 seeds x 7 methods on three scenarios, each term's share of the selections
        assert "105 campaigns on 3 scenario(s)" in md
        # CartPole: MDPFuzz finds more bugs than Delta (the answer, whichever it is, stays in the report)
        assert "| CartPole-v1 | bugs | 222.0 ± 14.0 (n=5) | mdpfuzz 282.6 ± 27.0 (n=5) | -21.4% | 0.012 |" in md
        assert "| delta w/o regret | 0.970 ± 0.006 (n=5) | 0.000 ± 0.000 (n=5) | 0.969 ± 0.011 (n=5) |" in md
    if folder == "delta-mujoco-local":
        # issue #18: the MuJoCo grid's local profile end to end, Hopper and Walker2d, 27 campaigns each;
        # Tables 3-4 under the BC challenger
        assert "54 campaigns on 2 scenario(s)" in md
        assert "| Walker2d-v5 | bugs | 158.0 ± 25.8 (n=3) | curefuzz 149.3 ± 25.4 (n=3) | +5.8% | 0.184 |" in md
        assert "| CQL | 1.6 ± 14.1 (n=3) | 3996.5 ± 68.5 |" in md  # CQL at 10k steps falls at once on Walker2d
        assert "| Hopper-v5 | bugs | 105.0 ± 52.9 (n=3) | mdpfuzz 101.3 ± 63.9 (n=3) | +3.6% | 1.000 |" in md
        assert "| CQL | 281.2 ± 284.9 (n=3) | 3173.8 ± 20.8 |" in md  # the weak laptop-budget CQL, as measured
    if folder == "delta-table7-hopper-noise-challengers":
        # issue #18: Table 7's top half (Delta with BCQ and CQL challengers, 3 seeds, statistical oracle):
        # no bug, and the AUT's success rate in the wind is reported beside the challengers'
        assert "6 campaigns on 1 scenario(s)" in md
        assert "| BCQ | 0.0 ± 0.0 (n=3) | 87.8 ± 23.3 |" in md and "| CQL | 0.0 ± 0.0 (n=3) | 65.2 ± 22.8 |" in md
        assert "| AUT (zoo:Hopper-Noise) | 3451.4 ± 21.3 (100 episodes) |  | 96.0 [90.2, 98.4] |  |" in md
    if folder == "delta-paper-cases-rq1":
        # issue #17's RQ1 at 5,000 cases: Delta with BC, BCQ, CQL, 5 seeds, three scenarios
        assert "45 campaigns on 3 scenario(s)" in md
        assert "| BCQ | 222.0 ± 14.0 (n=5) | 105.6 ± 17.7 |" in md  # the RQ2-RQ3 grid's Delta on CartPole
        assert len(assert_challengers_find_other_bugs(src)) == 15  # 3 scenarios x 5 seeds
    if folder == "delta-local-rq2-rq3":
        # 21 campaigns, 3 safety runs: each once; no effect size from a single run
        assert "| curefuzz | 600 | 28.0 ± 11.4 (n=3) | 26.0 ± 9.9 (n=3) |" in md
        assert "21 campaigns ran 3 distinct safety runs" in md
        # Delta against each ablation, not only the best one (issue #17: does removing a term change a metric?)
        for ablation in ("diversity", "inconsistency", "regret"):
            assert f"| bugs | delta w/o {ablation} | 208.7 ± 206.7 (n=3) |" in md
        assert "-40.43" not in md and "| distance | gmt | 0.141 ± 0.140 (n=2) | 0.787 (n=1) |" in md
        assert md.index("## The answer") < md.index("## All runs")
    for f in (src / "report_files").iterdir():
        assert f"report_files/{f.name}" in md


@pytest.mark.slow
def test_table7_cases_agree_with_their_campaigns():
    """The committed Hopper-Noise test cases (5 + 5 rollout returns each) give, under the oracle's
    own test, each campaign's bug count (the script exits naming the campaign when they disagree),
    and its table is the one the folder's README shows."""
    import runpy

    folder = REPO / "experiments" / "results" / "delta-table7-hopper-noise-summaries"
    mod = runpy.run_path(str(REPO / "benchmarks" / "table7_margins.py"))
    table = mod["table"](folder)
    rows = [ln for ln in table.splitlines() if ln.startswith("| delta-table7-")]
    assert len(rows) == len(list(folder.glob("*.cases.csv"))) == 18  # the whole grid's 18 campaigns
    readme = (folder / "README.md").read_text()
    assert all(row in readme for row in rows)


@pytest.mark.campaign
def test_report_cli(runs, tmp_path, capsys):
    from orchestrator.cli import main

    assert main(["report", str(runs / "safety-only"), "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "r" / "report.html").is_file() and "report.md" in printed and "report_data" in printed
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no run folder" in capsys.readouterr().err
    with pytest.raises(ReportError):
        write_report(tmp_path / "missing")


def test_state_heatmap_axes_fit_the_scenario():
    """MountainCar's velocity starts at 0 in every initial state: the figure is a bar chart over
    the position, not a heatmap with a made-up velocity axis."""
    from envs import get_scenario
    from orchestrator.analysis.figures import fig_state_heatmap, varying_dims

    mc = get_scenario("MountainCar-v0")
    assert varying_dims(mc) == [0]
    states = np.column_stack([np.random.default_rng(0).uniform(mc.low[0], mc.high[0], 50), np.zeros(50)])
    fig = fig_state_heatmap(states, mc, "t", "bugs")
    ax = fig.axes[0]
    assert ax.get_xlim() == (mc.low[0], mc.high[0]) and "velocity = 0" in ax.get_xlabel()
    assert sum(p.get_height() for p in ax.patches) == 50


def test_paper_numbers_reproduce_the_papers_percentages():
    """The transcription of Table 3 (experiments/papers/delta.yaml) gives back the improvement
    percentages the paper prints next to Delta."""
    from orchestrator.analysis.report import load_paper
    from orchestrator.analysis.stats import best_baseline, improvement

    t3 = load_paper()["table3"]
    printed = {("CartPole-v1", "bugs"): 46.7, ("MountainCar-v0", "bugs"): 91.5, ("Acrobot-v1", "bugs"): 40.9,
               ("Hopper-v5", "bugs"): 37.9, ("Walker2d-v5", "bugs"): 34.1,
               ("CartPole-v1", "distinct_bugs"): 71.6, ("MountainCar-v0", "distinct_bugs"): 19.3,
               ("Acrobot-v1", "distinct_bugs"): 401.5, ("Hopper-v5", "distinct_bugs"): 114.4,
               ("Walker2d-v5", "distinct_bugs"): 81.8, ("Acrobot-v1", "distance"): 61.9,
               ("Walker2d-v5", "distance"): 11.8, ("Hopper-Noise", "bugs"): 171.0}
    for (sc, metric), pct in printed.items():
        vals = t3[sc][metric]
        _, best = best_baseline({k: v[0] for k, v in vals.items() if k != "delta"})
        assert round(improvement(vals["delta"][0], best), 0 if sc == "Hopper-Noise" else 1) == pct, (sc, metric)
    assert np.isclose(t3["Acrobot-v1"]["bugs"]["delta"][0], 5450.0)


@pytest.mark.campaign
def test_report_gives_llmtesters_table2_layout_from_the_runs_figures(tmp_path):
    """Safety runs on ACAS Xu of random, MDPFuzz, LLMTester and LLMTester w/o ms, two seeds each
    (the LLM is the local test double): the report's Table II rows are the runs' own summary
    figures (mean ± CI over the two seeds), the paper's numbers beside them, LLM cost only for the
    LLM methods, the calls saved by multi-scale computed from the runs; the saved data makes the
    same report again; two runs of one campaign name stay apart."""
    import json

    from orchestrator.analysis.sections import cell
    from tests.llm_server import LLMStubServer

    methods = {"random": "{fuzzer: random}", "mdpfuzz": "{fuzzer: mdpfuzz}", "llmtester": "{fuzzer: llmtester}",
               "llmtester w/o ms": "{fuzzer: llmtester, params: {multi_scale: false}}"}
    runs_dir = tmp_path / "runs"
    with LLMStubServer(step=0.3) as srv:
        for i, (m, fz) in enumerate(methods.items()):
            for seed in (0, 1):
                p = tmp_path / f"c{i}{seed}.yaml"
                p.write_text(f"""
name: {"acas-llm" if m.startswith("llmtester") and seed == 0 else f"acas-{i}-{seed}"}
scenario: ACASXu
aut: python:workers.acasxu_policy:AcasXuDNN
workers: 0
seed: {seed}
output: {runs_dir / f"{i}-{seed}"}
mlflow: false
safety:
  fuzzer: {fz.split("fuzzer: ")[1].split(",")[0].rstrip("}")}
  {"params: {multi_scale: false}" if "w/o" in m else ""}
  budget: {{episodes: 64}}
  sampling_fraction: 0.25
  generation_size: 16
llm: {{base_url: "{srv.base_url}", model: stub-model, requests_per_minute: 6000, max_concurrent: 2, actors: 1}}
""")
                run(p)
    out = write_report(runs_dir, tmp_path / "rep", videos=0)
    md = Path(out["markdown"]).read_text()
    assert "### Safety testing in LLMTester's layout (Table II, Fig. 10)" in md
    summaries = {m: [json.loads((runs_dir / f"{i}-{s}" / "summary.json").read_text()) for s in (0, 1)]
                 for i, m in enumerate(methods)}
    paper = {"mdpfuzz": ["56", "43", "22", "20"], "llmtester": ["150", "43", "22", "29"]}
    for m, ss in summaries.items():
        row = next(line for line in md.splitlines() if line.startswith(f"| {m} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == cell([s["failures"] for s in ss])
        for j, k in enumerate(("entire", "initial", "terminal")):
            assert cells[3 + 2 * j] == cell([s["failure_states"][k] for s in ss])
        assert [cells[2], cells[4], cells[6], cells[8]] == paper.get(m, ["", "", "", ""])
        if m.startswith("llmtester"):
            assert cells[9] == cell([s["llm_calls"] for s in ss], digits=0) and cells[9] != "0 (n=2)"
        else:
            assert cells[9] == cells[10] == cells[11] == "–"
    assert all(s["failure_states"]["grid"] == "fixed" for ss in summaries.values() for s in ss)
    ms = np.mean([s["llm_calls"] for s in summaries["llmtester"]])
    wo = np.mean([s["llm_calls"] for s in summaries["llmtester w/o ms"]])
    assert wo > ms  # without the multi-scale strategy every fuzzing test asks the LLM
    assert f"LLM calls saved by the multi-scale strategy: {100 * (1 - ms / wo):.1f}%" in md and "paper: 5.27%." in md
    assert "LLMTester against the best other method" in md
    for m in ("llmtester", "llmtester w/o ms"):  # failing fuzzing tests by operator, pooled over the seeds
        ss = summaries[m]
        tests, fails = sum(s["llm_usable"] for s in ss), sum(s["llm_scenario_failures"] for s in ss)
        assert f"| {m} | the LLM's scenario | {tests} | {fails} |" in md
    assert sum(s["random_mutations"] for s in summaries["llmtester w/o ms"]) == 0
    assert "acas-llm@" in (tmp_path / "rep" / "report.md").read_text()  # both llmtester seeds 0 kept apart
    again = Path(write_report(tmp_path / "rep", tmp_path / "again", videos=0)["markdown"]).read_text()

    def table2(text):
        start = text.index("### Safety testing in LLMTester's layout")
        return text[start:text.index("\n### ", start + 1)]

    assert table2(again) == table2(md)  # from the saved report_data/ alone


def test_find_runs_skips_mlflows_artifact_store(tmp_path):
    # an interrupted grid has no results.parquet, so its report searches the folder; MLflow's copies of
    # summaries in mlartifacts/<run>/artifacts/ must not count as campaigns (seen: 22 "campaigns" for 8)
    from orchestrator.analysis.run_reader import find_runs
    from orchestrator.runs.layout import MLFLOW_ARTIFACTS

    run = tmp_path / "grid-000"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    copy = tmp_path / MLFLOW_ARTIFACTS / "0123abcd" / "artifacts"
    copy.mkdir(parents=True)
    (copy / "summary.json").write_text("{}")
    assert find_runs(tmp_path) == [run]
