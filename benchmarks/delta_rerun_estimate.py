"""Wall-time estimate of issue #17's re-run (the ``paper-cases`` profile of
``experiments/delta/rq1-challengers.yaml`` and ``rq2-rq3-methods.yaml``: CartPole, MountainCar and
Acrobot, 5 seeds, 5,000 safety episodes, the preset's challenger steps, 5,000 test cases for every
method) from short measured runs on this machine.

    python benchmarks/delta_rerun_estimate.py [--cases 1000] [--steps 300] [--envs CartPole-v1,MountainCar-v0,Acrobot-v1] \\
        [--cores 2,16]

Per scenario (zoo AUT, one torch thread, in-process rollouts, as a grid campaign runs). Times are
**CPU seconds of this process** (``time.process_time``), so that other jobs on a shared machine
do not inflate them: on an idle core a single-threaded campaign's wall time is its CPU time
(OpenMP threads wait passively, ``OMP_WAIT_POLICY=PASSIVE``, so that waiting is not booked).

* safety testing: CureFuzz episodes per second, from the 600-episode campaign that records the
  D of the benchmark challenger (``benchmarks/delta_setup.py``; wall time, a small share);
* challengers: CPU seconds per gradient step of BC, BCQ and CQL (``--steps``, 300 by default, on that D,
  the preset's 2 torch threads);
* optimality testing: Delta, MDPFuzz, CureFuzz and GMT against that BCQ challenger for ``--cases``
  test cases in generations of 8 with 25 % sampling, bugs confirmed as in a campaign. The
  cumulative wall time per generation (the run's timeline), scaled by the run's CPU / wall
  ratio, is extrapolated to 5,000 test cases
  two ways: at the rate of the run's last quarter (linear) and by a least-squares quadratic in
  the test cases (growing corpora, more bugs to confirm); the table gives both. Delta's ablations
  are costed as Delta.

Totals: rq2-rq3 = per scenario and seed one safety campaign and one BCQ challenger (the grid's
challenger cache shares them) + 7 optimality runs (Delta, 3 ablations, 3 baselines); rq1 = per
scenario, seed and challenger (BC, BCQ, CQL) one safety campaign, the challenger and one Delta
run. CPU time is the sum over campaigns (each a 1-CPU Ray task); wall time on P cores =
max(CPU time / P, the longest campaign). Evaluations of the challengers (100 episodes) and the
report are left out (seconds).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# torch's OpenMP threads otherwise spin while they wait, which on a busy machine books CPU time
# that is no work (set before torch is imported)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.delta_setup import ensure_challenger, optimality_campaign, run_fresh  # noqa: E402

TARGET_CASES, TARGET_SAFETY, SEEDS = 5000, 5000, 5
METHODS = ("delta", "mdpfuzz", "curefuzz", "gmt")


def extrapolate(timeline: pd.DataFrame, target: int) -> tuple[float, float]:
    """(linear, quadratic) wall seconds at ``target`` test cases from a run's timeline."""
    n = timeline["cases"].to_numpy(float)
    t = timeline["wall_time"].to_numpy(float)
    last = n >= 0.75 * n[-1]
    rate = (t[-1] - t[last][0]) / max(n[-1] - n[last][0], 1.0)  # s per case, last quarter
    linear = t[-1] + rate * (target - n[-1])
    a = np.polyfit(n, t, 2)
    quad = float(np.polyval(a, target))
    return float(linear), max(float(quad), float(linear) if a[0] < 0 else float(quad))


def step_seconds(run_dir: Path, algo: str, steps: int) -> float:
    from orchestrator.campaign.challenger import train_run_challenger

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.process_time()
        train_run_challenger(run_dir, algo, steps=steps, out=Path(tmp) / algo, eval_episodes=5, mlflow=False,
                             progress=False)
        return (time.process_time() - t0) / steps  # (the 5 evaluation episodes are a rounding error)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", default="CartPole-v1,MountainCar-v0,Acrobot-v1")
    ap.add_argument("--cases", type=int, default=1000, help="test cases of each measured optimality run")
    ap.add_argument("--steps", type=int, default=300, help="gradient steps of each measured challenger training")
    ap.add_argument("--cores", default="2,16")
    ap.add_argument("--runs", default="runs/bench-delta")
    args = ap.parse_args(argv)

    import torch

    from workers.challenger import challenger_config

    torch.set_num_threads(1)
    root = Path(args.runs)
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    rows, per_env = [], {}
    for env in envs:
        aut = f"zoo:{env}"
        uri, prep = ensure_challenger(env, aut, root)
        run_dir = Path(uri).parents[2]
        s = prep["safety"]
        safety_rate = s["episodes"] / s["wall_seconds"]
        step_s = {algo: step_seconds(run_dir, algo, args.steps) for algo in ("bc", "bcq", "cql")}
        preset_steps = {a: challenger_config(env, a).steps for a in ("bc", "bcq", "cql")}
        opt = {}
        for m in METHODS:
            c = optimality_campaign(env, aut, uri, root / f"estimate-{env}-{m}", fuzzer=m, budget=args.cases,
                                    generation_size=8, sampling_fraction=0.25)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            summ = run_fresh(c)
            ratio = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
            tl = pd.read_parquet(Path(c.output) / "optimality_timeline.parquet")
            lin, quad = (ratio * x for x in extrapolate(tl, TARGET_CASES))
            opt[m] = (lin, quad)
            rows.append({"env": env, "method": m, "cases": summ["cases"], "wall_s": summ["wall_seconds"],
                         "cpu_s": ratio * summ["wall_seconds"],
                         "bugs": summ["bugs"], "confirm_s": summ["confirm_seconds"], "est_5000_linear_s": lin,
                         "est_5000_quadratic_s": quad})
            print(f"{env} {m}: {summ['cases']} cases in {summ['wall_seconds']:.0f} s wall, CPU/wall {ratio:.2f} "
                  f"({summ['bugs']} bugs); 5000 cases: {lin:.0f}-{quad:.0f} CPU s", file=sys.stderr)
        per_env[env] = {"safety_s": TARGET_SAFETY / safety_rate, "safety_rate": safety_rate, "step_s": step_s,
                        "preset_steps": preset_steps, "opt": opt}

    print(f"\nMeasured on this machine (CPU seconds; one torch thread per campaign; {args.cases} test cases per "
          f"optimality run, generations of 8):\n")
    print("| scenario | safety episodes/s | BC / BCQ / CQL CPU ms per step (preset steps) | method | CPU s | wall s | "
          "bugs | confirming (wall s) | est. CPU s at 5,000 cases (linear – quadratic) |")
    print("|---|---:|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        e = per_env[r["env"]]
        st = " / ".join(f"{1000 * e['step_s'][a]:.1f}" for a in ("bc", "bcq", "cql"))
        ps = "/".join(str(e["preset_steps"][a]) for a in ("bc", "bcq", "cql"))
        print(f"| {r['env']} | {e['safety_rate']:.0f} | {st} ({ps}) | {r['method']} | {r['cpu_s']:.0f} | "
              f"{r['wall_s']:.0f} | {r['bugs']} | "
              f"{r['confirm_s']:.0f} | {r['est_5000_linear_s']:.0f} – {r['est_5000_quadratic_s']:.0f} |")

    totals = {}
    for k, pick in (("linear", 0), ("quadratic", 1)):
        rq23 = rq1 = 0.0
        longest = 0.0
        for e in per_env.values():
            o = {m: v[pick] for m, v in e["opt"].items()}
            bcq_s = e["step_s"]["bcq"] * e["preset_steps"]["bcq"]
            rq23 += SEEDS * (e["safety_s"] + bcq_s + 4 * o["delta"] + o["mdpfuzz"] + o["curefuzz"] + o["gmt"])
            for a in ("bc", "bcq", "cql"):
                camp = e["safety_s"] + e["step_s"][a] * e["preset_steps"][a] + o["delta"]
                rq1 += SEEDS * camp
                longest = max(longest, camp)
            longest = max(longest, e["safety_s"] + bcq_s + max(o.values()))
        totals[k] = (rq23, rq1, longest)
    print("\nEstimated re-run (`--profile paper-cases`), CPU hours and wall hours on P idle cores "
          "(max of CPU time / P and the longest campaign):\n")
    cores = [int(x) for x in args.cores.split(",")]
    print("| grid | campaigns | CPU h (linear – quadratic) | " + " | ".join(f"wall h on {p} cores" for p in cores) + " |")
    print("|---|---:|---|" + "---|" * len(cores))
    n_env = len(per_env)
    for name, idx, n in (("rq2-rq3-methods", 0, n_env * SEEDS * 7), ("rq1-challengers", 1, n_env * SEEDS * 3)):
        lo, hi = totals["linear"][idx], totals["quadratic"][idx]
        cells = " | ".join(f"{max(lo / p, totals['linear'][2]) / 3600:.1f} – {max(hi / p, totals['quadratic'][2]) / 3600:.1f}"
                           for p in cores)
        print(f"| {name} | {n} | {lo / 3600:.1f} – {hi / 3600:.1f} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
