"""Grids: expansion (coupled settings, validation) and ≥ 6 short campaigns run concurrently as
Ray tasks into one table and one MLflow experiment."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from orchestrator.campaign.grid import GridError, expand, load_grid, run_grid

BAL = "python:workers.examples:cartpole_balancer"


def grid_file(tmp_path, axes: str, extra_base: str = "", profile: str | None = None, tail: str = "") -> dict:
    p = tmp_path / "g.yaml"
    p.write_text(f"""
name: g
output: {tmp_path / 'out'}
base:
  scenario: CartPole-v1
  aut: "{BAL}"
  safety: {{fuzzer: random, budget: {{episodes: 32}}, generation_size: 16}}
{extra_base}
axes:
{axes}
{tail}""")
    return load_grid(p, profile=profile)


def test_expansion_crosses_axes_and_couples_mapping_values(tmp_path):
    g = grid_file(tmp_path, """  env:
    - {scenario: CartPole-v1, aut: "python:workers.examples:cartpole_balancer"}
    - {scenario: MountainCar-v0, aut: "python:workers.examples:mountaincar_energy"}
  safety.fuzzer: [random, curefuzz, gmt]
  seed: [0, 1]""")
    pts = expand(g)
    assert len(pts) == 12
    scen = {(c.scenario, c.aut) for _, c in pts}
    assert scen == {("CartPole-v1", BAL), ("MountainCar-v0", "python:workers.examples:mountaincar_energy")}
    assert len({c.output for _, c in pts}) == 12 and all(c.workers == 0 for _, c in pts)
    with pytest.raises(GridError, match="safety.fuzzer: unknown fuzzer 'afl'"):
        expand(grid_file(tmp_path, "  safety.fuzzer: [random, afl]"))


def progress_actors_of(prefix: str, wait: float = 10.0) -> list:
    """Named progress actors of campaigns starting with ``prefix`` still alive after ``wait`` s
    (``ray.kill`` is asynchronous)."""
    import time

    import ray

    deadline = time.monotonic() + wait
    while True:
        alive = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith(f"deltarl/{prefix}") and a["name"].endswith("/progress")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def test_a_grid_of_six_campaigns_runs_into_one_table(tmp_path, ray_cluster):
    import mlflow

    g = grid_file(tmp_path, """  safety.fuzzer: [random, curefuzz, mdpfuzz]
  seed: [0, 1]""", extra_base="  optimality: {challenger: 'random:3', budget: {episodes: 16}, generation_size: 8}")
    df = run_grid(g, progress=False)
    assert len(df) == 6 and (df["status"] == "done").all()
    assert set(df["safety.fuzzer"]) == {"random", "curefuzz", "mdpfuzz"} and set(df["seed"]) == {0, 1}
    assert (df["safety_episodes"] == 32).all() and (df["cases"] == 16).all()
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert table["failures"].tolist() == df["failures"].tolist()
    client = mlflow.MlflowClient(f"sqlite:///{(tmp_path / 'out' / 'mlflow.db').resolve()}")
    exp = client.get_experiment_by_name("g")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    assert len(runs) == 12  # safety + optimality of each campaign, one experiment
    assert {r.data.tags["deltarl.phase"] for r in runs} == {"safety", "optimality"}
    # each campaign's progress actor ends with its campaign: a grid's workers keep no idle actor per
    # finished campaign (they are processes: ~140 MB each)
    assert not progress_actors_of("g-"), "finished campaigns left their progress actors"
    # running the grid again skips what finished
    mtime = (tmp_path / "out" / "g-000" / "results.json").stat().st_mtime
    again = run_grid(g, progress=False)
    assert again["failures"].tolist() == df["failures"].tolist()
    assert (tmp_path / "out" / "g-000" / "results.json").stat().st_mtime == mtime


def test_only_runs_the_matching_campaigns_and_a_later_run_the_rest(tmp_path, ray_cluster):
    from orchestrator.campaign.grid import parse_only, selects

    g = grid_file(tmp_path, """  method:
    - {safety.fuzzer: random}
    - {safety.fuzzer: mdpfuzz, safety.params: {tau: 0.02}}
  seed: [0, 1]""")
    df = run_grid(g, progress=False, only=parse_only(["safety.params.tau=0.02", "seed=1"]))
    assert df["campaign"].tolist() == ["g-003"] and (df["status"] == "done").all()
    assert [p.name for p in sorted((tmp_path / "out").glob("g-*"))] == ["g-003"]
    df = run_grid(g, progress=False, only=parse_only(["safety.fuzzer=random"]))  # g-003 reported, not re-run
    assert df["campaign"].tolist() == ["g-000", "g-001", "g-003"]
    assert len(run_grid(g, progress=False)) == 4
    two = parse_only(["seed=0", "seed=1", "safety.fuzzer=mdpfuzz"])  # one setting's values: alternatives
    assert two == {"seed": [0, 1], "safety.fuzzer": ["mdpfuzz"]}
    picked = [c.name for _, c in expand(g) if selects(c, two)]
    assert picked == ["g-002", "g-003"]
    with pytest.raises(GridError, match="no campaign of the grid matches"):
        run_grid(g, progress=False, only=parse_only(["scenario=Pong-v5"]))
    with pytest.raises(GridError, match="write SETTING=VALUE"):
        parse_only(["seed"])


def test_profiles_set_budgets_axes_and_output(tmp_path):
    profiles = """profiles:
  local: {set: {safety.budget: {episodes: 50}}, axes: {seed: [0, 1, 2]}}
  paper: {set: {safety.budget: {seconds: 7200}, safety.sampling_fraction: 0.25}, axes: {seed: [0, 1, 2, 3, 4]}}"""

    def load(profile=None):
        return grid_file(tmp_path, "  safety.fuzzer: [random, mdpfuzz]", profile=profile, tail=profiles)

    local = expand(load())  # the first profile by default
    assert len(local) == 6 and all(c.safety.budget.episodes == 50 for _, c in local)
    assert all(str(tmp_path / "out" / "local") in c.output for _, c in local)
    paper = expand(load("paper"))
    assert len(paper) == 10 and all(c.safety.budget.seconds == 7200 and c.safety.budget.episodes is None
                                    for _, c in paper)
    with pytest.raises(GridError, match="unknown profile 'huge'; profiles: local, paper"):
        load("huge")


def _dig(d: dict, dotted: str):
    for k in dotted.split("."):
        d = d[k]
    return d


def _holds(campaign: dict, dotted: str, value) -> bool:
    """The campaign has ``value`` at ``dotted`` (a mapping: each of its keys; a budget: exactly)."""
    got = _dig(campaign, dotted)
    if isinstance(value, dict) and dotted.endswith("budget"):
        return got == {"episodes": None, "seconds": None, **value}
    if isinstance(value, dict):  # e.g. params: each key (a later axis may add others)
        return all(_holds(campaign, f"{dotted}.{k}", v) for k, v in value.items())
    return got == value


@pytest.mark.slow
def test_every_paper_grid_expands_in_every_profile(monkeypatch):
    """Every profile of every paper grid expands into exactly the campaigns it declares: the cross
    product of its axes, each axis value (methods, environments, challengers, seeds) in an equal
    share of the campaigns and in each campaign's settings, and the profile's budgets in all."""
    import math
    from collections import Counter
    from pathlib import Path

    import yaml

    from workers.policies.load import resolve_zoo_uri

    monkeypatch.setenv("DELTARL_LLM_BASE_URL", "http://127.0.0.1:9/v1")  # LLMTester grids take it from here
    monkeypatch.setenv("DELTARL_LLM_MODEL", "any")

    files = sorted(Path("experiments/delta").glob("*.yaml")) + sorted(Path("experiments/llmtester").glob("*.yaml"))
    assert len(files) >= 4
    for f in files:
        raw = yaml.safe_load(f.read_text())
        assert {"local", "paper"} <= set(raw["profiles"]), f
        for profile, prof in raw["profiles"].items():
            axes = {**raw["axes"], **(prof.get("axes") or {})}
            pts = expand(load_grid(f, profile=profile))
            where = f"{f.name} --profile {profile}"
            assert len(pts) == math.prod(len(v) for v in axes.values()), where
            dicts = [c.to_dict() for _, c in pts]
            for axis, values in axes.items():
                labels = [json.dumps(v, sort_keys=True) for v in values]
                got = [p[axis] if isinstance(values[0], dict) else json.dumps(p[axis], sort_keys=True) for p, _ in pts]
                assert Counter(got) == Counter({lab: len(pts) // len(values) for lab in labels}), (where, axis)
                for lab, d in zip(got, dicts):
                    v = values[labels.index(lab)]
                    for dotted, x in (v.items() if isinstance(v, dict) else [(axis, v)]):
                        assert _holds(d, dotted, x), (where, axis, dotted, x)
            for dotted, value in (prof.get("set") or {}).items():
                assert all(_holds(d, dotted, value) for d in dicts), (where, dotted)
            for aut in {d["aut"] for d in dicts if str(d["aut"]).startswith("zoo:")}:
                assert resolve_zoo_uri(aut).is_file(), (where, aut)  # an agent the zoo has
            if "optimality" in raw["base"]:  # every method of a table gets the same test-case budget
                assert len({json.dumps(d["optimality"]["budget"]) for d in dicts}) == 1, where
                assert len({(d["optimality"]["generation_size"], d["optimality"]["sampling_fraction"])
                            for d in dicts}) == 1, where
            if profile == "paper-cases":  # issue #17's re-run
                assert sorted({d["seed"] for d in dicts}) == [0, 1, 2, 3, 4], where
                assert {d["scenario"] for d in dicts} == {"CartPole-v1", "MountainCar-v0", "Acrobot-v1"}, where
                assert all(d["optimality"]["budget"]["episodes"] >= 5000 for d in dicts), where
                methods = {(d["optimality"]["fuzzer"], tuple(d["optimality"]["params"].get("without", [])))
                           for d in dicts}
                if f.name == "rq2-rq3-methods.yaml":
                    assert methods == {("delta", ()), ("mdpfuzz", ()), ("curefuzz", ()), ("gmt", ()),
                                       ("delta", ("diversity",)), ("delta", ("regret",)),
                                       ("delta", ("inconsistency",))}, where
                else:
                    assert methods == {("delta", ())} and {tuple(d["challenger"]["algos"]) for d in dicts} == {
                        ("bc",), ("bcq",), ("cql",)}, where


def test_a_finished_point_is_recognised_across_a_setting_added_since(tmp_path):
    """A finished campaign whose campaign.json predates a setting (here challenger.torch_threads,
    absent = its default) is the same point and is not re-run; a changed setting is an error that
    names it."""
    from orchestrator.campaign.grid import _finished
    from orchestrator.runs.layout import RunFolder

    g = grid_file(tmp_path, "  seed: [0]", extra_base="  challenger: {algos: [bc], steps: 10}")
    (_, campaign), = expand(g)
    folder = RunFolder(campaign.output)
    folder.root.mkdir(parents=True)
    stored = json.loads(json.dumps(campaign.to_dict(), default=str))
    del stored["challenger"]["torch_threads"]  # written before the setting existed
    folder.campaign_json.write_text(json.dumps(stored))
    assert _finished(campaign, folder) is None  # no results.json: not finished
    folder.results_json.write_text(json.dumps({"safety": {"episodes": 32}}))
    assert _finished(campaign, folder) == {"safety": {"episodes": 32}}
    stored["seed"] = 1
    folder.campaign_json.write_text(json.dumps(stored))
    with pytest.raises(GridError, match=r"holds a finished campaign that differs .*\(seed changed\)"):
        _finished(campaign, folder)


def test_a_challenger_lock_of_a_lost_ray_node_is_taken_over(tmp_path, monkeypatch):
    """A grid's campaign rerun after its node died finds the challenger-cache lock its first
    attempt held on another machine (another host name): it takes the lock over once the
    cluster counts that node dead, and waits while the node lives or is unknown."""
    import orchestrator.campaign.challenger as ch

    alive = {"n-alive": True, "n-dead": False}
    monkeypatch.setattr(ch, "ray_node_alive", lambda node: alive.get(node))
    monkeypatch.setattr(ch, "ray_node_id", lambda: "n-here")
    lock = tmp_path / ".k.lock"
    for text, died in (("other-host:12\nray-node:n-dead", True), ("other-host:12\nray-node:n-alive", False),
                       ("other-host:12\nray-node:n-unknown", False), ("other-host:12", False)):
        lock.write_text(text)
        assert ch._owner_died(lock) is died, text
    lock.write_text("other-host:12\nray-node:n-dead")
    monkeypatch.setattr(ch.time, "sleep", lambda s: (_ for _ in ()).throw(AssertionError("waited for a dead node")))
    assert ch._claim_or_wait(tmp_path, "k", timeout_s=3600.0, poll_s=2.0) == lock
    assert lock.read_text().splitlines()[1] == "ray-node:n-here"
