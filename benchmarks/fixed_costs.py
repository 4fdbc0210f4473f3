"""Fixed costs as a user meets them, before and after (issue #20): the floor (python start-up,
``import torch``), ``deltarl --help``, a 10-episode in-process campaign, and the quick start's time
outside its three phases' own work, with a second table breaking that time into its parts.

    python benchmarks/fixed_costs.py                      # after (this tree) and before (26b17db)
    python benchmarks/fixed_costs.py --skip-quickstart    # the short measurements only (a few minutes)
    python benchmarks/fixed_costs.py --before-ref none    # this tree only
    python benchmarks/fixed_costs.py --quickstart-scale 0.1   # the quick start with a tenth of its budgets

The breakdown: the quick start runs under a bootstrap (:data:`TIMED`) that wraps the functions
named in :data:`PATCH` with timers as their modules are imported (nothing in the tree changes),
and writes the intervals at exit; each part is a function's time without the timed functions it
calls. The before tree's modules differ: there only its phases are timed (their outside time
stays whole, as ``rest``).

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
# as the console script: trees with orchestrator.cli.exit_without_teardown (the `deltarl` entry point's
# exit since issue #20's second round) leave that way, older trees with sys.exit
CLI = ("import sys; import orchestrator.cli as c; "
       "getattr(c, 'exit_without_teardown', sys.exit)(c.main())")

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


# The quick start runs under this bootstrap (``python -c TIMED``): it wraps named functions of
# the tree (whichever of them it has: the before tree's modules differ) with timers as their
# modules are imported, runs the CLI and, at exit, writes every timed interval to
# $DELTARL_BENCH_TIMINGS. It adds a few microseconds per timed call and nothing to the tree.
TIMED = r"""
import atexit, importlib.abc, importlib.machinery, json, os, sys, time
T0, W0 = time.perf_counter(), time.time()
SPANS, STACK = [], []
def _now():
    return time.perf_counter() - T0
def _dump():
    SPANS.append(("process exit (atexit)", EXIT[0], _now(), 0)) if EXIT else None
    with open(os.environ["DELTARL_BENCH_TIMINGS"], "w") as f:
        json.dump({"wall0": W0, "spans": SPANS}, f)
atexit.register(_dump)  # registered first: runs last, after MLflow's and Ray's exit handlers
EXIT = []
PATCHES = {}
for spec in os.environ["DELTARL_BENCH_PATCH"].split(";"):
    mod, attr, label = spec.split("|")
    PATCHES.setdefault(mod, []).append((attr, label))
def _wrap(f, label):
    def timed(*a, **k):
        t = _now()
        STACK.append(label)
        try:
            return f(*a, **k)
        finally:
            STACK.pop()
            SPANS.append((label, t, _now(), len(STACK)))
    timed.__wrapped__ = f
    return timed
def _patch(module):
    for attr, label in PATCHES.get(module.__name__, ()):
        owner, *path = attr.split(".")
        obj = getattr(module, owner, None)
        if obj is None:
            continue
        if path:
            if getattr(obj, path[0], None) is not None:
                setattr(obj, path[0], _wrap(getattr(obj, path[0]), label))
        else:
            setattr(module, owner, _wrap(obj, label))
class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner
    def create_module(self, spec):
        return self.inner.create_module(spec)
    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec
sys.meta_path.insert(0, _Finder())
SPANS.append(("bootstrap", 0.0, _now(), 0))
import orchestrator.cli as _cli
try:
    rc = _cli.main()
finally:
    SPANS.append(("main", 0.0, _now(), 0))
    EXIT.append(_now())
getattr(_cli, "exit_without_teardown", sys.exit)(rc)  # as the console script leaves
"""

# module|attribute|label: the functions the quick start's breakdown times, for both layouts
# (after: orchestrator.campaign/runs/…, before 26b17db: flat orchestrator.*); absent ones are skipped
PATCH = ";".join([
    # the campaign and its phases (after)
    "orchestrator.campaign.pipeline|run_campaign|campaign",
    "orchestrator.campaign.pipeline|run_safety|phase safety",
    "orchestrator.campaign.pipeline|run_challenger_phase|phase challenger",
    "orchestrator.campaign.pipeline|run_optimality|phase optimality",
    "orchestrator.campaign.pipeline|summary_table|summary table",
    # inside the phases (after)
    "workers.policies.load|shared_policy|policy loading",
    "orchestrator.cluster.executor|Executor.__init__|executor start",
    "orchestrator.cluster.executor|Executor.close|executor close",
    "orchestrator.runs.tracking|AsyncRun.__init__|MLflow run start",
    "orchestrator.runs.tracking|AsyncRun.end|MLflow run end (wait for the writer)",
    "orchestrator.runs.store|RunStore.create|run store create/open",
    "orchestrator.runs.store|RunStore.open|run store create/open",
    "orchestrator.runs.store|RunStore.read_episodes|reading D (Parquet)",
    "orchestrator.runs.store|RunStore.read_steps|reading D (Parquet)",
    "orchestrator.campaign.safety|SafetyPhase.summarize|phase summary files",
    "orchestrator.campaign.optimality|OptimalityPhase.summarize|phase summary files",
    "orchestrator.campaign.generations|snapshot|snapshots",
    "orchestrator.campaign.confirm|Confirmer.failures|confirmation",
    "orchestrator.campaign.confirm|Confirmer.bugs|confirmation",
    "orchestrator.campaign.challenger|train_challenger_job|challenger training job",
    "orchestrator.campaign.challenger|challenger_card|challenger card",
    "orchestrator.campaign.cards|export_torchscript|TorchScript export",
    "orchestrator.campaign.cards|evaluate_policy|evaluation episodes (card)",
    "orchestrator.campaign.cards|aut_training_seconds|AUT training time lookup",
    "orchestrator.campaign.challenger|challenger_cache_key|challenger cache key",
    # inside the training job, outside its training clock (per-epoch watch and checkpoints, D as a dataset)
    "workers.challenger|evaluate_algo|training: per-epoch evaluation",
    "workers.challenger|_write_checkpoint|training: per-epoch checkpoint",
    "orchestrator.runs.store|RunStore.to_mdp_dataset|training: D as a d3rlpy dataset",
    # before (26b17db)
    "orchestrator.pipeline|run_campaign|campaign",
    "orchestrator.safety|run_safety|phase safety",
    "orchestrator.challenger|run_challenger_phase|phase challenger",
    "orchestrator.optimality|run_optimality|phase optimality",
    "orchestrator.pipeline|summary_table|summary table",
    "orchestrator.evaluation|evaluate_policy|evaluation episodes (card)",
])

CPU: list[float] = []  # CPU seconds (user + sys) of the last command, its waited-for children included


STARTED: list[float] = []  # time.time() when the last command was started


def deltarl(tree: Path, args: list[str], env: dict, timeout: float = 3600, code: str = CLI
            ) -> tuple[float, subprocess.CompletedProcess]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    STARTED[:] = [time.time()]
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env, capture_output=True, text=True,
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


def floor(env: dict, code: str) -> float:
    """Wall seconds of ``python -c code`` (the floor every command pays)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def _contained(s, spans):
    """The spans directly inside ``s`` (one level deeper, within its interval)."""
    return [c for c in spans if c is not s and c[3] == s[3] + 1 and c[1] >= s[1] and c[2] <= s[2]]


def _exclusive(window, spans, skip=None) -> dict:
    """Seconds per label of the spans nested in ``window`` (each without its own nested spans),
    leaving out those inside the interval ``skip``."""
    out: dict = {}
    todo = _contained(window, spans)
    while todo:
        s = todo.pop()
        kids = _contained(s, spans)
        todo += kids
        if skip and s[1] >= skip[0] and s[2] <= skip[1]:
            continue
        out[s[0]] = out.get(s[0], 0.0) + (s[2] - s[1]) - sum(k[2] - k[1] for k in kids)
    return out


def breakdown(timings: dict, wall: float, started: float, own: dict) -> dict:
    """The quick start's time outside its phases' own work, in parts, from the bootstrap's spans
    (:data:`TIMED`); ``own``: each phase's own work as its summary reports it."""
    spans = [tuple(x) for x in timings["spans"]]
    first = {label: (a, b, d) for label, a, b, d in reversed(spans)}  # the first span of each label
    boot, main_end = first["bootstrap"][1], first["main"][1]
    camp = first.get("campaign")
    parts = {"python start-up (interpreter, before the first line)": timings["wall0"] - started,
             "CLI: imports, campaign file, validation (before the campaign)": (camp[0] if camp else main_end) - boot}
    for name in ("safety", "challenger", "optimality"):
        ph = next((s for s in spans if s[0] == f"phase {name}"), None)
        if ph is None:
            continue
        loop = None
        if name != "challenger":  # the generation loop: from the executor's start to its close
            start = next((s for s in spans if s[0] == "executor start" and ph[1] <= s[1] <= ph[2]), None)
            close = next((s for s in spans if s[0] == "executor close" and ph[1] <= s[1] <= ph[2]), None)
            if start and close:
                loop = (start[2], close[1])
        sub = _exclusive(ph, spans, skip=loop)
        if loop:
            sub["generation loop, outside its clock (the last generation's record and snapshot)"] = (
                loop[1] - loop[0] - own[name])
        elif "challenger training job" in sub:
            sub["challenger training job, outside its clock"] = sub.pop("challenger training job") - own[name]
        outside = (ph[2] - ph[1]) - own[name]
        sub["rest"] = outside - sum(sub.values())
        for k, v in sub.items():
            parts[f"{name}: {k}"] = v
    if camp:
        parts["between and after the phases (results.json, summary table)"] = (
            main_end - camp[1] + (camp[1] - camp[0]) - sum(s[2] - s[1] for s in spans
                                                          if s[0].startswith("phase ") and camp[0] <= s[1] <= camp[1]))
    parts["process exit (atexit: MLflow writers, Ray, interpreter shutdown)"] = (
        started + wall - (timings["wall0"] + main_end))
    return parts


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
        out[name] = {"help_runs": [], "ten_runs": [], "ten_cpus": [], "python_runs": [], "torch_runs": []}
        (tmp / name).mkdir(parents=True, exist_ok=True)
        deltarl(tree, ["--help"], env)  # warm the file cache (every tree gets the same treatment)
    for i in range(repeats):
        for name in trees:  # the floor: the same interpreter for every tree, measured in the same turns
            out[name]["python_runs"].append(floor(envs[name], "pass"))
            out[name]["torch_runs"].append(floor(envs[name], "import torch"))
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
        r.update(python=statistics.median(r["python_runs"]), torch=statistics.median(r["torch_runs"]),
                 help=statistics.median(r["help_runs"]), ten=statistics.median(r["ten_runs"]),
                 ten_cpu=statistics.median(r["ten_cpus"]))
    if quickstart:
        for name, tree in trees.items():
            run = tmp / name / "quickstart"
            timings = tmp / name / "quickstart-timings.json"
            env = {**envs[name], "DELTARL_BENCH_TIMINGS": str(timings), "DELTARL_BENCH_PATCH": PATCH}
            try:
                wall, _ = deltarl(tree, ["run", str(quickstart_file(tree, tmp / name, scale)), "--out", str(run),
                                         "--quiet"], env, code=TIMED)
            except RuntimeError as exc:  # reported as n/a; the other trees' rows still come
                print(f"{name}: the quick start failed: {str(exc)[:500]}", file=sys.stderr)
                continue
            print(f"{name}: quick start {wall:.1f} s", file=sys.stderr)
            res = json.loads((run / "results.json").read_text())
            phases = {"safety": res["safety"]["wall_seconds"],
                      "challenger": sum(c["training_wall_seconds"] for c in res["challengers"]),
                      "optimality": res["optimality"]["wall_seconds"]}
            out[name]["quickstart_cpu"] = CPU[0]
            if timings.is_file():
                out[name]["parts"] = breakdown(json.loads(timings.read_text()), wall, STARTED[0], phases)
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
    rows = [("floor: python start-up, `python -c pass` (s)", lambda r: r["python"], 2),
            ("floor: `python -c \"import torch\"` (s)", lambda r: r["torch"], 2),
            ("`deltarl --help` (s)", lambda r: r["help"], 2), ("10-episode in-process campaign (s)", lambda r: r["ten"], 2),
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
    if any(results[c].get("parts") for c in cols):
        print_parts(results, cols)
    print("\n10-episode runs (s): " + "; ".join(f"{c} {[round(x, 2) for x in results[c]['ten_runs']]}" for c in cols))
    print("--help runs (s): " + "; ".join(f"{c} {[round(x, 2) for x in results[c]['help_runs']]}" for c in cols))
    return 0


def print_parts(results: dict, cols: list[str]) -> None:
    """The second table: the quick start's time outside its phases, part by part."""
    labels = []
    for c in cols:
        for k in results[c].get("parts") or {}:
            if k not in labels:
                labels.append(k)
    print("\n### The quick start's time outside its phases, by part (s)\n")
    print("Timed inside the process by wrapping the named functions (the bootstrap in this script); a part "
          "is a function's time without the timed functions it calls; blank: not timed in that tree "
          "(its modules differ). `rest`: the phase's outside time not in a timed part.\n")
    print("| part | " + " | ".join(("before " + c) if c != "after" else c for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for k in labels:
        vals = [(results[c].get("parts") or {}).get(k) for c in cols]
        print(f"| {k} | " + " | ".join("" if v is None else f"{v:.2f}" for v in vals) + " |")
    sums = [sum((results[c].get("parts") or {}).values()) if results[c].get("parts") else None for c in cols]
    print("| **sum (= time outside its phases)** | " + " | ".join("" if v is None else f"**{v:.1f}**" for v in sums)
          + " |")


if __name__ == "__main__":
    sys.exit(main())
