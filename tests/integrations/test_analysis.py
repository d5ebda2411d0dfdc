"""The demo's analysis: recoveries and SLO verdicts from recorded samples."""

from __future__ import annotations

from typing import Any

from integrations.summarizer.analysis import evaluate_slos, recovery_text, recovery_time


def _sample(t: float, ok: int, errors: int) -> dict[str, Any]:
    return {"t": t, "models": {"cheap": {"statuses": {"200": ok, "503": errors}}}}


def test_recovery_is_the_first_healthy_window_after_the_fault_clears() -> None:
    """Seconds from the clearing to the end of the first window with >= 90% successes."""
    samples = [_sample(0, 0, 5), _sample(1, 0, 9), _sample(2, 1, 12), _sample(3, 11, 12)]
    recovery = recovery_time(samples, "model", "cheap", cleared_at=1.0)
    assert recovery["seconds"] == 2.0
    assert recovery_text(recovery) == "2.0 s"


def test_a_dependency_without_traffic_after_the_fault_is_unused_not_unrecovered() -> None:
    """No answers after the clearing (the naive run never calls the cheap tier): nothing
    to measure, reported as unused rather than as a missed recovery."""
    never_called = recovery_time([{"t": 0}, {"t": 1}, {"t": 2}], "model", "cheap", cleared_at=1)
    assert never_called == {"seconds": None, "unused": True}
    assert recovery_text(never_called) == "unused"
    still_failing = [_sample(0, 0, 5), _sample(1, 0, 9), _sample(2, 0, 14)]
    missed = recovery_time(still_failing, "model", "cheap", cleared_at=1.0)
    assert missed == {"seconds": None}
    assert recovery_text(missed) == "-"


def test_a_phase_without_first_tokens_misses_the_first_token_slo() -> None:
    """No first token at all in a phase is a miss, not a pass."""
    phase = {
        "name": "steady",
        "api_p99_ms": 5.0,
        "first_token_p95_ms": None,
        "sustained_downloads": 400,
        "recovery": {},
    }
    totals = {"failed": 0, "submitted": 1, "full": 1, "degraded": 0, "requests": 1}
    checks = {c["slo"]: c for c in evaluate_slos({"totals": totals, "phases": [phase]})}
    verdict = checks["first-token p95 [steady]"]
    assert verdict["ok"] is False
    assert verdict["measured"] == "no first token"


def test_a_redis_fault_in_the_naive_run_is_unused_not_a_zero_second_recovery() -> None:
    """The naive run keeps no policy state in Redis: its Redis recovery is unused (it
    printed "0.0 s"); the resilient run with no fallback did recover at once."""
    from integrations.summarizer.analysis import _redis_recovery

    naive = _redis_recovery([], 10.0, 13.0, policies=False)
    assert naive["unused"] is True
    assert recovery_text(naive) == "unused"
    assert _redis_recovery([], 10.0, 13.0)["seconds"] == 0.0
    events = [
        {"kind": "backend_fallback", "policy": "limiter", "t": 11.0},
        {"kind": "backend_recovered", "policy": "limiter", "t": 14.5},
    ]
    assert _redis_recovery(events, 10.0, 13.0)["seconds"] == 1.5


def test_a_first_token_counts_in_the_phase_the_model_was_asked_in() -> None:
    """A job submitted in a short fault phase reaches the model after it: its first token
    counts where it was measured (the models-down row reported the healthy model after
    recovery), its outcome where it was submitted."""
    from integrations.summarizer.analysis import analyze_run

    def job(t: float, phase: str, first_token: float, inference_phase: str | None) -> dict:
        return {
            "t": t,
            "phase": phase,
            "submitted": True,
            "outcome": "full",
            "cached": False,
            "first_token": first_token,
            "inference_t": None,
            "inference_phase": inference_phase,
            "rejections": 0,
            "reasons": [],
        }

    phases = [
        {"name": "steady", "description": "", "start": 0.0, "end": 10.0, "faults": []},
        {"name": "models_down", "description": "", "start": 10.0, "end": 13.0, "faults": []},
    ]
    jobs = [
        job(1.0, "steady", 0.2, "steady"),
        job(2.0, "steady", 0.004, "models_down"),  # asked in the outage: extractive
        job(11.0, "models_down", 0.2, "drain"),  # asked after it: not the outage's
        job(3.0, "steady", 0.3, None),  # recorded before the field: its own phase
    ]
    run = {
        "mode": "resilient",
        "recorder": {
            "wall_start": 0.0,
            "phases": phases,
            "jobs": jobs,
            "api": [],
            "samples": [],
        },
        "events": [],
    }
    steady, down = analyze_run(run)["phases"]
    assert (steady["first_token_n"], steady["requests"]) == (2, 3)
    assert (down["first_token_n"], down["requests"]) == (1, 1)
    assert down["first_token_p95_ms"] == 4.0
