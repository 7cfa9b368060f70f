"""How the membership RPCs word a backend's answers: a change the replicas did not
confirm in time is UNAVAILABLE with a message that says it may have been applied and
that retrying is safe (adding or removing the same members again changes nothing)."""

from __future__ import annotations

import pytest

from service.api.admin import _store_errors
from service.domain.errors import StoreNotReplicated, StoreUnavailable, Unavailable


def test_an_unconfirmed_membership_change_says_it_may_have_been_applied() -> None:
    with pytest.raises(Unavailable, match=r"may have been applied.*retry it"), _store_errors():
        raise StoreNotReplicated("redis: 0 of the 1 replicas acknowledged in time")


def test_a_backend_that_does_not_answer_stays_a_plain_unavailable() -> None:
    with pytest.raises(Unavailable, match="membership is unavailable"), _store_errors():
        raise StoreUnavailable("redis did not answer")
