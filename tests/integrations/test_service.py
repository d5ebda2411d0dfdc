"""The service and its pipeline against the simulated upstreams, over real HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import httpx
import pytest

from integrations.summarizer.config import ENV, ServiceConfig
from integrations.summarizer.content import media_bytes
from integrations.summarizer.servers import ChildProcess


def _platform_requests(app, domain: str) -> int:
    return sum(app.stats[domain].requests.values())


def test_job_streams_tokens_then_done(make_service):
    """A job runs the four stages, then streams tokens before its done event."""
    svc = make_service()
    response = svc.submit("https://vidhub.test/watch/first")
    assert response.status_code == 202
    assert response.headers["ratelimit"].startswith('"summarizer.user-rate"')
    job_id = response.json()["id"]
    events = []
    with svc.client.stream("GET", f"/summaries/{job_id}/stream") as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
    assert events.index("inference") < events.index("token") < events.index("done")
    doc = svc.wait(job_id)
    assert doc["outcome"] == "full"
    assert [doc["stages"][s]["status"] for s in ("metadata", "video", "audio", "subtitles")] == [
        "done"
    ] * 4
    assert doc["summary"]


@pytest.mark.parametrize("seam", ["transport", "compose"])
def test_download_cut_halfway_resumes_from_part_offset(make_service, platforms, seam):
    """A video cut mid-transfer resumes with Range from the .part size; the file is whole
    (with the policies in ResilientTransport or composed around each attempt)."""
    _, app = platforms
    control = app.control("streamly.test")
    control.cut_next = 1
    control.cut_fraction = 0.5
    svc = make_service(download_seam=seam)
    job_id = svc.submit("https://streamly.test/watch/resume1").json()["id"]
    doc = svc.wait(job_id)
    assert doc["outcome"] == "full"
    videos = [e for e in app.stats["streamly.test"].log if e["kind"] == "video"]
    assert len(videos) == 2
    first, second = videos
    assert first["start"] == 0
    assert 0 < first["bytes"] < app.video_of("streamly.test", "resume1").video_size
    assert second["status"] == 206
    assert second["start"] == first["bytes"]  # asked only for the missing bytes
    assert doc["stages"]["video"]["resumed_from"] == first["bytes"]
    v = app.video_of("streamly.test", "resume1")
    path = svc.service.pipeline.media / "streamly.test" / "resume1" / "v1" / "video"
    assert path.read_bytes() == media_bytes(v, "video", 0, v.video_size)


@pytest.mark.parametrize("extra", [0, 7])
def test_a_part_holding_the_whole_file_or_more_ends_the_stage(make_service, platforms, extra):
    """A .part left holding every byte (a transfer that failed after its last one) is
    the file: the platform's 416 for ``Range: bytes=<size>-`` ends the stage (it was
    retried until the job's deadline, 3-5 requests a second, and the job degraded).
    A .part longer than the file (``extra``) is dropped and fetched again."""
    _, app = platforms
    v = app.video_of("clipzone.test", "whole1")
    svc = make_service()
    directory = svc.service.pipeline.media / "clipzone.test" / "whole1" / "v1"
    directory.mkdir(parents=True)
    (directory / "video.part").write_bytes(media_bytes(v, "video", 0, v.video_size) + b"x" * extra)
    job_id = svc.submit("https://clipzone.test/watch/whole1").json()["id"]
    doc = svc.wait(job_id)
    assert doc["outcome"] == "full"
    statuses = app.stats["clipzone.test"].statuses
    assert statuses["416"] == 1
    videos = [e["status"] for e in app.stats["clipzone.test"].log if e["kind"] == "video"]
    assert videos == ([] if extra == 0 else [200])  # a 416 is not logged as a transfer
    assert (directory / "video").read_bytes() == media_bytes(v, "video", 0, v.video_size)
    assert not (directory / "video.part").exists()


def test_repeated_url_is_served_from_cache_without_upstreams(make_service, platforms, models):
    """The second request for a URL is answered 200 from cache; no upstream sees it."""
    _, plat = platforms
    _, mods = models
    svc = make_service()
    job_id = svc.submit("https://clipzone.test/watch/cached1").json()["id"]
    first = svc.wait(job_id)
    before = (
        _platform_requests(plat, "clipzone.test"),
        sum(s.requests for s in mods.stats.values()),
    )
    again = svc.submit("https://clipzone.test/watch/cached1")
    assert again.status_code == 200
    assert again.json()["cached"] is True
    assert again.json()["summary"] == first["summary"]
    after = (
        _platform_requests(plat, "clipzone.test"),
        sum(s.requests for s in mods.stats.values()),
    )
    assert after == before


def test_changed_source_version_invalidates_the_cache(make_service, platforms):
    """Once an entry is stale, a new source version is summarized again; the same one is not."""
    _, app = platforms
    svc = make_service(cache_freshness=0.0)  # always revalidate with the platform
    url = "https://tubeverse.test/watch/versioned"
    svc.wait(svc.submit(url).json()["id"])
    videos_before = app.stats["tubeverse.test"].requests["video"]

    same = svc.wait(svc.submit(url).json()["id"])
    assert same["cached"] is True  # revalidated: one metadata request, nothing else
    assert app.stats["tubeverse.test"].requests["video"] == videos_before

    app.versions[("tubeverse.test", "versioned")] = 2
    changed = svc.wait(svc.submit(url).json()["id"])
    assert changed["cached"] is False
    assert changed["version"] == 2
    assert app.stats["tubeverse.test"].requests["video"] == videos_before + 1


def test_unknown_ids_and_sources_are_negatively_cached(make_service, platforms):
    """An unknown summary id and a missing video are remembered; repeats cost nothing."""
    _, app = platforms
    svc = make_service()
    assert svc.client.get("/summaries/doesnotexist").status_code == 404
    assert svc.client.get("/summaries/doesnotexist").status_code == 404
    assert svc.service.api_counts["unknown_id_hits"] == 1

    url = "https://vidhub.test/watch/missing42"
    doc = svc.wait(svc.submit(url).json()["id"])
    assert doc["outcome"] == "not_found"
    metadata_calls = app.stats["vidhub.test"].requests["metadata"]
    again = svc.submit(url)
    assert again.status_code == 404
    assert app.stats["vidhub.test"].requests["metadata"] == metadata_calls
    assert svc.service.api_counts["negative_source_hits"] == 1


def test_strong_model_down_falls_back_then_extractive(make_service, models):
    """Strong down: long segments fall back to cheap (full); all down: extractive, degraded."""
    _, mods = models
    svc = make_service()
    mods.tiers["strong"].down = True
    mods.tiers["strong"].down_mode = "503"
    doc = svc.wait(svc.submit("https://vidhub.test/watch/fallback1").json()["id"])
    assert doc["outcome"] == "full"
    assert "strong" not in doc["tiers"]
    mods.tiers["cheap"].down = True
    mods.tiers["cheap"].down_mode = "503"
    doc = svc.wait(svc.submit("https://vidhub.test/watch/fallback2").json()["id"])
    assert doc["outcome"] == "degraded"
    assert set(doc["tiers"]) == {"extractive"}
    assert "extractive_summary" in doc["reasons"]


def test_naive_mode_has_no_middleware_and_no_streaming(make_service):
    """Naive mode: no rate-limit headers, one non-streamed strong call per job."""
    svc = make_service(mode="naive")
    response = svc.submit("https://vidhub.test/watch/naive1")
    assert "ratelimit" not in response.headers
    doc = svc.wait(response.json()["id"])
    assert doc["outcome"] == "full"
    assert doc["tiers"] == ["strong"]


def test_metrics_and_health(make_service):
    """/healthz answers and /metrics exposes the policy and service series."""
    svc = make_service()
    svc.wait(svc.submit("https://vidhub.test/watch/metrics1").json()["id"])
    assert svc.client.get("/healthz").json()["status"] == "ok"
    response = svc.client.get("/metrics", follow_redirects=False)
    assert response.status_code == 200  # the path itself, no redirect to /metrics/
    text = response.text
    assert "summarizer_jobs_total" in text
    assert "summarizer_first_token_seconds_bucket" in text


def _streamed_events(svc, job_id: str) -> list[str]:
    names = []
    with svc.client.stream("GET", f"/summaries/{job_id}/stream") as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
    return names


def test_a_url_resubmitted_as_its_job_ends_never_loses_its_files(make_service):
    """A URL resubmitted while (or just as) its previous job runs: a job's media are
    removed before its URL is free again, so no new job of the URL fails on a file
    vanishing under it; with keep_media=False full jobs leave nothing behind."""
    svc = make_service(cache_freshness=0.0, user_rate="1000/s", user_burst=1000, keep_media=False)
    ids: set[str] = set()
    lock = threading.Lock()
    stop = time.monotonic() + 3.0

    def submit_until_stopped() -> None:
        while time.monotonic() < stop:
            response = svc.submit("https://clipzone.test/watch/overlap")
            assert response.status_code == 202
            with lock:
                ids.add(response.json()["id"])

    threads = [threading.Thread(target=submit_until_stopped) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcomes = [svc.wait(job_id) for job_id in ids]
    assert len(ids) >= 5  # several jobs for the one URL, one after another
    assert [(d["outcome"], d.get("error")) for d in outcomes if d["outcome"] != "full"] == []
    assert list((svc.service.pipeline.media / "clipzone.test").iterdir()) == []


def test_every_stream_ends_with_done_on_redis(make_service, redis_server):
    """With the cache on Redis (an awaited write as the job ends), each job's stream
    still ends with its done event, not at the last token."""
    svc = make_service(redis_url=redis_server.url)
    ids = [svc.submit(f"https://vidhub.test/watch/redisdone{i}").json()["id"] for i in range(8)]
    ends = [_streamed_events(svc, job_id)[-1] for job_id in ids]
    assert ends == ["done"] * len(ids)


def test_a_burst_of_lookups_on_a_healthy_redis_gets_no_503(
    redis_server, platforms, models, tmp_path
):
    """250 concurrent lookups of unknown ids on a fresh service with Redis up are 404s:
    the cache opened a connection per lookup at once, the connects that missed the
    0.1 s command timeout failed, tripped the cache breaker, and most were 503s. The
    service runs in its own process, as deployed (in this one, the client's burst
    would slow its event loop past its request timeout)."""
    cfg = ServiceConfig(
        platforms=("127.0.0.1", platforms[0].port),
        models=("127.0.0.1", models[0].port),
        workdir=str(tmp_path / "work"),
        redis_url=redis_server.url,
        user_rate="10000/s",
        user_burst=10000,
    )
    child = ChildProcess(["serve", "--port", "0"], env={ENV: cfg.to_json()}).start()
    try:
        url = f"http://127.0.0.1:{child.info['port']}"

        async def burst() -> list[int]:
            limits = httpx.Limits(max_connections=300)
            async with httpx.AsyncClient(base_url=url, timeout=20, limits=limits) as client:
                answers = await asyncio.gather(
                    *(client.get(f"/summaries/nope{i}") for i in range(250))
                )
            return [response.status_code for response in answers]

        statuses = asyncio.run(burst())
    finally:
        child.stop()
    assert Counter(statuses) == {404: 250}


@pytest.mark.parametrize("seam", ["transport", "compose"])
def test_leases_lost_mid_download_lose_no_download(make_service, platforms, redis_server, seam):
    """Redis loses its data (a restart) while a video downloads: the download holds a
    slot whose lease is gone, and finishes all the same (closing it raised LeaseLost: a
    complete video was thrown away, left as a .part, and the job degraded)."""
    _, app = platforms
    v = app.video_of("vidhub.test", "leaselost1")
    app.control("vidhub.test").bandwidth = v.video_size / 1.0  # about a second
    svc = make_service(redis_url=redis_server.url, download_seam=seam)
    job_id = svc.submit("https://vidhub.test/watch/leaselost1").json()["id"]
    deadline = time.monotonic() + 10
    while svc.client.get(f"/summaries/{job_id}").json()["stages"]["video"]["bytes"] == 0:
        assert time.monotonic() < deadline, "the video never started"
        time.sleep(0.01)
    redis_server.command("FLUSHALL")
    doc = svc.wait(job_id)
    assert doc["outcome"] == "full"
    assert doc["stages"]["video"]["attempts"] == 1
    path = svc.service.pipeline.media / "vidhub.test" / "leaselost1" / "v1" / "video"
    assert path.read_bytes() == media_bytes(v, "video", 0, v.video_size)


def test_a_redis_outage_is_not_taken_for_an_unknown_id(make_service, redis_server):
    """A finished job known only to the Redis store: while Redis is down its id gets a
    503 with Retry-After (the store cannot tell), not a 404 that the negative cache would
    then repeat for ``negative_ttl`` after Redis is back; once back, it is found again."""
    svc = make_service(redis_url=redis_server.url)
    job_id = svc.submit("https://vidhub.test/watch/stored1").json()["id"]
    assert svc.wait(job_id)["outcome"] == "full"
    svc.service.pipeline.jobs.by_id.clear()  # as after a restart: only the store knows it
    assert svc.client.get(f"/summaries/{job_id}").status_code == 200
    redis_server.pause()
    try:
        for path in (f"/summaries/{job_id}", f"/summaries/{job_id}/stream"):
            down = svc.client.get(path)
            assert down.status_code == 503
            assert down.headers["retry-after"] == "1"
    finally:
        redis_server.resume()
    deadline = time.monotonic() + 5  # the store's breaker probes again within a second
    while (back := svc.client.get(f"/summaries/{job_id}")).status_code == 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert back.status_code == 200
    assert back.json()["outcome"] == "full"
    assert svc.client.get("/summaries/neverexisted").status_code == 404


def test_workers_sharing_a_workdir_keep_their_media_apart(make_service, redis_server, tmp_path):
    """Two workers on one workdir (as `demo --workers 2` runs them), given the same URLs
    at once: each writes its own media directory, and every job is full."""
    shared = {
        "workdir": str(tmp_path / "shared-work"),
        "redis_url": redis_server.url,
        "workers": 2,
        "user_rate": "1000/s",
        "user_burst": 1000,
    }
    workers = [make_service(worker_index=index, **shared) for index in (0, 1)]
    jobs = [
        (worker, worker.submit(f"https://tubeverse.test/watch/shared{n}").json()["id"])
        for n in range(6)
        for worker in workers
    ]
    outcomes = [worker.wait(job_id)["outcome"] for worker, job_id in jobs]
    assert outcomes == ["full"] * len(jobs)
    media = [worker.service.pipeline.media for worker in workers]
    assert media[0] != media[1]


def test_stats_count_only_downloads_holding_a_slot_as_in_flight(make_service, platforms):
    """With the transport seam, attempts queued inside the transport for a slot are
    download attempts, not downloads in flight: in flight never exceeds the limit."""
    _, app = platforms
    app.control("clipzone.test").bandwidth = 256 * 1024  # about a second per video
    svc = make_service(domain_limit=1)
    ids = [svc.submit(f"https://clipzone.test/watch/slots{i}").json()["id"] for i in range(3)]
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        stats = svc.client.get("/internal/stats").json()
        attempts = stats["download_attempts"].get("clipzone.test", 0)
        in_flight = stats["downloads_inflight"].get("clipzone.test", 0)
        seen.append((attempts, in_flight))
        if attempts >= 2:
            break
        time.sleep(0.02)
    assert max(attempts for attempts, _ in seen) >= 2  # some attempts queued...
    assert max(in_flight for _, in_flight in seen) <= 1  # ...but one download at a time
    for job_id in ids:
        svc.wait(job_id, timeout=60)


def test_spellings_of_one_video_share_one_job_and_its_files(make_service):
    """Scheme, host case, port, query, fragment and extra slashes aside, a URL names one
    video: its spellings share the running job (the media directory is per video, and a
    second job in it used to see the first one's files vanish: degraded or failed)."""
    svc = make_service(keep_media=False)
    spellings = [
        "https://vidhub.test/watch/spelled",
        "https://vidhub.test/watch/spelled?t=30",
        "http://VIDHUB.test:443//watch/spelled/#t",
    ]
    ids = {svc.submit(url).json().get("id") for url in spellings}
    assert len(ids) == 1
    (doc,) = [svc.wait(job_id) for job_id in ids]
    assert doc["outcome"] == "full"
    assert doc["url"] == "https://vidhub.test/watch/spelled"
    cached = svc.submit("https://vidhub.test/watch/spelled?again")
    assert cached.status_code == 200
    assert cached.json()["cached"] is True


@pytest.mark.parametrize("priority", ["²", "①", "-3", "high", "9" * 5000])
def test_a_priority_that_is_no_number_gets_the_default_not_a_500(make_service, priority):
    """A priority the service cannot read is the default one: "²" is a Unicode digit that
    int() refuses, and it used to end the request in a 500."""
    svc = make_service()
    body = {"url": "https://vidhub.test/watch/prio", "priority": priority}
    response = svc.client.post("/summaries", json=body, headers={"x-user": "tester"})
    assert response.status_code == 202


def test_json_nested_too_deep_is_a_422_not_a_500(make_service):
    """A body nested deeper than the JSON parser's recursion goes is bad input, like any
    other malformed body (it raised RecursionError: a 500, and the keep-alive connection
    closed under the client's next request)."""
    svc = make_service()
    body = "[" * 100_000 + "]" * 100_000
    headers = {"content-type": "application/json", "x-user": "tester"}
    response = svc.client.post("/summaries", content=body, headers=headers)
    assert response.status_code == 422
    assert svc.client.get("/healthz").json()["status"] == "ok"  # same connection, alive


def test_media_left_by_degraded_jobs_are_kept_for_max_leftover_media_urls(make_service, models):
    """Degraded and failed jobs leave their media for a resume, but only for the
    ``max_leftover_media`` most recently ended URLs: a long model outage degrading every
    job used to keep every job's files for good."""
    _, mods = models
    for tier in ("strong", "cheap"):
        mods.tiers[tier].down = True
        mods.tiers[tier].down_mode = "503"
    svc = make_service(max_leftover_media=2, keep_media=False)
    media = svc.service.pipeline.media / "vidhub.test"

    def settles_on(expected: list[str]) -> list[str]:
        """The media directories once the job's end (and a removal thread) is through."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            held = sorted(p.name for p in media.iterdir())
            if held == expected:
                break
            time.sleep(0.02)
        return held

    for name in ("left1", "left2", "left3"):
        doc = svc.wait(svc.submit(f"https://vidhub.test/watch/{name}").json()["id"])
        assert doc["outcome"] == "degraded"
    assert settles_on(["left2", "left3"]) == ["left2", "left3"]
    # a new job of an evicted URL starts afresh and ends like the others
    doc = svc.wait(svc.submit("https://vidhub.test/watch/left1").json()["id"])
    assert doc["outcome"] == "degraded"
    assert settles_on(["left1", "left3"]) == ["left1", "left3"]


def _running_video(svc, platforms, name: str) -> str:
    """Submit a job whose video downloads at 1 KiB/s and wait until the video is running."""
    _, app = platforms
    app.control("vidhub.test").bandwidth = 1024.0  # minutes per video
    job_id = svc.submit(f"https://vidhub.test/watch/{name}").json()["id"]
    deadline = time.monotonic() + 10
    while svc.client.get(f"/summaries/{job_id}").json()["stages"]["video"]["bytes"] == 0:
        assert time.monotonic() < deadline, "the video never started"
        time.sleep(0.02)
    return str(job_id)


def test_a_job_running_at_shutdown_is_recorded_and_found_after_a_restart(make_service, platforms):
    """A job still running when the service stops is cancelled and its end recorded
    (failed, cancelled): a service started again on the same workdir knows its id. The
    store used to be closed before the cancelled job could write to it, and an accepted
    (202) job answered 404 "unknown summary id" after the restart."""
    svc = make_service()
    job_id = _running_video(svc, platforms, "shutdown1")
    started = time.monotonic()
    svc.server.stop(timeout=5)
    assert not svc.server.thread.is_alive()
    assert time.monotonic() - started < 5
    again = make_service(workdir=svc.service.cfg.workdir)
    response = again.client.get(f"/summaries/{job_id}")
    assert response.status_code == 200
    doc = response.json()
    assert (doc["status"], doc["outcome"], doc["error"]) == ("failed", "failed", "cancelled")
    # the stage that was downloading says so (it stayed "pending", as if never started)
    assert doc["stages"]["video"]["status"] == "cancelled"


def test_shutdown_ends_open_streams_with_a_shutdown_event(make_service, platforms):
    """Asked to exit while a client follows a running job, the server ends the stream at
    once with a ``shutdown`` event, then cancels the job and records it. It used to wait
    for the job to end (up to ``job_deadline``, 90 s) before it even started cancelling
    jobs: uvicorn waits for the requests in flight before the lifespan shutdown."""
    svc = make_service()
    job_id = _running_video(svc, platforms, "shutdown2")
    events: list[str] = []

    def follow() -> None:
        with httpx.stream("GET", f"{svc.server.url}/summaries/{job_id}/stream", timeout=30) as s:
            for line in s.iter_lines():
                if line.startswith("event: "):
                    events.append(line[7:])

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    deadline = time.monotonic() + 5
    while "stage" not in events:  # the stream is open
        assert time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    svc.server.stop(timeout=5)
    assert not svc.server.thread.is_alive()
    assert time.monotonic() - started < 5
    follower.join(5)
    assert not follower.is_alive()
    assert events[-1] == "shutdown"
    again = make_service(workdir=svc.service.cfg.workdir)
    doc = again.client.get(f"/summaries/{job_id}").json()
    assert (doc["outcome"], doc["error"]) == ("failed", "cancelled")


def test_a_submission_once_shutdown_started_gets_a_503(make_service):
    """Once the server is asked to exit, a new job is refused with a 503 and Retry-After
    (it would be cancelled at once); it used to be accepted (202) and cancelled."""
    svc = make_service()
    svc.service.shutdown_started()  # what the server calls first when asked to exit
    refused = svc.submit("https://vidhub.test/watch/toolate")
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
