"""Sound verdicts: every failure and bug a campaign reports replays in the reference gymnasium
environment with each policy acting alone (one observation per call, as deployed); candidates
that do not hold alone are kept apart as flaky; the same campaign gives the same verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs import get_scenario
from orchestrator.campaign.config import load_campaign
from orchestrator.campaign.pipeline import run_campaign
from orchestrator.campaign.replay import replay_bug, replay_failure
from orchestrator.runs.layout import RunFolder
from workers.policies import load_policy
from workers.rollout import episode_seeds

REPO = Path(__file__).resolve().parents[1]


def reference_episode(scenario, policy, state, seed: int) -> tuple[float, bool]:
    """Return and failure of ``policy`` from ``state`` in the reference gymnasium env, one
    observation per policy call."""
    env = scenario.reference_env()
    obs = scenario.reference_reset_to(env, np.asarray(state, dtype=np.float64), seed=seed)
    total, t, terminated = 0.0, 0, False
    while t < scenario.max_steps:
        a = policy.act(np.asarray(obs, dtype=np.float32)[None])[0]
        a = int(a) if scenario.action.discrete else np.asarray(a, dtype=np.float64)
        obs, r, terminated, truncated, _ = env.step(a)
        total += float(r)
        t += 1
        if terminated or truncated:
            break
    env.close()
    failed = bool(scenario.is_failure(np.array([total]), np.array([t]), np.array([terminated]))[0])
    return total, failed


def _campaign(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text.replace("OUT", str(tmp_path / "run")))
    return p


def _check_replays_in_reference_env(run_dir: Path, min_bugs: int = 1, min_failures: int = 1) -> tuple[int, int]:
    run = RunFolder(run_dir)
    campaign = json.loads(run.campaign_json.read_text())
    from orchestrator.campaign.config import campaign_of_run

    c = campaign_of_run(run_dir)
    scenario = c.build_scenario()
    aut = load_policy(campaign["aut"], scenario)
    ca = load_policy(run.resolve(run.summary("optimality")["challenger"]), scenario)  # stored relative to the folder
    bugs, failures = run.bugs(), run.failures()
    assert bugs is not None and len(bugs) >= min_bugs, "the campaign must find bugs for this check to mean anything"
    assert failures is not None and len(failures) >= min_failures, "and failures"
    for _, b in bugs.iterrows():
        seed = int(episode_seeds(int(b["gen_seed"]), np.array([b["state_index"]]), np.array([0]))[0])
        r_aut, _ = reference_episode(scenario, aut, b["initial_state"], seed)
        r_ca, _ = reference_episode(scenario, ca, b["initial_state"], seed)
        assert (r_aut, r_ca) == (b["aut_return"], b["ca_return"]), f"bug {b['bug_id']}"
        assert r_ca > r_aut
        assert replay_bug(run_dir, int(b["bug_id"]))["reproduced"]
    for _, f in failures.iterrows():
        seed = int(episode_seeds(int(f["gen_seed"]), np.array([f["state_index"]]), np.array([0]))[0])
        ret, failed = reference_episode(scenario, aut, f["initial_state"], seed)
        assert failed and ret == f["aut_return"], f"failure {f['failure_id']}"
        assert replay_failure(run_dir, int(f["failure_id"]))["reproduced"]
    return len(bugs), len(failures)


CARTPOLE = """
name: verdicts
scenario: CartPole-v1
aut: zoo:CartPole-v1
seed: 0
workers: 0
mlflow: false
output: OUT
safety: {fuzzer: curefuzz, budget: {episodes: 384}, generation_size: 64}
challenger: {algos: [bcq], steps: 2000, eval_episodes: 10}
optimality: {fuzzer: delta, budget: {episodes: 256}, generation_size: 64}
"""


@pytest.mark.slow
def test_cartpole_campaign_verdicts_replay_alone_in_the_reference_env(tmp_path):
    run_campaign(load_campaign(_campaign(tmp_path, CARTPOLE)), progress=False)
    n_bugs, n_fail = _check_replays_in_reference_env(tmp_path / "run")
    s = RunFolder(tmp_path / "run").summary("optimality")
    assert s["bugs"] == n_bugs and "flaky_bugs" in s and s["confirm_seconds"] > 0


HOPPER = """
name: verdicts-hopper
scenario: Hopper-v5
aut: random:3
seed: 0
workers: 0
mlflow: false
output: OUT
safety: {fuzzer: random, budget: {episodes: 32}, generation_size: 16}
optimality: {fuzzer: random, challenger: "zoo:Hopper-v5", budget: {episodes: 12}, generation_size: 6}
"""


@pytest.mark.slow
@pytest.mark.parametrize("inference", ["batched", "alone"])
def test_hopper_campaign_verdicts_replay_alone_in_the_reference_env(tmp_path, inference):
    """MuJoCo (the reference env is put into the state with ``set_state``), continuous actions, a
    torch policy as the challenger; the AUT is a seeded random policy, so it fails and loses often.
    Both ways to reach the deployed agent: candidates re-run alone, or the search acting alone."""
    text = HOPPER.replace("generation_size: 16}", f"generation_size: 16, inference: {inference}}}").replace(
        "generation_size: 6}", f"generation_size: 6, inference: {inference}}}")
    out = run_campaign(load_campaign(_campaign(tmp_path, text)), progress=False)
    _check_replays_in_reference_env(tmp_path / "run")
    for phase in ("safety", "optimality"):
        assert out[phase]["inference"] == inference
        assert (out[phase]["confirm_seconds"] == 0) == (inference == "alone")


class BatchSensitive:
    """A CartPole agent whose action depends on the batch it is computed in: alone it balances
    the pole, in a batch it pushes left whenever the pole leans only slightly (a stand-in for a
    near-tie that float32 batching flips)."""

    velocity_gain = 0.5

    def act(self, obs):
        obs = np.asarray(obs)
        good = (obs[:, 2] + self.velocity_gain * obs[:, 3] > 0).astype(np.int64)
        if obs.shape[0] == 1:
            return good
        return np.where(np.abs(obs[:, 2]) < 0.03, 0, good)


BATCH_SENSITIVE = """
name: batch-sensitive
scenario: CartPole-v1
aut: python:tests.test_verdicts:AGENT
seed: 0
workers: 0
mlflow: false
output: OUT
safety: {fuzzer: random, budget: {episodes: EPISODES}, generation_size: 64, inference: INFERENCE}
"""


def _batch_sensitive(agent: str, episodes: int, inference: str = "batched") -> str:
    return BATCH_SENSITIVE.replace("AGENT", agent).replace("EPISODES", str(episodes)).replace("INFERENCE", inference)


@pytest.mark.campaign
def test_batch_dependent_failures_are_flaky_not_failures(tmp_path):
    text = _batch_sensitive("BatchSensitive", 128)
    out = run_campaign(load_campaign(_campaign(tmp_path, text)), progress=False)["safety"]
    run = RunFolder(tmp_path / "run")
    flaky = run.flaky("safety")
    assert out["flaky_failures"] > 0 and len(flaky) == out["flaky_failures"]
    assert (flaky["batched_aut_return"] < flaky["aut_return"]).all()  # failed in the batch, not alone
    assert out["failures"] == (0 if run.failures() is None else len(run.failures()))
    eps = pd.read_parquet(run.root / "episodes")
    assert eps["failure"].sum() == out["failures"] + out["flaky_failures"]  # the batched record keeps both
    assert out["failure_states"]["episodes"] == out["failures"]  # Table II's counts: confirmed failures only
    # the phase's clock holds the re-runs, the last generation's included
    assert out["wall_seconds"] >= out["rollout_seconds"] + out["confirm_seconds"] > out["rollout_seconds"]


class WeakBatchSensitive(BatchSensitive):
    """Alone, a controller that leans too little on the pole's velocity: it fails from a few
    initial states (about 2% of CartPole's); in a batch it also flips near-upright actions."""

    velocity_gain = 0.02


@pytest.mark.campaign
def test_inference_alone_runs_the_deployed_agent_and_needs_no_reruns(tmp_path):
    """`inference: alone`: every policy call sees one observation, so a batch-sensitive agent
    shows its deployed behaviour in the search itself: no flaky candidates, nothing re-run, and
    (random testing proposes the same states either way) every failure the batched search
    confirmed is found too."""
    out = {}
    for mode in ("batched", "alone"):
        text = _batch_sensitive("WeakBatchSensitive", 256, mode)
        f = _campaign(tmp_path, text.replace("OUT", str(tmp_path / mode)), f"{mode}.yaml")
        out[mode] = run_campaign(load_campaign(f), progress=False)["safety"]
    alone = out["alone"]
    assert alone["inference"] == "alone" and out["batched"]["inference"] == "batched"
    assert alone["flaky_failures"] == 0 and alone["confirm_seconds"] == 0.0
    assert out["batched"]["flaky_failures"] > 0  # the same states in batches flip
    eps = pd.read_parquet(tmp_path / "alone" / "episodes")
    assert eps["failure"].sum() == alone["failures"]  # every failing episode is a failure: it was acting alone

    def states(mode):
        df = RunFolder(tmp_path / mode).failures()
        return set() if df is None else {tuple(np.round(s, 12)) for s in df["initial_state"]}

    assert 0 < len(states("batched")) and states("batched") <= states("alone")
    aut = load_policy("python:tests.test_verdicts:WeakBatchSensitive", None)
    df = RunFolder(tmp_path / "alone").failures()
    sc = get_scenario("CartPole-v1")
    for row in df.itertuples():  # each one fails alone in the reference env
        seed = int(episode_seeds(row.gen_seed, np.array([row.state_index]), np.array([0]))[0])
        assert reference_episode(sc, aut, row.initial_state, seed)[1]


def _bugs_and_failures(run_dir: Path) -> dict:
    run = RunFolder(run_dir)
    out = {}
    for name, df in (("bugs", run.bugs()), ("failures", run.failures())):
        df = df.drop(columns=["wall_time"])
        df["initial_state"] = df["initial_state"].map(list)
        out[name] = df
    return out


@pytest.mark.slow
def test_the_same_campaign_twice_in_separate_processes_gives_identical_verdicts(tmp_path):
    """Challenger training included: the same file and seed give identical bugs.parquet."""
    runs = []
    for k in range(2):
        f = _campaign(tmp_path, CARTPOLE.replace("OUT", str(tmp_path / f"run{k}")).replace(
            "steps: 2000", "steps: 600"), f"c{k}.yaml")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("DELTARL_CHALLENGER_CACHE", None)  # each process trains its own challenger
        res = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(f), "--quiet"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-2000:]
        runs.append(_bugs_and_failures(tmp_path / f"run{k}"))
    assert len(runs[0]["bugs"]) > 0
    for name in ("bugs", "failures"):
        pd.testing.assert_frame_equal(runs[0][name], runs[1][name])


FIXTURE = REPO / "tests" / "fixtures" / "run-layout-1"  # written by deltarl before the house rebuild


@pytest.mark.slow
def test_replay_reads_run_folders_of_the_first_layout(tmp_path):
    """A run folder written by the previous layout (no layout_version, bugs without the batched
    columns) still replays; a folder from a newer layout is refused with its version named."""
    import shutil

    from orchestrator.cli import main

    run = tmp_path / "old"
    shutil.copytree(FIXTURE, run)
    bugs = RunFolder(run).bugs()
    assert "batched_aut_return" not in bugs.columns and len(bugs) == 6
    assert all(replay_bug(run, i)["reproduced"] for i in bugs["bug_id"])
    data = json.loads((run / "campaign.json").read_text())
    (run / "campaign.json").write_text(json.dumps({**data, "layout_version": 99}))
    assert main(["replay", str(run), "0"]) == 2
    with pytest.raises(Exception, match="layout 99"):
        replay_bug(run, 0)


@pytest.mark.parametrize("scenario,expected", [("CartPole-v1", "batched"), ("Acrobot-v1", "batched"),
                                               ("Hopper-v5", "alone"), ("Walker2d-v5", "alone"),
                                               ("Hopper-Noise", "alone"), ("BipedalWalker", "alone")])
def test_inference_auto_takes_the_scenarios_choice_and_a_campaign_can_override_it(scenario, expected):
    """`inference: auto` (the default) acts alone where a simulator step costs many policy rows
    (MuJoCo, Box2D) and in batches elsewhere, and says why; an explicit mode wins."""
    from envs import get_scenario
    from orchestrator.campaign.config import OptimalitySpec, SafetySpec
    from orchestrator.campaign.generations import inference_mode

    sc = get_scenario(scenario)
    for spec in (SafetySpec(), OptimalitySpec()):
        assert spec.inference == "auto"
        mode, why = inference_mode(spec, sc)
        assert mode == expected and why.startswith(f"inference: auto, {sc.name}: ")
    for forced in ("batched", "alone"):
        assert inference_mode(SafetySpec(inference=forced), sc) == (forced, f"inference: {forced} in the campaign")


STOCHASTIC = """
name: verdicts-SCENARIO
scenario: SCENARIO
aut: random:3
seed: 0
workers: 0
mlflow: false
output: OUT
safety: {fuzzer: random, budget: {episodes: 16}, generation_size: 8}
"""


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["Walker2d-v5", "Hopper-Noise", "BipedalWalker"])
def test_failures_replay_on_walker2d_and_the_stochastic_scenarios(tmp_path, scenario):
    """`deltarl replay` reproduces every failure of a Walker2d campaign (MuJoCo's ``set_state``) and
    of the stochastic scenarios (Hopper-Noise's wind, BipedalWalker's terrain and initial push),
    which meet the recorded episode seeds again; a random AUT fails from most states."""
    out = run_campaign(load_campaign(_campaign(tmp_path, STOCHASTIC.replace("SCENARIO", scenario))), progress=False)
    failures = RunFolder(tmp_path / "run").failures()
    assert failures is not None and len(failures) >= 4 and out["safety"]["failures"] == len(failures)
    for fid in failures["failure_id"]:
        r = replay_failure(tmp_path / "run", int(fid))
        assert r["reproduced"] and r["failure"], r
