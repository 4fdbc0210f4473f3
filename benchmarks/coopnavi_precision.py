"""Where a CoopNavi agent fails: assignment, collisions or precision (docs/scenarios.md, issue #19).

Runs each policy for N episodes of the reference env (``deltarl/CoopNavi-v0``, reset seeds
2024, 2025, ...; the reset distribution) and prints, per policy, from the last step of each
episode:

* success rate (every landmark covered at step 25 and at most 5 collisions: the scenario's oracle),
* how often the three agents end nearest to three different landmarks (assignment),
* collisions per episode and the share of episodes with more than 5,
* each agent's distance to its nearest landmark (median over agents and episodes) and the share
  of agents within the cover radius (0.1),
* landmarks covered at the end (mean of 3).

    python benchmarks/coopnavi_precision.py \
        --policy shared=runs/aut/CoopNavi-sac-shared/policy.pt \
        --policy centralised=runs/aut/CoopNavi-sac/policy.pt \
        --policy hand-written=python:workers.examples:coopnavi_greedy

Loading a ``.d3``/``.zip`` policy unpickles it, which runs code: load only files you trust.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

import envs.coopnavi as cn
from workers.policies.load import load_policy


def measure(policy, episodes: int, seed: int) -> dict:
    env = gym.make(cn.ENV_ID).unwrapped
    success, distinct, collisions, dists, covered = [], [], [], [], []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        done = False
        info: dict = {}
        while not done:
            action = policy.act(obs[None, :])[0]
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        agents = np.array(env.agent_pos)
        landmarks = np.array(env.landmark_pos)
        d = np.linalg.norm(agents[:, None, :] - landmarks[None, :, :], axis=2)  # (agent, landmark)
        success.append(bool(truncated))  # the episode ends truncated exactly when the oracle passes
        distinct.append(len(set(d.argmin(axis=1).tolist())) == cn.N_LANDMARKS)
        collisions.append(info["collisions_total"])
        dists.extend(d.min(axis=1).tolist())
        covered.append(info["covered"])
    collisions_a = np.array(collisions)
    dists_a = np.array(dists)
    return {
        "success": float(np.mean(success)),
        "distinct": float(np.mean(distinct)),
        "collisions": float(collisions_a.mean()),
        "over5": float(np.mean(collisions_a > cn.MAX_COLLISIONS)),
        "median_dist": float(np.median(dists_a)),
        "within": float(np.mean(dists_a < cn.COVER_RADIUS)),
        "covered": float(np.mean(covered)),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", action="append", required=True, metavar="NAME=URI",
                    help="a policy to measure (repeatable); URI as `deltarl evaluate --policy` takes it")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=2024, help="reset seed of the first episode")
    args = ap.parse_args(argv)
    print(f"CoopNavi, reference env, {args.episodes} episodes, reset seeds {args.seed}..{args.seed + args.episodes - 1}\n")
    print("| policy | success | distinct landmarks | collisions / episode | episodes > 5 collisions "
          "| median distance to nearest landmark | agents within 0.1 | landmarks covered (of 3) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for item in args.policy:
        name, _, uri = item.partition("=")
        r = measure(load_policy(uri, scenario="CoopNavi", device="cpu"), args.episodes, args.seed)
        print(f"| {name} | {r['success']:.0%} | {r['distinct']:.0%} | {r['collisions']:.2f} | {r['over5']:.0%} "
              f"| {r['median_dist']:.3f} | {r['within']:.0%} | {r['covered']:.2f} |")


if __name__ == "__main__":
    main()
