"""The benchmarks' grids (experiments/benchmarks/*.yaml) cover what their tables report, and the
cheapest benchmark runs end to end and prints its table."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks import challenger_table, grid_runs, llmtester_local, optimality_comparison, safety_comparison
from orchestrator.campaign.grid import expand, load_grid

ROOT = Path(__file__).resolve().parents[1]


def one_method(module):
    return lambda c: [(module.method(c), c.seed)]


# grid file -> (the (method, seed) cells a campaign contributes to the benchmark's table,
#               the methods the benchmark reports, the seeds of each profile)
SPECS = {
    "safety_comparison": (one_method(safety_comparison), safety_comparison.FUZZERS,
                          {"local": [0, 1, 2], "results": [0, 1, 2], "smoke": [0]}),
    "optimality_comparison": (one_method(optimality_comparison), optimality_comparison.CONFIGS,
                              {"local": [0, 1, 2, 3, 4], "smoke": [0]}),
    "llmtester_local": (one_method(llmtester_local), llmtester_local.METHODS,
                        {"local": [0, 1], "results": [0, 1, 2, 3, 4], "smoke": [0]}),
    # one campaign per dataset D (seed) trains every algorithm on it
    "challenger_table": (lambda c: [(a, c.seed) for a in c.challenger.algos], list(challenger_table.ALGOS),
                         {"local": [0, 1, 2], "smoke": [0]}),
}


@pytest.fixture(autouse=True)
def llm_endpoint(monkeypatch):
    # the LLMTester grid leaves the endpoint to the benchmark (or the environment): expand() checks it
    monkeypatch.setenv("DELTARL_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("DELTARL_LLM_MODEL", "any")


def test_every_benchmark_grid_is_specified_here():
    files = sorted(p.stem for p in grid_runs.GRIDS.glob("*.yaml"))
    assert files == sorted(SPECS)
    for name, (_, _, seeds) in SPECS.items():
        profiles = yaml.safe_load(grid_runs.grid_file(name).read_text())["profiles"]
        assert sorted(profiles) == sorted(seeds), name


@pytest.mark.slow
@pytest.mark.parametrize("name,profile", [(n, p) for n, spec in SPECS.items() for p in spec[2]])
def test_grid_covers_exactly_the_methods_x_seeds_of_the_table(name, profile):
    cells, methods, seeds = SPECS[name]
    points = expand(load_grid(grid_runs.grid_file(name), profile=profile))
    got = sorted(cell for _, c in points for cell in cells(c))
    assert got == sorted(itertools.product(methods, seeds[profile]))  # each exactly once
    assert len({c.output for _, c in points}) == len(points)


def test_command_line_overrides_reach_every_campaign(tmp_path):
    grid = grid_runs.load("safety_comparison", "smoke", out=str(tmp_path), axes={"seed": [3, 4], "safety.fuzzer": None},
                          settings={"safety.budget": {"episodes": 10}, "aut": None})
    points = expand(grid)
    assert sorted((c.safety.fuzzer, c.seed) for _, c in points) == sorted(
        itertools.product(safety_comparison.FUZZERS, [3, 4]))
    assert {c.safety.budget.episodes for _, c in points} == {10}
    assert {c.aut for _, c in points} == {"zoo:CartPole-v1"}
    assert Path(grid["output"]).parent == tmp_path and Path(grid["output"]).name.startswith("smoke-")
    # other settings, another folder: a rerun never resumes campaigns of different settings
    assert grid_runs.load("safety_comparison", "smoke", out=str(tmp_path))["output"] != grid["output"]


def test_optimality_with_a_given_challenger_runs_optimality_only(tmp_path):
    args = optimality_comparison.parse(["--challenger", "random:0", "--configs", "delta w/o regret,gmt",
                                        "--seeds", "2", "--budget", "32", "--runs", str(tmp_path)])
    points = expand(optimality_comparison.load(args))
    assert sorted((optimality_comparison.method(c), c.seed) for _, c in points) == sorted(
        itertools.product(["delta w/o regret", "gmt"], [0, 1]))
    assert all(c.safety is None and c.challenger is None and c.optimality.challenger == "random:0"
               and c.optimality.budget.episodes == 32 for _, c in points)


def test_llmtester_parameters_override_only_the_llmtester_methods():
    args = llmtester_local.parse(["--alpha", "7", "--methods", "mdpfuzz", "llmtester w/o ms"])
    axis = llmtester_local.method_axis(args)
    assert [llmtester_local.label(m["safety.fuzzer"], m.get("safety.params")) for m in axis] == [
        "mdpfuzz", "llmtester w/o ms"]
    assert "safety.params" not in axis[0]
    assert axis[1]["safety.params"] == {"alpha": 7.0, "beta": 0.5, "delta": 0.1, "multi_scale": False}


@pytest.mark.subprocess
def test_fuzzer_overhead_smoke_prints_its_table():
    fuzzers = ["random", "mdpfuzz", "curefuzz", "gmt"]
    out = subprocess.run([sys.executable, "benchmarks/fuzzer_overhead.py", "--scenarios", "CartPole-v1",
                          "--generations", "2", "--n", "8", "--fuzzers", *fuzzers],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("|")]
    assert lines[0] == ("| scenario | AUT | fuzzer | episodes | rollout ms/episode | fuzzer ms/episode | "
                        "overhead / rollout |")
    assert lines[1] == "|---|---|---|---:|---:|---:|---:|"
    rows = [[cell.strip() for cell in ln.strip("|").split("|")] for ln in lines[2:]]
    assert [r[:4] for r in rows] == [["CartPole-v1", "zoo:CartPole-v1", f, "16"] for f in fuzzers]
    for r in rows:
        roll, fuzz, ratio = map(float, r[4:])
        assert roll > 0 and fuzz >= 0 and ratio == pytest.approx(fuzz / roll, abs=0.01)
        assert re.fullmatch(r"\d+\.\d\d", r[6])


@pytest.mark.slow  # ~6 s: the curves of 105 campaigns, twice
def test_coverage_curves_bin_states_and_recompute_the_committed_table(tmp_path):
    """benchmarks/coverage_curves.py: a state's cell on the grid of the initial-state box (a
    zero-width dimension ignored, the top edge in the last bin), and the committed table is what
    the script prints from the committed report data (a changed bin count changes it)."""
    import numpy as np

    from benchmarks import coverage_curves

    low, high = np.array([-1.0, 0.0, 0.0]), np.array([1.0, 0.0, 1.0])
    got = coverage_curves.cells(np.array([[-1.0, 0.0, 0.0], [1.0, 0.0, 1.0], [0.1, 0.0, 0.49]]), low, high, 4)
    assert got.tolist() == [0, 15, 2 * 4 + 1]
    src = ROOT / "experiments/results/delta-paper-cases-rq2-rq3"
    committed = (ROOT / "experiments/results/delta-paper-cases-coverage/README.md").read_text()
    sections = coverage_curves.table(*coverage_curves.curves(src, [20])).strip().split("\n\n### ")
    assert len(sections) == 3 and all(sec.strip("# ") in committed for sec in sections)  # one per scenario
    other = coverage_curves.table(*coverage_curves.curves(src, [19])).strip().split("\n\n### ")
    assert not any(sec.strip("# ") in committed for sec in other)


def test_challenger_clusters_count_each_methods_clusters_on_one_dendrogram(monkeypatch):
    """benchmarks/challenger_clusters.py clusters the pooled bugs once and counts, per method, the
    clusters its bugs reach: two far-apart behaviours, one found by both methods, one by b alone."""
    import numpy as np

    from benchmarks import challenger_clusters
    from orchestrator.analysis import behaviour

    t = np.linspace(0, 1, 30)[:, None]
    up, down = np.hstack([t, t]), np.hstack([-t, -t]) * 5
    seqs = {"a": [up, up + 0.01], "b": [up + 0.02, down, down + 0.01]}
    monkeypatch.setattr(behaviour, "bug_trajectories", lambda d, max_sequences=None: (seqs[str(d)], [], 0))
    per_tau, owner = challenger_clusters.clusters_by_method([("a", 0, "a"), ("b", 0, "b")], (0.3,))
    total, by = per_tau[0.3]
    assert owner == ["a", "a", "b", "b", "b"] and total == 2
    assert len(by["a"]) == 1 and len(by["b"]) == 2 and by["a"] < by["b"]
