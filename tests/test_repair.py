"""Repair (Delta RQ4): CQL from the AUT's weights, D_superior, the repair of a small real run,
its files and its error messages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs import get_scenario

REPO = Path(__file__).resolve().parents[1]
ZOO_CARTPOLE = REPO / "experiments" / "zoo" / "CartPole-v1-ddqn" / "model.d3"
BALANCER = "python:workers.examples:cartpole_balancer"


def _probe(n=512, dim=4, seed=0):
    return np.random.default_rng(seed).uniform(-0.3, 0.3, (n, dim)).astype(np.float32)


@pytest.mark.training
def test_discrete_cql_starts_from_the_aut_weights():
    import d3rlpy
    import torch

    from workers.repair import RepairConfig, cql_from_aut, fine_tune, steps_to_dataset
    from workers.training import quiet_d3rlpy

    quiet_d3rlpy()
    aut = d3rlpy.load_learnable(str(ZOO_CARTPOLE), device="cpu:0")
    algo = cql_from_aut(aut, RepairConfig(device="cpu:0", learning_rate=1e-3))
    assert type(algo).__name__ == "DiscreteCQL" and type(aut).__name__ == "DoubleDQN"
    assert algo.config.batch_size == aut.config.batch_size  # the AUT's settings unless overridden
    assert algo.config.target_update_interval == aut.config.target_update_interval
    x = _probe()
    np.testing.assert_array_equal(algo.predict(x), aut.predict(x))
    for a in (0, 1):
        acts = np.full(len(x), a)
        np.testing.assert_array_equal(algo.predict_value(x, acts), aut.predict_value(x, acts))
    for name in ("q_funcs", "targ_q_funcs"):  # the target network too, and as copies, not shared
        src, dst = getattr(aut.impl._modules, name), getattr(algo.impl._modules, name)
        for (k, v), (k2, v2) in zip(src.state_dict().items(), dst.state_dict().items()):
            assert k == k2 and torch.equal(v, v2) and v.data_ptr() != v2.data_ptr()
    # a fine-tuning step moves the copy, not the AUT
    rng = np.random.default_rng(0)
    steps = {"obs": rng.uniform(-0.05, 0.05, (200, 4)).astype(np.float32), "actions": rng.integers(0, 2, 200),
             "rewards": np.ones(200), "terminals": np.zeros(200, bool), "timeouts": np.zeros(200, bool),
             "episode_id": np.repeat([0, 1], 100), "t": np.tile(np.arange(100), 2)}
    q_before = aut.predict_value(x, np.zeros(len(x), int)).copy()
    fine_tune(algo, steps_to_dataset([steps], discrete=True, action_size=2),
              RepairConfig(steps=20, log_every=10, device="cpu:0"))
    np.testing.assert_array_equal(aut.predict_value(x, np.zeros(len(x), int)), q_before)
    assert not np.allclose(algo.predict_value(x, np.zeros(len(x), int)), q_before)


def test_a_cql_with_another_network_is_refused():
    import d3rlpy

    from workers.repair import check_same_predictions
    from workers.training import TrainingError, quiet_d3rlpy

    quiet_d3rlpy()
    aut = d3rlpy.load_learnable(str(ZOO_CARTPOLE), device="cpu:0")
    fresh = d3rlpy.algos.DiscreteCQLConfig().create(device="cpu:0")
    fresh.create_impl((4,), 2)
    with pytest.raises(TrainingError, match="does not reproduce the AUT's actions"):
        check_same_predictions(aut, fresh, _probe())


def test_continuous_cql_starts_from_the_sac_weights():
    import d3rlpy

    from workers.repair import RepairConfig, cql_from_aut
    from workers.training import quiet_d3rlpy

    quiet_d3rlpy()
    d3rlpy.seed(3)
    enc = d3rlpy.models.VectorEncoderFactory(hidden_units=[16, 16])
    sac = d3rlpy.algos.SACConfig(actor_encoder_factory=enc, critic_encoder_factory=enc,
                                 initial_temperature=0.3).create(device="cpu:0")
    sac.create_impl((11,), 3)
    cql = cql_from_aut(sac, RepairConfig(device="cpu:0", alpha=2.0), probe_obs=_probe(dim=11))
    assert type(cql).__name__ == "CQL" and cql.config.conservative_weight == 2.0
    x = _probe(dim=11, seed=1)
    np.testing.assert_array_equal(cql.predict(x), sac.predict(x))  # the actor
    a = np.random.default_rng(2).uniform(-1, 1, (len(x), 3)).astype(np.float32)
    np.testing.assert_allclose(cql.predict_value(x, a), sac.predict_value(x, a), rtol=0, atol=0)  # the critics
    assert float(next(cql.impl._modules.log_temp.parameters()).exp().item()) == pytest.approx(0.3)


@pytest.mark.training
def test_continuous_repair_learning_rates_reach_cql():
    """A SAC AUT's defaults (actor lr 1e-7, the temperature kept, 1,000 steps) and explicit
    --actor-lr / --temp-lr reach d3rlpy's CQL: the kept temperature does not move through updates,
    a positive rate moves it; a negative rate is refused."""
    import d3rlpy

    from workers.repair import RepairConfig, cql_from_aut, fine_tune, steps_to_dataset
    from workers.training import TrainingError, quiet_d3rlpy

    quiet_d3rlpy()
    d3rlpy.seed(3)
    enc = d3rlpy.models.VectorEncoderFactory(hidden_units=[16, 16])
    sac = d3rlpy.algos.SACConfig(actor_encoder_factory=enc, critic_encoder_factory=enc, initial_temperature=0.3,
                                 temp_learning_rate=3e-3).create(device="cpu:0")
    sac.create_impl((11,), 3)
    rng = np.random.default_rng(0)
    n = 200
    steps = {"obs": rng.standard_normal((n, 11)).astype(np.float32),
             "actions": rng.uniform(-1, 1, (n, 3)).astype(np.float32), "rewards": rng.standard_normal(n),
             "terminals": np.r_[np.zeros(n - 1), 1.0], "timeouts": np.zeros(n),
             "episode_id": np.zeros(n, dtype=np.int64), "t": np.arange(n)}
    data = steps_to_dataset([steps], discrete=False, action_size=3)

    def temp(algo):
        return float(next(algo.impl._modules.log_temp.parameters()).exp().item())

    assert RepairConfig().for_aut(discrete=False).steps == 1000 and RepairConfig().for_aut(discrete=True).steps == 3000
    kept = cql_from_aut(sac, RepairConfig(device="cpu:0"), probe_obs=_probe(dim=11))
    assert kept.config.temp_learning_rate == 0.0 and kept.config.actor_learning_rate == 1e-7
    t0 = temp(kept)
    fine_tune(kept, data, RepairConfig(steps=30, log_every=10))
    assert t0 == pytest.approx(0.3) and temp(kept) == t0
    learned = cql_from_aut(sac, RepairConfig(device="cpu:0", temp_learning_rate=3e-3, actor_learning_rate=1e-6),
                           probe_obs=_probe(dim=11))
    assert learned.config.temp_learning_rate == 3e-3 and learned.config.actor_learning_rate == 1e-6
    fine_tune(learned, data, RepairConfig(steps=30, temp_learning_rate=3e-3, log_every=10))
    assert abs(temp(learned) - 0.3) > 1e-3
    with pytest.raises(TrainingError, match="temperature learning rate"):
        RepairConfig(temp_learning_rate=-1.0).validate()
    with pytest.raises(TrainingError, match="actor learning rate"):
        RepairConfig(actor_learning_rate=0.0).validate()


# -- a small real run: weak AUT, the hand-written balancer as challenger --------------------------

@pytest.fixture(scope="module")
def weak_run(tmp_path_factory):
    """A CartPole run folder: a barely trained Double DQN AUT (a real .d3 with weights), 128
    CureFuzz safety episodes (dataset D, many failures), 64 optimality test cases against the
    balancer (bugs, the challenger's trajectories in steps/)."""
    import d3rlpy

    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign
    from workers.training import AutTrainConfig, make_algo, quiet_d3rlpy

    quiet_d3rlpy()
    root = tmp_path_factory.mktemp("repair")
    d3rlpy.seed(0)
    cfg = AutTrainConfig(scenario="CartPole-v1", algo="ddqn", hyperparameters={
        "encoder_factory": {"type": "vector", "params": {"hidden_units": [32, 32]}}, "batch_size": 32})
    aut = make_algo(cfg, "cpu:0")
    aut.build_with_env(get_scenario("CartPole-v1").reference_env())
    aut.save(str(root / "aut.d3"))
    camp = root / "c.yaml"
    camp.write_text(f"""
name: weak
scenario: CartPole-v1
aut: "{root / 'aut.d3'}"
workers: 0
seed: 0
output: {root / 'run'}
mlflow: false
safety:
  fuzzer: curefuzz
  budget: {{episodes: 128}}
  generation_size: 64
optimality:
  fuzzer: random
  challenger: "{BALANCER}"
  budget: {{episodes: 64}}
  generation_size: 32
""")
    run_campaign(load_campaign(camp), progress=False)
    return root / "run"


@pytest.mark.slow
def test_repair_end_to_end_on_a_small_run(weak_run, tmp_path):
    from orchestrator.cli import main
    from orchestrator.runs.store import RunStore

    run = tmp_path / "run"
    shutil.copytree(weak_run, run)
    bugs = pd.read_parquet(run / "bugs.parquet")
    assert len(bugs) > 20  # the balancer beats the untrained AUT almost everywhere
    code = main(["repair", str(run), "--steps", "600", "--lr", "1e-3", "--eval-episodes", "30", "--quiet"])
    assert code == 0
    out = run / "repair"
    for f in ("aut_improved.d3", "repair.json", "repair.md", "policy.pt"):
        assert (out / f).is_file(), f
    r = json.loads((out / "repair.json").read_text())
    # D_superior: the challenger's episodes of the bug states, read from the store
    sup = RunStore.open(run).read_episodes(phase="optimality", role="challenger", bug=True)
    assert r["data"]["superior_source"] == "stored" and r["data"]["choice"] == "superior"
    assert r["data"]["superior_episodes"] == len(sup) == len(bugs)
    assert r["data"]["superior_steps"] == int(sup["length"].sum())
    assert r["training"]["grad_steps"] == 600 and r["algorithm"].startswith("DiscreteCQL")
    # the bug states: the AUT reproduces its bugs; fine-tuning on the challenger's behaviour there helps
    b = r["bug_states"]
    assert b["states"] == len(bugs) and b["bugs_reproduced_aut"] == len(bugs)
    assert b["aut"]["mean_return"] == pytest.approx(bugs["aut_return"].mean())
    assert b["aut_improved"]["mean_return"] > b["aut"]["mean_return"] + 50
    assert b["bugs_remaining_aut_improved"] < len(bugs)
    # the known failure states: every AUT failure of the safety phase, run again by both
    feps = RunStore.open(run).read_episodes(phase=["sampling", "fuzzing"], role="aut", failure=True)
    f = r["failure_states"]
    assert f["known_failures"] == len(feps) > 0 and f["aut"]["failures"] == f["states"]
    assert f["aut_improved"]["failures"] < f["aut"]["failures"]
    # the standard starts, Table 5's first two columns
    ev = r["evaluation"]
    assert ev["aut"]["episodes"] == ev["aut_improved"]["episodes"] == 30
    assert ev["aut_improved"]["mean_return"] > ev["aut"]["mean_return"]
    md = (out / "repair.md").read_text()
    assert "| mean reward (AUT) | mean reward (AUT-Improved) |" in md
    assert f"{ev['aut']['mean_return']:.1f} ± {ev['aut']['ci95_margin']:.1f}" in md
    # deltarl evaluate loads the repaired agent
    assert main(["evaluate", "--policy", str(out / "aut_improved.d3"), "--scenario", "CartPole-v1",
                 "--episodes", "5", "--json"]) == 0
    # a second repair into the same folder needs --force
    assert main(["repair", str(run), "--steps", "5", "--quiet"]) == 2


@pytest.mark.campaign
def test_repair_reruns_the_challenger_when_its_trajectories_are_gone(weak_run, tmp_path):
    from orchestrator.campaign.repair import RepairInputs, superior_steps
    from orchestrator.runs.store import RunStore

    run = tmp_path / "run"
    shutil.copytree(weak_run, run)
    stored, how = superior_steps(RepairInputs(run))
    assert how == "stored"
    store = RunStore.open(run)  # drop every optimality step from the store (episodes stay)
    for p in (run / "steps").glob("*.parquet"):
        t = pd.read_parquet(p)
        if (t["phase"] == "optimality").any():
            p.unlink()
    rerun, how = superior_steps(RepairInputs(run))
    assert how == "re-run"
    # CartPole is deterministic: the challenger's new trajectories are the stored ones
    np.testing.assert_array_equal(rerun["obs"], stored["obs"])
    np.testing.assert_array_equal(rerun["actions"], stored["actions"])
    assert store.run_id


@pytest.mark.training
def test_union_ablation_trains_on_d_and_d_superior(weak_run, tmp_path):
    from orchestrator.campaign.repair import repair_run
    from orchestrator.runs.store import RunStore
    from workers.repair import RepairConfig

    run = tmp_path / "run"
    shutil.copytree(weak_run, run)
    r = repair_run(run, RepairConfig(steps=20, data="union"), eval_episodes=5, fuzz_budget=32, progress=False)
    d_steps = RunStore.open(run).read_steps(phase=["sampling", "fuzzing"], role="aut")["rewards"].shape[0]
    assert r["data"]["d"]["steps"] == d_steps and r["data"]["d"]["run_dir"] == str(run)
    # transitions: every step but the last of each non-terminal episode (d3rlpy), here a sum of both
    assert r["data"]["transitions"] > d_steps
    # --fuzz-budget: the same CureFuzz campaign against each agent, equal budgets
    z = r["fuzz"]
    assert z["fuzzer"] == "curefuzz" and z["budget"] == 32
    for role in ("aut", "aut_improved"):
        summary = json.loads((run / "repair" / f"fuzz-{role}" / "summary.json").read_text())
        assert z[role]["episodes"] == summary["episodes"] == 32 and z[role]["failures"] == summary["failures"]
        assert json.loads((run / "repair" / f"fuzz-{role}" / "campaign.json").read_text())["aut"] == (
            r["aut"] if role == "aut" else r["aut_improved"])
    assert z["aut"]["failures"] == 32  # the untrained AUT fails everywhere
    assert "Fuzz re-evaluation: curefuzz, 32 episodes" in (run / "repair" / "repair.md").read_text()


@pytest.mark.campaign
def test_repair_error_messages(weak_run, tmp_path, capsys):
    from orchestrator.cli import main

    # no bugs
    nobugs = tmp_path / "nobugs"
    shutil.copytree(weak_run, nobugs)
    (nobugs / "bugs.parquet").unlink()
    assert main(["repair", str(nobugs), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "has no optimality bugs" in err and "missing" in err and "optimality: section" in err
    # no challenger
    noca = tmp_path / "noca"
    shutil.copytree(weak_run, noca)
    c = json.loads((noca / "campaign.json").read_text())
    c["optimality"]["challenger"] = None  # the run's own challenger phase, never trained
    c["challenger"] = {"algos": ["bcq"], "preset": None, "steps": None, "eval_episodes": 100}
    (noca / "campaign.json").write_text(json.dumps(c))
    (noca / "optimality_summary.json").unlink()
    assert main(["repair", str(noca), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "challengers/bcq/model.d3" in err and "does not exist" in err
    assert f"deltarl train-challenger --data {noca} --algo bcq" in err
    # a challenger file that is gone
    gone = tmp_path / "gone"
    shutil.copytree(weak_run, gone)
    s = json.loads((gone / "optimality_summary.json").read_text())
    s["challenger"] = str(tmp_path / "missing" / "model.d3")
    (gone / "optimality_summary.json").write_text(json.dumps(s))
    assert main(["repair", str(gone), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    # not a run folder; an AUT without weights
    assert main(["repair", str(tmp_path), "--quiet"]) == 2
    assert "not a campaign run folder" in capsys.readouterr().err
    blackbox = tmp_path / "blackbox"
    shutil.copytree(weak_run, blackbox)
    c = json.loads((blackbox / "campaign.json").read_text())
    c["aut"] = BALANCER
    (blackbox / "campaign.json").write_text(json.dumps(c))
    assert main(["repair", str(blackbox), "--quiet"]) == 2
    assert "needs its d3rlpy model" in capsys.readouterr().err
    # bad settings
    assert main(["repair", str(weak_run), "--steps", "0", "--quiet"]) == 2
    assert "steps must be >= 1" in capsys.readouterr().err


def test_repair_help_names_the_method():
    from orchestrator.cli import build_parser

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "repair" in a.choices)
    text = sub.choices["repair"].format_help()
    for word in ("D_superior", "CQL", "--data", "--fuzz-budget", "aut_improved.d3", "Table 5"):
        assert word in text


def test_repair_reruns_verdicts_as_the_phase_that_found_them_acted(monkeypatch):
    # a MuJoCo campaign acts alone (inference: auto): repair's re-runs of its bug and failure states must
    # too, or last-bit differences of batched inference flip some verdicts (seen: 471 of 473 on Hopper)
    import orchestrator.campaign.repair as rep
    from envs import get_scenario

    hopper, cartpole = get_scenario("Hopper-v5"), get_scenario("CartPole-v1")
    spec = type("Spec", (), {"inference": "auto"})()
    assert rep.inference_alone(spec, hopper) and not rep.inference_alone(spec, cartpole)
    assert rep.inference_alone(type("Spec", (), {"inference": "alone"})(), cartpole)
    seen = []
    real = rep.rollout

    def spy(*a, **k):
        seen.append(k.get("alone"))
        return real(*a, **k)

    monkeypatch.setattr(rep, "rollout", spy)
    from workers.policies import load_policy

    states = cartpole.sample(np.random.default_rng(0), 3)
    pol = {"aut": load_policy("random:0", cartpole)}
    rep.evaluate_on_states(cartpole, pol, states, alone=True)
    rep.evaluate_on_states(cartpole, pol, states)
    assert seen == [True, False]


@pytest.mark.subprocess
def test_repair_settings_benchmark_runs_and_matches_deltarl_repair(weak_run, tmp_path):
    """benchmarks/repair_settings.py on the small CartPole run: a row per evaluated step, and its
    evaluation at the last step is the AUT-Improved that `deltarl repair` with the same settings
    makes (the random streams are put back after each evaluation)."""
    import subprocess
    import sys

    from orchestrator.cli import main

    run = tmp_path / "run"
    shutil.copytree(weak_run, run)
    out = subprocess.run([sys.executable, "benchmarks/repair_settings.py", str(run), "--variant", "a:learning_rate=1e-3",
                          "--at", "0", "40", "80", "--episodes", "30", "--no-failures", "--out", str(tmp_path / "t.md")],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [ln for ln in (tmp_path / "t.md").read_text().splitlines() if ln.startswith("| a |")]
    assert [int(r.split("|")[3]) for r in rows] == [0, 40, 80]
    reset = [r.split("|")[5] for r in rows]
    assert reset[0] != reset[-1]  # the fine-tuning moved the agent: the check below compares a trained one
    assert main(["repair", str(run), "--steps", "80", "--lr", "1e-3", "--eval-episodes", "30", "--quiet"]) == 0
    r = json.loads((run / "repair" / "repair.json").read_text())
    assert f"| {r['evaluation']['aut_improved']['mean_return']:.1f} ± " in rows[-1]
