"""Challengers at this machine's limit (issue #52, "Know the limit"): how much of the CPU's float32
matmul throughput a d3rlpy gradient step of BC, BCQ and CQL uses, where the rest goes, and what the
exact and the same-mathematics speed-ups give, before and after in one run.

1. Throughput: torch's float32 ``linear`` (MKL ``addmm``, what d3rlpy's layers call) and oneDNN's fused
   linear+ReLU on the challengers' layer shapes (rows = batch or batch x sampled actions), per
   CPU-second and per wall second, at each thread count asked for. The machine's limit at a thread
   count is the fastest of them (per CPU-second: robust to other processes on the machine).
2. Steps: each algorithm with its preset (experiments/challengers/mujoco.yaml) on Hopper-v5 (11 -> 3)
   and Walker2d-v5 (17 -> 6): the FLOPs of one gradient step counted by torch's ``FlopCounterMode`` from
   the shapes of every matmul the step runs (forward and backward, batch and sampled actions
   included), the CPU and wall time per step, the achieved GFLOP/s and its share of the limit;
   "before" is d3rlpy as it is, "after" with ``workers.challenger.fuse_no_grad_forward`` (the
   no-grad passes through oneDNN), timed in alternating blocks on the same algorithm object.
3. Optionally (``--omp bc,cql``) each algorithm in fresh processes at 1 thread, 2 threads, and 2
   threads with ``OMP_WAIT_POLICY=PASSIVE`` (libgomp's workers sleep instead of spinning at a
   barrier; read once, when torch loads). Optionally (``--compile cql``) torch.compile of a step's gradient functions: compile time and
   CPU per step, eager vs compiled.
4. Profile: torch.profiler's per-operator table (top operators by self CPU time) of one step of BCQ
   and CQL on Hopper-v5, before.

    python benchmarks/challenger_limit.py [--threads 1,2] [--steps 3] [--scenarios Hopper-v5,Walker2d-v5] [--omp bc,cql] [--compile cql]

Times per CPU-second are the process's CPU time (``time.process_time``): on a machine shared with
other work they measure the work, wall times measure what a run waited for too. With more than
one thread CPU time also counts OpenMP's spinning workers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import workers  # noqa: F401 - first: d3rlpy without scikit-learn, gym's banner off

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import challenger_speed  # noqa: E402 - after the path

SCENARIOS = {"Hopper-v5": (11, 3), "Walker2d-v5": (17, 6)}  # observation, action sizes
ALGOS = ("bc", "bcq", "cql")


def dataset(obs_dim: int, act: int, episodes: int = 50, length: int = 1000):
    """Random transitions of the scenario's sizes: a step's cost does not depend on their values
    nor on D's size (the vectorised sampler draws a batch in O(batch))."""
    from workers.datasets import steps_to_mdp_dataset

    rng = np.random.default_rng(0)
    n = episodes * length
    eid = np.repeat(np.arange(episodes), length)
    last = np.ones(n, dtype=bool)
    last[:-1] = eid[1:] != eid[:-1]
    terminal = last & (np.repeat(rng.random(episodes), length) < 0.5)
    steps = {"episode_id": eid, "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
             "actions": rng.uniform(-1, 1, size=(n, act)).astype(np.float32),
             "rewards": rng.normal(size=n).astype(np.float32), "terminals": terminal, "timeouts": last & ~terminal}
    return steps_to_mdp_dataset(steps, discrete=False, action_size=act)


def build(scenario: str, algo_name: str, data):
    """The challenger with its MuJoCo preset (experiments/challengers/mujoco.yaml), built on ``data``."""
    return challenger_speed.build(scenario, algo_name, data, False, "mujoco")


def layer_shapes(cfg, obs_dim: int, act: int) -> list[tuple[int, int, int]]:
    """(rows, in, out) of every hidden linear layer the step runs on many rows."""
    hp = cfg.hyperparameters
    units = lambda key: hp[key]["params"]["hidden_units"]  # noqa: E731
    bs = hp["batch_size"]
    shapes = []
    if cfg.algo == "bcq":  # the target: decoder, perturbation, 2 critics over batch x sampled actions
        rows = bs * hp["n_action_samples"]
        for ins, h in ((obs_dim + 2 * act, units("imitator_encoder_factory")),
                       (obs_dim + act, units("actor_encoder_factory")), (obs_dim + act, units("critic_encoder_factory"))):
            shapes += [(rows, i, o) for i, o in zip([ins, *h[:-1]], h)]
    elif cfg.algo == "cql":  # the conservative term: critics over batch x sampled actions
        rows = bs * hp["n_action_samples"]
        h = units("critic_encoder_factory")
        shapes += [(rows, i, o) for i, o in zip([obs_dim + act, *h[:-1]], h)]
    else:
        h = units("encoder_factory")
        shapes += [(bs, i, o) for i, o in zip([obs_dim, *h[:-1]], h)]
    return shapes


def _timed(fn) -> tuple[float, float]:
    c, w = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c, time.perf_counter() - w


def throughput(shapes, reps: int = 5) -> list[dict]:
    import torch

    rows = []
    for m, k, n in shapes:
        g = torch.Generator().manual_seed(0)
        a, w, b = (torch.randn(*s, generator=g) for s in ((m, k), (n, k), (n,)))
        ways = {"mkl": lambda a=a, w=w, b=b: torch.relu_(torch.nn.functional.linear(a, w, b)),
                "onednn": lambda a=a, w=w, b=b: torch.ops.mkldnn._linear_pointwise(a, w, b, "relu", [], "")}
        gflop = 2 * m * k * n / 1e9
        reps_m = max(reps, int(0.2 / max(gflop / 50, 1e-4)))  # ~0.2 CPU-s per way and shape at least
        res = {}
        for fn in ways.values():
            fn()
        times = {name: [] for name in ways}
        for _ in range(reps_m):  # alternating: both ways see the same load
            for name, fn in ways.items():
                times[name].append(_timed(fn))
        for name in ways:
            res[name] = (gflop / statistics.median(c for c, _ in times[name]),
                         gflop / statistics.median(w for _, w in times[name]))
        rows.append({"shape": (m, k, n), **res})
    return rows


def count_flops(algo, batch) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        algo.update(batch)
    return int(fc.get_total_flops())


MATMULS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear"}


def matmul_share(algo, sample, bs: int, steps: int = 2) -> float:
    """The share of a step's CPU time spent inside matmul operators (one thread: the step runs on
    this thread, backward included, so this thread's CPU clock sees all of it)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Clock(TorchDispatchMode):
        inside = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func.overloadpacket) not in MATMULS:
                return func(*args, **(kwargs or {}))
            t = time.thread_time()
            out = func(*args, **(kwargs or {}))
            Clock.inside += time.thread_time() - t
            return out

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batches = [sample(bs) for _ in range(steps)]
        t = time.thread_time()
        with Clock():
            for b in batches:
                algo.update(b)
        return Clock.inside / (time.thread_time() - t)
    finally:
        torch.set_num_threads(before)


def set_fused(algo, on: bool) -> None:
    import torch

    from workers.challenger import _fused_sequential_class, fuse_no_grad_forward

    if on:
        fuse_no_grad_forward(algo)
        return
    cls = _fused_sequential_class()
    for f in algo.impl.modules.__dataclass_fields__:
        m = getattr(algo.impl.modules, f)
        if isinstance(m, torch.nn.Module):
            for sub in m.modules():
                if type(sub) is cls:
                    sub.__class__ = torch.nn.Sequential


def step_times(algo, sample, bs: int, steps: int, blocks: int = 2) -> dict:
    """CPU and wall ms per step, before (d3rlpy) and after (fused no-grad passes), in alternating
    blocks of ``steps`` steps."""
    out = {"before": [], "after": []}
    for _ in range(blocks):
        for way in ("before", "after"):
            set_fused(algo, way == "after")
            for _ in range(steps):
                out[way].append(_timed(lambda: algo.update(sample(bs))))
    set_fused(algo, False)
    return {way: (1e3 * statistics.median(c for c, _ in v), 1e3 * statistics.median(w for _, w in v))
            for way, v in out.items()}


def compile_times(algo, sample, bs: int, steps: int) -> dict:
    """torch.compile (inductor, CPU) of the step's critic and actor gradient functions: the compile
    time (wall, and this process's CPU; inductor's compile workers are other processes) and CPU ms
    per step eager vs compiled in alternating blocks. d3rlpy's own ``compile_graph`` is CUDA only
    (CUDA graphs); the device is written "cpu" for dynamo (it refuses "cpu:0" beside "cpu")."""
    import torch

    impl = algo.impl
    impl._device = "cpu"
    eager = (impl._compute_critic_grad, impl._compute_actor_grad)
    compiled = (torch.compile(impl.compute_critic_grad), torch.compile(impl.compute_actor_grad))
    impl._compute_critic_grad, impl._compute_actor_grad = compiled
    c, w = _timed(lambda: [algo.update(sample(bs)) for _ in range(2)])
    out = {"compile wall s": w, "compile CPU s (this process)": c, "eager": [], "compiled": []}
    for _ in range(2):
        for way, fns in (("eager", eager), ("compiled", compiled)):
            impl._compute_critic_grad, impl._compute_actor_grad = fns
            for _ in range(steps):
                out[way].append(_timed(lambda: algo.update(sample(bs)))[0])
    impl._compute_critic_grad, impl._compute_actor_grad = eager
    impl._device = "cpu:0"
    return {k: 1e3 * statistics.median(v) if isinstance(v, list) else v for k, v in out.items()}


OMP_VARIANTS = (  # (label, torch threads, extra environment)
    ("1 thread", 1, {}),
    ("2 threads", 2, {}),
    ("2 threads, OMP_WAIT_POLICY=PASSIVE", 2, {"OMP_WAIT_POLICY": "PASSIVE"}),
)


def child_steps(scenario: str, name: str, threads: int, steps: int) -> dict:
    """In a fresh process (``--child``): CPU and wall ms per step of ``name`` at ``threads``."""
    import torch

    from workers.datasets import TransitionSampler

    torch.set_num_threads(threads)
    data = dataset(*SCENARIOS[scenario], episodes=20)
    sampler = TransitionSampler(data)
    _, algo = build(scenario, name, data)
    bs = algo.config.batch_size
    for _ in range(2):
        algo.update(sampler.sample(bs))
    times = [_timed(lambda: algo.update(sampler.sample(bs))) for _ in range(steps)]
    return {"cpu_ms": 1e3 * statistics.median(c for c, _ in times), "wall_ms": 1e3 * statistics.median(w for _, w in times)}


def omp_compare(scenario: str, algos: list[str], steps: int, reps: int = 2) -> dict:
    """Each algorithm in fresh processes under each of ``OMP_VARIANTS`` (OpenMP reads its
    environment once, when torch loads), the variants alternating ``reps`` times."""
    import json
    import subprocess

    out = {}
    for name in algos:
        for _ in range(reps):
            for label, threads, env in OMP_VARIANTS:
                r = subprocess.run([sys.executable, __file__, "--child", f"{scenario}:{name}:{threads}:{steps}"],
                                   env={**os.environ, **env}, capture_output=True, text=True, check=True)
                got = json.loads(r.stdout.strip().splitlines()[-1])
                out.setdefault((name, label), []).append(got)
    return {k: {m: statistics.median(g[m] for g in v) for m in ("cpu_ms", "wall_ms")} for k, v in out.items()}


def profile_table(algo, sample, bs: int, top: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        algo.update(sample(bs))
    ev = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ev)
    lines = ["| operator | input shapes | calls | self CPU (ms) | share |", "|---|---|---:|---:|---:|"]
    for e in ev[:top]:
        shapes = ", ".join(str(list(s)) for s in e.input_shapes if s)
        lines.append(f"| {e.key} | {shapes} | {e.count} | {e.self_cpu_time_total / 1e3:.1f} | "
                     f"{e.self_cpu_time_total / total:.1%} |")
    lines.append(f"| (all operators) | | | {total / 1e3:.1f} | 100% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import torch

    from workers.datasets import TransitionSampler

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="torch thread counts (the trainer's: torch_threads, 2; 1 in a grid)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per block (2 blocks before, 2 after)")
    ap.add_argument("--scenarios", default="Hopper-v5,Walker2d-v5")
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--omp", default="", help="algorithms to time in fresh processes at 1 thread, 2 threads and 2 "
                                              "threads with OMP_WAIT_POLICY=PASSIVE (first scenario), e.g. bc,cql")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compile", default="", help="algorithms to time under torch.compile too (first scenario, first "
                                                  "thread count; minutes of compiling each), e.g. cql")
    args = ap.parse_args(argv)
    if args.child:  # one measurement in a fresh process (--omp)
        import json

        from workers.training import quiet_d3rlpy

        quiet_d3rlpy()
        sc, name, t, n = args.child.split(":")
        print(json.dumps(child_steps(sc, name, int(t), int(n))))
        return 0
    try:
        threads = [int(t) for t in args.threads.split(",")]
        scenarios = args.scenarios.split(",")
        algos = args.algos.split(",")
        compile_algos = [a for a in args.compile.split(",") if a]
        omp_algos = [a for a in args.omp.split(",") if a]
        bad = [s for s in scenarios if s not in SCENARIOS] + [a for a in algos + compile_algos if a not in algos] \
            + [a for a in omp_algos if a not in ALGOS]
        if bad or min(threads) < 1 or args.steps < 1:
            raise ValueError(bad)
    except ValueError:
        print(f"bad arguments: --threads is a comma list of counts >= 1, --scenarios of {', '.join(SCENARIOS)}, "
              f"--algos of {', '.join(ALGOS)}, --steps >= 1", file=sys.stderr)
        return 2
    from workers.training import quiet_d3rlpy

    quiet_d3rlpy()
    load0 = os.getloadavg()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    built, shares = {}, {}
    for scenario in scenarios:
        obs_dim, act = SCENARIOS[scenario]
        data = dataset(obs_dim, act)
        sampler = TransitionSampler(data)
        for name in algos:
            cfg, algo = build(scenario, name, data)
            bs = algo.config.batch_size
            for _ in range(2):
                algo.update(sampler.sample(bs))
            built[scenario, name] = (cfg, algo, sampler, bs, count_flops(algo, sampler.sample(bs)))
            shares[scenario, name] = matmul_share(algo, sampler.sample, bs)
            print(f"built {scenario} {name}: {built[scenario, name][4] / 1e9:.2f} GFLOP per step, "
                  f"{shares[scenario, name]:.0%} of its CPU time in matmuls", flush=True)

    from workers.challenger import challenger_config

    # every algorithm's shapes, whichever are timed: the limit does not depend on --algos
    shapes = sorted({s for sc in scenarios for a in ALGOS
                     for s in layer_shapes(challenger_config(sc, a, "mujoco"), *SCENARIOS[sc])})
    limits, tput, steps = {}, {}, {}
    for t in threads:
        torch.set_num_threads(t)
        tput[t] = throughput(shapes)
        limits[t] = max(max(r["mkl"][0], r["onednn"][0]) for r in tput[t])
        print(f"threads {t}: limit {limits[t]:.1f} GFLOP per CPU-second", flush=True)
        for key, (_, algo, sampler, bs, _) in built.items():
            steps[t, key] = step_times(algo, sampler.sample, bs, args.steps)
            print(f"threads {t} {key}: {steps[t, key]}", flush=True)
    profiles = {}
    if not args.no_profile:
        torch.set_num_threads(threads[0])
        for key in [k for k in built if k[0] == scenarios[0] and k[1] in ("bcq", "cql")]:
            cfg, algo, sampler, bs, _ = built[key]
            profiles[key] = profile_table(algo, sampler.sample, bs)
    compiled = {}
    for name in compile_algos:
        torch.set_num_threads(threads[0])
        cfg, algo, sampler, bs, _ = built[scenarios[0], name]
        compiled[scenarios[0], name] = compile_times(algo, sampler.sample, bs, args.steps)
        print(f"compiled {name}: {compiled[scenarios[0], name]}", flush=True)
    omp = omp_compare(scenarios[0], omp_algos, 2 * args.steps) if omp_algos else {}
    load1 = os.getloadavg()

    print(f"\n{started}; {os.cpu_count()} CPUs; torch {torch.__version__}, threads {args.threads} "
          f"(interop {torch.get_num_interop_threads()}); load average {load0[0]:.2f} at the start, {load1[0]:.2f} "
          f"at the end; {2 * args.steps} timed steps per algorithm and way (medians), blocks alternating\n")
    print("### Throughput of the challengers' layer shapes (float32 linear + ReLU, GFLOP/s)\n")
    print("| threads | rows x in -> out | MKL addmm per CPU-s | oneDNN fused per CPU-s | MKL per wall s | "
          "oneDNN per wall s |")
    print("|---:|---|---:|---:|---:|---:|")
    for t in threads:
        for r in tput[t]:
            m, k, n = r["shape"]
            print(f"| {t} | {m} x {k} -> {n} | {r['mkl'][0]:.1f} | {r['onednn'][0]:.1f} | {r['mkl'][1]:.1f} | "
                  f"{r['onednn'][1]:.1f} |")
    print("\nlimit = the fastest of these per CPU-second at that thread count: "
          + ", ".join(f"{t} thread(s): {limits[t]:.1f} GFLOP/s" for t in threads))
    print("\n### Gradient steps: achieved share of the limit, before (d3rlpy) and after (no-grad passes fused)\n")
    print("| threads | scenario | algorithm | GFLOP per step | CPU ms before | CPU ms after | wall ms before | "
          "wall ms after | GFLOP/CPU-s before | after | share of limit before | after | after / before (CPU) | "
          "floor: GFLOP / limit (CPU ms) | most speed-up left (before / floor) |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in threads:
        for key, (*_, flops) in built.items():
            (cb, wb), (ca, wa) = steps[t, key]["before"], steps[t, key]["after"]
            gb, ga = flops / 1e9 / (cb / 1e3), flops / 1e9 / (ca / 1e3)
            print(f"| {t} | {key[0]} | {key[1]} | {flops / 1e9:.2f} | {cb:.1f} | {ca:.1f} | {wb:.1f} | {wa:.1f} | "
                  f"{gb:.1f} | {ga:.1f} | {gb / limits[t]:.0%} | {ga / limits[t]:.0%} | {cb / ca:.2f}x | "
                  f"{flops / 1e6 / limits[t]:.1f} | {cb / (flops / 1e6 / limits[t]):.2f}x |")
    print("\nShare of a step's CPU time inside matmul operators (1 thread, before): "
          + ", ".join(f"{sc} {a} {v:.0%}" for (sc, a), v in shares.items()))
    if compiled:
        print(f"\n### torch.compile (inductor) of the critic and actor gradient functions, {threads[0]} thread(s)\n")
        print("| scenario | algorithm | compile wall (s) | compile CPU, this process (s) | CPU ms per step eager | "
              "compiled | compiled / eager |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for (sc, name), r in compiled.items():
            print(f"| {sc} | {name} | {r['compile wall s']:.0f} | {r['compile CPU s (this process)']:.1f} | "
                  f"{r['eager']:.1f} | {r['compiled']:.1f} | {r['compiled'] / r['eager']:.2f}x |")
    if omp:
        print(f"\n### Threads and OpenMP's waiting, each in a fresh process ({scenarios[0]}, {2 * args.steps} steps, "
              f"medians of 2 alternating runs)\n")
        print("| algorithm | setting | CPU ms per step | wall ms per step | wall / 1 thread's |")
        print("|---|---|---:|---:|---:|")
        for (name, label), r in omp.items():
            print(f"| {name} | {label} | {r['cpu_ms']:.1f} | {r['wall_ms']:.1f} | "
                  f"{r['wall_ms'] / omp[name, OMP_VARIANTS[0][0]]['wall_ms']:.2f}x |")
    for key, table in profiles.items():
        print(f"\n### torch.profiler: one {key[1].upper()} step on {key[0]}, {threads[0]} thread(s), before "
              f"(top operators by self CPU time)\n")
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
