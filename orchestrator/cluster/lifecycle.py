"""Join a running Ray cluster, or start the embedded one.

``start_ray()`` joins a running cluster when there is one (``RAY_ADDRESS``, a head of ``deltarl
ray up`` or of ``ray start --head``; found by :func:`running_cluster` without importing Ray) and
otherwise starts the embedded default (``ray.init(address="local")``: a real single-node cluster,
listening on 127.0.0.1 only, ended by a supervisor when its driver dies; dashboard off unless
asked or the caller's :class:`~orchestrator.cluster.session.DriverSession` wants it).

Nothing found in Ray's temporary folder (``/tmp/ray``, writable by every user) is taken on trust:
a head is joined only when its file belongs to this user, carries the marker ``deltarl ray up``
writes and names a process that is still the one that wrote it (its command line and start
time: :func:`process_identity`); a head file of another user, a foreign file or one naming a
reused PID is ignored and the campaign starts its own cluster.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from pathlib import Path

from orchestrator.cluster import ray_compat
from orchestrator.cluster.session import DriverSession

HEAD_FILE = "deltarl-head.json"  # written by `deltarl ray up` beside Ray's own address file
HEAD_MARKER = "deltarl ray up"  # the head file's "written_by": a file without it is not deltarl's

log = logging.getLogger(__name__)


def ray_temp_dir() -> Path:
    """Ray's temporary folder (``/tmp/ray``, or under ``$RAY_TMPDIR``/``$TMPDIR``), as Ray finds it."""
    base = os.environ.get("RAY_TMPDIR") or (os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None)
    return Path(base or "/tmp") / "ray"


def _answers(address: str, timeout: float = 0.3) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def process_identity(pid: int) -> dict | None:
    """``{"cmdline", "started", "uid"}`` of the live process ``pid`` (its command line, its start
    time, its real user id), or None when there is none. A PID is reused once its process ends;
    the pair (command line, start time) is not. Linux: from ``/proc`` (the start time in clock
    ticks since boot); elsewhere from ``ps``."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return None
    if pid <= 0:
        return None
    if os.path.isdir("/proc/self"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
            status = Path(f"/proc/{pid}/status").read_text(errors="replace")
            started = int(stat[stat.rfind(")") + 2:].split()[19])  # field 22: starttime
            uid = int(status.split("\nUid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            return None
        if cmdline and cmdline[-1] == b"":
            cmdline = cmdline[:-1]
        return {"cmdline": [a.decode(errors="replace") for a in cmdline], "started": started, "uid": uid}
    import subprocess

    try:
        out = subprocess.run(["ps", "-o", "uid=", "-o", "lstart=", "-o", "command=", "-p", str(pid)],
                             capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) < 7:
        return None
    return {"cmdline": out[6:], "started": " ".join(out[1:6]), "uid": int(out[0])}


def same_process(pid, recorded) -> bool:
    """Whether ``pid`` is still the process ``recorded`` (a :func:`process_identity`) describes."""
    now = process_identity(pid) if isinstance(recorded, dict) else None
    return (now is not None and now["cmdline"] == recorded.get("cmdline") and now["started"] == recorded.get("started")
            and now["uid"] == recorded.get("uid"))


def head_record(address: str, **fields) -> dict:
    """What ``deltarl ray up`` writes in :data:`HEAD_FILE` about the head this process serves:
    the address, the marker, this user's id and this process's identity (``ray down`` signals
    only that process, a campaign joins only that head), plus ``fields``."""
    return {"address": address, "written_by": HEAD_MARKER, "uid": os.geteuid(), "pid": os.getpid(),
            "process": process_identity(os.getpid()), **fields}


def trusted_head(path: Path) -> tuple[dict | None, str]:
    """``(head, "")`` when ``path`` is a head file this user's ``deltarl ray up`` wrote and its
    process is still that head; else ``(None, why not)``."""
    try:
        st = path.stat()
    except OSError:
        return None, "no head file"
    if st.st_uid != os.geteuid():
        return None, f"{path} belongs to another user (uid {st.st_uid}), not to you (uid {os.geteuid()})"
    try:
        head = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"{path} is not a head file ({type(exc).__name__})"
    if not isinstance(head, dict) or head.get("written_by") != HEAD_MARKER or head.get("uid") != os.geteuid():
        return None, f"{path} was not written by your `deltarl ray up`"
    if not same_process(head.get("pid"), head.get("process")):
        return None, (f"{path} names PID {head.get('pid')}, which is no longer the head `deltarl ray up` started "
                      f"(that process ended; the PID is free or another program's)")
    return head, ""


def running_cluster() -> dict | None:
    """The Ray cluster this process would join instead of starting one, or None:

    1. ``RAY_ADDRESS`` (a Ray Job's driver, or set by hand);
    2. a head started by this user's ``deltarl ray up`` (:func:`trusted_head`: its file in Ray's
       temp folder is this user's, carries deltarl's marker and names the live head process);
    3. a head started by ``ray start --head`` (Ray's ``ray_current_cluster`` file, this user's).

    A head counts only while its port answers (a crashed head leaves its file behind). Returns
    ``{"address", "source"}`` (plus ``num_cpus``, ``auth``, ``dashboard_url`` when known). Ray
    itself is not imported."""
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return {"address": env, "source": "RAY_ADDRESS"}
    temp = ray_temp_dir()
    head, why = trusted_head(temp / HEAD_FILE)
    if head is None and why != "no head file":
        log.debug("not joining the head of %s: %s", temp / HEAD_FILE, why)
    if head is not None and isinstance(head.get("address"), str) and _answers(head["address"]):
        return {"address": head["address"], "source": HEAD_MARKER, "num_cpus": head.get("num_cpus"),
                "auth": head.get("auth", "disabled"), "dashboard_url": head.get("dashboard_url"),
                "token_path": head.get("token_path")}
    path = temp / "ray_current_cluster"
    try:
        if path.stat().st_uid != os.geteuid():  # another user's `ray start --head`
            return None
        address = path.read_text().strip()
    except OSError:
        return None
    if address and _answers(address):
        return {"address": address, "source": "ray start --head"}
    return None


def token_path() -> Path | None:
    """The file Ray reads its authentication token from (``$RAY_AUTH_TOKEN_PATH``, else
    ``~/.ray/auth_token``), or None when the token comes in ``$RAY_AUTH_TOKEN`` itself."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()


def ensure_private_token() -> Path | None:
    """Before a cluster with token authentication starts: its token file, readable by this user
    only. Ray writes a missing one with the process's umask (0644: any user of the machine could
    read the token); it is created here first with mode 0600 (a 256-bit random token, as Ray's
    own), and an existing one of this user that others can read is narrowed to 0600. None when
    the token comes in ``$RAY_AUTH_TOKEN``."""
    path = token_path()
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        st = path.stat()
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.chmod(path, 0o600)
            log.info("%s was readable by other users: narrowed to 0600", path)
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def start_ray(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool | None = None,
              namespace: str | None = None, object_store_bytes: int | None = 1 << 30) -> dict:
    """Initialise Ray once per process; returns the cluster resources.

    Joins ``address``, else a running cluster (:func:`running_cluster`: ``RAY_ADDRESS``, ``deltarl
    ray up``, ``ray start --head``), so that a series of campaigns pays the cluster's start-up
    once; else starts the embedded default (``ray.init(address="local")``: a real single-node
    cluster), listening on 127.0.0.1 only (:func:`loopback_only`) and ended by a supervisor when
    this driver dies (:func:`supervise_local_cluster`). ``dashboard=None``: as the current
    :class:`DriverSession` says (off outside one); a session that wants the dashboard also gets
    its address printed on stderr."""
    import ray

    if ray.is_initialized():
        return ray.cluster_resources()
    found = None if address else running_cluster()
    address = address or (found or {}).get("address")
    if address:
        if found and found["source"] == HEAD_MARKER:
            join_auth(found)
        # a head on 127.0.0.1 is joined in Ray's single-machine mode: otherwise Ray rewrites the
        # loopback address to the machine's own and retries a GCS that never answers there
        loopback = address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
        with loopback_only() if loopback else contextlib.nullcontext(), keep_sigterm_handler():
            ray.init(address=address, namespace=namespace, logging_level="WARNING", job_config=job_config())
        if found and found.get("dashboard_url") and dashboard_choice(dashboard)[1]:
            from orchestrator.cluster.dashboard import dashboard_text

            print(dashboard_text(joined=True, url=found["dashboard_url"]), file=sys.stderr)  # the head's dashboard, and how to log in
        return ray.cluster_resources()
    dashboard, announce = dashboard_choice(dashboard)
    local_auth(dashboard)
    with loopback_only(), keep_sigterm_handler():
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=dashboard,
                 dashboard_host="127.0.0.1", namespace=namespace, logging_level="WARNING",
                 object_store_memory=object_store_bytes, _node_ip_address="127.0.0.1", job_config=job_config())
    supervise_local_cluster()
    if announce:
        from orchestrator.cluster.dashboard import dashboard_text

        print(dashboard_text(), file=sys.stderr)
    return ray.cluster_resources()


def local_auth(dashboard: bool) -> str:
    """The auth mode of a local cluster this process starts, set explicitly in ``RAY_AUTH_MODE``
    unless the user set it (Ray >= 2.59 turns token auth on for a local cluster and says so in a
    WARNING line when the variable is unset): ``disabled`` without the dashboard (a loopback-only
    cluster needs no token), ``token`` with it; with token auth the token file is made private
    first (:func:`ensure_private_token`)."""
    mode = os.environ.setdefault("RAY_AUTH_MODE", "token" if dashboard else "disabled").lower()
    if mode == "token":
        ensure_private_token()
    ray_compat.reload_auth_mode()
    return mode


def join_auth(head: dict) -> None:
    """Join a ``deltarl ray up`` head the way it was started: its auth mode (token when it has the
    dashboard, whatever this process's environment says, since nothing else connects) and, for
    token auth, the token file it used when that was not the default."""
    mode = str(head.get("auth") or "disabled")
    os.environ["RAY_AUTH_MODE"] = mode
    if mode == "token" and head.get("token_path") and not os.environ.get("RAY_AUTH_TOKEN") \
            and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(head["token_path"])
    ray_compat.reload_auth_mode()


def job_config():
    """The Ray job this driver makes: named ``deltarl <campaign>`` (the ``job_name`` metadata the
    dashboard's Jobs page shows as Name) when the current :class:`DriverSession` names its
    campaign; else Ray's default (None)."""
    session = DriverSession.current()
    if session is None or not session.name:
        return None
    from ray.job_config import JobConfig

    return JobConfig(metadata={"job_name": f"deltarl {session.name}"})


def dashboard_choice(dashboard: bool | None) -> tuple[bool, bool]:
    """``(start the dashboard, print where it is)`` for a local cluster this process starts:
    ``dashboard`` as given, else as the current :class:`DriverSession` says (off outside one).
    Its address is printed when it starts and a session wants it (``deltarl run``), not when a
    caller asked for it alone (``deltarl rollout --dashboard``)."""
    session = DriverSession.current()
    wanted = session is not None and session.dashboard
    on = wanted if dashboard is None else bool(dashboard)
    return on, on and wanted


@contextlib.contextmanager
def keep_sigterm_handler():
    """``ray.init`` sets its own SIGTERM handler in the driver (``sys.exit``); a handler the caller
    had set (``deltarl``'s: SIGTERM as Ctrl-C, so a campaign stops the clean way and says how to
    continue) is put back. Without one Ray's stays."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(previous) and signal.getsignal(signal.SIGTERM) is not previous:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def loopback_only():
    """Start a local cluster whose every server (GCS, raylet, object manager, agents, workers)
    listens on 127.0.0.1 only, whatever the auth mode. Ray binds its servers to all interfaces
    unless the node's IP is exactly 127.0.0.1, and turns ``_node_ip_address="127.0.0.1"`` into
    the machine's address unless it runs in its single-machine mode
    (:func:`~orchestrator.cluster.ray_compat.single_machine_mode`, the default on macOS and
    Windows), which is on while the cluster starts and inherited by the cluster's processes."""
    with ray_compat.single_machine_mode():
        yield


def ray_node_id() -> str | None:
    """The id of the Ray node this process runs on when it is a Ray worker (a task or an actor,
    e.g. a grid's campaign), else None: a driver (``deltarl run``, a test) runs where its user
    started it, and nothing is started or imported here."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return context.get_node_id() if context.get_task_id() is not None else None


def ray_node_alive(node_id: str) -> bool | None:
    """Whether the cluster this process belongs to still counts node ``node_id`` as alive; None
    when it cannot tell (not in a Ray cluster, or no such node in its table)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return bool(node.get("Alive"))
    return None


def supervise_local_cluster() -> None:
    """No orphan Ray processes: a supervisor (:mod:`orchestrator.cluster.watchdog`) ends the
    processes of the cluster this driver started, and their children, as soon as the driver is
    gone, however it died (Ray's own agents outlive a killed driver by up to a minute)."""
    from orchestrator.cluster import watchdog

    watchdog.supervise(ray_compat.local_cluster_pids())
