"""Clocks for tests that need a policy to wait (to be cancelled while it waits)."""

from __future__ import annotations

import anyio

from resilience.testing import FakeClock

__all__ = ["StallingClock"]


class StallingClock(FakeClock):
    """Virtual time whose async sleeps (of more than zero seconds) last until cancelled:
    a caller stays in its backoff for the test to cancel it there."""

    async def sleep_async(self, seconds: float) -> None:
        if seconds > 0:
            await anyio.sleep_forever()
