"""Campaigns as Ray Jobs: submit to a cluster's head, list, follow logs, stop.

    deltarl submit experiments/quickstart.yaml --address http://HEAD:8265 --out /shared/runs/qs
    deltarl jobs | deltarl logs JOB_ID | deltarl stop JOB_ID

The job runs the same entrypoint as a local run (``deltarl run``). Everything it needs reaches the
cluster through Ray's ``runtime_env``, never through a disk the submitter and the nodes would have
to share: deltarl's own packages (``orchestrator``, ``workers``, ``envs`` and the ``experiments``
data: zoo, presets) as ``py_modules``, taken from wherever this deltarl is installed (a checkout or
a ``pip install``); the files the campaign names on this machine (its AUT file or ``rlzoo:`` folder,
a challenger model, a challenger preset file) in the job's ``working_dir``, a temporary folder
made here (``inputs/``), with the campaign's paths rewritten to point there; the resolved campaign
in the job's environment (``DELTARL_CAMPAIGN``). Every process of the job (its driver, its rollout
actors, its training workers, on any node) runs in its node's copy of that folder. The output
folder is made absolute here (``--out`` or the campaign's ``output``): on several nodes it must be
a path every node reaches (a shared volume), since it is written on the nodes, not here.

Address: ``--address``, else ``RAY_API_SERVER_ADDRESS``, ``RAY_ADDRESS`` (an ``http://`` one), else
``http://127.0.0.1:8265``. Auth, as Ray expects: when a token is available
(``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``) and ``RAY_AUTH_MODE`` is
unset, it is set to ``token`` so that Ray's client sends the token; the token itself is never
read, printed or logged here.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from workers.resources import data_root

CAMPAIGN_ENV = "DELTARL_CAMPAIGN"
INPUTS = "inputs"  # the folder of the job's working_dir that holds the campaign's local files
PACKAGES = ("envs", "workers", "orchestrator")  # deltarl's code, shipped with every job (py_modules)
EXCLUDES = ["__pycache__", "*.pyc", "/results/"]  # experiments/results: measured numbers, not package data


class JobError(ValueError):
    """A job request that cannot be served: no cluster at the address, unknown job id."""


def dashboard_address(address: str | None = None) -> str:
    if address is not None and not address.startswith(("http://", "https://")):
        raise JobError(f"--address {address!r}: give the job API's URL with its scheme, e.g. http://{address or 'HEAD:8265'} "
                       f"(the dashboard port, 8265 by default)")
    for a in (address, os.environ.get("RAY_API_SERVER_ADDRESS"), os.environ.get("RAY_ADDRESS")):
        if a and a.startswith("http"):
            return a.rstrip("/")
    return "http://127.0.0.1:8265"


def _client(address: str | None):
    addr = dashboard_address(address)  # an address without its scheme is refused before Ray loads
    if "RAY_AUTH_MODE" not in os.environ and (
            os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
            or (Path.home() / ".ray" / "auth_token").is_file()):
        os.environ["RAY_AUTH_MODE"] = "token"
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(addr)
    except Exception as exc:  # noqa: BLE001 - connection refused, 401, bad URL
        raise JobError(f"cannot reach a Ray cluster's job API at {addr} ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:200]}). Start one with `ray start --head` or give "
                       f"--address http://HEAD:8265; with token auth set RAY_AUTH_MODE=token and the token "
                       f"(RAY_AUTH_TOKEN or ~/.ray/auth_token)") from exc


def package_dirs() -> list[str]:
    """The folders of the installed deltarl (checkout or ``pip install``) a job ships as py_modules."""
    import importlib

    dirs = [str(Path(importlib.import_module(p).__file__).parent) for p in PACKAGES]
    return dirs + [str(data_root())]


def _local_path(text: str) -> tuple[str, Path] | None:
    """``(scheme prefix, path)`` of a policy URI or preset that names a file or folder on this
    machine (``/x/agent.d3``, ``rlzoo:/x/agent``, ``file:///x/a.onnx``); None for the others
    (``zoo:``, ``python:``, ``random:``, a preset name)."""
    low = text.strip().lower()
    if low.startswith(("zoo:", "python:", "random:")):
        return None
    prefix = ""
    if low.startswith("rlzoo:"):
        prefix, text = "rlzoo:", text.strip()[len("rlzoo:"):].strip()
    elif low.startswith("file://"):
        text = text.strip()[len("file://"):]
        text = text[len("localhost"):] if text.startswith("localhost/") else text
    path = Path(text).expanduser()
    return (prefix, path.resolve()) if path.exists() else None


def _ship(text: str | None, stage: Path, role: str) -> str | None:
    """Copy the local file or folder ``text`` names into ``stage/inputs/<role>/`` and return the
    same URI pointing there (relative: every process of the job runs in its node's copy of the
    working_dir); ``text`` itself when it names nothing on this machine. An rl-zoo ``.zip``
    travels with its ``<env>/config.yml`` folder."""
    found = _local_path(text) if isinstance(text, str) else None
    if found is None:
        return text
    prefix, path = found
    dest = stage / INPUTS / role
    dest.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.copytree(path, dest / path.name)
    else:
        shutil.copy2(path, dest / path.name)
        if path.suffix == ".zip":
            from workers.policies.rlzoo import stats_dir_for

            stats = stats_dir_for(path)
            if stats is not None:
                shutil.copytree(stats, dest / stats.name)
    return f"{prefix}{INPUTS}/{role}/{path.name}"


def job_inputs(campaign, stage: Path) -> dict:
    """The campaign as the job runs it (a dict), its local files copied into ``stage``."""
    d = campaign.to_dict()
    d["aut"] = _ship(d.get("aut"), stage, "aut")
    if d.get("optimality"):
        d["optimality"]["challenger"] = _ship(d["optimality"].get("challenger"), stage, "challenger")
    if d.get("challenger") and d["challenger"].get("preset") and Path(d["challenger"]["preset"]).is_file():
        d["challenger"]["preset"] = _ship(d["challenger"]["preset"], stage, "preset")
    return d


def runtime_env(campaign, stage: Path) -> dict:
    """The job's runtime_env: deltarl's packages, the campaign's local files, the campaign."""
    return {"working_dir": str(stage), "py_modules": package_dirs(), "excludes": EXCLUDES,
            "env_vars": {CAMPAIGN_ENV: json.dumps(job_inputs(campaign, stage))}}


def submit(campaign, *, address: str | None = None, submission_id: str | None = None,
           num_cpus: float = 1.0, num_gpus: float = 0.0, resources: dict | None = None) -> str:
    """Submit ``campaign`` (validated, output made absolute) as a Ray Job; returns its id.
    ``num_cpus``/``num_gpus``/``resources``: what the job's driver reserves on the node that runs it."""
    campaign.output = str(Path(campaign.output).resolve())
    client = _client(address)
    entrypoint = f"{job_python(address)} -m orchestrator.cli run --campaign-env {CAMPAIGN_ENV} --quiet"
    with tempfile.TemporaryDirectory(prefix="deltarl-job-") as stage:  # uploaded by submit_job, then not needed
        env = runtime_env(campaign, Path(stage))
        for attempt in range(30):  # a freshly started head takes a few seconds to bring up its job agent
            try:
                return client.submit_job(entrypoint=entrypoint, runtime_env=env, submission_id=submission_id,
                                         entrypoint_num_cpus=num_cpus, entrypoint_num_gpus=num_gpus or None,
                                         entrypoint_resources=resources or None,
                                         metadata={"deltarl.campaign": campaign.name, "deltarl.output": campaign.output})
            except RuntimeError as exc:
                if "No available agent" not in str(exc) or attempt == 29:
                    raise JobError(f"the cluster at {dashboard_address(address)} refused the job: "
                                   f"{str(exc).splitlines()[-1][:300]}") from exc
                time.sleep(1.0)


def submit_grid(grid: dict, *, address: str | None = None, submission_id: str | None = None,
                num_cpus: float = 0.0, resources: dict | None = None, env_vars: dict | None = None) -> str:
    """Submit a grid (:func:`orchestrator.campaign.grid.load_grid`'s dict, profile applied) as a
    Ray Job running ``deltarl grid`` on the cluster: its output made absolute (a shared path on
    several nodes), its base campaign's local files shipped as :func:`submit` ships a campaign's.
    The grid's driver only waits on its campaigns' tasks: no CPU by default (``resources``: pin it
    to a node's custom resource). ``env_vars``: more variables for every process of the job
    (e.g. ``DELTARL_CHALLENGER_CACHE``)."""
    import copy

    import yaml

    grid = copy.deepcopy(grid)
    grid.pop("profile", None)
    grid["output"] = str(Path(grid["output"]).resolve())
    client = _client(address)
    entrypoint = f"{job_python(address)} -m orchestrator.cli grid grid.yaml --quiet"
    with tempfile.TemporaryDirectory(prefix="deltarl-job-") as stage:
        base = grid["base"]
        base["aut"] = _ship(base.get("aut"), Path(stage), "aut")
        if (base.get("optimality") or {}).get("challenger"):
            base["optimality"]["challenger"] = _ship(base["optimality"]["challenger"], Path(stage), "challenger")
        (Path(stage) / "grid.yaml").write_text(yaml.safe_dump(grid, sort_keys=False))
        env = {"working_dir": stage, "py_modules": package_dirs(), "excludes": EXCLUDES,
               "env_vars": {str(k): str(v) for k, v in (env_vars or {}).items()}}
        try:
            return client.submit_job(entrypoint=entrypoint, runtime_env=env, submission_id=submission_id,
                                     entrypoint_num_cpus=num_cpus, entrypoint_resources=resources or None,
                                     metadata={"deltarl.campaign": f"grid {grid.get('name', '')}",
                                               "deltarl.output": grid["output"]})
        except RuntimeError as exc:
            raise JobError(f"the cluster at {dashboard_address(address)} refused the job: "
                           f"{str(exc).splitlines()[-1][:300]}") from exc


def _same_machine(address: str | None) -> bool:
    a = dashboard_address(address)
    return "127.0.0.1" in a or "localhost" in a


def job_python(address: str | None) -> str:
    """The interpreter in a job's entrypoint (a shell line). A head at a loopback address may be
    this machine, whose raylet need not have this venv on its PATH: then this interpreter, where
    the node that runs the driver has it at the same path. A loopback address may also be a
    port-forward to a cluster elsewhere, or nodes with their own file systems
    (tests/test_multinode.py), which lack the submitter's venv: there, and for any other address,
    the node's own ``python``."""
    if not _same_machine(address):
        return "python"
    me = shlex.quote(sys.executable)
    return f'"$(test -x {me} && echo {me} || echo python)"'


def list_jobs(address: str | None = None) -> list[dict]:
    out = []
    for j in _client(address).list_jobs():
        out.append({"job_id": j.submission_id or j.job_id, "status": str(j.status.value if hasattr(j.status, "value") else j.status),
                    "campaign": (j.metadata or {}).get("deltarl.campaign", ""),
                    "output": (j.metadata or {}).get("deltarl.output", ""),
                    "start": j.start_time, "end": j.end_time})
    return out


def status(job_id: str, address: str | None = None) -> str:
    try:
        s = _client(address).get_job_status(job_id)
    except RuntimeError as exc:
        raise JobError(f"no job {job_id!r} on {dashboard_address(address)} (deltarl jobs lists them)") from exc
    return str(s.value if hasattr(s, "value") else s)


def logs(job_id: str, address: str | None = None) -> str:
    try:
        return _client(address).get_job_logs(job_id)
    except RuntimeError as exc:
        raise JobError(f"no job {job_id!r} on {dashboard_address(address)} (deltarl jobs lists them)") from exc


def stop(job_id: str, address: str | None = None) -> bool:
    try:
        return bool(_client(address).stop_job(job_id))
    except RuntimeError as exc:
        raise JobError(f"no job {job_id!r} on {dashboard_address(address)} (deltarl jobs lists them)") from exc


def wait(job_id: str, address: str | None = None, timeout: float = 3600, poll: float = 1.0) -> str:
    end = time.time() + timeout
    while True:
        s = status(job_id, address)
        if s in ("SUCCEEDED", "FAILED", "STOPPED") or time.time() > end:
            return s
        time.sleep(poll)
