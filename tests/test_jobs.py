"""Campaigns as Ray Jobs on a real head started with `ray start --head` (own ports and temp dir,
so it does not touch the test session's cluster), then stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head(tmp_path_factory):
    temp = Path(f"/tmp/rj{os.getpid()}")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    ports = {k: free_port() for k in ("port", "dashboard-port", "dashboard-agent-listen-port",
                                      "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port",
                                      "ray-client-server-port", "node-manager-port", "object-manager-port")}
    cmd = [RAY, "start", "--head", "--num-cpus=2", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           "--disable-usage-stats", f"--temp-dir={temp}"] + [f"--{k}={v}" for k, v in ports.items()]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=180)
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        yield address
    finally:  # stop this head only (`ray stop` would stop every Ray on the machine)
        out = subprocess.run(["pgrep", "-f", str(temp)], capture_output=True, text=True).stdout.split()
        for pid in out:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_submit_a_campaign_as_a_ray_job(head, tmp_path, monkeypatch):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.cluster import jobs

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    p = tmp_path / "c.yaml"
    p.write_text(f"""
name: job-test
scenario: CartPole-v1
aut: "python:workers.examples:cartpole_balancer"
workers: 1
output: {tmp_path / 'out'}
safety: {{fuzzer: curefuzz, budget: {{episodes: 64}}, generation_size: 32}}
""")
    job_id = jobs.submit(load_campaign(p), address=head)
    assert jobs.wait(job_id, head, timeout=300) == "SUCCEEDED", jobs.logs(job_id, head)[-3000:]
    log = jobs.logs(job_id, head)
    assert "| safety | curefuzz, 64 episodes" in log
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["safety"]["episodes"] == 64
    listed = {j["job_id"]: j for j in jobs.list_jobs(head)}
    assert listed[job_id]["campaign"] == "job-test" and listed[job_id]["status"] == "SUCCEEDED"
    with pytest.raises(jobs.JobError, match="no job 'nope'"):
        jobs.status("nope", head)


@pytest.mark.slow
def test_no_cluster_at_the_address_is_a_clear_error(monkeypatch, capsys):
    from orchestrator.cli import main

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert main(["jobs", "--address", f"http://127.0.0.1:{free_port()}"]) == 2
    assert "cannot reach a Ray cluster's job API" in capsys.readouterr().err


@pytest.mark.subprocess
def test_a_job_runs_the_submitters_interpreter_only_where_the_node_has_it(monkeypatch, tmp_path):
    """The entrypoint's interpreter: for a loopback head, the submitter's own where the node has
    it at the same path, else the node's ``python`` (a port-forward, or nodes with their own file
    systems: tests/test_multinode.py); for any other address the node's ``python``."""
    from orchestrator.cluster import jobs

    assert jobs.job_python("http://10.0.0.5:8265") == "python"
    for exists in (True, False):
        fake = tmp_path / f"venv {exists}" / "bin" / "python"  # a space: the path is quoted
        if exists:
            fake.parent.mkdir(parents=True)
            fake.write_text("#!/bin/sh\n")
            fake.chmod(0o755)
        monkeypatch.setattr(jobs.sys, "executable", str(fake))
        line = jobs.job_python("http://127.0.0.1:8265")
        got = subprocess.run(["sh", "-c", f"echo {line}"], capture_output=True, text=True, check=True).stdout.strip()
        assert got == (str(fake) if exists else "python"), line
