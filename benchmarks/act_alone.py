"""What confirmation pays per observation: a policy acting alone (one model call per observation)
through ``act`` on each row (the loop confirmation used before), through ``act_alone``'s lean
per-row loop (the input checked and the outputs converted once for all rows; each row still a
batch of one) and through ``act_alone``'s rowwise graph (many rows per call, each computed as
alone: workers/policies/rowwise.py), with the batched ``act`` as the baseline. The rowwise result
is compared with the per-row calls bit for bit before it is timed. One table; the same process,
the same observations.

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
    print("| agent | batched act (µs/obs) | act per row (µs/obs) | act_alone, per-row loop (µs/obs) "
          "| act_alone, rowwise (µs/obs) | per-row loop / rowwise | rowwise / batched |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for scen, uri in (("CartPole-v1", "zoo:CartPole-v1"), ("Hopper-v5", "zoo:Hopper-v5"),
                      ("Walker2d-v5", "zoo:Walker2d-v5"), ("BipedalWalker", "zoo:BipedalWalker")):
        sc = get_scenario(scen)
        pol, loop = load_policy(uri, sc), load_policy(uri, sc)
        loop.per_row_loop()
        obs = np.random.default_rng(0).normal(size=(args.rows, sc.obs_dim))
        rowwise_actions = pol.act_alone(obs)
        assert np.array_equal(rowwise_actions, np.concatenate([pol.act(obs[j:j + 1]) for j in range(args.rows)]))
        kind = "rowwise" if pol.rowwise is not None else "loop (no rowwise graph)"
        # each lambda binds this iteration's policies and observations (called before the next one)
        batched = _per_obs_us(lambda pol=pol, obs=obs: pol.act(obs), args.rows, args.repeats)
        per_row = _per_obs_us(lambda pol=pol, obs=obs: [pol.act(obs[j:j + 1]) for j in range(args.rows)],
                              args.rows, args.repeats)
        lean = _per_obs_us(lambda loop=loop, obs=obs: loop.act_alone(obs), args.rows, args.repeats)
        rowwise = _per_obs_us(lambda pol=pol, obs=obs: pol.act_alone(obs), args.rows, args.repeats)
        print(f"| {uri} ({scen}) | {batched:.1f} | {per_row:.1f} | {lean:.1f} | {rowwise:.1f} ({kind}) "
              f"| {lean / rowwise:.2f} | {rowwise / batched:.2f} |")


if __name__ == "__main__":
    main()
