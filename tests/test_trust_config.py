"""Issue #47, the campaign's side: a resume cannot mix agents or seeds (the run's recorded
identity), every value bounded before any work, paths expanded, a full disk and NaN summaries
said plainly, the MLflow hint only when true."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "DELTARL_DASHBOARD": "0"}
BALANCER = "python:workers.examples:cartpole_balancer"

CAMPAIGN = """name: trust
scenario: CartPole-v1
aut: {aut}
seed: 7
workers: 0
output: {out}
mlflow: false
safety:
  fuzzer: curefuzz
  budget: {{episodes: 96}}
  generation_size: 16
{more}"""


class Killed(BaseException):
    """A simulated kill (no ``Exception``: nothing treats it as bad input)."""


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def parts(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for d in ("steps", "episodes") for p in (out / d).glob("*.parquet"))


def mlp(path: Path, seed: int) -> Path:
    from workers.policies import export_mlp_torchscript

    export_mlp_torchscript(str(path), 4, 2, hidden=(8,), seed=seed)
    return path


def killed_after(monkeypatch, campaign_file: Path, writes: int) -> None:
    """Run the campaign until its ``writes``-th store write (a few snapshots taken), then kill it."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign
    from orchestrator.runs.store import RunStore

    original, n = RunStore.write, {"n": 0}

    def write(self, *a, **kw):
        ids = original(self, *a, **kw)
        n["n"] += 1
        if n["n"] == writes:
            raise Killed
        return ids

    monkeypatch.setattr(RunStore, "write", write)
    with pytest.raises(Killed):
        run_campaign(load_campaign(campaign_file), progress=False)
    monkeypatch.undo()


# -- 1. a resume cannot mix agents or seeds ----------------------------------------------------
@pytest.mark.campaign
def test_a_resume_after_the_aut_file_was_replaced_is_refused_and_writes_nothing(tmp_path, monkeypatch, capsys):
    aut, out = mlp(tmp_path / "aut.pt", 0), tmp_path / "run"
    c = tmp_path / "c.yaml"
    c.write_text(CAMPAIGN.format(aut=aut, out=out, more=""))
    killed_after(monkeypatch, c, 4)
    recorded = json.loads((out / "identity.json").read_text())
    newest = max(int(p.stem.split("-")[1]) for p in (out / "snapshots").glob("gen-*.pkl"))
    assert newest == 3 and recorded["seed"] == 7  # killed in generation 4, three snapshots taken
    import pandas as pd

    shas = set(pd.read_parquet(out / "episodes", columns=["policy_sha256"])["policy_sha256"])
    assert shas == {recorded["aut_sha256"]}  # the identity holds the AUT as every episode names it
    before = parts(out)
    mlp(aut, 1)  # another agent in the same file
    code, _, err = run_cli(capsys, "run", "--resume", out)
    assert code == 2, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("deltarl: error: --resume") and "the AUT file changed since this run started (sha256 " \
        f"{recorded['aut_sha256'][:8]}… → " in line, line
    assert parts(out) == before and not (out / "results.json").exists()
    mlp(aut, 0)  # the same agent back: the run continues
    code, _, err = run_cli(capsys, "run", "--resume", out)
    assert code == 0, err
    assert set(pd.read_parquet(out / "episodes", columns=["policy_sha256"])["policy_sha256"]) == shas


@pytest.mark.campaign
@pytest.mark.parametrize("edit", ["seed", "aut", "fuzzer"])
def test_a_resume_after_campaign_json_was_edited_is_refused(tmp_path, monkeypatch, capsys, edit):
    out = tmp_path / "run"
    c = tmp_path / "c.yaml"
    c.write_text(CAMPAIGN.format(aut='"random:3"', out=out, more=""))
    killed_after(monkeypatch, c, 3)
    data = json.loads((out / "campaign.json").read_text())
    if edit == "seed":
        data["seed"], want = 8, "the seed changed since this run started (7 → 8)"
    elif edit == "aut":
        data["aut"], want = BALANCER, f"the AUT (campaign.json's aut) changed since this run started ('random:3' → '{BALANCER}')"
    else:
        data["safety"]["fuzzer"], want = "random", "safety.fuzzer changed since this run started ('curefuzz' → 'random')"
    (out / "campaign.json").write_text(json.dumps(data))
    before = parts(out)
    code, _, err = run_cli(capsys, "run", "--resume", out)
    assert code == 2 and want in err and "Traceback" not in err, err
    assert parts(out) == before


def test_identity_differences_name_each_change_and_merge_added_phases(tmp_path):
    from orchestrator.runs.identity import check_identity, record_identity
    from orchestrator.runs.store import StoreError

    base = {"deltarl_version": "0.1.0", "scenario": "CartPole-v1", "scenario_overrides": {}, "aut": "a.pt",
            "aut_sha256": "a" * 64, "seed": 0, "batch_size": 256, "phases": {"safety": {"fuzzer": "random"}}}
    record_identity(tmp_path, base)
    assert check_identity(tmp_path, dict(base), resume=True)["aut_sha256"] == "a" * 64
    as_loaded = {**base, "phases": {"safety": {"fuzzer": "random", "params": {"without": ("regret",)}}}}
    record_identity(tmp_path / "t", as_loaded)  # a tuple in memory is a list on disk: still the same run
    assert check_identity(tmp_path / "t", as_loaded, resume=True)["phases"]["safety"]["params"] == {"without": ["regret"]}
    with pytest.raises(StoreError, match=r"the scenario overrides changed since this run started \({} → "):
        check_identity(tmp_path, {**base, "scenario_overrides": {"max_steps": 10}}, resume=True)
    with pytest.raises(StoreError, match="deltarl's version changed"):
        check_identity(tmp_path, {**base, "deltarl_version": "9"}, resume=True)
    added = {**base, "phases": {"optimality": {"fuzzer": "delta", "challenger_sha256": "c" * 64}}}
    merged = check_identity(tmp_path, added, resume=False)  # a phase added: the run's phases kept, the new one in
    assert set(merged["phases"]) == {"safety", "optimality"}
    record_identity(tmp_path, merged)
    with pytest.raises(StoreError, match=r"the optimality challenger file changed since this run started "
                                         r"\(sha256 cccccccc… → dddddddd…\)"):
        check_identity(tmp_path, {**base, "phases": {"optimality": {"fuzzer": "delta", "challenger_sha256": "d" * 64}}},
                       resume=False)


# -- 2. validation before any work -------------------------------------------------------------
PROBE = """import sys
from orchestrator.cli import main
code = main(["run", sys.argv[1]])
print("RESULT", code, "ray" in sys.modules)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("change", ["workers: 100000", "episodes: 1e23"])
def test_huge_workers_or_episodes_exit_2_before_ray_is_imported(tmp_path, change):
    text = CAMPAIGN.format(aut='"random:3"', out=tmp_path / "run", more="")
    text = text.replace("workers: 0", change) if change.startswith("workers") else \
        text.replace("episodes: 96", change)
    (tmp_path / "c.yaml").write_text(text)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "c.yaml")], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "RESULT 2 False", proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    want = "rollout actors, but this machine (usable cores) has" if change.startswith("workers") else \
        "safety.budget.episodes must be at most 1,000,000,000"
    assert want in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_bounds_and_number_text(tmp_path):
    from orchestrator.campaign.config import MAX_EPISODES, CampaignError, load_campaign

    base = CAMPAIGN.format(aut='"random:3"', out=tmp_path / "run", more="")
    cases = {"seconds: 1e3": None, "seconds: 1.0e+300": "safety.budget.seconds must be at most",
             "episodes: 99999999999999999999999": "safety.budget.episodes must be at most",
             "episodes: 2e3": None, "episodes: 1.5e0": "safety.budget.episodes must be an integer"}
    for text, error in cases.items():
        (tmp_path / "c.yaml").write_text(base.replace("episodes: 96", text))
        if error is None:
            c = load_campaign(tmp_path / "c.yaml")
            assert (c.safety.budget.seconds, c.safety.budget.episodes) in ((1000.0, None), (None, 2000))
        else:
            with pytest.raises(CampaignError, match=error):
                load_campaign(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text(base.replace("episodes: 96", f"episodes: {MAX_EPISODES}"))
    assert load_campaign(tmp_path / "c.yaml").safety.budget.episodes == MAX_EPISODES


@pytest.mark.parametrize("override, message", [
    ("{max_steps: .nan}", "scenario_overrides.max_steps must be an integer >= 1"),
    ("{max_steps: -1}", "scenario_overrides.max_steps must be an integer >= 1"),
    ("{max_steps: abc}", "scenario_overrides.max_steps must be an integer >= 1"),
    ("{low: [1, 2]}", "scenario_overrides.low must be a list of 4 finite numbers"),
    ("{name: Other}", "scenario_overrides.name: name says which scenario this is"),
    ("{mutation_scale: .inf}", "scenario_overrides.mutation_scale must be a finite number"),
])
def test_scenario_overrides_are_checked_by_the_scenario(tmp_path, override, message):
    from orchestrator.campaign.config import CampaignError, load_campaign

    (tmp_path / "c.yaml").write_text(CAMPAIGN.format(aut='"random:3"', out=tmp_path / "run", more="")
                                     + f"scenario_overrides: {override}\n")
    with pytest.raises(CampaignError, match=message):
        load_campaign(tmp_path / "c.yaml")


def test_good_overrides_still_pass(tmp_path):
    from orchestrator.campaign.config import load_campaign

    (tmp_path / "c.yaml").write_text(CAMPAIGN.format(aut='"random:3"', out=tmp_path / "run", more="")
                                     + "scenario_overrides: {max_steps: 50, mutation_scale: 1, "
                                       "low: [-0.1, -0.1, -0.1, -0.1]}\n")
    c = load_campaign(tmp_path / "c.yaml")
    assert c.build_scenario().max_steps == 50


def test_every_campaign_shipped_still_loads():
    """The bounds refuse no campaign file of experiments/ (grids' bases and profiles aside)."""
    from orchestrator.campaign.config import load_campaign

    files = sorted((REPO / "experiments").glob("campaigns/*.yaml")) + [REPO / "experiments" / "quickstart.yaml"]
    assert len(files) >= 3
    for f in files:
        load_campaign(f, output="/tmp/unused-by-this-test")


def test_policy_paths_under_home_are_expanded(tmp_path, monkeypatch):
    from orchestrator.campaign.config import CampaignError, load_campaign

    monkeypatch.setenv("HOME", str(tmp_path))
    mlp(tmp_path / "aut.pt", 0)
    (tmp_path / "c.yaml").write_text(CAMPAIGN.format(aut="~/aut.pt", out=tmp_path / "run",
                                                     more="optimality:\n  challenger: $HOME/aut.pt\n"))
    c = load_campaign(tmp_path / "c.yaml")
    assert c.aut == str(tmp_path / "aut.pt") == c.optimality.challenger
    (tmp_path / "c.yaml").write_text(CAMPAIGN.format(aut="$DELTARL_NO_SUCH_VAR/aut.pt", out=tmp_path / "run", more=""))
    monkeypatch.delenv("DELTARL_NO_SUCH_VAR", raising=False)
    with pytest.raises(CampaignError, match="aut: environment variable DELTARL_NO_SUCH_VAR is not set"):
        load_campaign(tmp_path / "c.yaml")


@pytest.mark.campaign
def test_output_with_a_tilde_writes_under_home(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TRUST_SUB", "sub")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(CAMPAIGN.format(aut='"random:3"', out="~/x/$TRUST_SUB", more="")
                                     .replace("episodes: 96", "episodes: 32"))
    code, out, err = run_cli(capsys, "run", tmp_path / "c.yaml")
    assert code == 0, err
    assert (home / "x" / "sub" / "results.json").is_file() and not (tmp_path / "~").exists()
    assert json.loads((home / "x" / "sub" / "campaign.json").read_text())["output"] == str(home / "x" / "sub")
    assert "MLflow" not in out  # mlflow: false: no MLflow hint


@pytest.mark.campaign
def test_a_wrong_challenger_is_reported_before_the_safety_phase(tmp_path, capsys):
    from workers.policies import export_mlp_torchscript

    hopper = export_mlp_torchscript(str(tmp_path / "hopper.pt"), 11, 3, hidden=(8,), discrete=False)
    for challenger, want in ((tmp_path / "nope.pt", "optimality.challenger: "),
                             (hopper, "optimality.challenger: ")):
        opt = f"optimality:\n  fuzzer: delta\n  challenger: \"{challenger}\"\n  budget: {{episodes: 16}}\n"
        out = tmp_path / f"run-{Path(challenger).stem}"
        (tmp_path / "c.yaml").write_text(CAMPAIGN.format(aut='"random:3"', out=out, more=opt))
        code, _, err = run_cli(capsys, "run", tmp_path / "c.yaml")
        assert code == 2 and want in err and "Traceback" not in err, err
        assert not out.exists()  # nothing ran, nothing written


@pytest.mark.campaign
def test_a_full_disk_is_one_message_with_the_resume_hint(tmp_path, monkeypatch, capsys):
    from orchestrator.runs.store import RunStore

    original, n = RunStore.write, {"n": 0}

    def write(self, *a, **kw):
        n["n"] += 1
        if n["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "steps" / "x.parquet"))
        return original(self, *a, **kw)

    monkeypatch.setattr(RunStore, "write", write)
    (tmp_path / "c.yaml").write_text(CAMPAIGN.format(aut='"random:3"', out=tmp_path / "run", more=""))
    code, _, err = run_cli(capsys, "run", tmp_path / "c.yaml")
    assert code == 2 and "Traceback" not in err, err
    assert "is full (No space left on device" in err and f"deltarl run --resume {tmp_path / 'run'}" in err
    monkeypatch.undo()  # space freed: the hint's command finishes the run
    code, _, err = run_cli(capsys, "run", "--resume", tmp_path / "run")
    assert code == 0 and json.loads((tmp_path / "run" / "summary.json").read_text())["episodes"] == 96, err


def test_finite_or_null_makes_strict_json(tmp_path):
    import numpy as np

    from orchestrator.runs.layout import RunFolder, finite_or_null

    obj = {"a": float("nan"), "b": [1.0, float("inf"), np.float64("nan")], "c": {"d": np.float32(2.5)}, "e": "x"}
    text = json.dumps(finite_or_null(obj), allow_nan=False)
    assert json.loads(text) == {"a": None, "b": [1.0, None, None], "c": {"d": 2.5}, "e": "x"}
    run = RunFolder(tmp_path)  # every JSON file of a run folder (optimality_summary.json too) is written so
    run.write_json(run.summary_json("optimality"), obj)
    assert "NaN" not in run.summary_json("optimality").read_text()
    assert json.loads(run.summary_json("optimality").read_text())["b"] == [1.0, None, None]


@pytest.mark.campaign
def test_results_json_is_strict_json_when_a_figure_is_undefined(tmp_path, capsys):
    """No bug found: the optimality phase's distance is undefined (NaN in memory), null on disk."""
    opt = "optimality:\n  fuzzer: random\n  challenger: \"random:3\"\n  budget: {episodes: 16}\n  generation_size: 16\n"
    out = tmp_path / "run"
    (tmp_path / "c.yaml").write_text(CAMPAIGN.format(aut='"random:3"', out=out, more=opt)
                                     .replace("episodes: 96", "episodes: 16"))
    code, _, err = run_cli(capsys, "run", tmp_path / "c.yaml")
    assert code == 0, err

    def refuse(name):
        raise ValueError(f"{name} in strict JSON")

    results = json.loads((out / "results.json").read_text(), parse_constant=refuse)
    assert results["optimality"]["bugs"] == 0 and results["optimality"]["distance"] is None
    json.loads((out / "summary.json").read_text(), parse_constant=refuse)


@pytest.mark.subprocess  # `deltarl run` starts MLflow's writer ahead
def test_campaign_env_holding_a_list_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("TRUST_CAMPAIGN", "[1, 2]")
    code, _, err = run_cli(capsys, "run", "--campaign-env", "TRUST_CAMPAIGN")
    assert code == 2 and "the variable holds a JSON list, not a campaign" in err and "Traceback" not in err


def test_workers_beyond_a_joined_cluster_are_refused_and_within_it_accepted(monkeypatch):
    from orchestrator.cluster import executor

    monkeypatch.setattr(executor, "usable_cpus", lambda: 2)
    monkeypatch.setattr(executor, "worker_cpus", lambda: (2, "this machine (usable cores)"))
    executor.check_workers(2)
    executor.check_workers("auto")
    with pytest.raises(executor.WorkersError, match="has 2 CPUs: give at most 2"):
        executor.check_workers(3)
    monkeypatch.setattr(executor, "worker_cpus", lambda: (64, "the running Ray cluster at 127.0.0.1:6379"))
    executor.check_workers(40)  # a cluster with the CPUs takes them
    monkeypatch.setattr(executor, "worker_cpus", lambda: (None, "the running Ray cluster at RAY_ADDRESS"))
    executor.check_workers(40)  # a cluster that does not say: Ray schedules them
