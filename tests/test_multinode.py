"""deltarl on a Ray cluster of several nodes, each with its own file system view.

A head (``num-cpus 0``, token auth, as ``k8s/raycluster.yaml``) and two worker nodes, each
``ray start`` in its own mount namespace (:class:`orchestrator.cluster.multinode.NodeCluster`):
a node sees the Python installation and one shared folder (the "shared volume"), never the
checkout, ``/root`` or ``/tmp`` of the submitter. The code and the campaign's AUT reach the nodes
through the job's runtime_env only; run folders go to the shared folder.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from workers.resources import CHECKOUT

pytestmark = [pytest.mark.ray, pytest.mark.subprocess, pytest.mark.slow, pytest.mark.campaign]

ZOO_AUT = CHECKOUT / "experiments" / "zoo" / "CartPole-v1-ddqn" / "model.d3"


@pytest.fixture(scope="module")
def cluster():
    from orchestrator.cluster.multinode import NodeCluster

    root = Path(f"/var/tmp/deltarl-multinode-{os.getpid()}")
    shutil.rmtree(root, ignore_errors=True)
    c = NodeCluster(root, workers=[{"num_cpus": 2}, {"num_cpus": 2}])
    c.start()
    try:
        yield c
    finally:
        c.stop()
        left = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        assert str(root) not in left and c.pids() == [], "a Ray process of the cluster outlived it"
        if not os.environ.get("DELTARL_KEEP_MULTINODE"):  # set it to look at the run folders after a failure
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client_env(cluster, monkeypatch):
    for k, v in cluster.client_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    from orchestrator.cluster import ray_compat

    ray_compat.reload_auth_mode()
    yield
    monkeypatch.undo()
    ray_compat.reload_auth_mode()


def sees(pid: int, path: Path | str) -> bool:
    """Whether process ``pid`` can see ``path`` (looked up in its own mount namespace)."""
    return os.path.exists(f"/proc/{pid}/root{Path(path)}")


def dashboard_data(cluster, path: str) -> dict:
    """The ``data`` of one of the dashboard's own HTTP endpoints (those its pages read)."""
    import urllib.request

    req = urllib.request.Request(cluster.dashboard_url + path, headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["data"]


BOOKKEEPING = ("CampaignProgress",)  # deltarl's zero-CPU actors that hold no work (the progress counter)


def work_placement(cluster, job_id: str) -> dict:
    """``{node name: number of actors and tasks of job ``job_id`` that reserve CPU}``, where its
    driver ran, and ``"zero-CPU on head"``: the names of those that reserve none and ran on the
    head. Ray places an actor that reserves no CPU on any node, a ``num-cpus 0`` head included;
    an actor's tasks reserve what the actor reserves."""
    nodes, job = cluster.node_names(), cluster.job(job_id)
    ray_job = job["job_id"]
    out: dict = {"driver": nodes.get(job.get("driver_node_id"), "?"), "zero-CPU on head": []}
    actors = cluster.state("actors", job_id=ray_job)
    cpu = {a["actor_id"]: (a.get("required_resources") or {}).get("CPU", 0) for a in actors}
    items = [(a["node_id"], a["class_name"], cpu[a["actor_id"]]) for a in actors]
    for t in cluster.state("tasks", job_id=ray_job):
        reserve = cpu.get(t.get("actor_id"), 0) if t.get("actor_id") else (t.get("required_resources") or {}).get("CPU", 0)
        items.append((t.get("node_id"), t.get("func_or_class_name") or t.get("name", ""), reserve))
    for node_id, name, reserve in items:
        where = nodes.get(node_id, "unscheduled")
        if reserve > 0:
            out[where] = out.get(where, 0) + 1
        elif where == "head":
            out["zero-CPU on head"].append(name)
    return out


def test_quickstart_job_with_an_aut_only_the_submitter_has(cluster, client_env, tmp_path, installed_deltarl):
    """The quick start (small budgets) submitted with an AUT file in the submitter's /tmp, that no
    node can read: it runs on the workers only, its run folder lands on the shared volume."""
    from orchestrator.cluster import jobs

    aut = tmp_path / "my-agent" / "agent.d3"  # the submitter's own file, outside any checkout
    aut.parent.mkdir()
    shutil.copy(ZOO_AUT, aut)
    out = cluster.shared / "runs" / "quickstart"
    p = tmp_path / "qs.yaml"  # the quick start, with this AUT, 2 rollout actors and small budgets
    qs = yaml.safe_load((CHECKOUT / "experiments" / "quickstart.yaml").read_text())
    qs.update(aut=str(aut), workers=2)
    qs["safety"]["budget"], qs["optimality"]["budget"] = {"episodes": 64}, {"episodes": 64}
    qs["challenger"].update(steps=200, eval_episodes=10)
    p.write_text(yaml.safe_dump(qs, sort_keys=False))
    # submitted with the `deltarl` of a non-editable `pip install` (outside the checkout), from
    # another directory: the job ships that installation's code and data, not the checkout's
    deltarl = installed_deltarl / "bin" / "deltarl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(cluster.client_env())
    where_from = subprocess.run([str(installed_deltarl / "bin" / "python"), "-c", "import orchestrator, experiments; "
                                 "print(orchestrator.__file__, experiments.__file__)"],
                                env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert str(CHECKOUT) not in where_from and str(tmp_path) in where_from, where_from
    job_id, cli = "qs-pip-installed", [str(deltarl)]
    sub = subprocess.run([*cli, "submit", str(p), "--out", str(out), "--address", cluster.dashboard_url,
                          "--id", job_id, "--wait"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    log = jobs.logs(job_id, cluster.dashboard_url)
    assert sub.returncode == 0 and f"{job_id}: SUCCEEDED" in sub.stdout, (sub.stdout, sub.stderr[-2000:], log[-4000:])
    listed = subprocess.run([*cli, "jobs", "--address", cluster.dashboard_url], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    row = next((line for line in listed.stdout.splitlines() if job_id in line), "")
    assert listed.returncode == 0 and "SUCCEEDED" in row and str(out) in row, listed.stdout + listed.stderr
    printed = subprocess.run([*cli, "logs", job_id, "--address", cluster.dashboard_url], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0 and printed.stdout == log and str(out) in printed.stdout, printed.stderr[-2000:]

    results = json.loads((out / "results.json").read_text())
    assert results["safety"]["episodes"] == 64 and results["optimality"]["cases"] > 0, results
    for phase, verdicts in (("safety", "failures"), ("optimality", "bugs")):  # written when there are any
        rows = len(pd.read_parquet(out / f"{verdicts}.parquet")) if (out / f"{verdicts}.parquet").is_file() else 0
        assert rows == results[phase][verdicts], (verdicts, rows, sorted(os.listdir(out)))
    campaign = json.loads((out / "campaign.json").read_text())
    assert campaign["aut"].endswith("/inputs/aut/agent.d3") and str(aut) not in campaign["aut"]  # the shipped copy

    where = work_placement(cluster, job_id)
    assert where.get("head", 0) == 0 and where["driver"] != "head", where  # num-cpus 0: no work on the head
    assert all(name.split(".")[0] in BOOKKEEPING for name in where["zero-CPU on head"]), where
    assert where.get("worker1", 0) > 0 and where.get("worker2", 0) > 0, where  # rollout actors on both workers

    # what the dashboard's own pages are drawn from: its Cluster page lists the three nodes, its
    # Actors page the campaign's rollout actors, each on a worker
    names = cluster.node_names()
    summary = dashboard_data(cluster, "/nodes?view=summary")["summary"]
    shown_nodes = sorted(names[n["raylet"]["nodeId"]] for n in summary if n["raylet"].get("state") == "ALIVE")
    assert shown_nodes == ["head", "worker1", "worker2"], summary
    actors = dashboard_data(cluster, "/logical/actors")["actors"].values()
    rollouts = {a["name"]: names.get(a["address"]["nodeId"]) for a in actors
                if (a.get("name") or "").startswith(f"{qs['name']}/safety/rollout-")}
    assert sorted(rollouts) == [f"{qs['name']}/safety/rollout-{i}" for i in (0, 1)], rollouts
    assert set(rollouts.values()) <= {"worker1", "worker2"}, rollouts

    for node in cluster.nodes:  # no process of any node can read the submitter's files
        pids = node.pids()
        assert pids, node.name
        for pid in pids:
            assert not sees(pid, CHECKOUT / "orchestrator"), (node.name, pid, "sees the checkout")
            assert not sees(pid, aut), (node.name, pid, "sees the submitter's AUT")
            assert not sees(pid, Path.home() / ".ray"), (node.name, pid, "sees the submitter's home")
            assert sees(pid, cluster.shared / "runs"), (node.name, pid, "does not see the shared volume")


GRID = """
name: mn
output: {output}
base:
  scenario: CartPole-v1
  aut: zoo:CartPole-v1
  safety: {{fuzzer: curefuzz, budget: {{episodes: 64}}, generation_size: 16, sampling_fraction: 0.25}}
  challenger: {{algos: [bcq], steps: 100, eval_episodes: 5}}
  optimality: {{fuzzer: delta, budget: {{episodes: 32}}, generation_size: 16}}
axes:
  seed: [0, 1]
resources: {{num_cpus: 2}}
"""


def verdicts(folder: Path) -> dict:
    """Every campaign's failures and bugs, and how many episodes its store holds per phase. The
    wall-clock column and the episode ids are left out of the comparison: an episode id carries
    the slot of the process that wrote it (orchestrator/runs/store.py), and a campaign resumed
    by another process writes under another slot; the ids must still be unique."""
    out = {}
    for run in sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("mn-")):
        for name in ("failures", "bugs"):
            f = run / f"{name}.parquet"
            df = pd.read_parquet(f) if f.is_file() else pd.DataFrame()
            ids = [c for c in df.columns if c.endswith("episode_id")]
            for c in ids:
                assert df[c].is_unique, (run.name, name, c)
            df = df.drop(columns=["wall_time", *ids], errors="ignore")
            out[(run.name, name)] = df.sort_values(list(df.columns[:3])).reset_index(drop=True) if len(df) else df
        episodes = pd.read_parquet(run / "episodes", columns=["episode_id", "phase"])
        assert episodes["episode_id"].is_unique, run.name  # no episode written twice
        out[(run.name, "episodes per phase")] = episodes.groupby("phase").size().to_dict()
    return out


def mlflow_runs(db: Path) -> dict[str, str | None]:
    """``{run id: its deltarl.source tag or None}`` of the active runs of an MLflow SQLite file."""
    con = sqlite3.connect(db)
    try:
        return dict(con.execute("SELECT r.run_uuid, t.value FROM runs r LEFT JOIN tags t ON t.run_uuid = r.run_uuid "
                                "AND t.key = 'deltarl.source' WHERE r.lifecycle_stage = 'active'").fetchall())
    finally:
        con.close()


def run_grid_job(cluster, tmp_path, name: str, during=None) -> tuple[str, Path]:
    from orchestrator.campaign.grid import load_grid
    from orchestrator.cluster import jobs

    out = cluster.shared / "grids" / name
    p = tmp_path / f"{name}.yaml"
    p.write_text(GRID.format(output=out))
    # the grid's driver asks for no resources: Ray runs it on the head (never killed), as any job
    # that asks for none. Both grids share one challenger cache: BCQ training is not
    # bit-reproducible, and the same D must meet the same challenger
    job_id = jobs.submit_grid(load_grid(p), address=cluster.dashboard_url,
                              env_vars={"DELTARL_CHALLENGER_CACHE": str(cluster.shared / "challenger-cache")})
    if during is not None:
        during(job_id)
    status = jobs.wait(job_id, cluster.dashboard_url, timeout=1500)
    assert status == "SUCCEEDED", jobs.logs(job_id, cluster.dashboard_url)[-4000:]
    return job_id, out


def campaign_tasks(cluster, job_id: str) -> list[dict]:
    """The grid job's campaign tasks (every attempt), each with ``node``: the name of its node."""
    ray_job = cluster.job(job_id).get("job_id")
    if not ray_job:
        return []
    nodes = cluster.node_names()
    return [{**t, "node": nodes.get(t.get("node_id"), "unscheduled")} for t in cluster.state("tasks", job_id=ray_job)
            if (t.get("name") or "").endswith("_run_one")]


def test_a_node_lost_mid_grid(cluster, client_env, tmp_path):
    """While a grid's two campaigns run, one on each worker (each reserves a whole 2-CPU node), a
    third node joins and then one worker loses every process to ``kill -9`` (its safety phase or
    challenger training running): the lost campaign runs again on the node that joined (the
    surviving worker is busy: nowhere else has room), resumes its run folder on the shared
    volume, and every failures.parquet / bugs.parquet equals that of an undisturbed run."""
    killed = {}

    def add_a_node_then_kill_a_worker(job_id: str) -> None:
        t0 = time.monotonic()
        running: list = []
        while len(running) < 2 and time.monotonic() - t0 < 600:
            time.sleep(1.0)
            running = [t for t in campaign_tasks(cluster, job_id)
                       if t.get("state") == "RUNNING" and t["node"].startswith("worker")]
        assert sorted(t["node"] for t in running) == ["worker1", "worker2"], running
        started = time.monotonic()
        killed["added"] = cluster.add_node({"num_cpus": 2}).name  # a node joins mid-grid, idle
        time.sleep(max(0.0, 20 - (time.monotonic() - started)))  # well into the campaigns
        still = [t["node"] for t in campaign_tasks(cluster, job_id) if t.get("state") == "RUNNING"]
        assert sorted(still) == ["worker1", "worker2"], still  # both still running: the survivor stays busy
        killed.update(node="worker1", processes=cluster.kill_node("worker1"))

    storm_job, storm = run_grid_job(cluster, tmp_path, "storm", during=add_a_node_then_kill_a_worker)
    assert killed["processes"] > 0 and killed["added"] == "worker3", killed
    tasks = campaign_tasks(cluster, storm_job)
    where = sorted((t.get("attempt_number", 0), t["node"], t.get("state")) for t in tasks)
    print("node lost mid-grid:", killed, "campaign attempts (attempt, node, state):", where)
    assert all(node.startswith("worker") for _, node, _ in where), where  # never on the head
    retried = [(a, node) for a, node, _ in where if a >= 1]
    assert retried and all(node == "worker3" for _, node in retried), (killed, where)  # the grid used the new node

    # MLflow: each campaign wrote its own database; the grid's driver copied every run of them
    # (the killed attempt's too) into the grid's, once each
    own = {f"{d.name}/{rid}" for d in storm.glob("mn-*") for rid in mlflow_runs(d / "mlflow.db")}
    merged = sorted(mlflow_runs(storm / "mlflow.db").values(), key=str)
    assert len(own) >= 4 and merged == sorted(own), (merged, own)  # safety and optimality of both campaigns

    _, calm = run_grid_job(cluster, tmp_path, "calm")
    a, b = pd.read_parquet(storm / "results.parquet"), pd.read_parquet(calm / "results.parquet")
    assert (a["status"] == "done").all() and len(a) == 2, a
    pd.testing.assert_frame_equal(a, b)
    va, vb = verdicts(storm), verdicts(calm)
    assert sorted(va) == sorted(vb) and len(va) == 6
    for key in va:
        if isinstance(va[key], dict):
            assert va[key] == vb[key], (key, va[key], vb[key])  # no episode missing or duplicated
        else:
            pd.testing.assert_frame_equal(va[key], vb[key], obj=str(key))
    assert sum(len(v) for k, v in va.items() if k[1] != "episodes per phase") > 0  # something to compare


def test_a_node_lost_while_rollout_actors_run_there(cluster, client_env, tmp_path):
    """A campaign's safety phase on two rollout actors, submitted as a job: while it runs, every
    process of a worker that hosts a rollout actor (and not the job's driver) is killed and a
    fresh node joins. Ray restarts the lost actor on a node with room and reruns its batch (the
    pool's ``max_task_retries``; a batch is a pure function of its states and seeds): the job
    succeeds and its failures and episodes equal those of an undisturbed run."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.cluster import jobs

    qs = yaml.safe_load((CHECKOUT / "experiments" / "quickstart.yaml").read_text())
    qs = {k: v for k, v in qs.items() if k not in ("challenger", "optimality")}  # the safety phase only
    qs.update(aut="zoo:CartPole-v1", workers=2)
    qs["safety"]["budget"] = {"episodes": 4000}
    p = tmp_path / "safety.yaml"
    p.write_text(yaml.safe_dump(qs, sort_keys=False))
    lost: dict = {}

    def run(name: str, during=None) -> Path:
        out = cluster.shared / "actors" / name / "mn-0"
        job_id = jobs.submit(load_campaign(p, output=str(out)), address=cluster.dashboard_url)
        if during is not None:
            during(job_id)
        status = jobs.wait(job_id, cluster.dashboard_url, timeout=900)
        assert status == "SUCCEEDED", jobs.logs(job_id, cluster.dashboard_url)[-4000:]
        return out.parent

    def kill_a_node_with_a_rollout_actor(job_id: str) -> None:
        t0, victim = time.monotonic(), None
        while victim is None and time.monotonic() - t0 < 600:
            time.sleep(0.5)
            job = cluster.job(job_id)
            if not job.get("job_id") or not job.get("driver_node_id"):
                continue
            nodes = cluster.node_names()
            actors = [a for a in cluster.state("actors", job_id=job["job_id"])
                      if a.get("class_name") == "RolloutWorker" and a.get("state") == "ALIVE"]
            hosts = [nodes.get(a["node_id"]) for a in actors if a["node_id"] != job["driver_node_id"]]
            if len(actors) == 2 and hosts:
                victim = hosts[0]
        assert victim is not None, "the campaign's two rollout actors did not start"
        time.sleep(2.0)  # a few batches in
        assert jobs.status(job_id, cluster.dashboard_url) == "RUNNING"
        lost.update(node=victim, job=job_id, processes=cluster.kill_node(victim))
        lost["added"] = cluster.add_node({"num_cpus": 2}).name

    storm = run("storm", during=kill_a_node_with_a_rollout_actor)
    assert lost["processes"] > 0, lost
    ray_job = cluster.job(lost["job"])["job_id"]
    restarts = [int(a.get("num_restarts") or 0) for a in cluster.state("actors", job_id=ray_job)
                if a.get("class_name") == "RolloutWorker"]
    print("node lost under a rollout actor:", lost, "actor restarts:", restarts)
    assert max(restarts) >= 1, restarts  # the lost actor was restarted elsewhere
    calm = run("calm")
    va, vb = verdicts(storm), verdicts(calm)
    assert sorted(va) == sorted(vb)
    for key in va:
        if isinstance(va[key], dict):
            assert va[key] == vb[key], (key, va[key], vb[key])  # no episode missing or duplicated
        else:
            pd.testing.assert_frame_equal(va[key], vb[key], obj=str(key))
    assert len(va[("mn-0", "failures")]) > 0  # something to compare
