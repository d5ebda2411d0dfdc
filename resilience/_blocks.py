"""The ``with`` blocks a task has entered, innermost last (kept in a ContextVar tuple).

Breakers and bulkheads keep the permit of each block this way; both leave a block the
same way (:func:`pop_innermost`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["pop_innermost"]

E = TypeVar("E")


def pop_innermost(
    stack: tuple[E, ...], mine: Callable[[E], bool], settled: Callable[[E], bool]
) -> tuple[E, tuple[E, ...]] | None:
    """The innermost entry of ``stack`` that is ``mine`` and not ``settled``, and the
    stack without it; ``None`` if there is none.

    The last entry, unless blocks of several policies were exited out of order by hand.
    Settled entries below it are dropped on the way: a block left open by an abandoned
    async generator is exited by another task, in a copy of this context, so its
    settled entry stays here and must not be taken for this block's.

    Example::

        >>> pop_innermost((1, 2, 3), mine=lambda n: n < 3, settled=lambda n: n == 1)
        (2, (3,))
    """
    for index in range(len(stack) - 1, -1, -1):
        entry = stack[index]
        if mine(entry) and not settled(entry):
            kept = tuple(other for other in stack[:index] if not settled(other))
            return entry, kept + stack[index + 1 :]
    return None
