"""Generation barriers at simulated cluster scale: a safety campaign with ``execution: sync`` vs
``execution: async`` on 2, 8 and 16 lightweight Ray rollout actors, in one run.

Each actor sleeps an injected per-episode delay before its rollouts (long-tailed: lognormal,
``--mean-delay-ms`` mean, ``--sigma`` spread; one fixed sequence indexed by the episode's place
in the campaign, so both modes sleep the same delays in all). A sleeping actor holds no core, so 16 of them
on a 2-core machine behave like 16 actors on nodes of their own whose episodes take that long
(MuJoCo episodes of 20 to 1,000 steps, an LLM call). The driver's work (the fuzzer, Parquet,
snapshots) is real. Per row:

* actor idle share: 1 − (time the actors spent on units) / (actors × the phase's wall time);
* driver ms per result: the driver's own time (wall time minus the time it waited for
  rollouts) per episode applied;
* test cases per second: episodes / wall time.

    python benchmarks/async_scaling.py                  # the table in docs/scaling.md
    python benchmarks/async_scaling.py --actors 2,8 --mean-delay-ms 100

Prints a Markdown table (and the settings). Needs ~16 × 300 MB of memory for the actors.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.campaign.config import campaign_from_dict  # noqa: E402
from orchestrator.campaign.safety import run_safety  # noqa: E402
from orchestrator.cluster.executor import Executor  # noqa: E402
from orchestrator.cluster.lifecycle import start_ray  # noqa: E402
from workers.rollout import RolloutWorker  # noqa: E402


def delayed_worker(mean_s: float, sigma: float, n_max: int = 1 << 16):
    """A RolloutWorker that first sleeps each episode's delay (defined here, in ``__main__``, so
    Ray ships it to the actors by value). The delays are one fixed lognormal sequence indexed by
    the episode's place in the campaign (unit number × unit size + index in the unit), so a sync
    and an async run of the same budget sleep exactly the same delays in all (common random
    numbers: the modes differ only in how the work is scheduled)."""
    rng = np.random.default_rng(12345)
    # lognormal with the given mean: exp(N(mu, sigma)), mu = ln(mean) - sigma^2 / 2
    sequence = rng.lognormal(np.log(mean_s) - sigma**2 / 2, sigma, n_max)

    class DelayedWorker(RolloutWorker):
        busy = 0.0
        stride = 0  # episodes per unit (sync: the generation size; async: the unit size)

        def configure(self, stride: int) -> bool:
            self.stride = int(stride)
            return True

        def run(self, initial_states, *, seed: int = 0, state_offset: int = 0, repeats: int = 1, **kw):
            t0 = time.perf_counter()
            n = int(np.asarray(initial_states).shape[0])
            first = int(seed) * self.stride + int(state_offset)  # campaign seed 0: unit seed = unit number
            idx = np.arange(first, first + n) % n_max
            time.sleep(float(sequence[idx].sum()) * int(repeats))  # the actor runs its episodes one after another
            out = super().run(initial_states, seed=seed, state_offset=state_offset, repeats=repeats, **kw)
            self.busy += time.perf_counter() - t0
            return out

        def busy_seconds(self) -> float:
            return self.busy

    return DelayedWorker


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", default="2,8,16")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--scenario", default="MountainCar-v0")
    ap.add_argument("--aut", default="python:workers.examples:mountaincar_energy")
    ap.add_argument("--fuzzer", default="curefuzz")
    ap.add_argument("--episodes-per-actor", type=int, default=32, help="budget = this × actors (at least --min-episodes)")
    ap.add_argument("--min-episodes", type=int, default=256)
    ap.add_argument("--generation-size", type=int, default=64)
    ap.add_argument("--mean-delay-ms", type=float, default=300.0)
    ap.add_argument("--sigma", type=float, default=1.2)
    args = ap.parse_args(argv)
    actors = [int(a) for a in args.actors.split(",")]
    modes = args.modes.split(",")
    worker_cls = delayed_worker(args.mean_delay_ms / 1000.0, args.sigma)
    t_all = time.perf_counter()
    start_ray(num_cpus=max(actors), dashboard=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in actors:
            base = {"scenario": args.scenario, "aut": args.aut, "workers": w, "mlflow": False, "seed": 0}
            scenario = campaign_from_dict({**base, "name": "probe", "output": f"{tmp}/probe"}).build_scenario()
            t0 = time.perf_counter()
            ex = Executor(scenario, {"aut": args.aut}, workers=w, batch_size=256, worker_cls=worker_cls,
                          reason="benchmark", name=f"async-scaling/w{w}")
            startup = time.perf_counter() - t0
            try:
                for mode in modes:
                    budget = max(args.min_episodes, args.episodes_per_actor * w)
                    c = campaign_from_dict({**base, "name": f"w{w}-{mode}", "output": f"{tmp}/w{w}-{mode}",
                                            "safety": {"fuzzer": args.fuzzer, "budget": {"episodes": budget},
                                                       "generation_size": args.generation_size,
                                                       "execution": mode}})
                    # sync: unit = one generation (sampling 0.25 × budget: a multiple of it here)
                    stride = args.generation_size if mode == "sync" else ex.unit_size(args.generation_size)
                    ex.call_workers("configure", stride)
                    before = sum(ex.call_workers("busy_seconds"))
                    s = run_safety(c, progress=False, executor=ex)
                    busy = sum(ex.call_workers("busy_seconds")) - before
                    wall = s["wall_seconds"]
                    rows.append({"actors": w, "mode": mode, "episodes": s["episodes"], "wall": wall,
                                 "idle": 1.0 - busy / (w * wall), "driver_ms": 1000 * (wall - s["rollout_seconds"])
                                 / s["episodes"], "eps": s["episodes"] / wall, "startup": startup,
                                 "unit": s.get("unit_size", ""), "window": s.get("window", "")})
                    print(f"  {w} actors, {mode}: {s['episodes']} episodes in {wall:.1f} s", file=sys.stderr)
            finally:
                ex.close()
    print(f"{args.fuzzer} safety campaign on {args.scenario} ({args.aut}), generation_size {args.generation_size}; "
          f"injected per-episode delay: lognormal, mean {args.mean_delay_ms:g} ms, sigma {args.sigma:g}; "
          f"budget max({args.min_episodes}, {args.episodes_per_actor} × actors) episodes; total {time.perf_counter() - t_all:.0f} s\n")
    print("| actors | execution | episodes | wall s | actor idle share | driver ms per result | test cases/s |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['actors']} | {r['mode']} | {r['episodes']} | {r['wall']:.1f} | {r['idle']:.0%} | "
              f"{r['driver_ms']:.2f} | {r['eps']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
