"""What every command module shares: the bad-input error types and exit code, atomic JSON."""

from __future__ import annotations

import json
from pathlib import Path

EXIT_BAD_INPUT = 2


class UsageError(ValueError):
    """Bad command-line input that no lower layer reports."""


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
