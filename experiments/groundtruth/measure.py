"""Measure the planted-defect agents against their base agents (issue 51) and print the table
committed in experiments/results/groundtruth-agents/README.md:

    python experiments/groundtruth/measure.py [--states N] [--seed S] [SPEC ...]

For each spec: N initial states drawn from the scenario's reset distribution (seeded) plus, for
each region, states drawn inside it; the base agent and the planted agent run from every one.
Printed: the base's natural failure rate (all N draws, and outside the regions), and per region
its share of the reset distribution, the base's and the planted agent's failure rates and mean
returns inside it, and the share of its states where the planted agent's return is lower. Outside
the regions the two agents' episodes must be identical (counted and printed).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from workers.policies import load_policy
from workers.policies.planted import load_spec
from workers.rollout import rollout

DEFAULT = ["experiments/groundtruth/cartpole.yaml", "experiments/groundtruth/mountaincar.yaml",
           "experiments/groundtruth/acrobot.yaml", "experiments/groundtruth/hopper.yaml"]


def inside(spec, region: int, n: int, rng) -> np.ndarray:
    out, have = [], 0
    while have < n:
        c = spec.scenario.sample_uniform(rng, 20_000)
        c = c[spec.region_of_initial(c) == region]
        out.append(c)
        have += len(c)
    return np.concatenate(out)[:n]


def measure(path: str, n: int, per_region: int, seed: int) -> list[str]:
    spec = load_spec(path)
    sc = spec.scenario
    rng = np.random.default_rng(seed)
    draws = sc.sample(rng, n)
    parts = [draws] + [inside(spec, i, per_region, rng) for i in range(len(spec.regions))]
    states = np.concatenate(parts)
    truth = spec.region_of_initial(states)
    t0 = time.perf_counter()
    base = rollout(sc, load_policy(spec.base, sc, device="cpu"), states)
    planted = rollout(sc, load_policy(f"planted:{path}", sc, device="cpu"), states)
    wall = time.perf_counter() - t0
    out_rows = np.flatnonzero(truth < 0)
    same = sum(int(base.returns[e] == planted.returns[e] and base.lengths[e] == planted.lengths[e]
                   and np.array_equal(base.actions[base.episode == e], planted.actions[planted.episode == e]))
               for e in out_rows)
    first = truth[:n]
    vol = [(first == i).mean() for i in range(len(spec.regions))]
    lines = [f"### {sc.name}: `planted:{path}` on `{spec.base}`", "",
             f"{n} reset draws (seed {seed}) + {per_region} states inside each region; {wall:.0f} s of rollouts "
             f"on this machine (shared). Base natural failure rate: {base.failure[:n].mean():.3f} of the {n} draws, "
             f"{base.failure[out_rows].mean():.3f} of the {len(out_rows)} states outside every region. Outside the "
             f"regions the planted agent's episodes equal the base's in {same} of {len(out_rows)} (actions, "
             "return, length).", "",
             "| region | kind | steps | share of the reset draws | states | base fails | planted fails | "
             "base mean return | planted mean return | planted return lower |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(spec.regions):
        m = truth == i
        lines.append(f"| {r.name} | {r.kind} | {r.steps} | {100 * vol[i]:.2f}% | {int(m.sum())} | "
                     f"{base.failure[m].mean():.2f} | {planted.failure[m].mean():.2f} | {base.returns[m].mean():.1f} | "
                     f"{planted.returns[m].mean():.1f} | {(planted.returns[m] < base.returns[m]).mean():.2f} |")
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="*", default=DEFAULT)
    ap.add_argument("--states", type=int, default=300)
    ap.add_argument("--per-region", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    for path in args.specs:
        n = args.states if "hopper" not in path else max(20, args.states // 5)
        per = args.per_region if "hopper" not in path else max(5, args.per_region // 2)
        print("\n".join(measure(path, n, per, args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
