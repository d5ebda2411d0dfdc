"""The pure core of the bulkhead (:class:`Slots`) driven by random operations (hypothesis).

``occupy`` counts slots taken elsewhere (a distributed bulkhead's leases in its local
twin), possibly past the limit. Checked after every operation, against a model that
counts holders per key:

* the core's count is the number of holders;
* a slot is granted (taken at once or handed to a waiter) only if the holders then
  number at most ``limit``: occupation past the limit is never passed on;
* somebody waits for a key only while its holders number at least ``limit``.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from resilience.bulkhead._slots import GRANTED, Slots, Waiter

operations = st.lists(
    st.tuples(
        st.sampled_from(["occupy", "acquire", "wait", "release"]),
        st.sampled_from("ab"),
        st.integers(0, 2),  # priority of a waiter
    ),
    max_size=60,
)


@given(limit=st.integers(1, 3), ops=operations)
def test_occupied_slots_are_counted_and_never_handed_over_the_limit(
    limit: int, ops: list[tuple[str, str, int]]
) -> None:
    """Holders = count; grants keep holders <= limit; waiting implies a full key."""
    slots = Slots(limit)
    holders = {"a": 0, "b": 0}
    waiting: list[Waiter] = []
    for op, key, priority in ops:
        if op == "occupy":
            slots.occupy(key)
            holders[key] += 1
        elif op == "acquire":
            if slots.try_acquire(key):
                holders[key] += 1
                assert holders[key] <= limit
        elif op == "wait":
            waiter = Waiter(key)
            if slots.enqueue(waiter, priority):
                holders[key] += 1
                assert holders[key] <= limit
            else:
                waiting.append(waiter)
        elif holders[key]:
            handed = slots.release(key)
            if handed is None:
                holders[key] -= 1
            else:
                assert handed.key == key
                assert handed.state == GRANTED
                waiting.remove(handed)
                assert holders[key] <= limit  # the holder count did not change
        for k in holders:
            in_use, queued = slots.counts(k)
            assert in_use == holders[k]
            assert queued == sum(w.key == k for w in waiting)
            if queued:
                assert holders[k] >= limit


@given(
    limit=st.integers(1, 3),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["occupy", "acquire", "wait", "release", "retract", "fill"]),
            st.sampled_from("ab"),
            st.integers(0, 2),
        ),
        max_size=60,
    ),
)
@example(
    limit=1, ops=[("occupy", "a", 0), ("wait", "a", 0), ("retract", "a", 0), ("acquire", "a", 0)]
)
@example(limit=1, ops=[("occupy", "a", 0), ("wait", "a", 0), ("retract", "a", 0), ("wait", "a", 1)])
@settings(max_examples=400)
def test_retracted_slots_go_to_the_waiters_first(
    limit: int, ops: list[tuple[str, str, int]]
) -> None:
    """A distributed bulkhead's twin takes slots back from waiters it lets go to Redis
    (``retract``), so a key may have waiters and a free slot: a newcomer then never
    takes that slot past them, and ``fill`` hands the free slots to the first waiters
    (by priority, then arrival), after which waiting again implies a full key."""
    slots = Slots(limit)
    holders = {"a": 0, "b": 0}
    waiting: list[tuple[int, int, Waiter]] = []
    for arrival, (op, key, priority) in enumerate(ops):
        queued_before = any(w.key == key for _, _, w in waiting)
        if op == "occupy":
            slots.occupy(key)
            holders[key] += 1
        elif op == "acquire":
            if slots.try_acquire(key):
                assert not queued_before
                holders[key] += 1
                assert holders[key] <= limit
        elif op == "wait":
            waiter = Waiter(key)
            if slots.enqueue(waiter, priority):
                assert not queued_before
                holders[key] += 1
                assert holders[key] <= limit
            else:
                waiting.append((priority, arrival, waiter))
        elif op == "fill":
            granted = slots.fill(key)
            mine = sorted(entry for entry in waiting if entry[2].key == key)
            assert granted == [w for _, _, w in mine[: len(granted)]]
            for waiter in granted:
                assert waiter.state == GRANTED
                waiting = [entry for entry in waiting if entry[2] is not waiter]
            holders[key] += len(granted)
            assert holders[key] <= limit or not granted
            if any(w.key == key for _, _, w in waiting):
                assert holders[key] >= limit
        elif holders[key]:
            if op == "retract":
                slots.retract(key)
                holders[key] -= 1
            else:
                handed = slots.release(key)
                if handed is None:
                    holders[key] -= 1
                else:
                    assert handed.key == key
                    waiting = [entry for entry in waiting if entry[2] is not handed]
        for k in holders:
            in_use, queued = slots.counts(k)
            assert in_use == holders[k]
            assert queued == sum(w.key == k for _, _, w in waiting)
