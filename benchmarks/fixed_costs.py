"""Fixed costs as a user meets them, before and after (issue #20): ``deltarl --help``, a 10-episode
in-process campaign, and the quick start's time outside its three phases' own work.

    python benchmarks/fixed_costs.py                      # after (this tree) and before (26b17db)
    python benchmarks/fixed_costs.py --skip-quickstart    # the two short measurements only
    python benchmarks/fixed_costs.py --before-ref none    # this tree only

Every measurement is a whole process (``python -c 'from orchestrator.cli import main; main()'``,
i.e. what the ``deltarl`` script runs), timed from outside: interpreter start-up, imports, Ray,
MLflow and the work itself. "Before" is the same commands against ``--before-ref`` (default
26b17db, main before the refactor and before this work; several refs give several columns)
checked out with ``git worktree add`` into a temporary folder and run with this tree's Python
(``PYTHONPATH`` pointing at the worktree); the worktrees are removed at the end. The trees take
turns for every measurement (round robin), so that a changing load falls on all of them alike. Both sides write their runs to temporary folders.

"The quick start's time outside its phases" is the process's wall time minus what its phases
report as their own work: the safety phase's and the optimality phase's ``wall_seconds`` (their
generation loops) and the challenger's ``training_wall_seconds``. The quick start runs as
shipped by each tree (before: ``workers: 2``; after: ``workers: auto``) with its default
dashboard setting.

After: MLflow's template database (``~/.cache/deltarl``, made once per MLflow version) is warm
unless ``--cold-cache`` (then the first run of each command pays MLflow's migrations, as before).
The machine's load average is printed with the table: on a shared machine the timings move with
it; compare the columns of one run. CPU seconds (user + sys of the command and the children it
waited for, e.g. the MLflow writer; not Ray's daemons) move less with the load than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = "import sys; from orchestrator.cli import main; sys.exit(main())"

TEN = """name: ten
scenario: CartPole-v1
aut: zoo:CartPole-v1
seed: 0
workers: 0
output: {out}
safety:
  fuzzer: mdpfuzz
  budget: {{episodes: 10}}
  generation_size: 64
"""


CPU: list[float] = []  # CPU seconds (user + sys) of the last command, its waited-for children included


def deltarl(tree: Path, args: list[str], env: dict, timeout: float = 3600) -> tuple[float, subprocess.CompletedProcess]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CLI, *args], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=timeout)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU[:] = [r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime]
    if p.returncode != 0 and "--help" not in args:
        raise RuntimeError(f"deltarl {' '.join(args)} in {tree} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return wall, p


def quickstart_file(tree: Path, tmp: Path, scale: float) -> Path:
    """The tree's quick start, its budgets multiplied by ``scale`` (1: as shipped)."""
    path = tree / "experiments" / "quickstart.yaml"
    if scale == 1:
        return path
    import yaml

    q = yaml.safe_load(path.read_text())
    q["safety"]["budget"]["episodes"] = int(q["safety"]["budget"]["episodes"] * scale)
    q["optimality"]["budget"]["episodes"] = int(q["optimality"]["budget"]["episodes"] * scale)
    q["challenger"]["steps"] = int(10_000 * scale)  # the classic-control preset's 10,000 gradient steps
    out = tmp / "quickstart.yaml"
    out.write_text(yaml.safe_dump(q, sort_keys=False))
    return out


def measure(trees: dict[str, Path], tmp: Path, *, repeats: int, quickstart: bool, caches: dict,
            scale: float = 1.0) -> dict:
    """Every measurement for every tree, the trees taking turns (round robin), so that a load that
    changes during the benchmark falls on all of them alike."""
    envs, out = {}, {}
    for name, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": str(tree)}
        env.pop("MLFLOW_TRACKING_URI", None)
        if caches.get(name) is not None:
            env["DELTARL_CACHE"] = str(caches[name])
        envs[name] = env
        out[name] = {"help_runs": [], "ten_runs": [], "ten_cpus": []}
        (tmp / name).mkdir(parents=True, exist_ok=True)
        deltarl(tree, ["--help"], env)  # warm the file cache (every tree gets the same treatment)
    for i in range(repeats):
        for name, tree in trees.items():
            out[name]["help_runs"].append(deltarl(tree, ["--help"], envs[name])[0])
        for name, tree in trees.items():
            run = tmp / name / f"ten-{i}"
            camp = tmp / name / f"ten-{i}.yaml"
            camp.write_text(TEN.format(out=run))
            out[name]["ten_runs"].append(deltarl(tree, ["run", str(camp), "--quiet"], envs[name])[0])
            out[name]["ten_cpus"].append(CPU[0])
    for name in trees:
        r = out[name]
        r.update(help=statistics.median(r["help_runs"]), ten=statistics.median(r["ten_runs"]),
                 ten_cpu=statistics.median(r["ten_cpus"]))
    if quickstart:
        for name, tree in trees.items():
            run = tmp / name / "quickstart"
            try:
                wall, _ = deltarl(tree, ["run", str(quickstart_file(tree, tmp / name, scale)), "--out", str(run),
                                         "--quiet"], envs[name])
            except RuntimeError as exc:  # reported as n/a; the other trees' rows still come
                print(f"{name}: the quick start failed: {str(exc)[:500]}", file=sys.stderr)
                continue
            print(f"{name}: quick start {wall:.1f} s", file=sys.stderr)
            res = json.loads((run / "results.json").read_text())
            phases = {"safety": res["safety"]["wall_seconds"],
                      "challenger": sum(c["training_wall_seconds"] for c in res["challengers"]),
                      "optimality": res["optimality"]["wall_seconds"]}
            out[name]["quickstart_cpu"] = CPU[0]
            out[name]["quickstart"] = {
                "wall": wall, "phases": phases, "outside": wall - sum(phases.values()),
                "summary": {"failures": res["safety"]["failures"], "bugs": res["optimality"]["bugs"],
                            "distinct_bugs": res["optimality"]["distinct_bugs"],
                            "executor": res["safety"].get("executor", "ray x2 (workers: 2)")}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before-ref", default="26b17db",
                    help="git commit(s) for the before column(s), comma-separated ('none': skip)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of --help and of the 10-episode campaign (median)")
    ap.add_argument("--skip-quickstart", action="store_true", help="skip the quick start (minutes per side)")
    ap.add_argument("--cold-cache", action="store_true", help="after: start with an empty MLflow template cache")
    ap.add_argument("--quickstart-scale", type=float, default=1.0,
                    help="multiply the quick start's budgets (episodes, challenger steps) by this (default 1: as "
                         "shipped); the fixed costs do not depend on them")
    args = ap.parse_args(argv)
    refs = [] if args.before_ref.lower() == "none" else [r.strip() for r in args.before_ref.split(",") if r.strip()]
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fixed-costs-") as tmp:
        tmp = Path(tmp)
        trees = {}
        try:
            for i, ref in enumerate(refs):
                wt = tmp / f"before-tree-{i}"
                subprocess.run(["git", "worktree", "add", "--detach", str(wt), ref], cwd=REPO, check=True,
                               capture_output=True)
                trees[ref] = wt
            trees["after"] = REPO
            caches = {"after": tmp / "cache" if args.cold_cache else None}
            results = measure(trees, tmp / "runs", repeats=args.repeats, quickstart=not args.skip_quickstart,
                              caches=caches, scale=args.quickstart_scale)
        finally:
            for ref, wt in trees.items():
                if ref != "after":
                    subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=REPO, capture_output=True)
            subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)
    load1 = os.getloadavg()
    cols = refs + ["after"]
    first = results[refs[0]] if refs else None
    print(f"### Fixed costs: {', '.join(refs) or '(no before)'} vs after (this tree)\n")
    print(f"{os.cpu_count()} CPUs; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end; "
          f"median of {args.repeats} runs for the first two rows; after: MLflow template cache "
          f"{'cold' if args.cold_cache else 'warm'}; quick start budgets x{args.quickstart_scale:g}\n")
    rows = [("`deltarl --help` (s)", lambda r: r["help"], 2), ("10-episode in-process campaign (s)", lambda r: r["ten"], 2),
            ("10-episode in-process campaign, CPU s (user + sys)", lambda r: r["ten_cpu"], 2)]
    if any("quickstart" in r for r in results.values()):
        for r in results.values():
            r.setdefault("quickstart", None)
        rows += [("quick start, whole process (s)", lambda r: r["quickstart"]["wall"], 1),
                 ("quick start, CPU s of the process and its waited children", lambda r: r["quickstart_cpu"], 1),
                 ("quick start, its phases' own work (s)", lambda r: sum(r["quickstart"]["phases"].values()), 1),
                 ("quick start, time outside its phases (s)", lambda r: r["quickstart"]["outside"], 1)]
    head = " | ".join(("before " + r) for r in refs) + (" | " if refs else "")
    print(f"| measurement | {head}after |" + (f" after / {refs[0]} |" if refs else ""))
    print("|---|" + "---:|" * (len(cols) + (1 if refs else 0)))
    def value(f, r):
        try:
            return f(r)
        except (TypeError, KeyError):  # a quick start that failed
            return float("nan")

    for label, f, nd in rows:
        vals = [value(f, results[c]) for c in cols]
        ratio = f" {vals[-1] / vals[0]:.2f} |" if first else ""
        print(f"| {label} | " + " | ".join(f"{v:.{nd}f}" for v in vals) + " |" + ratio)
    if any(results[c].get("quickstart") for c in cols):
        print()
        for c in cols:
            q = results[c]["quickstart"]
            if not q:
                print(f"- {c}: the quick start failed (see stderr)")
                continue
            ph = ", ".join(f"{k} {v:.1f} s" for k, v in q["phases"].items())
            print(f"- {c}: phases {ph}; {q['summary']}")
    print("\n10-episode runs (s): " + "; ".join(f"{c} {[round(x, 2) for x in results[c]['ten_runs']]}" for c in cols))
    print("--help runs (s): " + "; ".join(f"{c} {[round(x, 2) for x in results[c]['help_runs']]}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
