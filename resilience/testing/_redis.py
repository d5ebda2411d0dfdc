"""A private ``redis-server`` per test, which the test may kill, pause or restart."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from .._validate import check_int
from ..errors import ConfigurationError

__all__ = ["RedisServer", "RedisUnavailable", "free_port", "resp_command"]


class RedisUnavailable(RuntimeError):
    """``redis-server`` is not installed or did not start.

    Example::

        try:
            server = RedisServer().start()
        except RedisUnavailable:
            pytest.skip("no redis-server")
    """


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Example: ``server = RedisServer(port=free_port()).start()``
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _encode(*args: object) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _read_reply(stream: Any) -> Any:
    line = stream.readline()
    if not line:
        raise ConnectionError("redis closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = stream.read(size + 2)[:-2]
        return data.decode(errors="replace")
    if kind == b"*":
        count = int(rest)
        return None if count < 0 else [_read_reply(stream) for _ in range(count)]
    raise RuntimeError(f"unexpected reply {line!r}")


def resp_command(port: int, *args: object, timeout: float = 2.0, host: str = "127.0.0.1") -> Any:
    """Send one command to Redis over a raw socket and return the parsed reply.

    Used by the fixture so that it needs no Redis client library.

    Example: ``assert resp_command(6380, "PING") == "PONG"``
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(_encode(*args))
        with sock.makefile("rb") as stream:
            return _read_reply(stream)


class RedisServer:
    """A ``redis-server`` process on a free port of 127.0.0.1, owned by one test.

    Nothing is persisted. ``kill()`` (SIGKILL), ``pause()`` (SIGSTOP: connections hang),
    ``resume()`` (SIGCONT), ``restart()`` (empty, same port) and ``flush_scripts()``
    (``SCRIPT FLUSH``) let chaos tests break it on purpose.

    Example::

        def test_survives_redis_death(redis_server):
            limiter = rs.RateLimiter("5/s", backend=RedisBackend.from_url(redis_server.url))
            redis_server.kill()
            assert limiter.try_acquire(key="k").allowed   # "local" fallback
    """

    def __init__(self, *, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        # Checked first: a bad argument would otherwise surface as "redis-server exited"
        # at start(), which the pytest plugin turns into a skipped test.
        if port is not None:
            check_int("port", port, minimum=1, maximum=65535)
        args: object = extra_args  # typed as a tuple; callers pass what they pass
        if (
            isinstance(args, str)
            or not isinstance(args, Iterable)
            or not all(isinstance(a, str) for a in extra_args)
        ):
            raise ConfigurationError(
                f"extra_args must be a sequence of strings such as ('--maxmemory', '1mb'), "
                f"got {extra_args!r}"
            )
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisUnavailable("redis-server is not on PATH (apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="resilience-redis-")
        self.paused = False

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Spawn the server and wait until it answers PING.

        The answer must come from the process just spawned: if another server holds the
        port, :class:`RedisUnavailable` is raised (and nothing is left behind) rather
        than handing the test someone else's Redis.
        """
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        os.makedirs(self._dir, exist_ok=True)  # stop() removed it
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir,
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
            *self.extra_args,
        ]
        # Its output goes to a file in its directory: what it says when it refuses to
        # start (a bad directive, a port in use) is the error message.
        with open(self._log_path, "wb") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.paused = False
        try:
            self._wait_until_up(self.process, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def _log_path(self) -> str:
        return os.path.join(self._dir, "redis-server.log")

    def _last_words(self) -> str:
        """The last lines redis-server wrote (why it exited), or ``""``."""
        try:
            with open(self._log_path, "rb") as log:
                text = log.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-3:])

    def _wait_until_up(self, process: subprocess.Popen[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                said = self._last_words()
                raise RedisUnavailable(
                    f"redis-server exited with {process.returncode} on port {self.port}: "
                    + (said or "no output (port in use?)")
                )
            answer: Any = None
            with contextlib.suppress(OSError, ConnectionError, RuntimeError):
                answer = resp_command(self.port, "INFO", "server", timeout=0.5)
            if answer is not None:
                found = re.search(r"process_id:(\d+)", str(answer))
                if found is not None and int(found.group(1)) == process.pid:
                    return
                raise RedisUnavailable(f"port {self.port} is held by another Redis server")
            time.sleep(0.02)
        raise RedisUnavailable(f"redis-server did not answer on port {self.port}")

    def command(self, *args: object) -> Any:
        """Run one Redis command over a raw socket (e.g. ``command("INFO", "commandstats")``)."""
        return resp_command(self.port, *args)

    def commandstats(self) -> dict[str, int]:
        """Calls per command since the last ``CONFIG RESETSTAT``: ``{"evalsha": 12, ...}``."""
        info = self.command("INFO", "commandstats")
        counts: dict[str, int] = {}
        for line in str(info).splitlines():
            if line.startswith("cmdstat_"):
                name, _, rest = line[len("cmdstat_") :].partition(":")
                fields = dict(item.split("=", 1) for item in rest.split(","))
                counts[name] = int(fields.get("calls", "0"))
        return counts

    def reset_stats(self) -> None:
        """``CONFIG RESETSTAT``."""
        self.command("CONFIG", "RESETSTAT")

    def flush_scripts(self) -> None:
        """``SCRIPT FLUSH``: the next EVALSHA gets NOSCRIPT."""
        self.command("SCRIPT", "FLUSH")

    def flushall(self) -> None:
        """``FLUSHALL``."""
        self.command("FLUSHALL")

    def kill(self) -> None:
        """SIGKILL the server (resumes it first if paused, so it really dies)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.paused:
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=10)
        self.process = None
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open and nothing answers."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.paused = False

    def restart(self) -> None:
        """Kill the server and start an empty one on the same port."""
        self.kill()
        self.start()

    @property
    def running(self) -> bool:
        """Whether the process is alive (paused counts as alive)."""
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Kill the server and remove its directory."""
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "paused" if self.paused else ("running" if self.running else "stopped")
        return f"<RedisServer {self.url} {state}>"
