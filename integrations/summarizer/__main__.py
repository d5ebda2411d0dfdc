"""Command line: ``python -m integrations.summarizer {demo,serve,upstreams}``.

* ``demo [--quick] [--duration S] [--redis URL|auto] [--workers N] [--out DIR]``: the
  chaos demo (naive then resilient), writes ``report.json`` and ``report.html``; exit
  status 1 when the resilient run misses an SLO.
* ``serve``: one service worker (configuration from ``SUMMARIZER_CONFIG``, see
  :class:`~integrations.summarizer.config.ServiceConfig`); prints ``{"port": N}``.
* ``upstreams``: the simulated platforms and model provider; prints their ports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any


def _serve_forever(servers: list[tuple[Any, Any]], ready: dict[str, Any]) -> None:
    async def main() -> None:
        # uvicorn handles SIGTERM/SIGINT itself (each server exits, then the signal is
        # raised again for the next one)
        tasks = [asyncio.create_task(server.serve(sockets=[sock])) for server, sock in servers]
        while not all(server.started for server, _ in servers):
            await asyncio.sleep(0.01)
        from ._asgi import tune_gc

        tune_gc()
        print(json.dumps(ready), flush=True)
        await asyncio.gather(*tasks)

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


def _upstreams(args: argparse.Namespace) -> int:
    import uvicorn

    from .models import ModelsApp
    from .platforms import PlatformsApp
    from .servers import bind, uvicorn_config

    servers: list[tuple[Any, Any]] = []
    ready: dict[str, Any] = {}
    if args.only in (None, "platforms"):
        sock = bind(args.platforms_port)
        server = uvicorn.Server(uvicorn_config(PlatformsApp(seed=args.seed)))
        servers.append((server, sock))
        ready["platforms"] = sock.getsockname()[1]
    if args.only in (None, "models"):
        sock = bind(args.models_port)
        server = uvicorn.Server(uvicorn_config(ModelsApp(seed=args.seed)))
        servers.append((server, sock))
        ready["models"] = sock.getsockname()[1]
    _serve_forever(servers, ready)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .config import ServiceConfig
    from .servers import bind, uvicorn_server
    from .service import create_app

    cfg = ServiceConfig.from_env()
    sock = bind(args.port)
    # On SIGTERM the service ends its streams at once (see uvicorn_server); requests
    # still in flight after the grace period are cancelled, so the shutdown is bounded.
    server = uvicorn_server(create_app(cfg), lifespan="on", timeout_graceful_shutdown=3)
    _serve_forever([(server, sock)], {"port": sock.getsockname()[1], "worker": cfg.worker_index})
    return 0


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` above zero."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
        return value

    return parse


def _port(text: str) -> int:
    """An argparse type: a TCP port, or 0 for a free one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 (any free one) to 65535, got {value}")
    return value


def _terminated(signum: int, frame: object) -> None:
    # SIGTERM (timeout, kill, systemd, CI cancelling) ends the demo as Ctrl-C does:
    # through its cleanup, which stops the upstreams, the workers and the private
    # Redis it started in sessions of their own (they outlived it, holding their ports).
    raise SystemExit(128 + signum)


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in ("naive", "resilient")]
    if not modes or unknown:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of naive and resilient, got {text!r}"
        )
    return modes


def _demo(args: argparse.Namespace) -> int:
    from .demo import DemoOptions, run_demo

    signal.signal(signal.SIGTERM, _terminated)

    options = DemoOptions(
        quick=args.quick,
        duration=args.duration,
        redis=args.redis,
        workers=args.workers,
        out=args.out,
        seed=args.seed,
        modes=args.modes,
        live=not args.no_live,
    )
    return run_demo(options)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m integrations.summarizer``."""
    parser = argparse.ArgumentParser(prog="python -m integrations.summarizer")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run the chaos demo and write the report")
    demo.add_argument("--quick", action="store_true", help="short phases (about 85 s in all)")
    demo.add_argument(
        "--duration", type=_positive(float), default=None, help="seconds of load per run"
    )
    demo.add_argument("--redis", default=None, help="redis://... or 'auto' (private server)")
    demo.add_argument(
        "--workers", type=_positive(int), default=1, help="service processes (needs --redis)"
    )
    demo.add_argument("--out", default="summarizer-report", help="report directory")
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument(
        "--modes", type=_modes, default=("naive", "resilient"), help="which runs, in order"
    )
    demo.add_argument("--no-live", action="store_true", help="no live progress display")
    demo.set_defaults(func=_demo)

    serve = commands.add_parser(
        "serve",
        help="run one service worker (configuration: SUMMARIZER_CONFIG, JSON of ServiceConfig)",
    )
    serve.add_argument("--port", type=_port, default=8000, help="0: a free port (default 8000)")
    serve.set_defaults(func=_serve)

    upstreams = commands.add_parser("upstreams", help="run the simulated upstreams")
    upstreams.add_argument("--seed", type=int, default=1)
    upstreams.add_argument(
        "--platforms-port", type=_port, default=8001, help="0: a free port (default 8001)"
    )
    upstreams.add_argument(
        "--models-port", type=_port, default=8002, help="0: a free port (default 8002)"
    )
    upstreams.add_argument("--only", choices=("platforms", "models"), default=None)
    upstreams.set_defaults(func=_upstreams)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except Exception as exc:
        # What a user got wrong or what the machine refused (a port in use, a bad
        # SUMMARIZER_CONFIG or --redis, an unwritable --out): a message, not a traceback.
        if not isinstance(exc, OSError | ValueError) and not _from_redis(exc):
            raise
        parser.exit(2, f"{parser.prog}: error: {exc}\n")


def _from_redis(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "redis"


if __name__ == "__main__":
    sys.exit(main())
