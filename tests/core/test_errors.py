"""The exception tree of DESIGN.md §4."""

from __future__ import annotations

import pickle

import pytest

import resilience as rs


@pytest.mark.parametrize("cls", [rs.RateLimited, rs.CircuitOpen, rs.BulkheadFull])
def test_rejections_are_rejected_and_carry_retry_after(cls: type[rs.Rejected]) -> None:
    """Every refusal is a Rejected, a ResilienceError, and keeps retry_after."""
    error = cls(retry_after=1.5)
    assert isinstance(error, rs.Rejected)
    assert isinstance(error, rs.ResilienceError)
    assert error.retry_after == 1.5
    assert "1.500" in str(error)


@pytest.mark.parametrize("cls", [rs.Rejected, rs.RateLimited, rs.CircuitOpen, rs.BulkheadFull])
def test_a_lone_number_is_the_retry_after(cls: type[rs.Rejected]) -> None:
    """``rs.RateLimited(2.0)`` carries retry_after 2.0 (the contract's
    ``Rejected(retry_after)``), not a message "2.0"; a message stays a message."""
    error = cls(2)
    assert error.retry_after == 2.0
    assert "retry after 2.000s" in str(error)
    assert cls("busy").retry_after is None
    with pytest.raises(TypeError):
        cls(1.0, retry_after=2.0)


def test_rejected_pickles_with_retry_after() -> None:
    """Rejections cross process boundaries intact."""
    error = pickle.loads(pickle.dumps(rs.RateLimited("slow down", retry_after=2.0)))
    assert isinstance(error, rs.RateLimited)
    assert (str(error), error.retry_after) == ("slow down", 2.0)


class _HostPaused(rs.RateLimited):
    """A user's refusal with its own __init__ and attribute."""

    def __init__(self, host: str) -> None:
        super().__init__(f"{host} paused", retry_after=3.0)
        self.host = host


def test_copies_of_refusals_keep_notes_attributes_and_their_class_s_arguments() -> None:
    """Pickled or copied, a refusal keeps its notes and attributes, and a subclass with
    its own __init__ comes back whole (notes and attributes were dropped, and such a
    subclass came back as "a.test paused paused", its host "a.test paused")."""
    import copy

    from resilience.bulkhead import LeaseLost

    error = _HostPaused("a.test")
    error.add_note("while calling https://a.test/users")
    lost = LeaseLost(key="k", reason="expired")
    lost.add_note("downloads")
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(again) is _HostPaused
        assert (str(again), again.host, again.retry_after) == ("a.test paused", "a.test", 3.0)
        assert again.__notes__ == ["while calling https://a.test/users"]
    again_lost = pickle.loads(pickle.dumps(lost))
    assert (str(again_lost), again_lost.key, again_lost.reason) == (str(lost), "k", "expired")
    assert again_lost.__notes__ == ["downloads"]


def test_timeout_is_a_timeout_error() -> None:
    """rs.Timeout is a ResilienceError and a builtin TimeoutError."""
    assert issubclass(rs.Timeout, rs.ResilienceError)
    assert issubclass(rs.Timeout, TimeoutError)
    assert rs.errors.Timeout is rs.Timeout


def test_configuration_error_is_a_value_error() -> None:
    """Bad arguments raise an error catchable as ValueError."""
    with pytest.raises(ValueError, match="attempts must be an integer >= 1, got 0"):
        rs.Retry(on=OSError, attempts=0)


@pytest.mark.parametrize(
    "cls", [rs.BackendError, rs.InjectedFault, rs.ConfigurationError, rs.Rejected]
)
def test_every_error_is_a_resilience_error(cls: type[Exception]) -> None:
    """One base class catches everything the library raises."""
    assert issubclass(cls, rs.ResilienceError)
