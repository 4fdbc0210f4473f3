"""The house rules, read from the code's own imports (every import, at module top or inside a
function): layers point down (between the top-level packages and between orchestrator's
sub-packages), Ray stays at the edge, no import cycle between modules, and no file spells a run
folder's file names except the layout that owns them."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "workers", "orchestrator")
RAY_ALLOWED = ("orchestrator/cluster/", "orchestrator/campaign/train_jobs.py")
# orchestrator's sub-packages, top to bottom: a package imports only from packages of a lower rank
# (never a sibling of its own rank): cli -> campaign -> cluster | analysis -> fuzzers | runs
ORCHESTRATOR_RANK = {"cli": 4, "campaign": 3, "cluster": 2, "analysis": 2, "fuzzers": 1, "runs": 1}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (REPO / pkg).rglob("*.py"):
            rel = p.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _imports(path: Path) -> set[str]:
    """Every module name imported by ``path`` (absolute imports; ``from a import b`` gives a.b
    when a.b is a module, else a)."""
    names = set()
    tree = ast.parse(path.read_text())
    typing_only = set()  # imports under `if TYPE_CHECKING:` never run
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    """The import graph of the repository at ``REPO`` (parsed once per repository per session)."""
    return {k: set(v) for k, v in _graph_of(REPO).items()}


@functools.lru_cache(maxsize=4)
def _graph_of(repo: Path) -> dict[str, frozenset[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for imp in _imports(path):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != name and not name.startswith(imp + "."):  # a package's own __init__ is not a dep
                deps.add(imp)
        graph[name] = frozenset(deps)
    return graph


def test_envs_and_workers_import_nothing_from_orchestrator():
    graph = _graph()
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.split(".")[0] in ("envs", "workers")
                 for d in deps if d.startswith("orchestrator"))
    assert not bad, bad
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.startswith("envs") for d in deps
                 if d.startswith("workers"))
    assert not bad, bad


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "orchestrator" and len(parts) > 2 else None


def test_orchestrator_subpackages_import_downwards():
    graph = _graph()
    seen = {p for m in graph if (p := _subpackage(m))}
    assert seen <= set(ORCHESTRATOR_RANK), f"a new orchestrator sub-package needs a rank: {seen - set(ORCHESTRATOR_RANK)}"
    bad = []
    for m, deps in graph.items():
        a = _subpackage(m)
        for d in deps:
            b = _subpackage(d)
            if a and b and a != b and ORCHESTRATOR_RANK[b] >= ORCHESTRATOR_RANK[a]:
                bad.append(f"{m} -> {d}")
    assert not bad, "orchestrator sub-packages import upwards or sideways (cli -> campaign -> cluster | analysis -> " \
                    "fuzzers | runs): " + ", ".join(sorted(bad))


def test_ray_is_imported_only_at_the_edge():
    bad = []
    for path in _modules().values():
        rel = path.relative_to(REPO).as_posix()
        if any(rel.startswith(a) for a in RAY_ALLOWED):
            continue
        if any(i == "ray" or i.startswith("ray.") for i in _imports(path)):
            bad.append(rel)
    assert not bad, f"Ray imported outside orchestrator/cluster/ and train_jobs: {bad}"


def test_no_import_cycle():
    graph = _graph()
    # an import inside a package's own __init__ re-exporting its children is not a cycle
    for name in graph:
        graph[name] = {d for d in graph[name] if not d.startswith(name + ".")}
    color, cycles = {}, []

    def visit(n, stack):
        color[n] = 1
        stack.append(n)
        for d in graph.get(n, ()):
            if color.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif not color.get(d):
                visit(d, stack)
        stack.pop()
        color[n] = 2

    for n in sorted(graph):
        if not color.get(n):
            visit(n, [])
    assert not cycles, " | ".join(" -> ".join(c) for c in cycles[:5])


def test_only_the_layout_spells_run_folder_file_names():
    names = re.compile(r'"(campaign\.json|summary\.json|optimality_summary\.json|results\.json|bugs\.parquet|'
                       r'failures\.parquet|flaky_failures\.parquet|flaky_bugs\.parquet|timeline\.parquet|optimality_timeline\.parquet)"')
    bad = []
    for path in _modules().values():
        rel = path.relative_to(REPO).as_posix()
        if rel == "orchestrator/runs/layout.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if names.search(line) and not line.lstrip().startswith("#"):
                bad.append(f"{rel}:{i}: {line.strip()[:90]}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_cycle_and_a_wrong_way_import(tmp_path, monkeypatch):
    """The checks above can fail: a planted cycle and an upward import are found."""
    pkg = tmp_path / "workers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from workers import b\nimport orchestrator.x\n")
    (pkg / "b.py").write_text("import workers.a\n")
    orch = tmp_path / "orchestrator"
    orch.mkdir()
    (orch / "__init__.py").write_text("")
    (orch / "x.py").write_text("import ray\n")
    for sub, text in (("runs", "from orchestrator.analysis import y\n"), ("analysis", "")):
        (orch / sub).mkdir()
        (orch / sub / "__init__.py").write_text("")
        (orch / sub / "y.py").write_text(text)
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    graph = _graph()
    assert "orchestrator.x" in graph["workers.a"] and "workers.a" in graph["workers.b"]
    try:
        test_no_import_cycle()
    except AssertionError as exc:
        assert "workers.a" in str(exc)
    else:
        raise AssertionError("the planted cycle was not found")
    try:
        test_orchestrator_subpackages_import_downwards()
    except AssertionError as exc:
        assert "orchestrator.runs.y -> orchestrator.analysis.y" in str(exc)
    else:
        raise AssertionError("the planted upward import runs -> analysis was not found")
    try:
        test_ray_is_imported_only_at_the_edge()
    except AssertionError as exc:
        assert "orchestrator/x.py" in str(exc)
    else:
        raise AssertionError("the planted Ray import was not found")
