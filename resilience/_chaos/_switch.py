"""The chaos switch: fault injection is off unless a ContextVar or the environment says so.

``RESILIENCE_CHAOS=1`` in the environment (read once, at import) turns it on for the
whole process; ``with chaos.enabled():`` turns it on for one block (one thread, one task
and the tasks it starts). A disabled injector costs one ``ContextVar.get()`` per call;
a disabled ``Faults`` in a decorated ``Pipeline`` costs nothing at all until fault
injection is first switched on in the process (see ``resilience._deferred``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

from .._deferred import arm

__all__ = ["ENV_VAR", "disabled", "enabled", "env_enabled", "is_enabled"]

ENV_VAR = "RESILIENCE_CHAOS"
"""The environment variable that turns fault injection on for the whole process."""

_FALSE = ("", "0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def env_enabled() -> bool:
    """Whether ``RESILIENCE_CHAOS`` is set to a true value right now.

    Only ``1``, ``true``, ``yes`` and ``on`` (any case) turn chaos on. Any other value
    leaves it off with a warning: a switch that breaks things on purpose must not be
    turned on by a typo or by ``RESILIENCE_CHAOS=disabled``.
    """
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE:
        warnings.warn(
            f"{ENV_VAR}={value!r} is neither true (1, true, yes, on) nor false "
            "(0, false, no, off, empty): fault injection stays off",
            RuntimeWarning,
            stacklevel=2,
        )
    return False


# The default is the environment at import time: processes started with
# RESILIENCE_CHAOS=1 inject everywhere, in every thread, without any code change.
CHAOS: ContextVar[bool] = ContextVar("resilience_chaos", default=env_enabled())  # noqa: B039
if CHAOS.get():
    arm()

chaos_active = CHAOS.get
"""Bound once: the whole cost of a disabled injector is calling this."""


def is_enabled() -> bool:
    """Whether fault injection is on in the current context.

    Example::

        with resilience.chaos.enabled():
            assert resilience.chaos.is_enabled()
    """
    return CHAOS.get()


@contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Turn fault injection on (or off, with ``on=False``) inside this block.

    Scoped by a ContextVar: other threads and tasks keep their setting; tasks started
    inside the block inherit it. Nesting works, and the previous setting is restored
    on exit.

    Example::

        faults = rs.Faults(error_rate=0.5, seed=7)

        @rs.Pipeline(rs.Retry(on=rs.InjectedFault), faults)
        def lookup(key: str) -> str: ...

        lookup("a")                       # faults are off: never fails
        with resilience.chaos.enabled():
            lookup("a")                   # now half the attempts fail
    """
    if on:
        arm()  # before the switch: no call may see it on through a chain without its layer
    token = CHAOS.set(bool(on))
    try:
        yield
    finally:
        CHAOS.reset(token)


def disabled() -> AbstractContextManager[None]:
    """Turn fault injection off inside this block (even under ``RESILIENCE_CHAOS=1``).

    Example::

        with resilience.chaos.disabled():
            warm_up_cache()               # no injected faults here
    """
    return enabled(False)
