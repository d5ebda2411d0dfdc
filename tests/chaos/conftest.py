"""Chaos suite plumbing: write the summary of what was measured at the end of the run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos._report import LONG, RECORD


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Under RESILIENCE_CHAOS_LONG=1 (``make chaos``), print the chaos table."""
    path = os.environ.get("RESILIENCE_CHAOS_REPORT")
    if path and RECORD.scenarios:
        Path(path).write_text(RECORD.as_json())
    quiet = os.environ.get("RESILIENCE_CHAOS_QUIET")  # python -m tests.chaos prints it
    if LONG and RECORD.scenarios and not quiet:
        terminalreporter.write_sep("=", "chaos summary")
        terminalreporter.write_line(RECORD.table())
