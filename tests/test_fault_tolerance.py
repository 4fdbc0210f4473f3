"""A campaign survives its driver being killed: `deltarl run --resume` continues from the last
corpus snapshot and the Parquet record ends up exactly as an uninterrupted run's (no episode
lost, none written twice). The rollout-actor kill test is in test_ray_pool.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

CAMPAIGN = """
name: killme
scenario: MountainCar-v0
aut: "python:workers.examples:mountaincar_energy"
seed: 5
workers: 0
output: {out}
mlflow: false
safety:
  fuzzer: curefuzz
  budget: {{episodes: 1600}}
  generation_size: 16
"""


@pytest.mark.slow
def test_a_killed_driver_resumes_without_losing_or_duplicating_episodes(tmp_path):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.safety import run_safety
    from orchestrator.runs.store import RunStore

    out = tmp_path / "killed"
    p = tmp_path / "c.yaml"
    p.write_text(CAMPAIGN.format(out=out))
    cmd = [sys.executable, "-m", "orchestrator.cli", "run", str(p), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.time() + 300
    while time.time() < deadline and len(list((out / "snapshots").glob("gen-*.pkl"))) < 2:
        time.sleep(0.02)
        assert proc.poll() is None, "the campaign ended before it could be killed"
    time.sleep(0.05)  # let it get into a later generation
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists()  # it really died mid-run
    parts_before = len(list((out / "episodes").glob("*.parquet")))

    resumed = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "--resume", str(out), "--quiet"],
                             cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    clean = tmp_path / "clean"
    q = tmp_path / "d.yaml"
    q.write_text(CAMPAIGN.format(out=clean))
    run_safety(load_campaign(q), progress=False)

    a, b = RunStore.open(out), RunStore.open(clean)
    ea, eb = a.read_episodes(), b.read_episodes()
    assert len(ea) == len(eb) == 1600  # Parquet row counts: every episode once
    assert parts_before >= 2
    key = ["iteration", "state_index"]
    ea, eb = ea.sort_values(key).reset_index(drop=True), eb.sort_values(key).reset_index(drop=True)
    np.testing.assert_array_equal(ea["return"].to_numpy(), eb["return"].to_numpy())
    np.testing.assert_array_equal(np.stack(ea["initial_state"]), np.stack(eb["initial_state"]))
    assert len(a.read_steps()["rewards"]) == len(b.read_steps()["rewards"])


def test_a_rollout_actor_killed_mid_campaign_loses_and_duplicates_nothing(tmp_path, ray_cluster, monkeypatch):
    """A safety campaign on 2 Ray rollout actors; one is killed (by its handle) while batches are
    in flight in the second generation. Ray restarts it and reruns its batches: the Parquet
    record equals the in-process run's, every episode once."""
    import ray

    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.safety import run_safety
    from orchestrator.cluster.pool import RolloutPool
    from orchestrator.runs.store import RunStore

    real_map = RolloutPool.map
    calls = {"n": 0, "killed": 0}

    def map_and_kill(self, *a, **k):
        calls["n"] += 1
        for i, item in enumerate(real_map(self, *a, **k)):
            if calls["n"] == 2 and i == 0:
                ray.kill(self.actors[1], no_restart=False)
                calls["killed"] += 1
            yield item

    monkeypatch.setattr(RolloutPool, "map", map_and_kill)
    text = CAMPAIGN.replace("episodes: 1600", "episodes: 256").replace("generation_size: 16", "generation_size: 64")
    (tmp_path / "a.yaml").write_text(text.format(out=tmp_path / "ray").replace("workers: 0", "workers: 2"))
    run_safety(load_campaign(tmp_path / "a.yaml"), progress=False)
    assert calls["killed"] == 1
    (tmp_path / "b.yaml").write_text(text.format(out=tmp_path / "local"))
    run_safety(load_campaign(tmp_path / "b.yaml"), progress=False)
    ea = RunStore.open(tmp_path / "ray").read_episodes().sort_values(["iteration", "state_index"])
    eb = RunStore.open(tmp_path / "local").read_episodes().sort_values(["iteration", "state_index"])
    assert len(ea) == len(eb) == 256 and not ea.duplicated(["iteration", "state_index"]).any()
    np.testing.assert_array_equal(ea["return"].to_numpy(), eb["return"].to_numpy())
