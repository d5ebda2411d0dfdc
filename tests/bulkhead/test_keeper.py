"""The process-wide lease keeper: scheduling, cancelled jobs, its thread's lifetime."""

from __future__ import annotations

import threading
import time

import pytest

from resilience.bulkhead._keeper import LeaseKeeper

pytestmark = pytest.mark.timeout(30)


class FarJob:
    """A renewal-like job due far in the future."""

    def __init__(self) -> None:
        self.active = True

    def __call__(self) -> float | None:
        return None


def test_released_jobs_do_not_pile_up() -> None:
    """Jobs cancelled before they are due are compacted away, not kept until due."""
    keeper = LeaseKeeper()
    far = time.monotonic() + 3600
    jobs = [FarJob() for _ in range(5000)]
    for job in jobs:
        keeper.schedule(far, job)
    for job in jobs[:4000]:
        job.active = False
        keeper.cancelled()
    assert keeper.pending() < 2500
    assert keeper.pending() >= 1000  # the live ones stay


def test_jobs_run_in_order_and_reschedule() -> None:
    """A job runs when due, again when it returns a time, and stops when it returns None."""
    keeper = LeaseKeeper()
    runs: list[int] = []
    done = threading.Event()

    def job() -> float | None:
        runs.append(len(runs))
        if len(runs) == 3:
            done.set()
            return None
        return time.monotonic() + 0.01

    keeper.schedule(time.monotonic(), job)
    assert done.wait(5)
    assert runs == [0, 1, 2]


def test_a_failing_job_is_logged_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """An exception in a job never kills the keeper thread."""
    keeper = LeaseKeeper()
    ran = threading.Event()

    def broken() -> float | None:
        raise RuntimeError("boom")

    with caplog.at_level("WARNING", logger="resilience"):
        keeper.schedule(time.monotonic(), broken)
        keeper.soon(ran.set)
        assert ran.wait(5)
    assert any("lease job failed" in record.getMessage() for record in caplog.records)
