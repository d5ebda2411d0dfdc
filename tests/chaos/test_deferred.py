"""A disabled rs.Faults in a decorated Pipeline is not in the call path until chaos is
first switched on in the process; from then on it injects like any other layer.

Each test runs a fresh interpreter: in this test process chaos was switched on long
ago (by other tests), and switching it on cannot be undone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

SCRIPT = r"""
import asyncio, gc, json, sys, threading, warnings
import resilience as rs
from resilience import chaos
from resilience import _deferred

warnings.simplefilter("error")


def faults_on_stack():
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith("_faults.py"):
            return True
        frame = frame.f_back
    return False


def work(x):
    return ("ran", faults_on_stack())


async def awork(x):
    return ("ran", faults_on_stack())


def failing(seed):
    return rs.Faults(error_rate=1.0, seed=seed)


def outcome(fn, *args):
    try:
        result = fn(*args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return list(result) if isinstance(result, tuple) else result
    except rs.InjectedFault:
        return "injected"


built = {
    # partial layers (Retry with a deadline, sync Timeout) outside the Faults
    "partials": rs.Pipeline(
        rs.Retry(on=OSError, attempts=2, deadline=5.0), rs.Timeout(1.0), failing(1)
    )(work),
    # a closure layer (Fallback) outside
    "closure": rs.Pipeline(rs.Fallback("fallback", on=OSError), failing(2))(work),
    # async: the Timeout's coroutine outside
    "async": rs.Pipeline(
        rs.Retry(on=OSError, attempts=2, deadline=5.0), rs.Timeout(1.0), failing(3)
    )(awork),
    # two in a row: spliced together
    "two": rs.Pipeline(
        rs.Fallback("fallback", on=rs.InjectedFault), failing(4), failing(5)
    )(work),
    # nothing outside to splice into: the layer is there from the start
    "alone": rs.Pipeline(failing(6))(work),
}
one_off = rs.Pipeline(rs.Fallback("fallback", on=OSError), failing(7))
report = {
    "armed_before": _deferred.armed(),
    "before": {name: outcome(fn, 1) for name, fn in built.items()},
    "one_off_before": outcome(one_off.call, work, 1),
}

# a dropped decorated function takes its record with it
waiting = len(_deferred._waiting)
dropped = rs.Pipeline(rs.Fallback(None, on=OSError), failing(8))(work)
report["recorded"] = len(_deferred._waiting) - waiting
del dropped
gc.collect()
report["left_after_drop"] = len(_deferred._waiting) - waiting

with chaos.enabled():
    report["enabled"] = {name: outcome(fn, 1) for name, fn in built.items()}
    report["one_off_enabled"] = outcome(one_off.call, work, 1)
    late = rs.Pipeline(rs.Fallback("fallback", on=OSError), failing(9))(work)
    report["built_while_enabled"] = outcome(late, 1)

other = []
thread = threading.Thread(target=lambda: other.append(outcome(built["closure"], 1)))
thread.start()
thread.join()
report["after"] = {name: outcome(fn, 1) for name, fn in built.items()}
report["other_thread"] = other[0]
report["armed_after"] = _deferred.armed()
print(json.dumps(report))
"""


def run_script(**env: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != "RESILIENCE_CHAOS"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(result.stdout)  # type: ignore[no-any-return]


#: What every built pipeline answers while its Faults layer is in and chaos is on (the
#: Fallback outside two Faults in a row turns the injected error into "fallback").
INJECTING = {
    "partials": "injected",
    "closure": "injected",
    "async": "injected",
    "two": "fallback",
    "alone": "injected",
}


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    """The script's report, run once for the tests that share the default environment."""
    return run_script()


def test_disabled_faults_stay_out_of_the_call_path_until_chaos_is_on(
    report: dict[str, Any],
) -> None:
    """Before chaos was ever on, the decorated pipelines run without the Faults frame
    (except where nothing outside could hold it), and run the call normally."""
    assert report["armed_before"] is False
    assert report["before"] == {
        "partials": ["ran", False],
        "closure": ["ran", False],
        "async": ["ran", False],
        "two": ["ran", False],
        "alone": ["ran", True],
    }
    assert report["one_off_before"] == ["ran", False]


def test_switching_chaos_on_splices_every_deferred_layer_in(report: dict[str, Any]) -> None:
    """Inside chaos.enabled(), pipelines decorated before it inject: through partial
    and closure layers, sync and async, two Faults in a row, one-off calls, and
    pipelines built while enabled."""
    assert report["enabled"] == INJECTING
    assert report["one_off_enabled"] == "injected"
    assert report["built_while_enabled"] == "injected"


def test_after_switching_off_the_layers_stay_and_obey_the_switch(report: dict[str, Any]) -> None:
    """Once spliced in, a layer checks the per-context switch: outside enabled(), and
    in another thread, calls run normally again (with the Faults frame present)."""
    assert report["armed_after"] is True
    assert report["after"] == {
        "partials": ["ran", True],
        "closure": ["ran", True],
        "async": ["ran", True],
        "two": ["ran", True],
        "alone": ["ran", True],
    }
    assert report["other_thread"] == ["ran", True]


def test_a_dropped_function_takes_its_splice_record_with_it(
    report: dict[str, Any],
) -> None:
    """The record of where a deferred layer goes is weak: no leak per decoration."""
    assert report["recorded"] == 1
    assert report["left_after_drop"] == 0


def test_environment_variable_puts_the_layers_in_from_the_start() -> None:
    """With RESILIENCE_CHAOS=1 nothing is deferred: every layer is there and injects."""
    report = run_script(RESILIENCE_CHAOS="1")
    assert report["armed_before"] is True
    assert report["before"] == INJECTING
