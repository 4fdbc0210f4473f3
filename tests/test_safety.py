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


@pytest.mark.subprocess
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


@pytest.mark.campaign
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


@pytest.mark.campaign
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


@pytest.mark.campaign
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


# -- the loop's parts, without a campaign -------------------------------------------------------
def _unit(generation=3):
    from orchestrator.campaign.units import WorkUnit

    return WorkUnit(generation=generation, proposed=np.arange(8.0).reshape(2, 4), tags={"parent": np.array([5, -1])},
                    states=np.arange(8.0).reshape(2, 4) / 10, n=2, phase="fuzzing", gen_seed=3_000_012)


def _snapshot_state(tmp_path, state: dict):
    """``state`` as the loop state of a safety snapshot in a run folder; the run folder."""
    import pickle

    from orchestrator.runs.layout import RunFolder

    run = RunFolder(tmp_path / "run")
    run.snapshots.mkdir(parents=True)
    (run.snapshots / "gen-000004.pkl").write_bytes(pickle.dumps({"fuzzer": {}, "state": state, "committed": []}))
    return run


class _Fuzzer:
    def __init__(self):
        self.loaded, self.observed = None, []

    def load_state_dict(self, d):
        self.loaded = d

    def observe(self, proposal, feedback):
        self.observed.append((proposal, feedback))


def test_units_in_flight_come_back_from_a_snapshot_as_work_units(tmp_path):
    """A snapshot holds the loop state as dataclasses.asdict gives it (units as dicts of their
    fields, also in snapshots of the version before WorkUnit); restore gives WorkUnits back."""
    import dataclasses

    from orchestrator.campaign.generations import restore
    from orchestrator.campaign.safety import SafetyState
    from orchestrator.campaign.units import WorkUnit

    st = SafetyState(generation=5, done=80, in_flight=[_unit(3), _unit(4)], window=2, unit_size=2)
    back = restore(_snapshot_state(tmp_path, dataclasses.asdict(st)), "safety", _Fuzzer(), SafetyState)
    assert [type(u) for u in back.in_flight] == [WorkUnit, WorkUnit] and back.done == 80 and back.window == 2
    u = back.in_flight[1]
    assert (u.generation, u.n, u.phase, u.gen_seed) == (4, 2, "fuzzing", 3_000_012)
    np.testing.assert_array_equal(u.states, _unit().states)
    np.testing.assert_array_equal(u.proposal.tags["parent"], [5, -1])
    np.testing.assert_array_equal(u.proposal.states, _unit().proposed)


def test_a_loop_state_of_another_version_is_refused_with_a_message(tmp_path):
    from orchestrator.campaign.generations import restore
    from orchestrator.campaign.safety import SafetyState
    from orchestrator.runs.store import StoreError

    unit_without_seed = {"generation": 0, "proposed": np.zeros((1, 4)), "tags": {}, "states": np.zeros((1, 4)), "n": 1,
                         "phase": "sampling"}
    for state in ({"in_flight": [unit_without_seed]}, {"generation": 1, "a_field_of_another_version": 0}):
        with pytest.raises(StoreError, match="written by another deltarl version"):
            restore(_snapshot_state(tmp_path / str(len(state)), state), "safety", _Fuzzer(), SafetyState)


class _Service:
    def __init__(self, log, name, fail=False):
        self.log, self.name, self.fail = log, name, fail

    def start(self, workers):
        self.log.append(f"start {self.name} {workers}")
        if self.fail:
            raise RuntimeError("no endpoint")

    def unit_columns(self):
        return {f"{self.name}_calls": 7}

    def close(self):
        self.log.append(f"close {self.name}")


def test_a_unit_row_holds_the_phases_columns_then_its_services():
    from types import SimpleNamespace

    from orchestrator.campaign.generations import LoopState
    from orchestrator.campaign.units import Verdict, apply_unit

    log, fuzzer = [], _Fuzzer()
    recorded = []
    phase = SimpleNamespace(fuzzer=fuzzer, count_name="episodes", services=[_Service(log, "llm")],
                            judge=lambda states, result, gen_seed: Verdict(feedback=("fb", gen_seed)),
                            record=lambda st, unit, result, verdict: recorded.append((st.generation, unit, verdict))
                            or {"failures": 1})
    st = LoopState(generation=9, done=10, phase="fuzzing")
    row = apply_unit(phase, st, _unit(3), result=None, t_start=0.0)
    assert list(row) == ["generation", "phase", "episodes", "wall_time", "failures", "llm_calls"]
    assert row["generation"] == 3 and row["episodes"] == 12 and row["llm_calls"] == 7 and st.generation == 9
    assert recorded[0][0] == 3 and recorded[0][2].feedback == ("fb", 3_000_012)  # recorded as unit 3
    assert fuzzer.observed[0][1] == ("fb", 3_000_012) and st.timeline == [row]


def test_a_phase_that_fails_to_start_closes_its_services_and_leaves_the_callers_executor_open():
    from types import SimpleNamespace

    from orchestrator.campaign.generations import LoopState, PhaseRun

    log = []
    executor = SimpleNamespace(alone=False, workers=0, reason="", close=lambda: log.append("close executor"))
    phase = SimpleNamespace(spec=SimpleNamespace(inference="batched"), scenario=None, fuzzer=_Fuzzer(),
                            services=[_Service(log, "a"), _Service(log, "b", fail=True)])
    with pytest.raises(RuntimeError, match="no endpoint"):
        with PhaseRun(phase, LoopState(), executor, mode="sync", replay=None):
            pass
    assert log == ["start a 0", "start b 0", "close a", "close b"]
