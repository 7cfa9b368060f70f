"""Pure rules of the client runtime: page checks, backfill stops, the state table,
backoff and liveness, outcome classes, the event queue."""

from __future__ import annotations

import random

import grpc
import pytest

from client import ConnectionState, EventsDropped, InvalidMailboxPage, MailboxCursor, MailboxPage
from client.errors import Offline, ServerRejected
from client.events import ConnectionChanged, EventQueue
from client.model import MailboxEvent
from client.outcomes import Outcome, classify, is_timeout, pull_failure, retry_wait_s
from client.pages import backfill_done, check_page, lanes_to_sync
from client.state import TRANSITIONS, Backoff, IllegalStateChange, Liveness, check_transition
from service.api.errors import RemoteError, RequestTooLarge
from service.domain.errors import (
    ConversationNotFound,
    IdempotencyConflict,
    InvalidClientMessageId,
    InvalidRequest,
    NotAMember,
    QuotaExceeded,
    Recoverable,
    Unavailable,
)
from service.domain.ids import CommitKey
from service.domain.model import Direction, HistoryPage
from tests.client.test_local_store import record


def events(*seq_group: tuple[int, int]) -> tuple[MailboxEvent, ...]:
    return tuple(MailboxEvent(s, g, record(s)) for s, g in seq_group)


def page(evs: tuple[MailboxEvent, ...], nxt: MailboxCursor, lane: str = "inbox") -> MailboxPage:
    return MailboxPage(lane, evs, nxt)


def test_a_page_that_continues_the_cursor_with_whole_groups_is_accepted() -> None:
    check_page(
        MailboxCursor("inbox", 2, 4),
        page(events((5, 5), (6, 5), (7, 7)), MailboxCursor("inbox", 2, 7)),
    )
    check_page(MailboxCursor("inbox", 0, 0), page(events((1, 1)), MailboxCursor("inbox", 3, 1)))
    check_page(MailboxCursor("inbox", 2, 4), page((), MailboxCursor("inbox", 2, 4)))


@pytest.mark.parametrize(
    ("cursor", "evs", "nxt", "why"),
    [
        (MailboxCursor("inbox", 1, 4), events((6, 6)), MailboxCursor("inbox", 1, 6), "gap"),
        (MailboxCursor("inbox", 1, 4), events((5, 4)), MailboxCursor("inbox", 1, 5), "group"),
        (
            MailboxCursor("inbox", 1, 4),
            events((5, 5), (6, 4)),
            MailboxCursor("inbox", 1, 6),
            "group",
        ),
        (MailboxCursor("inbox", 1, 4), events((5, 5)), MailboxCursor("inbox", 2, 5), "epoch"),
        (MailboxCursor("inbox", 1, 4), events((5, 5)), MailboxCursor("inbox", 1, 9), "next cursor"),
        (
            MailboxCursor("inbox", 1, 4),
            events((5, 5)),
            MailboxCursor("conversation:x", 1, 5),
            "lane",
        ),
    ],
)
def test_a_page_that_does_not_continue_the_cursor_is_refused(
    cursor: MailboxCursor, evs: tuple[MailboxEvent, ...], nxt: MailboxCursor, why: str
) -> None:
    with pytest.raises(InvalidMailboxPage):
        check_page(cursor, page(evs, nxt))


BIG = "conversation:big"


def test_a_big_lanes_withheld_entries_keep_its_pages_gap_free() -> None:
    """One reading rule for every lane: what a reader may not read of a big
    conversation's lane comes as withheld events (seq and group, no record), so
    its pages are held to the inbox's rule: no gap, whole groups."""
    withheld = MailboxEvent(5, 5, None)
    check_page(
        MailboxCursor(BIG, 2, 4),
        page((withheld, *events((6, 5), (7, 7))), MailboxCursor(BIG, 2, 7), BIG),
    )


@pytest.mark.parametrize("lane", ["inbox", BIG])
def test_a_page_that_skips_a_seq_is_refused_in_every_lane(lane: str) -> None:
    with pytest.raises(InvalidMailboxPage):
        check_page(MailboxCursor(lane, 2, 4), page(events((6, 6)), MailboxCursor(lane, 2, 6), lane))
    with pytest.raises(InvalidMailboxPage):
        check_page(MailboxCursor(lane, 2, 4), page((), MailboxCursor(lane, 2, 9), lane))


def hp(seqs: list[int], next_anchor: int) -> HistoryPage:
    return HistoryPage(
        "c", Direction.BACKWARD, 0, 0, tuple(record(s) for s in seqs), 1, 99, next_anchor
    )


def test_backfill_stops_at_the_floor_the_start_or_the_cap() -> None:
    assert not backfill_done(hp([30, 29], 29), floor_seq=10, fetched=2, cap=100)
    assert backfill_done(hp([11, 10], 10), floor_seq=10, fetched=2, cap=100)
    assert backfill_done(hp([3, 2], 0), floor_seq=0, fetched=2, cap=100)
    assert backfill_done(hp([50, 49], 49), floor_seq=0, fetched=100, cap=100)
    assert backfill_done(hp([], 0), floor_seq=0, fetched=0, cap=100)


def test_lanes_sync_inbox_first() -> None:
    assert lanes_to_sync(["conversation:b", "inbox", "conversation:a"]) == [
        "inbox",
        "conversation:a",
        "conversation:b",
    ]
    assert lanes_to_sync([]) == ["inbox"]


def test_the_state_table() -> None:
    s = ConnectionState
    check_transition(s.ONLINE, s.DISCONNECTED)
    check_transition(s.SYNCING, s.REBUILDING)
    for state in s:
        if state is not s.CLOSED:
            check_transition(state, s.CLOSED)
    with pytest.raises(IllegalStateChange):
        check_transition(s.DISCONNECTED, s.ONLINE)  # never online without a sync
    with pytest.raises(IllegalStateChange):
        check_transition(s.CLOSED, s.CONNECTING)
    assert s.ONLINE not in TRANSITIONS[s.CONNECTING] | TRANSITIONS[s.REBUILDING]


def test_backoff_doubles_jittered_to_its_cap_and_resets() -> None:
    b = Backoff(0.1, 1.0, random.Random(7))
    delays = [b.next_delay() for _ in range(8)]
    for n, d in enumerate(delays):
        top = min(0.1 * 2**n, 1.0)
        assert top / 2 <= d <= top
    b.reset()
    assert b.next_delay() <= 0.1


def test_liveness_expires_without_a_sign_of_life() -> None:
    live = Liveness(3.0, now=100.0)
    assert not live.expired(102.9) and live.remaining(102.0) == pytest.approx(1.0)
    live.seen(102.0)
    assert not live.expired(104.9) and live.expired(105.1)


KEY = CommitKey("t", "s", "c")


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (InvalidRequest("x"), Outcome.REFUSED),
        (InvalidClientMessageId("x"), Outcome.REFUSED),
        (NotAMember("x"), Outcome.REFUSED),
        (ConversationNotFound("x"), Outcome.REFUSED),
        (IdempotencyConflict(KEY), Outcome.REFUSED),
        (RequestTooLarge("x"), Outcome.REFUSED),
        (Recoverable(KEY, "c", "reserve"), Outcome.RETRY_LATER),
        (QuotaExceeded("x", 0.5), Outcome.RETRY_LATER),
        (Unavailable("x"), Outcome.CONNECTION),
        (RemoteError(grpc.StatusCode.DEADLINE_EXCEEDED, "late"), Outcome.CONNECTION),
        (RemoteError(grpc.StatusCode.INTERNAL, "internal error"), Outcome.CONNECTION),
    ],
)
def test_what_a_failure_means_for_a_pending_send(error: Exception, outcome: Outcome) -> None:
    assert classify(error) is outcome


def test_retry_waits_and_timeouts() -> None:
    assert retry_wait_s(QuotaExceeded("x", 0.7)) == pytest.approx(0.7)
    assert retry_wait_s(QuotaExceeded("x", 60.0)) == 5.0
    assert is_timeout(RemoteError(grpc.StatusCode.DEADLINE_EXCEEDED, ""))
    assert not is_timeout(Unavailable("x"))


async def test_the_event_queue_drops_the_oldest_and_says_so() -> None:
    q = EventQueue(capacity=2)
    for state in (ConnectionState.CONNECTING, ConnectionState.SYNCING, ConnectionState.ONLINE):
        q.put(ConnectionChanged(state))
    assert await q.get() == EventsDropped(1)
    assert await q.get() == ConnectionChanged(ConnectionState.SYNCING)
    assert await q.get() == ConnectionChanged(ConnectionState.ONLINE)


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (RemoteError(grpc.StatusCode.DEADLINE_EXCEEDED, "late"), Offline),
        (RemoteError(grpc.StatusCode.CANCELLED, "cut"), Offline),
        (RemoteError(grpc.StatusCode.INTERNAL, "internal error"), Offline),
        (Unavailable("x"), Offline),
        (QuotaExceeded("x", 0.5), Offline),
        (NotAMember("x"), ServerRejected),
    ],
)
def test_a_failed_pull_is_retryable_unless_the_server_refused(
    error: Exception, raised: type[Exception]
) -> None:
    """Issue 22, item 11: a pull's error says whether trying again can help."""
    assert type(pull_failure(error)) is raised
