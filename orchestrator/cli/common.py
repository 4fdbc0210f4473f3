"""What every command module shares: the bad-input error types and exit code, atomic JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

EXIT_BAD_INPUT = 2


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
