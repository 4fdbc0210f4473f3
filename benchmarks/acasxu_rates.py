"""ACAS Xu against MDPFuzz's measurements: how often random valid encounters fail, how often an
ownship that never manoeuvres collides, and how often MDPFuzz's mutants of a failing encounter
fail again (the numbers of ``docs/scenarios.md``, section ACASXu, "Measured").

    python benchmarks/acasxu_rates.py                       # seeds 2021 1 2 3, 20000 encounters each
    python benchmarks/acasxu_rates.py --n 5000 --seeds 0    # quicker

Prints one Markdown table row per seed (Wilson 95% intervals). Needs the 45 ACAS Xu networks
(``$DELTARL_ACASXU_DIR``, see ``workers/acasxu_policy.py``). About 35 s per 20000 encounters on
one core.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def collisions(scenario, agent, states) -> np.ndarray:
    """Per state: did the episode driven by ``agent`` collide?"""
    sim = scenario.simulator(len(states))
    obs = sim.reset_to(states)
    failed = np.zeros(len(states), dtype=bool)
    while not sim.done.all():
        out = sim.step(agent.act(obs))
        failed |= out.terminated
        obs = out.obs
    return failed


def pct(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.3f}% ({k} / {n}) [{100 * lo:.2f}, {100 * hi:.2f}]"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="random encounters per seed (default 20000)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[2021, 1, 2, 3])
    ap.add_argument("--mutants", type=int, default=20, help="mutants per failing encounter (default 20)")
    args = ap.parse_args(argv)

    from envs import get_scenario
    from workers.acasxu_policy import AcasXuDNN, AlwaysCOC

    sc = get_scenario("ACASXu")
    dnn = AcasXuDNN()
    print("| seed | DNN fails (random valid encounters) | always-COC collides | mutants of the failing "
          "encounters that fail | wall (s) |")
    print("|---:|---|---|---|---:|")
    for seed in args.seeds:
        t0 = time.perf_counter()
        states = sc.sample(np.random.default_rng(seed), args.n)
        fd = collisions(sc, dnn, states)
        fc = collisions(sc, AlwaysCOC(), states)
        parents = np.repeat(states[fd], args.mutants, axis=0)
        fm = collisions(sc, dnn, sc.mutate(parents, np.random.default_rng(seed + 1))) if len(parents) else np.zeros(0, bool)
        print(f"| {seed} | {pct(int(fd.sum()), args.n)} | {pct(int(fc.sum()), args.n)} | "
              f"{pct(int(fm.sum()), len(fm)) if len(fm) else '—'} | {time.perf_counter() - t0:.0f} |")


if __name__ == "__main__":
    main()
