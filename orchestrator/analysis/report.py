"""Reports: ``deltarl report RUN_OR_GRID_DIR [--out DIR]`` → ``report.md`` and one self-contained
``report.html`` (CSS inline, figures inlined as base64 PNG, no external URL).

What it reads (every part optional; a missing part is reported as "not in this run"):

* a **run folder** (``store.json``, ``campaign.json``, ``summary.json``, ``timeline.parquet``,
  ``challengers/*/card.json``, ``optimality_summary.json``, ``optimality_timeline.parquet``,
  ``bugs.parquet``, ``episodes/``, ``steps/``);
* a **grid folder** (``results.parquet`` from ``deltarl grid``): its table as is, then the
  campaigns' run folders aggregated as below;
* any other **folder of run folders** (e.g. ``benchmarks/optimality_comparison.py``'s output):
  the run folders found beneath it (up to three levels), aggregated.

Aggregated runs are grouped by scenario and method (the fuzzer, with Delta's ablations as
``delta w/o regret``); each cell is the mean ± 95% CI margin over the runs (seeds), as the
papers print them. Tables follow the Delta paper's layout (Table 1: AUT and challengers; Table
2: challengers as the oracle; Tables 3–4: Delta against the baselines and its ablations, with
the improvement over the best baseline and a two-sided Mann–Whitney U test and Cohen's d of
Delta against it; Table 6: behaviour clusters), with the paper's numbers
(``experiments/papers/delta.yaml``) beside ours. Plots: failures and bugs over time, bugs and
failures over the initial-state grid (the first two state dimensions), AUT vs challenger returns
per test case, and the behaviour dendrogram (:mod:`orchestrator.analysis.behaviour`).

The parts, each its own module (every public name is importable from here too):
:mod:`~orchestrator.analysis.run_reader` (what is read from run folders, through
:class:`~orchestrator.runs.layout.RunFolder`), :mod:`~orchestrator.analysis.sections` (the
tables and text), :mod:`~orchestrator.analysis.figures` (matplotlib),
:mod:`~orchestrator.analysis.document` (Markdown and HTML rendering).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.analysis.document import CSS, Doc
from orchestrator.analysis.figures import fig_dendrogram, fig_over_time, fig_returns_scatter, fig_state_heatmap
from orchestrator.analysis.run_reader import Run, find_runs, is_run, method_label, read_parquet
from orchestrator.analysis.sections import (
    BASELINES,
    METRICS,
    NOT_IN_RUN,
    section_behaviour,
    section_figures,
    section_grid,
    section_optimality,
    section_single,
    section_table1,
    section_training_time,
)
from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import atomic_write_bytes
from workers.resources import resource

__all__ = [
    "BASELINES", "CSS", "METRICS", "NOT_IN_RUN", "PAPER_FILE", "Doc", "ReportError", "Run", "build", "fig_dendrogram",
    "fig_over_time", "fig_returns_scatter", "fig_state_heatmap", "find_runs", "is_run", "load_paper", "method_label",
    "section_behaviour", "section_figures", "section_grid", "section_optimality", "section_single", "section_table1",
    "section_training_time", "write_report",
]

PAPER_FILE = resource("papers", "delta.yaml")
GRID_RESULTS = "results.parquet"  # what deltarl grid writes into a grid folder


class ReportError(ValueError):
    """A folder that holds nothing to report on."""


def load_paper() -> dict:
    return yaml.safe_load(PAPER_FILE.read_text()) if PAPER_FILE.is_file() else {}


def _run_dirs(root: Path, grid_df, single: bool) -> list[Path]:
    """The run folders to report on: ``root`` itself, a grid's campaigns, or those found below."""
    if single:
        return [root]
    found = find_runs(root)
    if grid_df is None:
        return found
    named = [root / str(c) for c in grid_df.get("campaign", [])]
    return [d for d in named if d.is_dir() and is_run(d)] or found


def _no_runs(root: Path) -> ReportError:
    f = RunFolder(root)
    markers = [f.store_json, f.campaign_json, f.summary_json("safety"), f.summary_json("optimality")]
    return ReportError(f"{root} holds no run folder ({', '.join(p.name for p in markers)} or {f.results_json.name}) "
                       f"and no grid {GRID_RESULTS}")


def build(path: str | Path, *, max_sequences: int = 300) -> Doc:
    """The report of a run folder, a grid folder or a folder of run folders."""
    root = Path(path)
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder")
    paper = load_paper()
    grid_df = read_parquet(root / GRID_RESULTS)
    single = grid_df is None and is_run(root)
    runs = [Run.load(d) for d in _run_dirs(root, grid_df, single)]
    if not runs and grid_df is None:
        raise _no_runs(root)
    kind = "run" if single else "grid" if grid_df is not None else "collection"
    doc = Doc(f"deltarl report: {runs[0].name if single else root.name}")
    doc.p(f"Folder `{root}` ({'a run folder' if single else 'a grid' if kind == 'grid' else 'a folder of runs'}"
          f"{'' if single else f', {len(runs)} run folders'}), made by `deltarl report`. Cells are mean ± 95% CI "
          f"margin; \"paper\" columns are the Delta paper's published numbers ({paper.get('source', 'n/a')}, "
          f"`experiments/papers/delta.yaml`).")
    if single:
        r = runs[0]
        doc.p(f"Scenario **{r.scenario}**, AUT `{r.aut}`, seed {r.seed}.")
        section_single(doc, r)
    if grid_df is not None:
        section_grid(doc, grid_df)
    for sc in sorted({r.scenario for r in runs if r.scenario}):
        group = [r for r in runs if r.scenario == sc]
        doc.h(sc if not single else f"{sc}: tables and figures", 2)
        section_table1(doc, group, sc, paper)
        section_optimality(doc, group, sc, paper)
        section_behaviour(doc, group, sc, paper, max_sequences)
        section_figures(doc, group, sc)
    return doc


def write_report(path: str | Path, out: str | Path | None = None, *, max_sequences: int = 300) -> dict:
    """Build the report of ``path`` and write ``report.md`` (figures in ``report_files/``) and the
    self-contained ``report.html`` into ``out`` (default: ``path``)."""
    doc = build(path, max_sequences=max_sequences)
    out = Path(out) if out is not None else Path(path)
    out.mkdir(parents=True, exist_ok=True)
    fig_dir = out / "report_files"
    images = doc.images()
    if images:
        fig_dir.mkdir(exist_ok=True)
        for name, png in images:
            atomic_write_bytes(fig_dir / f"{name}.png", png)
    atomic_write_bytes(out / "report.md", doc.markdown("report_files").encode())
    atomic_write_bytes(out / "report.html", doc.html().encode())
    return {"markdown": str(out / "report.md"), "html": str(out / "report.html"), "figures": len(images),
            "tables": sum(1 for b in doc.blocks if b[0] == "table")}
