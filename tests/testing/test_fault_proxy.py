"""FaultProxy: a loopback TCP proxy whose network faults change while a test runs."""

from __future__ import annotations

import socket
import time

import pytest

import resilience as rs
from resilience.testing import FaultProxy, FaultProxyFactory, RedisServer, resp_command

pytestmark = pytest.mark.redis


def ping(proxy: FaultProxy, timeout: float = 2.0) -> object:
    return resp_command(proxy.port, "PING", timeout=timeout)


def exchange(sock: socket.socket) -> bytes:
    """Send a PING on an open socket and read the reply."""
    sock.sendall(b"PING\r\n")
    return sock.recv(100)


def test_forwards_to_the_target(redis_server: RedisServer, fault_proxy: FaultProxyFactory) -> None:
    """A healthy proxy is transparent."""
    proxy = fault_proxy(redis_server.port)
    assert ping(proxy) == "PONG"
    assert resp_command(proxy.port, "SET", "k", "v") == "OK"
    assert redis_server.command("GET", "k") == "v"
    assert proxy.url("redis", "/0") == f"redis://127.0.0.1:{proxy.port}/0"


def test_latency_delays_each_reply(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """latency holds replies back: a round trip takes at least that long."""
    proxy = fault_proxy(redis_server.port)
    proxy.latency = 0.2
    started = time.monotonic()
    assert ping(proxy) == "PONG"
    assert time.monotonic() - started >= 0.2
    proxy.latency = 0.0
    assert proxy.latency == 0.0


def test_blackhole_accepts_and_never_answers_then_recovers(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """A blackhole times out clients; once lifted, new and held connections work again."""
    proxy = fault_proxy(redis_server.port)
    held = socket.create_connection(proxy.address, timeout=2)
    with proxy.faulted(blackhole=True):
        assert proxy.blackhole
        with pytest.raises(TimeoutError):
            ping(proxy, timeout=0.2)
        held.sendall(b"PING\r\n")
        held.settimeout(0.2)
        with pytest.raises(TimeoutError):
            held.recv(100)
    assert not proxy.blackhole
    held.settimeout(2)
    assert held.recv(100) == b"+PONG\r\n"  # the held request is delivered after the heal
    held.close()
    assert ping(proxy) == "PONG"


def test_clients_leaving_a_blackhole_free_their_connection(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """Connections closed by clients during a blackhole do not pile up."""
    proxy = fault_proxy(redis_server.port, max_connections=4)
    proxy.blackhole = True
    for _ in range(10):  # more than max_connections, each given up by its client
        with pytest.raises(TimeoutError):
            ping(proxy, timeout=0.05)
    deadline = time.monotonic() + 5
    while proxy.statistics().active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.statistics().active == 0
    assert proxy.statistics().rejected == 0
    proxy.heal()
    assert ping(proxy) == "PONG"


def test_refuse_closes_the_listener(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """refuse: new connections get ECONNREFUSED; the same port works again afterwards."""
    proxy = fault_proxy(redis_server.port)
    port = proxy.port
    with proxy.faulted(refuse=True):
        with pytest.raises(ConnectionRefusedError):
            ping(proxy)
    assert proxy.port == port
    assert ping(proxy) == "PONG"


def test_a_connection_made_just_before_refuse_keeps_working(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """A connection the proxy had not accepted yet when ``refuse`` was set is an existing
    connection: it is served, not left hanging in the closed listener's queue."""
    proxy = fault_proxy(redis_server.port)
    for _ in range(10):
        with socket.create_connection(proxy.address, timeout=2.0) as sock:
            proxy.refuse = True
            assert exchange(sock) == b"+PONG\r\n"
        proxy.refuse = False


def test_reset_new_resets_on_accept(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """reset_new: connections are accepted and reset at once."""
    proxy = fault_proxy(redis_server.port)
    proxy.reset_new = True
    with pytest.raises(ConnectionResetError):
        ping(proxy)
    proxy.reset_new = False
    assert ping(proxy) == "PONG"
    assert proxy.statistics().resets == 1


def test_reset_connections_resets_open_ones(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """reset_connections() sends a TCP reset on every open connection."""
    proxy = fault_proxy(redis_server.port)
    sock = socket.create_connection(proxy.address, timeout=2)
    sock.sendall(b"PING\r\n")
    assert sock.recv(100) == b"+PONG\r\n"
    assert proxy.reset_connections() == 1
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        exchange(sock)
    sock.close()
    assert ping(proxy) == "PONG"


def test_bandwidth_cap_slows_large_replies(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """bandwidth caps bytes per second: 2 KB at 10 KB/s takes >= 0.2 s."""
    proxy = fault_proxy(redis_server.port)
    redis_server.command("SET", "big", "x" * 2000)
    proxy.bandwidth = 10_000
    started = time.monotonic()
    assert resp_command(proxy.port, "GET", "big") == "x" * 2000
    assert time.monotonic() - started >= 0.2
    proxy.bandwidth = None
    assert proxy.bandwidth is None


def test_max_connections_rejects_the_excess(
    redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    """Beyond max_connections, new connections are closed: the proxy stays bounded."""
    proxy = fault_proxy(redis_server.port, max_connections=2)
    open_ = [socket.create_connection(proxy.address, timeout=2) for _ in range(2)]
    for sock in open_:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"+PONG\r\n"
    with pytest.raises((ConnectionResetError, ConnectionError)):
        ping(proxy)
    assert proxy.statistics().rejected == 1
    for sock in open_:
        sock.close()


def test_target_down_resets_clients(fault_proxy: FaultProxyFactory) -> None:
    """When the target refuses, the client sees a reset, not a hang."""
    from resilience.testing import free_port

    proxy = fault_proxy(free_port())
    with pytest.raises((ConnectionResetError, ConnectionError)):
        ping(proxy)


def test_context_manager_stops_everything(redis_server: RedisServer) -> None:
    """Leaving the with block closes the listener and the thread."""
    with FaultProxy(redis_server.port) as proxy:
        assert ping(proxy) == "PONG"
        port = proxy.port
    assert not proxy.running
    with pytest.raises(ConnectionRefusedError):
        resp_command(port, "PING", timeout=0.5)
    with pytest.raises(RuntimeError, match="not running"):
        proxy.latency = 1.0
    proxy.stop()  # idempotent


def test_listens_on_loopback_only() -> None:
    """Binding anything but loopback is refused at construction."""
    with pytest.raises(rs.ConfigurationError, match="loopback only"):
        FaultProxy(6379, host="0.0.0.0")
    with pytest.raises(rs.ConfigurationError, match="latency must be >= 0"):
        with FaultProxy(6379) as proxy:
            proxy.set(latency=-1)


@pytest.mark.parametrize("switch", ["blackhole", "refuse", "reset_new"])
def test_a_switch_takes_a_bool_only(switch: str) -> None:
    """``"false"`` is no switch: it used to turn a blackhole on (any value counted by
    its truth); refused, and the proxy is left as it was."""
    with FaultProxy(6379) as proxy:
        with pytest.raises(rs.ConfigurationError, match=f"{switch} must be True or False"):
            proxy.set(**{switch: "false"})
        with pytest.raises(rs.ConfigurationError, match=switch):
            setattr(proxy, switch, 1)
        assert getattr(proxy, switch) is False


def test_repr_shows_the_faults(redis_server: RedisServer, fault_proxy: FaultProxyFactory) -> None:
    """repr names the active faults."""
    proxy = fault_proxy(redis_server.port)
    proxy.set(latency=0.1, blackhole=True)
    assert "latency=0.1" in repr(proxy)
    assert "blackhole" in repr(proxy)
    proxy.heal()
    assert "healthy" in repr(proxy)
