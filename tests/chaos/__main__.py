"""``python -m tests.chaos`` (``make chaos``): run the chaos suite and print its summary.

Runs ``pytest tests/chaos`` in this process with ``RESILIENCE_CHAOS_LONG=1`` (longer,
randomized fault schedules) unless the variable is already set, then prints one row per
scenario: fault schedules tried, calls made, how the calls ended, the worst call
latency and the recovery times after the faults cleared. Extra arguments go to pytest
(e.g. ``python -m tests.chaos -k redis``). ``--json PATH`` also writes the table as
JSON. The exit status is pytest's.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    os.environ.setdefault("RESILIENCE_CHAOS_LONG", "1")
    json_path = None
    if "--json" in argv:
        index = argv.index("--json")
        json_path = argv[index + 1]
        del argv[index : index + 2]

    import pytest

    from tests.chaos._report import RECORD

    here = Path(__file__).resolve().parent
    started = time.monotonic()
    # The summary is printed below, not by the conftest hook.
    os.environ["RESILIENCE_CHAOS_QUIET"] = "1"
    status = int(pytest.main([str(here), "-q", "-p", "no:cacheprovider", *argv]))
    elapsed = time.monotonic() - started
    long = os.environ.get("RESILIENCE_CHAOS_LONG") not in ("", "0")
    calls = sum(s.calls for s in RECORD.scenarios.values())
    schedules = sum(s.schedules for s in RECORD.scenarios.values())
    print()
    print(f"## Chaos summary ({'long' if long else 'bounded'} run, {elapsed:.0f} s)")
    print()
    print(RECORD.table())
    print()
    print(
        f"{len(RECORD.scenarios)} scenarios, {schedules} fault schedules, {calls} calls; "
        f"pytest exit status {status}."
    )
    if json_path:
        Path(json_path).write_text(RECORD.as_json())
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
