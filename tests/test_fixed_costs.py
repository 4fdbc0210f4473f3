"""Fixed costs (issue #20): what a command imports, MLflow off the campaign's critical path,
``workers: auto``, joining a running Ray instance, policies loaded once per process.

Behaviour, not timings: the timings are benchmarks/fixed_costs.py's job."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "d3rlpy", "ray", "mlflow")


def _python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


# -- imports -----------------------------------------------------------------------------------
@pytest.mark.subprocess
def test_help_imports_no_torch_d3rlpy_ray_or_mlflow():
    """`deltarl --help` and each command's --help load the parser only (checked in a fresh process)."""
    out = _python(f"""
        import contextlib, io, json, sys
        from orchestrator.cli import main
        seen = {{}}
        for argv in (["--help"], ["run", "--help"], ["rollout", "--help"], ["train-challenger", "--help"],
                     ["ray", "--help"], []):
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    main(argv)
                except SystemExit:
                    pass
            seen[" ".join(argv) or "(none)"] = [m for m in {HEAVY!r} + ("pandas", "pyarrow") if m in sys.modules]
        print(json.dumps(seen))
    """)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {k: [] for k in seen}, seen


@pytest.mark.subprocess
def test_an_in_process_campaign_imports_neither_ray_nor_mlflow_in_its_own_process(tmp_path):
    """workers: auto on a small budget runs in this process: no Ray; MLflow is the writer's."""
    camp = tmp_path / "c.yaml"
    camp.write_text(f"scenario: CartPole-v1\naut: random:1\noutput: {tmp_path / 'run'}\n"
                    "safety: {fuzzer: random, budget: {episodes: 8}, generation_size: 4}\n")
    out = _python(f"""
        import json, sys
        from orchestrator.cli import main
        assert main(["run", {str(camp)!r}, "--quiet"]) == 0
        print(json.dumps([m for m in ("ray", "mlflow", "d3rlpy") if m in sys.modules]))
    """, env={"DELTARL_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["executor"] == "in-process" and summary["executor_reason"].startswith("auto: ")
    assert "safety ran        in-process (auto: " in out.stdout
    import mlflow  # ... and the run is in MLflow all the same

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("safety").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.metrics["episodes"] == 8


@pytest.mark.subprocess
def test_the_console_exit_waits_for_threads_runs_exit_handlers_and_flushes(tmp_path):
    """`exit_without_teardown` (the `deltarl` script's exit) skips only the interpreter's teardown:
    a thread that is not a daemon finishes, every exit handler runs (in order: the last registered
    first), buffered stdout reaches a pipe, and the exit code is main's."""
    out = _python(f"""
        import atexit, pathlib, sys, threading, time
        import orchestrator.cli as cli
        d = pathlib.Path({str(tmp_path)!r})
        atexit.register(lambda: (d / "handlers").open("a").write("first-registered\\n"))
        atexit.register(lambda: (d / "handlers").open("a").write("last-registered\\n"))
        def late():
            time.sleep(0.3)
            (d / "thread").write_text("done")
        threading.Thread(target=late).start()
        print("buffered line")  # a pipe: block-buffered until flushed
        cli.exit_without_teardown(3)
        print("never printed")
    """)
    assert out.returncode == 3, out.stderr
    assert out.stdout == "buffered line\n"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "handlers").read_text().splitlines() == ["last-registered", "first-registered"]


@pytest.mark.subprocess
def test_d3rlpy_imports_without_scikit_learn_and_prdc_still_gets_it():
    """With `workers` imported first, importing d3rlpy loads neither scikit-learn nor pandas; the
    real `sklearn` imports afterwards, and PRDC's nearest-neighbour search works through it."""
    out = _python("""
        import json, sys
        import numpy as np
        import workers, d3rlpy
        seen = [m for m in ("sklearn", "sklearn.neighbors", "pandas", "scipy.stats") if m in sys.modules]
        from d3rlpy.algos.qlearning.prdc import PRDC
        nb = PRDC._nbsr
        pts = np.array([[0.0, 0.0], [10.0, 10.0]])
        nb.fit(pts)
        idx = nb.kneighbors(np.array([[9.0, 9.5]]), n_neighbors=1)[1]
        import sklearn.neighbors
        print(json.dumps({"seen": seen, "idx": idx.tolist(), "real": type(nb._real) is sklearn.neighbors.NearestNeighbors,
                          "sklearn_file": sys.modules["sklearn"].__file__ is not None}))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"seen": [], "idx": [[1]], "real": True, "sklearn_file": True}, got


# -- workers: auto -----------------------------------------------------------------------------
def test_workers_auto_rule():
    from orchestrator.cluster.executor import plan_workers

    # explicit numbers are kept
    assert plan_workers(3) == (3, "workers: 3 as set") and plan_workers(0)[0] == 0
    # too few cores: in-process whatever the work
    n, why = plan_workers("auto", episodes=10**7, cpus=2)
    assert n == 0 and "2 CPUs < 4" in why
    # enough cores, a fresh cluster: Ray from 2 x 20 s of in-process work (130 episodes/s)
    assert plan_workers("auto", episodes=5000, cpus=8)[0] == 0
    n, why = plan_workers("auto", episodes=6000, cpus=8)
    assert n == 7 and "starting a local cluster" in why
    # a running cluster to join: its start-up is mostly paid, Ray from 2 x 5 s of work
    cluster = {"address": "127.0.0.1:6379", "source": "deltarl ray up", "num_cpus": 16}
    assert plan_workers("auto", episodes=1200, cluster=cluster)[0] == 0
    n, why = plan_workers("auto", episodes=1400, cluster=cluster)
    assert n == 15 and "joining the running cluster at 127.0.0.1:6379" in why
    # a seconds budget is its own estimate
    assert plan_workers("auto", seconds=30, cpus=8)[0] == 0
    assert plan_workers("auto", seconds=600, cpus=8)[0] == 7


def test_workers_auto_is_the_default_and_validated(tmp_path):
    from orchestrator.campaign.config import Campaign, CampaignError, load_campaign

    assert Campaign(scenario="CartPole-v1", aut="random:0", output="x").workers == "auto"
    base = f"scenario: CartPole-v1\naut: random:0\noutput: {tmp_path / 'r'}\n"
    for text, want in (("", "auto"), ("workers: auto\n", "auto"), ("workers: AUTO\n", "auto"), ("workers: 3\n", 3)):
        (tmp_path / "c.yaml").write_text(base + text)
        assert load_campaign(tmp_path / "c.yaml").workers == want
    for bad in ("-1", "two", "true", "1.5"):
        (tmp_path / "c.yaml").write_text(base + f"workers: {bad}\n")
        with pytest.raises(CampaignError, match="workers must be auto or an integer >= 0"):
            load_campaign(tmp_path / "c.yaml")
    import yaml

    assert yaml.safe_load((REPO / "experiments" / "quickstart.yaml").read_text())["workers"] == "auto"


# -- a running Ray instance ----------------------------------------------------------------------
def test_running_cluster_is_found_without_ray(tmp_path, monkeypatch):
    from orchestrator.cluster import lifecycle

    short = Path(tempfile.mkdtemp(prefix="drt", dir="/tmp"))
    try:
        monkeypatch.setenv("RAY_TMPDIR", str(short))
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        assert lifecycle.running_cluster() is None
        with socket.socket() as srv:  # a "head" that answers on a port
            srv.bind(("127.0.0.1", 0))
            srv.listen()
            address = f"127.0.0.1:{srv.getsockname()[1]}"
            (short / "ray").mkdir()
            # what `deltarl ray up` writes (this process standing in for the head): tests/test_ray_edge.py
            # shows that a file without deltarl's marker, of another user or naming another process is not joined
            (short / "ray" / lifecycle.HEAD_FILE).write_text(json.dumps(lifecycle.head_record(address, num_cpus=8)))
            found = lifecycle.running_cluster()
            assert found["address"] == address and found["source"] == "deltarl ray up" and found["num_cpus"] == 8
            (short / "ray" / lifecycle.HEAD_FILE).unlink()
            (short / "ray" / "ray_current_cluster").write_text(address)
            assert lifecycle.running_cluster()["source"] == "ray start --head"
        assert lifecycle.running_cluster() is None  # the port no longer answers: a stale file
        monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
        assert lifecycle.running_cluster() == {"address": "10.0.0.1:6379", "source": "RAY_ADDRESS"}
        if "ray" not in sys.modules or not sys.modules["ray"].is_initialized():
            from orchestrator.cluster.executor import resolve_workers

            monkeypatch.setattr(lifecycle, "running_cluster", lambda: {"address": "h:1", "source": "x", "num_cpus": 8})
            assert "joining the running cluster at h:1" in resolve_workers("auto", episodes=2000)[1]
    finally:
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.slow
def test_campaigns_join_a_head_started_by_deltarl_ray_up(tmp_path):
    """`deltarl ray up` once; a campaign with Ray actors joins that head (it starts no cluster of
    its own: one Ray session in the temp folder); `deltarl ray down` stops that head only."""
    short = Path(tempfile.mkdtemp(prefix="dru", dir="/tmp"))  # Ray's socket paths must stay short
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(short), "DELTARL_DASHBOARD": "0",
           "DELTARL_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    cli = [sys.executable, "-m", "orchestrator.cli"]

    def deltarl(*args, timeout=600):
        return subprocess.run(cli + list(args), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)

    try:
        assert deltarl("ray", "status").returncode == 1
        up = deltarl("ray", "up", "--num-cpus", "2")
        assert up.returncode == 0 and "Ray head started" in up.stdout, up.stderr[-3000:]
        status = deltarl("ray", "status")
        assert status.returncode == 0 and "deltarl ray up" in status.stdout
        sessions = sorted(p.name for p in (short / "ray").glob("session_2*"))
        assert len(sessions) == 1
        camp = tmp_path / "c.yaml"
        camp.write_text(f"scenario: CartPole-v1\naut: random:1\nworkers: 1\nmlflow: false\noutput: {tmp_path / 'run'}\n"
                        "safety: {fuzzer: random, budget: {episodes: 8}, generation_size: 4}\n")
        run = deltarl("run", str(camp), "--quiet")
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads((tmp_path / "run" / "summary.json").read_text())["executor"] == "ray x1"
        assert sorted(p.name for p in (short / "ray").glob("session_2*")) == sessions  # joined, started none
        assert deltarl("ray", "up").stdout.startswith("Ray head already running")
    finally:
        down = deltarl("ray", "down")
        shutil.rmtree(short, ignore_errors=True)
    assert "Ray head stopped" in down.stdout
    assert deltarl("ray", "status").returncode == 1


@pytest.mark.subprocess
def test_training_runs_in_process_without_a_cluster(tmp_path):
    short = Path(tempfile.mkdtemp(prefix="drp", dir="/tmp"))
    try:
        out = _python("""
            import sys
            from orchestrator.campaign.train_jobs import training_placement
            on_ray, why = training_placement()
            print(on_ray, why, "ray" in sys.modules)
        """, env={"RAY_TMPDIR": str(short), "RAY_ADDRESS": ""})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False in this process: no Ray cluster running, none started for one training False"


# -- MLflow off the critical path ----------------------------------------------------------------
@pytest.mark.subprocess
def test_async_run_flushes_buffered_metrics_and_ends_the_run(tmp_path, monkeypatch):
    import mlflow

    from orchestrator.runs import tracking

    monkeypatch.setenv("DELTARL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DELTARL_MLFLOW_EXPERIMENT", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    run = tracking.AsyncRun(run_dir, "safety", "c-random", params={"campaign": {"seed": 3, "budget": {"episodes": 8}}},
                            tags={"fuzzer": "random"})
    for step in range(40):  # queued at once: the writer is still importing MLflow
        run.log_metrics({"failures": step, "nan": float("nan"), "flag": True}, step=step)
    run.log_artifact(run_dir / "summary.json")
    info = run.end()
    assert info is not None and run.error is None
    client = mlflow.MlflowClient(info["tracking_uri"])
    got = client.get_run(info["run_id"])
    assert got.info.status == "FINISHED" and got.info.run_name == "c-random"
    assert got.data.params == {"campaign.seed": "3", "campaign.budget.episodes": "8"}
    assert got.data.tags["deltarl.phase"] == "safety" and got.data.tags["fuzzer"] == "random"
    hist = client.get_metric_history(info["run_id"], "failures")
    assert sorted((m.step, m.value) for m in hist) == [(s, float(s)) for s in range(40)]
    assert "nan" not in got.data.metrics and "flag" not in got.data.metrics
    assert [a.path for a in client.list_artifacts(info["run_id"])] == ["summary.json"]
    assert client.get_experiment_by_name("safety").artifact_location == (run_dir / "mlartifacts").as_uri()
    # a failed phase ends its run FAILED
    failed = tracking.AsyncRun(run_dir, "safety", "again")
    failed.log_metrics({"x": 1})
    assert client.get_run(failed.end("FAILED")["run_id"]).info.status == "FAILED"
    # the new database was a copy of the migrated template, and MLflow made its Default experiment
    assert (tmp_path / "cache").glob("mlflow-*-empty.db")
    assert client.get_experiment("0").name == "Default"


@pytest.mark.subprocess
def test_a_failing_mlflow_only_warns(tmp_path, monkeypatch, capsys):
    from orchestrator.runs import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    run = tracking.AsyncRun(tmp_path, "safety", "x")
    run.log_metrics({"a": 1})
    assert run.end() is None and run.error
    assert "MLflow logging failed" in capsys.readouterr().err


@pytest.mark.subprocess
def test_info_waits_for_the_run(tmp_path, monkeypatch):
    from orchestrator.runs import tracking

    monkeypatch.setenv("DELTARL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tracking.AsyncRun(tmp_path, "challenger-training", "bcq")
    info = run.info()
    assert info["tracking_uri"].endswith("mlflow.db") and info["run_id"]
    tracking.log_metrics(info, {"loss": 0.5}, step=1)  # what a Ray Train job does with it
    run.log_metrics({"loss": 0.25}, step=2)
    assert run.end()["run_id"] == info["run_id"]
    import mlflow

    hist = mlflow.MlflowClient(info["tracking_uri"]).get_metric_history(info["run_id"], "loss")
    assert sorted(m.step for m in hist) == [1, 2]


# -- each policy loaded once per process ---------------------------------------------------------
def test_a_policy_file_is_loaded_once_per_process(tmp_path):
    from envs import get_scenario
    from workers.policies import export_mlp_torchscript, shared_policy

    sc = get_scenario("CartPole-v1")
    path = tmp_path / "p.pt"
    export_mlp_torchscript(path, 4, 2, hidden=(8,), seed=0)
    a = shared_policy(str(path), sc)
    assert shared_policy(str(path), sc) is a and shared_policy(str(path), sc, device="cpu") is a
    export_mlp_torchscript(path, 4, 2, hidden=(8,), seed=1)  # a new model in the same file: loaded again
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    assert shared_policy(str(path), sc) is not a
    assert shared_policy("random:3", sc) is not shared_policy("random:3", sc)  # stateful: never shared
    assert shared_policy("zoo:CartPole-v1", sc) is shared_policy("zoo:CartPole-v1", sc)


def test_the_summary_says_how_the_agents_acted_once_and_short():
    """The end-of-run summary's "acted" explanation: one line when both phases acted alike, a line
    per phase when they did not, a few words each (the reasons are in docs/verdicts.md)."""
    from orchestrator.campaign.pipeline import _acted_lines

    why = "inference: auto, CartPole-v1: a simulator step costs about as much as a policy call: ..."
    same = _acted_lines((("safety", {"inference": "batched", "inference_reason": why}),
                         ("optimality", {"inference": "batched", "inference_reason": why})))
    assert same == ["agents acted      batched, candidates re-run alone (inference: auto)"]
    mixed = _acted_lines((("safety", {"inference": "alone", "inference_reason": "inference: alone in the campaign"}),
                          ("optimality", {"inference": "batched", "inference_reason": why}), ("repair", None)))
    assert mixed == ["safety acted      every agent acting alone (set in the campaign)",
                     "optimality acted  batched, candidates re-run alone (inference: auto)"]
    assert all(len(line) < 80 for line in same + mixed)
    assert _acted_lines((("safety", None),)) == []
