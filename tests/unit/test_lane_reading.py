"""One reading rule for every lane (DESIGN §10): ``readable`` as a case table, and
pages of a conversation lane built for one reader (``build_page`` with a reader)."""

from __future__ import annotations

import pytest

from backends.redis import codec
from backends.scylla.mailbox import entry_of as scylla_entry
from service.api.mailbox import page_from_proto, page_to_proto
from service.domain.mailbox import (
    UNKNOWN_VERSION,
    LaneRead,
    LaneState,
    MailboxCursor,
    MailboxEntry,
    Reader,
    build_page,
    readable,
)
from service.domain.model import MessageRecord, OutboxEntry, OutboxPublication
from service.domain.relay import PartitionEntry
from service.domain.relay_worker import Plan
from tests.support import text

LANE = "conversation:c"

# A reader who was a member at versions 2-3 and from 6 on: joined at 2, removed
# at 4, re-added at 6 (service.domain.membership's stored form).
REJOINED = (2, 4, 6)
REMOVED = (2, 4)


@pytest.mark.parametrize(
    ("reader", "version", "sees"),
    [
        (None, 1, True),  # an inbox's owner: the relay wrote there only what was for it
        (None, UNKNOWN_VERSION, True),
        (REJOINED, 1, False),  # before it joined
        (REJOINED, 2, True),
        (REJOINED, 3, True),
        (REJOINED, 4, False),  # while it was out
        (REJOINED, 5, False),
        (REJOINED, 6, True),  # after it came back
        (REJOINED, 99, True),
        (REMOVED, 3, True),  # a removed member keeps what was for it
        (REMOVED, 4, False),
        (REJOINED, UNKNOWN_VERSION, True),  # unknown: a member now reads it
        (REMOVED, UNKNOWN_VERSION, False),  # ... and only a member now
        ((), 3, False),  # never a member (the servicer refuses it before)
    ],
)
def test_a_reader_sees_what_was_committed_while_it_was_a_member(
    reader: Reader, version: int, sees: bool
) -> None:
    assert readable(reader, version) is sees


def entry(seq: int, group: int, version: int) -> MailboxEntry:
    record = MessageRecord("t", "c", seq, f"m{seq}", "u", "d", f"k{seq}", text("hi"), (), "", 1)
    return MailboxEntry(seq, group, record, 2, version)


# Groups (by first seq): 1 = {1 v1, 2 v2}, 3 = {3 v4}, 4 = {4 v5, 5 v6}, 6 = {6 v6, 7 v7}
ENTRIES = (
    entry(1, 1, 1),
    entry(2, 1, 2),
    entry(3, 3, 4),
    entry(4, 4, 5),
    entry(5, 4, 6),
    entry(6, 6, 6),
    entry(7, 6, 7),
)
READ = LaneRead(LaneState(1, 7, 0), ENTRIES)


def seqs(reader: Reader, cursor: MailboxCursor, limit: int = 100) -> tuple[list[int], int, bool]:
    page = build_page(LANE, cursor, READ, limit, 1 << 20, reader)
    return [e.seq for e in page.entries], page.next_cursor.seq, page.more


def test_a_page_leaves_out_what_the_reader_may_not_see_and_its_cursor_passes_it() -> None:
    assert seqs(REJOINED, MailboxCursor(LANE)) == ([2, 5, 6, 7], 7, False)
    assert seqs(None, MailboxCursor(LANE)) == ([1, 2, 3, 4, 5, 6, 7], 7, False)
    assert seqs(REMOVED, MailboxCursor(LANE)) == ([2], 7, False)  # passes all it read


def test_a_filtered_page_withholds_in_place_what_it_leaves_out_and_progresses() -> None:
    page = build_page(LANE, MailboxCursor(LANE), READ, 100, 1 << 20, REJOINED)
    assert page.withheld == ((1, 1), (3, 3), (4, 4))  # seq and group, nothing else
    shown = sorted([*(e.seq for e in page.entries), *(s for s, _ in page.withheld)])
    assert shown == list(range(1, 8))  # with the withheld ones the page has no gap
    # limit counts every event, withheld ones too; a group is never split
    assert seqs(REJOINED, MailboxCursor(LANE), limit=3) == ([2], 3, True)
    # the next group is over a limit of 1: still one whole group, never none
    assert seqs(REJOINED, MailboxCursor(LANE, 1, 3), limit=1) == ([5], 5, True)
    # nothing shown at all: a page of withheld events whose cursor moves past them
    only_hidden = LaneRead(LaneState(1, 9, 0), (entry(8, 8, 4), entry(9, 9, 5)))
    page = build_page(LANE, MailboxCursor(LANE, 1, 7), only_hidden, 1, 1 << 20, REJOINED)
    assert page.entries == () and page.withheld == ((8, 8),) and page.next_cursor.seq == 8
    assert page.more


def test_withheld_entries_travel_as_their_own_event_kind_in_seq_order() -> None:
    page = build_page(LANE, MailboxCursor(LANE), READ, 100, 1 << 20, REJOINED)
    wire = page_to_proto(page)
    assert [(e.seq, e.WhichOneof("event")) for e in wire.events] == [
        (1, "withheld"), (2, "message_added"), (3, "withheld"), (4, "withheld"),
        (5, "message_added"), (6, "message_added"), (7, "message_added"),
    ]  # fmt: skip
    back = page_from_proto(wire)  # the version an entry carries stays on the server
    assert back.withheld == page.withheld
    assert [e.record for e in back.entries] == [e.record for e in page.entries]


def test_entries_whose_delivery_was_frozen_inline_carry_no_version() -> None:
    def plan(recipients: tuple[str, ...] | None) -> Plan:
        outbox = OutboxEntry(OutboxPublication("s", "p"), "t", "c", 1, "m1", recipients, 7)
        record = MessageRecord("t", "c", 1, "m1", "u", "d", "k", text("hi"), (), "", 1)
        return Plan(PartitionEntry(outbox), record, ())

    assert plan(None).lane_version == 7
    assert plan(("alice", "bob")).lane_version == UNKNOWN_VERSION  # release 1


def test_redis_lane_records_carry_the_version_and_old_ones_read_as_unknown() -> None:
    record = MessageRecord("t", "c", 3, "m3", "u", "d", "k", text("hi"), (), "", 1)
    blob = codec.encode_lane_record(record, 5)
    assert codec.decode_lane_record("t", "c", 3, blob) == (record, 5)
    assert codec.decode_record("t", "c", 3, blob) == record  # a reader that ignores it
    old = codec.encode_record(record)  # what entries held before
    assert codec.decode_lane_record("t", "c", 3, old) == (record, UNKNOWN_VERSION)
    assert codec.encode_lane_record(record, UNKNOWN_VERSION) == old


def test_scylla_rows_from_before_schema_4_read_as_unknown() -> None:
    row = {
        "seq": 1, "group_id": 1, "appended_ms": 2, "message_id": "m1", "conversation": "c",
        "conv_seq": 1, "sender": "u", "device": "d", "cmid": "k", "server_ts_ms": 1,
        "message_type": "text", "custom_type": "", "body": b"hi",
    }  # fmt: skip
    assert scylla_entry("t", row).membership_version == UNKNOWN_VERSION  # no column
    assert scylla_entry("t", {**row, "membership_version": None}).membership_version == 0
    assert scylla_entry("t", {**row, "membership_version": 4}).membership_version == 4
