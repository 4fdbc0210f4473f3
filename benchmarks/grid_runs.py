"""The grid side of the benchmarks that sweep methods x seeds over campaigns.

Such a benchmark keeps its sweep as data, ``experiments/benchmarks/<name>.yaml`` (a grid file:
base campaign, axes, profiles; see ``orchestrator/campaign/grid.py``), and runs it through the
grid machinery: :func:`load` reads the file with a profile and the benchmark's command-line
overrides, :func:`run` runs it (``run_grid``: every campaign a Ray task, finished ones skipped)
and hands back each campaign beside its run folder, from which the benchmark builds its table.

The grid's output folder is ``OUT/<profile>-<digest of the resolved grid>``, so a rerun with
other settings (budget, seeds, methods) never picks up campaigns of an earlier one: the grid
resumes by campaign index only.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

from orchestrator.analysis.stats import mean_ci
from orchestrator.campaign.grid import expand, load_grid, run_grid
from orchestrator.runs.layout import RunFolder

GRIDS = Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"


def grid_file(name: str) -> Path:
    return GRIDS / f"{name}.yaml"


def set_dotted(d: dict, dotted: str, value) -> None:
    """``d[a][b][c] = value`` for ``"a.b.c"`` (sections created when missing or null)."""
    *parents, last = dotted.split(".")
    for k in parents:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    d[last] = copy.deepcopy(value)


def load(name: str, profile: str | None = None, *, out: str | None = None, settings: dict | None = None,
         axes: dict | None = None, drop: tuple[str, ...] = ()) -> dict:
    """The grid ``name`` with ``profile``, then ``settings`` (dotted keys of the base campaign)
    and ``axes`` (replaced whole) applied, a value of None leaving the profile's; the sections
    named in ``drop`` are set to null (a phase not run)."""
    grid = load_grid(grid_file(name), profile=profile)
    for section in drop:
        grid["base"][section] = None
    for dotted, value in (settings or {}).items():
        if value is not None:
            set_dotted(grid["base"], dotted, value)
    for axis, values in (axes or {}).items():
        if values is not None:
            grid["axes"][axis] = list(values)
    root = Path(out) if out else Path(grid["output"]).parent  # load_grid appended /<profile>
    digest = hashlib.sha1(json.dumps([grid["base"], grid["axes"]], sort_keys=True, default=str).encode())
    grid["output"] = str(root / f"{grid.get('profile', 'default')}-{digest.hexdigest()[:8]}")
    return grid


def run(grid: dict) -> list[tuple[object, RunFolder]]:
    """Run the grid; ``(campaign, run folder)`` per point, in grid order. A failed campaign
    stops the benchmark (its table would silently miss runs) after all campaigns ran."""
    points = expand(grid)
    print(f"grid {grid['name']} ({grid.get('profile', 'no profile')}): {len(points)} campaigns -> {grid['output']}",
          file=sys.stderr, flush=True)
    df = run_grid(grid, progress=sys.stderr.isatty())
    failed = df[df["status"] != "done"]
    for r in failed.itertuples(index=False):
        print(f"{r.campaign} failed: {r.error}", file=sys.stderr)
    if len(failed):
        raise SystemExit(f"{len(failed)} of {len(df)} campaigns failed; their folders are under {grid['output']}")
    return [(c, RunFolder(c.output)) for _, c in points]


def group(runs: list, label) -> dict[str, list]:
    """``{label(campaign): [(campaign, run), ...]}`` in grid order."""
    out: dict[str, list] = {}
    for c, r in runs:
        out.setdefault(label(c), []).append((c, r))
    return out


def cell(values, digits: int = 1, *, margin: bool = True) -> str:
    """``mean ± 95% CI margin`` over the seeds (the margin left out for a single seed)."""
    m, h = mean_ci(values)
    return f"{m:.{digits}f}" + ("" if h != h or not margin else f" ± {h:.{digits}f}")
