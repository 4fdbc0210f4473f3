"""``python -m orchestrator.cli`` = the ``deltarl`` command."""

from orchestrator.cli import entry

entry()
