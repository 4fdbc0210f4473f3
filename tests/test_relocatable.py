"""A run folder is self-contained: moved, renamed and read from another working directory, it is
replayed, reported, resumed and repaired (issue 48, item 2). Paths stored inside it are relative
to the folder; folders written before that (paths relative to the directory the campaign ran in)
still read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import StoreError

REPO = Path(__file__).resolve().parents[1]


def _deltarl(args, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # MLflow in the run folder
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


# -- unit: what is stored and how it is read back ---------------------------------------------------

def test_paths_inside_the_folder_are_stored_relative_to_it(tmp_path, monkeypatch):
    run = RunFolder(tmp_path / "runs" / "a")
    model = run.challenger_dir("bcq") / "model.d3"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"x")
    assert run.stored(model) == "challengers/bcq/model.d3"
    monkeypatch.chdir(tmp_path)
    assert RunFolder("runs/a").stored("runs/a/challengers/bcq/model.d3") == "challengers/bcq/model.d3"
    outside = tmp_path / "other.d3"
    assert run.stored(outside) == str(outside)  # outside the folder: absolute, readable from anywhere
    assert RunFolder("runs/a").stored("other.d3") == str(outside)
    for uri in ("zoo:CartPole-v1", "python:workers.examples:cartpole_balancer", "random:3"):
        assert run.stored(uri) == uri and run.resolve(uri) == uri


def test_stored_paths_resolve_in_a_moved_folder_old_and_new(tmp_path, monkeypatch):
    root = tmp_path / "moved-here"
    model = root / "challengers" / "bcq" / "model.d3"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    run = RunFolder(root)
    assert Path(run.resolve("challengers/bcq/model.d3")) == model  # the new form
    # an older deltarl stored the path relative to the directory the campaign ran in, or absolute
    assert Path(run.resolve("runs/quickstart-1/challengers/bcq/model.d3")) == model
    assert Path(run.resolve("/gone/elsewhere/runs/q/challengers/bcq/model.d3")) == model
    # a path found nowhere names where it was expected
    assert run.resolve("challengers/cql/model.d3") == str(root / "challengers" / "cql" / "model.d3")


def test_the_aut_file_is_stored_absolute_or_relative_to_the_folder(tmp_path, monkeypatch):
    """campaign.json names the AUT's file as no working directory matters: absolute outside the
    folder, relative to it inside; read back usable from here (relative to the current directory
    when below it, as a campaign file names it). Policy URIs without a file stay as written."""
    from orchestrator.runs.identity import differences
    from orchestrator.runs.layout import same_policy_file

    (tmp_path / "agents").mkdir()
    aut = tmp_path / "agents" / "aut.pt"
    aut.write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    run = RunFolder("runs/a")
    for given in ("agents/aut.pt", "./agents/aut.pt", str(aut), f"file://{aut}"):
        assert run.stored_policy(given) == str(aut), given
    assert run.stored_policy("rlzoo:agents") == f"rlzoo:{tmp_path / 'agents'}"
    inside = Path("runs/a/aut/policy.pt")
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"y")
    assert run.stored_policy("runs/a/aut/policy.pt") == "aut/policy.pt"
    for uri in ("zoo:CartPole-v1", "python:workers.examples:cartpole_balancer", "random:3", None):
        assert run.stored_policy(uri) == uri and run.resolved_policy(uri) == uri
    assert run.resolved_policy(str(aut)) == "agents/aut.pt"  # below the current directory: as a campaign file says
    assert run.resolved_policy("aut/policy.pt") == "runs/a/aut/policy.pt"
    assert run.resolved_policy(f"rlzoo:{tmp_path / 'agents'}") == "rlzoo:agents"
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert run.resolved_policy(str(aut)) == str(aut)  # not below: absolute
    moved = RunFolder(tmp_path / "moved")
    shutil.move(str(tmp_path / "runs" / "a"), str(moved.root))
    assert moved.resolved_policy("aut/policy.pt") == str(moved.root / "aut" / "policy.pt")  # moved with its folder
    # the same file, named from two places; the identity compares an AUT file by its bytes
    assert same_policy_file(str(aut), "../agents/aut.pt") and not same_policy_file(str(aut), "zoo:CartPole-v1")
    have = {"aut": "agents/aut.pt", "aut_sha256": "a" * 64}
    assert differences(have, {"aut": str(aut), "aut_sha256": "a" * 64}) == []
    assert differences(have, {"aut": str(aut), "aut_sha256": "b" * 64}) == [
        "the AUT file changed since this run started (sha256 aaaaaaaa… → bbbbbbbb…)"]
    assert differences({"aut": "zoo:CartPole-v1"}, {"aut": "zoo:Acrobot-v1"}) == [
        "the AUT (campaign.json's aut) changed since this run started ('zoo:CartPole-v1' → 'zoo:Acrobot-v1')"]


@pytest.mark.slow
def test_mlflow_artifacts_of_a_moved_folder_are_found_where_the_folder_is(tmp_path, monkeypatch):
    """MLflow stores artifact locations absolute; after a move, the printed ``mlflow ui`` command
    (and any run that writes into the folder) points them at the folder where it is now, so the
    UI lists the artifacts and new ones land in the moved folder, not the old place."""
    import mlflow

    from orchestrator.runs import tracking
    from orchestrator.runs.mlflow_ui import ui_lines

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DELTARL_MLFLOW_EXPERIMENT", raising=False)
    first = tmp_path / "first" / "run"
    (first).mkdir(parents=True)
    (first / "summary.json").write_text("{}")
    info = tracking.start_run(first, "safety", "r0")
    tracking.log_artifact(info, first / "summary.json")
    tracking.end_run(info)
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.copytree(first, moved)  # a copy: the old folder is still there
    db = moved / "mlflow.db"
    ui_lines(db)
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("safety")
    assert exp.artifact_location == (moved / "mlartifacts").as_uri()
    run = client.get_run(info["run_id"])
    assert run.info.artifact_uri.startswith((moved / "mlartifacts").as_uri() + "/")
    assert [a.path for a in client.list_artifacts(info["run_id"])] == ["summary.json"]
    assert tracking.relocate_artifacts(db) == 0  # once is enough
    # a run started in the copy writes its artifacts into the copy
    again = tracking.start_run(moved, "safety", "r1")
    tracking.log_artifact(again, moved / "summary.json")
    tracking.end_run(again)
    assert list((moved / "mlartifacts").rglob("summary.json")) and len(list((first / "mlartifacts").rglob("*.json"))) == 1
    # the original, read in place, is untouched
    assert tracking.relocate_artifacts(first / "mlflow.db") == 0


def test_replay_of_a_missing_folder_says_it_does_not_exist(tmp_path):
    from orchestrator.campaign.replay import replay_bug, replay_failure

    for fn in (replay_bug, replay_failure):
        with pytest.raises(StoreError, match="does not exist") as err:
            fn(tmp_path / "no-such-run", 0)
        assert "optimality phase first" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="not a campaign run folder"):
        replay_bug(tmp_path / "empty", 0)



def test_replay_of_a_run_whose_optimality_phase_found_no_bug_says_so(tmp_path):
    """A run folder without bugs.parquet: "run an optimality phase first" only when none ran; when
    one ran and found nothing, the message says that (README's replay line after a bug-free run)."""
    from orchestrator.campaign.replay import replay_bug

    run = tmp_path / "run"
    run.mkdir()
    (run / "campaign.json").write_text("{}")
    with pytest.raises(StoreError, match="run an optimality phase first"):
        replay_bug(run, 0)
    (run / "optimality_summary.json").write_text('{"cases": 128, "bugs": 0}')
    with pytest.raises(StoreError, match="its optimality phase found no bug in 128 test cases") as err:
        replay_bug(run, 0)
    assert "optimality phase first" not in str(err.value)


# -- end to end: a small campaign, moved and renamed, used from another directory --------------------

@pytest.fixture(scope="module")
def moved_run(tmp_path_factory):
    """A CartPole campaign written with a relative --out from one directory (the zoo's paper
    Double DQN as a file named relative to that directory, 128 CureFuzz episodes, a BC challenger
    of 300 steps, 64 Delta test cases: 2 bugs), then the folder renamed into another directory."""
    base = tmp_path_factory.mktemp("reloc")
    first = base / "first"
    first.mkdir()
    (base / "agents").mkdir()
    for f in ("policy.pt", "model.d3"):  # the policy; its d3rlpy model beside it, for repair
        shutil.copy(REPO / "experiments" / "zoo" / "CartPole-v1-ddqn-paper" / f, base / "agents" / f)
    (first / "c.yaml").write_text("""
name: reloc
scenario: CartPole-v1
aut: ../agents/policy.pt
workers: 0
seed: 0
output: runs/reloc
mlflow: false
safety:
  fuzzer: curefuzz
  budget: {episodes: 128}
  generation_size: 64
challenger:
  algos: [bc]
  steps: 300
  eval_episodes: 5
optimality:
  fuzzer: delta
  budget: {episodes: 64}
  generation_size: 32
""")
    r = _deltarl(["run", "c.yaml"], first)  # not --quiet, to pipes: the log a machine keeps
    assert r.returncode == 0, r.stderr[-3000:]
    (base / "campaign.log").write_text(r.stdout + r.stderr)
    moved = base / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(str(first / "runs" / "reloc"), str(moved))
    shutil.rmtree(first)  # nothing of the old place is left
    return moved


@pytest.mark.campaign
@pytest.mark.subprocess
@pytest.mark.training
def test_the_run_stores_no_path_of_the_directory_it_ran_in(moved_run):
    opt = json.loads((moved_run / "optimality_summary.json").read_text())
    assert opt["challenger"] == "challengers/bc/model.d3"
    # the AUT's file, named relative to the directory the campaign ran in, is stored absolute
    aut = json.loads((moved_run / "campaign.json").read_text())["aut"]
    assert aut == str(moved_run.parent.parent / "agents" / "policy.pt"), aut
    assert json.loads((moved_run / "results.json").read_text())["optimality"]["challenger"] == opt["challenger"]
    assert opt["bugs"] > 0  # the replays below have bugs to re-run


@pytest.mark.campaign
@pytest.mark.subprocess
@pytest.mark.training
def test_a_moved_renamed_folder_is_replayed_reported_resumed_and_repaired(moved_run, tmp_path):
    cwd = tmp_path / "somewhere"
    cwd.mkdir()
    r = _deltarl(["replay", str(moved_run), "0"], cwd)
    assert r.returncode == 0, r.stderr[-3000:]  # 0: reproduced
    assert "  reproduced" in r.stdout
    # a folder written before paths were relative: the challenger path of the directory it ran in
    opt_file = moved_run / "optimality_summary.json"
    new = opt_file.read_text()
    opt_file.write_text(new.replace('"challengers/bc/model.d3"', '"runs/reloc/challengers/bc/model.d3"'))
    try:
        r = _deltarl(["replay", str(moved_run), "0"], cwd)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "  reproduced" in r.stdout
    finally:
        opt_file.write_text(new)
    # report, read from another directory, into a folder of its own
    r = _deltarl(["report", str(moved_run), "--out", "rep"], cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (cwd / "rep" / "report.md").is_file() and "bc" in (cwd / "rep" / "report.md").read_text().lower()
    # ... and as a person sees it: the moved run's report in Chromium, its figures decoded (a screenshot)
    from browser import Browser

    with Browser(tmp_path) as b:
        page = b.page((cwd / "rep" / "report.html").as_uri())
        text = page.wait_for("document.body.innerText.includes('bugs') && document.body.innerText", timeout=60)
        images = page.images()
        page.screenshot(tmp_path / "moved-run-report.png")
    assert "renamed" in text and "reloc" in text  # the moved folder's name, the campaign's
    assert images and all(i["ok"] and i["w"] > 100 for i in images), images
    # resume: an optimality phase interrupted after its last snapshot finishes from the moved folder
    bugs_before = opt_file.read_text()
    copy = tmp_path / "copy-of-run"
    shutil.copytree(moved_run, copy)
    for f in ("optimality_summary.json", "optimality_timeline.parquet", "results.json"):
        (copy / f).unlink()
    r = _deltarl(["run", "--resume", str(copy), "--quiet"], cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "optimality delta CartPole-v1:" not in r.stdout + r.stderr  # --quiet: no progress lines
    again = json.loads((copy / "optimality_summary.json").read_text())
    assert again["challenger"] == "challengers/bc/model.d3"
    assert again["bugs"] == json.loads(bugs_before)["bugs"]
    # repair: the challenger found through the moved folder
    r = _deltarl(["repair", str(copy), "--steps", "5", "--eval-episodes", "3", "--quiet"], cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((copy / "repair" / "repair.json").read_text())
    assert Path(rep["challenger"]).resolve() == (copy / "challengers" / "bc" / "model.d3").resolve()


@pytest.mark.subprocess
@pytest.mark.training
def test_an_interrupted_train_challenger_continues_when_rerun(moved_run, tmp_path):
    """Checkpoints but no card (the training was stopped): the same command continues it; a
    finished challenger is refused with what to do."""
    run = tmp_path / "run"
    shutil.copytree(moved_run, run)
    bc = run / "challengers" / "bc"
    assert sorted(p.name for p in (bc / "checkpoints").iterdir())  # the finished training left one
    for f in ("card.json", "model.d3", "policy.pt", "training.json"):
        (bc / f).unlink()
    cmd = ["train-challenger", "--data", str(run), "--algo", "bc", "--steps", "300", "--eval-episodes", "3", "--quiet"]
    r = _deltarl(cmd, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "interrupted bc training" in r.stderr and "continuing it" in r.stderr
    card = json.loads((bc / "card.json").read_text())
    assert card["steps"] == 300 and (bc / "model.d3").is_file()
    r = _deltarl(cmd, tmp_path)
    assert r.returncode != 0 and "already holds a bc challenger, trained" in r.stderr


# -- the log of a campaign whose output is no terminal (issue 48, item 5) -----------------------------

def test_line_progress_writes_a_line_per_tenth_or_per_30_seconds():
    import io

    from orchestrator.runs.progress_lines import LineProgress, progress_bar

    now = [0.0]
    out = io.StringIO()
    bar = LineProgress(1000, unit="ep", desc="safety curefuzz CartPole-v1", file=out, clock=lambda: now[0])
    for _ in range(100):  # 100 updates of 10: a line at every 100
        now[0] += 0.1
        bar.set_postfix(failures=3)
        bar.update(10)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and lines[-1].startswith("safety curefuzz CartPole-v1: 1000/1000 ep (100%), failures=3")
    out = io.StringIO()
    bar = LineProgress(10_000, file=out, clock=lambda: now[0])
    bar.update(1)
    now[0] += 31  # slow work: a line every 30 s even within a tenth
    bar.update(1)
    bar.close()  # nothing new since: no second final line
    assert len(out.getvalue().splitlines()) == 1 and "2/10000" in out.getvalue()
    off = progress_bar(10, enabled=False, file=io.StringIO())
    off.update(5)
    assert off.n == 5
    assert isinstance(progress_bar(10, file=io.StringIO()), LineProgress)  # a StringIO is no terminal


@pytest.mark.campaign
@pytest.mark.subprocess
@pytest.mark.training
def test_a_campaign_log_off_a_terminal_has_a_few_progress_lines_per_phase(moved_run):
    log = (moved_run.parent.parent / "campaign.log").read_text()
    assert "\r" not in log and "it/s" not in log  # no tqdm bar
    for phase, desc in (("safety", "safety curefuzz CartPole-v1: "), ("optimality", "optimality delta CartPole-v1: "),
                        ("challenger", "challenger bc on D (CartPole-v1): ")):
        lines = [ln for ln in log.splitlines() if ln.startswith(desc)]
        assert 1 <= len(lines) <= 12, (phase, lines)
        assert "(100%)" in lines[-1], lines[-1]
    assert len(log) < 6000, log[-3000:]
