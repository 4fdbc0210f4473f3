"""Steps per second of the generic Gymnasium path (``gym:<id>``, envs/gym: one environment copy per
episode, stepped in a Python loop) against the hand-written batched simulators (envs/classic.py,
envs/mujoco_envs.py) on CartPole-v1 and Hopper-v5, same machine, same process, same initial states.

Two measures per scenario, each the best of ``--repeats`` runs:

* **simulator**: ``reset_to`` then ``step`` in lockstep with precomputed actions (seeded random
  actions; CartPole's episodes are kept alive by a balancing rule), no policy: what the simulator
  itself costs per episode-step;
* **rollout**: :func:`workers.rollout.rollout` with the zoo agent (one batched policy call per
  step, recording): what a campaign pays per step.

Also the one-off cost of building the generic scenario the first time in a process (the trust
checks included). One table, with the generic / hand-written ratio; with ``--highway`` a last row
for highway-env's highway-v0 (no hand-written simulator: random actions, the shipped DQN agent), the
environment that is slow in itself.

    python benchmarks/gym_throughput.py [--batch 64] [--steps 200] [--repeats 3] [--highway]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _sim_steps_per_s(sc, states, steps: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    best = 0.0
    for _ in range(repeats):
        sim = sc.simulator(len(states))
        sim.max_steps = steps
        t0 = time.perf_counter()
        obs = sim.reset_to(states, np.arange(len(states)))
        done = 0
        for _t in range(steps):
            live = ~sim.done
            if not live.any():
                break
            if sc.name.endswith("CartPole-v1"):  # push towards the pole's lean (episodes stay alive)
                a = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
            elif sc.action.discrete:
                a = rng.integers(0, sc.action.n, size=len(states))
            else:
                a = rng.uniform(-0.3, 0.3, size=(len(states),) + tuple(sc.action.shape)).astype(np.float32)
            done += int(live.sum())
            obs = sim.step(a).obs
        best = max(best, done / (time.perf_counter() - t0))
        del sim
    return best


def _rollout_steps_per_s(sc, policy, states, steps: int, repeats: int) -> float:
    from workers.rollout import rollout

    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = rollout(sc, policy, states, max_steps=steps, batch_size=len(states))
        best = max(best, r.n_steps / (time.perf_counter() - t0))
    return best


def main() -> None:
    import torch

    from envs import get_scenario
    from workers.policies import load_policy

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="episodes in lockstep")
    ap.add_argument("--steps", type=int, default=200, help="steps per episode at most")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--highway", action="store_true", help="add gym:highway-v0 (needs highway-env; 16 episodes, once)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, agent in (("CartPole-v1", "zoo:CartPole-v1"), ("Hopper-v5", "zoo:Hopper-v5")):
        builtin = get_scenario(name)
        t0 = time.perf_counter()
        generic = get_scenario(f"gym:{name}")
        build = time.perf_counter() - t0
        states = builtin.sample(np.random.default_rng(1), args.batch)
        sim = [_sim_steps_per_s(sc, states, args.steps, args.repeats) for sc in (builtin, generic)]
        pols = [load_policy(agent, sc) for sc in (builtin, generic)]
        roll = [_rollout_steps_per_s(sc, p, states, args.steps, args.repeats) for sc, p in zip((builtin, generic), pols)]
        rows.append((name, sim, roll, build))
    print("| scenario | simulator: hand-written (steps/s) | simulator: gym: (steps/s) | gym / hand-written "
          "| rollout with the zoo agent: hand-written (steps/s) | rollout: gym: (steps/s) | gym / hand-written "
          "| first build of gym: (s, trust checks included) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, sim, roll, build in rows:
        print(f"| {name}, {args.batch} episodes | {sim[0]:,.0f} | {sim[1]:,.0f} | {sim[1] / sim[0]:.2f} | {roll[0]:,.0f} "
              f"| {roll[1]:,.0f} | {roll[1] / roll[0]:.2f} | {build:.2f} |")
    if args.highway:
        t0 = time.perf_counter()
        hw = get_scenario("gym:highway-v0")
        build = time.perf_counter() - t0
        states = hw.sample(np.random.default_rng(1), 16)
        sim = _sim_steps_per_s(hw, states, hw.max_steps, 1)
        roll = _rollout_steps_per_s(hw, load_policy("experiments/gym/agents/highway-v0-dqn/model.zip", hw), states,
                                    hw.max_steps, 1)
        print(f"| gym:highway-v0, 16 episodes | - | {sim:,.0f} | - | - | {roll:,.0f} | - | {build:.2f} |")


if __name__ == "__main__":
    main()
