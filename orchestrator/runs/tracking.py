"""MLflow on the embedded default: SQLite in the run folder, artifacts beside it.

``MLFLOW_TRACKING_URI`` (e.g. a team server) wins when set; otherwise each run folder gets
``mlflow.db`` and ``mlartifacts/`` (open with ``mlflow ui --backend-store-uri sqlite:///RUN/mlflow.db``).
Experiments are created with an explicit artifact location: MLflow's default is relative to the
working directory, which under Ray Jobs is a temporary folder.

Two ways to log:

* :func:`start_run` / :func:`log_metrics` / :func:`log_artifact` / :func:`end_run`: synchronous,
  in this process (AUT training, grids; a Ray Train job gets the ``{"tracking_uri", "run_id"}``).
* :class:`AsyncRun`: the campaign phases. A separate *writer process* imports MLflow, opens the
  database and creates the run while the campaign imports torch and runs its first generations;
  metrics and artifacts are queued (never blocking the campaign) and written in order.
  :meth:`AsyncRun.end` flushes everything and waits for the writer. A writer that fails (MLflow
  broken, database locked, server down) costs the campaign nothing but a warning on stderr: the
  same figures are in the run folder (``summary.json``, ``timeline.parquet``).
  :func:`prestart` starts the writer before the campaign's own imports (``deltarl run`` does).

A new SQLite database starts as a copy of an empty, fully migrated one (:func:`prepare_sqlite`;
made once per MLflow version under ``~/.cache/deltarl``, ``$DELTARL_CACHE``): MLflow's ~60
schema migrations otherwise cost seconds in every new run folder.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)
WRITER_TIMEOUT_S = float(os.environ.get("DELTARL_MLFLOW_TIMEOUT", "600"))  # how long end() waits for the writer


def sqlite_uri(folder: str | os.PathLike) -> str:
    """The tracking URI of ``folder``'s own ``mlflow.db`` (a run folder's, a grid's)."""
    return f"sqlite:///{Path(folder).resolve() / 'mlflow.db'}"


def tracking_uri_for(run_dir: str | os.PathLike) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or sqlite_uri(run_dir)


# -- a migrated empty database, copied into each new run folder -----------------------------------
def cache_dir() -> Path:
    d = os.environ.get("DELTARL_CACHE")
    if d:
        return Path(d)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deltarl"


def prepare_sqlite(uri: str) -> bool:
    """Give a SQLite tracking URI whose file does not exist yet a copy of the empty, migrated
    template database (made on first use). True when it copied; False when there was nothing to
    do or no template could be made (MLflow then creates the database itself, as before)."""
    if not uri.startswith("sqlite:///"):
        return False
    db = Path(uri[len("sqlite:///"):])
    if db.exists():
        relocate_artifacts(db)
        return False
    try:
        import mlflow

        template = cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
        if not template.is_file():
            _make_template(template)
        db.parent.mkdir(parents=True, exist_ok=True)
        tmp = db.with_name(f".{db.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        shutil.copyfile(template, tmp)
        try:
            os.link(tmp, db)  # atomic, and never replaces a database another process made meanwhile
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True
    except Exception as exc:  # noqa: BLE001 - a cache we cannot write is no reason to fail: MLflow migrates itself
        log.debug("no MLflow template database for %s (%s: %s): MLflow creates it", db, type(exc).__name__, exc)
        return False


def relocate_artifacts(db: str | os.PathLike) -> int:
    """Point a moved run folder's MLflow artifacts at the folder where the database is now.

    MLflow stores every artifact location absolute (``file:///OLD/RUN/mlartifacts/…``, the
    experiment's and each run's): in a moved, renamed or copied folder the UI would look in the old
    place, and a resumed phase would write its artifacts there. Each location whose folder
    (``…/mlartifacts``) is not below the database's folder is rewritten to the one below it that
    ends the same way (``RUN/mlartifacts``, a grid's ``GRID/CAMPAIGN/mlartifacts``), or to
    ``RUN/mlartifacts`` when the old one is gone. Read with sqlite3 only (no MLflow import).
    Returns the number of rows rewritten; 0 when there was nothing to do or the file is no
    MLflow database."""
    import re
    import sqlite3
    from urllib.parse import unquote, urlparse

    db = Path(db)
    if not db.is_file():
        return 0
    here = db.parent.resolve()
    try:
        con = sqlite3.connect(str(db), timeout=10)
    except sqlite3.Error as exc:
        log.debug("cannot open %s to relocate its artifacts: %s", db, exc)
        return 0
    try:
        rows = [("experiments", "experiment_id", "artifact_location", *r) for r in
                con.execute("SELECT experiment_id, artifact_location FROM experiments")]
        rows += [("runs", "run_uuid", "artifact_uri", *r) for r in con.execute("SELECT run_uuid, artifact_uri FROM runs")]
        moves: dict[str, str | None] = {}
        changed = []
        for table, key, col, ident, loc in rows:
            m = re.match(r"^(file://[^?#]*?/mlartifacts)(/.*)?$", loc or "")
            if not m:
                continue
            old = m.group(1)
            if old not in moves:
                moves[old] = _artifacts_here(Path(unquote(urlparse(old).path)).parent, here)
            if moves[old] is not None:
                changed.append((table, key, col, ident, moves[old] + (m.group(2) or "")))
        with con:
            for table, key, col, ident, loc in changed:
                con.execute(f"UPDATE {table} SET {col} = ? WHERE {key} = ?", (loc, ident))
        return len(changed)
    except sqlite3.Error as exc:  # no MLflow tables (not an MLflow database), locked: left as it is
        log.debug("cannot relocate the artifacts of %s: %s", db, exc)
        return 0
    finally:
        con.close()


def _artifacts_here(old_root: Path, here: Path) -> str | None:
    """The ``mlartifacts`` folder below ``here`` that stands for ``old_root/mlartifacts`` (None:
    nothing to change)."""
    from orchestrator.runs.layout import MLFLOW_ARTIFACTS

    try:
        old_root.resolve().relative_to(here)
        return None  # already below the database's folder
    except ValueError:
        pass
    parts = old_root.parts[1:]
    for i in range(len(parts) + 1):  # the longest tail that is here: GRID/CAMPAIGN, else the folder itself
        cand = here.joinpath(*parts[i:], MLFLOW_ARTIFACTS)
        if cand.is_dir():
            return cand.as_uri()
    if (old_root / MLFLOW_ARTIFACTS).exists():
        return None  # not this folder's: an artifact store elsewhere that is still there
    return (here / MLFLOW_ARTIFACTS).as_uri()


def _make_template(template: Path) -> None:
    """An empty MLflow database at the head schema revision, without the Default experiment
    (MLflow creates that on first open, with the run folder's artifact root)."""
    import sqlite3

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    template.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=template.parent) as d:
        path = Path(d) / "empty.db"
        store = SqlAlchemyStore(f"sqlite:///{path}", (Path(d) / "artifacts").as_uri())
        store.engine.dispose()
        SqlAlchemyStore._engine_map.pop(f"sqlite:///{path}", None)
        con = sqlite3.connect(path)
        try:
            for table in ("experiment_tags", "experiments"):
                con.execute(f"DELETE FROM {table} WHERE experiment_id = 0")  # noqa: S608 - fixed names
            con.commit()
        finally:
            con.close()
        os.replace(path, template)


# -- synchronous logging ------------------------------------------------------------------------
def start_run(run_dir: str | os.PathLike, experiment: str, run_name: str, *, params: dict | None = None,
              tags: dict | None = None) -> dict:
    """Create (or reuse) ``experiment`` and start a run; returns ``{"tracking_uri", "run_id"}``.

    ``DELTARL_MLFLOW_EXPERIMENT`` (set by grids) puts the run into that experiment instead,
    with ``experiment`` kept as the tag ``deltarl.phase``."""
    uri = tracking_uri_for(run_dir)
    return _start(uri, run_dir, os.environ.get("DELTARL_MLFLOW_EXPERIMENT") or experiment, run_name,
                  params=params, tags={"deltarl.phase": experiment, **(tags or {})})


def _start(uri: str, run_dir, experiment: str, run_name: str, *, params: dict | None, tags: dict) -> dict:
    import mlflow
    from mlflow.entities import Param

    prepare_sqlite(uri)
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp_id = ensure_experiment(run_dir, experiment, uri)
    run = client.create_run(exp_id, run_name=run_name, tags=tags)
    if params:
        flat = [Param(k, str(v)[:6000]) for k, v in _flatten(params).items()]
        for i in range(0, len(flat), 100):  # one transaction per 100 (MLflow's batch limit), not one per param
            client.log_batch(run.info.run_id, params=flat[i:i + 100])
    return {"tracking_uri": uri, "run_id": run.info.run_id, "experiment_id": exp_id}


def ensure_experiment(run_dir: str | os.PathLike, experiment: str, uri: str | None = None) -> str:
    """The id of ``experiment``, created (artifacts beside ``run_dir``'s database) when missing."""
    import mlflow

    uri = uri or tracking_uri_for(run_dir)
    prepare_sqlite(uri)
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        return exp.experiment_id
    from orchestrator.runs.layout import MLFLOW_ARTIFACTS

    artifacts = (Path(run_dir).resolve() / MLFLOW_ARTIFACTS).as_uri() if uri.startswith("sqlite:") else None
    try:
        # MLflow 3 opens an experiment in its GenAI view unless told it holds model-training runs
        return client.create_experiment(experiment, artifact_location=artifacts,
                                        tags={"mlflow.experimentKind": "custom_model_development"})
    except mlflow.exceptions.MlflowException:  # created meanwhile by a concurrent campaign
        return client.get_experiment_by_name(experiment).experiment_id


SOURCE_TAG = "deltarl.source"  # on a run copied into a grid's database: "<campaign folder>/<its run id>"
COPYING_TAG = "deltarl.copying"  # on such a copy until it is complete


def merge_runs(src_dir: str | os.PathLike, dst_dir: str | os.PathLike, experiment: str, label: str) -> int:
    """Copy the runs of one campaign's own ``src_dir/mlflow.db`` into ``experiment`` of the SQLite
    database ``dst_dir/mlflow.db`` (a grid's), skipping those copied before; returns how many it copied.

    A grid's campaigns run on any node and each writes only its own run folder's database; the
    grid's driver, one process, copies each finished campaign's runs here, so no SQLite file ever
    has two writers (SQLite's locks are not reliable on NFS). Copied: the run's name, tags,
    params, every metric's whole history (steps and timestamps), status and start and end times.
    The artifacts stay in the campaign's folder: the copy's artifact location is the original's.
    Each copy carries :data:`SOURCE_TAG` = ``label/<run id>``, set last; until then it carries
    ``deltarl.copying``: a copy cut short (the driver killed meanwhile) is deleted by the next
    merge, which copies that run again in full."""
    import sqlite3

    import mlflow
    from mlflow.entities import Param

    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    dst_db = dst_dir / "mlflow.db"
    if not (src_dir / "mlflow.db").is_file():
        return 0
    src = mlflow.MlflowClient(tracking_uri=sqlite_uri(src_dir))
    dst_uri = sqlite_uri(dst_dir)
    dst = mlflow.MlflowClient(tracking_uri=dst_uri)
    exp_id = ensure_experiment(dst_dir, experiment, dst_uri)
    copied = set()
    for r in dst.search_runs([exp_id], max_results=50000):
        if SOURCE_TAG in r.data.tags:
            copied.add(r.data.tags[SOURCE_TAG])
        elif r.data.tags.get(COPYING_TAG, "").startswith(f"{label}/"):
            dst.delete_run(r.info.run_id)  # cut short by an earlier merge
    runs = src.search_runs([e.experiment_id for e in src.search_experiments()], max_results=50000,
                           order_by=["attributes.start_time ASC"])
    n = 0
    for run in runs:
        source = f"{label}/{run.info.run_id}"
        if source in copied:
            continue
        tags = {**{k: v for k, v in run.data.tags.items() if k != SOURCE_TAG}, COPYING_TAG: source}
        new = dst.create_run(exp_id, start_time=run.info.start_time, tags=tags, run_name=run.info.run_name)
        rid = new.info.run_id
        params = [Param(k, v) for k, v in run.data.params.items()]
        for i in range(0, len(params), 100):  # MLflow's batch limits: 100 params, 1000 metrics
            dst.log_batch(rid, params=params[i:i + 100])
        history = [m for key in sorted(run.data.metrics) for m in src.get_metric_history(run.info.run_id, key)]
        for i in range(0, len(history), 1000):
            dst.log_batch(rid, metrics=history[i:i + 1000])
        con = sqlite3.connect(str(dst_db), timeout=60)  # MLflow has no call that sets a run's artifact location
        try:
            with con:
                con.execute("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?", (run.info.artifact_uri, rid))
        finally:
            con.close()
        if run.info.status != "RUNNING":
            dst.set_terminated(rid, status=run.info.status, end_time=run.info.end_time)
        dst.set_tag(rid, SOURCE_TAG, source)
        dst.delete_tag(rid, COPYING_TAG)
        n += 1
    return n


def end_run(tracking: dict, status: str = "FINISHED") -> None:
    import mlflow

    mlflow.MlflowClient(tracking_uri=tracking["tracking_uri"]).set_terminated(tracking["run_id"], status=status)


def log_artifact(tracking: dict, path: str | os.PathLike, artifact_path: str | None = None) -> None:
    import mlflow

    mlflow.MlflowClient(tracking_uri=tracking["tracking_uri"]).log_artifact(tracking["run_id"], str(path), artifact_path)


def log_metrics(tracking: dict, metrics: dict, step: int = 0, timestamp_ms: int | None = None) -> None:
    import mlflow
    from mlflow.entities import Metric

    ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    batch = [Metric(k, float(v), ts, int(step)) for k, v in _finite(metrics).items()]
    if batch:  # one transaction per call, not one per metric
        mlflow.MlflowClient(tracking_uri=tracking["tracking_uri"]).log_batch(tracking["run_id"], metrics=batch)


def _finite(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# -- asynchronous logging: a writer process -----------------------------------------------------
_SPARE: list[subprocess.Popen] = []  # a prestarted writer, importing MLflow
_SPARE_LOCK = threading.Lock()
_SPARE_AT_EXIT: list = []


def _spawn_writer() -> subprocess.Popen:
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the orchestrator package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.runs.tracking"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, text=True, env=env, bufsize=1)
    proc._deltarl_stderr = err  # type: ignore[attr-defined]
    return proc


def prestart() -> None:
    """Start an MLflow writer now (MLflow's import takes seconds): the next :class:`AsyncRun`
    takes it over. Call it before the campaign's own heavy imports, as ``deltarl run`` does;
    unused, it is stopped at exit. It writes nothing until a run is started."""
    with _SPARE_LOCK:
        if _SPARE and _SPARE[0].poll() is None:
            return
        try:
            _SPARE[:] = [_spawn_writer()]
        except OSError:
            return
        if not _SPARE_AT_EXIT:
            _SPARE_AT_EXIT.append(atexit.register(_stop_spares))


def _take_writer() -> subprocess.Popen:
    with _SPARE_LOCK:
        proc = _SPARE.pop() if _SPARE else None
    if proc is not None and proc.poll() is None:
        return proc
    return _spawn_writer()


def stop_spare() -> None:
    """Stop a prestarted writer nobody will use (a campaign with ``mlflow: false``)."""
    _stop_spares()


def _stop_spares() -> None:
    with _SPARE_LOCK:
        spares = list(_SPARE)
        _SPARE.clear()
    for proc in spares:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class AsyncRun:
    """An MLflow run written by a separate process; the calls queue and return at once.

        run = AsyncRun(run_dir, "safety", "quickstart-curefuzz", params={...}, tags={...})
        run.log_metrics({"failures": 3}, step=64)       # queued
        run.log_artifact(path)                           # queued
        info = run.end()                                 # flushed; {"tracking_uri", "run_id", ...} or None

    ``end`` waits for every queued call to be written (at most ``DELTARL_MLFLOW_TIMEOUT`` s,
    default 600) and returns None, with one warning on stderr, when MLflow failed: the caller's
    work is never lost to MLflow. :meth:`info` waits until the run exists (for code that needs its
    id, e.g. a Ray Train job logging to it)."""

    def __init__(self, run_dir: str | os.PathLike, experiment: str, run_name: str, *, params: dict | None = None,
                 tags: dict | None = None):
        self.tracking_uri = tracking_uri_for(run_dir)
        self.experiment = os.environ.get("DELTARL_MLFLOW_EXPERIMENT") or experiment
        self.result: dict | None = None
        self.error: str | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._started: dict | None = None
        self._ended = False
        try:
            self._proc = _take_writer()
        except OSError as exc:
            self._proc = None
            self.error = f"cannot start the MLflow writer: {exc}"
        self._feeder = threading.Thread(target=self._feed, name="deltarl-mlflow-feeder", daemon=True)
        self._feeder.start()
        self._put({"op": "start", "uri": self.tracking_uri, "run_dir": str(Path(run_dir).resolve()),
                   "experiment": self.experiment,
                   "run_name": run_name, "params": json.loads(json.dumps(params or {}, default=str)),
                   "tags": {k: str(v) for k, v in {"deltarl.phase": experiment, **(tags or {})}.items()}})

    # the campaign's side: never blocks
    def log_metrics(self, metrics: dict, step: int = 0) -> None:
        clean = _finite(metrics)
        if clean:
            self._put({"op": "metrics", "metrics": clean, "step": int(step), "ts": int(time.time() * 1000)})

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self._put({"op": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def _put(self, msg: dict) -> None:
        if not self._ended:
            self._queue.put(msg)

    def _feed(self) -> None:
        while True:
            msg = self._queue.get()
            if msg is None:
                return
            if self._proc is None or self.error:
                continue
            try:
                self._proc.stdin.write(json.dumps(msg) + "\n")
                self._proc.stdin.flush()
            except (OSError, ValueError) as exc:  # the writer died: keep draining, report at end()
                self.error = f"the MLflow writer stopped ({type(exc).__name__})"

    def info(self, timeout: float | None = None) -> dict | None:
        """``{"tracking_uri", "run_id", "experiment_id"}`` once the writer has created the run
        (None when it could not)."""
        if self._started is None and self._proc is not None and not self.error:
            self._put({"op": "announce"})
            line = self._readline(timeout if timeout is not None else WRITER_TIMEOUT_S)
            msg = json.loads(line) if line else {}
            self._started = msg.get("started") or {}
            if not self._started:
                self.error = msg.get("error") or "the MLflow writer did not create the run"
        return self._started or None

    def _readline(self, timeout: float) -> str:
        box: list = []
        t = threading.Thread(target=lambda: box.append(self._proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        return box[0] if box else ""

    def end(self, status: str = "FINISHED", *, timeout: float | None = None) -> dict | None:
        """Flush every queued call, end the run with ``status`` and wait for the writer."""
        if self._ended:
            return self.result
        self._put({"op": "end", "status": status})
        self._ended = True
        self._queue.put(None)
        self._feeder.join()
        timeout = WRITER_TIMEOUT_S if timeout is None else timeout
        if self._proc is not None:
            try:
                out, _ = self._proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                out, _ = self._proc.communicate()
                self.error = self.error or f"the MLflow writer did not finish within {timeout:.0f} s"
            lines = [json.loads(x) for x in (out or "").splitlines() if x.startswith("{")]
            final = next((m for m in reversed(lines) if "done" in m), None)
            if final is None:
                self.error = self.error or f"the MLflow writer exited with code {self._proc.returncode}"
            else:
                self.result = final["done"]
                if final.get("errors"):
                    self.error = self.error or "; ".join(final["errors"])
            if self.error:
                self._warn()
        return None if self.error else self.result

    def _warn(self) -> None:
        tail = ""
        err = getattr(self._proc, "_deltarl_stderr", None) if self._proc is not None else None
        if err is not None:
            err.seek(0)
            lines = [x for x in err.read().decode(errors="replace").splitlines() if x.strip()]
            tail = f" ({lines[-1][:300]})" if lines else ""
        print(f"deltarl: warning: MLflow logging failed: {self.error}{tail}; the results are complete in the run "
              f"folder (summary.json, timeline.parquet)", file=sys.stderr)


def _writer_main() -> int:
    """The writer process: import MLflow (and make the template database) while the campaign
    starts, then apply the queued calls in order; nothing is written to the run folder before
    the run is started. Writes one ``{"done": ...}`` line on stdout at the end (and
    ``{"started": ...}`` when asked to announce the run)."""
    errors: list[str] = []
    run = None
    try:  # the slow part, before the campaign needs it: MLflow's import and the template database
        import mlflow  # noqa: F401
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: F401

        template = cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
        if not template.is_file():
            _make_template(template)
    except Exception as exc:  # noqa: BLE001 - reported at the end; the queued calls are drained
        errors.append(f"{type(exc).__name__}: {exc}")
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        op = msg.get("op")
        try:
            if op == "start" and not errors:
                run = _start(msg["uri"], msg["run_dir"], msg["experiment"], msg["run_name"], params=msg.get("params"),
                             tags=msg.get("tags") or {})
            elif op == "announce":
                print(json.dumps({"started": run} if run else {"error": "; ".join(errors) or "no run"}), flush=True)
            elif run is None:
                continue
            elif op == "metrics":
                log_metrics(run, msg["metrics"], step=msg.get("step", 0), timestamp_ms=msg.get("ts"))
            elif op == "artifact":
                log_artifact(run, msg["path"], msg.get("artifact_path"))
            elif op == "end":
                end_run(run, msg.get("status", "FINISHED"))
                break
        except Exception as exc:  # noqa: BLE001 - keep applying the rest; the caller gets the errors
            errors.append(f"{op}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
    print(json.dumps({"done": run, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":  # python -m orchestrator.runs.tracking  (the writer process)
    code = _writer_main()
    # Everything is written (MLflow commits each call) and the caller has its "done" line: leave
    # without the interpreter's teardown of MLflow and SQLAlchemy, which the campaign waited for in
    # AsyncRun.end (seconds per MLflow run; docs/performance.md, issue #20)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
