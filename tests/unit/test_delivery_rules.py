"""The pure delivery rules: the relay's state machine, verdicts and backoff; mailbox
cursors, pages of whole groups, trims at group boundaries, dedupe."""

from __future__ import annotations

import itertools

import pytest

from service.domain.errors import CursorExpired, IllegalTransition, InvalidRequest
from service.domain.mailbox import (
    MAX_GROUP_BYTES,
    MAX_GROUP_ENTRIES,
    MAX_PAGE_BYTES,
    LaneRead,
    LaneState,
    Mailbox,
    MailboxCursor,
    MailboxEntry,
    MailboxItem,
    build_page,
    check_cursor,
    dedupe_cut,
    new_items,
    parse_lane,
    refusal_margin_ms,
    split_group,
    sync_limits,
    too_old_to_deliver,
    trim_cut,
)
from service.domain.model import MessageRecord, OutboxEntry, OutboxPublication
from service.domain.relay import (
    TRANSITIONS,
    EntryState,
    PartitionEntry,
    RelayPolicy,
    Tracker,
    Verdict,
    transition,
    verdict,
)
from service.domain.relay_waiting import Waiting
from tests.support import DEDUPE_CASES, DEDUPE_GROUPS, DEDUPE_WINDOW_MS, text

S = EntryState
LEGAL = {
    (S.PENDING, S.SENDING),
    (S.PENDING, S.RETRYABLE),
    (S.RETRYABLE, S.SENDING),
    (S.SENDING, S.SENT),
    (S.SENDING, S.RETRYABLE),
    (S.SENDING, S.DEAD_LETTER),
}


@pytest.mark.parametrize(("current", "target"), list(itertools.product(S, S)))
def test_exactly_seed_004s_transitions_are_legal(current: S, target: S) -> None:
    if (current, target) in LEGAL:
        assert transition(current, target) is target
    else:
        with pytest.raises(IllegalTransition):
            transition(current, target)
    assert {(a, b) for a, bs in TRANSITIONS.items() for b in bs} == LEGAL


def test_the_tracker_checks_every_move_and_forgets_finished_entries() -> None:
    tracker = Tracker()
    tracker.move(["1", "2"], S.SENDING)
    tracker.move(["1"], S.SENT)
    assert tracker.states == {"2": S.SENDING}
    tracker.move(["2"], S.RETRYABLE)
    with pytest.raises(IllegalTransition):
        tracker.move(["2"], S.SENT)  # retryable -> sent skips sending
    tracker.move(["2"], S.SENDING)
    tracker.move(["2"], S.DEAD_LETTER)
    assert tracker.states == {}
    with pytest.raises(IllegalTransition):
        tracker.move(["3"], S.SENT)  # never claimed: pending -> sent


@pytest.mark.parametrize(
    ("expected", "present", "result"),
    [
        (["a", "b"], {"a", "b", "c"}, Verdict.ACCEPTED),
        (["a", "b"], {"a"}, Verdict.REJECTED),
        (["a"], set(), Verdict.REJECTED),
        (["a"], None, Verdict.UNKNOWN),
        ([], set(), Verdict.ACCEPTED),
    ],
)
def test_reconciliation_verdicts(
    expected: list[str], present: set[str] | None, result: Verdict
) -> None:
    assert verdict(expected, present) is result


def test_retry_delays_double_up_to_the_cap_and_the_policy_validates() -> None:
    policy = RelayPolicy(first_retry_ms=100, max_retry_ms=1000)
    assert [policy.retry_delay_ms(n) for n in range(1, 7)] == [100, 200, 400, 800, 1000, 1000]
    assert policy.retry_delay_ms(10_000) == 1000
    for bad in (
        RelayPolicy(batch=0),
        RelayPolicy(batch=1001),
        RelayPolicy(lease_ms=999),
        RelayPolicy(max_retry_ms=10, first_retry_ms=20),
    ):
        with pytest.raises(ValueError):
            bad.validate()


# --- mailboxes ------------------------------------------------------------------


def entry(seq: int, group: int, body: str = "hi") -> MailboxEntry:
    record = MessageRecord("t", "c", seq, f"m{seq}", "u", "d", f"k{seq}", text(body), (), "", 1)
    return MailboxEntry(seq, group, record, 2)


def test_lanes_and_cursors_are_validated() -> None:
    assert parse_lane("inbox") is None
    assert parse_lane("conversation:a:b") == "a:b"
    assert Mailbox.conversation("t", "x").lane == "conversation:x"
    for bad in ("", "Inbox", "conversation:", "conversation:a b", "outbox"):
        with pytest.raises(InvalidRequest):
            parse_lane(bad)
    for cursor in (MailboxCursor("inbox", 0, 3), MailboxCursor("inbox", -1, 0)):
        with pytest.raises(InvalidRequest):
            cursor.validate()
    assert sync_limits(0, 0) == (100, 1 << 20)
    for limit, size in ((1001, 0), (0, 1023), (0, (4 << 20) + 1)):
        with pytest.raises(InvalidRequest):
            sync_limits(limit, size)


@pytest.mark.parametrize(
    ("cursor", "why"),
    [
        (MailboxCursor("inbox", 2, 5), "epoch"),
        (MailboxCursor("inbox", 3, 4), "trimmed"),
        (MailboxCursor("inbox", 0, 0), "trimmed"),
        (MailboxCursor("inbox", 3, 11), "ahead"),
    ],
)
def test_a_cursor_that_cannot_continue_expires_with_the_watermark(
    cursor: MailboxCursor, why: str
) -> None:
    with pytest.raises(CursorExpired) as caught:
        check_cursor("inbox", cursor, LaneState(3, 10, 5))
    assert (caught.value.epoch, caught.value.trim_watermark) == (3, 5)
    assert why in caught.value.why


def test_cursors_at_the_watermark_and_at_the_head_continue() -> None:
    state = LaneState(3, 10, 5)
    assert check_cursor("inbox", MailboxCursor("inbox", 3, 5), state) == 5
    assert check_cursor("inbox", MailboxCursor("inbox", 3, 10), state) == 10
    assert check_cursor("inbox", MailboxCursor(), LaneState()) == 0


def test_pages_hold_whole_groups_within_limits_and_always_progress() -> None:
    entries = (entry(1, 1), entry(2, 1), entry(3, 1), entry(4, 4), entry(5, 5), entry(6, 5))
    read = LaneRead(LaneState(1, 6, 0), entries)
    page = build_page("inbox", MailboxCursor(), read, 4, 1 << 20)
    assert [e.seq for e in page.entries] == [1, 2, 3, 4] and page.more
    assert page.next_cursor == MailboxCursor("inbox", 1, 4)
    first = build_page("inbox", MailboxCursor(), read, 2, 1 << 20)
    assert [e.seq for e in first.entries] == [1, 2, 3]  # one group, even over the limit
    tight = build_page("inbox", MailboxCursor(), read, 100, 10)
    assert [e.seq for e in tight.entries] == [1, 2, 3]  # and over the byte budget
    rest = build_page("inbox", MailboxCursor("inbox", 1, 4), read, 100, 1 << 20)
    assert [e.seq for e in rest.entries] == [5, 6] and not rest.more


def test_trims_cut_whole_groups_by_age_and_by_count() -> None:
    groups = [(3, 100), (4, 200), (6, 300)]
    state = LaneState(1, 6, 0)
    assert trim_cut(state, groups, now_ms=1000, retention_ms=10_000, max_entries=10) == 0
    assert trim_cut(state, groups, now_ms=1000, retention_ms=850, max_entries=10) == 3
    assert trim_cut(state, groups, now_ms=1000, retention_ms=750, max_entries=10) == 4
    assert trim_cut(state, groups, now_ms=1000, retention_ms=10_000, max_entries=3) == 3
    assert trim_cut(state, groups, now_ms=1000, retention_ms=10_000, max_entries=1) == 4  # newest
    assert trim_cut(state, groups, now_ms=1000, retention_ms=100, max_entries=1) == 6  # all old


def test_new_items_drop_what_the_lane_holds_and_repeats() -> None:
    items = [MailboxItem(entry(n, 1).record) for n in (1, 2, 2, 3)]
    assert [i.message_id for i in new_items(items, {"m3"})] == ["m1", "m2"]


def test_groups_are_cut_at_entry_boundaries_within_the_byte_and_count_budgets() -> None:
    big = [MailboxItem(entry(n, 1, "x" * 60_000).record) for n in range(1, 71)]
    parts = split_group(big)
    assert [i for part in parts for i in part] == big  # every item once, in order
    assert all(sum(i.size_bytes() for i in part) <= MAX_GROUP_BYTES for part in parts)
    assert len(parts) == 18  # four 60 KB entries a group (the fifth would pass 256 KiB)
    huge = MailboxItem(entry(1, 1, "x" * (MAX_GROUP_BYTES + 1)).record)
    assert split_group([huge, big[0]]) == [(huge,), (big[0],)]  # alone, never dropped
    small = [MailboxItem(entry(n, 1).record) for n in range(MAX_GROUP_ENTRIES + 1)]
    assert [len(p) for p in split_group(small)] == [MAX_GROUP_ENTRIES, 1]
    assert split_group([]) == []


def test_a_page_stays_within_the_transport_whatever_max_bytes_asks() -> None:
    entries = tuple(entry(n, n, "x" * 60_000) for n in range(1, 71))
    read = LaneRead(LaneState(1, 70, 0), entries)
    page = build_page("inbox", MailboxCursor(), read, 1000, 4 << 20)
    assert sum(e.size_bytes() for e in page.entries) <= MAX_PAGE_BYTES < 4 << 20
    assert page.more and page.next_cursor.seq == len(page.entries)


def test_waiting_entries_are_tried_again_in_order_per_mailbox() -> None:
    def held(position: str) -> PartitionEntry:
        entry = OutboxEntry(OutboxPublication("s", position), "t", "c", 1, f"m{position}", None)
        return PartitionEntry(entry)

    a, b = Mailbox.inbox("t", "a"), Mailbox.inbox("t", "b")
    waiting = Waiting()
    waiting.add(held("1"), [a, b], 100, broken=[b])  # b is sick until 100
    waiting.add(held("2"), [a], 50, broken=[a])  # a until 50, but 1 (older) waits on a too
    waiting.add(held("3"), [b], 100)  # waits for b, untried
    assert waiting.sick_due([a, b]) == 100 and waiting.next_due_ms(0) == 50
    assert waiting.due(60, 10) == []  # 2 may not pass 1 on a
    assert [h.position for h in waiting.due(100, 10)] == ["1", "2", "3"]
    assert [h.position for h in waiting.due(100, 2)] == ["1", "2"]
    waiting.add(held("1"), [a, b], 200, broken=[b])  # tried again, failed again: keeps its place
    waiting.forget(["2"])
    assert [h.position for h in waiting.due(150, 10)] == []  # 3 waits behind 1 on b
    waiting.forget(["1", "3"])
    assert len(waiting) == 0 and waiting.next_due_ms(0) == 0  # nobody sick any more


@pytest.mark.parametrize(("now", "mark"), DEDUPE_CASES)
def test_trimmed_ids_are_forgotten_by_whole_groups_once_the_window_passes(
    now: int, mark: int
) -> None:
    groups = [*DEDUPE_GROUPS, (6, now)]
    assert dedupe_cut(0, 4, groups, now_ms=now, window_ms=DEDUPE_WINDOW_MS) == mark
    above = [g for g in groups if g[0] > mark]  # applied again: nothing more goes
    assert dedupe_cut(mark, 4, above, now_ms=now, window_ms=DEDUPE_WINDOW_MS) == mark


def test_a_message_is_refused_once_the_window_less_the_margin_has_passed() -> None:
    day = 86_400_000
    assert refusal_margin_ms(day) == 3_600_000 and refusal_margin_ms(100_000) == 10_000
    assert not too_old_to_deliver(1000, now_ms=1000 + day - 3_600_001, window_ms=day)
    assert too_old_to_deliver(1000, now_ms=1000 + day - 3_600_000, window_ms=day)
    # an id is remembered for the window after its group's append, which is after the
    # commit: what is not refused is still deduped, with the margin to spare
    assert too_old_to_deliver(0, now_ms=90_000, window_ms=100_000)
