"""Diversity of the failures a campaign found, as LLMTester's Table II counts it.

The failing episodes are read back from the run's store (they are the replays: deltarl keeps
every step); only the confirmed failures count (a candidate that did not fail with the AUT acting
alone is flaky, not a failure). Their observations are the ones the search recorded: for an
agent whose actions depend on the batch (BipedalWalker's PPO: the last bits of an action,
amplified by Box2D over 600 steps) the episode replayed alone fails too but may take another
path; a phase run with ``inference: alone`` records exactly the deployed episodes. Each
observation dimension is cut into ``intervals`` equal parts; a state is the
tuple of its parts. The counts are the distinct states over

* ``entire``   — every observation of every failing episode (the final one included),
* ``initial``  — the first observation of each failing episode,
* ``terminal`` — the last observation of each failing episode (the failure scene).

The grid. Two methods are comparable only when their failures are counted on the same grid, so
a scenario that declares observation bounds (:meth:`envs.base.Scenario.diversity_bounds`: ACAS
Xu, BipedalWalker, CoopNavi, the Table II scenarios) is counted between those fixed bounds,
for every method and seed alike (``"grid": "fixed"``; values outside fall into the edge parts).
Other scenarios fall back to a grid between the minimum and maximum observed in the run's own
failing episodes (``"grid": "fitted"``), which differs from run to run: such counts compare
runs only loosely.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envs.base import count_distinct_rows, grid_index
from orchestrator.runs.layout import SAFETY_PHASES, RunFolder
from orchestrator.runs.store import RunStore


def state_diversity(trajectories: list[np.ndarray], intervals: int = 10, bounds=None) -> dict:
    """Distinct entire / initial / terminal states of ``trajectories`` (each (T + 1, obs_dim)),
    on the grid between ``bounds`` = (low, high) per observation dimension, or (None) between
    the minimum and maximum of the trajectories themselves."""
    grid = "fitted" if bounds is None else "fixed"
    trajs = [np.asarray(t, dtype=np.float64).reshape(len(t), -1) for t in trajectories if len(t)]
    if not trajs:
        return {"episodes": 0, "entire": 0, "initial": 0, "terminal": 0, "intervals": int(intervals), "grid": grid}
    allobs = np.concatenate(trajs)
    if bounds is None:
        lo, hi = allobs.min(axis=0), allobs.max(axis=0)
    else:
        lo, hi = (np.asarray(b, dtype=np.float64).reshape(-1) for b in bounds)
        if lo.shape != (allobs.shape[1],) or hi.shape != lo.shape:
            raise ValueError(f"diversity bounds have {lo.size}/{hi.size} values for observations of "
                             f"{allobs.shape[1]} dimensions")
    first = np.stack([t[0] for t in trajs])
    last = np.stack([t[-1] for t in trajs])
    return {"episodes": len(trajs), "entire": count_distinct_rows(grid_index(allobs, lo, hi, intervals)),
            "initial": count_distinct_rows(grid_index(first, lo, hi, intervals)),
            "terminal": count_distinct_rows(grid_index(last, lo, hi, intervals)), "intervals": int(intervals),
            "grid": grid}


def failure_trajectories(run_dir: str | Path, phases=SAFETY_PHASES, role: str = "aut") -> list[np.ndarray]:
    """The AUT's observation sequences of the failing episodes of ``phases`` (final obs included),
    the confirmed failures only: a candidate that did not fail again with the AUT acting alone
    (``flaky_failures.parquet``) is not a failure and is left out."""
    store = RunStore.open(run_dir)
    eps = store.read_episodes(phase=list(phases), role=role, failure=True,
                              columns=["episode_id", "final_obs", "iteration", "state_index"])
    flaky = RunFolder(run_dir).flaky("safety")
    if flaky is not None and len(flaky) and len(eps):
        out = set(zip(flaky["generation"].astype(int), flaky["state_index"].astype(int)))
        keep = [(int(g), int(i)) not in out for g, i in zip(eps["iteration"], eps["state_index"])]
        eps = eps[np.asarray(keep, dtype=bool)]
    if len(eps) == 0:
        return []
    steps = store.read_steps(phase=list(phases), role=role, episode_ids=eps["episode_id"].to_numpy())
    obs = steps["obs"].reshape(len(steps["obs"]), -1).astype(np.float64)
    eid = steps["episode_id"]
    bounds = np.flatnonzero(np.diff(eid)) + 1
    starts = np.concatenate([[0], bounds]) if eid.size else np.zeros(0, int)
    ends = np.concatenate([bounds, [eid.size]]) if eid.size else np.zeros(0, int)
    finals = {int(e): np.asarray(f, dtype=np.float64).ravel() for e, f in zip(eps["episode_id"], eps["final_obs"])}
    out = []
    for a, b in zip(starts, ends):
        f = finals.get(int(eid[a]))
        seq = obs[a:b]
        if f is not None and f.size == seq.shape[1] and np.all(np.isfinite(f)):
            seq = np.concatenate([seq, f[None, :]])
        out.append(seq)
    return out


def failure_diversity(run_dir: str | Path, intervals: int = 10, phases=SAFETY_PHASES, bounds=None) -> dict:
    """Table II's # Entire / # Initial / # Terminal for the failures recorded in ``run_dir``
    (``bounds``: the scenario's :meth:`~envs.base.Scenario.diversity_bounds`)."""
    return state_diversity(failure_trajectories(run_dir, phases), intervals, bounds)
