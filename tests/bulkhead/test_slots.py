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

from hypothesis import given
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
