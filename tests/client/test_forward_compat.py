"""A mailbox event kind this runtime does not know (issue 22, item 8): kept as
opaque, its seq applied, never a gap that wedges the lane."""

from __future__ import annotations

from client import MailboxCursor
from client.pages import check_page
from client.transport import page_of
from service.api import convert
from service.domain.model import MessageContent, MessageRecord, MessageType
from service.gen.message_committer.v1 import mailbox_pb2 as xpb

UNKNOWN_KIND = b"\x9a\x06\x00"  # field 99, length-delimited, empty: a kind from a newer server


def _record(seq: int) -> MessageRecord:
    return MessageRecord(
        tenant="acme",
        conversation="general",
        seq=seq,
        message_id=f"m-{seq}",
        sender="bob",
        device="phone",
        cmid=f"c-{seq}",
        content=MessageContent(MessageType.TEXT, b"hi"),
        mentions=(),
        reply_to="",
        server_ts_ms=7,
    )


def test_an_unknown_event_kind_is_opaque_and_its_seq_is_applied() -> None:
    known = xpb.MailboxEvent(seq=1, group_id=1)
    known.message_added.message.CopyFrom(convert.record_to_proto(_record(1)))
    newer = xpb.MailboxEvent.FromString(
        xpb.MailboxEvent(seq=2, group_id=2).SerializeToString() + UNKNOWN_KIND
    )
    last = xpb.MailboxEvent(seq=3, group_id=3)
    last.message_added.message.CopyFrom(convert.record_to_proto(_record(2)))
    response = xpb.SyncResponse(
        events=[known, newer, last],
        next_cursor=xpb.MailboxCursor(lane="inbox", epoch=1, seq=3),
    )
    page = page_of(MailboxCursor("inbox", 1, 0), response)
    assert [e.seq for e in page.events] == [1, 2, 3]
    assert [e.record is None for e in page.events] == [False, True, False]
    assert page.events[1].opaque == newer.SerializeToString()
    check_page(MailboxCursor("inbox", 1, 0), page)  # no gap
