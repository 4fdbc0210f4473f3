"""A Ray cluster of several nodes on one Linux machine, each node with its own file system view.

Used by ``tests/test_multinode.py`` and ``benchmarks/multinode_grid.py`` to run deltarl the way a
real cluster (KubeRay pods, several hosts) runs it, on one machine::

    with NodeCluster(Path("/var/tmp/mn"), workers=[{"num_cpus": 1}, {"num_cpus": 1}]) as cluster:
        cluster.shared                     # the "shared volume" every node sees (run folders)
        cluster.dashboard_url              # the head's job API (deltarl submit --address ...)
        cluster.kill_node(1)               # kill -9 every process of worker node 1
        cluster.add_node({"num_cpus": 1})  # a node joins mid-run

Every node (the head too) is ``ray start --block`` in its own mount namespace (``unshare -m``,
root): ``/tmp``, ``/root`` (home), ``/work`` (the checkout and its run folders) and the cluster's
own folder are empty there, except for the Python installation (the venv and the interpreter it
points to, read back in place) and :attr:`shared`. A node therefore cannot read the submitter's
checkout, home or temporary files; the code and the inputs of a job reach it through Ray
(``runtime_env``: :mod:`orchestrator.cluster.jobs`), its outputs go to the shared folder. All
nodes and drivers use 127.0.0.1 (``--node-ip-address``), the head has ``num-cpus 0`` (no work
lands there) and token authentication is on, as in ``k8s/raycluster.yaml``. The processes of a
node are the processes of its mount namespace: :meth:`kill_node` and :meth:`stop` kill exactly
those (``/proc/PID/ns/mnt``), nothing else on the machine.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from workers.resources import CHECKOUT


def hidden_paths() -> list[str]:
    """What a node must not see of the submitter's machine: its temporary files, home, ``/work``
    and the checkout (with its run folders), outermost only (a folder inside another hidden one
    is hidden with it). Computed, not fixed: CI checks out elsewhere than ``/work``, and the
    fixed list of stop 55 let the head see that checkout."""
    found = {"/tmp", str(Path.home()), "/work", str(CHECKOUT)}
    return outermost(str(Path(p).resolve()) for p in found if p and os.path.isdir(p) and Path(p).resolve() != Path("/"))


def outermost(paths) -> list[str]:
    """``paths`` without those inside another of them, sorted."""
    paths = sorted(set(paths))
    return [p for p in paths if not any(p != q and Path(p).is_relative_to(q) for q in paths)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_paths() -> list[str]:
    """The folders a node needs to run this interpreter: the venv (``sys.prefix``) and the base
    installation it points to (``sys.base_prefix``), both read in place."""
    return sorted({str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve())})


def mount_script(root: Path, shared: Path, keep: list[str], hide: list[str] | None = None) -> str:
    """Shell lines that, in a fresh private mount namespace, hide ``hide`` and ``root`` behind
    empty tmpfs mounts and bind ``keep`` and ``shared`` back at their own paths."""
    stage = "/tmp/.keep"
    lines = ["set -e", "mount -t tmpfs -o mode=1777 tmpfs /tmp", f"mkdir -p {stage}"]
    binds = [*keep, str(shared)]
    for i, p in enumerate(binds):
        lines += [f"mkdir -p {stage}/{i}", f"mount --bind {shlex.quote(p)} {stage}/{i}"]
    for h in outermost([*(hidden_paths() if hide is None else hide), str(root)]):
        if h != "/tmp" and os.path.isdir(h):
            lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(h)}")
    for i, p in enumerate(binds):
        lines += [f"mkdir -p {shlex.quote(p)}", f"mount --bind {stage}/{i} {shlex.quote(p)}"]
    return "\n".join(lines)


def mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def pids_in_namespace(ns: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and mount_namespace(int(entry)) == ns:
            out.append(int(entry))
    return out


class Node:
    def __init__(self, name: str, proc: subprocess.Popen, log: Path, resources: dict, metrics_port: int):
        self.name, self.proc, self.log, self.resources = name, proc, log, resources
        self.metrics_port = metrics_port  # Prometheus text at http://127.0.0.1:PORT/metrics
        self.ns: str | None = None
        self.killed = False

    def namespace(self, timeout: float = 30.0) -> str:
        """The node's mount namespace (that of ``ray start``, once ``unshare`` has exec'd it)."""
        host = mount_namespace(os.getpid())
        t0 = time.monotonic()
        while self.ns is None and time.monotonic() - t0 < timeout:
            ns = mount_namespace(self.proc.pid)
            if ns is not None and ns != host:
                self.ns = ns
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        if self.ns is None:
            raise RuntimeError(f"node {self.name} did not enter its namespace within {timeout:.0f} s")
        return self.ns

    def pids(self) -> list[int]:
        return pids_in_namespace(self.ns) if self.ns else []

    def metric(self, name: str, **labels) -> float:
        """The sum of Prometheus metric ``name`` (samples with these ``labels``) the node exports."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def kill(self) -> int:
        """``kill -9`` every process of the node (its namespace's); returns how many."""
        self.killed = True
        n = 0
        for _ in range(5):  # a process may fork while the others die
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    n += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return n


class NodeCluster:
    """A head (``num-cpus 0``, token auth, dashboard and job API on 127.0.0.1) and worker nodes,
    each ``ray start`` in its own mount namespace; see the module's docstring."""

    def __init__(self, root: Path, workers: list[dict], *, object_store_bytes: int = 100 << 20,
                 timeout: float = 180.0):
        if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("unshare"):
            raise RuntimeError("NodeCluster needs Linux, root and unshare (util-linux): each node is a mount namespace")
        self.root = Path(root).resolve()
        self.shared = self.root / "shared"
        self.timeout = timeout
        self.object_store_bytes = int(object_store_bytes)
        self.worker_specs = list(workers)
        self.nodes: list[Node] = []
        self.token = secrets.token_hex(32)
        self.token_path = self.root / "auth_token"
        self.gcs_port = free_port()
        self.dashboard_port = free_port()

    # -- the environment of the nodes and of the submitter ----------------------------------------
    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def client_env(self) -> dict:
        """What a submitter (``deltarl submit``, ``ray.util.state``) needs in its environment."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def _node_env(self) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_", "PYTEST", "DELTARL_")) and k not in ("PYTHONPATH", "TMPDIR")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, RAY_USAGE_STATS_ENABLED="0",
                   HOME="/root", TMPDIR="/tmp", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
        # a node's `python` is the cluster's environment, as an image's is on its PATH
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
        return env

    def _start(self, name: str, args: list[str], resources: dict) -> Node:
        from orchestrator.cluster.ray_compat import LOOPBACK_RAY_START

        ports = {k: free_port() for k in ("node-manager-port", "object-manager-port", "metrics-export-port",
                                          "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                          "runtime-env-agent-port")}
        cmd = [sys.executable, "-c", LOOPBACK_RAY_START, "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
               f"--object-store-memory={self.object_store_bytes}", *args, *[f"--{k}={v}" for k, v in ports.items()]]
        script = mount_script(self.root, self.shared, python_paths()) + "\nexec " + shlex.join(cmd)
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self._node_env(),
                                    start_new_session=True, cwd="/")
        node = Node(name, proc, log, resources, ports["metrics-export-port"])
        self.nodes.append(node)
        node.namespace()
        return node

    def start(self) -> "NodeCluster":
        self.shared.mkdir(parents=True, exist_ok=True)
        os.chmod(self.shared, 0o777)
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        try:
            self._start("head", ["--head", f"--port={self.gcs_port}", "--num-cpus=0", "--include-dashboard=true",
                                 "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                                 f"--ray-client-server-port={free_port()}"], {})
            self._wait_nodes(1)
            for spec in self.worker_specs:
                self.add_node(spec, wait=False)
            self._wait_nodes(1 + len(self.worker_specs))
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, spec: dict, wait: bool = True) -> Node:
        """A worker node: ``{"num_cpus": N, "resources": {...}}``."""
        import json

        name = f"worker{sum(1 for n in self.nodes if n.name.startswith('worker')) + 1}"
        resources = {name: 1.0, **(spec.get("resources") or {})}
        node = self._start(name, [f"--address={self.gcs_address}", f"--num-cpus={spec.get('num_cpus', 1)}",
                                  f"--resources={json.dumps(resources)}"], resources)
        if wait:
            self._wait_nodes(sum(1 for n in self.nodes if not n.killed))
        return node

    def state(self, kind: str, **filters) -> list[dict]:
        """The head's state API (``/api/v0/<kind>``: nodes, actors, tasks, jobs) over HTTP with the
        cluster's token, without importing Ray in this process; ``filters``: equality filters."""
        import json
        import urllib.parse
        import urllib.request

        query = [("limit", "10000"), ("detail", "1")]
        for k, v in filters.items():
            query += [("filter_keys", k), ("filter_predicates", "="), ("filter_values", str(v))]
        req = urllib.request.Request(f"{self.dashboard_url}/api/v0/{kind}?{urllib.parse.urlencode(query)}",
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
        return body["data"]["result"]["result"]

    def node_names(self) -> dict[str, str]:
        """``{node id: "head" or the custom resource naming the worker ("worker1", ...)}`` of every
        node the head knows (dead ones included: a task's record keeps its node's id)."""
        return {n["node_id"]: ("head" if n.get("is_head_node") else next(r for r in n["resources_total"]
                                                                        if r.startswith("worker")))
                for n in self.state("nodes")}

    def job(self, submission_id: str) -> dict:
        """The state API's record of the job submitted as ``submission_id`` (its Ray ``job_id``,
        ``driver_node_id``, ...), or ``{}`` while the head does not know it yet."""
        return next((j for j in self.state("jobs") if j.get("submission_id") == submission_id), {})

    def alive_nodes(self) -> list[dict]:
        return [n for n in self.state("nodes") if n.get("state") == "ALIVE"]

    def _wait_nodes(self, n: int) -> None:
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < self.timeout:
            for node in self.nodes:
                if node.proc.poll() is not None and not node.killed:
                    raise RuntimeError(f"node {node.name} exited ({node.proc.returncode}): "
                                       f"{node.log.read_text()[-3000:]}")
            try:
                if len(self.alive_nodes()) >= n:
                    return
            except Exception as exc:  # noqa: BLE001 - the head's API is not up yet: try again
                last = exc
            time.sleep(1.0)
        raise RuntimeError(f"{n} nodes did not join within {self.timeout:.0f} s (last error: {last!r})")

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def kill_node(self, name: str) -> int:
        """``kill -9`` every process of node ``name`` (raylet, object store, agents, workers)."""
        return self.node(name).kill()

    def pids(self) -> list[int]:
        return [p for n in self.nodes for p in n.pids()]

    def stop(self) -> None:
        """Kill every node's processes (workers first, the head last) and check none is left."""
        for node in reversed(self.nodes):
            node.kill()
        left = self.pids()
        if left:
            raise RuntimeError(f"processes of the cluster outlived it: {left}")

    def __enter__(self) -> "NodeCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
