"""The Ray edge's house rules, without a cluster: no module-level mutable state in
``orchestrator/cluster/``, Ray's and torch's private APIs spelled in their compatibility modules
only, the driver session's scoping, and what the compatibility functions put back."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from orchestrator.cluster.session import DriverSession

REPO = Path(__file__).resolve().parents[1]
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque"}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add",
            "discard", "appendleft"}


def _module_level_state(path: Path) -> list[str]:
    """Module-level containers (``NAME = {...}``, ``[...]``, ``dict()`` ...) that the module
    changes (item assignment or deletion, ``.append``, ``.update``, ``.pop`` ...), and ``global``
    statements. A constant table that nothing changes is not state."""
    tree = ast.parse(path.read_text())
    containers = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None)) in MUTABLE_CALLS):
            containers.update({t.id: node.lineno for t in targets if isinstance(t, ast.Name)})
    changed = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, (ast.Store, ast.Del)) and isinstance(n.value, ast.Name):
            changed.add(n.value.id)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            changed.add(n.target.id)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS \
                and isinstance(n.func.value, ast.Name):
            changed.add(n.func.value.id)
    found = [f"{path.name}:{line}: {name}" for name, line in containers.items() if name in changed]
    found += [f"{path.name}:{n.lineno}: global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    return found


def test_no_module_of_the_ray_edge_holds_mutable_state():
    bad = [hit for p in sorted((REPO / "orchestrator" / "cluster").glob("*.py")) for hit in _module_level_state(p)]
    assert not bad, bad


def test_the_state_check_sees_a_module_level_registry(tmp_path):
    """The three globals the old driver module held are found (and a constant table is not)."""
    planted = tmp_path / "m.py"
    planted.write_text("from collections import OrderedDict\n_DASHBOARD = {'on': False}\n_SUPERVISORS: list = []\n"
                       "_PROGRESS = OrderedDict()\nTABLE = {'start': 20.0}\n"
                       "def f(p):\n    _DASHBOARD['on'] = True\n    _SUPERVISORS.append(p)\n    _PROGRESS.pop('c', None)\n"
                       "    global E\n    E = TABLE['start']\n")
    assert [h.split(": ", 1)[1] for h in _module_level_state(planted)] == ["_DASHBOARD", "_SUPERVISORS", "_PROGRESS",
                                                                          "global E"]


PRIVATE = {
    "ray": (re.compile(r"\bray\._private\b|\bray\._raylet\b|from ray import _"), "orchestrator/cluster/ray_compat.py"),
    "torch": (re.compile(r"\btorch\._[A-Za-z]"), "workers/torch_compat.py"),
}


@pytest.mark.parametrize("framework", sorted(PRIVATE))
def test_private_framework_apis_are_spelled_in_their_compatibility_module_only(framework):
    pattern, home = PRIVATE[framework]
    bad = []
    for pkg in ("envs", "workers", "orchestrator", "benchmarks"):
        for p in sorted((REPO / pkg).rglob("*.py")):
            rel = p.relative_to(REPO).as_posix()
            for i, line in enumerate(p.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if rel != home and pattern.search(code) and not code.strip().startswith(('"', "'", "``")):
                    bad.append(f"{rel}:{i}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)
    assert pattern.search((REPO / home).read_text())  # the check finds the spelling where it lives


def test_a_driver_session_is_found_inside_its_block_only():
    assert DriverSession.current() is None
    outer = DriverSession(dashboard=True)
    with outer as s:
        assert s is outer and DriverSession.current() is outer and outer.dashboard
        outer.progress["c"] = "handle"
        with DriverSession() as inner:
            assert DriverSession.current() is inner and not inner.dashboard
        assert DriverSession.current() is outer
        with outer:  # re-entered: its actors stay until the outermost block ends
            pass
        assert outer.progress == {"c": "handle"}
    assert DriverSession.current() is None
    assert outer.progress == {}  # the session's end lets its progress actors go


def test_the_dashboard_comes_with_a_cluster_when_the_caller_or_its_session_asks():
    from orchestrator.cluster.lifecycle import dashboard_choice

    # (asked by the caller, session's wish) -> (started, printed)
    assert dashboard_choice(None) == (False, False) and dashboard_choice(True) == (True, False)
    with DriverSession(dashboard=True):  # deltarl run
        assert dashboard_choice(None) == (True, True) and dashboard_choice(False) == (False, False)
    with DriverSession(dashboard=False):  # deltarl run --no-dashboard
        assert dashboard_choice(None) == (False, False) and dashboard_choice(True) == (True, False)


def test_single_machine_mode_is_put_back(monkeypatch):
    from ray._private import ray_constants

    from orchestrator.cluster.ray_compat import single_machine_mode

    var = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    flag = ray_constants.ENABLE_RAY_CLUSTER
    for before in (None, "1"):
        if before is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, before)
        with single_machine_mode():
            assert os.environ[var] == "0" and ray_constants.ENABLE_RAY_CLUSTER is False
        assert os.environ.get(var) == before and ray_constants.ENABLE_RAY_CLUSTER == flag


def test_the_node_readers_fall_back_when_ray_moves_its_internals(monkeypatch, caplog):
    """What ``ray_compat`` does with a Ray whose node object is missing or shaped otherwise: no
    supervisor and no dashboard address (logged), never an error; and the PIDs it reads when the
    node looks as in Ray 2.60.0."""
    from types import SimpleNamespace

    from orchestrator.cluster import ray_compat

    monkeypatch.setattr(ray_compat, "_global_node", lambda: None)
    with caplog.at_level("WARNING", logger="orchestrator.cluster.ray_compat"):
        assert ray_compat.node_dashboard_url() is None and ray_compat.local_cluster_pids() == []
    assert "no supervisor" in caplog.text
    monkeypatch.setattr(ray_compat, "_global_node", lambda: SimpleNamespace(all_processes={"gcs": 7}))
    assert ray_compat.local_cluster_pids() == [] and ray_compat.node_dashboard_url() is None
    node = SimpleNamespace(webui_url="127.0.0.1:8266", all_processes={
        "gcs_server": [SimpleNamespace(process=SimpleNamespace(pid=11))],
        "raylet": [SimpleNamespace(process=SimpleNamespace(pid=12)), SimpleNamespace(process=None)]})
    monkeypatch.setattr(ray_compat, "_global_node", lambda: node)
    assert ray_compat.local_cluster_pids() == [11, 12] and ray_compat.node_dashboard_url() == "127.0.0.1:8266"


def test_token_auth_follows_ray_auth_mode(monkeypatch):
    from orchestrator.cluster import ray_compat

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as conftest sets it for the whole session
    assert ray_compat.token_auth_on() is False


def test_a_batch_whose_actor_was_lost_goes_to_the_next_actor_after_a_back_off_then_fails(monkeypatch):
    """``RolloutPool._lost``: a chunk whose actor was lost (a node gone) is resubmitted to the next
    actor after a growing wait, at most ``LOST_ACTOR_TRIES`` times; then the error is raised."""
    from orchestrator.cluster import pool

    waits: list = []
    monkeypatch.setattr(pool.time, "sleep", waits.append)
    p = object.__new__(pool.RolloutPool)
    p.actors = ["a0", "a1", "a2"]
    exc = RuntimeError("actor unavailable")
    assert [p._lost(exc, t, i, "a chunk") for t, i in ((0, 0), (1, 1), (2, 2))] == [1, 2, 0]
    assert waits == [0.5, 1.0, 2.0]
    p._lost(exc, pool.LOST_ACTOR_TRIES - 1, 0, "a chunk")
    assert max(waits) == pool.LOST_ACTOR_MAX_WAIT_S
    with pytest.raises(RuntimeError, match="actor unavailable"):
        p._lost(exc, pool.LOST_ACTOR_TRIES, 0, "a chunk")
    schedule = [min(pool.LOST_ACTOR_MAX_WAIT_S, 0.5 * 2 ** t) for t in range(pool.LOST_ACTOR_TRIES)]
    assert 30 <= sum(schedule) <= 60  # the tries outlast a node's death being noticed (~15-30 s), not much more


def test_a_node_is_kept_from_the_checkout_wherever_it_lies(monkeypatch):
    """The multi-node cluster's mount script hides the checkout where it actually is (CI checks
    out under ``/check/...``, where a fixed ``/work`` left it visible to the head) and binds the
    Python installation back even when it lies inside a hidden folder."""
    from orchestrator.cluster import multinode

    outside = Path("/var/tmp") / f"deltarl-edge-{os.getpid()}"  # outside /tmp, /root and /work
    checkout = outside / "check" / "work" / "main"
    (checkout / ".venv").mkdir(parents=True)
    monkeypatch.setattr(multinode, "CHECKOUT", checkout)
    try:
        hidden = multinode.hidden_paths()
        script = multinode.mount_script(outside / "x", outside / "x" / "shared", [str(checkout / ".venv")])
    finally:
        import shutil

        shutil.rmtree(outside)
    assert str(checkout) in hidden
    assert not any(p != q and Path(p).is_relative_to(q) for p in hidden for q in hidden), hidden
    lines = script.splitlines()
    hide = f"mount -t tmpfs -o mode=0755 tmpfs {checkout}"
    assert hide in lines
    assert lines.index(hide) < lines.index(f"mount --bind /tmp/.keep/0 {checkout / '.venv'}")
