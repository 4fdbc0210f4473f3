"""An external simulator plugged in through DELTARL_SCENARIOS runs a campaign end to end."""

from __future__ import annotations

import pytest

from envs import ScenarioError, get_scenario, register_scenario


@pytest.mark.campaign
def test_plugin_through_the_environment(tmp_path, monkeypatch):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.safety import run_safety

    monkeypatch.setenv("DELTARL_SCENARIOS", "ToyRobot=tests.plugin_scenario:ToyRobot")
    assert get_scenario("toyrobot").name == "ToyRobot"
    p = tmp_path / "c.yaml"
    p.write_text(f"scenario: ToyRobot\naut: python:tests.plugin_scenario:push_right\nworkers: 0\n"
                 f"output: {tmp_path / 'run'}\nmlflow: false\n"
                 f"safety: {{fuzzer: mdpfuzz, budget: {{episodes: 60}}, generation_size: 20}}\n")
    s = run_safety(load_campaign(p), progress=False)
    assert s["episodes"] == 60 and 0 < s["failures"] < 60  # some starts reach the wall within 40 steps


def test_plugin_errors_are_clear(monkeypatch):
    monkeypatch.setenv("DELTARL_SCENARIOS", "Broken=no_such_pkg.sim:Sim")
    with pytest.raises(ScenarioError, match="cannot import its module 'no_such_pkg.sim'.*plug-in installed"):
        get_scenario("Broken")
    monkeypatch.setenv("DELTARL_SCENARIOS", "Bad")
    with pytest.raises(ScenarioError, match="must read Name=module:Class"):
        get_scenario("CartPole-v1")
    monkeypatch.delenv("DELTARL_SCENARIOS")
    with pytest.raises(ScenarioError, match="built in"):
        register_scenario("CartPole-v1", "x:y")
