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
import atexit
import os
import sys
import threading

from orchestrator.cli import agents, campaigns, cluster, engine, llm
from orchestrator.cli.common import EXIT_BAD_INPUT, bad_input_types, sigterm_as_interrupt, stopped

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
        with sigterm_as_interrupt():  # `kill`, `timeout`, Kubernetes: the same clean stop as Ctrl-C
            return int(args.func(args) or 0)
    except bad_input_types() as exc:
        print(f"deltarl: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `deltarl scenarios | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, no traceback (`deltarl run` adds how to resume)
        words, code = stopped(exc)
        print(f"\ndeltarl: {words}", file=sys.stderr)
        return code


def entry() -> None:
    """The ``deltarl`` console script: :func:`main`, then the exit without the interpreter's teardown.

    After a campaign, tearing the interpreter down (freeing torch's, d3rlpy's and pyarrow's module
    state one object at a time) took 0.6-0.8 s of a 10-episode run and about 2 s of the quick start,
    with nothing left to do. This exit does what Python's own does that matters, in its order: wait
    for the threads that are not daemons (``threading._shutdown``, as the interpreter does first),
    run the exit handlers (the MLflow writers, Ray's shutdown, logging's flush), flush stdout and
    stderr, then end the process with ``main``'s exit code. Everything a command writes is
    closed before ``main`` returns (files are written whole and renamed into place). An exception
    that escapes ``main`` takes the ordinary way out (traceback, teardown).
    ``DELTARL_FULL_EXIT=1`` keeps the ordinary exit every time (e.g. for tools that report at
    teardown).
    """
    exit_without_teardown(main())


def exit_without_teardown(code: int) -> None:
    """End the process with ``code`` as :func:`entry` does (``sys.exit`` under ``DELTARL_FULL_EXIT``)."""
    if os.environ.get("DELTARL_FULL_EXIT") or not hasattr(threading, "_shutdown") \
            or not hasattr(atexit, "_run_exitfuncs"):
        sys.exit(code)
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed (a broken pipe), nothing to flush
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
