"""What every command module shares: the bad-input error types and exit code, atomic JSON, and
SIGTERM taken as Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it
EXIT_TERMINATED = 143  # SIGTERM (128 + 15)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, systemd, Kubernetes before its SIGKILL) raised where the
    command is, as Ctrl-C raises ``KeyboardInterrupt``: every ``except KeyboardInterrupt`` and
    ``finally`` on the way out runs, so a campaign stops the clean way (its snapshots kept, the
    local LLM server and Ray shut down, the resume hint printed)."""


def _raise_terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the command runs (main thread only; elsewhere nothing changes), SIGTERM raises
    :class:`Terminated`; the previous handler is back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """How a stopped command says so: ("interrupted", 130) for Ctrl-C, ("terminated (SIGTERM)", 143)."""
    return ("terminated (SIGTERM)", EXIT_TERMINATED) if isinstance(exc, Terminated) else ("interrupted", EXIT_INTERRUPTED)


class UsageError(ValueError):
    """Bad command-line input that no lower layer reports."""


MAX_SEED = 2**31 - 1


def seed_arg(text: str) -> int:
    """argparse type of ``--seed``: an integer from 0 to 2^31 - 1 (numpy refuses negative seeds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {MAX_SEED}, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {MAX_SEED}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type of sizes such as ``--batch-size``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def out_arg(text: str) -> str:
    """argparse type of ``--out``: a folder path, not an empty string (which would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a folder path, got an empty string (which would write into the "
                                         "current folder)")
    return text


def bad_input_types() -> tuple:
    """Every error that means "the input is wrong": one message on stderr, exit 2. Imported when
    a command fails, so that ``deltarl --help`` does not load torch, Ray or MLflow."""
    from envs import ScenarioError
    from orchestrator.analysis.report import ReportError
    from orchestrator.campaign.config import CampaignError
    from orchestrator.campaign.grid import GridError
    from orchestrator.cluster.jobs import JobError
    from orchestrator.fuzzers import FuzzerError
    from orchestrator.runs.store import StoreError
    from workers.llm import LLMConfigError, LLMFatalError
    from workers.policies import PolicyError
    from workers.training import TrainingError

    return (ScenarioError, StoreError, PolicyError, TrainingError, CampaignError, FuzzerError, GridError, JobError,
            LLMConfigError, LLMFatalError, ReportError, UsageError)


def write_json_atomic(path: Path, obj) -> None:
    from orchestrator.runs.store import atomic_write_bytes

    atomic_write_bytes(Path(path), json.dumps(obj, indent=2, default=float).encode())
