"""Fixtures: the simulated upstreams and the summarizer service, served for real.

Each runs under uvicorn on a free port of 127.0.0.1 in a thread of the test process;
the tests talk to them over HTTP like any client would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from integrations.summarizer.config import ServiceConfig
from integrations.summarizer.models import ModelsApp
from integrations.summarizer.platforms import PlatformsApp
from integrations.summarizer.servers import ThreadServer, serve_in_thread
from integrations.summarizer.service import Service, create_app


@pytest.fixture
def platforms() -> Iterator[tuple[ThreadServer, PlatformsApp]]:
    """The simulated platforms, fast (no bandwidth limit, 1 ms latency)."""
    app = PlatformsApp(seed=7)
    for control in app.controls.values():
        control.latency_ms = 1.0
        control.bandwidth = 0.0
    with serve_in_thread(app) as server:
        yield server, app


@pytest.fixture
def models() -> Iterator[tuple[ThreadServer, ModelsApp]]:
    """The simulated model provider."""
    app = ModelsApp(seed=7)
    with serve_in_thread(app) as server:
        yield server, app


class Running:
    """A running service: its base URL, its in-process state, and small helpers."""

    def __init__(self, server: ThreadServer, service: Service) -> None:
        self.server = server
        self.service = service
        self.client = httpx.Client(base_url=server.url, timeout=10.0)

    def submit(self, url: str) -> httpx.Response:
        return self.client.post("/summaries", json={"url": url}, headers={"x-user": "tester"})

    def wait(self, job_id: str, timeout: float = 20.0) -> dict[str, Any]:
        """Poll the job until it ends (bounded; the job runs on real servers)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = self.client.get(f"/summaries/{job_id}").json()
            if doc.get("outcome") not in (None, "running"):
                return dict(doc)
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} did not end within {timeout} s")


@pytest.fixture
def make_service(
    tmp_path: Path,
    platforms: tuple[ThreadServer, PlatformsApp],
    models: tuple[ThreadServer, ModelsApp],
) -> Iterator[Callable[..., Running]]:
    """Start a service (``make_service(mode="resilient", **config)``) on the upstreams."""
    started: list[tuple[ThreadServer, Running]] = []

    def make(**overrides: Any) -> Running:
        cfg = ServiceConfig(
            platforms=("127.0.0.1", platforms[0].port),
            models=("127.0.0.1", models[0].port),
            workdir=str(tmp_path / f"work{len(started)}"),
            keep_media=True,
        )
        for name, value in overrides.items():
            setattr(cfg, name, value)
        app = create_app(cfg)
        server = serve_in_thread(app, lifespan="on").start()
        running = Running(server, app.state.service)
        started.append((server, running))
        return running

    yield make
    for server, running in started:
        running.client.close()
        server.stop()
