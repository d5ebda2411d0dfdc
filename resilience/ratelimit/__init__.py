"""Rate limiting: exact GCRA token buckets per key, in memory or shared on Redis.

* :class:`Rate` and its text form (``"100/s"``, ``"5 per minute"``, ``"10/5s"``).
* :class:`Decision`: what a limiter decided (``allowed``, ``remaining``,
  ``retry_after``, ``reset_after``, ``limit``).
* :class:`RateLimiter`: the policy (decorator, ``with``/``async with``,
  ``try_acquire``/``acquire`` and their async twins).
* :class:`GCRA`: the pure core, for those who build their own shells.

Example::

    import resilience as rs

    limiter = rs.RateLimiter("10/s", key=lambda user, *a, **k: user)

    @limiter
    def handle(user: str, request: object) -> str: ...
"""

from ._gcra import GCRA, Decision
from ._limiter import ALGORITHMS, RateLimiter, RateLimiterStatistics
from ._rate import Rate

__all__ = ["ALGORITHMS", "GCRA", "Decision", "Rate", "RateLimiter", "RateLimiterStatistics"]
