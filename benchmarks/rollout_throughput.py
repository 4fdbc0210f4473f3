"""Rollout throughput: the peer tools' serial loop vs the batched engine vs the engine on Ray.

    python benchmarks/rollout_throughput.py [--scenarios CartPole-v1 Hopper-v5] [--quick]

For each scenario, with the same 256x256 MLP policy (TorchScript, seeded random weights):

  (a) serial   one gymnasium env: reset, set the initial state, one batch-1 policy call per step
               (what MDPFuzz, CureFuzz and GMT do)
  (b) batched  deltarl's lockstep engine in this process (one batched policy call per step), run
               by the executor (orchestrator.cluster.executor.Executor, workers=0)
  (c) ray x2   the same executor on a local Ray cluster with 2 rollout actors (workers=2), chunked by
               its own rule (chunk_size)

Every mode runs one thread of torch per process (torch.set_num_threads(1)), so (a) and (b)
use one core and (c) two: the ratios are per-core speed-up (b/a) and scaling (c/b). Ray start-up
and actor creation are excluded from (c); policy loading is excluded everywhere. Prints a
Markdown table of episodes/s, steps/s and the ratios. The mean episode length is printed too:
the engine's advantage grows as episodes get shorter (resets are cheap in batch), so compare
steps/s for long-episode workloads.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs import get_scenario
from orchestrator.cluster.executor import Executor
from workers.policies import export_mlp_torchscript, load_policy


def serial_loop(scenario, policy, states):
    env = scenario.reference_env()
    steps = 0
    t0 = time.perf_counter()
    for s in states:
        obs = scenario.reference_reset_to(env, s)
        for _ in range(scenario.max_steps):
            a = policy.act(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, r, term, trunc, _ = env.step(int(a) if scenario.action.discrete else a)
            steps += 1
            if term or trunc:
                break
    return time.perf_counter() - t0, steps


def batched(scenario, uri, policy, states, batch_size):
    """(b): the executor in this process (``workers=0``), reusing the loaded policy."""
    with Executor(scenario, {"aut": uri}, workers=0, batch_size=batch_size, policies={"aut": policy}) as ex:
        t0 = time.perf_counter()
        res = ex.run(states, seed=0)
        return time.perf_counter() - t0, res.n_steps


def on_ray(scenario, uri, states, batch_size, workers=2):
    """(c): the executor on ``workers`` Ray rollout actors, with its own chunking
    (``orchestrator.cluster.executor.chunk_size``); start-up and a warm-up call per actor excluded."""
    with Executor(scenario, {"aut": uri}, workers=workers, batch_size=batch_size) as ex:
        # warm-up: one state per task, two per actor (first-call costs: torch JIT, MuJoCo model compile)
        ex.run(states[: 2 * workers], seed=0)
        t0 = time.perf_counter()
        steps = sum(r.n_steps for _, r in ex.stream(states, seed=0))
        return time.perf_counter() - t0, steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", default=["CartPole-v1", "Hopper-v5"])
    ap.add_argument("--quick", action="store_true", help="small episode counts (a smoke run)")
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    torch.set_num_threads(1)

    counts = {  # (serial episodes, engine episodes)
        "CartPole-v1": (300, 65536),
        "Hopper-v5": (40, 2048),
    }
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="deltarl-bench-"))
    for name in args.scenarios:
        sc = get_scenario(name)
        n_serial, n_engine = counts.get(name, (40, 2048))
        if args.quick:
            n_serial, n_engine = max(10, n_serial // 10), max(64, n_engine // 8)
        spec = sc.action
        uri = str(tmp / f"{name}-mlp.pt")
        # continuous: outputs squashed into 10% of the action range, so that the random robot
        # stays up long enough for the benchmark to measure stepping rather than resets
        export_mlp_torchscript(
            uri, sc.obs_dim, spec.size, hidden=(256, 256), seed=0, discrete=spec.discrete,
            action_low=None if spec.discrete else 0.1 * spec.low,
            action_high=None if spec.discrete else 0.1 * spec.high,
        )
        policy = load_policy(uri, sc, device="cpu")
        rng = np.random.default_rng(0)
        states_serial = sc.sample(rng, n_serial)
        states = sc.sample(rng, n_engine)
        policy.act(np.zeros((4, sc.obs_dim), np.float32))  # warm-up

        wa, sa = serial_loop(sc, policy, states_serial)
        wb, sb = batched(sc, uri, policy, states, args.batch_size)
        wc, scount = on_ray(sc, uri, states, args.batch_size)
        ea, eb, ec = n_serial / wa, n_engine / wb, n_engine / wc
        rows.append((name, "(a) serial gymnasium loop", n_serial, ea, sa / wa, 1.0))
        rows.append((name, f"(b) batched engine, 1 process (B={args.batch_size})", n_engine, eb, sb / wb, eb / ea))
        rows.append((name, "(c) engine on Ray, 2 workers", n_engine, ec, scount / wc, ec / ea))
        print(f"{name}: (b)/(a) = {eb / ea:.1f}x  (c)/(b) = {ec / eb:.2f}x", file=sys.stderr)

    print("| scenario | mode | episodes | mean length | episodes/s | steps/s | vs (a) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, mode, n, eps, sps, ratio in rows:
        print(f"| {name} | {mode} | {n} | {sps / eps:.0f} | {eps:,.1f} | {sps:,.0f} | {ratio:.1f}x |")
    print()
    for name in args.scenarios:
        r = [x for x in rows if x[0] == name]
        print(f"- {name}: (b)/(a) = {r[1][3] / r[0][3]:.1f}x, (c)/(b) = {r[2][3] / r[1][3]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
