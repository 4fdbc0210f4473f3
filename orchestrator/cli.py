"""The ``deltarl`` command line.

    deltarl scenarios                 list the scenarios and their initial-state spaces
    deltarl rollout --scenario S --policy URI --episodes N --out DIR
                                      run a policy from N initial states, write Parquet
    deltarl evaluate | train-aut | zoo-add | train-challenger
                                      agents: score, train, ship, train a challenger on D
    deltarl run CAMPAIGN.yaml         safety -> challenger -> optimality (any fuzzer, LLMTester too)
    deltarl grid GRID.yaml --profile local|paper
                                      many campaigns as Ray tasks (the papers' tables)
    deltarl repair RUN_DIR            fine-tune the AUT on the challenger's better trajectories
    deltarl report RUN_OR_GRID_DIR    report.md + a self-contained report.html
    deltarl replay | submit | jobs | logs | stop
                                      re-run a bug; campaigns as Ray Jobs on a cluster

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
    from orchestrator.campaign import CampaignError
    from orchestrator.fuzzers import FuzzerError
    from workers.training import TrainingError
    from orchestrator.grid import GridError
    from orchestrator.jobs import JobError
    from workers.llm import LLMConfigError, LLMFatalError

    return (ScenarioError, StoreError, PolicyError, TrainingError, CampaignError, FuzzerError, GridError, JobError,
            LLMConfigError, LLMFatalError, UsageError)


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
    from orchestrator.stats import mean_ci
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
    pool = None
    if args.workers == 0:
        worker = RolloutWorker(scenario.name, policy_uris, batch_size=args.batch_size)
        chunk = args.batch_size
        chunks = (worker.run(states[lo:lo + chunk], seed=args.seed, max_steps=args.max_steps, state_offset=lo)
                  for lo in range(0, n, chunk))
    else:
        from orchestrator.driver import RolloutPool, start_ray

        t_start = time.perf_counter()
        start_ray(num_cpus=max(args.workers, os.cpu_count() or 1), dashboard=args.dashboard)
        pool = RolloutPool(scenario.name, policy_uris, workers=args.workers, batch_size=args.batch_size)
        startup = time.perf_counter() - t_start
        t0 = time.perf_counter()  # episodes/s counts the rollouts, not Ray's start-up
        # several tasks per actor, each big enough to dwarf Ray's per-task overhead (~1.5 ms)
        chunk = max(1, min(4 * args.batch_size, -(-n // (args.workers * 4))))
        chunks = (res for _, res in pool.map(states, seed=args.seed, max_steps=args.max_steps, chunk=chunk))
    try:
        for i, res in enumerate(chunks):
            store.write(res, phase="rollout", iteration=i, wall_time=time.perf_counter() - t0, policy_sha256=hashes)
            results.append(res)
            bar.update(res.n_episodes)
    finally:
        if pool is not None:
            pool.shutdown()
    bar.close()
    wall = time.perf_counter() - t0

    # 3. summarise
    all_results = RolloutResult.concat(results)
    summary = all_results.summary()
    summary["ci95_margin"] = mean_ci(all_results.returns)[1]
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


def cmd_evaluate(args) -> int:
    from envs import get_scenario
    from orchestrator.evaluation import evaluate_policy

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


def cmd_train_aut(args) -> int:
    import dataclasses

    from orchestrator import tracking
    from workers.training import AutTrainConfig, latest_checkpoint, train_aut_job

    preset = Path(args.config) if args.config else Path(__file__).resolve().parents[1] / "experiments" / "aut" / f"{args.scenario}-{args.algo}.yaml"
    overrides = {"steps": args.steps, "seed": args.seed, "scenario": args.scenario, "algo": args.algo,
                 "steps_per_epoch": args.steps_per_epoch}
    if preset.is_file():
        cfg = AutTrainConfig.from_file(preset, **overrides)
    elif args.config:
        raise UsageError(f"--config {args.config}: no such file")
    else:
        cfg = AutTrainConfig(**{k: v for k, v in overrides.items() if v is not None})
    cfg.validate()
    out = Path(args.out)
    if args.resume and latest_checkpoint(out) is None:
        raise UsageError(f"--resume: {out} holds no checkpoint to resume from")
    if not args.resume and latest_checkpoint(out) is not None:
        raise UsageError(f"{out} already holds a training run; add --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    run = tracking.start_run(out, "aut-training", f"{cfg.scenario}-{cfg.algo}-s{cfg.seed}",
                             params={"config": dataclasses.asdict(cfg), "resume": args.resume},
                             tags={"deltarl.kind": "aut-training", "scenario": cfg.scenario})
    t0 = time.perf_counter()
    try:
        state = train_aut_job(cfg, out, resume=args.resume, tracking=run, progress=not args.quiet)
    except BaseException:
        tracking.end_run(run, "FAILED")
        raise
    card = write_model_card(out, cfg, state, eval_episodes=args.eval_episodes, wall=time.perf_counter() - t0)
    tracking.log_metrics(run, {"final_mean_return": card["evaluation"]["mean_return"],
                               "final_success_rate": card["evaluation"]["success_rate"]}, step=state["step"])
    tracking.log_artifact(run, out / "card.json")
    tracking.end_run(run)
    ev = card["evaluation"]
    print(f"{cfg.algo} on {cfg.scenario}: {state['step']} steps, {state['wall_seconds']:.0f} s of training\n"
          f"  mean return  {ev['mean_return']:.1f} ± {ev['ci95_margin']:.1f} over {ev['episodes']} episodes\n"
          f"  success rate {100 * ev['success_rate']:.1f}%\n"
          f"  model        {out / 'model.d3'}  (TorchScript: {out / 'policy.pt'})\n"
          f"  card         {out / 'card.json'}\n"
          f"  MLflow       mlflow ui --backend-store-uri {run['tracking_uri']}")
    return 0


def cmd_run(args) -> int:
    from orchestrator.campaign import campaign_from_dict, load_campaign
    from orchestrator.pipeline import run_campaign, summary_table

    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "campaign.json").is_file():
            raise UsageError(f"--resume {run_dir}: not a campaign run folder (no campaign.json)")
        campaign = campaign_from_dict(json.loads((run_dir / "campaign.json").read_text()), str(run_dir / "campaign.json"))
        campaign.output = str(run_dir)
    elif args.campaign_env:  # a Ray Job: the resolved campaign comes in the job's environment
        if not os.environ.get(args.campaign_env):
            raise UsageError(f"--campaign-env {args.campaign_env}: the variable is not set")
        campaign = campaign_from_dict(json.loads(os.environ[args.campaign_env]), args.campaign_env)
        if args.out:
            campaign.output = args.out
        if (Path(campaign.output) / "campaign.json").is_file():  # a resubmitted or retried job continues
            args.resume = campaign.output
    else:
        if not args.campaign:
            raise UsageError("give a campaign file (deltarl run CAMPAIGN.yaml) or --resume RUN_DIR")
        campaign = load_campaign(args.campaign, output=args.out)
    if (campaign.workers > 0 or campaign.challenger is not None) and not args.no_dashboard \
            and os.environ.get("DELTARL_DASHBOARD", "1") != "0":
        from orchestrator.driver import start_ray

        start_ray(num_cpus=max(campaign.workers, os.cpu_count() or 1), dashboard=True)
        if not args.quiet:
            print("Ray dashboard: http://127.0.0.1:8265 (actors, jobs, logs, metrics)", file=sys.stderr)
    results = run_campaign(campaign, resume=bool(args.resume), progress=not args.quiet)
    print(f"{campaign.name}: {campaign.scenario}, AUT {campaign.aut}\n")
    print(summary_table(results))
    return 0


def cmd_grid(args) -> int:
    from orchestrator.grid import expand, load_grid, markdown_table, run_grid

    grid = load_grid(args.grid, profile=args.profile)
    if args.out:
        grid["output"] = args.out
    if args.dry_run:
        for point, c in expand(grid):
            print(f"{c.name}: {point} -> {c.output}")
        return 0
    df = run_grid(grid, progress=not args.quiet)
    print(markdown_table(df))
    out = Path(grid["output"])
    print(f"table   {out / 'results.parquet'}\nMLflow  mlflow ui --backend-store-uri sqlite:///{out.resolve() / 'mlflow.db'}")
    return 0 if (df["status"] == "done").all() else 1


def cmd_submit(args) -> int:
    from orchestrator import jobs
    from orchestrator.campaign import load_campaign

    campaign = load_campaign(args.campaign, output=args.out)
    job_id = jobs.submit(campaign, address=args.address, submission_id=args.id, num_gpus=args.num_gpus)
    print(f"submitted {job_id} ({campaign.name}) to {jobs.dashboard_address(args.address)}\n"
          f"  output  {campaign.output}\n  logs    deltarl logs {job_id}\n  stop    deltarl stop {job_id}")
    if args.wait:
        s = jobs.wait(job_id, args.address)
        print(f"{job_id}: {s}")
        return 0 if s == "SUCCEEDED" else 1
    return 0


def cmd_jobs(args) -> int:
    from orchestrator import jobs

    rows = jobs.list_jobs(args.address)
    print("| job | status | campaign | output |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['job_id']} | {r['status']} | {r['campaign']} | {r['output']} |")
    return 0


def cmd_logs(args) -> int:
    from orchestrator import jobs

    print(jobs.logs(args.job_id, args.address), end="")
    return 0


def cmd_stop(args) -> int:
    from orchestrator import jobs

    print(f"{args.job_id}: {'stop requested' if jobs.stop(args.job_id, args.address) else 'already ended'}")
    return 0


def cmd_replay(args) -> int:
    from orchestrator.optimality import replay

    r = replay(args.run_dir, args.bug_id)
    state = ", ".join(f"{n}={v:.4g}" for n, v in zip(r["state_names"], r["initial_state"]))
    print(f"bug {r['bug_id']}: {state}\n"
          f"  AUT         {r['aut_return']:.2f}  (recorded {r['recorded_aut_return']:.2f})\n"
          f"  challenger  {r['ca_return']:.2f}  (recorded {r['recorded_ca_return']:.2f})\n"
          f"  {'reproduced' if r['reproduced'] else 'NOT reproduced: the returns differ from the record'}")
    return 0 if r["reproduced"] else 1


def cmd_report(args) -> int:
    from orchestrator.report import ReportError, write_report

    try:
        out = write_report(args.path, args.out, max_sequences=args.max_sequences)
    except ReportError as exc:
        print(f"deltarl: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{out['tables']} tables, {out['figures']} figures\n  {out['markdown']}\n  {out['html']}  (self-contained)")
    return 0


def _print_challenger(card: dict, out: Path) -> None:
    ev = card["evaluation"]
    lines = [f"{card['algorithm']} challenger on {card['scenario']}: {card['steps']} gradient steps on "
             f"{card['dataset']['transitions']} transitions ({card['dataset']['episodes']} AUT episodes), "
             f"{card['training_wall_seconds']:.0f} s of training",
             f"  challenger   {ev['mean_return']:.1f} ± {ev['ci95_margin']:.1f}, success "
             f"{100 * ev['success_rate']:.0f}% [{100 * ev['success_wilson95'][0]:.1f}, {100 * ev['success_wilson95'][1]:.1f}]"]
    if card.get("aut"):
        a = card["aut"]["evaluation"]
        t = card["aut"].get("training_wall_seconds")
        lines.append(f"  AUT          {a['mean_return']:.1f} ± {a['ci95_margin']:.1f}, success "
                     f"{100 * a['success_rate']:.0f}% [{100 * a['success_wilson95'][0]:.1f}, {100 * a['success_wilson95'][1]:.1f}]"
                     + (f", trained in {t:.0f} s" if t else ""))
        r = card["return_vs_aut"]["ratio"]
        if r is not None:
            lines.append(f"  ratio        {100 * r:.1f}% of the AUT's mean return ({ev['episodes']} episodes, same starts)")
    lines += [f"  model        {out / 'model.d3'}", f"  card         {out / 'card.json'}"]
    print("\n".join(lines))


def cmd_train_challenger(args) -> int:
    from orchestrator.challenger import challenger_dir, train_run_challenger

    if args.eval_episodes < 1:
        raise UsageError(f"--eval-episodes must be >= 1, got {args.eval_episodes}")
    out = Path(args.out) if args.out else challenger_dir(args.data, args.algo)
    card = train_run_challenger(args.data, args.algo, preset=args.preset, steps=args.steps, seed=args.seed,
                                out=out, resume=args.resume, eval_episodes=args.eval_episodes,
                                progress=not args.quiet)
    _print_challenger(card, out)
    return 0


def cmd_zoo_add(args) -> int:
    from orchestrator.zoo import add_to_zoo

    try:
        dest = add_to_zoo(args.training_dir)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    print(f"added {dest} (index: {dest.parent / 'README.md'})")
    return 0


def write_model_card(out: Path, cfg, state: dict, *, eval_episodes: int = 100, wall: float = 0.0) -> dict:
    """Export TorchScript, evaluate over ``eval_episodes`` and write ``card.json`` (whole)."""
    import dataclasses
    import hashlib

    import d3rlpy

    from envs import get_scenario

    algo = d3rlpy.load_learnable(str(out / "model.d3"), device="cpu:0")
    from orchestrator.evaluation import evaluate_policy

    algo.save_policy(str(out / "policy.pt"))
    scenario = get_scenario(cfg.scenario)
    ev = evaluate_policy(scenario, str(out / "policy.pt"), eval_episodes, seed=2024, device="cpu")
    card = {
        "agent": f"{cfg.scenario}-{cfg.algo}",
        "scenario": cfg.scenario,
        "algorithm": {"ddqn": "DoubleDQN", "sac": "SAC"}[cfg.algo] + " (d3rlpy " + d3rlpy.__version__ + ")",
        "config": dataclasses.asdict(cfg),
        "steps": state["step"],
        "selected": state.get("best"),  # model.d3 = the best epoch by the training-time evaluation
        "seed": cfg.seed,
        "training_wall_seconds": state["wall_seconds"],
        "wall_seconds_incl_eval": wall,
        "evaluation": ev,
        "files": {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in ("model.d3", "policy.pt")},
    }
    _write_json_atomic(out / "card.json", card)
    return card


def _write_json_atomic(path: Path, obj) -> None:
    from orchestrator.store import atomic_write_bytes

    atomic_write_bytes(path, json.dumps(obj, indent=2, default=float).encode())


# ---------------------------------------------------------------------------------------------
# deltarl repair (Delta RQ4)
# ---------------------------------------------------------------------------------------------


def cmd_repair(args) -> int:
    from orchestrator.repair import repair_run
    from workers.repair import RepairConfig

    cfg = RepairConfig(**{k: v for k, v in {"steps": args.steps, "learning_rate": args.lr, "alpha": args.alpha,
                                            "batch_size": args.batch_size, "data": args.data,
                                            "seed": args.seed}.items() if v is not None})
    r = repair_run(args.run_dir, cfg, out=args.out, fuzz_budget=args.fuzz_budget, fuzz_fuzzer=args.fuzzer,
                   fuzz_workers=args.fuzz_workers, eval_episodes=args.eval_episodes, force=args.force,
                   progress=not args.quiet)
    print(Path(r["aut_improved"]).with_name("repair.md").read_text())
    print(f"files   {Path(r['aut_improved']).parent}/{{aut_improved.d3,repair.json,repair.md}}")
    return 0


def _add_repair_parser(sub) -> None:
    p = sub.add_parser(
        "repair",
        help="fine-tune the AUT with CQL on the challenger's superior trajectories (AUT-Improved)",
        description="Repair the AUT of an optimality run (Delta RQ4).\n\n"
        "D_superior = the challenger's trajectories from the bug states (bugs.parquet; read from\n"
        "steps/, re-run when not stored). The AUT's network, with its weights, is fine-tuned offline\n"
        "with CQL (Double DQN -> DiscreteCQL, SAC -> CQL) on D_superior (the paper) or D ∪ D_superior\n"
        "(--data union). Then AUT and AUT-Improved are compared: mean return ± 95% CI over 100 starts,\n"
        "failures on the known failure states of the safety phase, returns and remaining bugs on the\n"
        "bug states, and with --fuzz-budget a new safety campaign against each. Writes RUN_DIR/repair/:\n"
        "aut_improved.d3, policy.pt, repair.json, repair.md (Table 5).",
        epilog="Example:\n  deltarl run experiments/quickstart.yaml\n  deltarl repair runs/quickstart\n"
        "  deltarl evaluate --policy runs/quickstart/repair/aut_improved.d3 --scenario CartPole-v1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", help="a run folder with bugs.parquet (an optimality phase) and its challenger")
    p.add_argument("--data", choices=["superior", "union"], default=None,
                   help="fine-tuning data: superior = D_superior only (default, as the paper), union = D ∪ D_superior")
    p.add_argument("--steps", type=int, default=None, help="CQL gradient steps (default 3000)")
    p.add_argument("--lr", type=float, default=None, help="learning rate of the Q-function / critic (default 1e-4)")
    p.add_argument("--alpha", type=float, default=None, help="CQL conservative weight (default 1.0)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (default: the AUT's)")
    p.add_argument("--seed", type=int, default=None, help="fine-tuning seed (default 0)")
    p.add_argument("--eval-episodes", type=int, default=100, help="starts for the mean return (default 100)")
    p.add_argument("--fuzz-budget", type=int, default=None, metavar="N",
                   help="also fuzz AUT-Improved and the AUT for safety failures, N episodes each (default: skip)")
    p.add_argument("--fuzzer", default="curefuzz", help="the fuzzer of --fuzz-budget (default curefuzz)")
    p.add_argument("--fuzz-workers", type=int, default=0,
                   help="Ray rollout actors for --fuzz-budget (default 0: in this process, no Ray)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/repair)")
    p.add_argument("--force", action="store_true", help="replace an existing repair in the output folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_repair)


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
    p.add_argument("--seed", type=int, default=2024, help="seed of the initial states (default 2024, as the zoo cards)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "train-aut",
        help="train an agent under test (Double DQN or SAC, d3rlpy) as a Ray Train job",
        description="Train an agent under test with d3rlpy (Double DQN for discrete scenarios, SAC for "
        "continuous ones) as a Ray Train job: in this process on a CPU machine, on a GPU worker when "
        "the cluster has GPUs. Hyperparameters come from experiments/aut/SCENARIO-ALGO.yaml (or "
        "--config). Checkpoints every epoch under OUT/checkpoints; --resume continues from the last. "
        "Metrics go to MLflow (OUT/mlflow.db unless MLFLOW_TRACKING_URI is set); the end writes "
        "OUT/model.d3, OUT/policy.pt (TorchScript) and OUT/card.json.",
    )
    p.add_argument("--scenario", required=True)
    p.add_argument("--algo", required=True, choices=["ddqn", "sac"])
    p.add_argument("--steps", type=int, default=None, help="total environment steps (default: the preset's)")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="steps between checkpoints (default: the preset's)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--config", default=None, help="a training YAML instead of the preset")
    p.add_argument("--out", required=True, help="training folder")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--eval-episodes", type=int, default=100, help="episodes for the model card (default 100)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train_aut)

    p = sub.add_parser(
        "train-challenger",
        help="train a challenger (BC, BCQ or CQL, offline) on a safety run's record D",
        description="Train a challenger agent with offline RL (d3rlpy; discrete variants for discrete "
        "scenarios) on dataset D of a safety run: every AUT step of its sampling and fuzzing phases. "
        "Runs as a Ray Train job like train-aut (checkpoints every epoch, --resume, MLflow in the run "
        "folder). Settings come from the scenario's preset in experiments/challengers/ (Scope-RL for "
        "classic control, D4RL for MuJoCo) or --preset. The end evaluates the challenger and the AUT "
        "from the same 100 starts and writes OUT/card.json beside OUT/model.d3.",
        epilog="Example:\n  deltarl run experiments/campaigns/cartpole-curefuzz.yaml --out runs/cp\n"
        "  deltarl train-challenger --data runs/cp --algo bcq",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, metavar="RUN_DIR", help="the safety run folder holding D")
    p.add_argument("--algo", required=True, choices=["bc", "bcq", "cql"])
    p.add_argument("--preset", default=None,
                   help="preset name (classic-control, mujoco) or YAML file (default: the one covering the scenario)")
    p.add_argument("--steps", type=int, default=None, help="gradient steps (default: the preset's)")
    p.add_argument("--seed", type=int, default=None, help="training seed (default: the campaign's)")
    p.add_argument("--out", default=None, help="challenger folder (default RUN_DIR/challengers/ALGO)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the folder")
    p.add_argument("--eval-episodes", type=int, default=100, help="episodes for the card (default 100)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train_challenger)

    p = sub.add_parser(
        "run",
        help="run a campaign from a YAML file: safety -> challenger -> optimality",
        description="Run a campaign, each phase when the file has its section: safety (fuzz the AUT's "
        "initial states for failures with random, mdpfuzz, curefuzz or gmt, recording every trajectory as "
        "Parquet: dataset D), challenger (offline RL on D), optimality (differential fuzzing, Delta or a "
        "baseline, of AUT vs challenger: bugs.parquet). Ends with a summary table. Corpora are snapshotted "
        "every generation; --resume RUN_DIR continues an interrupted run.",
        epilog="Quick start: deltarl run experiments/quickstart.yaml. More: experiments/campaigns/*.yaml",
    )
    p.add_argument("campaign", nargs="?", help="campaign YAML file")
    p.add_argument("--out", default=None, help="run folder (overrides the campaign's output)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue the campaign in RUN_DIR")
    p.add_argument("--no-dashboard", action="store_true",
                   help="no Ray dashboard (by default it runs on 127.0.0.1:8265 while the campaign uses Ray)")
    p.add_argument("--campaign-env", metavar="VAR", default=None,
                   help="read the campaign (JSON) from environment variable VAR (what `deltarl submit` jobs do)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    addr = {"default": None, "help": "the head's job API, e.g. http://HEAD:8265 (default: RAY_API_SERVER_ADDRESS, "
                                     "RAY_ADDRESS or http://127.0.0.1:8265)"}
    p = sub.add_parser("submit", help="submit a campaign to a Ray cluster as a Ray Job",
                       description="Submit a campaign as a Ray Job: this repository is uploaded as the working "
                       "directory (gitignored folders stay behind), the job runs `deltarl run` on the cluster, "
                       "writing to the absolute output folder (--out or the campaign's, made absolute here). "
                       "With token auth (Ray >= 2.59) set RAY_AUTH_MODE=token and the token "
                       "(RAY_AUTH_TOKEN or ~/.ray/auth_token).")
    p.add_argument("campaign", help="campaign YAML file")
    p.add_argument("--address", **addr)
    p.add_argument("--out", default=None, help="output folder (absolute, shared by the nodes)")
    p.add_argument("--id", default=None, help="submission id (default: Ray's)")
    p.add_argument("--num-gpus", type=float, default=0.0, help="GPUs reserved for the job's driver")
    p.add_argument("--wait", action="store_true", help="wait for the job to end and print its status")
    p.set_defaults(func=cmd_submit)
    p = sub.add_parser("jobs", help="list the Ray Jobs of a cluster")
    p.add_argument("--address", **addr)
    p.set_defaults(func=cmd_jobs)
    p = sub.add_parser("logs", help="print a Ray Job's logs")
    p.add_argument("job_id")
    p.add_argument("--address", **addr)
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("stop", help="stop a Ray Job (the campaign resumes from its snapshot when resubmitted)")
    p.add_argument("job_id")
    p.add_argument("--address", **addr)
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("grid", help="expand a grid of campaigns and run them concurrently on Ray",
                       description="Expand GRID.yaml (a base campaign and axes: scenario x method x seed x ...) into "
                       "campaigns, run each as a Ray task (concurrently, by its resource request), and collect one "
                       "results table (OUT/results.parquet, results.md) and their MLflow runs in one experiment. "
                       "Running it again skips finished campaigns. Exit 1 when a campaign failed.",
                       epilog="Example: experiments/grids/cartpole-fuzzers.yaml")
    p.add_argument("grid", help="grid YAML file")
    p.add_argument("--profile", default=None,
                   help="the grid's named budget profile, e.g. local (laptop-sized) or paper (the papers' budgets); "
                        "default: the first profile in the file")
    p.add_argument("--out", default=None, help="output folder (overrides the grid's)")
    p.add_argument("--dry-run", action="store_true", help="list the campaigns, run nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_grid)

    p = sub.add_parser("replay", help="re-run an optimality bug and show both returns",
                       description="Re-run bug BUG_ID of an optimality run (bugs.parquet) with its recorded "
                       "initial state and episode seeds: the AUT and the challenger again, both returns beside "
                       "the recorded ones. Exit 1 when they differ.")
    p.add_argument("run_dir", help="the campaign's run folder")
    p.add_argument("bug_id", type=int, help="the bug_id column of bugs.parquet")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("report", help="write report.md and a self-contained report.html for a run or a grid",
                       description="Tables in the Delta paper's layout with its numbers beside ours (mean ± 95% CI, "
                       "Mann–Whitney U, Cohen's d, improvement over the best baseline), failures and bugs over time, "
                       "bugs over the initial-state grid, AUT vs challenger returns, and behaviour clusters (DTW) of "
                       "the AUT on the bugs. PATH: a run folder, a grid folder (results.parquet) or a folder of runs.")
    p.add_argument("path", help="run folder, grid folder or folder of run folders")
    p.add_argument("--out", default=None, help="where to write report.md, report.html, report_files/ (default: PATH)")
    p.add_argument("--max-sequences", type=int, default=300,
                   help="behaviour clustering: at most this many bug trajectories per run (seeded sample; default 300)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("zoo-add", help="ship a finished training run in experiments/zoo",
                       description="Copy model.d3, policy.pt and card.json of a finished `deltarl train-aut` "
                       "run into experiments/zoo/<scenario>-<algo>/ and regenerate the zoo's README.")
    p.add_argument("training_dir", help="the --out folder of deltarl train-aut")
    p.set_defaults(func=cmd_zoo_add)
    _add_repair_parser(sub)
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
