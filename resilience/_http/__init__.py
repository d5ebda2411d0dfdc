"""Private helpers of :mod:`resilience.httpx`, one concept per module.

* ``_signals``: ``Retry-After`` and rate-limit fields, parsed and capped (pure).
* ``_pace``: per-host pacing from those signals (pure state machine).
* ``_latency``: recent latencies and their quantiles, for hedging (pure).
* ``_hosts``: the default key, the per-host state and its bounded table.
* ``_config``: defaults, :class:`HostPolicy`, argument checks.
* ``_responses``: response bodies holding a bulkhead slot; closing hedge losers.
* ``_transport``: :class:`ResilientTransport`, its decisions and its two shells.

Only ``_config``, ``_responses`` and ``_transport`` import httpx.
"""
