"""The ``deltarl`` command line.

    deltarl scenarios                 list the scenarios and their initial-state spaces
    deltarl rollout --scenario S --policy URI --episodes N --out DIR
                                      run a policy from N initial states, write Parquet

Bad input (unknown scenario, invalid initial state, a policy that does not load or does not
fit, an output folder holding another run) ends with one message on stderr and exit code 2,
before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np

EXIT_BAD_INPUT = 2


class UsageError(ValueError):
    """Bad command-line input that no lower layer reports."""


def _bad_input_types() -> tuple:
    from envs import ScenarioError
    from orchestrator.store import StoreError
    from workers.policies import PolicyError

    return (ScenarioError, StoreError, PolicyError, UsageError)


# ---------------------------------------------------------------------------------------------
# deltarl scenarios
# ---------------------------------------------------------------------------------------------


def cmd_scenarios(args) -> int:
    from envs import SCENARIOS, get_scenario

    infos = [get_scenario(n).describe() for n in SCENARIOS]
    if args.json:
        print(json.dumps(infos, indent=2))
        return 0
    if args.markdown:
        for info in infos:
            print(f"### {info['name']}\n")
            print(f"Reference env `{info['env_id']}`; observation {info['obs_dim']}, action {info['action']}, "
                  f"{info['max_steps']} steps{'; stochastic' if info['stochastic'] else ''}. "
                  f"Failure: {info['failure']}. Distinct bugs: {info['grid_intervals']} intervals per dimension.\n")
            print("| state | low | high | meaning |\n|---|---:|---:|---|")
            for s in info["state"]:
                print(f"| `{s['name']}` | {s['low']:.4g} | {s['high']:.4g} | {s['meaning']} |")
            print()
        return 0
    for info in infos:
        print(f"{info['name']}  (reference env {info['env_id']}; obs {info['obs_dim']}, action {info['action']}, "
              f"{info['max_steps']} steps{', stochastic' if info['stochastic'] else ''})")
        print(f"  failure: {info['failure']}; distinct bugs on a grid of {info['grid_intervals']} intervals per dimension")
        for s in info["state"]:
            print(f"    {s['name']:<16} [{s['low']:+.4g}, {s['high']:+.4g}]  {s['meaning']}")
        print()
    return 0


# ---------------------------------------------------------------------------------------------
# deltarl rollout
# ---------------------------------------------------------------------------------------------


def _load_states(path: str, scenario) -> np.ndarray:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"--states {path}: no such file; give a .npy file or a CSV with one initial state per row")
    try:
        if p.suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
        else:
            arr = np.loadtxt(p, delimiter=",", ndmin=2, comments="#")
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's file
        raise UsageError(f"--states {path}: could not read it ({exc}); give a .npy file or a CSV of numbers") from exc
    return scenario.validate(arr)


def cmd_rollout(args) -> int:
    from tqdm import tqdm

    from envs import get_scenario
    from orchestrator.store import RunStore
    from workers.policies import load_policy
    from workers.rollout import RolloutResult, RolloutWorker

    # 1. validate everything before anything is written or Ray is started
    scenario = get_scenario(args.scenario)
    if args.states:
        states = _load_states(args.states, scenario)
    else:
        if args.episodes is None or args.episodes < 1:
            raise UsageError("--episodes must be a positive number (or give --states FILE)")
        rng = np.random.default_rng(args.seed)
        states = scenario.sample(rng, args.episodes)
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError(f"--max-steps must be >= 1, got {args.max_steps}")
    policy = load_policy(args.policy, scenario)  # raises PolicyError with the reason
    policy_uris = {"aut": args.policy}
    run_id = f"rollout-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    store = RunStore.create(args.out, scenario, run_id)  # refuses a folder holding another run

    # 2. run
    n = states.shape[0]
    startup = 0.0
    t0 = time.perf_counter()
    results = []
    bar = tqdm(total=n, unit="ep", desc=f"{scenario.name}", disable=args.quiet or None, file=sys.stderr)
    hashes = {"aut": getattr(policy, "sha256", "") or ""}
    if args.workers == 0:
        worker = RolloutWorker(scenario.name, policy_uris, batch_size=args.batch_size, torch_threads=None)
        chunk = args.batch_size
        for lo in range(0, n, chunk):
            res = worker.run(states[lo:lo + chunk], seed=args.seed, max_steps=args.max_steps, state_offset=lo)
            store.write(res, phase="rollout", iteration=lo // chunk, wall_time=time.perf_counter() - t0,
                        policy_sha256=hashes)
            results.append(res)
            bar.update(res.n_episodes)
    else:
        from orchestrator.driver import RolloutPool, start_ray

        t_start = time.perf_counter()
        start_ray(num_cpus=max(args.workers, os.cpu_count() or 1), dashboard=args.dashboard)
        pool = RolloutPool(scenario.name, policy_uris, workers=args.workers, batch_size=args.batch_size)
        startup = time.perf_counter() - t_start
        t0 = time.perf_counter()  # episodes/s counts the rollouts, not Ray's start-up
        # several tasks per actor, each big enough to dwarf Ray's per-task overhead (~1.5 ms)
        chunk = max(1, min(4 * args.batch_size, -(-n // (args.workers * 4))))
        try:
            for i, (lo, res) in enumerate(pool.map(states, seed=args.seed, max_steps=args.max_steps, chunk=chunk)):
                store.write(res, phase="rollout", iteration=i, wall_time=time.perf_counter() - t0,
                            policy_sha256=hashes)
                results.append(res)
                bar.update(res.n_episodes)
        finally:
            pool.shutdown()
    bar.close()
    wall = time.perf_counter() - t0

    # 3. summarise
    summary = RolloutResult.concat(results).summary()
    summary.update(
        run_id=run_id,
        scenario=scenario.name,
        policy=args.policy,
        policy_sha256=hashes["aut"],
        workers=args.workers,
        seed=args.seed,
        wall_seconds=wall,
        startup_seconds=startup,
        episodes_per_second=n / wall if wall > 0 else float("inf"),
    )
    _write_json_atomic(Path(args.out) / "summary.json", summary)
    print(
        f"{scenario.name}: {summary['episodes']} episodes, {summary['steps']} steps in {wall:.1f} s "
        f"({summary['episodes_per_second']:.1f} episodes/s"
        + (f"; Ray cluster and {args.workers} workers started in {startup:.1f} s" if startup else "")
        + ")\n"
        f"  mean return {summary['mean_return']:.2f} ± {summary['ci95_margin']:.2f} (95% CI)\n"
        f"  failures    {summary['failures']} / {summary['episodes']} ({100 * summary['failure_rate']:.1f}%; "
        f"{scenario.failure_rule})\n"
        f"  Parquet     {Path(args.out) / 'steps'}  and  {Path(args.out) / 'episodes'}\n"
        f"  summary     {Path(args.out) / 'summary.json'}"
    )
    return 0


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, default=float))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# parser
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deltarl",
        description="Test deep-RL agents: run them from chosen initial states, fuzz them for failures, "
        "and find where a challenger does better. Runs on a local Ray cluster by default.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `deltarl COMMAND --help` for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("scenarios", help="list the scenarios and their initial-state spaces",
                       description="List every scenario: initial-state vector (names, bounds, meaning), "
                       "observation and action spaces, failure oracle and the grid for distinct bugs.")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON instead of a table")
    fmt.add_argument("--markdown", action="store_true", help="print Markdown tables (docs/scenarios.md)")
    p.set_defaults(func=cmd_scenarios)

    p = sub.add_parser(
        "rollout",
        help="run a policy from many initial states and record the episodes as Parquet",
        description="Run a policy from N initial states drawn from the scenario's reset distribution "
        "(or given with --states), in lockstep batches on a pool of Ray rollout actors, and write "
        "every step and episode as Parquet under --out.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Policy URIs:\n"
        "  path/to/model.d3            a d3rlpy model\n"
        "  path/to/policy.pt           TorchScript (Q-values/logits -> argmax; continuous -> clipped)\n"
        "  path/to/policy.onnx         ONNX\n"
        "  path/to/model.zip           Stable-Baselines3 (pip install 'deltarl[sb3]')\n"
        "  python:module:attr          a black-box agent: an object with act(obs) or a callable\n"
        "  random:SEED                 uniform random actions\n\n"
        "Example:\n"
        "  deltarl rollout --scenario CartPole-v1 --policy python:workers.examples:cartpole_balancer \\\n"
        "      --episodes 1000 --out runs/cartpole-demo",
    )
    p.add_argument("--scenario", required=True, help="scenario name (see `deltarl scenarios`)")
    p.add_argument("--policy", required=True, help="policy URI (see below)")
    p.add_argument("--episodes", type=int, default=None, help="number of initial states to sample")
    p.add_argument("--states", default=None, help="initial states from a .npy or CSV file instead of sampling")
    p.add_argument("--out", required=True, help="run folder (must be new or empty)")
    p.add_argument("--workers", type=int, default=2,
                   help="rollout actors on the Ray cluster (default 2); 0 runs in this process without Ray")
    p.add_argument("--batch-size", type=int, default=256, help="episodes per lockstep batch (default 256)")
    p.add_argument("--max-steps", type=int, default=None, help="step limit (default: the scenario's)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling and stochastic scenarios (default 0)")
    p.add_argument("--dashboard", action="store_true", help="start the Ray dashboard on 127.0.0.1:8265")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_rollout)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args) or 0)
    except _bad_input_types() as exc:
        print(f"deltarl: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `deltarl scenarios | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
