"""Fuzzer overhead: time per episode spent outside rollouts, beside the rollout time.

    python benchmarks/fuzzer_overhead.py [--fuzzers random mdpfuzz curefuzz gmt] [--generations 8]

For each fuzzer on CartPole-v1 and Hopper-v5, a campaign of G generations of n = 64 proposals
(the default generation size) runs in this process: the sampling phase for the first quarter,
then fuzzing. Time in ``propose`` + ``observe`` (selection, mutation, curiosity / GMM / diffusion
updates, corpus) is the fuzzer's overhead; time in the batched engine is the rollout time. The
AUT is the zoo agent when the zoo has one, else a 256x256 MLP with random weights. Rollouts go
through the executor (``orchestrator.cluster.executor.Executor``, ``workers=0``: in this process,
no Ray), as in a campaign. One torch thread. The peers' MDPFuzz spends more time in its GMM than in testing; the target here is an
overhead below the rollout time for every fuzzer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs import get_scenario
from orchestrator.cluster.executor import Executor
from orchestrator.fuzzers import Feedback, make_fuzzer
from workers.policies import PolicyError, export_mlp_torchscript, load_policy


def aut_for(scenario, tmp: Path) -> tuple[str, object, str]:
    """(policy URI, the loaded policy, a label for the table)."""
    try:
        uri = f"zoo:{scenario.name}"
        return uri, load_policy(uri, scenario, device="cpu"), uri
    except PolicyError:
        spec = scenario.action
        uri = str(tmp / f"{scenario.name}.pt")
        export_mlp_torchscript(uri, scenario.obs_dim, spec.size, hidden=(256, 256), seed=0, discrete=spec.discrete,
                               action_low=None if spec.discrete else 0.1 * spec.low,
                               action_high=None if spec.discrete else 0.1 * spec.high)
        return uri, load_policy(uri, scenario, device="cpu"), "random-weight MLP"


def measure(name, scenario, executor, generations, n):
    fz = make_fuzzer(name, scenario, seed=0)
    t_fuzz = t_roll = 0.0
    episodes = 0
    for g in range(generations):
        if g == max(1, generations // 4):
            fz.start_phase("fuzzing")
        t0 = time.perf_counter()
        p = fz.propose(n)
        t1 = time.perf_counter()
        res = executor.run(p.states, seed=g)
        t2 = time.perf_counter()
        fz.observe(p, Feedback.from_result(res))
        t3 = time.perf_counter()
        t_fuzz += (t1 - t0) + (t3 - t2)
        t_roll += t2 - t1
        episodes += len(p)
    return episodes, t_roll / episodes, t_fuzz / episodes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fuzzers", nargs="+", default=["random", "mdpfuzz", "curefuzz", "gmt"])
    ap.add_argument("--scenarios", nargs="+", default=["CartPole-v1", "Hopper-v5"])
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--n", type=int, default=64)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="deltarl-fuzz-bench-"))
    print("| scenario | AUT | fuzzer | episodes | rollout ms/episode | fuzzer ms/episode | overhead / rollout |")
    print("|---|---|---|---:|---:|---:|---:|")
    for sname in args.scenarios:
        sc = get_scenario(sname)
        uri, policy, label = aut_for(sc, tmp)
        with Executor(sc, {"aut": uri}, workers=0, policies={"aut": policy}) as ex:
            for name in args.fuzzers:
                eps, roll, fuzz = measure(name, sc, ex, args.generations, args.n)
                print(f"| {sname} | {label} | {name} | {eps} | {1e3 * roll:.2f} | {1e3 * fuzz:.2f} | {fuzz / roll:.2f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
