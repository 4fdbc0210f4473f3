"""Coverage curves for the natural (unplanted) benchmark (issue 51): distinct bug cells found
against test cases, on grids fine enough not to saturate, from a committed Delta report's data.

    python benchmarks/coverage_curves.py experiments/results/delta-paper-cases-rq2-rq3 \
        [--bins 5 10 20] [--out experiments/results/delta-paper-cases-coverage]

Reads ``report_data/cases.parquet`` (every test case of every campaign, in order, with its
verdict), ``bug_list.parquet`` (each bug's initial state, in the same order) and ``runs.parquet``
(scenario, method, seed of each campaign). A bug's cell is its initial state binned into
``bins`` equal intervals per dimension of the scenario's initial-state box (dimensions of zero
width ignored). Printed, per scenario and grid: how many cells the union of every method's bugs
holds and its share of the grid (saturation), and per method the mean ± sd over seeds of the
cells found after 25%, 50% and 100% of the test cases. With ``--out``: the table (``README.md``),
the curves as Parquet and one PNG per scenario (finest grid, mean over seeds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cells(states: np.ndarray, low: np.ndarray, high: np.ndarray, bins: int) -> np.ndarray:
    """Each state's cell index on a ``bins``-per-dimension grid of the box (flat index)."""
    live = high > low
    frac = (states[:, live] - low[live]) / (high[live] - low[live])
    idx = np.clip((frac * bins).astype(np.int64), 0, bins - 1)
    return np.ravel_multi_index(idx.T, (bins,) * int(live.sum())) if live.any() else np.zeros(len(states), np.int64)


def curves(folder: Path, bins_list: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (campaign, bins): distinct cells after each test case (at the 100 evenly spaced case
    counts), and the per-(scenario, bins) union of cells over every campaign."""
    from envs import get_scenario

    data = folder / "report_data"
    cases = pd.read_parquet(data / "cases.parquet", columns=["campaign", "bug"])
    bugs = pd.read_parquet(data / "bug_list.parquet", columns=["campaign", "bug_id", "initial_state"])
    runs = pd.read_parquet(data / "runs.parquet", columns=["campaign", "scenario", "method", "seed"])
    rows, union = [], []
    for (scenario,), group in runs.groupby(["scenario"]):
        sc = get_scenario(scenario)
        low, high = np.asarray(sc.low, float), np.asarray(sc.high, float)
        seen_all: dict[int, set[int]] = {bins: set() for bins in bins_list}
        for run in group.itertuples():  # each campaign's verdicts and bug states read once
            flags = cases.loc[cases.campaign == run.campaign, "bug"].to_numpy(bool)
            mine = bugs[bugs.campaign == run.campaign].sort_values("bug_id")
            if len(mine) != flags.sum():
                raise SystemExit(f"{run.campaign}: {flags.sum()} bug verdicts in cases.parquet but {len(mine)} "
                                 f"rows in bug_list.parquet: the data is not from one report")
            states = np.stack(mine.initial_state.to_numpy()).astype(float) if len(mine) else np.empty((0, len(low)))
            case_of_bug = np.flatnonzero(flags) + 1  # 1-based test case of each bug
            at = np.linspace(len(flags) / 100, len(flags), 100).round().astype(int)
            for bins in bins_list:
                cell = cells(states, low, high, bins)
                seen_all[bins].update(cell.tolist())
                first = pd.Series(case_of_bug).groupby(cell).min().to_numpy()  # first case of each cell
                rows += [(scenario, bins, run.method, run.seed, int(x), int((first <= x).sum())) for x in at]
        live = int((high > low).sum())
        union += [(scenario, bins, bins ** live, len(seen_all[bins])) for bins in bins_list]
    cols = ["scenario", "bins", "method", "seed", "cases", "cells"]
    return (pd.DataFrame(rows, columns=cols),
            pd.DataFrame(union, columns=["scenario", "bins", "grid_cells", "union_cells"]))


def table(curve: pd.DataFrame, union: pd.DataFrame) -> str:
    lines = []
    for (scenario, bins), g in curve.groupby(["scenario", "bins"]):
        u = union[(union.scenario == scenario) & (union.bins == bins)].iloc[0]
        n = g.cases.max()
        lines += [f"\n### {scenario}, {bins} bins per dimension ({u.grid_cells:,} cells; every method's bugs "
                  f"together: {u.union_cells:,}, {u.union_cells / u.grid_cells:.1%} of the grid)\n",
                  f"| method | seeds | cells at {n // 4:,} cases | at {n // 2:,} | at {n:,} | at {n:,}, share of the union |",
                  "|---|---:|---:|---:|---:|---:|"]
        for method, m in g.groupby("method"):
            at = {x: m[m.cases == x].cells for x in (n // 4, n // 2, n)}
            cell = [f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" if len(v) > 1 else f"{v.mean():.1f}" for v in at.values()]
            lines.append(f"| {method} | {m.seed.nunique()} | {' | '.join(cell)} | {at[n].mean() / u.union_cells:.1%} |")
    return "\n".join(lines)


def plot(curve: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    finest = curve.bins.max()
    for scenario, g in curve[curve.bins == finest].groupby("scenario"):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for method, m in g.groupby("method"):
            mean = m.groupby("cases").cells.mean()
            ax.plot(mean.index, mean.values, label=method)
        ax.set(xlabel="test cases", ylabel=f"distinct bug cells ({finest} bins per dimension)",
               title=f"{scenario}: bug cells found, mean over seeds")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"coverage-{scenario}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a committed Delta report folder (with report_data/)")
    ap.add_argument("--bins", type=int, nargs="+", default=[5, 10, 20])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not (args.folder / "report_data" / "cases.parquet").is_file():
        print(f"coverage_curves: {args.folder} has no report_data/cases.parquet: give a committed report folder "
              f"such as experiments/results/delta-paper-cases-rq2-rq3", file=sys.stderr)
        return 2
    curve, union = curves(args.folder, args.bins)
    text = table(curve, union)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        curve.to_parquet(args.out / "curves.parquet", index=False)
        union.to_parquet(args.out / "union.parquet", index=False)
        plot(curve, args.out)
        head = (f"# Bug cells against test cases on finer grids (issue 51)\n\nPrinted by `python benchmarks/"
                f"coverage_curves.py {args.folder.as_posix()} --bins {' '.join(map(str, args.bins))} --out "
                f"{args.out.as_posix()}` from the committed report data (`report_data/cases.parquet`, "
                f"`bug_list.parquet`, `runs.parquet`); the curves are in `curves.parquet` and the PNGs beside "
                f"this file. A cell: a bug's initial state binned into equal intervals per dimension of the "
                f"scenario's initial-state box. Mean ± sd over seeds.\n")
        (args.out / "README.md").write_text(head + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
