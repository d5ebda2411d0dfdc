"""TimeoutMiddleware: a deadline per HTTP request, 504 or a cleanly ended stream."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import anyio

from .. import _deadline
from .._clock import Clock
from .._events import Listener, TimedOut
from .._timeout import Timeout, _get_running_loop, from_any_thread
from .._validate import check_callable, check_clock, check_name, check_number
from ..errors import ConfigurationError
from ._base import Observed
from ._problem import Problem
from ._rules import UNSET, Matcher, Rule
from ._types import (
    DEADLINE,
    DEADLINE_ECHO,
    TIMED_OUT,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    ends_response,
)

__all__ = ["TimeoutMiddleware"]

logger = logging.getLogger("resilience")

_ALLOWED = ("seconds",)


class TimeoutMiddleware(Observed):
    """Give every HTTP request at most ``seconds``; answer 504 if it overruns.

    * The response has not started when time runs out: the application is cancelled
      and the client gets ``504`` with an ``application/problem+json`` body. On
      asyncio the 504 goes out at the deadline even when the application cannot be
      cancelled at once (a sync endpoint in a worker thread: the thread runs on, its
      late answer is dropped, and the request ends when it does); on trio it goes out
      when the application has ended (a late answer is dropped there too).
    * The application still waits for a request body the client is slow to send: the
      client gets ``408`` (with ``Connection: close``) instead, the slow party being
      the client.
    * The response is streaming: the application is cancelled and the response is
      ended cleanly (a final empty body chunk), so the client sees a complete, if
      truncated, response instead of a reset connection.
    * The response has completed: the deadline is lifted, so Starlette background
      tasks that run after the response are not cut.

    While the request runs, the ambient deadline (:func:`resilience.time_remaining`) is
    set, so inner policies (retries, limiter and bulkhead waits, :class:`Timeout`)
    clamp to it. ``rules`` give some paths other limits (``seconds=None``: no limit).
    Websocket and lifespan scopes pass through untouched.

    Example::

        app = TimeoutMiddleware(app, seconds=10, rules=[
            Rule("/reports/*", seconds=120),
            Rule("/events", seconds=None),      # server-sent events: unbounded
        ])
    """

    __slots__ = (
        "_clock",
        "_listeners",
        "_match",
        "_problem",
        "_slow_client",
        "_timers",
        "app",
        "name",
        "seconds",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        seconds: float | None,
        rules: Iterable[Rule] = (),
        clock: Clock | None = None,
        name: str = "TimeoutMiddleware",
    ) -> None:
        check_callable("app", app, allow_none=False)
        self.app = app
        self.seconds: float | None = check_number("seconds", seconds, strict=True, allow_none=True)
        self._clock: Clock = check_clock("clock", clock)
        # A clock with timers (FakeClock) cuts at virtual time; otherwise anyio's clock.
        self._timers = clock is not None and hasattr(clock, "call_at")
        matcher = Matcher(rules, allowed=_ALLOWED, owner="TimeoutMiddleware")
        for rule in matcher.rules:
            if rule.seconds is not UNSET:
                check_number("Rule.seconds", rule.seconds, strict=True, allow_none=True)
            others = [kind for kind in rule.scopes if kind != "http"]
            if others:
                raise ConfigurationError(
                    f"TimeoutMiddleware times HTTP requests only; {rule!r} names {others} "
                    "(websocket sessions are long-lived by design and pass through)"
                )
        self._match = matcher if matcher.rules else None
        self.name = check_name(name, "TimeoutMiddleware")
        self._listeners: list[Listener] = []
        self._problem = Problem(
            504, "about:blank", "Gateway Timeout", detail="the request did not complete in time"
        )
        self._slow_client = Problem(
            408,
            "about:blank",
            "Request Timeout",
            detail="the request body did not arrive in time",
        )

    def _configured(self) -> list[str]:
        parts = [f"seconds={self.seconds:g}" if self.seconds is not None else "seconds=None"]
        if self._match is not None:
            parts.append(f"rules={len(self._match.rules)}")
        return parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seconds = self.seconds
        rule_path: str | None = None
        if self._match is not None:
            found = self._match.match(scope)
            if found is not None:
                rule = found[1]
                if rule.exempt:
                    await self.app(scope, receive, send)
                    return
                if rule.seconds is not UNSET:
                    seconds = rule.seconds
                rule_path = str(rule.path)
        if seconds is None:
            await self.app(scope, receive, send)
            return
        await self._run(scope, receive, send, seconds, rule_path)

    async def _run(
        self, scope: Scope, receive: Receive, send: Send, seconds: float, rule_path: str | None
    ) -> None:
        started = False
        ended = False
        start_headers: Any = ()
        outer = _deadline.current_deadline()
        entered, token = _deadline.push(seconds, self._clock)
        scope[DEADLINE] = (entered, seconds)
        # Ours to lift when the response completes, unless a sooner outer one stays.
        own = entered is not outer
        budget = entered.remaining()
        # On asyncio the deadline is a loop timer of ours: besides cancelling the app it
        # answers 504 at once, which the app's task cannot do while it waits on a thread.
        loop = _get_running_loop()
        answer: Any = None  # the task sending the 504 at the deadline
        # The app waits for the request body, which has not all arrived: when time runs
        # out then, the client is the slow party (408, not 504).
        reading = False
        read = False

        def problem() -> Problem:
            return self._slow_client if reading and not read else self._problem

        async def receive_wrapper() -> Message:
            nonlocal reading, read
            reading = True
            try:
                message = await receive()
            except BaseException:
                # Cut by our deadline: still waiting for the body. Cancelled by the app
                # itself (Starlette's is_disconnected() polls in a cancelled scope): not.
                reading = cancel_scope.cancel_called
                raise
            reading = False
            if message["type"] == "http.request" and not message.get("more_body", False):
                read = True
            return message

        def expire() -> None:
            nonlocal answer
            cancel_scope.cancel()
            if not ended:
                # Now, for a middleware outside this one that sees its app return (a cut
                # sync endpoint returns normally once its thread ends).
                scope[TIMED_OUT] = True
            if not started and answer is None and loop is not None:
                answer = loop.create_task(_answer(problem(), send))

        timer: Any = None
        if self._timers:
            cancel_scope = anyio.CancelScope()
            timer = self._clock.call_at(  # type: ignore[attr-defined]
                entered.at, from_any_thread(expire)
            )
        elif loop is not None:
            cancel_scope = anyio.CancelScope()
            timer = loop.call_at(loop.time() + budget, expire)
        else:
            cancel_scope = anyio.CancelScope(deadline=anyio.current_time() + budget)

        def overrun(echo: bool) -> bool:
            """Past the deadline: cut already, or by the clock with the cut yet to fire.
            ``echo``: an error that may be this deadline's echo (a 5xx answer, a
            Timeout): an inner rs.Timeout clamped to this deadline fires on its own
            timer, which lands a moment sooner now and then (uvloop's timers keep
            milliseconds), and the app answers its error before the cut; within
            DEADLINE_ECHO of the deadline such an error is taken for the timeout's."""
            if cancel_scope.cancel_called:
                return True
            if entered.remaining() > (DEADLINE_ECHO if echo else 0.0):
                return False
            expire()
            return True

        async def send_wrapper(message: Message) -> None:
            nonlocal started, ended, start_headers
            if answer is not None or (
                not started
                and overrun(
                    message["type"] == "http.response.start" and message.get("status", 0) >= 500
                )
            ):
                # Past the deadline before it started (an app that got past the cut
                # without a checkpoint, a thread that returned late, an error page for
                # an inner timeout): the 504 is the answer, sent at the deadline on
                # asyncio, when the app ends otherwise.
                scope[TIMED_OUT] = True
                return
            kind = message["type"]
            if kind == "http.response.start":
                started = True
                start_headers = message.get("headers", ())
            elif ends_response(message):
                ended = True
                # The response is complete: lift the deadline for what runs after it.
                if own:
                    _deadline.lift(entered)
                if timer is not None:
                    timer.cancel()
                else:
                    cancel_scope.deadline = math.inf
            await send(message)

        try:
            with cancel_scope:
                await self.app(scope, receive_wrapper, send_wrapper)
        except Exception as exc:
            if ended or not overrun(isinstance(exc, Timeout)):
                raise
            # The app failed after its cut (a worker thread that raised late, a cleanup
            # that failed, an inner rs.Timeout clamped to this deadline): its time ran
            # out all the same, so it is answered like any overrun below. Raising would
            # make the server treat the request as broken after a complete 504 and close
            # the connection, and with it the next request already read from it.
            if not isinstance(exc, Timeout):  # an inner timeout is this one's echo
                logger.warning(
                    "%s: the application failed after its deadline (%r); answered as timed out",
                    self.name,
                    scope.get("path"),
                    exc_info=True,
                )
        except BaseException:
            if answer is not None:  # cancelled from outside: the 504 still goes out
                await _settle(answer)
            raise
        finally:
            _deadline.pop(token)
            if timer is not None:
                timer.cancel()
        # cancel_called: also an app that caught the cut and returned anyway; its time ran
        # out all the same (the server would answer 500 to a response never started).
        if ended or not (cancel_scope.cancelled_caught or cancel_scope.cancel_called):
            return
        scope[TIMED_OUT] = True
        if self._observed:
            self._emit(TimedOut(policy=self.name, key=rule_path, seconds=seconds))
        if answer is not None:
            await _settle(answer)
            return
        if not started:
            await _answer(problem(), send)
            return
        if _declares_length(start_headers):
            # A body shorter than its declared length cannot end cleanly: returning lets
            # the server close the connection, which tells the client it was cut.
            return
        # Bounded: a client that stopped reading blocks the server's send, and must not
        # hold the request (and any slot outside it) past the deadline for good.
        with anyio.move_on_after(_END_GRACE):
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:  # best effort: the client went away, or the server refused
                pass


async def _answer(problem: Problem, send: Send) -> None:
    """Send ``problem`` at the deadline; a 408 also closes the connection, whose unread
    body could not be told from the next request."""
    await problem.send(send, _CLOSE if problem.status == 408 else ())


_CLOSE = ((b"connection", b"close"),)


async def _settle(answer: Any) -> None:
    """Wait for the 504 sent at the deadline (even if this request is being cancelled:
    it must not send after the request has returned), for at most ``_END_GRACE``
    seconds (then it is cancelled); its failure is the client's."""
    with anyio.CancelScope(shield=True, deadline=anyio.current_time() + _END_GRACE):
        try:
            await answer
        except Exception:  # best effort: the client went away, or the server refused
            pass
    if not answer.done():  # a client that reads nothing: the 504 is not sent after us
        answer.cancel()


#: Seconds the clean end of a cut stream may take to send.
_END_GRACE = 1.0


def _declares_length(headers: Any) -> bool:
    return any(name.lower() == b"content-length" for name, _ in headers)
