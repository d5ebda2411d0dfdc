"""Where policies keep their state: in process memory or shared through Redis.

* :class:`MemoryBackend`: the default; per-process, bounded keyed state.
* :class:`RedisBackend`: shared state on Redis (standalone or Cluster), one Lua
  ``EVALSHA`` round trip per decision, time from Redis ``TIME``. Its small generic seam
  (:meth:`RedisBackend.script`, :meth:`RedisBackend.key`) serves every policy.
* :class:`Failover`: the ``on_backend_error`` machinery (``"local"`` | ``"open"`` |
  ``"closed"``) shared by policies with a backend.

redis-py is imported only when a :class:`RedisBackend` is built.

Example::

    import resilience as rs

    shared = rs.backends.RedisBackend.from_url("redis://localhost:6379/0")
    limiter = rs.RateLimiter("100/s", backend=shared, on_backend_error="local")
"""

from ._failover import MODES, Failover, FailureMode
from ._memory import MemoryBackend
from ._redis import RedisBackend, RedisScript

__all__ = ["MODES", "Failover", "FailureMode", "MemoryBackend", "RedisBackend", "RedisScript"]
