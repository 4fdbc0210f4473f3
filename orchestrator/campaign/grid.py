"""Experiment grids as data: one YAML file expands into many campaigns, run concurrently on Ray.

    name: cartpole-fuzzers
    output: runs/grids/cartpole-fuzzers
    base:                            # a campaign (inline mapping or a campaign file path)
      scenario: CartPole-v1
      aut: zoo:CartPole-v1
      safety: {fuzzer: random, budget: {episodes: 200}}
    axes:                            # the cross product of every axis
      safety.fuzzer: [random, curefuzz, mdpfuzz]
      seed: [0, 1]
      # a mapping sets several keys together (e.g. a scenario with its AUT):
      # env: [{scenario: CartPole-v1, aut: zoo:CartPole-v1}, {scenario: Acrobot-v1, aut: zoo:Acrobot-v1}]
    resources: {num_cpus: 1}         # per campaign (a Ray task); campaigns run in-process in it
    profiles:                        # optional: named budgets; `deltarl grid FILE --profile paper`
      local: {set: {safety.budget: {episodes: 500}}, axes: {seed: [0, 1, 2]}}
      paper: {set: {safety.budget: {seconds: 7200}}, axes: {seed: [0, 1, 2, 3, 4]}}

A profile's ``set`` overrides settings of ``base`` (dotted keys), its ``axes`` replace or add
axes, and its output goes to ``OUTPUT/<profile>/``; without ``--profile`` the first one runs.
Campaigns of a grid share a challenger cache (``OUTPUT/challenger-cache``): points that run
the same safety campaign train each challenger once.

Every campaign goes to ``OUTPUT/<name>-<index>/`` and is validated before anything runs. Each
runs as a Ray task: the tasks are spread over the cluster by their resource requests, and one
failing campaign does not stop the others. Resuming a grid skips the campaigns that finished.
Results: ``OUTPUT/results.parquet`` and ``results.md``, one row per campaign (the axis values,
then the headline figures of each phase it ran). MLflow: every campaign logs to
``OUTPUT/mlflow.db``, in one experiment named after the grid, with the phase as a tag.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from pathlib import Path


class GridError(ValueError):
    """A grid file that cannot be expanded into valid campaigns."""


def _set(d: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        if d.get(k) is None:
            d[k] = {}
        if not isinstance(d[k], dict):
            raise GridError(f"axis {dotted}: {k} is not a section of the campaign")
        d = d[k]
    d[keys[-1]] = copy.deepcopy(value)


def load_grid(path: str | os.PathLike, profile: str | None = None) -> dict:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise GridError(f"grid file {p} not found")
    try:
        g = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise GridError(f"grid file {p} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    allowed = ("name", "output", "base", "axes", "resources", "profiles")
    unknown = set(g) - set(allowed)
    if unknown:
        raise GridError(f"grid file {p}: unknown key {sorted(unknown)[0]}; allowed: {', '.join(allowed)}")
    profiles = g.pop("profiles", None) or {}
    for key in ("base", "axes", "output"):
        if key not in g:
            raise GridError(f"grid file {p}: missing {key}")
    if isinstance(g["base"], str):
        base = Path(g["base"])
        if not base.is_file():
            raise GridError(f"grid base campaign {base} not found")
        g["base"] = yaml.safe_load(base.read_text())
    if profiles:
        if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
            raise GridError(f"grid file {p}: profiles must map names to mappings of settings")
        if profile is None:
            profile = next(iter(profiles))
        if profile not in profiles:
            raise GridError(f"grid file {p}: unknown profile {profile!r}; profiles: {', '.join(profiles)}")
        prof = profiles[profile]
        bad = set(prof) - {"set", "axes", "resources"}
        if bad:
            raise GridError(f"grid file {p}: profile {profile}: unknown key {sorted(bad)[0]}; allowed: set, axes, resources")
        g.setdefault("base", {})
        for dotted, value in (prof.get("set") or {}).items():
            _set(g["base"], dotted, value)
        g.setdefault("axes", {}).update(prof.get("axes") or {})
        if "resources" in prof:
            g["resources"] = prof["resources"]
        g["output"] = str(Path(g.get("output", "runs/grids")) / profile)
        g["profile"] = profile
    elif profile is not None:
        raise GridError(f"grid file {p} has no profiles (asked for {profile!r})")
    if not isinstance(g["axes"], dict) or not g["axes"] or not all(isinstance(v, list) and v for v in g["axes"].values()):
        raise GridError(f"grid file {p}: axes must map each setting to a non-empty list of values")
    g.setdefault("name", p.stem)
    g.setdefault("resources", {"num_cpus": 1})
    return g


def expand(grid: dict) -> list[tuple[dict, object]]:
    """(axis values, Campaign) for every point of the grid, validated."""
    from orchestrator.campaign.config import CampaignError, campaign_from_dict

    names = list(grid["axes"])
    out = []
    for i, values in enumerate(itertools.product(*grid["axes"].values())):
        d = copy.deepcopy(grid["base"])
        point = {}
        for axis, v in zip(names, values):
            if isinstance(v, dict):
                for k, sub in v.items():
                    _set(d, k, sub)
                point[axis] = json.dumps(v, sort_keys=True)
            else:
                _set(d, axis, v)
                point[axis] = v
        d["name"] = f"{grid['name']}-{i:03d}"
        d["output"] = str(Path(grid["output"]) / d["name"])
        d.setdefault("workers", 0)
        try:
            out.append((point, campaign_from_dict(d, where=f"grid point {i} ({point})")))
        except CampaignError as exc:
            raise GridError(str(exc)) from exc
    return out


def _run_one(campaign_dict: dict, tracking_uri: str, experiment: str) -> dict:
    """Body of the Ray task: one campaign, in this worker process (whose environment is put back
    afterwards: Ray reuses worker processes)."""
    import torch

    from orchestrator.campaign.config import campaign_from_dict
    from orchestrator.campaign.pipeline import run_campaign

    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "DELTARL_MLFLOW_EXPERIMENT",
                                             "DELTARL_CHALLENGER_CACHE")}
    os.environ.update(MLFLOW_TRACKING_URI=tracking_uri, DELTARL_MLFLOW_EXPERIMENT=experiment)
    # campaigns of a grid that share a safety run (same seed, same D) train each challenger once
    os.environ.setdefault("DELTARL_CHALLENGER_CACHE", str(Path(campaign_dict["output"]).parent / "challenger-cache"))
    torch.set_num_threads(1)
    try:
        c = campaign_from_dict(campaign_dict)
        resume = (Path(c.output) / "campaign.json").is_file()
        return run_campaign(c, resume=resume, progress=False)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def row(point: dict, campaign, results: dict | None, error: str | None = None) -> dict:
    r = {"campaign": campaign.name, **point, "status": "failed" if error else "done", "error": error or ""}
    if results:
        s = results.get("safety")
        if s:
            r.update(safety_episodes=s["episodes"], failures=s["failures"], distinct_failures=s["distinct_failures"])
        for c in results.get("challengers") or []:
            r[f"{c['config']['algo']}_return"] = c["evaluation"]["mean_return"]
        o = results.get("optimality")
        if o:
            r.update(cases=o["cases"], bugs=o["bugs"], distinct_bugs=o["distinct_bugs"], distance=o["distance"])
    return r


def run_grid(grid: dict, *, progress: bool = True) -> "pd.DataFrame":  # noqa: F821
    import pandas as pd
    import pyarrow as pa
    import ray
    from tqdm import tqdm

    from orchestrator.cluster.driver import start_ray
    from orchestrator.runs.store import atomic_write_bytes, atomic_write_table

    points = expand(grid)
    out = Path(grid["output"])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "grid.json", json.dumps(grid, indent=2, default=str).encode())
    tracking_uri = f"sqlite:///{out.resolve() / 'mlflow.db'}"
    from orchestrator.runs import tracking

    tracking.ensure_experiment(out, grid["name"], tracking_uri)  # created once, before the tasks race
    start_ray()
    res = grid.get("resources") or {}
    task = ray.remote(num_cpus=res.get("num_cpus", 1), num_gpus=res.get("num_gpus", 0), max_retries=0)(_run_one)
    rows: list[dict | None] = [None] * len(points)
    refs = {}
    for i, (point, c) in enumerate(points):
        done = Path(c.output) / "results.json"
        if done.is_file():  # finished in an earlier run of the grid
            rows[i] = row(point, c, json.loads(done.read_text()))
            continue
        refs[task.remote(c.to_dict(), tracking_uri, grid["name"])] = i
    bar = tqdm(total=len(points), initial=len(points) - len(refs), unit="campaign", desc=grid["name"],
               disable=not progress)
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        i = refs.pop(ready[0])
        point, c = points[i]
        try:
            rows[i] = row(point, c, ray.get(ready[0]))
        except Exception as exc:  # noqa: BLE001 - one failing campaign does not stop the grid
            rows[i] = row(point, c, None, error=f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300]}")
        bar.update(1)
    bar.close()
    df = pd.DataFrame(rows)
    atomic_write_table(out / "results.parquet", pa.Table.from_pandas(df, preserve_index=False))
    atomic_write_bytes(out / "results.md", markdown_table(df).encode())
    return df


def markdown_table(df) -> str:
    def cell(v):
        if isinstance(v, float):
            return "" if v != v else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"
