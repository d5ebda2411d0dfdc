"""The simulated upstreams: deterministic content, Range, quotas, outages, SSE tiers."""

from __future__ import annotations

import json

import httpx

from integrations.summarizer.content import media_bytes, video


def test_media_supports_range_and_if_range(platforms):
    """A Range request gets 206 and exactly those bytes; a stale If-Range gets all of it."""
    server, _ = platforms
    headers = {"host": "vidhub.test"}
    full = httpx.get(f"{server.url}/media/abc/audio", headers=headers)
    assert full.status_code == 200
    v = video("vidhub.test", "abc", 1, video_kb=(160, 320), audio_kb=(48, 96), sentences=(8, 60))
    assert full.content == media_bytes(v, "audio", 0, v.audio_size)
    part = httpx.get(
        f"{server.url}/media/abc/audio",
        headers={**headers, "range": "bytes=1000-", "if-range": v.etag},
    )
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 1000-{v.audio_size - 1}/{v.audio_size}"
    assert part.content == full.content[1000:]
    stale = httpx.get(
        f"{server.url}/media/abc/audio",
        headers={**headers, "range": "bytes=1000-", "if-range": '"old"'},
    )
    assert stale.status_code == 200
    assert len(stale.content) == v.audio_size


def test_quota_answers_429_with_retry_after(platforms):
    """Beyond its quota a domain answers 429 with Retry-After and RateLimit fields."""
    server, _ = platforms
    httpx.post(
        f"{server.url}/_control/domains/clipzone.test", json={"quota_rps": 1, "quota_burst": 2}
    )
    statuses = [
        httpx.get(f"{server.url}/api/videos/q{i}", headers={"host": "clipzone.test"})
        for i in range(4)
    ]
    assert [r.status_code for r in statuses[:2]] == [200, 200]
    limited = statuses[2]
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert "r=0" in limited.headers["ratelimit"]


def test_outage_503_and_unknown_video(platforms):
    """A domain switched down in 503 mode refuses; ids starting with 'missing' are 404."""
    server, app = platforms
    assert (
        httpx.get(f"{server.url}/api/videos/missing1", headers={"host": "vidhub.test"}).status_code
        == 404
    )
    app.control("vidhub.test").down = True
    app.control("vidhub.test").down_mode = "503"
    assert (
        httpx.get(f"{server.url}/api/videos/x", headers={"host": "vidhub.test"}).status_code == 503
    )
    state = httpx.get(f"{server.url}/_control/state").json()
    assert state["domains"]["vidhub.test"]["stats"]["statuses"]["503"] == 1


def test_version_change_changes_etag(platforms):
    """Bumping a source's version through the control API changes its ETag and content."""
    server, _ = platforms
    first = httpx.get(f"{server.url}/api/videos/v1", headers={"host": "tubeverse.test"}).json()
    httpx.post(f"{server.url}/_control/versions/tubeverse.test/v1", json={"version": 2})
    second = httpx.get(f"{server.url}/api/videos/v1", headers={"host": "tubeverse.test"}).json()
    assert (first["version"], second["version"]) == (1, 2)
    assert first["etag"] != second["etag"]


def _stream(url: str, tier: str, prompt: str) -> list[str]:
    deltas = []
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={"model": tier, "prompt": prompt, "stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                deltas.append(json.loads(line[6:])["delta"])
    return deltas


def test_models_stream_tokens_and_tiers_differ(models):
    """Both tiers stream SSE deltas; the strong tier says more than the cheap one."""
    server, app = models
    prompt = " ".join(f"Sentence number {i} talks about dough and flour." for i in range(20))
    strong = _stream(server.url, "strong", prompt)
    cheap = _stream(server.url, "cheap", prompt)
    assert len(strong) > 1
    assert len("".join(strong).split()) > len("".join(cheap).split())
    app.tiers["cheap"].down = True
    app.tiers["cheap"].down_mode = "503"
    response = httpx.post(
        f"{server.url}/v1/completions", json={"model": "cheap", "prompt": prompt, "stream": True}
    )
    assert response.status_code == 503
