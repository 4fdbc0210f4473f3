"""Placement: on a cluster that has GPUs, rollout actors each hold a GPU fraction; on a CPU-only
one they hold none. A GPU is declared to a separate local Ray (in a subprocess) without a
physical one, which is how Ray sees a GPU node's resources; inference then falls back to the
CPU because torch finds no CUDA device, so this checks the placement, not GPU arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import json, os, sys, ray
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=2, num_gpus=float(sys.argv[1]), include_dashboard=False,
             logging_level="ERROR")
    from orchestrator.cluster.pool import RolloutPool
    pool = RolloutPool("CartPole-v1", {"aut": "python:workers.examples:cartpole_balancer"}, workers=2)
    got = [ray.get(a.__ray_call__.remote(lambda self: ray.get_runtime_context().get_assigned_resources()))
           for a in pool.actors]
    print("RESULT " + json.dumps(got))
""")


@pytest.mark.slow
@pytest.mark.parametrize("gpus, want", [(1, 0.25), (0, 0.0)])
def test_rollout_actors_take_a_gpu_fraction_only_when_the_cluster_has_gpus(gpus, want):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(gpus)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, out.stderr[-3000:]
    for res in json.loads(line[7:]):
        assert res.get("CPU") == 1.0 and res.get("GPU", 0.0) == want


@pytest.mark.slow
def test_training_goes_to_a_gpu_worker_only_when_the_cluster_has_gpus(monkeypatch, tmp_path):
    """run_train_job's choice: one GPU worker with GPUs, in-process (num_workers=0) without.
    A GPU training cannot run on this GPU-less machine, so the trainer is replaced by a recorder
    of the ScalingConfig it would get (the CPU path itself runs for real in test_training.py)."""
    import ray.train.torch

    from orchestrator.campaign import train_jobs as training

    seen = {}

    class FakeTrainer:  # records the ScalingConfig Ray Train would get, runs nothing
        def __init__(self, fn, train_loop_config, scaling_config, run_config):
            seen["scaling"], seen["config"] = scaling_config, train_loop_config

        def fit(self):
            return None

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", FakeTrainer)
    training.run_train_job(lambda c: None, {}, tmp_path, name="t", use_gpu=True)
    assert (seen["scaling"].num_workers, seen["scaling"].use_gpu, seen["config"]["use_gpu"]) == (1, True, True)
    training.run_train_job(lambda c: None, {}, tmp_path, name="t", use_gpu=False)
    assert (seen["scaling"].num_workers, seen["scaling"].use_gpu) == (0, False)
