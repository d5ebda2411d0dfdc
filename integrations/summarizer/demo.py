"""The chaos demo: the same load and the same faults, naive then resilient, side by side.

For each run it starts fresh simulated upstreams and fresh service workers (child
processes on 127.0.0.1), drives virtual users through the phases, breaking and healing
dependencies on schedule, and records what users and upstreams saw. Then it prints
one table per run, writes ``report.json`` and ``report.html`` and checks the resilient
run against its SLOs (exit status 1 if any is missed).

Phases (each fault is switched on for its phase and cleared when it ends):

======================  ===============================================================
steady                  everything healthy (the first seconds ramp the load up)
platform_down           ``vidhub.test`` stops answering: connections hang (a black hole)
platform_slow           ``streamly.test``: 8x latency, half the bandwidth, an 8 req/s
                        quota answered with 429 + ``Retry-After``
strong_down             the strong model answers 503
models_down             both model tiers answer 503
redis_down              Redis stops answering (only with ``--redis``)
recovery                everything healthy again
======================  ===============================================================

Example::

    python -m integrations.summarizer demo --quick --out /tmp/report
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .analysis import analyze_run, evaluate_slos, recovery_text
from .config import ENV, ServiceConfig
from .load import LoadDriver, Phase, Recorder
from .servers import ChildProcess

__all__ = ["DemoOptions", "build_phases", "run_demo"]


@dataclass
class DemoOptions:
    """What ``python -m integrations.summarizer demo`` was asked to do."""

    quick: bool = False
    duration: float | None = None
    redis: str | None = None
    workers: int = 1
    out: str = "summarizer-report"
    seed: int = 1
    modes: tuple[str, ...] = ("naive", "resilient")
    live: bool = True
    #: Jobs submitted per second; None: 32 for ``--quick``, 40 for the full run.
    rate: float | None = None
    #: Seconds to wait for unfinished jobs after the load; None: the users' patience in
    #: the full run, 15 s in the quick one.
    drain: float | None = None
    #: ServiceConfig fields to override (tests use it to lower limits).
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Phases to run instead of the standard schedule.
    phases: list[Phase] | None = None

    def jobs_per_second(self) -> float:
        """The submission rate. The full run's 30 s steady phase needs 40 jobs/s to hold
        300 downloads at equilibrium (32 jobs/s settles near 250). The quick run reaches
        300 during its 9 s steady phase at 32 jobs/s, and on a 2-core machine that shares
        the cores with the simulated platforms, models and load driver, 40 jobs/s leaves
        too little CPU for the service's latency SLOs in its compressed fault phases."""
        if self.rate is not None:
            return self.rate
        return 32.0 if self.quick else 40.0


def build_phases(options: DemoOptions, *, with_redis: bool) -> list[Phase]:
    """The phase schedule, scaled to ``--quick`` / ``--duration``."""
    lengths = {
        "steady": 30.0,
        "platform_down": 12.0,
        "platform_slow": 12.0,
        "strong_down": 10.0,
        "models_down": 10.0,
        "redis_down": 10.0,
        "recovery": 16.0,
    }
    if options.quick:
        lengths = {
            "steady": 9.0,
            "platform_down": 3.5,
            "platform_slow": 3.5,
            "strong_down": 3.0,
            "models_down": 3.0,
            "redis_down": 3.0,
            "recovery": 5.0,
        }
    if not with_redis:
        del lengths["redis_down"]
    if options.duration:
        scale = options.duration / sum(lengths.values())
        lengths = {k: v * scale for k, v in lengths.items()}
    down = {"down": True}
    up = {"down": False}
    slow = {"latency_ms": 200.0, "bandwidth": 16384.0, "quota_rps": 8.0, "quota_burst": 8.0}
    normal = {"latency_ms": 25.0, "bandwidth": 32768.0, "quota_rps": 0.0}
    m503 = {"down": True, "down_mode": "503"}
    phases = [
        Phase("steady", lengths["steady"], "all dependencies healthy (load ramps up first)"),
        Phase(
            "platform_down",
            lengths["platform_down"],
            "vidhub.test stops answering (connections hang)",
            faults=[("platform", "vidhub.test", down)],
            clear=[("platform", "vidhub.test", up)],
        ),
        Phase(
            "platform_slow",
            lengths["platform_slow"],
            "streamly.test: 8x latency, half bandwidth, 8 req/s quota (429 + Retry-After)",
            faults=[("platform", "streamly.test", slow)],
            clear=[("platform", "streamly.test", normal)],
        ),
        Phase(
            "strong_down",
            lengths["strong_down"],
            "the strong model answers 503",
            faults=[("model", "strong", m503)],
            clear=[("model", "strong", up)],
        ),
        Phase(
            "models_down",
            lengths["models_down"],
            "both model tiers answer 503",
            faults=[("model", "strong", m503), ("model", "cheap", m503)],
            clear=[("model", "strong", up), ("model", "cheap", up)],
        ),
    ]
    if with_redis:
        phases.append(
            Phase(
                "redis_down",
                lengths["redis_down"],
                "Redis stops answering (shared limits fall back to local ones)",
                faults=[("redis", "redis", {"down": True, "seconds": lengths["redis_down"]})],
                clear=[("redis", "redis", {"down": False})],
            )
        )
    phases.append(Phase("recovery", lengths["recovery"], "all dependencies healthy again"))
    return phases


class _RedisSwitch:
    """Makes Redis stop answering and come back: SIGSTOP a private server, or CLIENT PAUSE."""

    def __init__(self, url: str, server: Any = None) -> None:
        self.url = url
        self.server = server
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379

    def __call__(self, patch: dict[str, Any]) -> None:
        from resilience.testing import resp_command

        if self.server is not None:
            if patch.get("down"):
                self.server.pause()
            else:
                self.server.resume()
            return
        if patch.get("down"):
            ms = int(float(patch.get("seconds", 5.0)) * 1000)
            resp_command(self.port, "CLIENT", "PAUSE", ms, "ALL", host=self.host)
        else:
            with contextlib.suppress(Exception):
                resp_command(self.port, "CLIENT", "UNPAUSE", host=self.host)

    def flush(self) -> None:
        """Forget the previous run's shared state (only the demo's own keys)."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            for key in client.scan_iter(match="summarizer*", count=1000):
                client.delete(key)
            for key in client.scan_iter(match="*summarizer*", count=1000):
                client.delete(key)
        finally:
            client.close()


def _service_config(
    mode: str,
    options: DemoOptions,
    platforms: int,
    models: int,
    workdir: Path,
    events: Path,
    redis: str | None,
) -> ServiceConfig:
    cfg = ServiceConfig(
        mode=mode,
        platforms=("127.0.0.1", platforms),
        models=("127.0.0.1", models),
        redis_url=redis,
        workdir=str(workdir),
        events_path=str(events),
        workers=options.workers,
        job_deadline=60.0 if options.quick else 120.0,
    )
    for name, value in options.overrides.items():
        setattr(cfg, name, value)
    return cfg


def run_once(
    mode: str,
    options: DemoOptions,
    phases: list[Phase],
    out: Path,
    redis: _RedisSwitch | None,
    console: Any,
) -> dict[str, Any]:
    """One run (``naive`` or ``resilient``): start everything, drive the load, tear down."""
    workdir = out / f"work-{mode}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    events = out / f"events-{mode}.jsonl"
    events.write_text("")
    if redis is not None:
        redis.flush()
    # the platforms and the model provider in their own processes: the OS spreads
    # them over the cores as separate machines would be
    seed = ["--seed", str(options.seed)]
    children = [
        ChildProcess(["upstreams", "--only", "platforms", "--platforms-port", "0", *seed]),
        ChildProcess(["upstreams", "--only", "models", "--models-port", "0", *seed]),
    ]
    ChildProcess.start_all(children)
    platforms_port = int(children[0].info["platforms"])
    models_port = int(children[1].info["models"])
    workers: list[ChildProcess] = []
    try:
        base = _service_config(
            mode,
            options,
            platforms_port,
            models_port,
            workdir,
            events,
            redis.url if redis else None,
        )
        for i in range(options.workers):
            cfg = ServiceConfig.from_json(base.to_json())
            cfg.worker_index = i
            workers.append(ChildProcess(["serve", "--port", "0"], env={ENV: cfg.to_json()}))
        ChildProcess.start_all(workers)
        recorder = Recorder()
        patience = 30.0 if options.quick else 60.0
        # The full run waits for every user until their patience runs out (each user
        # gives up by then): a job counts as failed because a user gave up, never because
        # the demo stopped watching a job still on its way. The quick run must fit in
        # 90 s, and waiting out the naive run's stuck users (30 s) would not: it waits
        # 15 s, more than the resilient run's last jobs need (they finish within about
        # 12 s of the load's end); a job still pending then fails as "unfinished".
        default_drain = 15.0 if options.quick else patience
        drain = options.drain if options.drain is not None else default_drain
        driver = LoadDriver(
            service_ports=[int(w.info["port"]) for w in workers],
            platforms_port=platforms_port,
            models_port=models_port,
            recorder=recorder,
            rate=options.jobs_per_second(),
            seed=options.seed,
            patience=patience,
            redis_control=redis,
        )
        asyncio.run(_drive(driver, phases, drain, mode, options, console))
    finally:
        for child in [*workers, *children]:
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # also when stopped or interrupted
    log = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    return {
        "mode": mode,
        "config": json.loads(base.to_json()),
        "recorder": recorder.to_json(),
        "events": [e for e in log if e["kind"] != "job"],
    }


async def _drive(
    driver: LoadDriver,
    phases: list[Phase],
    drain: float,
    mode: str,
    options: DemoOptions,
    console: Any,
) -> None:
    run = asyncio.create_task(driver.run(phases, drain=drain))
    if options.live and console is not None and console.is_terminal:
        from rich.live import Live

        with Live(_live_table(driver, mode), console=console, refresh_per_second=4) as live:
            while not run.done():
                await asyncio.sleep(0.5)
                live.update(_live_table(driver, mode))
    else:
        last = None
        while not run.done():
            await asyncio.sleep(0.5)
            if driver.rec.phase != last:
                last = driver.rec.phase
                print(f"  [{mode}] t={driver.rec.now():5.1f}s phase {last}", flush=True)
    await run


def _live_table(driver: LoadDriver, mode: str) -> Any:
    from rich.table import Table

    from .analysis import percentile

    rec = driver.rec
    now = rec.now()
    jobs = rec.jobs
    recent_api = [a.latency for a in rec.api[-4000:] if a.t > now - 5]
    recent_ft = [
        j.first_token for j in jobs[-3000:] if j.first_token is not None and j.t > now - 15
    ]
    sample = driver.live or {}
    downloads = sum(v.get("inflight", 0) for v in sample.get("platforms", {}).values())
    breakers: dict[str, str] = {}
    for w in sample.get("workers", []):
        for k, v in w.get("breakers", {}).items():
            if v != "closed":
                breakers[k] = v
    table = Table(title=f"summarizer demo - {mode} run", show_header=False)
    table.add_row("time / phase", f"{now:5.1f} s   {rec.phase}")
    done = {o: sum(1 for j in jobs if j.outcome == o) for o in ("full", "degraded", "failed")}
    table.add_row(
        "jobs",
        f"{len(jobs)} requested  {done['full']} full  {done['degraded']} degraded  "
        f"{done['failed']} failed  {sum(1 for j in jobs if j.outcome == 'pending')} running",
    )
    table.add_row("downloads in flight", str(downloads))
    p99 = percentile(recent_api, 0.99)
    p95 = percentile(recent_ft, 0.95)
    table.add_row("API p99 (last 5 s)", "-" if p99 is None else f"{p99 * 1000:.0f} ms")
    table.add_row("first token p95 (15 s)", "-" if p95 is None else f"{p95 * 1000:.0f} ms")
    table.add_row("breakers not closed", ", ".join(f"{k}={v}" for k, v in breakers.items()) or "-")
    return table


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}{unit}" if value >= 10 else f"{value:.1f}{unit}"
    return f"{value}{unit}"


def print_tables(
    results: dict[str, dict[str, Any]], slos: list[dict[str, Any]], console: Any
) -> None:
    """The per-phase tables of every run, then the SLO check (rich)."""
    from rich.markup import escape
    from rich.table import Table

    for mode, result in results.items():
        table = Table(title=f"{mode} run", title_justify="left")
        for column in (
            "phase",
            "req",
            "full",
            "degr",
            "failed",
            "API p50",
            "p95",
            "p99",
            "1st tok p50",
            "p95",
            "peak dl",
            "breaker trans.",
            "recovery",
        ):
            table.add_column(column, justify="right" if column != "phase" else "left")
        for p in result["phases"]:
            recovery = ", ".join(
                f"{k.split(':', 1)[1]} {recovery_text(v)}" for k, v in p["recovery"].items()
            )
            table.add_row(
                p["name"],
                str(p["requests"]),
                str(p["full"]),
                str(p["degraded"]),
                str(p["failed"]),
                _fmt(p["api_p50_ms"], " ms"),
                _fmt(p["api_p95_ms"], " ms"),
                _fmt(p["api_p99_ms"], " ms"),
                _fmt(p["first_token_p50_ms"], " ms"),
                _fmt(p["first_token_p95_ms"], " ms"),
                str(p["peak_downloads"]),
                str(p["breaker_transitions"]),
                recovery or "-",
            )
        t = result["totals"]
        table.add_row(
            "all",
            str(t["requests"]),
            str(t["full"]),
            str(t["degraded"]),
            str(t["failed"]),
            "",
            "",
            _fmt(t["api_p99_ms"], " ms"),
            "",
            _fmt(t["first_token_p95_ms"], " ms"),
            str(t["peak_downloads"]),
            str(t["breaker_transitions"]),
            "",
        )
        console.print(table)
    if slos:
        table = Table(title="resilient run vs its SLOs", title_justify="left")
        for column in ("SLO", "target", "measured", "met"):
            table.add_column(column)
        for s in slos:
            table.add_row(
                escape(s["slo"]), s["target"], _fmt(s["measured"]), "yes" if s["ok"] else "NO"
            )
        console.print(table)


def run_demo(options: DemoOptions) -> int:
    """Run the demo; return the exit status (1 if the resilient run missed an SLO)."""
    from rich.console import Console

    from .report import write_report

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    server = None
    redis: _RedisSwitch | None = None
    if options.redis:
        if options.redis == "auto":
            from resilience.testing import RedisServer

            server = RedisServer().start()
            redis = _RedisSwitch(server.url, server)
        else:
            redis = _RedisSwitch(options.redis)
    if options.workers > 1 and redis is None:
        console.print("[yellow]--workers > 1 without --redis: limits are per worker[/]")
    phases = options.phases or build_phases(options, with_redis=redis is not None)
    started = time.monotonic()
    runs: dict[str, dict[str, Any]] = {}
    try:
        for mode in options.modes:
            console.print(f"[bold]{mode} run[/] ({sum(p.seconds for p in phases):.0f} s of load)")
            runs[mode] = run_once(mode, options, phases, out, redis, console)
    finally:
        if server is not None:
            server.stop()
    results = {mode: analyze_run(run) for mode, run in runs.items()}
    slos = evaluate_slos(results["resilient"]) if "resilient" in results else []
    document = {
        "generated": time.time(),
        "options": {
            "quick": options.quick,
            "redis": bool(options.redis),
            "workers": options.workers,
            "seed": options.seed,
            "rate": options.jobs_per_second(),
        },
        "phases": [
            {"name": p.name, "seconds": p.seconds, "description": p.description} for p in phases
        ],
        "results": results,
        "slos": slos,
        "slos_met": all(s["ok"] for s in slos),
        "runs": runs,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    html = write_report(document, out)
    print_tables(results, slos, console)
    console.print(f"report: {html}")
    console.print(f"data:   {out / 'report.json'}")
    if slos and not document["slos_met"]:
        console.print("[red]the resilient run missed its SLOs[/]")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo(DemoOptions(quick=True)))
