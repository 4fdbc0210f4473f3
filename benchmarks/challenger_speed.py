"""Challenger training speed on CPU: where a d3rlpy gradient step's time goes, before and after the
vectorised minibatch sampler (``workers.datasets.TransitionSampler``, issue #18).

For each challenger algorithm with the settings of its preset (experiments/challengers/), on a
dataset of the quick start's size (CartPole: 2,000 episodes of 500 steps, discrete) and of a
Hopper campaign's (1,000 episodes of 1,000 steps, continuous; random values: a step's cost does not
depend on them), in this process with torch's default threads:

* sampling a minibatch: d3rlpy's ``sample_transition_batch`` vs ``TransitionSampler.sample``
  (the same minibatch for the same numpy seed; tests/test_challenger.py);
* a whole step (sample + ``algo.update``) each way, and steps/s before and after.

    python benchmarks/challenger_speed.py [--steps 200] [--only CartPole-v1|Hopper-v5]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import workers  # noqa: F401 - first: d3rlpy without scikit-learn, gym's banner off

SHAPES = {  # scenario: (episodes, steps per episode, observation size, discrete, action size)
    "CartPole-v1": (2000, 500, 4, True, 2),
    "Hopper-v5": (1000, 1000, 11, False, 3),
}


def dataset(scenario: str):
    from workers.datasets import steps_to_mdp_dataset

    episodes, length, obs_dim, discrete, act = SHAPES[scenario]
    rng = np.random.default_rng(0)
    n = episodes * length
    eid = np.repeat(np.arange(episodes), length)
    last = np.ones(n, dtype=bool)
    last[:-1] = eid[1:] != eid[:-1]
    terminal = last & (np.repeat(rng.random(episodes), length) < 0.5)  # half fall, half reach the limit
    actions = rng.integers(0, act, size=n) if discrete else rng.uniform(-1, 1, size=(n, act)).astype(np.float32)
    steps = {"episode_id": eid, "obs": rng.normal(size=(n, obs_dim)).astype(np.float32), "actions": actions,
             "rewards": rng.normal(size=n).astype(np.float32), "terminals": terminal, "timeouts": last & ~terminal}
    return steps_to_mdp_dataset(steps, discrete=discrete, action_size=act), discrete


def build(scenario: str, algo_name: str, data, discrete: bool, preset: str | None = None):
    """The challenger ``algo_name`` of ``preset`` (the scenario's default preset when None), built
    on ``data`` as training builds it (seed 0, standard observation scaler). Also used by
    challenger_limit.py."""
    import d3rlpy
    from d3rlpy.algos.utility import build_scalers_with_transition_picker

    from workers.challenger import challenger_config, fit_standard_observation_scaler
    from workers.training import d3rlpy_config

    cfg = challenger_config(scenario, algo_name, preset)
    d3rlpy.seed(0)
    algo = d3rlpy_config(cfg.config_class(discrete), cfg.hyperparameters, f"{cfg.preset} {cfg.algo}").create(
        device="cpu:0")
    fit_standard_observation_scaler(algo, data)
    build_scalers_with_transition_picker(algo, data)
    algo.build_with_dataset(data)
    return cfg, algo


def per_call_ms(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return 1e3 * (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    import torch

    from workers.challenger import ALGOS
    from workers.datasets import TransitionSampler

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="timed gradient steps per algorithm and way (after 20)")
    ap.add_argument("--only", choices=sorted(SHAPES), default=None)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    rows = []
    for scenario in [args.only] if args.only else list(SHAPES):
        data, discrete = dataset(scenario)
        t0 = time.perf_counter()
        sampler = TransitionSampler(data)
        layout_s = time.perf_counter() - t0
        for name in ALGOS:
            cfg, algo = build(scenario, name, data, discrete)
            bs = algo.config.batch_size
            # each lambda binds this iteration's data, sampler, algorithm and batch size
            sample_theirs = per_call_ms(lambda data=data, bs=bs: data.sample_transition_batch(bs), 50)
            sample_ours = per_call_ms(lambda sampler=sampler, bs=bs: sampler.sample(bs), 50)
            for _ in range(20):
                algo.update(sampler.sample(bs))
            step_theirs = per_call_ms(lambda algo=algo, data=data, bs=bs: algo.update(data.sample_transition_batch(bs)),
                                      args.steps)
            step_ours = per_call_ms(lambda algo=algo, sampler=sampler, bs=bs: algo.update(sampler.sample(bs)),
                                    args.steps)
            rows.append((scenario, name, bs, sample_theirs, sample_ours, step_theirs, step_ours, layout_s))
            print(f"{scenario} {name}: {step_theirs:.1f} -> {step_ours:.1f} ms per step", flush=True)
    load1 = os.getloadavg()
    print(f"\n{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; load average {load0[0]:.2f} at the "
          f"start, {load1[0]:.2f} at the end; {args.steps} timed steps per algorithm and way (after 20 warm-up "
          f"steps); datasets: CartPole 2,000 x 500 steps, Hopper 1,000 x 1,000 steps\n")
    print("| scenario | algorithm (preset) | batch | sample, d3rlpy (ms) | sample, vectorised (ms) | step, d3rlpy "
          "sampler (ms) | step, vectorised (ms) | steps/s before | steps/s after | after / before |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scenario, name, bs, st, so, pt, po, _ in rows:
        print(f"| {scenario} | {name} | {bs} | {st:.2f} | {so:.3f} | {pt:.2f} | {po:.2f} | {1e3 / pt:.0f} | "
              f"{1e3 / po:.0f} | {pt / po:.2f}x |")
    for scenario in dict.fromkeys(r[0] for r in rows):
        print(f"\nLaying out {scenario}'s transitions for the vectorised sampler (once per training): "
              f"{next(r[7] for r in rows if r[0] == scenario):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
