"""Upstreams that answer what they should not: the service degrades, never fails or waits.

The simulated platform and model serve what the demo's phases need; here single answers
are replaced (a body that is no text, a refusal, a malformed model event) by patching
the upstream app's request handler on the instance.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

Answer = Callable[[str, str], tuple[int, bytes] | None]


def answer_some(app: Any, monkeypatch: pytest.MonkeyPatch, answer: Answer) -> None:
    """Let ``answer(kind, video_id)`` answer a platform request (``(status, body)``), or
    return ``None`` to leave it to the simulated platform."""
    serve = app._serve

    async def patched(
        scope: Any, send: Any, domain: str, kind: str, video_id: str, watch: Any
    ) -> int:
        got = answer(kind, video_id)
        if got is None:
            return int(await serve(scope, send, domain, kind, video_id, watch))
        status, body = got
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return status

    monkeypatch.setattr(app, "_serve", patched)


def test_subtitles_that_are_no_text_degrade_the_job_and_are_fetched_again(
    make_service, platforms, monkeypatch
):
    """Subtitles that are not UTF-8 count as missing (the description is summarized,
    the job is degraded) and are not kept: once the platform serves them right, the
    next job of the URL fetches them and ends full. (The job used to fail with
    UnicodeDecodeError, and every later job of the URL reused the bad file and failed.)"""
    _, app = platforms
    garbled = {"on": True}
    fetched: list[str] = []

    def answer(kind: str, video_id: str) -> tuple[int, bytes] | None:
        if kind == "subtitles":
            fetched.append(video_id)
            if garbled["on"]:
                return 200, bytes(range(128, 256))
        return None

    answer_some(app, monkeypatch, answer)
    svc = make_service()
    url = "https://vidhub.test/watch/garbled1"
    doc = svc.wait(svc.submit(url).json()["id"])
    assert doc["outcome"] == "degraded"
    assert "missing_subtitles" in doc["reasons"]
    assert doc["summary"]
    garbled["on"] = False
    doc = svc.wait(svc.submit(url).json()["id"])
    assert doc["outcome"] == "full"
    assert fetched == ["garbled1", "garbled1"]


@pytest.mark.parametrize("status", [301, 403, 410])
def test_a_refusal_fails_its_stage_at_once(make_service, platforms, monkeypatch, status):
    """A platform that refuses a media stage for good (a redirect, 403, 410) is asked
    once: the stage fails and the job ends degraded at once. (Every status but 404 and
    416 used to be retried until the job's 90 s deadline, about 3.5 requests a second.)"""
    _, app = platforms
    asked: list[str] = []

    def answer(kind: str, video_id: str) -> tuple[int, bytes] | None:
        if kind == "video":
            asked.append(video_id)
            return status, b'{"error": "no"}'
        return None

    answer_some(app, monkeypatch, answer)
    svc = make_service(job_deadline=20.0)
    doc = svc.wait(svc.submit("https://vidhub.test/watch/refused1").json()["id"], timeout=10)
    assert doc["outcome"] == "degraded"
    assert doc["reasons"] == ["missing_video"]
    assert asked == ["refused1"]


def test_a_download_past_max_download_bytes_fails_its_stage(make_service, platforms):
    """A stage larger than ``max_download_bytes`` is cut and not kept (nothing to resume
    from): the job is degraded instead of buffering whatever the platform sends."""
    svc = make_service(max_download_bytes=100 * 1024)  # below every simulated video
    doc = svc.wait(svc.submit("https://vidhub.test/watch/huge1").json()["id"])
    assert doc["outcome"] == "degraded"
    assert "missing_video" in doc["reasons"]
    video_dir = svc.service.pipeline.media / "vidhub.test" / "huge1"
    assert not list(video_dir.rglob("video*"))


@pytest.mark.parametrize("delta", [5, None, ["a"]])
def test_a_model_event_whose_delta_is_no_text_falls_back(make_service, models, monkeypatch, delta):
    """A model event with a delta that is no string is a failed model call (the next
    tier, then the extractive summary answer), not a failed job. (It was streamed to
    followers, counted as the model's success, and the job failed on a TypeError.)"""
    _, app = models

    async def complete(send: Any, tier: str, prompt: str, body: Any, watch: Any) -> int:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        events = b"data: %s\n\ndata: [DONE]\n\n" % json.dumps({"delta": delta}).encode()
        await send({"type": "http.response.body", "body": events})
        return 200

    monkeypatch.setattr(app, "_complete", complete)
    svc = make_service()
    doc = svc.wait(svc.submit("https://vidhub.test/watch/baddelta1").json()["id"])
    assert doc["outcome"] == "degraded"
    assert "extractive_summary" in doc["reasons"]
    assert set(doc["tiers"]) == {"extractive"}
