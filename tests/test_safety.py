"""Safety campaigns: campaign-file validation, the generation loop, dataset D, resume."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from orchestrator.campaign.config import (
    CampaignError,
    campaign_from_dict,
    load_campaign,
)
from orchestrator.campaign.safety import run_safety
from orchestrator.runs.layout import SAFETY_PHASES

BALANCER = "python:workers.examples:cartpole_balancer"


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD = f"""
scenario: CartPole-v1
aut: {BALANCER}
workers: 0
output: OUT
mlflow: false
safety:
  fuzzer: random
  budget: {{episodes: 100}}
  generation_size: 16
"""


@pytest.mark.parametrize(
    "edit, message",
    [
        (("fuzzer: random", "fuzzer: afl"), "safety.fuzzer: unknown fuzzer 'afl'; allowed: random, mdpfuzz, curefuzz, gmt"),
        (("scenario: CartPole-v1", "scenario: Pong"), "scenario: unknown scenario 'Pong'"),
        (("episodes: 100", "episodes: -5"), "safety.budget.episodes must be a positive integer, got -5"),
        (("generation_size: 16", "generation_size: many"), "safety.generation_size must be an integer, got 'many'"),
        (("workers: 0", "workerz: 0"), "unknown key workerz; allowed keys: scenario, aut, output"),
        (("  generation_size: 16", "  generation_size: 16\n  budgett: 3"), "unknown key safety.budgett; allowed keys: fuzzer, params, budget"),
        (("budget: {episodes: 100}", "budget: {}"), "safety.budget: give episodes or seconds"),
        (("aut: " + BALANCER + "\n", ""), "missing required key aut"),
    ],
)
def test_bad_campaign_files_name_the_field(tmp_path, edit, message):
    p = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(CampaignError) as e:
        load_campaign(p)
    assert message in str(e.value)


def test_bad_campaign_via_cli_exits_2_before_any_work(tmp_path, capsys):
    from orchestrator.cli import main

    out = tmp_path / "never"
    p = write(tmp_path, GOOD.replace("OUT", str(out)).replace("episodes: 100", "episodes: 0"))
    assert main(["run", str(p), "--quiet"]) == 2
    assert "safety.budget.episodes must be a positive integer" in capsys.readouterr().err
    assert not out.exists()


def test_examples_are_valid(monkeypatch):
    from pathlib import Path

    # LLM-guided examples take their endpoint from the environment
    monkeypatch.setenv("DELTARL_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("DELTARL_LLM_MODEL", "any")

    files = sorted((Path(__file__).resolve().parents[1] / "experiments" / "campaigns").glob("*.yaml"))
    assert files
    for f in files:
        load_campaign(f)


def test_safety_run_records_dataset_d(tmp_path):
    out = tmp_path / "run"
    c = load_campaign(write(tmp_path, GOOD.replace("OUT", str(out))))
    s = run_safety(c, progress=False)
    assert s["episodes"] == 100 and s["sampling_episodes"] == 25  # a quarter of the budget
    eps = pd.read_parquet(out / "episodes")
    assert len(eps) == 100 and set(eps["phase"]) == set(SAFETY_PHASES)
    assert (eps["phase"] == "sampling").sum() == 25 and set(eps["fuzzer"]) == {"random"}
    assert s["failures"] == int(eps["failure"].sum())
    timeline = pd.read_parquet(out / "timeline.parquet")
    assert timeline["episodes"].iloc[-1] == 100 and timeline["failures"].is_monotonic_increasing
    saved = json.loads((out / "campaign.json").read_text())
    assert saved["safety"]["sampling_fraction"] == 0.25  # the resolved campaign, defaults filled in
    from orchestrator.runs.store import RunStore

    d = RunStore.open(out).to_mdp_dataset(phase=list(SAFETY_PHASES), role="aut")
    assert len(d.episodes) == 100
    assert sum(len(e.rewards) for e in d.episodes) == int(eps["length"].sum())


def test_resume_after_a_crash_gives_the_uninterrupted_result(tmp_path, monkeypatch):
    text = GOOD.replace("fuzzer: random", "fuzzer: random\n  params: {}")
    full = load_campaign(write(tmp_path, text.replace("OUT", str(tmp_path / "full")), "a.yaml"))
    run_safety(full, progress=False)

    cut = load_campaign(write(tmp_path, text.replace("OUT", str(tmp_path / "cut")), "b.yaml"))
    from orchestrator.runs.store import RunStore

    calls = {"n": 0}
    original = RunStore.write

    def crashing_write(self, *a, **kw):
        calls["n"] += 1
        ids = original(self, *a, **kw)
        if calls["n"] == 4:  # the 4th generation's files are written, its snapshot never is
            raise KeyboardInterrupt
        return ids

    monkeypatch.setattr(RunStore, "write", crashing_write)
    with pytest.raises(KeyboardInterrupt):
        run_safety(cut, progress=False)
    monkeypatch.setattr(RunStore, "write", original)
    snaps = sorted((tmp_path / "cut" / "snapshots").glob("gen-*.pkl"))
    assert snaps[-1].name == "gen-000003.pkl"  # three generations snapshotted, the 4th lost
    resumed = campaign_from_dict(json.loads((tmp_path / "cut" / "campaign.json").read_text()))
    s = run_safety(resumed, resume=True, progress=False)
    a = pd.read_parquet(tmp_path / "full" / "episodes").sort_values("episode_id")
    b = pd.read_parquet(tmp_path / "cut" / "episodes").sort_values("episode_id")
    assert len(b) == 100 == s["episodes"]
    np.testing.assert_array_equal(np.stack(a["initial_state"]), np.stack(b["initial_state"]))
    np.testing.assert_array_equal(a["return"].to_numpy(), b["return"].to_numpy())
    assert json.loads((tmp_path / "full" / "summary.json").read_text())["failures"] == s["failures"]


def test_budget_in_seconds_switches_phase_by_time(tmp_path):
    out = tmp_path / "timed"
    text = GOOD.replace("OUT", str(out)).replace("budget: {episodes: 100}", "budget: {seconds: 4}")
    s = run_safety(load_campaign(write(tmp_path, text)), progress=False)
    timeline = pd.read_parquet(out / "timeline.parquet")
    assert s["wall_seconds"] >= 4 and s["episodes"] == len(pd.read_parquet(out / "episodes"))
    assert set(timeline["phase"]) == {"sampling", "fuzzing"}
    first_fuzz = timeline[timeline["phase"] == "fuzzing"]["wall_time"].min()
    assert first_fuzz >= 1.0  # a quarter of the 4 s went to sampling


@pytest.mark.ray
def test_campaign_on_ray_workers_equals_in_process(tmp_path, ray_cluster):
    text = GOOD.replace("fuzzer: random", "fuzzer: curefuzz")
    local = load_campaign(write(tmp_path, text.replace("OUT", str(tmp_path / "local")), "l.yaml"))
    on_ray = load_campaign(write(tmp_path, text.replace("OUT", str(tmp_path / "ray")).replace("workers: 0", "workers: 2"),
                                 "r.yaml"))
    a, b = run_safety(local, progress=False), run_safety(on_ray, progress=False)
    assert a["failures"] == b["failures"] and a["episodes"] == b["episodes"] == 100
    ea = pd.read_parquet(tmp_path / "local" / "episodes").sort_values(["iteration", "episode_id"])
    eb = pd.read_parquet(tmp_path / "ray" / "episodes").sort_values(["iteration", "episode_id"])
    np.testing.assert_array_equal(np.stack(ea["initial_state"]), np.stack(eb["initial_state"]))
    np.testing.assert_array_equal(ea["return"].to_numpy(), eb["return"].to_numpy())
