"""A TCP proxy on 127.0.0.1 whose network faults a test changes while it runs."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._validate import check_bool, check_int, check_number
from ..errors import ConfigurationError

__all__ = ["FaultProxy", "ProxyStatistics"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_CHUNK = 16 * 1024
_QUEUE_CHUNKS = 16
_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class ProxyStatistics:
    """Counters of a :class:`FaultProxy` since it started.

    ``accepted``: connections accepted; ``active``: open now; ``rejected``: closed at
    once (over ``max_connections``, ``reset_new`` or the target refused); ``resets``:
    connections reset by :meth:`FaultProxy.reset_connections` or ``reset_new``;
    ``bytes_up`` / ``bytes_down``: bytes delivered to the target / to the clients.

    Example: ``assert proxy.statistics().active == 0``
    """

    accepted: int
    active: int
    rejected: int
    resets: int
    bytes_up: int
    bytes_down: int


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0) instead of a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    __slots__ = ("client", "done", "open_directions", "reset", "tasks", "upstream")

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.done = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.reset = False
        self.open_directions = 2

    def finish(self, *, reset: bool = False) -> None:
        self.reset = self.reset or reset
        self.done.set()

    def direction_ended(self) -> None:
        """One direction reached its end of stream; the connection ends with the second."""
        self.open_directions -= 1
        if self.open_directions <= 0:
            self.finish()

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is None:
                continue
            if self.reset:
                _rst(writer)
            else:
                writer.transport.abort()


async def _half_close(writer: asyncio.StreamWriter) -> bool:
    """Pass an end of stream on: send what is buffered, then a FIN (``shutdown(SHUT_WR)``).

    Returns False when the transport cannot half-close; the connection then has to end.
    """
    if not writer.can_write_eof():
        return False
    # drain() only waits for the buffer to fall below its high-water mark; with a mark
    # of 0 it waits until everything was sent, so that closing later loses no data.
    writer.transport.set_write_buffer_limits(high=0)
    await writer.drain()
    writer.write_eof()
    return True


#: A host name, IPv4 or IPv6 address (no spaces, no scheme).
_HOST = re.compile(r"[A-Za-z0-9._:\[\]-]+")


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of Redis (or any TCP service), for chaos tests.

    It runs its own event loop in a daemon thread, so sync and async tests use it
    alike, and forwards ``127.0.0.1:proxy.port`` to ``target_host:target_port``. While
    it runs, a test changes its behaviour (each change is in effect when the call
    returns):

    * ``latency`` (seconds): every chunk from the target back to the client is held
      that long, so each request/response round trip gains ``latency``;
    * ``bandwidth`` (bytes per second, per connection and direction, ``None``: no cap);
    * ``blackhole``: accept connections and never answer; data waits (bounded, with TCP
      back-pressure) and flows again when the blackhole is lifted;
    * ``refuse``: close the listening socket, so new connections are refused
      (``ECONNREFUSED``); existing ones keep working;
    * ``reset_new``: accept new connections and reset them at once (``ECONNRESET``);
    * :meth:`reset_connections`: reset every open connection now.

    Healthy, it is transparent, half-closes included: an end of stream from one side
    is passed on after the data before it, and the other direction keeps flowing until
    it ends too. :meth:`heal` clears everything; ``with proxy.faulted(blackhole=True):``
    heals on exit. The proxy listens on loopback only, holds at most ``max_connections``
    connections and a bounded buffer per connection, and :meth:`stop` (or leaving the
    ``with`` block, or the end of the test with the ``fault_proxy`` fixture) closes
    everything.

    Example::

        def test_limiter_survives_slow_redis(redis_server, fault_proxy):
            proxy = fault_proxy(redis_server.port)
            backend = RedisBackend.from_url(proxy.url("redis", "/0"), timeout=0.05)
            limiter = rs.RateLimiter("100/s", backend=backend)
            with proxy.faulted(latency=0.2):
                assert limiter.try_acquire(key="k").allowed    # "local" fallback
    """

    def __init__(
        self,
        target_port: int,
        target_host: str = "127.0.0.1",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = 100,
        connect_timeout: float = 2.0,
    ) -> None:
        self.target_port: int = check_int("target_port", target_port, minimum=1, maximum=65535)
        if not isinstance(target_host, str) or not _HOST.fullmatch(target_host):
            # A host no connection can reach would look exactly like the outage under test.
            raise ConfigurationError(
                f"target_host must be a host name or address, got {target_host!r}"
            )
        self.target_host = target_host
        if host not in _LOOPBACK:
            raise ConfigurationError(f"FaultProxy listens on loopback only, got host={host!r}")
        self.host = host
        self._requested_port: int = check_int("port", port, minimum=0, maximum=65535)
        self.port = 0
        self.max_connections: int = check_int("max_connections", max_connections, minimum=1)
        self.connect_timeout: float = check_number("connect_timeout", connect_timeout, strict=True)
        self._latency = 0.0
        self._bandwidth: float | None = None
        self._blackhole = False
        self._refuse = False
        self._reset_new = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._counts = {"accepted": 0, "rejected": 0, "resets": 0, "up": 0, "down": 0}

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 5.0) -> FaultProxy:
        """Start the proxy thread and wait until it listens; returns ``self``.

        Example: ``proxy = FaultProxy(6380).start()``
        """
        if self._thread is not None:
            raise RuntimeError("FaultProxy already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                try:
                    loop.run_until_complete(self._startup())
                except BaseException as exc:
                    failure.append(exc)
                    return
                finally:
                    ready.set()
                loop.run_forever()
            finally:
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.wait(pending, timeout=2.0))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="resilience-FaultProxy", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("FaultProxy did not start in time")
        if failure:
            self._thread.join(timeout)
            self._thread = None
            raise failure[0]
        return self

    async def _startup(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        await self._listen(self._requested_port)
        assert self._server is not None
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _listen(self, port: int) -> None:
        self._server = await asyncio.start_server(
            self._on_client, self.host, port, reuse_address=True, backlog=self.max_connections
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Close every connection, stop listening and end the thread (idempotent).

        Example: ``proxy.stop()``
        """
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None
        self._loop = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        connections = list(self._connections)
        for connection in connections:
            connection.finish()
        tasks = [task for connection in connections for task in connection.tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        for connection in connections:
            connection.close()
        self._connections.clear()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=2.0)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the proxy thread is up."""
        return self._thread is not None and self._thread.is_alive()

    def url(self, scheme: str = "tcp", path: str = "") -> str:
        """``scheme://host:port`` + ``path`` of the proxy (e.g. ``proxy.url("redis", "/0")``);
        an IPv6 host is written in brackets (``redis://[::1]:6390/0``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{path}"

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` to connect to."""
        return self.host, self.port

    # -- changing faults at run time ----------------------------------------------------

    def _run(self, coro: Any, timeout: float = 5.0) -> Any:
        loop = self._loop
        if loop is None or not loop.is_running():
            coro.close()
            raise RuntimeError("FaultProxy is not running: call start() or use it in a with block")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def set(
        self,
        *,
        latency: float = _UNSET,
        bandwidth: float | None = _UNSET,
        blackhole: bool = _UNSET,
        refuse: bool = _UNSET,
        reset_new: bool = _UNSET,
    ) -> None:
        """Change several faults at once; the change is in effect when this returns.

        Example: ``proxy.set(latency=0.2, bandwidth=10_000)``
        """
        if latency is not _UNSET:
            latency = check_number("latency", latency)
        if bandwidth is not _UNSET:
            bandwidth = check_number("bandwidth", bandwidth, strict=True, allow_none=True)
        # A switch, never a truthy value: "false" would turn a blackhole on.
        if blackhole is not _UNSET:
            blackhole = check_bool("blackhole", blackhole)
        if refuse is not _UNSET:
            refuse = check_bool("refuse", refuse)
        if reset_new is not _UNSET:
            reset_new = check_bool("reset_new", reset_new)
        self._run(self._apply(latency, bandwidth, blackhole, refuse, reset_new))

    async def _apply(
        self, latency: Any, bandwidth: Any, blackhole: Any, refuse: Any, reset_new: Any
    ) -> None:
        if latency is not _UNSET:
            self._latency = latency
        if bandwidth is not _UNSET:
            self._bandwidth = bandwidth
        if reset_new is not _UNSET:
            self._reset_new = bool(reset_new)
        if blackhole is not _UNSET:
            self._blackhole = bool(blackhole)
            assert self._flowing is not None
            if self._blackhole:
                self._flowing.clear()
            else:
                self._flowing.set()
        if refuse is not _UNSET and bool(refuse) != self._refuse:
            self._refuse = bool(refuse)
            if self._refuse:
                if self._server is not None:
                    # Connections made before this call may still wait in the accept
                    # queue; closing the listener now would leave them hanging. Let the
                    # loop poll the listener and accept them first (they are existing
                    # connections, and keep working).
                    for _ in range(3):
                        await asyncio.sleep(0)
                    self._server.close()
                    self._server = None
            else:
                await self._listen(self.port)

    def heal(self) -> None:
        """Clear every fault: no latency, no cap, no blackhole, accept connections again.

        Example: ``proxy.heal()``
        """
        self.set(latency=0.0, bandwidth=None, blackhole=False, refuse=False, reset_new=False)

    @contextlib.contextmanager
    def faulted(self, **faults: Any) -> Iterator[FaultProxy]:
        """Apply faults (as :meth:`set`) for the ``with`` block, then :meth:`heal`.

        Example::

            with proxy.faulted(blackhole=True):
                ...   # Redis looks dead
            # healed here
        """
        self.set(**faults)
        try:
            yield self
        finally:
            if self.running:
                self.heal()

    def reset_connections(self) -> int:
        """Reset (TCP RST) every open connection now; returns how many.

        Example: ``proxy.reset_connections()``
        """
        result: int = self._run(self._reset_all())
        return result

    async def _reset_all(self) -> int:
        connections = list(self._connections)
        for connection in connections:
            connection.finish(reset=True)
        self._counts["resets"] += len(connections)
        return len(connections)

    @property
    def latency(self) -> float:
        """Seconds added to every response chunk (set it to change it)."""
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        self.set(latency=seconds)

    @property
    def bandwidth(self) -> float | None:
        """Bytes per second per connection and direction, or ``None`` for no cap."""
        return self._bandwidth

    @bandwidth.setter
    def bandwidth(self, bytes_per_second: float | None) -> None:
        self.set(bandwidth=bytes_per_second)

    @property
    def blackhole(self) -> bool:
        """Whether connections are accepted and never answered."""
        return self._blackhole

    @blackhole.setter
    def blackhole(self, on: bool) -> None:
        self.set(blackhole=on)

    @property
    def refuse(self) -> bool:
        """Whether new connections are refused."""
        return self._refuse

    @refuse.setter
    def refuse(self, on: bool) -> None:
        self.set(refuse=on)

    @property
    def reset_new(self) -> bool:
        """Whether new connections are reset as soon as they are accepted."""
        return self._reset_new

    @reset_new.setter
    def reset_new(self, on: bool) -> None:
        self.set(reset_new=on)

    def statistics(self) -> ProxyStatistics:
        """Connection and byte counters.

        Example: ``proxy.statistics().accepted``
        """
        c = self._counts
        return ProxyStatistics(
            c["accepted"], len(self._connections), c["rejected"], c["resets"], c["up"], c["down"]
        )

    def __repr__(self) -> str:
        faults = [
            name
            for name, on in (
                (f"latency={self._latency:g}", self._latency > 0),
                (f"bandwidth={self._bandwidth}", self._bandwidth is not None),
                ("blackhole", self._blackhole),
                ("refuse", self._refuse),
                ("reset_new", self._reset_new),
            )
            if on
        ]
        state = ", ".join(faults) or "healthy"
        return (
            f"<FaultProxy {self.host}:{self.port} -> {self.target_host}:{self.target_port} {state}>"
        )

    # -- the proxy (runs on its own loop) -------------------------------------------------

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._counts["accepted"] += 1
        if self._reset_new:
            self._counts["rejected"] += 1
            self._counts["resets"] += 1
            _rst(writer)
            return
        if len(self._connections) >= self.max_connections:
            self._counts["rejected"] += 1
            _rst(writer)
            return
        connection = _Connection(writer)
        self._connections.add(connection)
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        try:
            await self._serve(connection, reader)
        finally:
            for task in connection.tasks:
                task.cancel()
            if connection.tasks:
                await asyncio.wait(connection.tasks, timeout=2.0)
            connection.close()
            self._connections.discard(connection)
            if handler is not None:
                self._handlers.discard(handler)

    async def _serve(self, connection: _Connection, client: asyncio.StreamReader) -> None:
        assert self._flowing is not None
        up: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
        down: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
        spawn = asyncio.get_running_loop().create_task
        connection.tasks.append(spawn(self._read(client, up, connection, delayed=False)))
        # Blackholed: accept, read (bounded), never connect or answer until lifted.
        flowing = spawn(self._flowing.wait())
        waiting = spawn(connection.done.wait())
        await asyncio.wait({flowing, waiting}, return_when=asyncio.FIRST_COMPLETED)
        flowing.cancel()
        waiting.cancel()
        if connection.done.is_set():
            return
        try:
            target_reader, target_writer = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port),
                self.connect_timeout,
            )
        except (TimeoutError, OSError):
            self._counts["rejected"] += 1
            connection.finish(reset=True)
            return
        connection.upstream = target_writer
        connection.tasks.append(spawn(self._read(target_reader, down, connection, delayed=True)))
        connection.tasks.append(spawn(self._write(up, target_writer, connection, "up")))
        connection.tasks.append(spawn(self._write(down, connection.client, connection, "down")))
        await connection.done.wait()

    async def _read(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        connection: _Connection,
        *,
        delayed: bool,
    ) -> None:
        assert self._flowing is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    if not delayed and not self._flowing.is_set():
                        connection.finish()  # the client left a blackholed connection
                    # The target's end of stream is queued behind its last reply: a
                    # blackhole hides both until it is lifted.
                    await queue.put(None)
                    return
                release = loop.time() + (self._latency if delayed else 0.0)
                await queue.put((release, data))
        except asyncio.CancelledError:
            raise
        except Exception:
            if delayed:
                await self._flowing.wait()  # a blackhole hides the target's reset too
            connection.finish(reset=True)

    async def _write(
        self,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
        connection: _Connection,
        direction: str,
    ) -> None:
        assert self._flowing is not None
        loop = asyncio.get_running_loop()
        half_closed = False
        try:
            while True:
                item = await queue.get()
                if item is None:
                    await self._flowing.wait()
                    # End of stream this way only: the other direction may still carry
                    # the reply to a client that shut down its sending side.
                    half_closed = await _half_close(writer)
                    return
                release, data = item
                await self._flowing.wait()
                delay = release - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    await self._flowing.wait()
                await self._send(writer, data)
                self._counts[direction] += len(data)
        except asyncio.CancelledError:
            raise
        except Exception:
            connection.reset = True
        finally:
            if half_closed:
                connection.direction_ended()
            else:
                connection.finish()

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        bandwidth = self._bandwidth
        if bandwidth is None:
            writer.write(data)
            await writer.drain()
            return
        step = max(1, int(bandwidth / 20))
        for start in range(0, len(data), step):
            piece = data[start : start + step]
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(len(piece) / bandwidth)
