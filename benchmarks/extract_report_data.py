"""One-off provenance script: the data behind the committed Delta grid reports, extracted from
those reports themselves (their run folders under ``runs/`` were never committed and are gone).

For each folder it reads the "Grid results (results.parquet)" table that the earlier report
printed (one row per campaign: the grid's axis values and each phase's headline figures), the
grid file's ``local`` profile for what no axis set, and the AUT's evaluation from the earlier
Table 1 (one evaluation, identical in every challenger card), and writes ``report_data/``
(:mod:`orchestrator.analysis.report_data`). ``deltarl report experiments/results/<folder>``
then makes the report again from the repository alone.

    .venv/bin/python benchmarks/extract_report_data.py      # run once, from the repository root

It reads each report as committed by the last commit that made it from the run folders
(``git show``), so running it again gives the same tables.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.analysis.report_data import GRID_JSON, from_grid_table  # noqa: E402
from orchestrator.campaign.grid import load_grid  # noqa: E402

FOLDERS = {  # folder: (grid file, where it ran, the commit of its last report made from the run folders)
    "delta-local-rq1": ("experiments/delta/rq1-challengers.yaml", "runs/grids/delta-rq1/local", "9acfc0b"),
    "delta-local-rq2-rq3": ("experiments/delta/rq2-rq3-methods.yaml", "runs/grids/delta-rq2-rq3/local", "9acfc0b"),
    "delta-local-table7": ("experiments/delta/rq-table7-hopper-noise.yaml", "runs/grids/delta-table7/local", "3c611df"),
}
# where each folder lives now (under experiments/results/): the superseded ones moved to archive/;
# their report_data keeps the source it was made with (the folder's name when it was made)
NOW = {"delta-local-rq1": "archive/delta-local-rq1", "delta-local-table7": "archive/delta-local-table7"}


def git_show(commit: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout


def old_report(folder: str, commit: str) -> str:
    return git_show(commit, f"experiments/results/{folder}/report.md")


def _value(text: str):
    t = text.strip()
    if t == "":
        return None
    if t.startswith("["):
        return ast.literal_eval(t)
    if t.startswith("{"):
        return t  # a grid axis set as a mapping: kept as the JSON string deltarl grid wrote
    try:
        f = float(t)
    except ValueError:
        return t
    return int(f) if f.is_integer() and "." not in t else f


def grid_table(md: str) -> pd.DataFrame:
    """The "Grid results" table of an earlier report as the DataFrame deltarl grid wrote."""
    rows = []
    for ln in md.split("## Grid results (results.parquet)", 1)[1].splitlines():
        if ln.startswith("|"):
            rows.append(ln)
        elif rows:  # the table ended
            break
    header = [h.strip() for h in rows[0].strip().strip("|").split("|")]
    out = []
    for ln in rows[2:]:
        cells = [c.strip() for c in ln.strip()[1:-1].split(" | ")]
        assert len(cells) == len(header), ln
        out.append({h: _value(c) for h, c in zip(header, cells)})
    return pd.DataFrame(out)


def aut_rows(md: str, grid: dict) -> list[dict]:
    """The AUT's evaluation per scenario from the earlier Table 1: its mean return (the CI printed
    there was over identical copies; the CI over episodes is not in the report) and its success
    rate over the card's evaluation episodes."""
    episodes = int(((grid["base"].get("challenger") or {}).get("eval_episodes")) or 100)
    rows = []
    for section in md.split("\n## ")[1:]:
        scenario = section.splitlines()[0].strip()
        for ln in section.splitlines():
            if ln.startswith("| AUT ("):
                cells = [c.strip() for c in ln.strip().strip("|").split("|")]
                mean = float(cells[1].split("±")[0])
                rate = float(cells[3].split("[")[0]) / 100
                aut = cells[0][len("AUT ("):-1]
                rows.append({"scenario": scenario, "role": "aut", "algo": "aut", "campaign": None,
                             "key": json.dumps([scenario, aut, episodes]), "mean_return": mean, "ci95_margin": None,
                             "success_rate": round(rate * episodes) / episodes, "episodes": episodes,
                             "training_wall_seconds": _aut_seconds(section)})
                break
    return rows


def _aut_seconds(section: str):
    for ln in section.splitlines():
        if ln.startswith("| AUT (") and ln.count("|") == 5:  # the training-time table: agent, trainings, seconds, share
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            try:
                return float(cells[2])
            except ValueError:
                return None
    return None


def main() -> None:
    for folder, (grid_file, output, commit) in FOLDERS.items():
        md = old_report(folder, commit)
        df = grid_table(md)
        with tempfile.TemporaryDirectory() as d:
            # the grid file as it was when the grid ran (the one in the tree may have changed since)
            (Path(d) / "grid.yaml").write_text(git_show(commit, grid_file))
            grid = load_grid(Path(d) / "grid.yaml", profile="local")
            (Path(d) / GRID_JSON).write_text(json.dumps(grid, default=str))
            data = from_grid_table(df, Path(d))
        agents = pd.concat([data.tables.get("agents", pd.DataFrame()), pd.DataFrame(aut_rows(md, grid))],
                           ignore_index=True)
        data.tables["agents"] = agents
        data.title = Path(output).name if Path(output).name != "local" else f"{grid['name']} (local profile)"
        data.source = (f"experiments/results/{folder} (grid {grid_file}, profile local, run in {output}; the run "
                       f"folders were not kept)")
        data.notes = [
            f"made from the committed data only: the per-campaign table of the report committed in {commit} "
            f"(every campaign's failures, bugs, distinct bugs, distance and challenger return) and the AUT's "
            f"evaluation from its Table 1 (mean return and success rate; the CI over the AUT's episodes was not "
            f"printed). The run folders ({output}/) were never committed, so these cannot be made again: failures "
            f"and bugs over time, the bug and failure initial-state grids, AUT vs challenger returns per test case, "
            f"the behaviour clusters (Table 6: they need the AUT's trajectories), the challengers' success rates "
            f"and training times (Fig. 4: in the challenger cards), and bug videos (they need the policies and "
            f"bugs.parquet). Re-run the grid (deltarl grid {grid_file} --profile local) and report on its folder "
            f"for those"]
        out = REPO / "experiments" / "results" / NOW.get(folder, folder)
        data.save(out)
        print(f"{out}/report_data: {len(data['runs'])} campaigns, {len(agents)} agent rows")


if __name__ == "__main__":
    main()
