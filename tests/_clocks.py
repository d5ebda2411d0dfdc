"""Clocks for tests that need a policy to wait (to be cancelled while it waits)."""

from __future__ import annotations

import anyio

from resilience.testing import FakeClock

__all__ = ["OvershootingClock", "StallingClock"]


class StallingClock(FakeClock):
    """Virtual time whose async sleeps (of more than zero seconds) last until cancelled:
    a caller stays in its backoff for the test to cancel it there."""

    async def sleep_async(self, seconds: float) -> None:
        if seconds > 0:
            await anyio.sleep_forever()


class OvershootingClock(FakeClock):
    """Virtual time whose sleeps end ``overshoot`` seconds late, as real sleeps do (the
    scheduler wakes the sleeper a little after the time asked for)."""

    def __init__(self, overshoot: float) -> None:
        super().__init__()
        self.overshoot = overshoot

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds + self.overshoot if seconds > 0 else seconds)

    async def sleep_async(self, seconds: float) -> None:
        await super().sleep_async(seconds + self.overshoot if seconds > 0 else seconds)
