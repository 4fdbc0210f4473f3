"""The command line: scenarios, rollout in-process and on Ray, and bad input (exit 2, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from orchestrator.cli import main

BALANCER = "python:workers.examples:cartpole_balancer"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_reads_well(capsys):
    with pytest.raises(SystemExit) as e:
        main(["rollout", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for text in ("--scenario", "--policy", "--episodes", "--workers", "--out", "python:module:attr", "Example"):
        assert text in out


def test_scenarios_lists_all_six(capsys):
    code, out, _ = run_cli(capsys, "scenarios")
    assert code == 0
    for name in ("CartPole-v1", "MountainCar-v0", "Acrobot-v1", "Hopper-v5", "Walker2d-v5", "Hopper-Noise"):
        assert name in out
    assert "theta_dot" in out and "pole > 12 deg" in out
    code, out, _ = run_cli(capsys, "scenarios", "--json")
    infos = json.loads(out)
    assert [i["name"] for i in infos][:3] == ["CartPole-v1", "MountainCar-v0", "Acrobot-v1"]
    assert infos[1]["grid_intervals"] == 100


def test_rollout_in_process_writes_parquet_and_summary(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(capsys, "rollout", "--scenario", "CartPole-v1", "--policy", BALANCER,
                                "--episodes", "50", "--workers", "0", "--out", str(out), "--quiet")
    assert code == 0, err
    assert "mean return" in stdout and "failures" in stdout
    eps = pd.read_parquet(out / "episodes")
    steps = pd.read_parquet(out / "steps")
    assert len(eps) == 50 and eps["episode_id"].is_unique
    assert len(steps) == eps["length"].sum()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 50
    assert summary["failures"] == int(eps["failure"].sum())
    assert abs(summary["mean_return"] - eps["return"].mean()) < 1e-9


@pytest.mark.ray
def test_rollout_on_ray_equals_in_process(tmp_path, capsys, ray_cluster):
    args = ["rollout", "--scenario", "Acrobot-v1", "--policy", "python:workers.examples:acrobot_swing",
            "--episodes", "40", "--seed", "3", "--batch-size", "8", "--quiet"]
    code, _, err = run_cli(capsys, *args, "--workers", "0", "--out", str(tmp_path / "local"))
    assert code == 0, err
    code, _, err = run_cli(capsys, *args, "--workers", "2", "--out", str(tmp_path / "ray"))
    assert code == 0, err
    a = pd.read_parquet(tmp_path / "local" / "episodes").sort_values("initial_state", key=lambda s: s.map(tuple))
    b = pd.read_parquet(tmp_path / "ray" / "episodes").sort_values("initial_state", key=lambda s: s.map(tuple))
    assert len(a) == len(b) == 40
    np.testing.assert_array_equal(a["return"].to_numpy(), b["return"].to_numpy())
    np.testing.assert_array_equal(a["length"].to_numpy(), b["length"].to_numpy())
    assert len(pd.read_parquet(tmp_path / "ray" / "steps")) == a["length"].sum()


# ------------------------------------------------------------------------------ bad input


def assert_bad(capsys, tmp_path, argv, *messages):
    out = tmp_path / "never"
    code, _, err = run_cli(capsys, *argv, "--out", str(out), "--quiet")
    assert code == 2
    assert err.startswith("deltarl: error: ") and err.count("\n") == 1, err
    for m in messages:
        assert m in err, err
    assert not out.exists(), "nothing may be written on bad input"


def test_unknown_scenario(capsys, tmp_path):
    assert_bad(capsys, tmp_path, ["rollout", "--scenario", "Pong-v5", "--policy", BALANCER, "--episodes", "3"],
               "unknown scenario 'Pong-v5'", "known scenarios: CartPole-v1")


def test_nan_and_out_of_bounds_initial_states(capsys, tmp_path):
    f = tmp_path / "states.csv"
    f.write_text("0.0,0.01,nan,0.0\n")
    assert_bad(capsys, tmp_path, ["rollout", "--scenario", "CartPole-v1", "--policy", BALANCER, "--states", str(f)],
               "initial state #0 has a non-finite value", "'theta'")
    np.save(tmp_path / "states.npy", np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.3, 0.0]]))
    assert_bad(capsys, tmp_path, ["rollout", "--scenario", "CartPole-v1", "--policy", BALANCER,
                                  "--states", str(tmp_path / "states.npy")],
               "initial state #1 has 'theta' = 0.3", "outside the valid initial-state region")


def test_policy_that_does_not_load_or_fit(capsys, tmp_path):
    from workers.policies import export_mlp_torchscript

    assert_bad(capsys, tmp_path, ["rollout", "--scenario", "CartPole-v1", "--policy", str(tmp_path / "nope.pt"),
                                  "--episodes", "3"], "nope.pt")
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(b"\x00not a model" * 10)
    assert_bad(capsys, tmp_path, ["rollout", "--scenario", "CartPole-v1", "--policy", str(bad), "--episodes", "3"],
               "garbage.pt")
    wrong = tmp_path / "hopper.pt"
    export_mlp_torchscript(str(wrong), 11, 3, hidden=(8,), discrete=False, action_low=-np.ones(3), action_high=np.ones(3))
    assert_bad(capsys, tmp_path, ["rollout", "--scenario", "CartPole-v1", "--policy", str(wrong), "--episodes", "3"],
               "hopper.pt", "CartPole-v1")


@pytest.mark.slow
def test_output_folder_holding_another_run(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "rollout", "--scenario", "CartPole-v1", "--policy", BALANCER,
                           "--episodes", "5", "--workers", "0", "--out", str(out), "--quiet")
    assert code == 0, err
    before = sorted(p.name for p in (out / "episodes").iterdir())
    code, _, err = run_cli(capsys, "rollout", "--scenario", "CartPole-v1", "--policy", BALANCER,
                           "--episodes", "5", "--workers", "0", "--out", str(out), "--quiet")
    assert code == 2 and "already holds run" in err and "choose another --out folder" in err
    assert sorted(p.name for p in (out / "episodes").iterdir()) == before


# ------------------------------------------------------------------------------ evaluate, zoo, train-aut


@pytest.mark.slow
def test_evaluate_prints_table1_columns(capsys):
    code, out, err = run_cli(capsys, "evaluate", "--policy", BALANCER, "--scenario", "CartPole-v1",
                             "--episodes", "30", "--json")
    assert code == 0, err
    ev = json.loads(out)
    assert ev["episodes"] == 30 and 0 <= ev["success_rate"] <= 1
    lo, hi = ev["success_wilson95"]
    assert lo <= ev["success_rate"] <= hi
    code, out2, _ = run_cli(capsys, "evaluate", "--policy", BALANCER, "--scenario", "CartPole-v1", "--episodes", "30")
    assert f"{ev['mean_return']:.1f} ± {ev['ci95_margin']:.1f}" in out2 and "95% Wilson" in out2
    # deterministic: the same seed gives the same figures (what a zoo card relies on)
    code, out3, _ = run_cli(capsys, "evaluate", "--policy", BALANCER, "--scenario", "CartPole-v1",
                            "--episodes", "30", "--json")
    assert json.loads(out3) == ev


def test_zoo_uris_resolve(tmp_path, monkeypatch, capsys):
    from workers.policies import PolicyError, export_mlp_torchscript, load_policy

    agent = tmp_path / "CartPole-v1-ddqn"
    agent.mkdir()
    export_mlp_torchscript(str(agent / "policy.pt"), 4, 2, hidden=(16,))
    monkeypatch.setenv("DELTARL_ZOO", str(tmp_path))
    pol = load_policy("zoo:CartPole-v1", "CartPole-v1")
    assert pol.act(np.zeros((3, 4), np.float32)).shape == (3,)
    assert load_policy("zoo:CartPole-v1-ddqn", "CartPole-v1").sha256 == pol.sha256
    with pytest.raises(PolicyError, match="no zoo agent 'Hopper-v5'.*known agents: CartPole-v1-ddqn"):
        load_policy("zoo:Hopper-v5")
    code, out, err = run_cli(capsys, "evaluate", "--policy", "zoo:CartPole-v1", "--scenario", "CartPole-v1",
                             "--episodes", "5")
    assert code == 0 and "success rate" in out


@pytest.mark.slow
def test_train_aut_cli_writes_a_card_and_refuses_to_overwrite(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("scenario: CartPole-v1\nalgo: ddqn\nsteps: 300\nsteps_per_epoch: 150\nwarmup_steps: 100\n"
                   "buffer_size: 2000\neval_episodes: 3\nhyperparameters: {batch_size: 16}\n")
    out = tmp_path / "aut"
    args = ["train-aut", "--scenario", "CartPole-v1", "--algo", "ddqn", "--config", str(cfg), "--out", str(out),
            "--eval-episodes", "10", "--quiet"]
    code, stdout, err = run_cli(capsys, *args)
    assert code == 0, err
    card = json.loads((out / "card.json").read_text())
    assert card["steps"] == 300 and card["evaluation"]["episodes"] == 10
    assert set(card["files"]) == {"model.d3", "policy.pt"}
    # the card is reproducible with `deltarl evaluate`
    code, ev, _ = run_cli(capsys, "evaluate", "--policy", str(out / "policy.pt"), "--scenario", "CartPole-v1",
                          "--episodes", "10", "--json")
    assert json.loads(ev)["mean_return"] == card["evaluation"]["mean_return"]
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "already holds a training run; add --resume" in err
    code, _, err = run_cli(capsys, *[a if a != "ddqn" else "sac" for a in args])
    assert code == 2 and "train it with --algo ddqn" in err
