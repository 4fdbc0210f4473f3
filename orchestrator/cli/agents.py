"""``deltarl train-aut | train-challenger | zoo-add``: train agents under test and challengers, ship to the zoo.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli.common import UsageError, out_arg, seed_arg
from workers.resources import resource


def cmd_train_aut(args) -> int:
    from orchestrator.campaign.train_jobs import train_aut_run
    from workers.training import AutTrainConfig, latest_checkpoint

    preset = Path(args.config) if args.config else resource("aut", f"{args.scenario}-{args.algo}.yaml")
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
    state, card, tracking_uri = train_aut_run(cfg, out, resume=args.resume, eval_episodes=args.eval_episodes,
                                              progress=not args.quiet)
    ev = card["evaluation"]
    print(f"{cfg.algo} on {cfg.scenario}: {state['step']} steps, {state['wall_seconds']:.0f} s of training\n"
          f"  mean return  {ev['mean_return']:.1f} ± {ev['ci95_margin']:.1f} over {ev['episodes']} episodes\n"
          f"  success rate {100 * ev['success_rate']:.1f}%\n"
          f"  model        {out / 'model.d3'}  (TorchScript: {out / 'policy.pt'})\n"
          f"  card         {out / 'card.json'}\n"
          f"  MLflow       mlflow ui --backend-store-uri {tracking_uri}")
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
    from orchestrator.campaign.challenger import challenger_dir, train_run_challenger

    if args.eval_episodes < 1:
        raise UsageError(f"--eval-episodes must be >= 1, got {args.eval_episodes}")
    out = Path(args.out) if args.out else challenger_dir(args.data, args.algo)
    card = train_run_challenger(args.data, args.algo, preset=args.preset, steps=args.steps, seed=args.seed,
                                out=out, resume=args.resume, eval_episodes=args.eval_episodes,
                                progress=not args.quiet)
    _print_challenger(card, out)
    return 0


def cmd_zoo_add(args) -> int:
    from orchestrator.runs.zoo import add_to_zoo

    try:
        dest = add_to_zoo(args.training_dir)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    print(f"added {dest} (index: {dest.parent / 'README.md'})")
    return 0


def register(sub) -> None:
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
    p.add_argument("--seed", type=seed_arg, default=None)
    p.add_argument("--config", default=None, help="a training YAML instead of the preset")
    p.add_argument("--out", required=True, type=out_arg, help="training folder")
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
    p.add_argument("--seed", type=seed_arg, default=None, help="training seed (default: the campaign's)")
    p.add_argument("--out", default=None, type=out_arg, help="challenger folder (default RUN_DIR/challengers/ALGO)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the last checkpoint in the folder (the same command without it continues "
                        "an interrupted training too)")
    p.add_argument("--eval-episodes", type=int, default=100, help="episodes for the card (default 100)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train_challenger)

    p = sub.add_parser("zoo-add", help="ship a finished training run in experiments/zoo",
                       description="Copy model.d3, policy.pt and card.json of a finished `deltarl train-aut` "
                       "run into experiments/zoo/<scenario>-<algo>/ and regenerate the zoo's README.")
    p.add_argument("training_dir", help="the --out folder of deltarl train-aut")
    p.set_defaults(func=cmd_zoo_add)
