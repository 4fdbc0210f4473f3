"""What every command module shares: the bad-input error types and exit code, atomic JSON, and
SIGTERM, SIGHUP and SIGINT taken as Ctrl-C (one clean stop, exit 128 + the signal's number)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it
EXIT_TERMINATED = 143  # SIGTERM (128 + 15)
EXIT_HANGUP = 129  # SIGHUP (128 + 1): the terminal closed, or `kill -HUP`

# what each stopping signal is called in the one line a stopped command prints
_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP)"}


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (``kill``, ``timeout``, systemd, Kubernetes before its SIGKILL, a closed
    terminal) raised where the command is, as Ctrl-C raises ``KeyboardInterrupt``: every ``except
    KeyboardInterrupt`` and ``finally`` on the way out runs, so a campaign stops the clean way
    (its snapshots kept, the local LLM server and Ray shut down, the resume hint printed).
    ``signum`` is the signal."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__()
        self.signum = signum


class _Received:
    """The first stopping signal of the command (:func:`sigterm_as_interrupt` resets it). An
    exception alone cannot carry it: Ray's ``ray.get`` turns whatever ``KeyboardInterrupt`` a
    signal handler raises inside it into a plain new ``KeyboardInterrupt``, so a SIGTERM that
    arrives while the driver waits on Ray would otherwise read as Ctrl-C (exit 130)."""

    signum: int | None = None


def _raise_stopped(signum, frame):
    if _Received.signum is None:
        _Received.signum = signum
    if signum != signal.SIGINT:
        signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM/SIGHUP ends the process at once
        raise Terminated(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the command runs (main thread only; elsewhere nothing changes), SIGTERM, SIGHUP and
    SIGINT raise :class:`Terminated` / ``KeyboardInterrupt`` and are remembered, so that
    :func:`stopped` names the signal that came first whatever exception reaches the top. A SIGINT
    or SIGHUP the process inherited as ignored (a background job of a non-interactive shell,
    ``nohup``) stays ignored. The previous handlers are back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Received.signum = None
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        current = signal.getsignal(sig)
        if sig != signal.SIGTERM and current == signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, _raise_stopped)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """How a stopped command says so, by the signal that stopped it (the first one received,
    else the exception's): ``("interrupted", 130)`` for Ctrl-C / SIGINT, ``("terminated
    (SIGTERM)", 143)``, ``("hung up (SIGHUP)", 129)`` — 128 + the signal's number, as a shell
    reports a process that a signal ended."""
    signum = _Received.signum or (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)
    return _WORDS.get(signum, f"stopped by signal {int(signum)}"), 128 + int(signum)


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
