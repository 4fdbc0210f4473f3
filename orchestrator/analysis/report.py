"""Reports: ``deltarl report RUN_OR_GRID_DIR [--out DIR]`` → ``report.md``, one self-contained
``report.html`` (CSS inline, figures and bug GIFs inlined as base64, no external URL) and the
data behind them, ``report_data/`` (small Parquet tables, :mod:`~orchestrator.analysis.report_data`),
so that a committed results folder is reported again from the repository alone.

What it reads (every part optional; a missing part is reported as such):

* a **run folder** (``campaign.json``, the phase summaries and timelines, ``challengers/*/card.json``,
  ``bugs.parquet``, ``failures.parquet``, ``episodes/``, ``steps/``);
* a **grid folder** (``results.parquet`` from ``deltarl grid``) and its campaigns' run folders;
* any other **folder of run folders** (up to three levels down);
* a folder holding only an earlier report's ``report_data/`` (or only a grid's ``results.parquet``).

The report leads with the answer: Delta against the best baseline on every scenario, ours beside
the paper's (``experiments/papers/delta.yaml``), and the bugs over time. Then, per scenario,
LLMTester's Table II layout where safety runs of its scenarios or of LLMTester are present
(:mod:`~orchestrator.analysis.llmtester_tables`, ``experiments/papers/llmtester.yaml``), the
tables in the Delta paper's layout (Tables 2–4 with Mann–Whitney U and Cohen's d of Delta against
the best other method; Table 1 and Fig. 4; the safety failures; Table 6's behaviour clusters), the
bugs one can watch (GIFs of the AUT's and the challenger's episodes from the top bugs' states),
and the figures (failures over time, bugs and failures over the initial-state grid, AUT vs
challenger returns per test case). Every campaign's raw numbers come last.

Statistics count independent units (seeds): an optimality run is one unit, a safety run or
challenger shared by several campaigns of a grid is one unit; each cell says its n.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import yaml

from orchestrator.analysis.document import CSS, Doc
from orchestrator.analysis.llmtester_tables import load_paper as load_llmtester_paper
from orchestrator.analysis.llmtester_tables import section_table2
from orchestrator.analysis.report_data import DATA_DIR, ReportData, ReportError, add_runs, collect
from orchestrator.analysis.sections import (
    BASELINES,
    METRICS,
    NOT_IN_RUN,
    figure_bugs_over_time,
    figure_runs,
    optimality_units,
    section_all_runs,
    section_answer,
    section_answer_challengers,
    section_behaviour,
    section_figures,
    section_optimality,
    section_single,
    section_table1,
    section_videos,
)
from orchestrator.runs.store import atomic_write_bytes
from workers.resources import resource

log = logging.getLogger(__name__)

__all__ = ["BASELINES", "CSS", "DATA_DIR", "METRICS", "NOT_IN_RUN", "PAPER_FILE", "Doc", "ReportData", "ReportError",
           "build", "load_paper", "make_videos", "write_report"]

PAPER_FILE = resource("papers", "delta.yaml")
FILES = "report_files"


def load_paper() -> dict:
    return yaml.safe_load(PAPER_FILE.read_text()) if PAPER_FILE.is_file() else {}


def _scenario(name: str):
    from envs import get_scenario

    try:
        return get_scenario(name)
    except Exception as exc:  # noqa: BLE001 - a plug-in scenario not installed here: no grid figures
        log.debug("scenario %s unavailable here (%s: %s): no grid figures", name, type(exc).__name__, exc)
        return None


def make_videos(data: ReportData, per_scenario: int = 2, *, max_frames: int = 60, skip=()) -> dict:
    """Render the top ``per_scenario`` bugs of each scenario (largest challenger-over-AUT margin,
    among the Delta runs when there are any) as side-by-side GIFs; adds them to
    ``data.tables["videos"]`` and returns ``{file name: GIF bytes}``. Needs the run folders (the
    policies): only the bugs of runs in ``data.run_dirs`` are candidates, and scenarios in
    ``skip`` (those with saved videos) get none; a scenario that cannot render is noted, not fatal."""
    import numpy as np

    from workers.policies import load_policy
    from workers.render import gif_bytes, render_episodes, side_by_side_frames
    from workers.rollout import episode_seeds

    if per_scenario <= 0 or not data.run_dirs or not data.has("bug_list"):
        return {}
    from orchestrator.analysis.run_reader import Run

    rows, gifs = [], {}
    bugs = data["bug_list"]
    for sc in sorted(set(data["runs"]["scenario"].dropna()) - set(skip)):
        units = optimality_units(data["runs"], sc)
        focus = units[units["method"] == "delta"] if (units["method"] == "delta").any() else units
        b = bugs[bugs["campaign"].isin(focus["campaign"]) & bugs["campaign"].isin(list(data.run_dirs))].copy()
        if b.empty:
            continue
        b["margin"] = b["ca_return"] - b["aut_return"]
        for _, bug in b.sort_values(["margin", "campaign", "bug_id"], ascending=[False, True, True]).head(
                per_scenario).iterrows():
            run = Run.load(data.run_dirs[bug["campaign"]])
            try:
                scenario = run.scenario_obj()
                verdict = run.folder.bugs()
                row = verdict[verdict["bug_id"] == int(bug["bug_id"])].iloc[0]
                pols = {"AUT": load_policy(run.aut, scenario),
                        "challenger": load_policy(run.folder.resolve(run.optimality.get("challenger")), scenario)}
                seed = int(episode_seeds(int(row["gen_seed"]), np.array([int(row["state_index"])]), np.array([0]))[0])
                eps = render_episodes(scenario, pols, np.asarray(row["initial_state"], float), seed,
                                      max_frames=max_frames)
            except Exception as exc:  # noqa: BLE001 - RenderError or another: a report without a video is still one
                data.notes.append(f"bug {int(bug['bug_id'])} of {bug['campaign']}: no video ({type(exc).__name__}: "
                                  f"{str(exc)[:200]})")
                continue
            name = f"bug-{bug['campaign']}-{int(bug['bug_id'])}.gif"
            title = f"{sc} bug {int(bug['bug_id'])} of {bug['campaign']}"
            gifs[name] = gif_bytes(side_by_side_frames(eps, title=title), fps=12)
            e = dict(eps)
            rows.append({"scenario": sc, "campaign": bug["campaign"], "bug_id": int(bug["bug_id"]), "file": name,
                         "aut_return": e["AUT"].total, "ca_return": e["challenger"].total,
                         "aut_length": e["AUT"].length, "ca_length": e["challenger"].length})
    if rows:
        data.tables["videos"] = pd.concat([data["videos"], pd.DataFrame(rows)], ignore_index=True)
    return gifs


def build(path: str | Path, *, max_sequences: int = 300, videos: int = 2, data: ReportData | None = None,
          gifs: dict | None = None) -> Doc:
    """The report of a run folder, a grid folder, a folder of run folders or a saved ``report_data/``."""
    root = Path(path)
    if data is None:
        data = collect(root, max_sequences=max_sequences)
        gifs = make_videos(data, videos)
    gifs = gifs if gifs is not None else _saved_gifs(root, data)
    paper = load_paper()
    runs = data["runs"]
    single = data.kind == "run"
    doc = Doc(f"deltarl report: {data.title}")
    n_scen = runs["scenario"].nunique()
    what = "a run folder" if single else "a grid" if data.kind == "grid" else "a folder of runs"
    # data saved without its run folders, with or without run folders added to it: the same words,
    # so that the folder alone makes the same report again
    src = "" if data.from_runs else f" from the data saved beside it (`{DATA_DIR}/`)"
    doc.p(f"`{data.source}`: {what}" + ("" if single else f", {len(runs)} campaigns on {n_scen} scenario(s)") + src
          + ". Cells are mean ± 95% CI margin over independent runs with their n (a safety run or challenger that "
            "several campaigns share counts once); \"paper\": the Delta paper's numbers "
            f"({paper.get('source', 'n/a')}, 5 runs of two hours each).")
    if single:
        r = runs.iloc[0]
        doc.p(f"Scenario **{r['scenario']}**, AUT `{r['aut']}`, seed {r['seed']}.")
        section_single(doc, data)
    answered = section_answer(doc, data, paper) or section_answer_challengers(doc, data, paper)
    scenarios = sorted(runs["scenario"].dropna().unique())
    if answered:
        for sc in scenarios:
            figure_runs(doc, data, sc)
            figure_bugs_over_time(doc, data, sc)
    llm_paper = load_llmtester_paper()
    for sc in scenarios:
        doc.h(sc if not single else f"{sc}: tables and figures", 2)
        section_table2(doc, data, sc, llm_paper)
        section_optimality(doc, data, sc, paper)
        if not answered:  # the key plots right after the comparison
            if len(optimality_units(runs, sc)) > 1:
                figure_runs(doc, data, sc)
            figure_bugs_over_time(doc, data, sc)
        section_videos(doc, data, sc, gifs)
        section_table1(doc, data, sc, paper)
        section_behaviour(doc, data, sc, paper)
        section_figures(doc, data, sc, _scenario(sc))
    if not single:
        section_all_runs(doc, data)
    if data.notes:
        doc.h("What this report cannot show", 2)
        for n in data.notes:
            doc.p(n[0].upper() + n[1:] + ("" if n.endswith(".") else "."))
    return doc


def _saved_gifs(root: Path, data: ReportData) -> dict:
    v = data["videos"]
    out = {}
    for f in (v["file"] if not v.empty else []):
        p = root / FILES / f
        if p.is_file():
            out[f] = p.read_bytes()
    return out


def write_report(path: str | Path, out: str | Path | None = None, *, max_sequences: int = 300,
                 videos: int = 2, add=()) -> dict:
    """Build the report of ``path`` (with the run folders ``add`` added: :func:`add_runs`) and
    write ``report.md`` (figures in ``report_files/``), the self-contained ``report.html`` and the
    data behind them (``report_data/``) into ``out`` (default: ``path``)."""
    path = Path(path)
    data = collect(path, max_sequences=max_sequences)
    gifs = make_videos(data, videos) if data.run_dirs else _saved_gifs(path, data)
    if add:
        data = add_runs(data, add, max_sequences=max_sequences)
        saved = set(data["videos"]["scenario"]) if data.has("videos") else set()
        gifs.update(make_videos(data, videos, skip=saved))
    doc = build(path, data=data, gifs=gifs)
    out = Path(out) if out is not None else path
    out.mkdir(parents=True, exist_ok=True)
    fig_dir = out / FILES
    images = doc.images()
    keep = {name for name, _ in images}
    if fig_dir.is_dir():
        for old in fig_dir.iterdir():  # figures of an earlier report that this one no longer draws
            if old.is_file() and old.name not in keep and old.suffix in (".png", ".gif"):
                old.unlink()
    if images:
        fig_dir.mkdir(exist_ok=True)
        for name, data_bytes in images:
            atomic_write_bytes(fig_dir / name, data_bytes)
    elif fig_dir.is_dir() and not any(fig_dir.iterdir()):
        fig_dir.rmdir()
    data.save(out)
    atomic_write_bytes(out / "report.md", doc.markdown(FILES).encode())
    atomic_write_bytes(out / "report.html", doc.html().encode())
    return {"markdown": str(out / "report.md"), "html": str(out / "report.html"), "figures": len(images),
            "tables": sum(1 for b in doc.blocks if b[0] == "table"), "data": str(out / DATA_DIR),
            "videos": sum(1 for name, _ in images if name.endswith(".gif"))}
