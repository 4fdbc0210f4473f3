"""The Ray edge: start (or join) a cluster and keep a pool of rollout actors busy.

Everything below this module runs without Ray. ``start_ray()`` joins a running cluster when
there is one (``RAY_ADDRESS``, a head of ``deltarl ray up`` or of ``ray start --head``; found by
:func:`running_cluster` without importing Ray) and otherwise starts the embedded default
(``ray.init(address="local")``: a real single-node cluster, dashboard off unless asked).
``deltarl ray up`` (:func:`head_up`) keeps one local head running for a series of campaigns, so
that they pay the cluster's start-up once; ``deltarl ray down`` stops that head only. ``RolloutPool`` spreads chunks of initial
states over ``RolloutWorker`` actors with several chunks in flight per actor (``ray.wait``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from orchestrator.fuzzers.corpus import Corpus
from workers.rollout import RolloutResult, RolloutWorker

# -- a running cluster, found without importing Ray ------------------------------------------------
HEAD_FILE = "deltarl-head.json"  # written by `deltarl ray up` beside Ray's own address file
_DASHBOARD = {"on": False}  # `deltarl run` turns it on: the dashboard comes with a cluster it starts


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


def running_cluster() -> dict | None:
    """The Ray cluster this process would join instead of starting one, or None:

    1. ``RAY_ADDRESS`` (a Ray Job's driver, or set by hand);
    2. a head started by ``deltarl ray up`` (its file in Ray's temp folder, its process alive);
    3. a head started by ``ray start --head`` (Ray's ``ray_current_cluster`` file).

    A head counts only while its port answers (a crashed head leaves its file behind). Returns
    ``{"address", "source"}`` (plus ``num_cpus`` when known). Ray itself is not imported."""
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return {"address": env, "source": "RAY_ADDRESS"}
    temp = ray_temp_dir()
    try:
        head = json.loads((temp / HEAD_FILE).read_text())
        os.kill(int(head["pid"]), 0)
        if _answers(head["address"]):
            return {"address": head["address"], "source": "deltarl ray up", "num_cpus": head.get("num_cpus"),
                    "auth": head.get("auth", "disabled")}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        address = (temp / "ray_current_cluster").read_text().strip()
    except OSError:
        return None
    if address and _answers(address):
        return {"address": address, "source": "ray start --head"}
    return None


def use_dashboard(on: bool = True) -> None:
    """Start the dashboard with the next cluster this process starts (``deltarl run`` does)."""
    _DASHBOARD["on"] = bool(on)


def start_ray(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool | None = None,
              namespace: str | None = None, object_store_bytes: int | None = 1 << 30) -> dict:
    """Initialise Ray once per process; returns the cluster resources.

    Joins ``address``, else a running cluster (:func:`running_cluster`: ``RAY_ADDRESS``, ``deltarl
    ray up``, ``ray start --head``), so that a series of campaigns pays the cluster's start-up
    once; else starts the embedded default (``ray.init(address="local")``: a real single-node
    cluster, dashboard off unless asked), listening on 127.0.0.1 only (:func:`loopback_only`) and
    ended by a supervisor when this driver dies (:func:`supervise_local_cluster`)."""
    import ray

    if not ray.is_initialized():
        found = None if address else running_cluster()
        address = address or (found or {}).get("address")
        if address:
            if found and found.get("auth") == "disabled":  # a loopback head of `deltarl ray up`
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            # a head on 127.0.0.1 is joined in Ray's single-machine mode: otherwise Ray rewrites the
            # loopback address to the machine's own and retries a GCS that never answers there
            loopback = address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
            with loopback_only() if loopback else contextlib.nullcontext(), keep_sigterm_handler():
                ray.init(address=address, namespace=namespace, logging_level="WARNING")
        else:
            dashboard = _DASHBOARD["on"] if dashboard is None else dashboard
            if not dashboard:
                # a loopback-only cluster without the dashboard needs no token (Ray >= 2.59
                # turns token auth on by default for local clusters)
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            with loopback_only(), keep_sigterm_handler():
                ray.init(
                    address="local",
                    num_cpus=num_cpus or os.cpu_count(),
                    include_dashboard=dashboard,
                    dashboard_host="127.0.0.1",
                    namespace=namespace,
                    logging_level="WARNING",
                    object_store_memory=object_store_bytes,
                    _node_ip_address="127.0.0.1",
                )
            supervise_local_cluster()
            if dashboard and _DASHBOARD["on"]:
                print(dashboard_text(), file=sys.stderr)
    return ray.cluster_resources()


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
    the machine's address unless it runs in its single-machine mode (Ray's
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the default on macOS and Windows): both are set
    while the cluster starts, and the variable is inherited by the cluster's processes."""
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER, os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved[0]
        if saved[1] is None:
            os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
        else:
            os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = saved[1]


_SUPERVISORS: list = []  # this driver's cluster supervisors (their pipes close when it exits)


def supervise_local_cluster() -> None:
    """No orphan Ray processes: a supervisor (:mod:`orchestrator.cluster.watchdog`) ends the
    processes of the cluster this driver started, and their children, as soon as the driver is
    gone, however it died (Ray's own agents outlive a killed driver by up to a minute)."""
    from orchestrator.cluster import watchdog

    try:
        import ray

        node = ray._private.worker._global_node
        roots = [info.process.pid for infos in (node.all_processes or {}).values() for info in infos
                 if getattr(info, "process", None) is not None]
    except Exception:  # noqa: BLE001 - a Ray without these internals: its own fate-sharing only
        return
    proc = watchdog.supervise(roots)
    if proc is not None:
        _SUPERVISORS.append(proc)


# -- `deltarl ray up | down`: one local head for a series of campaigns ----------------------------
def serve_head(num_cpus: int | None = None, dashboard: bool = False) -> None:
    """The body of ``deltarl ray up``'s background process: start a local head, publish its
    address in :data:`HEAD_FILE`, and hold it until SIGTERM (``deltarl ray down``)."""
    import signal

    import ray

    if not dashboard:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with loopback_only():  # a head without a token must not be reachable from the network
        info = ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=dashboard,
                        dashboard_host="127.0.0.1", logging_level="WARNING", object_store_memory=1 << 30,
                        _node_ip_address="127.0.0.1")
    supervise_local_cluster()
    head = {"address": info.address_info["gcs_address"], "pid": os.getpid(),
            "num_cpus": int(ray.cluster_resources().get("CPU", 0)), "dashboard": bool(dashboard),
            "auth": os.environ.get("RAY_AUTH_MODE", "token"), "started": time.time()}
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
            pass
        ray.shutdown()


def head_up(num_cpus: int | None = None, dashboard: bool = False, timeout: float = 180.0) -> dict:
    """Start the ``deltarl ray up`` head in a background process (or return the running one)."""
    found = running_cluster()
    if found and found["source"] == "deltarl ray up":
        return {**found, "already": True}
    log = ray_temp_dir() / "deltarl-head.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    code = (f"from orchestrator.cluster.driver import serve_head; "
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


def head_down(timeout: float = 60.0) -> bool:
    """Stop the ``deltarl ray up`` head (only that one: other Ray clusters are left alone).
    False when none was running."""
    path = ray_temp_dir() / HEAD_FILE
    try:
        pid = int(json.loads(path.read_text())["pid"])
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, KeyError):
        path.unlink(missing_ok=True)
        return False
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return True


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


# -- the dashboard: where Ray bound it and how to get in ------------------------------------------
def dashboard_info() -> dict | None:
    """The dashboard of the cluster this process is connected to: ``{"url", "auth", "login"}``,
    or None when Ray is not initialised or runs without a dashboard.

    ``url`` is the address Ray bound (8265 when free, the next free port otherwise: a second
    local cluster's dashboard is not the first one's). ``auth`` is ``token`` when Ray's token
    authentication is on (Ray >= 2.59 turns it on for a local cluster with a dashboard unless
    ``RAY_AUTH_MODE=disabled``): the dashboard then asks for the token, which ``login`` says how
    to print."""
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    from ray._private import worker

    url = os.environ.get("RAY_OVERRIDE_DASHBOARD_URL")
    if not url:
        node = getattr(worker, "_global_node", None)
        url = getattr(node, "webui_url", None) if node is not None else None
    if not url:
        return None
    if "://" not in url:
        url = "http://" + url
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode

        token = get_authentication_mode() == AuthenticationMode.TOKEN
    except Exception:  # noqa: BLE001 - a Ray without token authentication
        token = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    if not token:
        return {"url": url, "auth": "disabled", "login": None}
    if os.environ.get("RAY_AUTH_TOKEN"):
        login = "paste the token in $RAY_AUTH_TOKEN (`ray get-auth-token` prints it in this environment)"
    elif os.environ.get("RAY_AUTH_TOKEN_PATH"):
        login = f"paste the token that `RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']} ray get-auth-token` prints"
    else:
        login = "paste the token that `ray get-auth-token` prints (it is in ~/.ray/auth_token)"
    return {"url": url, "auth": "token", "login": login}


def dashboard_text() -> str:
    """What ``deltarl run`` prints about the dashboard (the address Ray bound, how to log in)."""
    info = dashboard_info()
    if info is None:
        return "Ray dashboard: off"
    lines = [f"Ray dashboard: {info['url']}  (Actors: this campaign's rollout actors and its progress; Jobs; "
             f"Logs; Metrics need Prometheus, docs/deployment.md)"]
    if info["login"]:
        lines.append(f"  it asks for a token: {info['login']}")
    lines.append("  it closes with the campaign; --keep-dashboard keeps it up afterwards")
    return "\n".join(lines)


def rollout_actor_class(num_gpus: float = 0.0, num_cpus: float = 1.0, max_restarts: int = 3,
                        max_task_retries: int = 3, worker_cls=None):
    """The Ray actor wrapping :class:`~workers.rollout.RolloutWorker`.

    A dead actor is restarted (``max_restarts``) and the batches it had in flight are run again
    on the new one (``max_task_retries``). A batch is a pure function of its states and seeds,
    and the driver writes a generation only once all its batches are back, so a crash neither
    loses nor duplicates episodes. In an async campaign each unit's result is applied once,
    when its task returns (a rerun task returns once too). ``worker_cls``: a
    ``RolloutWorker`` subclass (benchmarks inject delays with one)."""
    import ray

    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts,
                      max_task_retries=max_task_retries)(worker_cls or RolloutWorker)



def corpus_actor_class(holder=None):
    """``holder`` (default :class:`~orchestrator.fuzzers.corpus.Corpus`; ``FuzzerHost``: a whole
    fuzzer, ``corpus: actor``) as a Ray actor, no CPU reserved. Ray does not restart it: a
    restarted one would hold a fresh corpus; its driver-side handle restores it from the last
    snapshot instead (``orchestrator.cluster.corpus_actor.RemoteFuzzer``)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(holder or Corpus)



def _named(actor_cls, name: str | None):
    """``actor_cls`` with ``name`` (a free one: ``name~2``, ``~3``, ... when another actor of this
    job holds it); unnamed when ``name`` is None."""
    if not name:
        return actor_cls
    import ray

    candidate, i = name, 1
    while True:
        try:
            ray.get_actor(candidate)
        except ValueError:
            return actor_cls.options(name=candidate)
        i += 1
        candidate = f"{name}~{i}"


class RolloutPool:
    """``workers`` rollout actors, each holding the scenario and the loaded policies."""

    def __init__(self, scenario: str, policy_uris: dict[str, str], *, workers: int = 2, batch_size: int = 256,
                 scenario_overrides: dict | None = None, in_flight: int = 2, device: str | None = None,
                 name: str | None = None, worker_cls=None, num_cpus: float = 1.0, alone: bool = False):
        """``name`` (e.g. ``"quickstart/safety"``) names the actors ``<name>/rollout-<i>``, as the
        dashboard lists them; ``alone``: every policy call of the actors sees one observation."""
        import ray

        if workers < 1:
            raise ValueError(f"a rollout pool needs at least one worker, got {workers}")
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        # GPUs present: share them between the rollout actors for batched inference
        num_gpus = min(0.25, gpus / workers) if gpus > 0 else 0.0
        actor_cls = rollout_actor_class(num_gpus=num_gpus, num_cpus=num_cpus, worker_cls=worker_cls)
        self.batch_size = int(batch_size)
        self.in_flight = max(1, int(in_flight))
        self.name = name
        self.actors = [
            _named(actor_cls, f"{name}/rollout-{i}" if name else None).remote(
                scenario, policy_uris, scenario_overrides=scenario_overrides, device=device, batch_size=batch_size,
                alone=alone)
            for i in range(workers)
        ]
        ray.get([a.ping.remote() for a in self.actors])  # surface load errors now, not mid-run
        self.policy_hashes = ray.get(self.actors[0].policy_hashes.remote())
        self._pending: dict = {}  # steady state: ref -> (key, actor index)
        self._load = [0] * len(self.actors)  # units in flight per actor

    # -- steady state (async campaigns): submit units, take them back as they finish ------------
    def submit(self, key, states: np.ndarray, *, roles: list[str] | None = None, repeats: int = 1, seed: int = 0,
               max_steps: int | None = None) -> None:
        """Run ``states`` as one task under ``key`` on the actor with the fewest units in flight."""
        i = min(range(len(self.actors)), key=lambda j: self._load[j])
        ref = self.actors[i].run.remote(np.asarray(states, dtype=np.float64), roles=roles, repeats=repeats, seed=seed,
                                        max_steps=max_steps, state_offset=0)
        self._pending[ref] = (key, i)
        self._load[i] += 1

    @property
    def units_in_flight(self) -> int:
        return len(self._pending)

    def next_result(self, key=None) -> tuple:
        """``(key, result)``: the first submitted unit to finish, or the one under ``key``. A unit
        whose actor died is rerun by Ray on the restarted actor (``max_task_retries``) and comes
        back once."""
        import ray

        if not self._pending:
            raise ValueError("no work in flight")
        if key is None:
            done, _ = ray.wait(list(self._pending), num_returns=1)
            ref = done[0]
        else:
            ref = next(r for r, (k, _) in self._pending.items() if k == key)
        result = ray.get(ref)
        k, i = self._pending.pop(ref)
        self._load[i] -= 1
        return k, result

    def map(self, states: np.ndarray, *, roles: list[str] | None = None, repeats: int = 1, seed: int = 0,
            max_steps: int | None = None, chunk: int | None = None) -> Iterator[tuple[int, RolloutResult]]:
        """Yield ``(offset, result)`` for chunks of ``states`` as they complete.

        ``offset`` is the index of the chunk's first state; episodes keep global state indices
        and seeds, so the union of the chunks equals one in-process ``rollout`` call.
        """
        import ray

        states = np.asarray(states, dtype=np.float64)
        chunk = int(chunk or max(1, self.batch_size // max(1, repeats)))
        todo = [(lo, states[lo:lo + chunk]) for lo in range(0, states.shape[0], chunk)]
        todo.reverse()
        pending: dict = {}

        def submit(actor):
            lo, part = todo.pop()
            ref = actor.run.remote(part, roles=roles, repeats=repeats, seed=seed, max_steps=max_steps,
                                   state_offset=lo)
            pending[ref] = (actor, lo)

        for _ in range(self.in_flight):
            for actor in self.actors:
                if todo:
                    submit(actor)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                actor, lo = pending.pop(ref)
                result = ray.get(ref)
                if todo:
                    submit(actor)
                yield lo, result

    def call(self, method: str, *args) -> list:
        """``method(*args)`` on every actor (e.g. a benchmark worker's counters), in actor order."""
        import ray

        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []
        self._pending, self._load = {}, []


class CampaignProgress:
    """A campaign's progress as a named actor (``deltarl/<campaign>/progress``, no CPU): the
    dashboard's Actors page lists the campaign by name, and every update is an actor task named
    after the progress (``safety: 384/600 episodes, 12 failures``), which the job's task list and
    the actor's page show. ``state()`` returns the latest update per phase."""

    def __init__(self, campaign: str):
        self.campaign = campaign
        self.phases: dict = {}

    def report(self, phase: str, **state) -> bool:
        self.phases[phase] = state
        return True

    def state(self) -> dict:
        return {"campaign": self.campaign, "phases": self.phases}

    def __repr__(self) -> str:
        return f"deltarl campaign {self.campaign}"


_PROGRESS: dict = {}  # campaign -> its progress actor: held for the driver's life (and --keep-dashboard)


def progress_actor(campaign: str):
    """The campaign's :class:`CampaignProgress` actor (created once per driver, reused by its
    phases, alive until the driver exits so that the dashboard shows the final state)."""
    import ray

    if campaign not in _PROGRESS:
        cls = ray.remote(num_cpus=0)(CampaignProgress)
        _PROGRESS[campaign] = cls.options(name=f"deltarl/{campaign}/progress", get_if_exists=True).remote(campaign)
    return _PROGRESS[campaign]


def release_progress(campaign: str) -> bool:
    """End the campaign's progress actor, if this process made one. A grid's worker runs one
    campaign after another and would otherwise keep one idle actor process per finished campaign
    (measured in a 45-campaign grid: ~140 MB each, 2.2 GB after 16 campaigns); the campaign's
    final state is in its run folder and the grid's results table. True when one was ended."""
    actor = _PROGRESS.pop(campaign, None)
    if actor is None:
        return False
    try:
        import ray

        ray.kill(actor)
    except Exception:  # noqa: BLE001 - an aid, never a reason to fail a campaign
        return False
    return True


class CampaignMetrics:
    """Campaign progress where the Ray dashboard shows it, a no-op when Ray is not running
    (in-process campaigns):

    * custom metrics (``ray.util.metrics``), tagged with the campaign and the phase, exported in
      Prometheus format as ``ray_deltarl_episodes_total`` (counter), ``ray_deltarl_failures`` and
      ``ray_deltarl_bugs`` (gauges) — Ray prefixes ``ray_`` and a counter gets ``_total``; the
      dashboard's Metrics page draws them once Prometheus and Grafana run (docs/deployment.md);
    * the named :class:`CampaignProgress` actor, one named task per update."""

    def __init__(self, campaign: str, phase: str):
        self.tags = {"campaign": campaign, "phase": phase}
        self.on = False
        self.progress = None
        if "ray" not in sys.modules:  # in-process campaigns never import Ray for this
            return
        try:
            import ray
            from ray.util.metrics import Counter, Gauge

            if ray.is_initialized():
                keys = ("campaign", "phase")
                self.episodes = Counter("deltarl_episodes", description="episodes run", tag_keys=keys)
                self.failures = Gauge("deltarl_failures", description="safety failures so far", tag_keys=keys)
                self.bugs = Gauge("deltarl_bugs", description="optimality bugs so far", tag_keys=keys)
                self.on = True
                self.progress = progress_actor(campaign)
        except Exception:  # noqa: BLE001 - metrics are an aid, never a reason to stop a campaign
            self.on = False

    def update(self, episodes: int = 0, failures: int | None = None, bugs: int | None = None,
               progress: str | None = None) -> None:
        """``progress``: e.g. ``"384/600 episodes"`` (the task name the dashboard shows)."""
        if not self.on:
            return
        if self.progress is not None and progress:
            found = "".join(f", {v} {k}" for k, v in (("failures", failures), ("bugs", bugs)) if v is not None)
            try:
                self.progress.report.options(name=f"{self.tags['phase']}: {progress}{found}"[:200]).remote(
                    self.tags["phase"], progress=progress, failures=failures, bugs=bugs)
            except Exception:  # noqa: BLE001 - an aid, never a reason to stop a campaign
                self.progress = None
        if episodes:
            self.episodes.inc(episodes, tags=self.tags)
        if failures is not None:
            self.failures.set(failures, tags=self.tags)
        if bugs is not None:
            self.bugs.set(bugs, tags=self.tags)
