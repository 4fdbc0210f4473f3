"""``deltarl run | grid | replay | repair | report``: campaigns, grids of campaigns and what they found.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from orchestrator.cli.common import UsageError, out_arg, positive_int, seed_arg, stopped


def cmd_run(args) -> int:
    from orchestrator.runs import tracking

    tracking.prestart()  # MLflow's import starts now, beside the campaign's own (stopped if unused)
    from orchestrator.campaign.config import campaign_from_dict, campaign_of_run, load_campaign
    from orchestrator.runs.layout import RunFolder

    if args.resume and (args.campaign or args.out is not None):
        raise UsageError("--resume RUN_DIR continues the run as it was set up (its campaign.json, in its folder): "
                         "give no campaign file and no --out with it")
    if args.resume:
        run = RunFolder(args.resume)
        if not run.has_campaign():
            raise UsageError(f"--resume {run.root}: not a campaign run folder (no campaign.json)")
        campaign = campaign_of_run(run.root)
    elif args.campaign_env:  # a Ray Job: the resolved campaign comes in the job's environment
        if not os.environ.get(args.campaign_env):
            raise UsageError(f"--campaign-env {args.campaign_env}: the variable is not set")
        try:
            data = json.loads(os.environ[args.campaign_env])
        except ValueError as exc:
            raise UsageError(f"--campaign-env {args.campaign_env}: the variable holds no JSON campaign ({exc})") from None
        if not isinstance(data, dict):
            raise UsageError(f"--campaign-env {args.campaign_env}: the variable holds a JSON {type(data).__name__}, "
                             f"not a campaign (a JSON object of its settings, as `deltarl submit` writes it)")
        campaign = campaign_from_dict(data, args.campaign_env)
        if args.out:
            campaign.output = args.out
        if RunFolder(campaign.output).has_campaign():  # a resubmitted or retried job continues
            args.resume = campaign.output
    else:
        if not args.campaign:
            raise UsageError("give a campaign file (deltarl run CAMPAIGN.yaml) or --resume RUN_DIR")
        campaign = load_campaign(args.campaign, output=args.out)
    if not campaign.mlflow:
        tracking.stop_spare()
    from orchestrator.campaign.pipeline import run_campaign, summary_table
    from orchestrator.cluster.session import DriverSession

    # the dashboard comes with the local cluster, if a phase starts one (workers: auto often does
    # not); the session holds the campaign's progress actor until --keep-dashboard is over
    dashboard = not args.no_dashboard and os.environ.get("DELTARL_DASHBOARD", "1") != "0"
    with DriverSession(dashboard=dashboard, name=campaign.name):
        try:
            results = run_campaign(campaign, resume=bool(args.resume), progress=not args.quiet)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM
            hint = (f"; continue it with: deltarl run --resume {campaign.output}"
                    if RunFolder(campaign.output).has_campaign() else "; nothing was kept")
            words, code = stopped(exc)
            print(f"\ndeltarl: {words}{hint}", file=sys.stderr)
            return code
        print(f"{campaign.name}: {campaign.scenario}, AUT {campaign.aut}\n")
        print(summary_table(results, mlflow=campaign.mlflow))
        if args.keep_dashboard is not None:
            keep_dashboard(args.keep_dashboard)
    failed = [f"{name}: the LLM gave no usable scenario in {r['llm_calls']} calls (every LLM seed fell back to random "
              f"mutation: this is not {r['fuzzer']}'s method; check llm.base_url and llm.model)"
              for name, r in (("safety", results.get("safety")), ("optimality", results.get("optimality")))
              if r and r.get("llm_no_usable_scenario")]
    for line in failed:
        print(f"deltarl: error: {line}", file=sys.stderr)
    return 1 if failed else 0


def keep_dashboard(seconds: float) -> None:
    """``--keep-dashboard``: hold this process (the cluster's driver, and so the dashboard with its
    actors, their logs and the campaign's progress) until Ctrl-C, or ``seconds`` when > 0."""
    import time

    from orchestrator.cluster.dashboard import dashboard_info

    sys.stdout.flush()
    info = dashboard_info()
    if info is None:
        print("--keep-dashboard: no Ray dashboard to keep (the campaign ran in this process without Ray, or with "
              "--no-dashboard); run it with workers: N (N >= 1) to get one", file=sys.stderr)
        return
    how_long = f"for {seconds:g} s" if seconds > 0 else "until Ctrl-C"
    print(f"Ray dashboard kept up at {info['url']} {how_long}"
          + (f"\n  it asks for a token: {info['login']}" if info["login"] else ""), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        while seconds <= 0 or time.monotonic() - t0 < seconds:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


def cmd_grid(args) -> int:
    from orchestrator.campaign.grid import chosen, expand, load_grid, markdown_table, parse_only, run_grid

    grid = load_grid(args.grid, profile=args.profile)
    if args.out:
        grid["output"] = args.out
    only = parse_only(args.only)
    if args.dry_run:
        points = expand(grid)
        for (point, c), picked in zip(points, chosen(points, only)):
            if picked:
                print(f"{c.name}: {point} -> {c.output}")
        return 0
    df = run_grid(grid, progress=not args.quiet, only=only)
    print(markdown_table(df))
    out = Path(grid["output"])
    from orchestrator.runs.mlflow_ui import ui_lines

    print(f"table   {out / 'results.parquet'}  (deltarl report {out})\nMLflow  "
          + "\n".join(ui_lines(out / "mlflow.db", indent="        ")))
    return 0 if (df["status"] == "done").all() else 1


def cmd_replay(args) -> int:
    from orchestrator.campaign.replay import replay_bug, replay_failure

    r = replay_failure(args.run_dir, args.id) if args.failure else replay_bug(args.run_dir, args.id)
    state = ", ".join(f"{n}={v:.4g}" for n, v in zip(r["state_names"], r["initial_state"]))
    lines = [f"{r['kind']} {r['id']}: {state}",
             f"  AUT         {r['aut_return']:.2f}  (recorded {r['recorded_aut_return']:.2f})"]
    if r["kind"] == "bug":
        lines.append(f"  challenger  {r['ca_return']:.2f}  (recorded {r['recorded_ca_return']:.2f})")
    else:
        lines.append(f"  {'fails' if r['failure'] else 'does not fail'} alone")
    lines.append(f"  {'reproduced' if r['reproduced'] else 'NOT reproduced: the episode differs from the record'}"
                 " (each agent acting alone, the recorded episode seeds)")
    if args.video is not None:
        from orchestrator.campaign.replay import bug_video

        v = bug_video(args.run_dir, args.id, args.video or None, failure=args.failure)
        shown = ", ".join(f"{k} {ret:.2f} in {v['lengths'][k]} steps" for k, ret in v["returns"].items())
        lines.append(f"video   {v['path']}  ({shown}; the scenario's reference environment"
                     + (f", repeat 0 of {v['repeats']}" if v["repeats"] > 1 else "") + ")")
    print("\n".join(lines))
    return 0 if r["reproduced"] else 1


def cmd_report(args) -> int:
    from orchestrator.analysis.report import write_report

    out = write_report(args.path, args.out, max_sequences=args.max_sequences, videos=args.videos, add=args.add or ())
    print(f"{out['tables']} tables, {out['figures']} figures ({out['videos']} bug videos)\n  {out['markdown']}\n"
          f"  {out['html']}  (self-contained)\n  {out['data']}/  (the data behind it: deltarl report makes it again "
          f"from this folder alone)")
    db = Path(args.path) / "mlflow.db"
    if db.is_file():  # a run or grid folder's MLflow, its artifacts pointed at where the folder is now
        from orchestrator.runs.mlflow_ui import ui_lines

        print("  MLflow: " + "\n".join(ui_lines(db, indent="    ")))
    unreadable = [f for p in (args.path, *(args.add or ())) for f in _unreadable_files(Path(p))]
    for line in unreadable:  # a report with figures silently missing must not look complete
        print(f"deltarl: warning: could not read {line}; the report leaves it out", file=sys.stderr)
    return 1 if unreadable else 0


def _unreadable_files(path: Path) -> list[str]:
    """Every file of the run folders under ``path`` that cannot be read (truncated Parquet, damaged JSON)."""
    from orchestrator.analysis.run_reader import find_runs
    from orchestrator.runs.layout import RunFolder

    if not path.is_dir():
        return []
    return [f"{p}: {why}" for run in find_runs(path) for p, why in RunFolder(run).damaged_files()]


def cmd_repair(args) -> int:
    from orchestrator.campaign.repair import repair_run
    from workers.repair import RepairConfig

    cfg = RepairConfig(**{k: v for k, v in {"steps": args.steps, "learning_rate": args.lr, "alpha": args.alpha,
                                            "actor_learning_rate": args.actor_lr, "temp_learning_rate": args.temp_lr,
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
    p.add_argument("--steps", type=int, default=None,
                   help="CQL gradient steps (default 3000 for a discrete AUT, 1000 for a continuous one)")
    p.add_argument("--lr", type=float, default=None, help="learning rate of the Q-function / critic (default 1e-4)")
    p.add_argument("--actor-lr", type=float, default=None,
                   help="continuous AUTs: the actor's learning rate (default 1e-7: d3rlpy's --lr / 3 wrecks a "
                        "MuJoCo agent within 20 updates, docs/optimality.md)")
    p.add_argument("--temp-lr", type=float, default=None,
                   help="continuous AUTs: the SAC temperature's learning rate (default 0: the AUT's temperature "
                        "kept)")
    p.add_argument("--alpha", type=float, default=None, help="CQL conservative weight (default 1.0)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="batch size (default: the AUT's)")
    p.add_argument("--seed", type=seed_arg, default=None, help="fine-tuning seed (default 0)")
    p.add_argument("--eval-episodes", type=int, default=100, help="starts for the mean return (default 100)")
    p.add_argument("--fuzz-budget", type=int, default=None, metavar="N",
                   help="also fuzz AUT-Improved and the AUT for safety failures, N episodes each (default: skip)")
    p.add_argument("--fuzzer", default="curefuzz", help="the fuzzer of --fuzz-budget (default curefuzz)")
    p.add_argument("--fuzz-workers", type=int, default=0,
                   help="Ray rollout actors for --fuzz-budget (default 0: in this process, no Ray)")
    p.add_argument("--out", default=None, type=out_arg, help="output folder (default RUN_DIR/repair)")
    p.add_argument("--force", action="store_true", help="replace an existing repair in the output folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_repair)


def register(sub) -> None:
    _add_repair_parser(sub)
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
    p.add_argument("--out", default=None, type=out_arg,
                   help="run folder (overrides the campaign's output); new or empty, or a run of the same "
                        "scenario, AUT and seed to add phases to")
    p.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue the campaign in RUN_DIR")
    p.add_argument("--keep-dashboard", nargs="?", type=float, const=0.0, default=None, metavar="SECONDS",
                   help="keep the Ray dashboard (and this process, its driver) up after the campaign, until Ctrl-C "
                        "or for SECONDS, to look at its actors, logs and progress")
    p.add_argument("--no-dashboard", action="store_true",
                   help="no Ray dashboard (by default it runs on 127.0.0.1, port 8265 or the next free one, when the "
                        "campaign starts a Ray cluster; the address and how to log in are printed)")
    p.add_argument("--campaign-env", metavar="VAR", default=None,
                   help="read the campaign (JSON) from environment variable VAR (what `deltarl submit` jobs do)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

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
    p.add_argument("--out", default=None, type=out_arg, help="output folder (overrides the grid's)")
    p.add_argument("--only", action="append", metavar="SETTING=VALUE", default=None,
                   help="run only the campaigns whose settings match (repeatable: different settings must all "
                        "hold, repeated ones are alternatives), e.g. --only scenario=ACASXu --only seed=0 --only seed=1; "
                        "the rest wait for a later run")
    p.add_argument("--dry-run", action="store_true", help="list the campaigns, run nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_grid)

    p = sub.add_parser("replay", help="re-run a confirmed bug (or --failure) and show the returns",
                       description="Re-run bug ID of an optimality run (bugs.parquet), or with --failure safety "
                       "failure ID (failures.parquet), from its recorded initial state and episode seeds, every agent "
                       "acting alone (one observation per policy call), as the campaign confirmed it. Prints the "
                       "returns beside the recorded ones; exit 1 when they differ.")
    p.add_argument("run_dir", help="the campaign's run folder")
    p.add_argument("id", type=int, help="the bug_id column of bugs.parquet (failure_id of failures.parquet with --failure)")
    p.add_argument("--failure", action="store_true", help="replay a safety failure instead of an optimality bug")
    p.add_argument("--video", nargs="?", const="", default=None, metavar="GIF",
                   help="also render the episodes side by side (AUT | challenger) in the scenario's reference "
                        "environment to an animated GIF (default RUN_DIR/videos/bug-ID.gif or failure-ID.gif); MuJoCo "
                        "renders offscreen with MUJOCO_GL=egl (set when there is no display)")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("report", help="write report.md and a self-contained report.html for a run or a grid",
                       description="It leads with the answer (Delta against the best baseline, ours beside the Delta "
                       "paper's), then tables in the paper's layout (mean ± 95% CI over independent runs with n, "
                       "Mann–Whitney U, Cohen's d where both sides have two runs), the top bugs as GIFs, failures and "
                       "bugs over time, over the initial-state grid, AUT vs challenger returns, behaviour clusters (DTW); "
                       "every campaign's numbers last. Beside report.md and report.html it writes report_data/ (Parquet): "
                       "the folder alone makes the report again. PATH: a run folder, a grid folder (results.parquet), a "
                       "folder of runs, or a folder with an earlier report's report_data/. --add RUN_DIR adds a run "
                       "folder to it (repeatable): a committed results folder grows as its campaigns finish; an added "
                       "run of a campaign already there replaces it.")
    p.add_argument("path", help="run folder, grid folder, folder of run folders, or a folder with a saved report_data/")
    p.add_argument("--add", action="append", metavar="RUN_DIR",
                   help="add this run folder to PATH's report (repeatable; a saved campaign of the same name and "
                        "seed is replaced)")
    p.add_argument("--out", default=None, type=out_arg,
                   help="where to write report.md, report.html, report_files/ (default: PATH)")
    p.add_argument("--max-sequences", type=int, default=300,
                   help="behaviour clustering: at most this many bug trajectories per run (seeded sample; default 300)")
    p.add_argument("--videos", type=int, default=2, metavar="N",
                   help="GIFs of the top N bugs per scenario, AUT and challenger side by side (default 2; 0: none)")
    p.set_defaults(func=cmd_report)
