"""Run ASGI apps for real with uvicorn on 127.0.0.1: in a thread, or in a child process.

The demo starts the simulated upstreams and the service as child processes (so they
use both cores and can be stopped cleanly); the tests start them in threads of the
test process, each on a free port.

Example::

    with serve_in_thread(PlatformsApp(seed=1)) as server:
        httpx.get(f"{server.url}/_control/state")
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ChildProcess",
    "ThreadServer",
    "bind",
    "serve_in_thread",
    "uvicorn_config",
    "uvicorn_server",
]


def bind(port: int = 0, host: str = "127.0.0.1") -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: a free one).

    Created with ``proto=IPPROTO_TCP`` so that asyncio sets ``TCP_NODELAY`` on every
    accepted connection (it only does for sockets whose ``proto`` says TCP): without it
    a response written in two parts (head, then body) waits for the peer's delayed ACK,
    40 ms on Linux, on every request.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


def uvicorn_config(app: Any, **overrides: Any) -> Any:
    """A quiet uvicorn ``Config`` tuned for many concurrent loopback connections."""
    import uvicorn

    options: dict[str, Any] = {
        "log_level": "critical",
        "access_log": False,
        "lifespan": "off",
        "backlog": 4096,
        "timeout_keep_alive": 30,
        "http": "auto",  # httptools when installed (as uvicorn[standard] deploys), else h11
        "loop": "asyncio",
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


def uvicorn_server(app: Any, **overrides: Any) -> Any:
    """A uvicorn ``Server`` for ``app`` (see :func:`uvicorn_config`) that tells the app
    as soon as it is asked to exit.

    On SIGTERM/SIGINT (or ``should_exit``) uvicorn stops accepting connections, waits
    for the requests in flight, and only then runs the lifespan shutdown. A request that
    streams until something else ends (an SSE follower of a job) holds that wait as long.
    If ``app.state.on_shutdown_started`` exists, this server calls it first, before the
    wait: the summarizer service ends its streams there.
    """
    return _server_class()(uvicorn_config(app, **overrides))


@functools.cache
def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            state = getattr(self.config.app, "state", None)
            hook = getattr(state, "on_shutdown_started", None)
            if hook is not None:
                try:
                    hook()
                except Exception:  # the shutdown goes on all the same
                    logging.getLogger(__name__).exception("on_shutdown_started failed")
            await super().shutdown(sockets)

    return Server


class ThreadServer:
    """A uvicorn server running ``app`` in a daemon thread (see :func:`serve_in_thread`)."""

    def __init__(self, app: Any, *, port: int = 0, **options: Any) -> None:
        self.sock = bind(port)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn_server(app, **options)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self, timeout: float = 10.0) -> ThreadServer:
        """Start serving and wait until uvicorn reports it has started."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self.server.should_exit = True
        self.thread.join(timeout)
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> ThreadServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(app: Any, *, port: int = 0, **options: Any) -> ThreadServer:
    """Serve ``app`` on 127.0.0.1 in a thread; use as a context manager or call ``stop()``."""
    return ThreadServer(app, port=port, **options)


class ChildProcess:
    """A child ``python -m integrations.summarizer ...`` that prints one JSON line when ready.

    Example::

        child = ChildProcess(["upstreams", "--seed", "1"]).start()
        child.info["platforms"]       # the port it listens on
        child.stop()
    """

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.args = [sys.executable, "-m", "integrations.summarizer", *args]
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    def spawn(self) -> ChildProcess:
        """Start the child without waiting for it (see :meth:`wait_ready`)."""
        self.process = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=None,
            env=self.env,
            start_new_session=True,
            cwd=os.getcwd(),
        )
        return self

    def wait_ready(self, timeout: float = 30.0) -> ChildProcess:
        """Wait for the child's ready line (raises, and kills it, if it does not come)."""
        assert self.process is not None, "spawn() first"
        ready: dict[str, Any] = {}

        def read() -> None:
            assert self.process is not None
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            with contextlib.suppress(ValueError):
                ready.update(json.loads(line))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not ready and self.process.poll() is None:
            self.signal(signal.SIGKILL)
        if not ready:
            self.stop()
            raise RuntimeError(f"{' '.join(self.args[2:])} did not start")
        self.info = ready
        return self

    def start(self, timeout: float = 30.0) -> ChildProcess:
        """Spawn the child and wait for its ready line (raises if it dies first)."""
        return self.spawn().wait_ready(timeout)

    @staticmethod
    def start_all(children: Sequence[ChildProcess], timeout: float = 30.0) -> None:
        """Spawn every child at once, then wait for each (start-up costs overlap)."""
        for child in children:
            child.spawn()
        try:
            for child in children:
                child.wait_ready(timeout)
        except BaseException:
            for child in children:
                child.stop()
            raise

    @property
    def pid(self) -> int:
        """The child's process id."""
        assert self.process is not None
        return self.process.pid

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's process group (its workers included)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the child's process group, SIGKILL it if it does not exit in time."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout)
        self.process = None

    def __enter__(self) -> ChildProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
