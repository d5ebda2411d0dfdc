"""From raw measurements to the numbers the demo prints: per phase, per run, and the SLOs.

Everything here is a pure function of what a run recorded (see
:class:`~integrations.summarizer.load.Recorder`) and of the service's event log; no
number is assumed or hard-coded.

*Recovery time* after a fault clears is measured on the upstream side, from the
answers the affected dependency gave (a platform's responses, a model tier's), counted
by the upstream itself and sampled every half second: it is the end of the first
sample window after the fault was cleared in which the dependency answered at least
one request successfully and at least 90% of its answers were successes (late failures
of requests stuck since the fault count against it), minus the moment the fault was
cleared. For Redis, it is the time until every policy that fell back to local state
reported being back on Redis.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["SLO", "analyze_run", "evaluate_slos", "percentile"]

#: The resilient run's targets (the seed article's "after" column, tightened).
SLO = {
    "failed": 0,
    "api_p99_ms": 300.0,
    "first_token_p95_ms": 500.0,
    "concurrent_downloads": 300,
    "recovery_s": 5.0,
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation; None when empty.

    Example::

        >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
        2.5
    """
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 1)


def _downloads(sample: dict[str, Any]) -> int:
    return sum(int(v["inflight"]) for v in sample.get("platforms", {}).values())


def _ok(statuses: dict[str, int], codes: Iterable[str]) -> int:
    return sum(int(statuses.get(c, 0)) for c in codes)


def _answers(sample: dict[str, Any], target: str, name: str) -> tuple[int, int] | None:
    """Cumulative (successful, all) answers of a platform domain or a model tier."""
    good: tuple[str, ...]
    if target == "platform":
        entry = sample.get("platforms", {}).get(name)
        good = ("200", "206")
    else:
        entry = sample.get("models", {}).get(name)
        good = ("200",)
    if entry is None:
        return None
    statuses = entry["statuses"]
    return _ok(statuses, good), sum(int(v) for v in statuses.values())


def recovery_time(
    samples: list[dict[str, Any]], target: str, name: str, *, cleared_at: float
) -> dict[str, Any]:
    """Seconds from ``cleared_at`` to the end of the first sample window in which the
    dependency answered successfully again: at least one success, and at least 90% of
    its answers in that window successes (see the module docstring).

    ``{"seconds": None}`` when it never did; ``{"seconds": None, "unused": True}`` when
    the run sent it nothing after ``cleared_at`` (nothing to measure: the naive
    pipeline never calls the cheap model tier, for one)."""
    points = [(s["t"], a) for s in samples if (a := _answers(s, target, name)) is not None]
    after = [(t, answers) for t, answers in points if t >= cleared_at]
    if len(after) < 2 or after[-1][1][1] == after[0][1][1]:
        return {"seconds": None, "unused": True}
    for (t0, (ok0, all0)), (t1, (ok1, all1)) in itertools.pairwise(after):
        ok, total = ok1 - ok0, all1 - all0
        if ok >= 1 and ok >= 0.9 * total:
            return {"seconds": round(t1 - cleared_at, 2), "window": [t0, t1]}
    return {"seconds": None}


def recovery_text(recovery: dict[str, Any]) -> str:
    """A recovery as the tables print it: ``2.6 s``, ``-`` (not within the run) or
    ``unused`` (no traffic to measure it by)."""
    if recovery.get("unused"):
        return "unused"
    seconds = recovery.get("seconds")
    if seconds is None:
        return "-"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _redis_recovery(
    events: list[dict[str, Any]], start: float, cleared_at: float, *, policies: bool = True
) -> dict[str, Any]:
    fell = {e["policy"] for e in events if e["kind"] == "backend_fallback" and e["t"] >= start}
    if not fell:
        if not policies:  # the naive run keeps no policy state in Redis: nothing to measure
            return {"seconds": None, "unused": True, "note": "no policy uses Redis"}
        return {"seconds": 0.0, "note": "no policy had to fall back"}
    back: dict[str, float] = {}
    for e in events:
        if e["kind"] == "backend_recovered" and e["t"] >= cleared_at and e["policy"] in fell:
            back.setdefault(e["policy"], e["t"])
    if set(back) != fell:
        return {"seconds": None, "note": f"not recovered: {sorted(fell - set(back))}"}
    return {"seconds": round(max(back.values()) - cleared_at, 2), "policies": sorted(fell)}


def analyze_run(run: dict[str, Any]) -> dict[str, Any]:
    """Per-phase and whole-run numbers of one run (``mode``, ``recorder``, ``events``)."""
    rec = run["recorder"]
    wall0 = rec["wall_start"]
    events = [{**e, "t": e["t"] - wall0} for e in run.get("events", [])]
    phases = rec["phases"]
    jobs = rec["jobs"]
    api = rec["api"]
    samples = rec["samples"]
    out_phases = []
    for phase in phases:
        name = phase["name"]
        in_phase = [j for j in jobs if j["phase"] == name]
        lat = [a["latency"] for a in api if a["phase"] == name]
        # First tokens count in the phase the model was asked in (not the submission's).
        ft = [
            j["first_token"]
            for j in jobs
            if j["first_token"] is not None and (j.get("inference_phase") or j["phase"]) == name
        ]
        window = [s for s in samples if phase["start"] <= s["t"] <= phase["end"]]
        downloads = [_downloads(s) for s in window]
        late = [_downloads(s) for s in window if s["t"] >= (phase["start"] + phase["end"]) / 2]
        transitions = [
            e for e in events if e["kind"] == "state" and phase["start"] <= e["t"] < phase["end"]
        ]
        out_phases.append(
            {
                "name": name,
                "description": phase["description"],
                "start": phase["start"],
                "end": phase["end"],
                "requests": len(in_phase),
                "submitted": sum(1 for j in in_phase if j["submitted"]),
                "full": sum(1 for j in in_phase if j["outcome"] == "full"),
                "degraded": sum(1 for j in in_phase if j["outcome"] == "degraded"),
                "failed": sum(1 for j in in_phase if j["outcome"] not in ("full", "degraded")),
                "cached": sum(1 for j in in_phase if j["cached"]),
                "rejections": sum(j["rejections"] for j in in_phase),
                "api_calls": len(lat),
                "api_p50_ms": _ms(percentile(lat, 0.5)),
                "api_p95_ms": _ms(percentile(lat, 0.95)),
                "api_p99_ms": _ms(percentile(lat, 0.99)),
                "first_token_n": len(ft),
                "first_token_p50_ms": _ms(percentile(ft, 0.5)),
                "first_token_p95_ms": _ms(percentile(ft, 0.95)),
                "peak_downloads": max(downloads, default=0),
                "sustained_downloads": int(percentile(late, 0.5) or 0),
                "breaker_transitions": len(transitions),
                "transitions": [
                    f"{e.get('policy')}[{e.get('key')}] {e.get('old')}->{e.get('new')}"
                    for e in transitions
                ][:40],
                "faults": phase.get("faults", []),
                "recovery": {},
            }
        )
    # recovery after each fault, measured from the moment it was cleared for good (a
    # fault that goes on in the next phase is measured after that one)
    for i, phase in enumerate(out_phases):
        following = out_phases[i + 1]["faults"] if i + 1 < len(out_phases) else []
        for target, name in phase["faults"]:
            key = f"{target}:{name}"
            if [target, name] in following or (target, name) in following:
                continue
            if target == "redis":
                phase["recovery"][key] = _redis_recovery(
                    events, phase["start"], phase["end"], policies=run["mode"] != "naive"
                )
            else:
                phase["recovery"][key] = recovery_time(
                    samples, target, name, cleared_at=phase["end"]
                )
    totals = {
        "requests": len(jobs),
        "submitted": sum(1 for j in jobs if j["submitted"]),
        "full": sum(1 for j in jobs if j["outcome"] == "full"),
        "degraded": sum(1 for j in jobs if j["outcome"] == "degraded"),
        "failed": sum(1 for j in jobs if j["outcome"] not in ("full", "degraded")),
        "cached": sum(1 for j in jobs if j["cached"]),
        "api_calls": len(api),
        "api_p99_ms": _ms(percentile([a["latency"] for a in api], 0.99)),
        "first_token_p95_ms": _ms(
            percentile([j["first_token"] for j in jobs if j["first_token"] is not None], 0.95)
        ),
        "peak_downloads": max((_downloads(s) for s in samples), default=0),
        "breaker_transitions": sum(1 for e in events if e["kind"] == "state"),
        "failure_reasons": _reasons(jobs),
        "scraper": {
            "requests": len(rec.get("scraper", [])),
            "rate_limited": sum(1 for a in rec.get("scraper", []) if a["status"] == 429),
            "not_found": sum(1 for a in rec.get("scraper", []) if a["status"] == 404),
        },
    }
    return {"mode": run["mode"], "phases": out_phases, "totals": totals}


def _reasons(jobs: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for j in jobs:
        if j["outcome"] not in ("full", "degraded"):
            for reason in j["reasons"] or ["unknown"]:
                counts[reason] = counts.get(reason, 0) + 1
    return counts


def evaluate_slos(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each SLO of the resilient run: name, target, measured value, met or not."""
    checks: list[dict[str, Any]] = []
    totals = result["totals"]

    def check(name: str, target: str, measured: Any, ok: bool) -> None:
        checks.append({"slo": name, "target": target, "measured": measured, "ok": bool(ok)})

    check("failed requests", "0", totals["failed"], totals["failed"] == 0)
    check(
        "accounting",
        "submitted = full + degraded",
        f"{totals['submitted']} = {totals['full']} + {totals['degraded']}",
        totals["submitted"] == totals["full"] + totals["degraded"] == totals["requests"],
    )
    for phase in result["phases"]:
        p99 = phase["api_p99_ms"]
        check(
            f"API p99 [{phase['name']}]",
            f"< {SLO['api_p99_ms']:.0f} ms",
            p99,
            p99 is not None and p99 < SLO["api_p99_ms"],
        )
        p95 = phase["first_token_p95_ms"]
        check(
            f"first-token p95 [{phase['name']}]",
            f"< {SLO['first_token_p95_ms']:.0f} ms",
            "no first token" if p95 is None else p95,
            p95 is not None and p95 < SLO["first_token_p95_ms"],
        )
    steady = result["phases"][0] if result["phases"] else None
    if steady is not None:
        check(
            "concurrent downloads [steady, sustained]",
            f">= {SLO['concurrent_downloads']}",
            steady["sustained_downloads"],
            steady["sustained_downloads"] >= SLO["concurrent_downloads"],
        )
    for phase in result["phases"]:
        for key, rec in phase["recovery"].items():
            seconds = rec.get("seconds")
            check(
                f"recovery after {phase['name']} ({key})",
                f"< {SLO['recovery_s']:.0f} s",
                seconds,
                seconds is not None and seconds < SLO["recovery_s"],
            )
    return checks
