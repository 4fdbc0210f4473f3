"""Reports: built from small real runs (no Ray), rendered by headless Chromium.

Chromium is required: the Debian package (``apt-get update && apt-get install -y chromium``).
Without it these tests fail, naming that command.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis.report import NOT_IN_RUN, ReportError, write_report

APT = "apt-get update && apt-get install -y chromium"
RENDER_CHECK = """<script>window.addEventListener("load", function () {
  function bottomRowOpaque(i) {  // share of opaque pixels in the image's last row: 0 when not decoded to the end
    var c = document.createElement("canvas"); c.width = i.naturalWidth; c.height = i.naturalHeight;
    if (!c.width || !c.height) return 0;
    var g = c.getContext("2d"); g.drawImage(i, 0, 0);
    var px = g.getImageData(0, c.height - 1, c.width, 1).data, n = 0;
    for (var k = 3; k < px.length; k += 4) if (px[k] > 0) n++;
    return n / c.width;
  }
  var r = {images: [].map.call(document.images, function (i) {
             return [i.naturalWidth, i.naturalHeight, i.complete && bottomRowOpaque(i) > 0.9]; }),
           tables: [].map.call(document.querySelectorAll("table"), function (t) { return t.rows.length; })};
  var e = document.createElement("pre"); e.id = "render-check"; e.textContent = JSON.stringify(r);
  document.body.appendChild(e);
});</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"headless Chromium is needed to check the HTML report and was not found; install it with: {APT}")


def render(html_file: Path, tmp: Path) -> tuple[dict, str, Path]:
    """Open a copy of the report (plus a script that records image sizes and table rows on load)
    in headless Chromium: (that record, the DOM after load, a screenshot)."""
    exe = chromium()
    page = tmp / "check.html"
    page.write_text(html_file.read_text().replace("</body>", RENDER_CHECK + "</body>"))
    common = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
              f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=10000"]
    dom = subprocess.run(common + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=90).stdout
    shot = tmp / "shot.png"
    subprocess.run(common + ["--window-size=1200,2400", f"--screenshot={shot}", html_file.as_uri()],
                   capture_output=True, text=True, timeout=90)
    m = re.search(r'<pre id="render-check">(.*?)</pre>', dom)
    assert m, f"the page did not load in Chromium; DOM starts: {dom[:300]!r}"
    return json.loads(m.group(1)), dom, shot


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


def test_report_of_a_run_renders_in_chromium(runs, tmp_path):
    out = write_report(runs / "full", tmp_path / "out")
    md = Path(out["markdown"]).read_text()
    html = Path(out["html"]).read_text()
    summary = json.loads((runs / "full" / "optimality_summary.json").read_text())
    # the tables: the run's phases, Table 3's layout with the paper's Delta row for CartPole beside ours
    assert (f"| delta | 1 | {summary['bugs']} | 105.6 ± 17.7 (+46.7%) | {summary['distinct_bugs']} | "
            f"81.0 ± 9.8 (+71.6%) |") in md
    assert "| curefuzz | 1 | 48 |" in md and "77.4 ± 10.3" in md  # safety: 48 episodes, paper's CureFuzz failures
    assert "| 0.10 |" in md and "100.2 ± 15.2" in md  # behaviour clusters beside Table 6
    assert f"Challengers: {NOT_IN_RUN}" in md or f"Challengers and safety testing: {NOT_IN_RUN}" in md
    for name in ("safety-over-time", "optimality-over-time", "bugs-grid", "failures-grid", "returns", "dendrogram"):
        assert any(f.name.startswith(name) for f in (tmp_path / "out" / "report_files").iterdir()), name
        assert f"report_files/{name}" in md
    # self-contained: no external URL, every image inline
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", html) and "<link" not in html
    assert html.count('src="data:image/png;base64,') == out["figures"] == 6
    check, dom, shot = render(Path(out["html"]), tmp_path)
    assert len(check["images"]) == 6 and all(w > 100 and h > 100 and ok for w, h, ok in check["images"])
    assert check["tables"] == [4, 2, 2, 4]  # phases, safety, Table 3, Table 6: header + body rows
    assert f"<td class=\"l\">delta</td><td class=\"r\">1</td><td class=\"r\">{summary['bugs']}</td>" in dom
    from matplotlib.image import imread

    img = imread(shot)
    assert img.shape[0] > 1000 and img[..., :3].std() > 0.05  # a page with content, not a blank screen


def test_report_degrades_gracefully_on_a_safety_only_run(runs, tmp_path):
    out = write_report(runs / "safety-only", tmp_path)
    md = Path(out["markdown"]).read_text()
    assert f"Optimality testing: {NOT_IN_RUN}" in md and f"Behaviour clustering: {NOT_IN_RUN}" in md
    assert f"| optimality | {NOT_IN_RUN} |" in md and "optimality timeline: not in this run" in md
    assert out["figures"] == 2  # failures over time and over the grid
    check, _, _ = render(Path(out["html"]), tmp_path)
    assert len(check["images"]) == 2 and all(w > 0 for w, _, _ in check["images"])


def test_report_of_a_grid_folder(runs, tmp_path):
    from orchestrator.analysis.stats import mann_whitney

    out = write_report(runs / "grid", tmp_path)
    md = Path(out["markdown"]).read_text()
    assert "## Grid results (results.parquet)" in md and "| g-000 |" in md
    df = pd.read_parquet(runs / "grid" / "results.parquet")
    d, r = df[df["optimality.fuzzer"] == "delta"], df[df["optimality.fuzzer"] == "random"]
    # Delta against the only baseline: its Mann–Whitney p over the two seeds, as scipy gives it
    u, p = mann_whitney(d["bugs"], r["bugs"])
    line = next(ln for ln in md.splitlines() if ln.startswith("| bugs | random |"))
    assert line.split(" | ")[5:7] == [f"{u:.1f}", f"{p:.3f}"]
    line = next(ln for ln in md.splitlines() if ln.startswith("| random | 2 |"))
    assert f"{r['bugs'].mean():.1f} ± " in line
    check, dom, _ = render(Path(out["html"]), tmp_path)
    assert check["images"] and all(w > 0 for w, _, _ in check["images"])
    assert check["tables"][0] == 5  # the grid's table: header + four campaigns
    assert "Grid results (results.parquet)" in dom


def test_report_cli(runs, tmp_path, capsys):
    from orchestrator.cli import main

    assert main(["report", str(runs / "safety-only"), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.html").is_file() and "report.md" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no run folder" in capsys.readouterr().err
    with pytest.raises(ReportError):
        write_report(tmp_path / "missing")


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
