"""``python -m orchestrator.cli`` = the ``deltarl`` command."""

import sys

from orchestrator.cli import main

sys.exit(main())
