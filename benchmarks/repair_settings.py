"""Repair settings measured along the fine-tuning (issue #18: Table 5 on Hopper and Walker2d).

`deltarl repair` fine-tunes the AUT with CQL on D_superior; its defaults were set on discrete
CartPole. This script measures, for several settings on one optimality run folder, how the
AUT-Improved does *during* the fine-tuning: at chosen gradient steps it is evaluated (with
numpy's and torch's random streams put back afterwards, so the training is the one `deltarl
repair` with those settings would do) on

* the reset distribution: mean return ± 95% CI over ``--episodes`` starts (seed as Table 5's),
* the run's bug states: mean return and the bugs that remain under the run's oracle against the
  challenger's returns there (the challenger and the AUT are run once, at step 0),
* the known failure states of the safety phase (D's run): failures of the AUT-Improved.

    python benchmarks/repair_settings.py runs/grids/delta-mujoco/local/delta-mujoco-003 \\
        --variant default: --variant fixed-temp:temp_learning_rate=0 \\
        --variant fixed-temp-union:temp_learning_rate=0,data=union --at 0 500 1500 3000

A variant is NAME:key=value,... over :class:`workers.repair.RepairConfig`'s fields (steps is
the largest --at). Prints one Markdown table; --out also writes it. Loading the run's models
unpickles them (d3rlpy), which runs code: use it on run folders you trust.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_variant(text: str):
    from workers.repair import RepairConfig

    name, _, body = text.partition(":")
    fields = {f.name: f for f in dataclasses.fields(RepairConfig)}
    kw = {}
    for item in filter(None, body.split(",")):
        key, _, val = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--variant {text!r}: {key!r} is not a RepairConfig field ({', '.join(fields)})")
        kw[key] = val if key in ("data", "device") else (int(val) if key in ("steps", "seed", "batch_size")
                                                           else float(val))
    return name or "default", kw


def temperature(algo) -> float | None:
    """A SAC/CQL agent's entropy temperature; None for a discrete one (it has none)."""
    log_temp = getattr(algo.impl._modules, "log_temp", None)
    return None if log_temp is None else float(next(log_temp.parameters()).exp().item())


def fmt_temp(t: float | None) -> str:
    return "—" if t is None else f"{t:.3f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--variant", action="append", required=True, metavar="NAME:key=val,...")
    ap.add_argument("--at", type=int, nargs="+", default=[0, 500, 1500, 3000], help="gradient steps to evaluate at")
    ap.add_argument("--episodes", type=int, default=20, help="reset-distribution starts per evaluation")
    ap.add_argument("--no-failures", action="store_true", help="skip the known failure states")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)

    import d3rlpy
    import torch

    from orchestrator.analysis.evaluation import evaluate_policy
    from orchestrator.campaign.repair import SB3_AUT, RepairInputs, _repair_dataset, evaluate_on_states
    from orchestrator.runs.cards import EVAL_SEED
    from workers.policies import load_policy
    from workers.policies.sb3_to_d3rlpy import save_sac_from_sb3
    from workers.repair import RepairConfig, cql_from_aut, fine_tune
    from workers.training import quiet_d3rlpy

    quiet_d3rlpy()
    inp = RepairInputs(args.run_dir)
    tmp = Path(tempfile.mkdtemp(prefix="repair-settings-"))
    if inp.aut_weights is None:  # a Stable-Baselines3 SAC AUT (rl-zoo Walker2d): its d3rlpy twin, as deltarl repair does
        save_sac_from_sb3(inp.aut_sb3, tmp / SB3_AUT)
        inp.aut_weights = tmp / SB3_AUT
    sc = inp.scenario
    oracle = inp.oracle()
    alone, f_alone = inp.optimality_alone, inp.safety_alone
    fixed = {"aut": load_policy(inp.aut_uri, sc, device="cpu"),
             "challenger": load_policy(inp.challenger_uri, sc, device="cpu")}
    on_bugs = evaluate_on_states(sc, fixed, inp.bug_states, repeats=oracle.repeats, alone=alone)
    known = None if args.no_failures else inp.known_failures()
    fstates = known[1] if known and known[0] else None
    aut_ev = evaluate_policy(sc, inp.aut_uri, args.episodes, seed=EVAL_SEED, device="cpu")
    aut_f = (evaluate_on_states(sc, {"aut": fixed["aut"]}, fstates, repeats=oracle.repeats, alone=f_alone)["aut"]
             ["failures"] if fstates is not None else None)
    failures_text = ("known failure states not measured" if fstates is None
                     else f"{aut_f} failures on {len(fstates)} known failure states")
    print(f"{inp.run_dir}: {sc.name}, {len(inp.bug_states)} bug states (oracle {oracle.kind}, {oracle.repeats} "
          f"repeat(s)); AUT {aut_ev['mean_return']:.1f} "
          f"on {args.episodes} starts, {on_bugs['aut']['mean_return']:.1f} on the bug states (challenger "
          f"{on_bugs['challenger']['mean_return']:.1f}), {failures_text}", flush=True)

    rows = []
    for text in args.variant:
        name, kw = parse_variant(text)
        cfg = RepairConfig(**{**kw, "steps": max(args.at), "log_every": 1}).validate()
        _, _, _, dataset = _repair_dataset(inp, cfg)
        aut = d3rlpy.load_learnable(str(inp.aut_weights), device="cpu:0")
        algo = cql_from_aut(aut, cfg)
        t_train = [0.0]

        # evaluate and report bind this variant's name, settings, algorithm and clocks (B023)
        def evaluate(step: int, name=name, kw=kw, algo=algo, t_train=t_train) -> None:
            np_state, torch_state = np.random.get_state(), torch.get_rng_state()
            path = tmp / f"{name}-{step}.d3"
            algo.save(str(path))
            pol = load_policy(str(path), sc, device="cpu")
            ev = evaluate_policy(sc, str(path), args.episodes, seed=EVAL_SEED, device="cpu")
            b = evaluate_on_states(sc, {"aut_improved": pol}, inp.bug_states, repeats=oracle.repeats, alone=alone)
            still, _ = oracle.judge(b["aut_improved"]["_returns"], on_bugs["challenger"]["_returns"])
            f = (evaluate_on_states(sc, {"aut_improved": pol}, fstates, repeats=oracle.repeats, alone=f_alone)
                 ["aut_improved"]["failures"] if fstates is not None else None)
            rows.append({"variant": name, "settings": ", ".join(f"{k}={v}" for k, v in kw.items()) or "defaults",
                         "step": step, "train_s": t_train[0], "reset": ev["mean_return"], "reset_ci": ev["ci95_margin"],
                         "bugs_return": b["aut_improved"]["mean_return"], "bugs_left": int(still.sum()),
                         "failures": f, "temp": temperature(algo)})
            r = rows[-1]
            print(f"  {name} step {step}: reset {r['reset']:.1f} ± {r['reset_ci']:.1f}, bug states "
                  f"{r['bugs_return']:.1f} ({r['bugs_left']} bugs left), known failures {f}, temperature "
                  f"{fmt_temp(r['temp'])}, training {t_train[0]:.0f} s", flush=True)
            np.random.set_state(np_state)
            torch.set_rng_state(torch_state)

        marks = set(args.at)
        if 0 in marks:
            evaluate(0)
        t0 = [time.perf_counter()]

        def report(row: dict, marks=marks, t_train=t_train, t0=t0, evaluate=evaluate) -> None:
            if row["step"] in marks:
                t_train[0] += time.perf_counter() - t0[0]
                evaluate(row["step"])
                t0[0] = time.perf_counter()

        fine_tune(algo, dataset, cfg, report=report)

    lines = [f"Run `{inp.run_dir}` ({sc.name}): {len(inp.bug_states)} bug states, oracle {oracle.kind}; "
             f"AUT: {aut_ev['mean_return']:.1f} ± {aut_ev['ci95_margin']:.1f} on {args.episodes} starts of the reset "
             f"distribution, {on_bugs['aut']['mean_return']:.1f} on the bug states (challenger "
             f"{on_bugs['challenger']['mean_return']:.1f}), {failures_text}.", "",
             "| variant | settings | step | training s | reset distribution | bug states: return | bugs left "
             "| known failures | temperature |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['settings']} | {r['step']} | {r['train_s']:.0f} | {r['reset']:.1f} ± "
                     f"{r['reset_ci']:.1f} | {r['bugs_return']:.1f} | {r['bugs_left']} | {'—' if r['failures'] is None else r['failures']} | {fmt_temp(r['temp'])} |")
    shutil.rmtree(tmp, ignore_errors=True)  # the saved models of the evaluations
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(f"`python benchmarks/repair_settings.py {' '.join(sys.argv[1:] if argv is None else argv)}`"
                                  f"\n\n{text}")


if __name__ == "__main__":
    main()
