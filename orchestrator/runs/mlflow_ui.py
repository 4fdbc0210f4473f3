"""Where to look in the MLflow UI: the command that serves a run folder's ``mlflow.db`` and the
address of each experiment's charts.

MLflow 3.17's UI opens every experiment in its GenAI view (traces, latency, errors) unless the
address says ``workflowType=machine_learning`` (the UI's "Model training" switch; the
``mlflow.experimentKind`` tag deltarl sets on its experiments is what other MLflow versions
read). ``compareRunsMode=CHART`` opens the runs' charts, where the ``findings/`` section
(failures, bugs and their distinct cells over the episodes or test cases run) comes first.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

DEFAULT_PORT = 5000
VIEW = "workflowType=machine_learning&compareRunsMode=CHART"


def ui_command(db: str | Path, port: int = DEFAULT_PORT) -> str:
    return f"mlflow ui --backend-store-uri sqlite:///{Path(db).resolve()} --port {port}"


def experiment_url(experiment_id: str | int, port: int = DEFAULT_PORT, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs?{VIEW}"


def experiments(db: str | Path) -> list[tuple[str, str]]:
    """``(id, name)`` of the experiments holding runs in an MLflow SQLite database (read without
    importing MLflow); [] when there is none or it cannot be read."""
    path = Path(db)
    if not path.is_file():
        return []
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)
        try:
            rows = con.execute("SELECT e.experiment_id, e.name FROM experiments e WHERE e.lifecycle_stage = 'active' "
                               "AND EXISTS (SELECT 1 FROM runs r WHERE r.experiment_id = e.experiment_id) "
                               "ORDER BY e.experiment_id").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return []
    return [(str(i), str(n)) for i, n in rows]


def ui_lines(db: str | Path, port: int = DEFAULT_PORT, indent: str = "                  ") -> list[str]:
    """The ``mlflow ui`` command, then one address per experiment (its runs' charts). A moved
    folder's artifact locations are pointed at it first (``tracking.relocate_artifacts``)."""
    from orchestrator.runs.tracking import relocate_artifacts

    relocate_artifacts(db)
    out = [ui_command(db, port)]
    out += [f"{indent}{name}: {experiment_url(i, port)}" for i, name in experiments(db)]
    return out
