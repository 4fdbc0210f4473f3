"""What confirmation pays per observation: a policy acting alone (one model call per observation)
through ``act`` on each row (the loop confirmation used before) and through ``act_alone`` (the
input checked and the outputs converted once for all rows; each row still a batch of one), with
the batched ``act`` as the baseline. One table; the same process, the same observations.

    python benchmarks/act_alone.py [--rows 64] [--repeats 30]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def _per_obs_us(fn, rows: int, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e6 * best / rows


def main() -> None:
    from envs import get_scenario
    from workers.policies import load_policy

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| agent | batched act (µs/obs) | act per row (µs/obs) | act_alone (µs/obs) | per row / act_alone |")
    print("|---|---:|---:|---:|---:|")
    for scen, uri in (("CartPole-v1", "zoo:CartPole-v1"), ("Hopper-v5", "zoo:Hopper-v5"),
                      ("BipedalWalker", "zoo:BipedalWalker")):
        sc = get_scenario(scen)
        pol = load_policy(uri, sc)
        obs = np.random.default_rng(0).normal(size=(args.rows, sc.obs_dim))
        batched = _per_obs_us(lambda: pol.act(obs), args.rows, args.repeats)
        per_row = _per_obs_us(lambda: [pol.act(obs[j:j + 1]) for j in range(args.rows)], args.rows, args.repeats)
        alone = _per_obs_us(lambda: pol.act_alone(obs), args.rows, args.repeats)
        print(f"| {uri} ({scen}) | {batched:.1f} | {per_row:.1f} | {alone:.1f} | {per_row / alone:.2f} |")


if __name__ == "__main__":
    main()
