"""``execution: async``: campaigns without generation barriers (orchestrator/campaign/generations.py).

Every fuzzer runs a real campaign in the async loop (in this process; the units finish in a
shuffled order, as Ray actors would finish them): the budget is spent exactly, every episode is
recorded once, the applied order is recorded, and a replay in that order gives the same
proposals, episodes and verdicts. A killed driver resumes from the snapshot (units in flight
included) to exactly the uninterrupted run; a killed rollout actor loses and duplicates nothing.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from orchestrator.fuzzers import FUZZERS

REPO = Path(__file__).resolve().parents[1]

SAFETY = """
name: async-{fuzzer}
scenario: CartPole-v1
aut: "python:workers.examples:cartpole_balancer"
seed: 3
workers: {workers}
output: {out}
mlflow: false
safety:
  fuzzer: {fuzzer}
  budget: {{episodes: {budget}}}
  generation_size: 16
  execution: async
{llm}"""

OPTIMALITY = """
name: async-{fuzzer}
scenario: CartPole-v1
aut: "python:workers.examples:cartpole_balancer"
seed: 3
workers: {workers}
output: {out}
mlflow: false
safety: null
optimality:
  fuzzer: {fuzzer}
  challenger: "random:1"
  budget: {{episodes: {budget}}}
  generation_size: 16
  execution: async
{llm}"""


def _campaign(tmp_path, name, fuzzer, *, budget=90, workers=0, llm=""):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.fuzzers import fuzzer_class

    text = OPTIMALITY if fuzzer_class(fuzzer).needs_challenger else SAFETY
    p = tmp_path / f"{name}.yaml"
    p.write_text(text.format(fuzzer=fuzzer, out=tmp_path / name, budget=budget, workers=workers, llm=llm))
    return load_campaign(p)


def _run(campaign, **kw):
    from orchestrator.campaign.optimality import run_optimality
    from orchestrator.campaign.safety import run_safety

    return (run_optimality if campaign.optimality is not None else run_safety)(campaign, progress=False, **kw)


def _episodes(run_dir):
    from orchestrator.runs.store import RunStore

    e = RunStore.open(run_dir).read_episodes()
    return e.sort_values(["iteration", "role", "state_index"]).reset_index(drop=True)


def _verdicts(run_dir):
    import pandas as pd

    for name in ("failures.parquet", "bugs.parquet"):
        if (Path(run_dir) / name).is_file():
            return pd.read_parquet(Path(run_dir) / name).drop(columns=["wall_time"])
    return None


def _same_record(a, b):
    ea, eb = _episodes(a), _episodes(b)
    assert len(ea) == len(eb)
    np.testing.assert_array_equal(ea["iteration"].to_numpy(), eb["iteration"].to_numpy())
    np.testing.assert_array_equal(ea["return"].to_numpy(), eb["return"].to_numpy())
    np.testing.assert_array_equal(np.stack(ea["initial_state"]), np.stack(eb["initial_state"]))
    va, vb = _verdicts(a), _verdicts(b)
    assert (va is None) == (vb is None)
    if va is not None:
        assert va.equals(vb)


@pytest.fixture
def shuffled(monkeypatch):
    """In-process units finish in a (seeded) shuffled order instead of the order submitted."""
    from orchestrator.cluster.executor import Executor

    rng = random.Random(7)
    monkeypatch.setattr(Executor, "_next_local_key", lambda self: rng.choice(list(self._queued)))


@pytest.mark.campaign
@pytest.mark.parametrize("fuzzer", FUZZERS)
def test_every_fuzzer_runs_async_and_replays_to_the_same_verdicts(fuzzer, tmp_path, shuffled, monkeypatch):
    from orchestrator.campaign.generations import applied_order
    from orchestrator.cluster.executor import Executor
    from orchestrator.fuzzers import fuzzer_class

    llm = ""
    srv = None
    if fuzzer_class(fuzzer).needs_llm:
        from tests.llm_server import LLMStubServer

        srv = LLMStubServer(step=0.2).__enter__()
        llm = (f'llm: {{base_url: "{srv.base_url}", model: stub, requests_per_minute: 60000, timeout_s: 5, '
               f'max_retries: 0, backoff_s: 0.01}}\n')
    try:
        # 90 is no multiple of the unit (8): the last units are cut to the budget
        summary = _run(_campaign(tmp_path, "async", fuzzer, llm=llm))
        e = _episodes(tmp_path / "async")
        aut = e[e["role"] == "aut"]
        assert len(aut) == 90 == summary.get("episodes", summary.get("cases"))
        assert not aut.duplicated(["iteration", "state_index"]).any()
        assert summary["execution"] == "async" and summary["window"] == 2 and summary["unit_size"] == 8
        rec = applied_order(tmp_path / "async", "safety" if "episodes" in summary else "optimality")
        assert sorted(rec["order"]) == list(range(len(rec["order"])))  # every unit applied once
        assert rec["order"] != sorted(rec["order"])  # the shuffle really reordered them

        monkeypatch.setattr(Executor, "_next_local_key", lambda self: next(iter(self._queued)))
        _run(_campaign(tmp_path, "replay", fuzzer, llm=llm), replay=rec)
        _same_record(tmp_path / "async", tmp_path / "replay")
    finally:
        if srv is not None:
            srv.__exit__(None, None, None)


@pytest.mark.campaign
def test_async_in_process_without_shuffle_is_deterministic(tmp_path):
    _run(_campaign(tmp_path, "a", "curefuzz", budget=64))
    _run(_campaign(tmp_path, "b", "curefuzz", budget=64))
    _same_record(tmp_path / "a", tmp_path / "b")


@pytest.mark.campaign
def test_a_replay_of_another_campaign_is_refused(tmp_path, shuffled):
    from orchestrator.campaign.generations import applied_order
    from orchestrator.runs.store import StoreError

    _run(_campaign(tmp_path, "a", "random", budget=64))
    rec = applied_order(tmp_path / "a")
    with pytest.raises(StoreError, match="replay"):
        _run(_campaign(tmp_path, "b", "random", budget=64), replay={**rec, "order": rec["order"][::-1]})


@pytest.mark.parametrize("value", ["asynch", "ASYNC", ""])
def test_execution_is_validated(tmp_path, value):
    from orchestrator.campaign.config import CampaignError, load_campaign

    p = tmp_path / "c.yaml"
    p.write_text(SAFETY.format(fuzzer="random", out=tmp_path / "x", budget=10, workers=0, llm="")
                 .replace("execution: async", f"execution: '{value}'"))
    with pytest.raises(CampaignError, match="safety.execution must be one of sync, async"):
        load_campaign(p)


@pytest.mark.slow
def test_a_killed_async_driver_resumes_to_the_uninterrupted_run(tmp_path):
    out = tmp_path / "killed"
    p = tmp_path / "c.yaml"
    text = SAFETY.format(fuzzer="curefuzz", out=out, budget=1200, workers=0, llm="")
    p.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(p), "--quiet"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((out / "snapshots").glob("gen-*.pkl"))) < 2:
        time.sleep(0.02)
        assert proc.poll() is None, "the campaign ended before it could be killed"
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists()
    import pickle

    snap = pickle.loads(sorted((out / "snapshots").glob("gen-*.pkl"))[-1].read_bytes())
    assert snap["state"]["in_flight"]  # the snapshot holds units in flight: the resume must run them again

    resumed = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "--resume", str(out), "--quiet"],
                             cwd=REPO, capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _run(_campaign(tmp_path, "clean", "curefuzz", budget=1200))
    _same_record(out, tmp_path / "clean")
    assert len(_episodes(out)) == 1200


def test_a_rollout_actor_killed_in_an_async_campaign_loses_and_duplicates_nothing(tmp_path, ray_cluster,
                                                                                   monkeypatch):
    """Two Ray actors, units finishing in whatever order; actor 1 is killed (by its handle) with
    units in flight after the second result. Ray restarts it and reruns its units: every episode
    is recorded once, and an in-process replay in the recorded order gives the same record."""
    import ray

    from orchestrator.campaign.generations import applied_order
    from orchestrator.cluster.pool import RolloutPool

    real = RolloutPool.next_result
    calls = {"n": 0, "killed": 0}

    def next_and_kill(self, key=None):
        calls["n"] += 1
        if calls["n"] == 3:
            assert self.units_in_flight >= 2
            ray.kill(self.actors[1], no_restart=False)
            calls["killed"] += 1
        return real(self, key)

    monkeypatch.setattr(RolloutPool, "next_result", next_and_kill)
    summary = _run(_campaign(tmp_path, "ray", "curefuzz", budget=192, workers=2))
    assert calls["killed"] == 1 and summary["window"] == 4
    e = _episodes(tmp_path / "ray")
    assert len(e) == 192 and not e.duplicated(["iteration", "state_index"]).any()
    _run(_campaign(tmp_path, "replay", "curefuzz", budget=192, workers=0), replay=applied_order(tmp_path / "ray"))
    _same_record(tmp_path / "ray", tmp_path / "replay")


# -- corpus: actor ----------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,match", [("corpus: central", "safety.corpus must be one of driver, actor"),
                                         ("corpus: actor\n  execution: sync", "needs safety.execution: async")])
def test_corpus_is_validated(tmp_path, extra, match):
    from orchestrator.campaign.config import CampaignError, load_campaign

    p = tmp_path / "c.yaml"
    text = SAFETY.format(fuzzer="random", out=tmp_path / "x", budget=10, workers=0, llm="")
    p.write_text(text.replace("  execution: async\n", "") + f"  {extra}\n")
    with pytest.raises(CampaignError, match=match):
        load_campaign(p)


def test_corpus_actor_is_refused_for_an_llm_guided_fuzzer(tmp_path):
    from orchestrator.campaign.config import CampaignError, load_campaign

    p = tmp_path / "c.yaml"
    p.write_text(SAFETY.format(fuzzer="llmtester", out=tmp_path / "x", budget=10, workers=0, llm="") + "  corpus: actor\n")
    with pytest.raises(CampaignError, match="corpus: actor is not available for llmtester"):
        load_campaign(p)


@pytest.mark.campaign
def test_corpus_actor_without_ray_workers_keeps_the_corpus_in_the_driver(tmp_path):
    from orchestrator.campaign.config import load_campaign

    p = tmp_path / "c.yaml"
    p.write_text(SAFETY.format(fuzzer="curefuzz", out=tmp_path / "a", budget=48, workers=0, llm="") + "  corpus: actor\n")
    summary = _run(load_campaign(p))
    assert summary["corpus"] == "driver" and "workers: 0" in summary["corpus_reason"]
    _run(_campaign(tmp_path, "b", "curefuzz", budget=48))
    _same_record(tmp_path / "a", tmp_path / "b")


def _feedback(proposal, rng, obs_dim=4):
    """Synthetic feedback for ``proposal``: trajectories of random length near the states."""
    from orchestrator.fuzzers import Feedback

    n = len(proposal)
    lengths = rng.integers(5, 40, size=n)
    traj = [(proposal.states[i, :obs_dim] + 0.05 * rng.standard_normal((int(t) + 1, obs_dim))).astype(np.float32)
            for i, t in enumerate(lengths)]
    returns = lengths.astype(np.float64)
    return Feedback(returns=returns, lengths=lengths, terminated=lengths < 39, failure=lengths < 8, traj_obs=traj)


def _wait_until_dead(actor, timeout: float = 60.0) -> None:
    """Block until calls to ``actor`` fail: ``ray.kill`` is asynchronous, and a call sent right
    after it may still be served (CI saw one of two kills go unnoticed that way)."""
    import time

    import ray
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=10)
        except RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def test_a_killed_corpus_actor_is_restored_to_the_corpus_before_the_kill(ray_cluster):
    """The handle restores a killed actor from its last ``state_dict`` and makes the calls since
    then again: the next proposals are those of a fuzzer that was never killed."""
    import ray

    from envs import get_scenario
    from orchestrator.cluster.corpus_actor import RemoteFuzzer
    from orchestrator.fuzzers import make_fuzzer

    local = make_fuzzer("curefuzz", get_scenario("CartPole-v1"), seed=5)
    remote = RemoteFuzzer(make_fuzzer("curefuzz", get_scenario("CartPole-v1"), seed=5))
    rng_l, rng_r = np.random.default_rng(1), np.random.default_rng(1)
    try:
        for step in range(12):
            if step == 4:
                for f in (local, remote):
                    f.start_phase("fuzzing")
            if step == 6:
                remote.state_dict()  # a snapshot: the restore point
            if step in (9, 11):  # calls made since the snapshot must be made again
                assert remote._journal
                ray.kill(remote._actor, no_restart=True)
                _wait_until_dead(remote._actor)  # ray.kill returns before the actor is gone
            pl, pr = local.propose(8), remote.propose(8)
            np.testing.assert_array_equal(pl.states, pr.states)
            local.observe(pl, _feedback(pl, rng_l))
            remote.observe(pr, _feedback(pr, rng_r))
        assert remote.restores == 2 and remote.restore_mismatches == 0
        np.testing.assert_array_equal(local.propose(16).states, remote.propose(16).states)
    finally:
        remote.close()


def test_a_corpus_actor_killed_in_an_async_campaign_is_restored_and_loses_nothing(tmp_path, ray_cluster,
                                                                                   monkeypatch):
    """``corpus: actor`` with two Ray rollout actors; the corpus actor is killed twice mid-run,
    each time with results applied since the last snapshot. The run spends its whole budget,
    records every episode once, and gives the verdicts of an in-process replay in its applied
    order (corpus in the driver, never killed)."""
    import ray

    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.generations import applied_order
    from orchestrator.cluster import corpus_actor
    from orchestrator.cluster.pool import RolloutPool

    handles = []
    real_init = corpus_actor.RemoteFuzzer.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        handles.append(self)

    real = RolloutPool.next_result
    calls = {"n": 0, "killed": []}

    def next_and_kill(self, key=None):
        calls["n"] += 1
        (h,) = handles
        if len(calls["killed"]) < 2 and calls["n"] >= 3 + 6 * len(calls["killed"]) \
                and any(m == "observe" for m, _, _ in h._journal):
            calls["killed"].append(calls["n"])
            ray.kill(h._actor, no_restart=True)
        return real(self, key)

    monkeypatch.setattr(corpus_actor.RemoteFuzzer, "__init__", init)
    monkeypatch.setattr(RolloutPool, "next_result", next_and_kill)
    p = tmp_path / "ray.yaml"
    p.write_text(SAFETY.format(fuzzer="curefuzz", out=tmp_path / "ray", budget=192, workers=2, llm="")
                 + "  corpus: actor\n")
    summary = _run(load_campaign(p))
    assert len(calls["killed"]) == 2 and summary["corpus"] == "actor" and summary["corpus_restores"] == 2
    assert handles[0].restore_mismatches == 0
    e = _episodes(tmp_path / "ray")
    assert len(e) == 192 == summary["episodes"] and not e.duplicated(["iteration", "state_index"]).any()
    _run(_campaign(tmp_path, "replay", "curefuzz", budget=192, workers=0), replay=applied_order(tmp_path / "ray"))
    _same_record(tmp_path / "ray", tmp_path / "replay")


def test_an_optimality_phase_with_its_corpus_in_an_actor_replays_to_the_same_verdicts(tmp_path, ray_cluster):
    """Delta (reads both agents; its summary reads the fuzzer's stats through the actor) with
    ``corpus: actor``: the in-process replay in the recorded order gives the same record."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.generations import applied_order

    p = tmp_path / "ray.yaml"
    p.write_text(OPTIMALITY.format(fuzzer="delta", out=tmp_path / "ray", budget=48, workers=2, llm="")
                 + "  corpus: actor\n")
    summary = _run(load_campaign(p))
    assert summary["corpus"] == "actor" and summary["corpus_restores"] == 0 and summary["cases"] == 48
    assert 0 <= summary["decision_share_diversity"] <= 1  # Delta's stats, read from the actor
    _run(_campaign(tmp_path, "replay", "delta", budget=48, workers=0),
         replay=applied_order(tmp_path / "ray", "optimality"))
    _same_record(tmp_path / "ray", tmp_path / "replay")
