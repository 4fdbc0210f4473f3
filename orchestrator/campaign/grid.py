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
then the headline figures of each phase it ran). MLflow: each campaign logs to its own run
folder's ``mlflow.db`` (one writer per file, on whichever node it runs), in an experiment named
after the grid with the phase as a tag; the grid's driver copies each finished campaign's runs
into ``OUTPUT/mlflow.db`` (:func:`orchestrator.runs.tracking.merge_runs`), so the grid's
database has one writer too. With ``MLFLOW_TRACKING_URI`` set (a tracking server), every
campaign logs there directly instead.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
from tqdm import tqdm

from orchestrator.analysis.markdown import markdown_table  # also imported from here by the CLI
from orchestrator.campaign.config import CampaignError, campaign_from_dict
from orchestrator.cluster.progress import release_progress  # no start-up cost: Ray is imported when used
from orchestrator.cluster.tasks import run_tasks
from orchestrator.runs import tracking
from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import atomic_write_bytes, atomic_write_table
from workers.yamlfile import load_yaml

log = logging.getLogger(__name__)


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


GRID_KEYS = ("name", "output", "base", "axes", "resources", "profiles")


def load_grid(path: str | os.PathLike, profile: str | None = None) -> dict:
    """The grid file at ``path`` with ``profile`` applied (without one: the first profile, if
    the file has any), checked; :class:`GridError` names what is wrong."""
    p = Path(path)
    g = load_yaml(p, "grid file", GridError, fix="examples are in experiments/grids/ and experiments/delta/")
    unknown = set(g) - set(GRID_KEYS)
    if unknown:
        raise GridError(f"grid file {p}: unknown key {sorted(unknown)[0]}; allowed: {', '.join(GRID_KEYS)}")
    profiles = g.pop("profiles", None) or {}
    for key in ("base", "axes", "output"):
        if key not in g:
            raise GridError(f"grid file {p}: missing {key}")
    if isinstance(g["base"], str):
        g["base"] = load_yaml(Path(g["base"]), "grid base campaign", GridError)
    if profiles:
        _apply_profile(g, profiles, profile, p)
    elif profile is not None:
        raise GridError(f"grid file {p} has no profiles (asked for {profile!r})")
    if not isinstance(g["axes"], dict) or not g["axes"] or not all(isinstance(v, list) and v for v in g["axes"].values()):
        raise GridError(f"grid file {p}: axes must map each setting to a non-empty list of values")
    g.setdefault("name", p.stem)
    g.setdefault("resources", {"num_cpus": 1})
    return g


def _apply_profile(g: dict, profiles, profile: str | None, p: Path) -> None:
    """Profile ``profile`` (None: the first) into grid ``g``: its ``set`` into ``base``, its
    ``axes`` over the grid's, its ``resources``, its output in ``OUTPUT/<profile>/``."""
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


def expand(grid: dict) -> list[tuple[dict, object]]:
    """(axis values, Campaign) for every point of the grid, validated."""
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


def _run_one(campaign_dict: dict, tracking_uri: str | None, experiment: str) -> dict:
    """Body of the Ray task: one campaign, in this worker process (whose environment is put back
    afterwards: Ray reuses worker processes). ``tracking_uri``: where its MLflow runs go (a
    tracking server); None: its own run folder's ``mlflow.db``, copied into the grid's later."""
    import torch

    from orchestrator.campaign.pipeline import run_campaign  # torch, d3rlpy

    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "DELTARL_MLFLOW_EXPERIMENT",
                                             "DELTARL_CHALLENGER_CACHE")}
    os.environ["DELTARL_MLFLOW_EXPERIMENT"] = experiment
    if tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
    else:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    # campaigns of a grid that share a safety run (same seed, same D) train each challenger once
    os.environ.setdefault("DELTARL_CHALLENGER_CACHE", str(Path(campaign_dict["output"]).parent / "challenger-cache"))
    torch.set_num_threads(1)
    try:
        c = campaign_from_dict(campaign_dict)
        resume = RunFolder(c.output).has_campaign()
        return run_campaign(c, resume=resume, progress=False)
    finally:
        release_progress(campaign_dict.get("name", ""))  # one idle actor per finished campaign otherwise
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
            r.update(cases=o["cases"], bugs=o["bugs"], distinct_bugs=o["distinct_bugs"], distance=o["distance"],
                     distance_normalized=o.get("distance_normalized", float("nan")))
    return r


def _finished(point_campaign, folder: RunFolder) -> dict | None:
    """The results of a campaign an earlier run of the grid finished in ``folder``; None when it
    has not finished. A folder that holds a *different* campaign (the grid file changed) is an
    error: its results would be reported for the wrong point."""
    if not folder.results_json.is_file():
        return None
    def settings(campaign_dict: dict) -> dict:
        return {k: v for k, v in json.loads(json.dumps(campaign_dict, default=str)).items() if k not in ("output", "name")}

    stored = folder.campaign_dict()
    try:  # read through today's parser: a setting added since (at its default) is no difference
        have = settings(campaign_from_dict(stored).to_dict())
    except CampaignError:
        have = settings(stored)
    want = settings(point_campaign.to_dict())
    if have != want:
        raise GridError(f"{folder.root} holds a finished campaign that differs from this grid's point "
                        f"({', '.join(sorted(k for k in want if want[k] != have.get(k)))} changed); give the grid "
                        f"another output folder (--out) or remove that one")
    return folder.results()


def parse_only(items: list[str] | None) -> dict:
    """``["scenario=ACASXu", "seed=0", "seed=1"]`` -> {"scenario": ["ACASXu"], "seed": [0, 1]}
    (values read as YAML): different settings must all hold, values of one setting are
    alternatives."""
    import yaml

    out: dict[str, list] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise GridError(f"--only {item!r}: write SETTING=VALUE, e.g. --only scenario=ACASXu or --only safety.fuzzer=mdpfuzz")
        out.setdefault(key.strip(), []).append(yaml.safe_load(value))
    return out


def no_match(only: dict) -> str:
    said = " ".join(f"--only {k}={v}" for k, vs in only.items() for v in vs)
    return (f"{said}: no campaign of the grid matches; see them with --dry-run (settings are dotted paths of the "
            f"campaign, e.g. scenario, seed, safety.fuzzer)")


def selects(campaign, only: dict) -> bool:
    """Whether the campaign's resolved settings hold every ``only`` setting (dotted paths), each
    with one of its values."""
    d = json.loads(json.dumps(campaign.to_dict(), default=str))
    for dotted, wants in only.items():
        v = d
        for k in dotted.split("."):
            if not isinstance(v, dict) or k not in v:
                return False  # a setting this campaign does not have (e.g. another fuzzer's parameter)
            v = v[k]
        if not any(v == w or str(v) == str(w) for w in wants):
            return False
    return True


def chosen(points: list, only: dict | None) -> list[bool]:
    """Which of the grid's ``points`` (``expand``) the ``only`` filter selects (all of them
    without one); a filter that selects none is an error naming it."""
    picked = [not only or selects(c, only) for _, c in points]
    if not any(picked):
        raise GridError(no_match(only))
    return picked


def _merge_tracking(c, out: Path, experiment: str) -> None:
    """Copy campaign ``c``'s MLflow runs into the grid's database; a failure costs a warning (the
    campaign's own ``mlflow.db`` keeps everything, and the next run of the grid copies again)."""
    try:
        tracking.merge_runs(c.output, out, experiment, label=Path(c.output).name)
    except Exception as exc:  # noqa: BLE001 - MLflow's errors have no common base; nothing is lost
        log.warning("could not copy %s's MLflow runs into %s (%s: %s); they stay in its own mlflow.db",
                    Path(c.output).name, out / "mlflow.db", type(exc).__name__, exc)


def run_grid(grid: dict, *, progress: bool = True, only: dict | None = None) -> pd.DataFrame:
    """Run the grid's unfinished campaigns (those matching ``only``, when given: the others are
    left for a later run and reported only when an earlier run finished them)."""
    points = expand(grid)
    picked = chosen(points, only)
    out = Path(grid["output"])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "grid.json", json.dumps(grid, indent=2, default=str).encode())
    server = os.environ.get("MLFLOW_TRACKING_URI") or None  # campaigns log there; else each to its folder
    tracking.ensure_experiment(out, grid["name"], server or tracking.sqlite_uri(out))
    rows: list[dict | None] = [None] * len(points)
    todo = []
    for i, (point, c) in enumerate(points):
        done = _finished(c, RunFolder(c.output))
        if done is not None:  # finished in an earlier run of the grid
            rows[i] = row(point, c, done)
        elif picked[i]:
            todo.append(i)
    n_rows = sum(r is not None for r in rows) + len(todo)
    bar = tqdm(total=n_rows, initial=n_rows - len(todo), unit="campaign", desc=grid["name"],
               disable=not progress)
    res = grid.get("resources") or {}
    calls = [(points[i][1].to_dict(), server, grid["name"]) for i in todo]
    for k, result, exc in run_tasks(_run_one, calls, num_cpus=res.get("num_cpus", 1), num_gpus=res.get("num_gpus", 0)):
        point, c = points[todo[k]]
        error = None if exc is None else f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300]}"
        rows[todo[k]] = row(point, c, result, error=error)  # one failing campaign does not stop the grid
        if server is None:
            _merge_tracking(c, out, grid["name"])
        bar.update(1)
    bar.close()
    if server is None:  # campaigns finished by an earlier run whose driver stopped before copying
        ran = set(todo)
        for i, (_, c) in enumerate(points):
            if rows[i] is not None and i not in ran:
                _merge_tracking(c, out, grid["name"])
    df = pd.DataFrame([r for r in rows if r is not None])
    atomic_write_table(out / "results.parquet", pa.Table.from_pandas(df, preserve_index=False))
    atomic_write_bytes(out / "results.md", markdown_table(df).encode())
    return df
