"""kit.observing.UNOBSERVED stands in for any observer Protocol and observes nothing."""

from __future__ import annotations

import copy

import pytest

from capwatch.controller.leasing import LeaseObserver
from capwatch.controller.writes.writer import WriteObserver
from capwatch.kit.observing import UNOBSERVED


def test_every_method_of_every_observer_takes_the_call_and_does_nothing() -> None:
    """The controller's observers' methods, with their arguments, all return None."""
    lease: LeaseObserver = UNOBSERVED
    writes: WriteObserver = UNOBSERVED
    assert lease.leading(True) is None
    assert lease.fenced_out() is None
    assert writes.written(result="ok", latency_s=0.1) is None
    assert UNOBSERVED.anything_at_all(1, 2, three=3) is None  # type: ignore[attr-defined]


def test_it_is_not_mistaken_for_what_copy_and_pickle_look_for() -> None:
    """Dunder lookups are refused, so copying it is an ordinary copy."""
    with pytest.raises(AttributeError):
        UNOBSERVED.__reduce_ex_extra__  # noqa: B018
    assert type(copy.copy(UNOBSERVED)) is type(UNOBSERVED)
