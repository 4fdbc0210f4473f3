"""MLflow on the embedded default: SQLite in the run folder, artifacts beside it.

``MLFLOW_TRACKING_URI`` (e.g. a team server) wins when set; otherwise each run folder gets
``mlflow.db`` and ``mlartifacts/`` (open with ``mlflow ui --backend-store-uri sqlite:///RUN/mlflow.db``).
Experiments are created with an explicit artifact location: MLflow's default is relative to the
working directory, which under Ray Jobs is a temporary folder.
"""

from __future__ import annotations

import os
from pathlib import Path


def tracking_uri_for(run_dir: str | os.PathLike) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def start_run(run_dir: str | os.PathLike, experiment: str, run_name: str, *, params: dict | None = None,
              tags: dict | None = None) -> dict:
    """Create (or reuse) ``experiment`` and start a run; returns ``{"tracking_uri", "run_id"}``.

    ``DELTARL_MLFLOW_EXPERIMENT`` (set by grids) puts the run into that experiment instead,
    with ``experiment`` kept as the tag ``deltarl.phase``."""
    import mlflow

    uri = tracking_uri_for(run_dir)
    client = mlflow.MlflowClient(tracking_uri=uri)
    tags = {"deltarl.phase": experiment, **(tags or {})}
    experiment = os.environ.get("DELTARL_MLFLOW_EXPERIMENT") or experiment
    exp_id = ensure_experiment(run_dir, experiment, uri)
    run = client.create_run(exp_id, run_name=run_name, tags=tags)
    if params:
        flat = {k: str(v)[:6000] for k, v in _flatten(params).items()}
        for k, v in flat.items():
            client.log_param(run.info.run_id, k, v)
    return {"tracking_uri": uri, "run_id": run.info.run_id, "experiment_id": exp_id}


def ensure_experiment(run_dir: str | os.PathLike, experiment: str, uri: str | None = None) -> str:
    """The id of ``experiment``, created (artifacts beside ``run_dir``'s database) when missing."""
    import mlflow

    uri = uri or tracking_uri_for(run_dir)
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        return exp.experiment_id
    artifacts = (Path(run_dir).resolve() / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
    try:
        return client.create_experiment(experiment, artifact_location=artifacts)
    except mlflow.exceptions.MlflowException:  # created meanwhile by a concurrent campaign
        return client.get_experiment_by_name(experiment).experiment_id


def end_run(tracking: dict, status: str = "FINISHED") -> None:
    import mlflow

    mlflow.MlflowClient(tracking_uri=tracking["tracking_uri"]).set_terminated(tracking["run_id"], status=status)


def log_artifact(tracking: dict, path: str | os.PathLike, artifact_path: str | None = None) -> None:
    import mlflow

    mlflow.MlflowClient(tracking_uri=tracking["tracking_uri"]).log_artifact(tracking["run_id"], str(path), artifact_path)


def log_metrics(tracking: dict, metrics: dict, step: int = 0) -> None:
    import math
    import time

    import mlflow
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    batch = [Metric(k, float(v), ts, int(step)) for k, v in metrics.items()
             if isinstance(v, (int, float)) and math.isfinite(float(v))]
    if batch:  # one transaction per call, not one per metric
        mlflow.MlflowClient(tracking_uri=tracking["tracking_uri"]).log_batch(tracking["run_id"], metrics=batch)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out
