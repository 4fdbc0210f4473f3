"""Delta's Table 5 (RQ4, repair) over the full-Delta runs of a grid: ``deltarl repair`` on each
run folder that has none yet (resumable: a finished repair is kept), then one table with the mean
± 95% CI margin over seeds per scenario, beside the paper's numbers.

    python benchmarks/table5_repair.py runs/grids/delta-rq2-rq3/paper-cases \
        --scenario MountainCar-v0 --scenario Acrobot-v1 --out experiments/results/delta-table5

For every run: the repair's ``repair.json`` is copied to ``OUT/<scenario>-s<seed>.json`` (the
numbers behind the table, a few KB each) and the table is written to ``OUT/README.md``'s
generated block (``OUT/table5.md``). The fuzz re-evaluation runs the run's own safety fuzzer and
budget (the paper: "the same execution setup described in RQ1"). ``OMP_NUM_THREADS=1`` is set for
the repairs (two side by side on two cores do not fight over threads).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Table 5 of the Delta paper: mean reward AUT, AUT-Improved; safety failures of the AUT on the known
# failure states, of AUT-Improved (reduction); CureFuzz re-evaluation of AUT-Improved (all ± 95% CI)
PAPER = {
    "CartPole-v1": ("495.7 ± 6.8", "500 ± 0.0", "77.4 ± 10.3", "0.0 (−100.0%) ± 0.0", "0.0 ± 0.0"),
    "MountainCar-v0": ("−129.8 ± 2.8", "−125.4 ± 3.2", "167.2 ± 8.7", "0.0 (−100.0%) ± 0.0", "37.4 ± 6.4"),
    "Acrobot-v1": ("−81.3 ± 3.0", "−75.2 ± 2.9", "1183.6 ± 41.9", "118.2 (−90.0%) ± 11.3", "265.0 ± 18.5"),
    "Hopper-v5": ("3162.3 ± 60.9", "3247.0 ± 30.5", "154.4 ± 9.9", "40.0 (−74.1%) ± 6.0", "106.2 ± 19.5"),
    "Walker2d-v5": ("3925.5 ± 192.2", "4399.3 ± 93.8", "251.8 ± 23.8", "5.6 (−97.8%) ± 2.4", "105.0 ± 17.2"),
}


def delta_runs(grid_dir: Path, scenarios: list[str], challenger: str | None = None) -> list[tuple[str, int, Path]]:
    """(scenario, seed, run folder) of every finished full-Delta run (no ablation) of the grid;
    ``challenger``: only the runs whose (first) challenger algorithm is that one."""
    out = []
    for d in sorted(grid_dir.iterdir()):
        c, s = d / "campaign.json", d / "optimality_summary.json"
        if not (c.is_file() and s.is_file() and (d / "bugs.parquet").is_file()):
            continue
        cfg = json.loads(c.read_text())
        opt = cfg.get("optimality") or {}
        if opt.get("fuzzer") != "delta" or (opt.get("params") or {}).get("without"):
            continue
        if scenarios and cfg["scenario"] not in scenarios:
            continue
        if challenger and ((cfg.get("challenger") or {}).get("algos") or [None])[0] != challenger:
            continue
        out.append((cfg["scenario"], int(cfg["seed"]), d))
    return out


def repair(run: Path) -> dict:
    done = run / "repair" / "repair.json"
    if not done.is_file():
        cfg = json.loads((run / "campaign.json").read_text())
        safety = cfg.get("safety") or {}
        budget = (safety.get("budget") or {}).get("episodes")
        cmd = [sys.executable, "-m", "orchestrator.cli", "repair", str(run), "--quiet"]
        if budget:
            cmd += ["--fuzz-budget", str(int(budget)), "--fuzzer", safety.get("fuzzer", "curefuzz")]
        print("$", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, cwd=REPO, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(done.read_text())


def fmt(xs: list[float], digits: int = 1) -> str:
    from orchestrator.analysis.stats import mean_ci

    m, h = mean_ci(xs)
    return f"{m:.{digits}f} ± {h:.{digits}f}" if math.isfinite(h) else f"{m:.{digits}f}"


def table(rows: dict[str, list[dict]]) -> list[str]:
    lines = ["| environment | runs (seeds) | mean reward (AUT) | mean reward (AUT-Improved) | safety failures of AUT "
             "(known failure states) | safety failures of AUT-Improved (after repair) | CureFuzz re-eval: AUT → "
             "AUT-Improved |", "|---|---|---:|---:|---:|---:|---:|"]
    for scen, reps in rows.items():
        ev = [r["evaluation"] for r in reps]
        fs = [r["failure_states"] for r in reps]
        # a run whose safety phases found no failure has no known failure states: 0 for both agents
        aut_f = [f["aut"]["failures"] if f.get("known_failures") else 0 for f in fs]
        imp_f = [f["aut_improved"]["failures"] if f.get("known_failures") else 0 for f in fs]
        red = (sum(imp_f) - sum(aut_f)) / sum(aut_f) if sum(aut_f) else float("nan")
        red_s = f" ({100 * red:+.1f}%)" if math.isfinite(red) else ""
        fz = [r.get("fuzz") for r in reps]
        fuzz = "not run" if any(f is None for f in fz) else (
            f"{fmt([f['aut']['failures'] for f in fz])} → {fmt([f['aut_improved']['failures'] for f in fz])}")
        seeds = ", ".join(str(r["_seed"]) for r in reps)
        if len({e["aut"]["policy_sha256"] for e in ev}) == 1:  # one AUT: its own 100-episode mean ± CI
            aut = f"{ev[0]['aut']['mean_return']:.1f} ± {ev[0]['aut']['ci95_margin']:.1f}"
        else:
            aut = fmt([e["aut"]["mean_return"] for e in ev])
        lines.append(f"| {scen} | {len(reps)} ({seeds}) | {aut} | "
                     f"{fmt([e['aut_improved']['mean_return'] for e in ev])} | {fmt(aut_f)} | {fmt(imp_f)}{red_s} | {fuzz} |")
        if scen in PAPER:
            p = PAPER[scen]
            lines.append(f"| {scen}, paper | 5 | {p[0]} | {p[1]} | {p[2]} | {p[3]} | → {p[4]} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grid_dir", type=Path)
    ap.add_argument("--scenario", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--challenger", default=None, help="only the Delta runs with this challenger algorithm (a grid "
                    "with several, e.g. experiments/delta/mujoco.yaml: bc in its local profile)")
    ap.add_argument("--no-run", action="store_true", help="only tabulate the repairs already in --out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {}
    if not args.no_run:
        runs = delta_runs(args.grid_dir, args.scenario, args.challenger)
        seen = [(scen, seed) for scen, seed, _ in runs]
        if len(seen) != len(set(seen)):
            ap.error("several full-Delta runs share a scenario and seed (Delta with several challengers): "
                     "choose one with --challenger bc|bcq|cql")
        for scen, seed, run in runs:
            repair(run)
            shutil.copyfile(run / "repair" / "repair.json", args.out / f"{scen}-s{seed}.json")
    for f in sorted(args.out.glob("*-s[0-9]*.json")):
        scen, seed = f.stem.rsplit("-s", 1)
        if args.scenario and scen not in args.scenario:
            continue
        rep = json.loads(f.read_text())
        rep["_seed"] = int(seed)
        rows.setdefault(scen, []).append(rep)
    for reps in rows.values():
        reps.sort(key=lambda r: r["_seed"])
    lines = ["Delta Table 5 (repair), printed by `python benchmarks/table5_repair.py` from the "
             "`<scenario>-s<seed>.json` files beside this table (each a `deltarl repair` of one full-Delta run; "
             "mean ± 95% CI margin over the runs, t distribution; the AUT's mean reward: its 100 episodes ± their CI, "
             "the same agent in every run). Failures on the known failure states and in the "
             "re-evaluation are counts per run; the reduction is of the summed counts.", "", *table(rows)]
    (args.out / "table5.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
