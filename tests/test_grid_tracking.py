"""A grid's MLflow database has one writer: its driver copies each finished campaign's runs
(``orchestrator.runs.tracking.merge_runs``); the campaigns, on any node, write only their own."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # MLflow's import and SQLite store: seconds


def test_a_grids_database_gets_each_campaigns_runs_once_whole_and_from_one_writer(tmp_path, monkeypatch):
    import mlflow

    from orchestrator.runs import tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DELTARL_MLFLOW_EXPERIMENT", "g")  # as the grid's task sets it
    grid = tmp_path / "grid"
    camp = grid / "g-000"
    camp.mkdir(parents=True)
    (camp / "summary.json").write_text("{}")
    done = tracking.start_run(camp, "safety", "g-000-safety", params={"fuzzer": "random", "budget": {"episodes": 32}})
    for step in (8, 16, 24):
        tracking.log_metrics(done, {"failures": step // 8, "episodes": step}, step=step)
    tracking.log_artifact(done, camp / "summary.json")
    tracking.end_run(done)
    cut = tracking.start_run(camp, "optimality", "g-000-optimality")  # never ended: its campaign was killed
    monkeypatch.delenv("DELTARL_MLFLOW_EXPERIMENT")
    assert not (grid / "mlflow.db").exists()  # the campaign wrote only its own database

    assert tracking.merge_runs(camp, grid, "g", label="g-000") == 2
    assert tracking.merge_runs(camp, grid, "g", label="g-000") == 0  # copied once
    client = mlflow.MlflowClient(f"sqlite:///{grid / 'mlflow.db'}")
    exp = client.get_experiment_by_name("g")
    runs = {r.data.tags["deltarl.phase"]: r for r in client.search_runs([exp.experiment_id])}
    assert sorted(runs) == ["optimality", "safety"]
    s = runs["safety"]
    assert s.info.run_name == "g-000-safety" and s.info.status == "FINISHED"
    assert s.data.params == {"fuzzer": "random", "budget.episodes": "32"}
    history = client.get_metric_history(s.info.run_id, "failures")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(8, 1.0), (16, 2.0), (24, 3.0)]
    original = mlflow.MlflowClient(f"sqlite:///{camp / 'mlflow.db'}").get_run(done["run_id"])
    assert (s.info.start_time, s.info.end_time) == (original.info.start_time, original.info.end_time)
    assert s.data.tags[tracking.SOURCE_TAG] == f"g-000/{done['run_id']}" and tracking.COPYING_TAG not in s.data.tags
    assert s.info.artifact_uri == original.info.artifact_uri  # the artifacts stay in the campaign's folder
    assert [a.path for a in client.list_artifacts(s.info.run_id)] == ["summary.json"]
    assert runs["optimality"].info.status == "RUNNING"

    # a copy cut short (the driver killed between creating the run and tagging it) is replaced whole
    client.delete_run(runs["optimality"].info.run_id)
    partial = client.create_run(exp.experiment_id, tags={tracking.COPYING_TAG: f"g-000/{cut['run_id']}",
                                                         "deltarl.phase": "optimality"})
    assert tracking.merge_runs(camp, grid, "g", label="g-000") == 1
    left = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["deltarl.phase"] for r in left) == ["optimality", "safety"]
    assert partial.info.run_id not in {r.info.run_id for r in left}
    assert all(tracking.COPYING_TAG not in r.data.tags for r in left)
