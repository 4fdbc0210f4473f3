"""``deltarl scenarios | rollout | evaluate``: the scenarios, and policies run from chosen initial states.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

from orchestrator.cli.common import UsageError, out_arg, positive_int, seed_arg


def cmd_scenarios(args) -> int:
    from envs import SCENARIOS, get_scenario
    from envs.gym.spec import spec_files, summarize_spec_file

    infos = [get_scenario(n).describe() for n in SCENARIOS]
    gyms = [summarize_spec_file(name, path) for name, path in spec_files()]
    if args.json:
        print(json.dumps(infos + gyms, indent=2))
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
        _gym_markdown(gyms)
        return 0
    _builtin_text(infos)
    _gym_text(gyms)
    return 0


def _builtin_text(infos) -> None:
    for info in infos:
        print(f"{info['name']}  (reference env {info['env_id']}; obs {info['obs_dim']}, action {info['action']}, "
              f"{info['max_steps']} steps{', stochastic' if info['stochastic'] else ''})")
        print(f"  failure: {info['failure']}; distinct bugs on a grid of {info['grid_intervals']} intervals per dimension")
        for s in info["state"]:
            print(f"    {s['name']:<16} [{s['low']:+.4g}, {s['high']:+.4g}]  {s['meaning']}")
        print()


GYM_HEAD = ("Gymnasium environments with a state spec (scenario: gym:<id>; any other Gymnasium id works too "
            "with a spec of your own, docs/scenarios.md 'Test your own environment'; each is built, with its "
            "trust checks, when a command first uses it):")


def _dims(d) -> str:
    kind = "integer " if d["integer"] else ""
    return f"[{d['low']:+.4g}, {d['high']:+.4g}] {kind}"


def _gym_text(gyms) -> None:
    if not gyms:
        return
    print(GYM_HEAD + "\n")
    for g in gyms:
        if "error" in g:
            print(f"{g['name']}  (spec {g['spec']}): {g['error']}\n")
            continue
        needs = f"; needs {', '.join(g['imports'])}" if g["imports"] else ""
        print(f"{g['name']}  (env {g['env_id']}; spec {g['spec']}{needs})")
        print(f"  failure: {g['failure']}; setter {g['setter']}; sampler {g['sampler']}")
        if g["description"]:
            print(textwrap.fill(g["description"], 110, initial_indent="  ", subsequent_indent="  "))
        if g["state_auto"]:
            print("    state read from the environment by its setter (bounds from 256 resets)")
        for d in g["state"]:
            print(f"    {d['name']:<16} {_dims(d)} {d['meaning']}")
        print()


def _gym_markdown(gyms) -> None:
    for g in gyms:
        print(f"### {g['name']}\n")
        if "error" in g:
            print(f"Spec `{g['spec']}`: {g['error']}\n")
            continue
        print(f"Environment `{g['env_id']}` (spec `{g['spec']}`); setter {g['setter']}, sampler {g['sampler']}. "
              f"Failure: {g['failure']}.{' ' + g['description'] if g['description'] else ''}\n")
        if g["state_auto"]:
            print("State: read from the environment by its setter (bounds from 256 resets).\n")
            continue
        print("| state | low | high | meaning |\n|---|---:|---:|---|")
        for d in g["state"]:
            print(f"| `{d['name']}`{' (integer)' if d['integer'] else ''} | {d['low']:.4g} | {d['high']:.4g} | "
                  f"{d['meaning']} |")
        print()


def _load_states(path: str, scenario):
    import numpy as np

    p = Path(path)
    if not p.exists():
        raise UsageError(f"--states {path}: no such file; give a .npy file or a CSV with one initial state per row")
    try:
        arr = np.load(p, allow_pickle=False) if p.suffix == ".npy" else _read_states_csv(p, scenario)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's file
        raise UsageError(f"--states {path}: could not read it ({exc}); {_csv_format(scenario)}") from exc
    if arr.size == 0:
        raise UsageError(f"--states {path}: holds no initial state (shape {arr.shape}); {_csv_format(scenario)}")
    return scenario.validate(arr)


def _csv_format(scenario) -> str:
    names = ",".join(scenario.state_names)
    return (f"give a .npy array (N, {len(scenario.state_names)}) or a CSV with one initial state per row, "
            f"optionally under the header `deltarl scenarios` prints for {scenario.name}: {names}")


def _read_states_csv(path: Path, scenario):
    """A CSV of initial states: numbers only, or a first row naming the state dimensions (the names
    ``deltarl scenarios`` prints, in any order; ``s_<name>`` as in failures.parquet also reads).
    Blank lines and lines starting with ``#`` are skipped."""
    import csv

    import numpy as np

    with path.open(newline="") as f:
        rows = [[c.strip() for c in r] for r in csv.reader(f) if r and not r[0].lstrip().startswith("#")]
    rows = [r for r in rows if any(r)]
    if not rows:
        return np.zeros((0, len(scenario.state_names)))
    header, order = rows[0], None
    if not all(_is_number(c) for c in header):
        names = list(scenario.state_names)
        given = [c[2:] if c.startswith("s_") and c[2:] in names else c for c in header]
        if sorted(given) != sorted(names):
            raise UsageError(f"--states {path}: the header {','.join(header)} does not name {scenario.name}'s "
                             f"state dimensions; {_csv_format(scenario)}")
        order, rows = [given.index(n) for n in names], rows[1:]
    arr = np.array([[float(c) for c in r] for r in rows], dtype=np.float64).reshape(len(rows), -1)
    return arr[:, order] if order is not None else arr


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def cmd_rollout(args) -> int:
    import numpy as np

    from envs import get_scenario
    from orchestrator.campaign.rollouts import record_rollouts

    # 1. validate everything before anything is written or Ray is started
    scenario = get_scenario(args.scenario)
    if args.states:
        states = _load_states(args.states, scenario)
    else:
        if args.episodes is None or args.episodes < 1:
            raise UsageError("--episodes must be a positive number (or give --states FILE)")
        rng = np.random.default_rng(args.seed)
        states = scenario.sample(rng, args.episodes)
    from orchestrator.cluster.executor import resolve_workers

    try:
        workers = args.workers if args.workers.strip().lower() == "auto" else int(args.workers)
    except ValueError:
        raise UsageError(f"--workers must be auto or an integer >= 0, got {args.workers!r}") from None
    if workers != "auto" and workers < 0:
        raise UsageError(f"--workers must be auto or an integer >= 0, got {args.workers}")
    workers, why = resolve_workers(workers, episodes=int(states.shape[0]))
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError(f"--max-steps must be >= 1, got {args.max_steps}")
    summary = record_rollouts(scenario, args.policy, states, args.out, workers=workers,
                              batch_size=args.batch_size, seed=args.seed, max_steps=args.max_steps,
                              dashboard=args.dashboard, progress=not args.quiet)
    wall, startup = summary["wall_seconds"], summary["startup_seconds"]
    print(
        f"{scenario.name}: {summary['episodes']} episodes, {summary['steps']} steps in {wall:.1f} s "
        f"({summary['episodes_per_second']:.1f} episodes/s"
        + (f"; Ray cluster and {workers} workers started in {startup:.1f} s" if startup else "")
        + ")\n"
        f"  ran         {'in this process' if not workers else f'on {workers} Ray rollout actors'} ({why})\n"
        f"  mean return {summary['mean_return']:.2f} ± {summary['ci95_margin']:.2f} (95% CI)\n"
        f"  failures    {summary['failures']} / {summary['episodes']} ({100 * summary['failure_rate']:.1f}%; "
        f"{scenario.failure_rule})\n"
        f"  Parquet     {Path(args.out) / 'steps'}  and  {Path(args.out) / 'episodes'}\n"
        f"  summary     {Path(args.out) / 'summary.json'}"
    )
    return 0


def cmd_evaluate(args) -> int:
    from envs import get_scenario
    from orchestrator.analysis.evaluation import evaluate_policy

    if args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    scenario = get_scenario(args.scenario)
    ev = evaluate_policy(scenario, args.policy, args.episodes, args.seed)
    if args.json:
        print(json.dumps(ev, indent=2))
        return 0
    lo, hi = ev["success_wilson95"]
    print(f"{scenario.name} | {args.policy}\n"
          f"  mean return  {ev['mean_return']:.1f} ± {ev['ci95_margin']:.1f}  (95% CI margin, {args.episodes} episodes, seed {args.seed})\n"
          f"  success rate {100 * ev['success_rate']:.1f}%  [{100 * lo:.1f}, {100 * hi:.1f}]  (95% Wilson; failure = {scenario.failure_rule})")
    return 0


def register(sub) -> None:
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
    p.add_argument("--states", default=None, metavar="FILE",
                   help="initial states instead of sampling: a .npy array (N, state dims) or a CSV, one state per "
                        "row, optionally under a header of the state names `deltarl scenarios` prints (CartPole-v1: "
                        "x,x_dot,theta,theta_dot; any column order)")
    p.add_argument("--out", required=True, type=out_arg, help="run folder (must be new or empty)")
    p.add_argument("--workers", default="auto",
                   help="rollout actors on the Ray cluster; 0 runs in this process without Ray; auto (default): "
                        "in this process unless Ray pays (4+ CPUs and enough episodes, see workers: auto in "
                        "orchestrator/campaign/config.py)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="episodes per lockstep batch (default 256)")
    p.add_argument("--max-steps", type=int, default=None, help="step limit (default: the scenario's)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed for sampling and stochastic scenarios (default 0)")
    p.add_argument("--dashboard", action="store_true", help="start the Ray dashboard on 127.0.0.1:8265")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser(
        "evaluate",
        help="mean return ± 95%% CI and success rate (Wilson interval) of a policy",
        description="Evaluate a policy over N initial states from the scenario's reset distribution "
        "with the batched engine: mean return ± 95%% CI margin and success rate with its 95%% Wilson "
        "score interval (the columns of the Delta paper's Table 1).",
    )
    p.add_argument("--policy", required=True, help="policy URI (a file, python:module:attr, zoo:NAME, ...)")
    p.add_argument("--scenario", required=True, help="scenario name (see `deltarl scenarios`)")
    p.add_argument("--episodes", type=int, default=100, help="number of episodes (default 100)")
    p.add_argument("--seed", type=seed_arg, default=2024, help="seed of the initial states (default 2024, as the zoo cards)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_evaluate)
