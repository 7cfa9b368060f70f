"""What the memory backend keeps for long, as flat tuples the garbage collector
stops tracking.

A committed message stays for its retention: its history record, one
mailbox entry per recipient and its idempotency key. As dataclass instances
that was about nine objects per delivered commit that CPython's cyclic collector tracks, and a full
collection walks every one of them: one pause, 0.5 to 1.9 s after 100,000
commits, that grows with the retained history (issue 27). A tuple that holds
only strings, bytes, ints and None is untracked by the first collection that
sees it; a tuple holding another tuple needs one more collection per level
(the inner one is untracked first), so the rows are flat: the body reference
as three fields, the mentions as one space-joined string (user ids have no
spaces), and a mailbox entry is its four numbers followed by its record's row.
The dataclasses are made again when read (a history page, a Sync page, the
relay's record lookup).
"""

from __future__ import annotations

from typing import Final

from service.domain.mailbox import MailboxEntry
from service.domain.model import BodyReference, MessageContent, MessageRecord, MessageType

RecordRow = tuple[
    str, str, int, str, str, str, str, str, bytes, str | None, int, str, str, str, str, int
]
"""tenant, conversation, seq, message id, sender, device, cmid, message type,
body, body reference (uri or None, size, sha256), custom type, mentions
(space-joined), reply to, server time."""
EntryRow = tuple[
    int, int, int, int,
    str, str, int, str, str, str, str, str, bytes, str | None, int, str, str, str, str, int,
]  # fmt: skip
"""seq, group id, appended ms, membership version, then the record's row."""

CommittedRow = tuple[bytes, str, str, str, int, int, str, str]
"""A COMMITTED key: identity digest, conversation, cmid, message id, seq, server
time, publication stream and position (``state.Commit.of`` reads one back)."""

MESSAGE_ID: Final = 3
"""A record row's message id."""
ENTRY_SEQ: Final = 0
ENTRY_RECORD: Final = 4
ENTRY_MESSAGE_ID: Final = 7
"""An entry row's seq, where its record's row starts, and its message id."""


def record_row(record: MessageRecord) -> RecordRow:
    c, ref = record.content, record.content.body_ref
    return (
        record.tenant,
        record.conversation,
        record.seq,
        record.message_id,
        record.sender,
        record.device,
        record.cmid,
        str(c.message_type.value),  # the plain str: an enum member is tracked
        c.body,
        None if ref is None else ref.uri,
        0 if ref is None else ref.size_bytes,
        "" if ref is None else ref.sha256,
        c.custom_type,
        " ".join(record.mentions),
        record.reply_to,
        record.server_ts_ms,
    )


def record_of(row: RecordRow) -> MessageRecord:
    uri, mentions = row[9], row[13]
    content = MessageContent(
        MessageType(row[7]),
        row[8],
        None if uri is None else BodyReference(uri, row[10], row[11]),
        row[12],
    )
    return MessageRecord(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        content,
        tuple(mentions.split(" ")) if mentions else (),
        row[14],
        row[15],
    )


def entry_row(
    seq: int, group_id: int, appended_ms: int, version: int, record: RecordRow
) -> EntryRow:
    return (seq, group_id, appended_ms, version, *record)


def entry_of(row: EntryRow) -> MailboxEntry:
    return MailboxEntry(row[0], row[1], record_of(row[ENTRY_RECORD:]), row[2], row[3])
