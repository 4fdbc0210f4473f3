"""A campaign's progress where the Ray dashboard shows it (issue #48, item 3), on a real cluster
with the dashboard: the job named after the campaign (Jobs page), the progress actor's repr naming
the campaign and its current phase for all three phases, challenger training included (Actors
page), every update a named task, and gauges that stay exported for the whole campaign (they left
the export 10-20 s after their phase's last update)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cluster.progress import CampaignProgress

REPO = Path(__file__).resolve().parents[1]

CAMPAIGN = """
import json, os, sys, time, urllib.request
from orchestrator.cluster.lifecycle import start_ray
from orchestrator.cluster.progress import CampaignMetrics, report_progress
from orchestrator.cluster.ray_compat import metrics_export_port
from orchestrator.cluster.session import DriverSession
import ray
from ray.util.state import list_actors
from orchestrator.cluster.dashboard import dashboard_info

def exported():
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_export_port()}/metrics", timeout=10).read().decode()
    return sorted({line.split("{")[0] + "/" + line.split('phase="')[1].split('"')[0] for line in text.splitlines()
                   if line.startswith("ray_deltarl_") and 'campaign="ptest"' in line})

out = {"scrapes": []}
with DriverSession(dashboard=True, name="ptest"):
    start_ray(num_cpus=1, object_store_bytes=1 << 28)
    m = CampaignMetrics("ptest", "safety")
    m.update(episodes=8, failures=2, progress="8/16 episodes")
    m.update(episodes=8, failures=3, progress="16/16 episodes")
    safety_done = time.monotonic()
    del m
    m = CampaignMetrics("ptest", "challenger")  # the driver enters the phase; the training reports
    m.update(progress="bc: training")
    out["reported"] = report_progress("ptest", "challenger", "bc: 500/1000 steps")
    while time.monotonic() - safety_done < 40:  # the gauge's last value is from the safety phase
        time.sleep(4)
        out["scrapes"].append([round(time.monotonic() - safety_done), exported()])
    m = CampaignMetrics("ptest", "optimality")
    m.update(episodes=4, bugs=1, progress="4/4 cases")
    actor = ray.get_actor("deltarl/ptest/progress")
    out["state"] = ray.get(actor.state.remote())
    time.sleep(3)  # the state API sees the newest actor
    gcs = ray.get_runtime_context().gcs_address  # other clusters may run on this machine
    out["actors"] = sorted((a["state"], a.get("repr_name")) for a in list_actors(address=gcs, detail=True, limit=1000)
                           if a.get("name") == "deltarl/ptest/progress")
    me = ray.get_runtime_context().get_job_id()
    jobs = json.loads(urllib.request.urlopen(dashboard_info()["url"] + "/api/jobs/", timeout=10).read())  # the Jobs page's
    out["job_name"] = [(j.get("metadata") or {}).get("job_name") for j in jobs if j.get("job_id") == me]
print("RESULT " + json.dumps(out), flush=True)
"""


def test_the_progress_actor_names_its_campaign_and_phase():
    assert repr(CampaignProgress("quickstart")) == "deltarl campaign quickstart"
    assert repr(CampaignProgress("quickstart", "challenger")) == "deltarl campaign quickstart: challenger phase"
    p = CampaignProgress("q", "optimality", {"safety": {"progress": "16/16 episodes", "failures": 3, "bugs": None}})
    assert p.state() == {"campaign": "q", "phase": "optimality",
                         "phases": {"safety": {"progress": "16/16 episodes", "failures": 3, "bugs": None}}}


@pytest.mark.subprocess
@pytest.mark.ray
@pytest.mark.slow
def test_the_dashboard_shows_the_campaign_its_phase_and_gauges_for_the_whole_campaign(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    short = Path("/tmp") / f"drp{os.getpid()}"  # Ray's socket paths must stay short
    short.mkdir(exist_ok=True)
    env["RAY_TMPDIR"] = str(short)
    try:
        proc = subprocess.run([sys.executable, "-c", CAMPAIGN], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=400)
    finally:
        subprocess.run(["rm", "-rf", str(short)], check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["job_name"] == ["deltarl ptest"]  # the Jobs page's Name column
    reprs = {r: s for s, r in out["actors"]}
    assert reprs == {"deltarl campaign ptest: safety phase": "DEAD", "deltarl campaign ptest: challenger phase": "DEAD",
                     "deltarl campaign ptest: optimality phase": "ALIVE"}, out["actors"]
    assert out["reported"] is True
    assert out["state"]["phase"] == "optimality"
    assert out["state"]["phases"] == {
        "safety": {"progress": "16/16 episodes", "failures": 3, "bugs": None},
        "challenger": {"progress": "bc: 500/1000 steps", "failures": None, "bugs": None},
        "optimality": {"progress": "4/4 cases", "failures": None, "bugs": 1}}
    seen = [i for i, (_, names) in enumerate(out["scrapes"]) if "ray_deltarl_failures/safety" in names]
    assert seen, out["scrapes"]
    after = out["scrapes"][seen[0]:]
    assert all("ray_deltarl_failures/safety" in names for _, names in after), out["scrapes"]
    assert after[-1][0] >= 35  # still exported 35 s after the safety phase's last update
