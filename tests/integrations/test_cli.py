"""The command line: clear errors for what a user gets wrong, and a demo that cleans up
after itself when it is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integrations.summarizer.__main__ import main
from integrations.summarizer.config import ServiceConfig


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "70000"],
        ["upstreams", "--platforms-port", "-5"],
        ["demo", "--duration", "inf"],
    ],
)
def test_bad_arguments_are_usage_errors(argv: list[str]) -> None:
    """A port out of range or an endless demo is refused with exit status 2 (a port
    raised OverflowError with a traceback; ``--duration inf`` ran for good)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


def test_a_bad_service_configuration_names_what_is_wrong() -> None:
    """Unknown fields in SUMMARIZER_CONFIG are named (it was a TypeError from the
    dataclass), and a document that is no object is refused."""
    with pytest.raises(ValueError, match="unknown service configuration fields: foo"):
        ServiceConfig.from_json('{"foo": 1}')
    with pytest.raises(ValueError, match="JSON object"):
        ServiceConfig.from_json("[1]")


def test_a_port_in_use_is_a_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --port N`` with N taken: exit 2 and one line saying so."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.delenv("SUMMARIZER_CONFIG", raising=False)
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--port", str(port)])
    assert exit_info.value.code == 2
    assert "Address already in use" in capsys.readouterr().err


def _children_of(pid: int) -> list[int]:
    listing = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return [int(line) for line in listing.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(sys.platform != "linux", reason="reads the process table with ps")
def test_sigterm_stops_the_demo_and_every_process_it_started(tmp_path: Path) -> None:
    """``timeout``, ``kill``, systemd and CI send SIGTERM: the demo stops its upstreams
    and service workers (started in sessions of their own) and removes its workdir, as
    on Ctrl-C. They outlived it, holding their ports, and kept its output open."""
    argv = ["demo", "--modes", "resilient", "--duration", "30", "--no-live"]
    demo = subprocess.Popen(
        [sys.executable, "-m", "integrations.summarizer", *argv, "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if "phase" in line:
                break
        children = _children_of(demo.pid)
        assert children  # the upstreams and the worker
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in children if _alive(pid)]
        assert not (tmp_path / "work-resilient").exists()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
