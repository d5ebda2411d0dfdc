"""FaultProxy carries TCP streams like a direct connection: half-closes, whole tails.

The targets here are small TCP servers in threads (no Redis needed), on loopback only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from resilience.testing import FaultProxy, FaultProxyFactory

Handler = Callable[[socket.socket], None]
TIMEOUT = 5.0


@contextlib.contextmanager
def serve(handler: Handler) -> Iterator[int]:
    """Run ``handler`` for each connection to a loopback listener; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # accept() wakes up to see the end of the test
    stopping = threading.Event()
    threads: list[threading.Thread] = []

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(TIMEOUT)
            try:
                handler(conn)
            except OSError:
                pass

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=handle, args=(conn,), daemon=True)
            threads.append(thread)
            thread.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stopping.set()
        acceptor.join(TIMEOUT)
        listener.close()
        for thread in threads:
            thread.join(TIMEOUT)


def read_to_eof(sock: socket.socket, pause: float = 0.0) -> bytes:
    """Everything ``sock`` receives until the peer's end of stream."""
    chunks: list[bytes] = []
    while chunk := sock.recv(16 * 1024):
        chunks.append(chunk)
        if pause:
            time.sleep(pause)
    return b"".join(chunks)


def echo_after_eof(conn: socket.socket) -> None:
    """Read the whole request (up to the client's end of stream), then answer it."""
    conn.sendall(read_to_eof(conn))


def wait_idle(proxy: FaultProxy) -> None:
    """Wait (bounded) until the proxy holds no connection."""
    deadline = time.monotonic() + TIMEOUT
    while proxy.statistics().active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.statistics().active == 0


@pytest.fixture
def echo_after_eof_port() -> Iterator[int]:
    """The port of a target that answers each request once the client has sent it all."""
    with serve(echo_after_eof) as port:
        yield port


@pytest.mark.parametrize(
    "faults",
    [{}, {"latency": 0.05}, {"bandwidth": 200_000}],
    ids=["healthy", "latency", "bandwidth"],
)
def test_client_half_close_still_gets_the_reply(
    echo_after_eof_port: int, fault_proxy: FaultProxyFactory, faults: dict[str, Any]
) -> None:
    """A client that shuts down its sending side after its request gets the whole reply.

    The proxy used to treat the client's end of stream as the end of the connection:
    it closed both sides at once, so the target's reply was dropped (b'' then EOF, with
    11 bytes up and 0 down), where the direct connection answered b'hello world'.
    """
    proxy = fault_proxy(echo_after_eof_port)
    proxy.set(**faults)
    request = b"hello world" * 1000
    with socket.create_connection(proxy.address, timeout=TIMEOUT) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)  # "that was my whole request"
        assert read_to_eof(sock) == request
    wait_idle(proxy)  # both directions ended: the connection is gone
    stats = proxy.statistics()
    assert (stats.bytes_up, stats.bytes_down, stats.resets) == (len(request), len(request), 0)


def test_target_half_close_lets_the_client_still_send(fault_proxy: FaultProxyFactory) -> None:
    """A target that shuts down its sending side still receives what the client sends.

    The target's end of stream used to close the whole connection: the client's last
    words never reached the target.
    """
    received: list[bytes] = []

    def greet_then_listen(conn: socket.socket) -> None:
        conn.sendall(b"hello, I am done talking")
        conn.shutdown(socket.SHUT_WR)
        received.append(read_to_eof(conn))

    with serve(greet_then_listen) as port:
        proxy = fault_proxy(port)
        with socket.create_connection(proxy.address, timeout=TIMEOUT) as sock:
            assert read_to_eof(sock) == b"hello, I am done talking"
            sock.sendall(b"goodbye")
        wait_idle(proxy)
    assert received == [b"goodbye"]


def test_target_closing_after_a_long_reply_loses_no_tail(fault_proxy: FaultProxyFactory) -> None:
    """A reply larger than the buffers on the way, to a slow reader, arrives whole.

    The target's end of stream used to abort the client side at once, discarding what
    the proxy still held for a client that reads slower than the target writes.
    """
    size = 4_000_000
    payload = bytes(range(256)) * (size // 256)

    def blast(conn: socket.socket) -> None:
        conn.sendall(payload)

    with serve(blast) as port:
        proxy = fault_proxy(port)
        with socket.create_connection(proxy.address, timeout=TIMEOUT) as sock:
            time.sleep(0.3)  # not reading yet: every buffer on the way fills up
            assert read_to_eof(sock, pause=0.001) == payload


def test_stop_ends_a_half_closed_connection() -> None:
    """stop() ends a connection with one direction still open, without hanging.

    A half-closed connection stays open until the target ends its side too; stopping
    the proxy must not wait for that, nor leave its thread behind.
    """
    saw_eof = threading.Event()
    release = threading.Event()

    def listen_then_hold(conn: socket.socket) -> None:
        read_to_eof(conn)
        saw_eof.set()
        release.wait(TIMEOUT)  # never answers while the proxy stops

    with serve(listen_then_hold) as port:
        proxy = FaultProxy(port).start()
        try:
            with socket.create_connection(proxy.address, timeout=TIMEOUT) as sock:
                sock.sendall(b"request")
                sock.shutdown(socket.SHUT_WR)
                assert saw_eof.wait(TIMEOUT)
                assert proxy.statistics().active == 1
                started = time.monotonic()
                proxy.stop()
                assert time.monotonic() - started < 2.0
                assert not proxy.running
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(100) == b""  # closed by the proxy, not left hanging
        finally:
            release.set()
            proxy.stop()
    assert not any(
        t.name == "resilience-FaultProxy" and t.is_alive() for t in threading.enumerate()
    )


def test_a_blackhole_hides_the_targets_close_until_it_is_lifted(
    fault_proxy: FaultProxyFactory,
) -> None:
    """The target answers and closes while the network is blackholed: the client hears
    nothing (a dead network, not a closed connection), and once the blackhole is
    lifted it gets the reply, then the end of stream. (The target's close used to end
    the client's connection at once and drop the reply.)"""
    closed = threading.Event()

    def reply_then_close(conn: socket.socket) -> None:
        conn.recv(100)
        blackholed.wait(TIMEOUT)
        conn.sendall(b"REPLY")
        conn.shutdown(socket.SHUT_WR)
        closed.set()

    blackholed = threading.Event()
    with serve(reply_then_close) as port:
        proxy = fault_proxy(port)
        with socket.create_connection(proxy.address, timeout=TIMEOUT) as client:
            client.sendall(b"REQUEST")
            # the request has reached the target once it has been counted
            deadline = time.monotonic() + TIMEOUT
            while proxy.statistics().bytes_up < len(b"REQUEST") and time.monotonic() < deadline:
                time.sleep(0.005)
            proxy.blackhole = True
            blackholed.set()
            assert closed.wait(TIMEOUT)
            client.settimeout(0.3)
            with pytest.raises(TimeoutError):
                client.recv(100)  # silence, not an end of stream
            proxy.blackhole = False
            client.settimeout(TIMEOUT)
            assert read_to_eof(client) == b"REPLY"
    wait_idle(proxy)
