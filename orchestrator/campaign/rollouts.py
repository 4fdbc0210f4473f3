"""Record a policy's episodes from given initial states into a new run folder (``deltarl rollout``).

    summary = record_rollouts(scenario, "zoo:CartPole-v1", states, "runs/cp", workers=0)

The states run through the one executor (in this process or on Ray actors), each finished part
is written to the Parquet store as it arrives (phase ``rollout``), and ``summary.json`` holds
the aggregate (mean return with its 95% CI margin, failures, throughput).
"""

from __future__ import annotations

import shutil
import sys
import time

import numpy as np
from tqdm import tqdm

from orchestrator.analysis.stats import mean_ci
from orchestrator.cluster.executor import Executor
from orchestrator.runs.files import new_run_id
from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import RunStore
from workers.policies import load_policy
from workers.rollout import RolloutResult


def record_rollouts(scenario, policy_uri: str, states: np.ndarray, out, *, workers: int = 0, batch_size: int = 256,
                    seed: int = 0, max_steps: int | None = None, dashboard: bool = False, progress: bool = True) -> dict:
    """Run ``policy_uri`` from ``states``; write steps, episodes and ``summary.json`` under ``out``."""
    policy = load_policy(policy_uri, scenario)  # raises PolicyError with the reason, before anything is written
    run = RunFolder(out)
    if run.is_run():
        RunStore.check_new(out)  # "already holds run ...": the store's own message
    run.check_empty()  # files already there are never overwritten
    with run.lock("deltarl rollout"):
        run.check_empty()
        try:
            return _record(scenario, policy_uri, policy, states, run, workers=workers, batch_size=batch_size, seed=seed,
                           max_steps=max_steps, dashboard=dashboard, progress=progress)
        except Exception:
            if not any(run.episodes_dir.glob("*.parquet")):  # nothing recorded: leave the folder as found
                for name in run.entries():
                    path = run.root / name
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            raise


def _record(scenario, policy_uri: str, policy, states: np.ndarray, run: RunFolder, *, workers: int, batch_size: int,
            seed: int, max_steps: int | None, dashboard: bool, progress: bool) -> dict:
    out = run.root
    run_id = new_run_id("rollout")
    store = RunStore.create(out, scenario, run_id)
    n = states.shape[0]
    results = []
    with Executor(scenario, {"aut": policy_uri}, workers=workers, batch_size=batch_size,
                  policies={"aut": policy}, dashboard=dashboard) as ex:
        t0 = time.perf_counter()  # episodes/s counts the rollouts, not Ray's start-up
        bar = tqdm(total=n, unit="ep", desc=scenario.name, disable=not progress or None, file=sys.stderr)
        for i, (_, res) in enumerate(ex.stream(states, seed=seed, max_steps=max_steps)):
            store.write(res, phase="rollout", iteration=i, wall_time=time.perf_counter() - t0,
                        policy_sha256=ex.policy_hashes)
            results.append(res)
            bar.update(res.n_episodes)
        bar.close()
        wall = time.perf_counter() - t0
    all_results = RolloutResult.concat(results)
    summary = all_results.summary()
    summary.update(ci95_margin=mean_ci(all_results.returns)[1], run_id=run_id, scenario=scenario.name,
                   policy=policy_uri, policy_sha256=ex.policy_hashes["aut"], workers=workers, executor=ex.kind,
                   seed=seed, wall_seconds=wall, startup_seconds=ex.startup_seconds,
                   episodes_per_second=n / wall if wall > 0 else float("inf"))
    run.write_json(run.summary_json("safety"), summary)
    return summary
