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
    deltarl llm serve                 the local language model (SmolLM2) for LLMTester campaigns

Bad input (unknown scenario, invalid initial state, a policy that does not load or does not
fit, an output folder holding another run) ends with one message on stderr and exit code 2,
before anything is written.
"""

from __future__ import annotations

import argparse
import sys

from orchestrator.cli import agents, campaigns, cluster, engine, llm
from orchestrator.cli.common import EXIT_BAD_INPUT, bad_input_types

COMMAND_GROUPS = (engine, agents, campaigns, cluster, llm)  # each module: its parsers beside their handlers


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deltarl",
        description="Test deep-RL agents: run them from chosen initial states, fuzz them for failures, "
        "and find where a challenger does better. Runs on a local Ray cluster by default.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `deltarl COMMAND --help` for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args) or 0)
    except bad_input_types() as exc:
        print(f"deltarl: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `deltarl scenarios | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (`deltarl run` adds how to resume)
        print("\ndeltarl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
