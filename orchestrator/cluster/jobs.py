"""Campaigns as Ray Jobs: submit to a cluster's head, list, follow logs, stop.

    deltarl submit experiments/quickstart.yaml --address http://HEAD:8265 --out /shared/runs/qs
    deltarl jobs | deltarl logs JOB_ID | deltarl stop JOB_ID

The job runs the same entrypoint as a local run (``deltarl run``), with this repository as the
uploaded working directory (``.gitignore``d folders such as ``runs/`` and ``.venv/`` stay
behind) and the resolved campaign passed in the job's environment (``DELTARL_CAMPAIGN``). The
job's working directory is a temporary folder on the cluster, so the output folder is made
absolute here (``--out`` or the campaign's ``output``): on a multi-node cluster it should be a
path every node shares.

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
import sys
import time
from pathlib import Path

from workers.resources import CHECKOUT

REPO = CHECKOUT  # the code shipped to the cluster with a job (working_dir)
CAMPAIGN_ENV = "DELTARL_CAMPAIGN"


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


def submit(campaign, *, address: str | None = None, submission_id: str | None = None,
           num_cpus: float = 1.0, num_gpus: float = 0.0) -> str:
    """Submit ``campaign`` (validated, output made absolute) as a Ray Job; returns its id."""
    campaign.output = str(Path(campaign.output).resolve())
    client = _client(address)
    entrypoint = f"{shlex.quote(sys.executable) if _same_machine(address) else 'python'} -m orchestrator.cli run " \
                 f"--campaign-env {CAMPAIGN_ENV} --quiet"
    runtime_env = {"working_dir": str(REPO), "excludes": [".git", "runs", ".venv", "*.egg-info"],
                   "env_vars": {CAMPAIGN_ENV: json.dumps(campaign.to_dict())}}
    for attempt in range(30):  # a freshly started head takes a few seconds to bring up its job agent
        try:
            return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id,
                                     entrypoint_num_cpus=num_cpus, entrypoint_num_gpus=num_gpus or None,
                                     metadata={"deltarl.campaign": campaign.name, "deltarl.output": campaign.output})
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or attempt == 29:
                raise JobError(f"the cluster at {dashboard_address(address)} refused the job: "
                               f"{str(exc).splitlines()[-1][:300]}") from exc
            time.sleep(1.0)


def _same_machine(address: str | None) -> bool:
    """A head on this machine runs the job with this interpreter (and its installed packages)."""
    a = dashboard_address(address)
    return "127.0.0.1" in a or "localhost" in a


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
