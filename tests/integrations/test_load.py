"""The demo's load driver: the same seeded load in both runs, every API call counted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from integrations.summarizer.load import LoadDriver, Phase, Recorder
from integrations.summarizer.servers import serve_in_thread


def stub_service(*, reject_every: int = 0, hang_gets: bool = False) -> Any:
    """A service that answers every job from its cache (or refuses every n-th with
    429); with ``hang_gets`` it starts every job (202) and its GETs never answer."""
    posts = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal posts
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        status: int = 200
        body: dict[str, Any] = {}
        headers: list[tuple[bytes, bytes]] = []
        if scope["method"] == "POST":
            posts += 1
            if reject_every and posts % reject_every == 0:
                status, headers = 429, [(b"retry-after", b"0")]
            elif hang_gets:
                status, body = 202, {"id": "x"}
            else:
                body = {"summary": "s", "id": "x"}
        elif hang_gets:
            await asyncio.sleep(3)  # past every patience
        data = json.dumps(body).encode()
        headers += [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    return app


def drive(app: Any, *, patience: float = 5.0, seconds: float = 1.5) -> Recorder:
    with serve_in_thread(app) as server:
        recorder = Recorder()
        driver = LoadDriver(
            service_ports=[server.port],
            platforms_port=server.port,
            models_port=server.port,
            recorder=recorder,
            rate=40,
            seed=1,
            patience=patience,
            scraper_rate=0,
        )
        asyncio.run(driver.run([Phase("steady", seconds, "steady")], drain=1.0))
    return recorder


def test_rejections_do_not_change_the_load_that_follows() -> None:
    """A shed or rate-limited POST draws its back-off from a generator of its own: the
    jobs that follow are the same (domain, priority) in a run with rejections as in one
    without (one rejection shifted every later arrival and URL)."""
    calm = drive(stub_service())
    refused = drive(stub_service(reject_every=5))
    assert sum(job.rejections for job in refused.jobs) > 0
    first = [(job.domain, job.priority) for job in calm.jobs]
    second = [(job.domain, job.priority) for job in refused.jobs]
    common = min(len(first), len(second))
    assert common > 20
    assert first[:common] == second[:common]


def test_an_api_call_a_user_gave_up_on_still_counts() -> None:
    """GETs that hang past the users' patience are API samples of status 0, as long as
    they lasted (they were dropped, and the API p99 read a few milliseconds)."""
    recorder = drive(stub_service(hang_gets=True), patience=0.5, seconds=1.0)
    hung = [sample for sample in recorder.api if sample.endpoint.startswith("GET")]
    assert hung
    assert all(sample.status == 0 for sample in hung)
    assert max(sample.latency for sample in hung) >= 0.4
