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


@pytest.mark.training
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


@pytest.mark.training
def test_resume_without_the_buffer_refills_it(tmp_path):
    out = tmp_path / "aut"
    train_aut(tiny(steps=200, steps_per_epoch=200), out)
    (latest_checkpoint(out) / "buffer.h5").unlink()  # as a committed checkpoint ships
    state = train_aut(tiny(steps=400, steps_per_epoch=200), out, resume=True)
    assert state["step"] == 400
    assert state["grad_steps"] < 100 + 200  # updates waited for the refill


@pytest.mark.training
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


@pytest.mark.training
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


@pytest.mark.training
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



# --- challenger speed (issue #52): oneDNN for the no-grad passes (workers.challenger.fuse_no_grad_forward) ---

def _hopper_data():
    """Hopper-sized (11 -> 3) random transitions: 10 episodes of 200 steps."""
    from workers.datasets import steps_to_mdp_dataset

    rng = np.random.default_rng(0)
    n, length = 2000, 200
    eid = np.repeat(np.arange(n // length), length)
    last = np.r_[eid[1:] != eid[:-1], True]
    return steps_to_mdp_dataset({"episode_id": eid, "obs": rng.normal(size=(n, 11)).astype(np.float32),
                                 "actions": rng.uniform(-1, 1, size=(n, 3)).astype(np.float32),
                                 "rewards": rng.normal(size=n).astype(np.float32), "terminals": last,
                                 "timeouts": np.zeros(n, bool)}, discrete=False, action_size=3)


def _small_hyperparameters(algo_name: str) -> dict:
    """The mujoco preset's settings of ``algo_name`` with small networks, batch and sampled actions."""
    from workers.challenger import challenger_config

    hp = dict(challenger_config("Hopper-v5", algo_name, "mujoco").hyperparameters, batch_size=16)
    for k in [k for k in hp if k.endswith("encoder_factory")]:
        hp[k] = {"type": "vector", "params": {"hidden_units": [48, 40]}}
    if "n_action_samples" in hp:
        hp["n_action_samples"] = 6
    return hp


def _small_challenger(algo_name: str, fused: bool):
    """(algo, sampler, encoders switched): a d3rlpy BC/BCQ/CQL with small networks on Hopper-sized
    transitions, the same initial weights every call."""
    import d3rlpy

    from workers.challenger import challenger_config, fuse_no_grad_forward
    from workers.datasets import TransitionSampler
    from workers.training import d3rlpy_config

    data = _hopper_data()
    d3rlpy.seed(0)
    cls = challenger_config("Hopper-v5", algo_name, "mujoco").config_class(False)
    algo = d3rlpy_config(cls, _small_hyperparameters(algo_name), "test").create(device="cpu:0")
    algo.build_with_dataset(data)
    switched = fuse_no_grad_forward(algo) if fused else 0
    return algo, TransitionSampler(data), switched


def _weights_after(algo, sampler, steps: int = 5) -> dict:
    import torch

    np.random.seed(1)  # the minibatches
    torch.manual_seed(1)  # the sampled latents and actions
    for _ in range(steps):
        algo.update(sampler.sample(16))
    mods = algo.impl.modules
    return {f"{f}.{k}": v.detach().clone() for f in ("policy", "q_funcs", "vae_decoder", "vae_encoder")
            if hasattr(mods, f) for k, v in getattr(mods, f).state_dict().items()}


def _ops(fn) -> set:
    """The aten/mkldnn operators ``fn`` dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


def _torch_batch(algo, batch):
    from d3rlpy.torch_utility import TorchMiniBatch

    c = algo.config
    return TorchMiniBatch.from_batch(batch, c.gamma, False, "cpu:0", c.observation_scaler, c.action_scaler,
                                     c.reward_scaler)


@pytest.mark.training
def test_fused_no_grad_forward_leaves_gradient_passes_bit_identical(one_torch_thread):
    import torch

    # BC's update runs with autograd on throughout: fused or not, the same weights bit for bit
    plain, s1, _ = _small_challenger("bc", fused=False)
    fused, s2, switched = _small_challenger("bc", fused=True)
    assert switched == 1
    a, b = _weights_after(plain, s1), _weights_after(fused, s2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # ... while its greedy action (no grad) is the oneDNN call, close to d3rlpy's
    x = np.random.default_rng(2).normal(size=(64, 11)).astype(np.float32)
    assert "mkldnn._linear_pointwise" in _ops(lambda: fused.predict(x))
    assert "mkldnn._linear_pointwise" not in _ops(lambda: plain.predict(x))
    np.testing.assert_allclose(fused.predict(x), plain.predict(x), rtol=1e-5, atol=1e-6)


@pytest.mark.training
@pytest.mark.parametrize("algo_name", ["bcq", "cql"])
def test_fused_no_grad_forward_is_the_same_update_and_deterministic(one_torch_thread, algo_name, tmp_path):
    import d3rlpy
    import torch

    plain, s1, _ = _small_challenger(algo_name, fused=False)
    fused, s2, switched = _small_challenger(algo_name, fused=True)
    # every vector encoder, targets included: BCQ policy x2, critics x4, VAE x2; CQL policy, critics x4
    assert switched == (8 if algo_name == "bcq" else 5)
    batch = s1.sample(16)
    # the no-grad target: through oneDNN, the same values up to float32 summation order
    assert "mkldnn._linear_pointwise" in _ops(lambda: fused.impl.compute_target(_torch_batch(fused, batch)))
    assert "mkldnn._linear_pointwise" not in _ops(lambda: plain.impl.compute_target(_torch_batch(plain, batch)))
    torch.manual_seed(3)
    want = plain.impl.compute_target(_torch_batch(plain, batch))
    torch.manual_seed(3)
    torch.testing.assert_close(fused.impl.compute_target(_torch_batch(fused, batch)), want, rtol=1e-5, atol=1e-5)
    # five updates: the same weights up to float32 rounding
    a, b = _weights_after(plain, s1), _weights_after(fused, s2)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    # deterministic: the same seed, the same weights bit for bit
    again, s3, _ = _small_challenger(algo_name, fused=True)
    c = _weights_after(again, s3)
    assert all(torch.equal(b[k], c[k]) for k in b)
    # saved and loaded as any d3rlpy model (the state_dict is d3rlpy's)
    fused.save(str(tmp_path / "m.d3"))
    back = d3rlpy.load_learnable(str(tmp_path / "m.d3"), device="cpu:0")
    got = {k: v for k, v in back.impl.modules.q_funcs.state_dict().items()}
    assert all(torch.equal(got[k], b[f"q_funcs.{k}"]) for k in got)


@pytest.mark.training
def test_challenger_config_onednn_no_grad_trains(tmp_path, one_torch_thread):
    from workers.challenger import challenger_config, train_challenger

    cfg = challenger_config("Hopper-v5", "bcq", "mujoco", steps=4, steps_per_epoch=4, eval_episodes=0)
    assert cfg.onednn_no_grad is False  # d3rlpy as it is unless asked
    cfg.onednn_no_grad = True
    cfg.hyperparameters = _small_hyperparameters("bcq")
    state = train_challenger(cfg, _hopper_data(), tmp_path / "bcq")
    assert state["step"] == 4 and (tmp_path / "bcq" / "model.d3").is_file()
