"""RolloutWorker actors on the shared local Ray cluster give the same episodes as in-process."""

from __future__ import annotations

import os

import numpy as np
import pytest

from envs import get_scenario
from workers.policies import load_policy
from workers.rollout import RolloutResult, rollout

pytestmark = pytest.mark.ray

URIS = {"aut": "python:workers.examples:acrobot_swing", "challenger": "random:5"}


def test_pool_matches_in_process_rollout(ray_cluster):
    from orchestrator.cluster.pool import RolloutPool

    sc = get_scenario("Acrobot-v1")
    states = sc.sample(np.random.default_rng(11), 30)
    pool = RolloutPool(sc.name, URIS, workers=2, batch_size=8, in_flight=2)
    try:
        parts = list(pool.map(states, repeats=2, seed=9, max_steps=80, chunk=7))
        assert pool.policy_hashes["aut"] and pool.policy_hashes["challenger"]
    finally:
        pool.shutdown()
    assert sorted(lo for lo, _ in parts) == list(range(0, 30, 7))
    got = RolloutResult.concat([r for _, r in parts])
    policies = {role: load_policy(uri, sc) for role, uri in URIS.items()}
    want = rollout(sc, policies, states, repeats=2, seed=9, max_steps=80)
    key = lambda r: np.lexsort((r.repeat, r.state_index, r.role.astype(str)))  # noqa: E731
    g, w = key(got), key(want)
    assert got.n_episodes == want.n_episodes == 2 * 2 * 30
    for f in ("returns", "lengths", "seed", "state_index", "repeat", "failure"):
        np.testing.assert_array_equal(getattr(got, f)[g], getattr(want, f)[w], err_msg=f)
    assert got.n_steps == want.n_steps


def test_a_killed_rollout_actor_is_restarted_and_its_batches_rerun(ray_cluster):
    """Kill an actor (by its id) while it has batches in flight: the union of the chunks still
    equals the in-process rollout, each episode exactly once."""
    import ray

    from orchestrator.cluster.pool import RolloutPool

    sc = get_scenario("Acrobot-v1")
    states = sc.sample(np.random.default_rng(3), 40)
    pool = RolloutPool(sc.name, URIS, workers=2, batch_size=8, in_flight=2)
    try:
        victim = pool.actors[0]
        pid_before = ray.get(victim.__ray_call__.remote(lambda self: os.getpid()))
        parts, killed = [], False
        for lo, res in pool.map(states, seed=4, max_steps=120, chunk=4):
            parts.append((lo, res))
            if not killed:  # after the first chunk: the victim still has batches in flight
                ray.kill(victim, no_restart=False)  # the process dies; Ray restarts the actor
                killed = True
        assert killed
        # the same handle reaches the restarted actor, in a new process
        assert ray.get(victim.__ray_call__.remote(lambda self: os.getpid())) != pid_before
    finally:
        pool.shutdown()
    offsets = sorted(lo for lo, _ in parts)
    assert offsets == list(range(0, 40, 4))  # every chunk once
    got = RolloutResult.concat([r for _, r in parts])
    policies = {role: load_policy(uri, sc) for role, uri in URIS.items()}
    want = rollout(sc, policies, states, seed=4, max_steps=120)
    key = lambda r: np.lexsort((r.repeat, r.state_index, r.role.astype(str)))  # noqa: E731
    assert got.n_episodes == want.n_episodes == 2 * 40 and got.n_steps == want.n_steps
    np.testing.assert_array_equal(got.returns[key(got)], want.returns[key(want)])


def test_pool_reports_a_policy_that_does_not_load(ray_cluster):
    from orchestrator.cluster.pool import RolloutPool

    with pytest.raises(Exception, match="policy file not found"):
        RolloutPool("CartPole-v1", {"aut": "/nonexistent/aut.pt"}, workers=1)


def test_actors_use_no_gpu_on_a_cpu_cluster(ray_cluster):
    import ray

    from orchestrator.cluster.pool import RolloutPool

    assert ray.cluster_resources().get("GPU", 0) == 0
    pool = RolloutPool("CartPole-v1", {"aut": "python:workers.examples:cartpole_balancer"}, workers=1)
    try:
        avail = ray.available_resources()
        assert avail.get("CPU", 0) <= ray.cluster_resources()["CPU"] - 1  # the actor holds one CPU
    finally:
        pool.shutdown()


def test_corpus_actor_holds_a_corpus(ray_cluster):
    import ray

    from orchestrator.cluster.pool import corpus_actor_class
    from orchestrator.fuzzers.corpus import Corpus

    actor = corpus_actor_class(Corpus).remote(2)
    ids = ray.get(actor.add.remote(np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]), energy=[0.0, 1.0, 0.0], ret=[1, 2, 3]))
    assert list(ids) == [0, 1, 2]
    picks = ray.get(actor.select.remote(np.random.default_rng(0), 20))
    assert set(picks.tolist()) == {1}  # all the energy is on the second seed
    ray.get(actor.remove.remote([1]))
    local = Corpus(2)
    local.load_state_dict(ray.get(actor.state_dict.remote()))
    assert len(local) == 2 and local.scores["ret"].tolist() == [1.0, 3.0]
    ray.kill(actor)


def test_campaign_metrics_reach_ray_when_it_runs(ray_cluster):
    from orchestrator.cluster.progress import CampaignMetrics

    m = CampaignMetrics("metrics-test", "safety")
    assert m.on
    m.update(episodes=64, failures=3)  # through ray.util.metrics, no error
    m.update(bugs=2)


def test_actors_are_named_by_campaign_and_role_and_progress_is_an_actor(ray_cluster):
    """What the dashboard lists: rollout actors named ``CAMPAIGN/PHASE/rollout-i`` (a second pool
    of the same name gets free names), and the campaign's progress actor with one update per call."""
    import ray

    from orchestrator.cluster.dashboard import dashboard_info
    from orchestrator.cluster.pool import RolloutPool, named_actor
    from orchestrator.cluster.progress import CampaignMetrics

    uris = {"aut": "python:workers.examples:cartpole_balancer"}
    pool = RolloutPool("CartPole-v1", uris, workers=2, name="named-test/safety")
    try:
        assert ray.get_actor("named-test/safety/rollout-0") and ray.get_actor("named-test/safety/rollout-1")
    finally:
        pool.shutdown()
    pool = RolloutPool("CartPole-v1", uris, workers=1, name="named-test/optimality")
    try:  # the name is taken (by that pool): another actor of this driver gets the next free one
        class Probe:
            def ping(self):
                return 1

        handle = named_actor(ray.remote(num_cpus=0)(Probe), "named-test/optimality/rollout-0").remote()
        assert ray.get(ray.get_actor("named-test/optimality/rollout-0~2").ping.remote()) == 1
        ray.kill(handle)
    finally:
        pool.shutdown()
    m = CampaignMetrics("named-test", "safety")
    m.update(episodes=32, failures=4, progress="32/64 episodes")
    m.update(episodes=32, failures=5, progress="64/64 episodes")
    state = ray.get(ray.get_actor("deltarl/named-test/progress").state.remote())
    assert state["phases"]["safety"] == {"progress": "64/64 episodes", "failures": 5, "bugs": None}
    assert dashboard_info() is None  # the test cluster runs without a dashboard


def _gone(name: str, wait: float = 30.0) -> bool:
    """Whether the named actor is gone within ``wait`` s (Ray ends an actor asynchronously)."""
    import time

    import ray

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            return True
        time.sleep(0.2)
    return False


def test_a_driver_session_holds_the_progress_actor_across_phases_until_it_ends(ray_cluster):
    """``deltarl run``'s session keeps one progress actor for all the campaign's phases (each
    phase's metrics object is gone before the next is made) and lets it go when it ends;
    ``release_progress`` ends one at once (a grid's worker after each campaign)."""
    import gc

    import ray

    from orchestrator.cluster.progress import CampaignMetrics, release_progress
    from orchestrator.cluster.session import DriverSession

    with DriverSession():
        for phase, kw in (("safety", {"failures": 1, "progress": "8/8 episodes"}),
                          ("optimality", {"bugs": 2, "progress": "4/4 cases"})):
            m = CampaignMetrics("session-test", phase)
            m.update(episodes=8, **kw)
            del m
            gc.collect()
        state = ray.get(ray.get_actor("deltarl/session-test/progress").state.remote())
        assert state["phases"] == {"safety": {"progress": "8/8 episodes", "failures": 1, "bugs": None},
                                   "optimality": {"progress": "4/4 cases", "failures": None, "bugs": 2}}
        CampaignMetrics("release-test", "safety").update(episodes=1, progress="1/1 episodes")
        assert release_progress("release-test") and _gone("deltarl/release-test/progress")
        assert not release_progress("release-test")
        assert ray.get_actor("deltarl/session-test/progress")  # the session still holds it
    assert _gone("deltarl/session-test/progress"), "the session's end left its progress actor up"
