"""``deltarl ray up | down``: one local Ray head for a series of campaigns.

``deltarl ray up`` (:func:`head_up`) keeps one local head running in a background process, so
that a series of campaigns pays the cluster's start-up once (each joins it:
:func:`~orchestrator.cluster.lifecycle.running_cluster`); ``deltarl ray down`` (:func:`head_down`)
stops that head only: it signals the PID of the head file only while that PID is still the head
process ``ray up`` recorded (command line and start time), never a process that reused the PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.cluster.lifecycle import (
    HEAD_FILE,
    HEAD_MARKER,
    head_record,
    local_auth,
    loopback_only,
    ray_temp_dir,
    running_cluster,
    same_process,
    supervise_local_cluster,
    token_path,
    trusted_head,
)


def serve_head(num_cpus: int | None = None, dashboard: bool = False) -> None:
    """The body of ``deltarl ray up``'s background process: start a local head, publish its
    address in :data:`~orchestrator.cluster.lifecycle.HEAD_FILE`, and hold it until SIGTERM
    (``deltarl ray down``)."""
    import ray

    auth = local_auth(dashboard)  # token with the dashboard (its token file private), else disabled
    with loopback_only():  # a head without a token must not be reachable from the network
        info = ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=dashboard,
                        dashboard_host="127.0.0.1", logging_level="WARNING", object_store_memory=1 << 30,
                        _node_ip_address="127.0.0.1")
    supervise_local_cluster()
    url = info.address_info.get("webui_url") if dashboard else None
    tokens = token_path() if auth == "token" else None
    head = head_record(info.address_info["gcs_address"], num_cpus=int(ray.cluster_resources().get("CPU", 0)),
                       dashboard=bool(dashboard), auth=auth, started=time.time(),
                       dashboard_url=("http://" + url if url and "://" not in url else url),
                       token_path=str(tokens) if tokens and os.environ.get("RAY_AUTH_TOKEN_PATH") else None)
    path = ray_temp_dir() / HEAD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(head))
    os.replace(tmp, path)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    try:
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass  # already gone, or a file another head rewrote: not ours to remove
        ray.shutdown()


def head_up(num_cpus: int | None = None, dashboard: bool = False, timeout: float = 180.0) -> dict:
    """Start the ``deltarl ray up`` head in a background process (or return the running one)."""
    found = running_cluster()
    if found and found["source"] == "deltarl ray up":
        return {**found, "already": True}
    log = ray_temp_dir() / "deltarl-head.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    code = (f"from orchestrator.cluster.head import serve_head; "
            f"serve_head(num_cpus={num_cpus!r}, dashboard={bool(dashboard)!r})")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_package_root(), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=env, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = running_cluster()
        if found and found["source"] == "deltarl ray up":
            return {**found, "pid": proc.pid, "already": False}
        if proc.poll() is not None:
            raise RuntimeError(f"the Ray head did not start (exit {proc.returncode}); see {log}")
        time.sleep(0.25)
    proc.terminate()
    raise RuntimeError(f"the Ray head did not start within {timeout:.0f} s; see {log}")


def head_down(timeout: float = 60.0) -> tuple[bool, str]:
    """Stop the ``deltarl ray up`` head (only that one: other Ray clusters are left alone).
    Returns ``(stopped, what happened)``. The PID in the head file is signalled only while it is
    still the head process ``ray up`` recorded (:func:`~orchestrator.cluster.lifecycle.trusted_head`):
    a stale file naming a reused PID (an unrelated process now) leaves that process alone, and is
    removed when it is this user's deltarl file; another user's or a foreign file is left as it is."""
    path = ray_temp_dir() / HEAD_FILE
    if not path.exists():
        return False, "no Ray head of `deltarl ray up` is running"
    head, why = trusted_head(path)
    if head is None:
        ours = False
        try:
            ours = path.stat().st_uid == os.geteuid() and json.loads(path.read_text()).get("written_by") == HEAD_MARKER
        except (OSError, ValueError, AttributeError):
            pass  # unreadable or not a mapping: not ours to remove
        if ours:
            path.unlink(missing_ok=True)
        return False, (f"no Ray head of `deltarl ray up` is running: {why}; signalled nothing"
                       + ("; removed the stale head file" if ours else "; left the file alone"))
    pid, identity = int(head["pid"]), head["process"]
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        path.unlink(missing_ok=True)
        return False, "no Ray head of `deltarl ray up` is running (it ended just now)"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not same_process(pid, identity):
            return True, "Ray head stopped"
        time.sleep(0.2)
    if same_process(pid, identity):  # still the head, not a process that took over its PID
        os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return True, f"Ray head stopped (killed: it did not end within {timeout:.0f} s of SIGTERM)"


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])
