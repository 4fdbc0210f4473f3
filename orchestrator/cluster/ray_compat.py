"""Ray's private APIs that deltarl uses, all in this one module.

Ray offers no public way to do these things; each function names the private attribute it
reads, the Ray version it was checked against (2.60.0, the version ``pyproject.toml`` pins), and
what it does when a Ray release moves or drops that attribute. A Ray upgrade is checked here
first (``tests/test_ray_pool.py`` and ``tests/test_robustness.py`` exercise every function). Only
this module may spell ``ray._private`` or ``ray._raylet``.
"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger(__name__)


@contextlib.contextmanager
def single_machine_mode():
    """While the block runs, Ray starts a cluster in its single-machine mode: it keeps
    ``_node_ip_address="127.0.0.1"`` as given instead of rewriting it to the machine's address
    (and so binds every server to 127.0.0.1). The mode is ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``
    (read by ``ray.init`` in the driver) and the ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` variable
    (read by the processes the cluster starts, which inherit it); both are set to off and put back.

    Checked against Ray 2.60.0. Fallback when ``ray_constants`` lacks either name: only the
    environment variable is set (its name as in 2.60.0), which is what Ray's own processes read."""
    try:
        from ray._private import ray_constants

        env_var = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
        saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    except (ImportError, AttributeError) as exc:
        log.warning("Ray without ray_constants.ENABLE_RAY_CLUSTER (%s): single-machine mode set by its "
                    "environment variable only", exc)
        ray_constants, env_var, saved_flag = None, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None
    saved_env = os.environ.get(env_var)
    if ray_constants is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[env_var] = "0"
    try:
        yield
    finally:
        if ray_constants is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(env_var, None)
        else:
            os.environ[env_var] = saved_env


def _global_node():
    """``ray._private.worker._global_node``: the node this driver started or joined (None before
    ``ray.init``). Checked against Ray 2.60.0; None when the attribute is gone."""
    try:
        from ray._private import worker
    except ImportError as exc:
        log.debug("no ray._private.worker (%s)", exc)
        return None
    return getattr(worker, "_global_node", None)


def local_cluster_pids() -> list[int]:
    """The PIDs of the processes of the local cluster this driver started (GCS, raylet,
    dashboard, log monitor...), from ``_global_node.all_processes`` (a dict of lists of
    ``ProcessInfo`` whose ``process`` is a ``Popen``). Checked against Ray 2.60.0. Fallback: an
    empty list (logged), and the cluster is then ended by Ray's own fate-sharing only."""
    node = _global_node()
    try:
        infos = (node.all_processes or {}).values()
        return [info.process.pid for group in infos for info in group if getattr(info, "process", None) is not None]
    except (AttributeError, TypeError) as exc:
        log.warning("cannot list the local Ray cluster's processes (%s: %s): no supervisor, Ray's own "
                    "fate-sharing only", type(exc).__name__, exc)
        return []


def node_dashboard_url() -> str | None:
    """The dashboard address Ray bound for the node this driver is connected to
    (``_global_node.webui_url``, e.g. ``127.0.0.1:8265``), or None (no dashboard, not connected).
    ``ray.init(...).address_info["webui_url"]`` is the public way, but only for the caller of
    ``ray.init``. Checked against Ray 2.60.0. Fallback: None (the dashboard is reported off)."""
    node = _global_node()
    return getattr(node, "webui_url", None) if node is not None else None


def dashboard_event_logger():
    """A logger whose records the dashboard's Overview page lists as the cluster's Events
    (``ray._private.event.event_logger.get_event_logger(Event.SourceType.COMMON, logs_dir)``,
    the node's logs folder from ``global_worker.node``); call ``.info(message, **custom_fields)``.
    Checked against Ray 2.60.0. Fallback: None (logged) when the names are gone or this process
    is not a connected worker; progress then shows in the metrics and task names only."""
    try:
        from ray._private import worker
        from ray._private.event.event_logger import get_event_logger
        from ray.core.generated.event_pb2 import Event
    except ImportError as exc:
        log.debug("no Ray event logger (%s)", exc)
        return None
    node = getattr(getattr(worker, "global_worker", None), "node", None)
    if node is None:
        log.debug("no Ray event logger: this process is not connected to a Ray node")
        return None
    return get_event_logger(Event.SourceType.COMMON, node.get_logs_dir_path())


def token_auth_on() -> bool:
    """Whether this process runs with Ray's token authentication
    (``ray._raylet.get_authentication_mode() == AuthenticationMode.TOKEN``; Ray >= 2.59 turns it
    on by default for a local cluster with a dashboard). Checked against Ray 2.60.0. Fallback for a
    Ray without these names: ``RAY_AUTH_MODE=token`` in the environment."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError as exc:
        log.debug("a Ray without ray._raylet.get_authentication_mode (%s): RAY_AUTH_MODE decides", exc)
        return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    return get_authentication_mode() == AuthenticationMode.TOKEN


def reload_auth_mode() -> None:
    """Make this process's Ray read ``RAY_AUTH_MODE`` again after deltarl set it: Ray's C++ config
    (``ray._raylet.Config``) reads the variable once, when ``ray`` is imported, and a driver whose
    config still says ``disabled`` cannot talk to the token-auth GCS it starts or joins
    (``InvalidAuthToken``). Ray does the same when it turns token auth on by itself
    (``ray._private.authentication.authentication_token_setup._enable_token_auth``:
    ``Config.initialize("")``). Checked against Ray 2.60.0. Fallback when the name is gone: nothing
    (logged); the variable then only reaches the processes Ray starts, so set ``RAY_AUTH_MODE``
    before running deltarl."""
    import sys

    if "ray" not in sys.modules:  # not imported yet: it reads the variable when it is
        return
    try:
        from ray._raylet import Config
    except ImportError as exc:
        log.warning("cannot reload Ray's auth mode (%s): set RAY_AUTH_MODE before deltarl starts", exc)
        return
    Config.initialize("")


def metrics_export_port() -> int | None:
    """The port where this node's metrics agent exports Ray's and deltarl's metrics in Prometheus
    format (``_global_node.metrics_export_port``; ``curl http://127.0.0.1:PORT/metrics``), or None
    before ``ray.init``. Checked against Ray 2.60.0. Fallback: None."""
    node = _global_node()
    port = getattr(node, "metrics_export_port", None) if node is not None else None
    return int(port) if port else None


# `python -c LOOPBACK_RAY_START start ...`: `ray start` for a node of a cluster whose every node is on
# 127.0.0.1 (several nodes on one machine: orchestrator/cluster/multinode.py). Self-contained (the
# node may not have deltarl). `ray start` turns --node-ip-address=127.0.0.1 into the machine's
# interface address (`services.resolve_ip_for_localhost`) unless Ray runs in its single-machine mode
# (`ray_constants.ENABLE_RAY_CLUSTER` off), which in turn refuses to start a worker node. So: the mode
# stays on for the processes the node starts (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in their
# environment: workers and agents use 127.0.0.1), while this process allows the worker node and keeps
# 127.0.0.1 as given. `services.get_node` is retried for up to 120 s: `ray start` gives its raylet a
# fixed 30 s to register with the GCS, which a loaded 2-core machine exceeded (worker3 added during
# test_multinode's grid, while a local LLM grid ran: "The current node timed out during startup").
# Checked against Ray 2.60.0 (scripts.py `start`, services.py); with a Ray that
# lacks these names the wrapper fails at once with an AttributeError naming the one that moved.
LOOPBACK_RAY_START = """
import os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
from ray._private import ray_constants, services
from ray.scripts import scripts
services.resolve_ip_for_localhost
services.get_node_ip_address
services.resolve_ip_for_localhost = lambda host: host
services.get_node_ip_address = lambda address=None: "127.0.0.1"
ray_constants.ENABLE_RAY_CLUSTER = True
_get_node = services.get_node
def _patient_get_node(*args, **kwargs):  # `ray start` gives a raylet 30 s (fixed) to register
    import time
    t0 = time.monotonic()
    while True:
        try:
            return _get_node(*args, **kwargs)
        except RuntimeError:
            if time.monotonic() - t0 > 120:
                raise
            time.sleep(1.0)
services.get_node = _patient_get_node
sys.argv = ["ray", *sys.argv[1:]]
sys.exit(scripts.main())
"""
