"""The redis_server fixture: a private server the test may break on purpose."""

from __future__ import annotations

import socket

import pytest

from resilience.testing import RedisServer, resp_command


def test_fixture_serves_commands(redis_server: RedisServer) -> None:
    """The server answers and counts commands."""
    redis_server.command("SET", "k", "v")
    assert redis_server.command("GET", "k") == "v"
    assert redis_server.commandstats()["set"] == 1


def test_kill_and_restart_empty(redis_server: RedisServer) -> None:
    """After kill() nothing listens; restart() brings an empty server on the same port."""
    redis_server.command("SET", "k", "v")
    redis_server.kill()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", redis_server.port), timeout=0.5)
    redis_server.restart()
    assert redis_server.command("GET", "k") is None


def test_pause_makes_requests_hang_until_resume(redis_server: RedisServer) -> None:
    """A paused server accepts nothing in time; resume() brings it back."""
    redis_server.pause()
    with pytest.raises(OSError):
        resp_command(redis_server.port, "PING", timeout=0.3)
    redis_server.resume()
    assert redis_server.command("PING") == "PONG"


def test_flush_scripts(redis_server: RedisServer) -> None:
    """flush_scripts() drops loaded Lua scripts (the next EVALSHA gets NOSCRIPT)."""
    sha = redis_server.command("SCRIPT", "LOAD", "return 1")
    assert redis_server.command("SCRIPT", "EXISTS", sha) == [1]
    redis_server.flush_scripts()
    assert redis_server.command("SCRIPT", "EXISTS", sha) == [0]


def test_a_port_held_by_another_server_is_refused(redis_server: RedisServer) -> None:
    """``start()`` on a port another Redis holds raises ``RedisUnavailable`` and leaves
    nothing behind (it used to take that server's PONG as its own: the test then used,
    flushed or killed someone else's Redis, and its own process was orphaned)."""
    import os

    from resilience.testing import RedisUnavailable

    intruder = RedisServer(port=redis_server.port)
    with pytest.raises(RedisUnavailable, match="another"):
        intruder.start()
    assert not intruder.running
    assert not os.path.isdir(intruder._dir)
    assert redis_server.command("PING") == "PONG"


def test_a_server_that_refuses_to_start_says_why() -> None:
    """redis-server's own words are the error (a misspelt directive used to be
    reported as "port in use?")."""
    from resilience.testing import RedisUnavailable

    server = RedisServer(extra_args=("--maxmemory-polcy", "allkeys-lru"))
    with pytest.raises(RedisUnavailable, match="Bad directive"):
        server.start()
    assert not server.running


def test_start_twice_is_refused_and_start_after_stop_works() -> None:
    """A running server cannot be started again (the first process used to be orphaned,
    out of stop()'s reach); after stop(), start() works again."""
    server = RedisServer().start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            server.start()
        server.stop()
        server.start()
        assert server.command("PING") == "PONG"
    finally:
        server.stop()
