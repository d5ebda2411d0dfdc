"""Configuration of the summarizer service: one dataclass, passed to workers as JSON.

``ServiceConfig(mode="resilient")`` is the reference pipeline; ``mode="naive"`` is the
same code with the policies off, as the seed article's service was before its fixes:
one global semaphore of 80 downloads, no breakers, no fallbacks, fixed-delay retries,
one non-streamed call to the strong model per job, no load shedding, no request timeout,
no per-user rate limit.

Example::

    cfg = ServiceConfig(mode="naive", platforms=("127.0.0.1", 8001), models=("127.0.0.1", 8002))
    os.environ[ENV] = cfg.to_json()            # what a worker process reads back
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from .content import DOMAINS

__all__ = ["ENV", "MODEL_HOST", "ServiceConfig"]

#: The environment variable through which a service worker receives its configuration.
ENV = "SUMMARIZER_CONFIG"

#: The host name under which the simulated model provider is reached.
MODEL_HOST = "models.test"


@dataclass
class ServiceConfig:
    """Every knob of the service and its pipeline (defaults: the demo's settings)."""

    mode: str = "resilient"
    platforms: tuple[str, int] = ("127.0.0.1", 8001)
    models: tuple[str, int] = ("127.0.0.1", 8002)
    domains: tuple[str, ...] = DOMAINS
    redis_url: str | None = None
    workdir: str = "/tmp/summarizer-work"
    events_path: str | None = None
    workers: int = 1
    worker_index: int = 0
    keep_media: bool = False
    #: URLs whose media a degraded or failed job left for a later job to resume, per
    #: worker; beyond it the least recently ended go (a long outage must not fill the disk).
    max_leftover_media: int = 1000
    #: Bytes one stage may download (its whole file); past it the stage fails (the job
    #: is degraded): a platform must not fill the memory or the disk.
    max_download_bytes: int = 64 * 1024 * 1024

    # downloads (resilient): per-domain bulkhead, token bucket, breaker, budgeted retries,
    # applied by resilience.httpx.ResilientTransport ("transport") or composed around
    # each attempt by the pipeline ("compose"); same policies, same settings
    download_seam: str = "transport"
    domain_limit: int = 100
    slot_wait: float = 20.0
    domain_rate: float = 60.0
    domain_burst: int = 60
    rate_wait: float = 2.0
    connect_timeout: float = 1.0
    read_timeout: float = 2.5
    attempts: int = 4
    backoff_base: float = 0.1
    backoff_cap: float = 2.0
    budget_ratio: float = 0.2
    budget_min_per_second: float = 10.0
    breaker_failure_rate: float = 0.5
    breaker_window: int = 20
    breaker_min_calls: int = 8
    breaker_open_for: float = 1.5
    breaker_half_open_calls: int = 2
    job_deadline: float = 90.0

    # downloads (naive)
    global_limit: int = 80
    naive_attempts: int = 3
    naive_retry_delay: float = 0.5
    naive_timeout: float = 10.0

    # inference
    segments: int = 5
    strong_threshold_words: int = 45
    strong_first_token_timeout: float = 0.35
    cheap_first_token_timeout: float = 0.2
    model_timeout: float = 3.0
    model_breaker_open_for: float = 1.5
    model_breaker_min_calls: int = 10
    model_breaker_window: int = 20

    # API
    user_rate: str = "20/s"
    user_burst: int = 40
    api_concurrency: int = 256
    api_max_wait: float = 0.1
    request_timeout: float = 1.0

    # cache
    cache_path: str | None = None
    cache_freshness: float = 300.0
    negative_ttl: float = 15.0

    extra: dict[str, object] = field(default_factory=dict)

    @property
    def resilient(self) -> bool:
        """Whether the policies are on."""
        return self.mode == "resilient"

    def to_json(self) -> str:
        """This configuration as a JSON string (see :meth:`from_json`)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServiceConfig:
        """Rebuild a configuration written by :meth:`to_json`."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a service configuration is a JSON object, got {text[:80]!r}")
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown service configuration fields: {', '.join(unknown)}")
        for name in ("platforms", "models", "domains"):
            if name in raw:
                raw[name] = tuple(raw[name])
        return cls(**raw)

    @classmethod
    def from_env(cls) -> ServiceConfig:
        """The configuration in :data:`ENV` (defaults when unset)."""
        text = os.environ.get(ENV)
        return cls.from_json(text) if text else cls()

    def routes(self) -> dict[str, tuple[str, int]]:
        """Host name -> address: every platform domain and the model provider."""
        routes = {d: self.platforms for d in self.domains}
        routes[MODEL_HOST] = self.models
        return routes
