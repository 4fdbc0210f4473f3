"""AUT training: a short run through the Ray Train path (in-process), resume, presets, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.campaign.train_jobs import train_aut_job
from workers.training import AutTrainConfig, TrainingError, latest_checkpoint, train_aut

REPO = Path(__file__).resolve().parents[1]


def tiny(scenario="CartPole-v1", algo="ddqn", **kw):
    base = dict(scenario=scenario, algo=algo, steps=400, steps_per_epoch=200, warmup_steps=100, buffer_size=5000,
                eval_episodes=3, device="cpu:0",
                hyperparameters={"batch_size": 32})
    base.update(kw)
    return AutTrainConfig(**base)


def test_presets_load_and_match_their_scenarios():
    for f in sorted((REPO / "experiments" / "aut").glob("*.yaml")):
        cfg = AutTrainConfig.from_file(f)
        assert f.stem == cfg.agent_name  # SCENARIO-ALGO, or the name it sets
        cfg.validate()
        assert cfg.init_from is None or Path(cfg.init_from).is_file(), f  # relative to the preset's folder


def test_ray_train_job_in_process_with_mlflow_and_resume(tmp_path):
    from orchestrator.runs import tracking

    out = tmp_path / "aut"
    run = tracking.start_run(out, "aut-training", "test", params={"steps": 400})
    state = train_aut_job(tiny(), out, tracking=run)
    assert state["step"] == 400 and state["epoch"] == 2 and len(state["history"]) == 2
    assert state["grad_steps"] == 400 - 100  # one update per step after the warm-up
    ck = latest_checkpoint(out)
    assert ck.name == "epoch-00002" and {p.name for p in ck.iterdir()} == {"model.d3", "buffer.h5", "state.json"}
    assert not list((out / "checkpoints").glob(".tmp-*"))
    assert (out / "model.d3").is_file() and (out / "final.d3").is_file() and (out / "best.d3").is_file()
    best = max(state["history"], key=lambda m: m["eval_return"])
    assert state["best"]["eval_return"] == best["eval_return"]
    import mlflow

    hist = mlflow.MlflowClient(run["tracking_uri"]).get_metric_history(run["run_id"], "eval_return")
    assert [m.step for m in hist] == [200, 400]

    # resume: continues the step and gradient counters from the checkpoint
    state2 = train_aut_job(tiny(steps=600), out, resume=True)
    assert state2["step"] == 600 and state2["epoch"] == 3 and len(state2["history"]) == 3
    assert state2["grad_steps"] == 500
    assert state2["history"][:2] == state["history"]


def test_resume_without_the_buffer_refills_it(tmp_path):
    out = tmp_path / "aut"
    train_aut(tiny(steps=200, steps_per_epoch=200), out)
    (latest_checkpoint(out) / "buffer.h5").unlink()  # as a committed checkpoint ships
    state = train_aut(tiny(steps=400, steps_per_epoch=200), out, resume=True)
    assert state["step"] == 400
    assert state["grad_steps"] < 100 + 200  # updates waited for the refill


def test_sac_trains_on_a_mujoco_scenario(tmp_path):
    cfg = tiny("Hopper-v5", "sac", steps=150, steps_per_epoch=150, warmup_steps=50, eval_episodes=2,
               hyperparameters={"batch_size": 16})
    state = train_aut(cfg, tmp_path / "sac")
    assert state["step"] == 150 and np.isfinite(state["history"][-1]["eval_return"])
    from envs import get_scenario
    from workers.policies import load_policy

    pol = load_policy(str(tmp_path / "sac" / "model.d3"), get_scenario("Hopper-v5"))
    a = pol.act(np.zeros((4, 11), np.float32))
    assert a.shape == (4, 3) and np.all(np.abs(a) <= 1)


def test_bad_training_input(tmp_path):
    with pytest.raises(TrainingError, match="Hopper-v5 has continuous actions: train it with --algo sac"):
        tiny("Hopper-v5", "ddqn").validate()
    with pytest.raises(TrainingError, match="unknown algorithm 'ppo'"):
        tiny(algo="ppo").validate()
    with pytest.raises(TrainingError, match="nothing to resume"):
        train_aut(tiny(), tmp_path / "empty", resume=True)
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenario: CartPole-v1\nalgo: ddqn\nlearning_rat: 0.1\n")
    with pytest.raises(TrainingError, match=r"unknown settings \['learning_rat'\]"):
        AutTrainConfig.from_file(bad)
    with pytest.raises(TrainingError, match="not found"):
        AutTrainConfig.from_file(tmp_path / "missing.yaml")


def _terminal_episodes(out) -> list[bool]:
    import d3rlpy

    with open(latest_checkpoint(out) / "buffer.h5", "rb") as f:
        buffer = d3rlpy.dataset.ReplayBuffer.load(f, d3rlpy.dataset.FIFOBuffer(5000))
    return [bool(ep.terminated) for ep in buffer.episodes]


def test_episode_end_truncated_bootstraps_through_failing_episode_ends(tmp_path):
    # CoopNavi's episodes all last 25 steps; a failed one (random actions: nearly all) ends
    # "terminated". episode_end: truncated stores every end as a time limit instead.
    kw = dict(steps=100, steps_per_epoch=100, warmup_steps=100, eval_episodes=1,
              hyperparameters={"batch_size": 16})
    train_aut(tiny("CoopNavi", "sac", **kw), tmp_path / "env")
    train_aut(tiny("CoopNavi", "sac", episode_end="truncated", **kw), tmp_path / "trunc")
    as_env, as_trunc = _terminal_episodes(tmp_path / "env"), _terminal_episodes(tmp_path / "trunc")
    assert len(as_env) == len(as_trunc) == 4
    assert any(as_env) and not any(as_trunc)
    with pytest.raises(TrainingError, match="episode_end"):
        tiny(episode_end="sometimes").validate()


def test_init_from_starts_from_another_runs_weights(tmp_path):
    from envs import get_scenario
    from workers.policies import load_policy

    train_aut(tiny(steps=200, steps_per_epoch=200), tmp_path / "a")
    src = tmp_path / "a" / "final.d3"
    # no steps after warm-up: the new run's policy is the loaded one, and its warm-up acted with it
    cfg = tiny(steps=100, steps_per_epoch=100, warmup_steps=200, init_from=str(src), eval_episodes=1)
    train_aut(cfg, tmp_path / "b")
    x = get_scenario("CartPole-v1").sample(np.random.default_rng(0), 64).astype(np.float32)
    a = load_policy(str(src), get_scenario("CartPole-v1")).act(x)
    b = load_policy(str(tmp_path / "b" / "final.d3"), get_scenario("CartPole-v1")).act(x)
    assert np.array_equal(a, b)
    fresh = tiny(steps=100, steps_per_epoch=100, warmup_steps=200, eval_episodes=1)
    train_aut(fresh, tmp_path / "c")
    c = load_policy(str(tmp_path / "c" / "final.d3"), get_scenario("CartPole-v1")).act(x)
    assert not np.array_equal(a, c)  # without init_from: fresh networks, other actions
    with pytest.raises(TrainingError, match="init_from: no model file"):
        train_aut(tiny(steps=10, steps_per_epoch=10, init_from=str(tmp_path / "nope.d3")), tmp_path / "d")
    hopper = tiny("Hopper-v5", "sac", steps=10, steps_per_epoch=10, init_from=str(src))
    with pytest.raises(TrainingError, match="init_from: .* is a DoubleDQN, this run trains a SAC"):
        train_aut(hopper, tmp_path / "e")


def test_select_keeps_the_epoch_closest_to_the_asked_quality(tmp_path):
    # a run without `select` keeps its best epoch; the same run (same seed) asked for the quality of
    # its worst epoch keeps that one instead, under the name it sets
    from workers.training import selection_distance

    kw = dict(steps=1000, steps_per_epoch=200, eval_episodes=10)
    best = train_aut(tiny(**kw), tmp_path / "best")
    hist = best["history"]
    returns = [m["eval_return"] for m in hist]
    assert len(set(returns)) > 1, returns  # the check needs epochs of different quality
    worst = min(hist, key=lambda m: m["eval_return"])
    assert best["best"]["epoch"] == max(hist, key=lambda m: m["eval_return"])["epoch"]
    target = {"return": worst["eval_return"], "success": 1.0 - worst["eval_failure_rate"]}
    cfg = tiny(select=target, name="CartPole-v1-ddqn-worst", **kw)
    sel = train_aut(cfg, tmp_path / "sel")
    assert [m["eval_return"] for m in sel["history"]] == returns  # selection does not change the training
    closest = min(sel["history"], key=lambda m: selection_distance(m, target))
    assert sel["best"]["epoch"] == closest["epoch"] == worst["epoch"] != best["best"]["epoch"]
    assert sel["best"]["distance"] == 0.0 and "closest to return" in sel["best"]["rule"]
    assert cfg.agent_name == "CartPole-v1-ddqn-worst" and tiny().agent_name == "CartPole-v1-ddqn"
    for bad, msg in [({"return": 1}, "select must be"), ({"return": 1, "success": 2}, "success a rate in"),
                     ({"return": "high", "success": 0.9}, "return is a number")]:
        with pytest.raises(TrainingError, match=msg):
            tiny(select=bad).validate()
    with pytest.raises(TrainingError, match="not a folder name"):
        tiny(name="a/b").validate()
