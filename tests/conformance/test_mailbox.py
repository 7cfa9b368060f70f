"""The MailboxStore contract (DESIGN §10), the same on every backend: gap-free seqs
per epoch, groups, dedupe by message id, fencing, pages, trims, epochs, cursors."""

from __future__ import annotations

import pytest

from service.domain.delivery import (
    AppendRequest,
    DeliveryPorts,
    DeliverySettings,
    LeftConversation,
    LeftMark,
    MailboxSettings,
)
from service.domain.errors import CursorExpired
from service.domain.lane_marks import LaneMark
from service.domain.mailbox import LaneState, Mailbox, MailboxCursor, MailboxItem
from service.domain.model import MessageRecord
from service.domain.ports import Backend, ManualClock
from service.domain.relay import Fence
from tests.conformance.harness import Harness
from tests.support import DEDUPE_CASES, DEDUPE_WINDOW_MS, text, unique

PARTITION = "p-test"
FENCE = Fence(PARTITION, 1)
BIG_PAGE = 1 << 20


def record(tenant: str, n: int, conversation: str = "c1", body: str = "hi") -> MessageRecord:
    return MessageRecord(
        tenant=tenant,
        conversation=conversation,
        seq=n,
        message_id=f"m-{conversation}-{n}",
        sender="alice",
        device="phone",
        cmid=f"cm-{n}",
        content=text(body),
        mentions=(),
        reply_to="",
        server_ts_ms=1_700_000_000_000 + n,
    )


def items(tenant: str, *seqs: int, conversation: str = "c1") -> tuple[MailboxItem, ...]:
    return tuple(MailboxItem(record(tenant, s, conversation)) for s in seqs)


def ports(backend: Backend) -> DeliveryPorts:
    assert backend.delivery is not None
    return backend.delivery


async def sync_all(d: DeliveryPorts, mailbox: Mailbox, limit: int = 1000) -> list[tuple[int, int]]:
    page = await d.mailbox.sync(mailbox, MailboxCursor(mailbox.lane), limit, BIG_PAGE)
    return [(e.seq, e.record.seq) for e in page.entries]


async def test_appends_get_gap_free_seqs_in_groups_and_dedupe_by_message_id(
    harness: Harness,
) -> None:
    d = ports(await harness.open())
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    first = await d.mailbox.append([AppendRequest(box, items(tenant, 1, 2, 2, 3))], FENCE)
    assert [(o.added, o.duplicates, o.first_seq, o.fenced) for o in first] == [(3, 1, 1, False)]
    again = await d.mailbox.append([AppendRequest(box, items(tenant, 3, 4))], FENCE)
    assert [(o.added, o.duplicates, o.first_seq) for o in again] == [(1, 1, 4)]
    nothing = await d.mailbox.append([AppendRequest(box, items(tenant, 1, 4))], FENCE)
    assert [(o.added, o.duplicates, o.first_seq) for o in nothing] == [(0, 2, 0)]
    page = await d.mailbox.sync(box, MailboxCursor(), 100, BIG_PAGE)
    assert [(e.seq, e.group_id, e.record.seq) for e in page.entries] == [
        (1, 1, 1),
        (2, 1, 2),
        (3, 1, 3),
        (4, 4, 4),
    ]
    assert page.entries[0].record == record(tenant, 1)  # the whole record comes back
    assert page.entries[0].appended_ms > 0
    assert page.next_cursor == MailboxCursor("inbox", 1, 4)
    assert (page.more, page.trim_watermark, page.head) == (False, 0, 4)
    (state,) = await d.mailbox.lane_state([box])
    assert state == LaneState(1, 4, 0)


async def test_a_page_never_splits_a_group_and_always_makes_progress(harness: Harness) -> None:
    d = ports(await harness.open())
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    await d.mailbox.append([AppendRequest(box, items(tenant, 1, 2, 3))], FENCE)  # seqs 1-3
    await d.mailbox.append([AppendRequest(box, items(tenant, 4))], FENCE)  # seq 4
    await d.mailbox.append([AppendRequest(box, items(tenant, 5, 6))], FENCE)  # seqs 5-6
    one = await d.mailbox.sync(box, MailboxCursor(), 2, BIG_PAGE)  # a 3-entry group > limit 2
    assert [e.seq for e in one.entries] == [1, 2, 3] and one.more
    two = await d.mailbox.sync(box, one.next_cursor, 2, BIG_PAGE)
    assert [e.seq for e in two.entries] == [4] and two.more  # 4 + the 5-6 group would be 3
    three = await d.mailbox.sync(box, two.next_cursor, 2, BIG_PAGE)
    assert [e.seq for e in three.entries] == [5, 6] and not three.more
    tight = await d.mailbox.sync(box, MailboxCursor(), 100, 1024)  # bytes: one group at least
    assert [e.seq for e in tight.entries] == [1, 2, 3, 4, 5, 6]
    big = tuple(MailboxItem(record(tenant, n, "c2", "x" * 600)) for n in (1, 2))
    await d.mailbox.append([AppendRequest(box, big[:1])], FENCE)
    await d.mailbox.append([AppendRequest(box, big[1:])], FENCE)
    after = await d.mailbox.sync(box, three.next_cursor, 100, 1024)
    assert [e.seq for e in after.entries] == [7] and after.more
    empty = await d.mailbox.sync(box, MailboxCursor("inbox", 1, 8), 100, BIG_PAGE)
    assert (empty.entries, empty.next_cursor, empty.more) == (
        (),
        MailboxCursor("inbox", 1, 8),
        False,
    )


async def test_a_mailbox_refuses_an_older_fencing_token_and_writes_nothing(
    harness: Harness,
) -> None:
    d = ports(await harness.open())
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    await d.mailbox.append([AppendRequest(box, items(tenant, 1))], Fence(PARTITION, 5))
    (refused,) = await d.mailbox.append([AppendRequest(box, items(tenant, 2))], Fence(PARTITION, 4))
    assert refused.fenced and refused.added == 0
    (other,) = await d.mailbox.append([AppendRequest(box, items(tenant, 3))], Fence("p-other", 1))
    assert not other.fenced and other.added == 1  # tokens are per partition
    (newer,) = await d.mailbox.append([AppendRequest(box, items(tenant, 4))], Fence(PARTITION, 6))
    assert newer.added == 1
    (stale,) = await d.mailbox.append([AppendRequest(box, items(tenant, 5))], Fence(PARTITION, 5))
    assert stale.fenced
    assert [s for _, s in await sync_all(d, box)] == [1, 3, 4]
    assert await d.mailbox.contains([(box, ("m-c1-1", "m-c1-2", "m-c1-4"))]) == [
        frozenset({"m-c1-1", "m-c1-4"})
    ]


async def test_cursors_below_the_watermark_of_another_epoch_or_ahead_expire(
    harness: Harness,
) -> None:
    d = ports(await harness.open())
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    for n in range(1, 7):
        await d.mailbox.append([AppendRequest(box, items(tenant, n))], FENCE)
    state = await d.mailbox.trim(box, 3)
    assert state == LaneState(1, 6, 3)
    for cursor, why in (
        (MailboxCursor("inbox", 1, 2), "trimmed"),
        (MailboxCursor(), "trimmed"),  # from the start, but the start is gone
        (MailboxCursor("inbox", 2, 4), "epoch"),
        (MailboxCursor("inbox", 1, 7), "ahead"),
    ):
        with pytest.raises(CursorExpired) as caught:
            await d.mailbox.sync(box, cursor, 100, BIG_PAGE)
        assert (caught.value.lane, caught.value.epoch, caught.value.trim_watermark) == (
            "inbox",
            1,
            3,
        )
        assert why in caught.value.why
    resumed = await d.mailbox.sync(box, MailboxCursor("inbox", 1, 3), 100, BIG_PAGE)
    assert [e.seq for e in resumed.entries] == [4, 5, 6] and resumed.trim_watermark == 3
    # a trim by hand, like one by count, keeps the ids for the dedupe window
    held = await d.mailbox.contains([(box, ("m-c1-2", "m-c1-5", "m-c1-7"))])
    assert held == [frozenset({"m-c1-2", "m-c1-5"})]


async def test_a_new_epoch_starts_empty_from_seq_1_and_keeps_the_fences(harness: Harness) -> None:
    d = ports(await harness.open())
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    await d.mailbox.append([AppendRequest(box, items(tenant, 1, 2))], Fence(PARTITION, 3))
    assert await d.mailbox.new_epoch(box) == LaneState(2, 0, 0)
    with pytest.raises(CursorExpired):
        await d.mailbox.sync(box, MailboxCursor("inbox", 1, 2), 100, BIG_PAGE)
    (stale,) = await d.mailbox.append([AppendRequest(box, items(tenant, 3))], Fence(PARTITION, 2))
    assert stale.fenced
    (fresh,) = await d.mailbox.append([AppendRequest(box, items(tenant, 1))], Fence(PARTITION, 3))
    assert (fresh.added, fresh.first_seq) == (1, 1)  # the old epoch's dedupe is gone too
    page = await d.mailbox.sync(box, MailboxCursor(), 100, BIG_PAGE)
    assert page.next_cursor == MailboxCursor("inbox", 2, 1)


async def test_an_append_below_its_floor_is_refused_and_writes_nothing(harness: Harness) -> None:
    """A lane found below the (epoch, head) its writer saw moved backwards (a failover
    or a restore lost entries): the append says so and writes nothing, so no seq a
    client may have applied is given out again; the next epoch goes above the floor."""
    d = ports(await harness.open())
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    (first,) = await d.mailbox.append([AppendRequest(box, items(tenant, 1, 2))], FENCE)
    assert (first.epoch, first.head, first.moved_back) == (1, 2, False)
    at_head = AppendRequest(box, items(tenant, 3), floor=LaneMark(1, 2))
    (ok,) = await d.mailbox.append([at_head], FENCE)
    assert (ok.added, ok.epoch, ok.head, ok.moved_back) == (1, 1, 3, False)
    for floor in (LaneMark(1, 4), LaneMark(2, 0)):  # a higher head, a later epoch
        refused = AppendRequest(box, items(tenant, 4), floor=floor)
        (moved,) = await d.mailbox.append([refused], FENCE)
        assert (moved.added, moved.epoch, moved.head, moved.moved_back) == (0, 1, 3, True)
    assert await sync_all(d, box) == [(1, 1), (2, 2), (3, 3)]
    stranger = Mailbox.inbox(tenant, "carol")  # never written: epoch 1, head 0
    (empty,) = await d.mailbox.append(
        [AppendRequest(stranger, items(tenant, 1), floor=LaneMark(1, 5))], FENCE
    )
    assert empty.moved_back and await sync_all(d, stranger) == []
    assert await d.mailbox.new_epoch(box, above=4) == LaneState(5, 0, 0)
    assert await d.mailbox.new_epoch(box, above=2) == LaneState(6, 0, 0)
    (fresh,) = await d.mailbox.append(
        [AppendRequest(box, items(tenant, 4), floor=LaneMark(6, 0))], FENCE
    )
    assert (fresh.first_seq, fresh.epoch, fresh.head, fresh.moved_back) == (1, 6, 1, False)


async def test_retention_trims_whole_groups_by_count_and_by_age(harness: Harness) -> None:
    clock = ManualClock()
    settings = MailboxSettings(retention_ms=60_000, max_entries=4)
    d = ports(await harness.open(clock=clock, delivery=DeliverySettings(mailbox=settings)))
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    await d.mailbox.append([AppendRequest(box, items(tenant, 1, 2, 3))], FENCE)  # seqs 1-3
    await d.mailbox.append([AppendRequest(box, items(tenant, 4, 5))], FENCE)  # 5 > 4: cut 1-3
    assert (await d.mailbox.lane_state([box]))[0] == LaneState(1, 5, 3)
    page = await d.mailbox.sync(box, MailboxCursor("inbox", 1, 3), 100, BIG_PAGE)
    assert [e.seq for e in page.entries] == [4, 5]
    clock.advance(61_000)
    await d.mailbox.append([AppendRequest(box, items(tenant, 6))], FENCE)  # 4-5 are too old
    assert (await d.mailbox.lane_state([box]))[0] == LaneState(1, 6, 5)
    assert await d.mailbox.contains([(box, ("m-c1-4", "m-c1-6"))]) == [frozenset({"m-c1-6"})]


async def test_an_idle_lane_past_retention_is_trimmed_when_read(harness: Harness) -> None:
    """Nothing is appended after the entries grow old (issue 23, item 9: on Redis
    and Scylla retention ran only at appends, so an idle lane kept and served
    what it should no longer hold). The next Sync trims first: the old cursor
    expires, and what the lane still holds is nothing."""
    clock = ManualClock()
    settings = MailboxSettings(retention_ms=60_000, max_entries=100)
    d = ports(await harness.open(clock=clock, delivery=DeliverySettings(mailbox=settings)))
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    await d.mailbox.append([AppendRequest(box, items(tenant, 1, 2))], FENCE)
    await d.mailbox.append([AppendRequest(box, items(tenant, 3))], FENCE)
    clock.advance(61_000)
    with pytest.raises(CursorExpired):
        await d.mailbox.sync(box, MailboxCursor("inbox", 1, 0), 100, BIG_PAGE)
    assert (await d.mailbox.lane_state([box]))[0] == LaneState(1, 3, 3)
    page = await d.mailbox.sync(box, MailboxCursor("inbox", 1, 3), 100, BIG_PAGE)
    assert page.entries == () and page.trim_watermark == 3
    assert await d.mailbox.contains([(box, ("m-c1-1", "m-c1-3"))]) == [frozenset()]


async def test_mailboxes_of_tenants_users_and_conversations_never_mix(harness: Harness) -> None:
    d = ports(await harness.open())
    t1, t2 = unique("t"), unique("t")
    boxes = [
        Mailbox.inbox(t1, "x"),
        Mailbox.inbox(t2, "x"),
        Mailbox.conversation(t1, "x"),
        Mailbox.inbox(t1, "x:y"),
    ]
    for n, box in enumerate(boxes, 1):
        await d.mailbox.append([AppendRequest(box, items(box.tenant, n))], FENCE)
    for n, box in enumerate(boxes, 1):
        assert [s for _, s in await sync_all(d, box)] == [n]
    page = await d.mailbox.sync(boxes[2], MailboxCursor("conversation:x"), 100, BIG_PAGE)
    assert page.next_cursor == MailboxCursor("conversation:x", 1, 1)
    untouched = await d.mailbox.lane_state([Mailbox.inbox(t1, "nobody")])
    assert untouched == [LaneState(1, 0, 0)]


async def test_many_mailboxes_in_one_call_and_a_restart_keeps_everything(
    harness: Harness,
) -> None:
    backend = await harness.open()
    d = ports(backend)
    tenant = unique("t")
    boxes = [Mailbox.inbox(tenant, f"u{n}") for n in range(50)]
    outcomes = await d.mailbox.append([AppendRequest(b, items(tenant, 1, 2)) for b in boxes], FENCE)
    assert all(o.added == 2 for o in outcomes)
    if not harness.durable:
        return
    await backend.close()
    again = ports(await harness.open())
    for box in boxes[:5]:
        assert [s for _, s in await sync_all(again, box)] == [1, 2]
    (stale,) = await again.mailbox.append(
        [AppendRequest(boxes[0], items(tenant, 3))], Fence(PARTITION, 0)
    )
    assert stale.fenced


async def test_the_conversation_index_lists_in_pages_and_forgets_removed(harness: Harness) -> None:
    d = ports(await harness.open())
    tenant = unique("t")
    for conversation in ("c3", "c1", "c2", "a:b"):
        await d.index.add(tenant, conversation, ["alice", "bob"])
    await d.index.add(tenant, "c1", ["alice"])  # idempotent
    await d.index.remove(tenant, "c2", ["alice", "nobody"])
    first, after = await d.index.conversations(tenant, "alice", "", 2)
    assert (first, after) == (("a:b", "c1"), "c1")
    rest, end = await d.index.conversations(tenant, "alice", after, 2)
    assert (rest, end) == (("c3",), "")
    assert (await d.index.conversations(tenant, "bob", "", 10))[0] == ("a:b", "c1", "c2", "c3")
    assert (await d.index.conversations(unique("t"), "alice", "", 10)) == ((), "")


async def test_departures_list_by_time_in_pages_with_the_latest_of_each(
    harness: Harness,
) -> None:
    """The departures behind ListLeftConversations: ordered by (time, conversation),
    strictly after the mark, paged; a conversation left again is listed at its
    latest departure (Scylla keeps both rows; the servicer keeps the latest)."""
    d = ports(await harness.open())
    tenant = unique("t")
    await d.index.record_left(tenant, "c2", ["alice", "bob"], 3, 1_000)
    await d.index.record_left(tenant, "c1", ["alice"], 2, 1_000)  # a tie in time
    await d.index.record_left(tenant, "c0", ["alice"], 5, 2_000)
    await d.index.record_left(tenant, "c2", ["alice"], 3, 1_000)  # idempotent
    first, mark = await d.index.left(tenant, "alice", LeftMark(0), 2)
    assert first == (LeftConversation("c1", 2, 1_000), LeftConversation("c2", 3, 1_000))
    assert mark == LeftMark(1_000, "c2")
    rest, end = await d.index.left(tenant, "alice", mark, 2)
    assert (rest, end) == ((LeftConversation("c0", 5, 2_000),), None)
    tie, more = await d.index.left(tenant, "alice", LeftMark(1_000, "c1"), 1)
    assert tie == (LeftConversation("c2", 3, 1_000),) and more == LeftMark(1_000, "c2")
    assert (await d.index.left(tenant, "alice", LeftMark(1_001), 10))[0] == (
        LeftConversation("c0", 5, 2_000),
    )
    assert (await d.index.left(tenant, "bob", LeftMark(0), 10)) == (
        (LeftConversation("c2", 3, 1_000),),
        None,
    )
    assert (await d.index.left(unique("t"), "alice", LeftMark(0), 10)) == ((), None)
    await d.index.record_left(tenant, "c1", ["alice"], 7, 3_000)  # left again, later
    again, _ = await d.index.left(tenant, "alice", LeftMark(2_000, "c0"), 10)
    assert again == (LeftConversation("c1", 7, 3_000),)


async def test_a_redelivery_after_a_count_trim_is_still_deduped(harness: Harness) -> None:
    """Issue 23, item 8: the dedupe index was trimmed with the entries, so once a
    lane had more than ``max_entries`` newer entries, a redelivery (reconcile,
    requeue) of an early message was appended again. Now the ids of entries
    trimmed by count stay for the dedupe window."""
    clock = ManualClock()
    settings = MailboxSettings(retention_ms=600_000, max_entries=2)
    d = ports(await harness.open(clock=clock, delivery=DeliverySettings(mailbox=settings)))
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    for n in range(1, 6):  # one group each: 1-3 are trimmed by count
        await d.mailbox.append([AppendRequest(box, items(tenant, n))], FENCE)
    assert (await d.mailbox.lane_state([box]))[0] == LaneState(1, 5, 3)
    (again,) = await d.mailbox.append([AppendRequest(box, items(tenant, 1, 2, 6))], FENCE)
    assert (again.added, again.duplicates, again.first_seq) == (1, 2, 6)
    page = await d.mailbox.sync(box, MailboxCursor("inbox", 1, 4), 100, BIG_PAGE)
    assert [e.record.seq for e in page.entries] == [5, 6]
    held = await d.mailbox.contains([(box, ("m-c1-1", "m-c1-3", "m-c1-9"))])
    assert held == [frozenset({"m-c1-1", "m-c1-3"})]


@pytest.mark.parametrize(("later_ms", "forgotten"), DEDUPE_CASES)
async def test_the_ids_of_trimmed_groups_are_forgotten_when_the_window_passes(
    harness: Harness, later_ms: int, forgotten: int
) -> None:
    """One case table for ``service.domain.mailbox.dedupe_cut`` on every backend (the
    Redis script mirrors it): ids of trimmed groups go by age, a whole group at a
    time, never those of an entry still held."""
    clock = ManualClock()
    settings = MailboxSettings(
        retention_ms=600_000, max_entries=2, dedupe_window_ms=DEDUPE_WINDOW_MS
    )
    d = ports(await harness.open(clock=clock, delivery=DeliverySettings(mailbox=settings)))
    tenant = unique("t")
    box = Mailbox.inbox(tenant, "bob")
    await d.mailbox.append([AppendRequest(box, items(tenant, 1, 2))], FENCE)  # at 0
    clock.advance(10_000)
    await d.mailbox.append([AppendRequest(box, items(tenant, 3))], FENCE)  # at 10 s
    clock.advance(10_000)
    await d.mailbox.append([AppendRequest(box, items(tenant, 4))], FENCE)  # at 20 s: cut 1-2
    await d.mailbox.append([AppendRequest(box, items(tenant, 5))], FENCE)  # cut 3
    clock.advance(later_ms - 20_000)
    await d.mailbox.append([AppendRequest(box, items(tenant, 6))], FENCE)  # cut 4
    ids = tuple(f"m-c1-{n}" for n in range(1, 7))
    (held,) = await d.mailbox.contains([(box, ids)])
    assert held == {f"m-c1-{n}" for n in range(forgotten + 1, 7)}
    assert (await d.mailbox.lane_state([box]))[0] == LaneState(1, 6, 4)


async def test_entries_keep_the_membership_version_they_were_appended_with(
    harness: Harness,
) -> None:
    """What ``mailbox.readable`` judges a conversation lane's reader by; an item
    without one (written before entries carried it) reads as unknown (0)."""
    d = ports(await harness.open())
    tenant = unique("t")
    box = Mailbox.conversation(tenant, "c1")
    carried = (
        MailboxItem(record(tenant, 1), 3),
        MailboxItem(record(tenant, 2), 4),
        MailboxItem(record(tenant, 3)),
    )
    await d.mailbox.append([AppendRequest(box, carried)], FENCE)
    page = await d.mailbox.sync(box, MailboxCursor(box.lane), 100, BIG_PAGE)
    assert [(e.record.seq, e.membership_version) for e in page.entries] == [(1, 3), (2, 4), (3, 0)]
    mine = await d.mailbox.sync(box, MailboxCursor(box.lane), 100, BIG_PAGE, (4,))
    assert [e.record.seq for e in mine.entries] == [2, 3] and mine.next_cursor.seq == 3
