"""The memory backend keeps history records, mailbox entries and committed keys
as rows the cyclic garbage collector does not track (issue 27: a full collection walked
every retained message, one pause that grew with the history)."""

from __future__ import annotations

import gc

import pytest

from backends.memory import MemoryState, open_memory_backend
from backends.memory.rows import record_of, record_row
from service.domain.mailbox import Mailbox
from service.domain.model import MessageContent, MessageRecord, MessageType
from service.domain.ports import ManualClock
from tests.conformance.relay_support import drain, inbox
from tests.support import committer, conversation, referenced, send, text, unique


def _record(content: MessageContent, mentions: tuple[str, ...] = ()) -> MessageRecord:
    return MessageRecord(
        "t", "c1", 7, "m-7", "alice", "phone", "cm-7", content, mentions, "m-1", 1_700_000
    )


@pytest.mark.parametrize(
    "record",
    [
        _record(text("hello")),
        _record(referenced(), mentions=("bob", "carol")),
        _record(MessageContent(MessageType.CUSTOM, b"{}", custom_type="poll")),
        _record(MessageContent(MessageType.IMAGE, body_ref=referenced().body_ref)),
    ],
    ids=["text", "referenced-with-mentions", "custom", "image"],
)
def test_a_record_comes_back_from_its_row_equal_and_the_row_is_untracked(
    record: MessageRecord,
) -> None:
    row = record_row(record)
    assert record_of(row) == record
    assert record_of(row).content.message_type is record.content.message_type
    gc.collect()  # one collection untracks a flat tuple of atomic values
    assert not gc.is_tracked(row)


async def test_delivered_messages_leave_nothing_per_message_for_the_collector_but_the_commit() -> (
    None
):
    state = MemoryState()
    clock = ManualClock()
    backend = open_memory_backend(state, clock=clock)
    tenant = unique("t")
    users = ("alice", "bob", "carol")
    await conversation(backend, tenant, members=users)
    c = committer(backend, clock)
    acks = [await c.commit_send(send(tenant)) for _ in range(20)]
    await drain(backend, "relay-1", clock)
    gc.collect()  # one collection untracks the (flat) rows made since the last one

    conv = state.conversations[(tenant, "c1")]
    assert sorted(conv.history) == [a.seq for a in acks]
    assert not any(gc.is_tracked(row) for row in conv.history.values())
    lanes = [state.delivery.lanes[(tenant, "u", user)] for user in users]
    assert [len(lane.stored) for lane in lanes] == [20, 20, 20]
    assert not any(gc.is_tracked(row) for lane in lanes for row in lane.stored)
    committed = [state.commits[(tenant, "alice", a.cmid)] for a in acks]
    assert not any(gc.is_tracked(row) for row in committed)  # the idempotency keys too
    read = await inbox(backend, Mailbox.inbox(tenant, "bob"))
    assert read == [("c1", a.seq) for a in acks]  # and read back as entries
