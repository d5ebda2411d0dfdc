"""Deferred layers: a pipeline layer left out until it can matter, then spliced in.

A disabled :class:`resilience.Faults` does nothing but check a switch and call on, yet
as a layer of a pipeline it would cost every call one Python frame. Until fault
injection is first switched on in the process (:func:`arm`), it cannot fire anywhere.
So :class:`resilience.Pipeline` builds its chain without such a layer and records
where it would go: the references to the next inner callable held by the next outer
layer (closure cells of a function, or the first argument of a ``functools.partial``).
:func:`arm` builds each deferred layer around that inner callable and points those
references at it. From then on the layer is in the chain and checks its switch on
every call, as it would have all along.

Only the chains that outlive their construction (decorated functions) are recorded;
a chain built for one ``Pipeline.call`` simply runs without the layer. If the outer
layer holds the inner callable somewhere this module cannot reach, or no layer is
outside the deferred one, the layer is put in at once: deferral is an optimisation,
never a change of behaviour.
"""

from __future__ import annotations

import functools
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["arm", "armed", "splice_later"]

_lock = threading.Lock()
_armed = False
# outer layer -> the (slots, build, inner) splices waiting inside it; weak, so that a
# decorated function that is dropped takes its record with it.
_waiting: weakref.WeakKeyDictionary[Any, list[_Splice]] = weakref.WeakKeyDictionary()

# How deep to follow functions held in closure cells: a lean layer may keep the inner
# callable in a helper closure of its own (one level) and no deeper.
_SEARCH_DEPTH = 2


def armed() -> bool:
    """Whether deferred layers are in place (fault injection was switched on once)."""
    return _armed


def arm() -> None:
    """Splice every deferred layer in; from now on no layer is deferred. Idempotent.

    Called before fault injection is first switched on, so that no call can run in an
    enabled context through a chain that lacks its layer.
    """
    global _armed
    with _lock:
        if _armed:
            return
        for splices in list(_waiting.values()):
            for splice in splices:
                splice.apply()
        _waiting.clear()
        _armed = True


class _Splice:
    """Where one group of deferred layers goes inside one outer layer."""

    __slots__ = ("build", "inner", "slots")

    def __init__(
        self,
        slots: list[Callable[[Any], None]],
        build: Callable[[Any], Any],
        inner: Any,
    ) -> None:
        self.slots = slots
        self.build = build
        self.inner = inner

    def apply(self) -> None:
        layer = self.build(self.inner)
        for point_at in self.slots:
            point_at(layer)


def splice_later(outer: Any, inner: Any, build: Callable[[Any], Any]) -> bool:
    """Record that ``build(inner)`` belongs where ``outer`` refers to ``inner``.

    Returns False when ``outer`` holds ``inner`` nowhere this module can reach: the
    caller must then put the layer in now. When already armed, splices at once.
    """
    slots = _slots(outer, inner)
    if not slots:
        return False
    splice = _Splice(slots, build, inner)
    with _lock:
        if _armed:
            splice.apply()
        else:
            _waiting.setdefault(outer, []).append(splice)
    return True


def _slots(outer: Any, inner: Any) -> list[Callable[[Any], None]]:
    """Setters for every reference to ``inner`` that ``outer`` calls through."""
    if isinstance(outer, functools.partial):
        if outer.args and outer.args[0] is inner:
            # Weakly: the record must not keep its own key (``outer``) alive.
            return [functools.partial(_retarget_partial, weakref.ref(outer))]
        return []
    found: list[Callable[[Any], None]] = []
    if isinstance(outer, types.FunctionType):
        _search_cells(outer, inner, _SEARCH_DEPTH, found, set())
    return found


def _search_cells(
    function: types.FunctionType,
    inner: Any,
    depth: int,
    found: list[Callable[[Any], None]],
    seen: set[int],
) -> None:
    if id(function) in seen:
        return
    seen.add(id(function))
    for cell in function.__closure__ or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if held is inner:
            found.append(functools.partial(setattr, cell, "cell_contents"))
        elif depth > 1 and isinstance(held, types.FunctionType):
            _search_cells(held, inner, depth - 1, found, seen)


def _retarget_partial(ref: weakref.ref[functools.partial[Any]], layer: Any) -> None:
    outer = ref()
    if outer is None:
        return
    # A partial's arguments are read-only attributes; __setstate__ (the pickle
    # protocol's re-initialisation) is the one supported way to replace them in place.
    outer.__setstate__(  # type: ignore[attr-defined]
        (outer.func, (layer, *outer.args[1:]), outer.keywords or None, outer.__dict__ or None)
    )
