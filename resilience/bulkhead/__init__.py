"""Bulkheads: per-key concurrency limits, in process or across processes on Redis.

* :class:`Bulkhead`: the policy (decorator, ``with``/``async with``, direct
  ``acquire``/``acquire_nowait``/``acquire_async``), for threads and tasks at once.
* :class:`Permit`: a held slot; release it once, or leave its ``with`` block.
* :class:`BulkheadStatistics`: ``bulkhead.statistics(key=None)``.
* :class:`LeaseLost` / :class:`BulkheadLeaseLost`: a distributed lease ran out while held.

Example::

    import resilience as rs

    per_domain = rs.Bulkhead(4, key=lambda url: urlsplit(url).hostname, max_wait=10.0)

    @per_domain
    async def download(url: str) -> bytes: ...
"""

from ._bulkhead import Bulkhead, BulkheadStatistics
from ._events import BulkheadLeaseLost, LeaseLost
from ._permit import Permit

__all__ = ["Bulkhead", "BulkheadLeaseLost", "BulkheadStatistics", "LeaseLost", "Permit"]
