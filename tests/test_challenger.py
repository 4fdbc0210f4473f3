"""Challengers (Delta phase 2): presets, offline training on D of a safety run, the Ray Train
path with MLflow and resume, the card, the campaign phase and the errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from envs import SCENARIOS, get_scenario
from orchestrator.runs.store import RunStore, StoreError
from workers.challenger import (
    ALGOS,
    ChallengerConfig,
    challenger_config,
    list_presets,
    train_challenger,
)
from workers.policies import load_policy
from workers.rollout import rollout
from workers.training import TrainingError

BALANCER = "python:workers.examples:cartpole_balancer"


def safety_run(tmp_path, scenario="CartPole-v1", aut=BALANCER, episodes=48, name="safety", extra=""):
    """A small real safety run (in this process) whose record D the challengers learn from."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.safety import run_safety

    out = tmp_path / name
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"""
scenario: {scenario}
aut: "{aut}"
workers: 0
output: {out}
mlflow: false
safety:
  fuzzer: random
  budget: {{episodes: {episodes}}}
  generation_size: 16
{extra}""")
    run_safety(load_campaign(p), progress=False)
    return out


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    return safety_run(tmp_path_factory.mktemp("cp"))


@pytest.fixture(scope="module")
def hopper_run(tmp_path_factory):
    return safety_run(tmp_path_factory.mktemp("hop"), scenario="Hopper-v5", aut="random:0", episodes=16)


@pytest.mark.slow
def test_every_scenario_has_valid_presets_for_every_algorithm():
    covered = {s for scens in list_presets().values() for s in scens}
    assert covered == set(SCENARIOS)
    for s in SCENARIOS:
        for algo in ALGOS:
            cfg = challenger_config(s, algo)
            cfg.validate()  # builds the d3rlpy config: every preset value is a real setting
            assert cfg.preset.endswith(".yaml") and cfg.steps >= 1
    # the preset's values (Scope-RL's, and deltarl's measured changes) reach d3rlpy
    import d3rlpy

    cfg = challenger_config("CartPole-v1", "bcq")
    from workers.training import d3rlpy_config

    c = d3rlpy_config(d3rlpy.algos.DiscreteBCQConfig, cfg.hyperparameters, "t")
    assert (c.learning_rate, c.target_update_interval, c.beta) == (1e-3, 1000, 0.1)  # Scope-RL's CartPole BCQ
    assert (c.batch_size, c.action_flexibility, c.share_encoder) == (256, 0.9, False)  # deltarl's changes
    assert c.encoder_factory.hidden_units == [30, 30] and type(c.observation_scaler).__name__ == "StandardObservationScaler"
    assert challenger_config("CartPole-v1", "bcq", steps=77).steps == 77


@pytest.mark.slow
def test_a_preset_marked_default_false_is_used_only_when_named():
    # mujoco-local covers the MuJoCo scenarios too and sorts before mujoco: it must never be the default
    assert "mujoco-local" in list_presets() and "mujoco-local" not in list_presets(defaults_only=True)
    for s in ("Hopper-v5", "Walker2d-v5", "Hopper-Noise"):
        assert challenger_config(s, "bcq").preset.endswith("/mujoco.yaml")
        assert challenger_config(s, "bcq").hyperparameters["n_action_samples"] == 100
    local = challenger_config("Hopper-v5", "bcq", "mujoco-local")
    local.validate()
    assert local.preset.endswith("/mujoco-local.yaml") and local.hyperparameters["n_action_samples"] == 10
    assert (local.steps, local.torch_threads) == (24000, 1)
    assert challenger_config("Hopper-v5", "bcq", "mujoco-local", steps=5).steps == 5  # a campaign's steps win


@pytest.mark.training
@pytest.mark.parametrize("algo", ALGOS)
def test_each_algorithm_trains_on_discrete_D_and_acts_in_the_engine(cartpole_run, tmp_path, algo):
    store = RunStore.open(cartpole_run)
    data = store.to_mdp_dataset(phase=["sampling", "fuzzing"])
    cfg = challenger_config("CartPole-v1", algo, steps=60, steps_per_epoch=30, eval_episodes=2, device="cpu:0")
    state = train_challenger(cfg, data, tmp_path / algo)
    assert state["step"] == 60 and state["epoch"] == 2 and state["grad_steps"] == 60
    assert state["transitions"] == data.transition_count and state["episodes"] == 48
    assert all(np.isfinite(v) for m in state["history"] for k, v in m.items() if "loss" in k)
    scenario = get_scenario("CartPole-v1")
    policy = load_policy(str(tmp_path / algo / "model.d3"), scenario)
    res = rollout(scenario, policy, scenario.sample(np.random.default_rng(0), 8), seed=0)
    assert res.lengths.min() >= 1 and set(np.unique(res.actions)) <= {0, 1}


@pytest.mark.training
@pytest.mark.parametrize("algo", ALGOS)
def test_each_algorithm_trains_on_continuous_D(hopper_run, tmp_path, algo):
    data = RunStore.open(hopper_run).to_mdp_dataset(phase=["sampling", "fuzzing"])
    cfg = challenger_config("Hopper-v5", algo, steps=4, steps_per_epoch=2, eval_episodes=0, device="cpu:0")
    cfg.hyperparameters["batch_size"] = 16
    state = train_challenger(cfg, data, tmp_path / algo)
    assert state["step"] == 4 and "eval_return" not in state["history"][-1]
    scenario = get_scenario("Hopper-v5")
    policy = load_policy(str(tmp_path / algo / "model.d3"), scenario)
    res = rollout(scenario, policy, scenario.sample(np.random.default_rng(0), 2), seed=0, max_steps=20)
    assert res.actions.shape[1] == 3 and np.all(np.abs(res.actions) <= 1.0)


def test_ray_train_job_card_mlflow_and_resume(cartpole_run, tmp_path, ray_cluster):
    import mlflow

    from orchestrator.analysis.evaluation import evaluate_policy
    from orchestrator.campaign.challenger import train_run_challenger

    out = tmp_path / "bcq"
    # the safety run's campaign names the AUT: the card evaluates both from the same starts
    card = train_run_challenger(cartpole_run, "bcq", steps=40, out=out, eval_episodes=5, progress=False)
    assert card["steps"] == 40 and card["dataset"]["episodes"] == 48
    assert card["dataset"]["phases"] == ["sampling", "fuzzing"]
    assert card["aut"]["policy"] == BALANCER
    assert card["return_vs_aut"]["difference"] == pytest.approx(
        card["evaluation"]["mean_return"] - card["aut"]["evaluation"]["mean_return"])
    again = evaluate_policy(get_scenario("CartPole-v1"), str(out / "model.d3"), 5, seed=2024)
    assert again["mean_return"] == card["evaluation"]["mean_return"]
    # TorchScript export acts like the d3rlpy model
    assert card["torchscript"] == "policy.pt"
    scenario = get_scenario("CartPole-v1")
    obs = scenario.sample(np.random.default_rng(1), 32).astype(np.float32)
    a = load_policy(str(out / "model.d3"), scenario).act(obs)
    b = load_policy(str(out / "policy.pt"), scenario).act(obs)
    assert np.array_equal(a, b)
    # MLflow in the run folder: per-epoch metrics and the final ones
    client = mlflow.MlflowClient(f"sqlite:///{Path(cartpole_run).resolve() / 'mlflow.db'}")
    exp = client.get_experiment_by_name("challenger-training")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.metrics["final_mean_return"] == card["evaluation"]["mean_return"]
    assert len(client.get_metric_history(runs[0].info.run_id, "loss")) == 1  # 40 steps < one 1000-step epoch

    # resume continues the counters from the last checkpoint
    with pytest.raises(TrainingError, match="already holds a bcq challenger"):
        train_run_challenger(cartpole_run, "bcq", steps=80, out=out, progress=False)
    card2 = train_run_challenger(cartpole_run, "bcq", steps=80, out=out, resume=True, eval_episodes=5,
                                 progress=False, mlflow=False)
    state = json.loads((out / "training.json").read_text())
    assert card2["steps"] == 80 and state["grad_steps"] == 80 and state["epoch"] == 2


def test_campaign_challenger_phase_trains_from_the_runs_D(tmp_path, ray_cluster):
    from orchestrator.cli import main

    out = safety_run(tmp_path, episodes=32, name="camp",
                     extra="challenger:\n  algos: [bc]\n  steps: 30\n  eval_episodes: 4\n  torch_threads: 1\n")
    # the safety phase already ran; `--resume` finishes the campaign with its challenger phase
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    card = json.loads((out / "challengers" / "bc" / "card.json").read_text())
    assert card["steps"] == 30 and card["dataset"]["episodes"] == 32
    assert card["config"]["torch_threads"] == 1  # the campaign's setting, not the preset's 2
    mtime = (out / "challengers" / "bc" / "card.json").stat().st_mtime
    assert main(["run", "--resume", str(out), "--quiet"]) == 0  # a finished challenger is kept
    assert (out / "challengers" / "bc" / "card.json").stat().st_mtime == mtime


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(algo="awac"), "unknown challenger algorithm 'awac'; choose one of bc, bcq, cql"),
        (dict(preset="nope"), "challenger preset 'nope' not found"),
        (dict(preset="mujoco"), "has no settings for CartPole-v1 (it covers Hopper-v5, Walker2d-v5, Hopper-Noise)"),
    ],
)
def test_bad_challenger_settings(kwargs, message):
    args = {"scenario": "CartPole-v1", "algo": "bcq", **kwargs}
    with pytest.raises(TrainingError) as e:
        challenger_config(args.pop("scenario"), args.pop("algo"), **args)
    assert message in str(e.value)


@pytest.mark.campaign
def test_bad_hyperparameters_and_data_are_named(cartpole_run, hopper_run, tmp_path):
    cfg = ChallengerConfig("CartPole-v1", "bcq", hyperparameters={"learning_rat": 0.1})
    with pytest.raises(TrainingError, match="unknown DiscreteBCQConfig setting 'learning_rat'"):
        cfg.validate()
    cfg = ChallengerConfig("CartPole-v1", "bcq", hyperparameters={"encoder_factory": {"type": "vectr"}})
    with pytest.raises(TrainingError, match="unknown factory type 'vectr'"):
        cfg.validate()
    hop = RunStore.open(hopper_run).to_mdp_dataset(phase=["sampling", "fuzzing"])
    with pytest.raises(TrainingError, match="dataset observations have 11 dimensions, CartPole-v1 has 4"):
        train_challenger(challenger_config("CartPole-v1", "bc", steps=2), hop, tmp_path / "x")
    with pytest.raises(StoreError, match="no AUT episodes in phases"):
        from orchestrator.campaign.challenger import train_run_challenger

        train_run_challenger(cartpole_run, "bc", phases=("optimality",), progress=False)


def test_cli_train_challenger_bad_input_exits_2(tmp_path, capsys):
    from orchestrator.cli import main

    assert main(["train-challenger", "--data", str(tmp_path / "none"), "--algo", "bcq"]) == 2
    assert "holds no run store" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_campaign_challenger_section_is_validated(tmp_path):
    from orchestrator.campaign.config import CampaignError, load_campaign

    p = tmp_path / "c.yaml"
    base = f"scenario: CartPole-v1\naut: {BALANCER}\noutput: {tmp_path / 'o'}\n"
    p.write_text(base + "challenger:\n  algos: [bcq, td3]\n")
    with pytest.raises(CampaignError, match="challenger.algos: unknown algorithm 'td3'"):
        load_campaign(p)
    p.write_text(base + "challenger:\n  algos: bcq\n")
    with pytest.raises(CampaignError, match="challenger.algos must be a list"):
        load_campaign(p)
    p.write_text(base + "challenger:\n  algos: [cql]\n  preset: mujoco\n")
    with pytest.raises(CampaignError, match="no settings for CartPole-v1"):
        load_campaign(p)
    p.write_text(base + "challenger: {algos: [bc], torch_threads: 0}\n")
    with pytest.raises(CampaignError, match="challenger.torch_threads must be an integer >= 1"):
        load_campaign(p)
    p.write_text(base + "challenger: {algos: [bc, bcq]}\n")
    c = load_campaign(p)
    assert c.challenger.algos == ["bc", "bcq"] and c.challenger.eval_episodes == 100
    assert c.challenger.torch_threads is None


def test_challenger_cache_reuses_training_on_the_same_D(cartpole_run, tmp_path, ray_cluster, monkeypatch):
    """Same D and config: the second campaign copies the first one's challenger (grids set
    DELTARL_CHALLENGER_CACHE); another config trains anew."""
    import shutil

    from orchestrator.campaign.challenger import train_run_challenger

    monkeypatch.setenv("DELTARL_CHALLENGER_CACHE", str(tmp_path / "cache"))
    first = train_run_challenger(cartpole_run, "bc", steps=30, out=tmp_path / "a", eval_episodes=3,
                                 mlflow=False, progress=False)
    assert "from_cache" not in first and len(list((tmp_path / "cache").iterdir())) == 1
    twin = tmp_path / "twin"  # a copy of the run: the same D in another folder
    shutil.copytree(cartpole_run, twin)
    shutil.rmtree(twin / "challengers", ignore_errors=True)
    second = train_run_challenger(twin, "bc", steps=30, eval_episodes=3, mlflow=False, progress=False)
    assert second["from_cache"] and second["evaluation"] == first["evaluation"]
    assert (twin / "challengers" / "bc" / "model.d3").read_bytes() == (tmp_path / "a" / "model.d3").read_bytes()
    third = train_run_challenger(twin, "bc", steps=31, out=tmp_path / "c", eval_episodes=3, mlflow=False,
                                 progress=False)
    assert "from_cache" not in third and len(list((tmp_path / "cache").iterdir())) == 2


@pytest.mark.slow
def test_the_vectorised_observation_scaler_fit_is_d3rlpys_bit_for_bit():
    """`fit_standard_observation_scaler` gives d3rlpy's `fit_with_transition_picker` mean and std
    exactly, on episodes that end by termination (every step a transition) and by time limit (the
    last step not), with observations of very different magnitudes; other scalers are left alone."""
    import d3rlpy
    from d3rlpy.dataset import MDPDataset

    from workers.challenger import fit_standard_observation_scaler

    rng = np.random.default_rng(3)
    n = 20_000
    obs = (rng.normal(size=(n, 5)) * 10.0 ** rng.integers(-3, 6, size=(n, 1))).astype(np.float32)
    terminals, timeouts = np.zeros(n), np.zeros(n)
    for k, e in enumerate(np.sort(rng.choice(n - 1, 60, replace=False))):
        (terminals if k % 2 else timeouts)[e] = 1.0
    timeouts[-1] = 1.0
    ds = MDPDataset(obs, rng.integers(0, 2, n), np.ones(n, np.float32), terminals, timeouts=timeouts)

    def algo(scaler):
        return d3rlpy.algos.DiscreteBCConfig(observation_scaler=scaler).create(device="cpu:0")

    ref, fast = algo(d3rlpy.preprocessing.StandardObservationScaler()), algo(d3rlpy.preprocessing.StandardObservationScaler())
    ref.observation_scaler.fit_with_transition_picker(ds.episodes, ds.transition_picker)
    assert fit_standard_observation_scaler(fast, ds)
    for name in ("mean", "std"):
        got, want = getattr(fast.observation_scaler, name), getattr(ref.observation_scaler, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert not fit_standard_observation_scaler(fast, ds)  # already built: left as it is
    other = algo(d3rlpy.preprocessing.MinMaxObservationScaler())
    assert not fit_standard_observation_scaler(other, ds) and not other.observation_scaler.built


@pytest.mark.parametrize("discrete", [True, False])
def test_the_dataset_on_an_episode_index_is_d3rlpys_mdp_dataset(discrete):
    """`steps_to_mdp_dataset` (d3rlpy's episodes on an `EpisodeIndex`, filled in one go) is
    the `MDPDataset` d3rlpy builds from the same steps: the same episodes, transitions, dataset
    info, and the same minibatches for the same numpy seed; episodes ending by termination, by
    time limit and by neither (a budget cut: timeout added)."""
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import MDPDataset

    from workers.datasets import EpisodeIndex, steps_to_mdp_dataset

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 40, size=120)
    n = int(lengths.sum())
    eid = np.repeat(np.arange(lengths.size), lengths)
    last = np.ones(n, dtype=bool)
    last[:-1] = eid[1:] != eid[:-1]
    kind = rng.integers(0, 3, size=lengths.size)[eid]  # 0: terminal, 1: timeout, 2: neither
    actions = rng.integers(0, 3, size=n) if discrete else rng.normal(size=(n, 2)).astype(np.float32)
    steps = {"episode_id": eid, "obs": rng.normal(size=(n, 3)).astype(np.float32), "actions": actions,
             "rewards": rng.normal(size=n).astype(np.float32), "terminals": last & (kind == 0),
             "timeouts": last & (kind == 1)}
    got = steps_to_mdp_dataset(steps, discrete=discrete, action_size=3 if discrete else 2)
    want = MDPDataset(steps["obs"], actions.astype(np.int64) if discrete else actions, steps["rewards"],
                      (last & (kind == 0)).astype(np.float32), timeouts=(last & (kind != 0)).astype(np.float32),
                      action_space=ActionSpace.DISCRETE if discrete else ActionSpace.CONTINUOUS,
                      action_size=3 if discrete else 2)
    assert isinstance(got.buffer, EpisodeIndex)
    assert got.transition_count == want.transition_count and len(got.episodes) == len(want.episodes) > 100
    assert got.dataset_info == want.dataset_info
    for a, b in zip(got.episodes, want.episodes):
        for name in ("observations", "actions", "rewards"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert a.terminated == b.terminated
    pos_got = {id(e): k for k, e in enumerate(got.episodes)}
    pos_want = {id(e): k for k, e in enumerate(want.episodes)}
    assert [(pos_got[id(got.buffer[j][0])], got.buffer[j][1]) for j in range(len(got.buffer))] == \
        [(pos_want[id(want.buffer[j][0])], want.buffer[j][1]) for j in range(len(want.buffer))]
    for seed in (0, 1):
        np.random.seed(seed)
        x = got.sample_transition_batch(32)
        np.random.seed(seed)
        y = want.sample_transition_batch(32)
        for name in ("observations", "actions", "rewards", "next_observations", "terminals", "intervals"):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name


@pytest.mark.training
@pytest.mark.parametrize("discrete", [True, False])
def test_the_vectorised_sampler_gives_d3rlpys_minibatches_and_the_same_training(discrete):
    """`TransitionSampler` answers d3rlpy's minibatch for the same numpy seed (every array, dtype
    and shape; terminal steps with zero next observation and action), leaves numpy's global stream
    where d3rlpy leaves it, and 30 updates of an algorithm on it give the same weights as on
    d3rlpy's own sampler; it steps aside for an algorithm that needs returns-to-go."""
    import d3rlpy

    from workers.datasets import TransitionSampler, steps_to_mdp_dataset

    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 30, size=80)
    n = int(lengths.sum())
    eid = np.repeat(np.arange(lengths.size), lengths)
    last = np.ones(n, dtype=bool)
    last[:-1] = eid[1:] != eid[:-1]
    kind = rng.integers(0, 3, size=lengths.size)[eid]
    actions = rng.integers(0, 2, size=n) if discrete else rng.uniform(-1, 1, size=(n, 2)).astype(np.float32)
    steps = {"episode_id": eid, "obs": rng.normal(size=(n, 3)).astype(np.float32), "actions": actions,
             "rewards": rng.normal(size=n).astype(np.float32), "terminals": last & (kind == 0),
             "timeouts": last & (kind == 1)}
    data = steps_to_mdp_dataset(steps, discrete=discrete, action_size=2)
    fast = TransitionSampler(data)
    assert fast.terminals.sum() == sum(bool(e.terminated) for e in data.episodes) > 0
    sampled_terminals = 0
    for seed in (0, 7):
        np.random.seed(seed)
        x = fast.sample(256)
        after_fast = np.random.get_state()[1].copy()
        np.random.seed(seed)
        y = data.sample_transition_batch(256)
        assert np.array_equal(after_fast, np.random.get_state()[1])
        sampled_terminals += int(y.terminals.sum())
        for name in ("observations", "actions", "rewards", "next_observations", "next_actions", "terminals",
                     "intervals"):
            a, b = getattr(x, name), getattr(y, name)
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    assert sampled_terminals > 0  # the zero next observation / action of a terminal step was compared

    def trained(sample_of):
        d3rlpy.seed(3)
        cfg = d3rlpy.algos.DiscreteBCQConfig(batch_size=32) if discrete else d3rlpy.algos.TD3PlusBCConfig(batch_size=32)
        algo = cfg.create(device="cpu:0")
        algo.build_with_dataset(data)
        sample = sample_of(algo)
        for _ in range(30):
            algo.update(sample(32))
        probe = np.random.default_rng(1).normal(size=(200, 3)).astype(np.float32)
        probe_actions = np.zeros(200, np.int64) if discrete else np.zeros((200, 2), np.float32)
        return algo.predict(probe), algo.predict_value(probe, probe_actions)  # the Q-values: every weight

    ours = trained(lambda algo: TransitionSampler.for_algo(data, algo))
    theirs = trained(lambda algo: data.sample_transition_batch)
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))

    class NeedsReturns:
        need_returns_to_go = True

    assert TransitionSampler.for_algo(data, NeedsReturns()) == data.sample_transition_batch


@pytest.mark.training
@pytest.mark.parametrize("scenario_name,algo", [("CartPole-v1", "bcq"), ("Hopper-v5", "bcq")])
def test_watching_a_training_does_not_change_it(cartpole_run, hopper_run, tmp_path, scenario_name, algo):
    """The per-epoch evaluation (d3rlpy's greedy graph traced in memory, torch's random stream put
    back; continuous BCQ's action selection samples from it) leaves the training as it would be
    unwatched: the same weights after 6 steps in 3 epochs with and without it; the watch's graph
    acts as `algo.predict` does, and every parameter's requires_grad is as before."""
    import d3rlpy

    from workers.training import _AlgoPolicy

    run = cartpole_run if scenario_name == "CartPole-v1" else hopper_run
    data = RunStore.open(run).to_mdp_dataset(phase=["sampling", "fuzzing"])
    probe = np.random.default_rng(2).normal(size=(64, data.dataset_info.observation_signature.shape[0][0]))
    probe = probe.astype(np.float32)
    values = []
    for watch in (0, 2):
        cfg = challenger_config(scenario_name, algo, steps=6, steps_per_epoch=2, eval_episodes=watch, device="cpu:0")
        cfg.hyperparameters["batch_size"] = 16
        state = train_challenger(cfg, data, tmp_path / f"w{watch}")
        assert ("eval_return" in state["history"][-1]) == bool(watch)
        trained = d3rlpy.load_learnable(str(tmp_path / f"w{watch}" / "model.d3"), device="cpu:0")
        acts = trained.predict(probe) if scenario_name == "CartPole-v1" else np.zeros((64, 3), np.float32)
        values.append(trained.predict_value(probe, acts))
        if scenario_name == "CartPole-v1":
            flags = [p.requires_grad for p in trained.impl.modules.q_funcs.parameters()]
            policy = _AlgoPolicy(trained, discrete=True)
            assert policy.graph is not None and np.array_equal(policy.act(probe), trained.predict(probe))
            assert [p.requires_grad for p in trained.impl.modules.q_funcs.parameters()] == flags
    assert np.array_equal(values[0], values[1])


@pytest.mark.subprocess
def test_a_cache_lock_left_by_a_dead_process_is_taken_over_at_once(tmp_path, monkeypatch):
    """A grid killed while a campaign trained a challenger leaves the cache entry's lock behind;
    the resumed grid must not wait the stale timeout (6 hours) for an owner that is gone. A lock
    whose owner lives, or ran on another machine, is waited for."""
    import os
    import socket
    import subprocess
    import sys

    import orchestrator.campaign.challenger as ch
    from orchestrator.campaign.challenger import _claim_or_wait, _owner_died

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(gone.stdout)
    lock = tmp_path / ".k.lock"
    for text, died in ((f"{socket.gethostname()}:{dead_pid}", True), (str(dead_pid), True),  # old format
                       (f"{socket.gethostname()}:{os.getpid()}", False), (f"other-host:{dead_pid}", False),
                       ("", False)):  # just created, not written yet
        lock.write_text(text)
        assert _owner_died(lock) is died, text
    lock.write_text(f"{socket.gethostname()}:{dead_pid}")

    def no_wait(seconds):
        raise AssertionError(f"waited {seconds} s for a lock whose owner is gone")

    monkeypatch.setattr(ch.time, "sleep", no_wait)
    got = _claim_or_wait(tmp_path, "k", timeout_s=3600.0, poll_s=2.0)
    assert got == lock and lock.read_text() == f"{socket.gethostname()}:{os.getpid()}"


def test_the_challenger_cache_key_does_not_depend_on_where_the_checkout_lives(tmp_path):
    """Two checkouts (or two nodes) with the same preset text and the same D share a cache entry;
    another preset text does not. The key once held the preset's absolute path."""
    import shutil

    from orchestrator.campaign.challenger import challenger_cache_key
    from workers.challenger import challenger_config

    class Steps:  # what the key reads of a run's store: D's transitions
        def read_steps(self, phase, role):
            rng = np.random.default_rng(0)
            return {"obs": rng.normal(size=(6, 4)).astype(np.float32), "actions": np.arange(6) % 2,
                    "rewards": np.ones(6), "terminals": np.zeros(6, bool), "timeouts": np.zeros(6, bool),
                    "episode_id": np.array([0, 0, 0, 1, 1, 1])}

    keys = []
    for where in ("a", "b"):
        cfg = challenger_config("CartPole-v1", "bcq", seed=0)
        preset = tmp_path / where / "classic-control.yaml"
        preset.parent.mkdir()
        shutil.copy(cfg.preset, preset)
        keys.append(challenger_cache_key(Steps(), ("safety",), dataclasses.replace(cfg, preset=str(preset)), 100))
    assert keys[0] == keys[1]
    preset.write_text(preset.read_text() + "\n# another text\n")
    assert challenger_cache_key(Steps(), ("safety",), dataclasses.replace(cfg, preset=str(preset)), 100) != keys[0]
