"""The LocalStore contract, run on the SQLite file store and the in-memory one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from client import (
    AccountMismatch,
    ConnectRequest,
    DuplicateClientMessageId,
    LocalStoreBusy,
    LocalStoreFailure,
    MailboxCursor,
    MailboxPage,
    Origin,
    in_memory_store_for_test,
    open_local_store,
)
from client.faults import ClientCrash, ClientFaults, ClientPoint
from client.model import Backfill, ConversationSummary, ExpiredCursor, MailboxEvent
from client.sqlite import SqliteLocalStore
from service.domain.model import (
    AuthenticatedSend,
    CommittedMessage,
    Direction,
    HistoryPage,
    MessageContent,
    MessageRecord,
    MessageType,
)

ME = ConnectRequest("acme", "alice", "phone")
POLL = MessageContent(MessageType.CUSTOM, b"{}", custom_type="poll")
POLL_OTHER = MessageContent(MessageType.CUSTOM, b'{"q": 1}', custom_type="poll")


def send(cmid: str, body: bytes = b"hi", conversation: str = "general") -> AuthenticatedSend:
    content = MessageContent(MessageType.TEXT, body)
    return AuthenticatedSend("acme", "alice", "phone", conversation, cmid, content)


def record(
    seq: int, sender: str = "bob", cmid: str = "", conversation: str = "general"
) -> MessageRecord:
    return MessageRecord(
        tenant="acme",
        conversation=conversation,
        seq=seq,
        message_id=f"00000000-0000-7000-8000-{seq:012d}",
        sender=sender,
        device="phone" if sender == "alice" else "web",
        cmid=cmid or f"{sender}-{seq}",
        content=MessageContent(
            MessageType.TEXT, b"hi" if sender == "alice" else f"m{seq}".encode()
        ),
        mentions=(),
        reply_to="",
        server_ts_ms=1_000 + seq,
    )


def page(records: list[MessageRecord], after: int, epoch: int = 1) -> MailboxPage:
    events = tuple(MailboxEvent(after + i + 1, after + 1, r) for i, r in enumerate(records))
    return MailboxPage("inbox", events, MailboxCursor("inbox", epoch, after + len(records)))


def hpage(records: list[MessageRecord], next_anchor: int = 0) -> HistoryPage:
    return HistoryPage(
        "general", Direction.BACKWARD, 0, 1 << 20, tuple(records), 1, 99, next_anchor
    )


@pytest.fixture(params=["file", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqliteLocalStore]:
    faults = ClientFaults()
    if request.param == "file":
        s = await open_local_store(tmp_path / "local.db", faults=faults)
    else:
        s = in_memory_store_for_test(faults)
    await s.bind_account(ME)
    yield s
    await s.close()


async def test_pending_is_idempotent_for_the_same_send_only(store: SqliteLocalStore) -> None:
    first = await store.persist_pending(send("c1"), 10)
    assert await store.persist_pending(send("c1"), 20) == first
    with pytest.raises(DuplicateClientMessageId):
        await store.persist_pending(send("c1", b"other"), 30)
    await store.persist_pending(send("c2"), 40)
    assert [p.cmid for p in await store.pending()] == ["c1", "c2"]


async def test_attempts_park_unpark_discard(store: SqliteLocalStore) -> None:
    await store.persist_pending(send("c1"), 10)
    await store.mark_attempt("c1", 50)
    await store.mark_attempt("c1", 60)
    [p] = await store.pending()
    assert (p.attempts, p.first_attempt_ms) == (2, 50)
    await store.park_pending("c1", "NotAMember: no")
    [p] = await store.pending()
    assert p.parked and p.problem == "NotAMember: no"
    assert await store.unpark_pending("c1") and not await store.unpark_pending("c1")
    assert await store.discard_pending("c1") and await store.pending() == []


async def test_a_page_writes_messages_projection_and_cursor_and_dedupes(
    store: SqliteLocalStore,
) -> None:
    applied = await store.apply_mailbox_page(
        page([record(1), record(2)], 0), MailboxCursor("inbox", 1, 2)
    )
    assert [m.seq for m in applied.added] == [1, 2]
    assert await store.cursor("inbox") == MailboxCursor("inbox", 1, 2)
    again = await store.apply_history(hpage([record(2), record(1), record(3)]))
    assert [m.seq for m in again.added] == [3]
    [view] = await store.conversations()
    assert (view.last_seq, view.message_count, view.last_message_id) == (3, 3, record(3).message_id)
    assert [m.origin for m in await store.messages("general")] == [
        Origin.MAILBOX,
        Origin.MAILBOX,
        Origin.HISTORY,
    ]


async def test_a_page_confirms_its_own_pending_send_in_place(store: SqliteLocalStore) -> None:
    await store.persist_pending(send("mine"), 10)
    await store.persist_pending(send("other", b"different"), 11)
    own = record(1, sender="alice", cmid="mine")
    lookalike = replace(
        record(2, sender="alice", cmid="other"), content=MessageContent(MessageType.TEXT, b"x")
    )
    applied = await store.apply_mailbox_page(
        page([own, lookalike], 0), MailboxCursor("inbox", 1, 2)
    )
    assert [c.cmid for c in applied.confirmed] == ["mine"]
    assert applied.confirmed[0].message.seq == 1
    assert [m.seq for m in applied.added] == [2]  # not the pending send: another one
    assert [p.cmid for p in await store.pending()] == ["other"]
    assert (await store.find_own("alice", "mine")) is not None


async def test_a_crash_mid_batch_writes_nothing(tmp_path: Path) -> None:
    faults = ClientFaults()
    s = await open_local_store(tmp_path / "crash.db", faults=faults)
    await s.bind_account(ME)
    await s.apply_mailbox_page(page([record(1)], 0), MailboxCursor("inbox", 1, 1))
    faults.arm(ClientPoint.MID_BATCH)
    with pytest.raises(ClientCrash):
        await s.apply_mailbox_page(page([record(2), record(3)], 1), MailboxCursor("inbox", 1, 3))
    await s.close()
    reopened = await open_local_store(tmp_path / "crash.db")
    assert await reopened.cursor("inbox") == MailboxCursor("inbox", 1, 1)
    assert [m.seq for m in await reopened.messages("general")] == [1]
    [view] = await reopened.conversations()
    assert view.message_count == 1
    await reopened.close()


async def test_resolve_keeps_type_and_custom_type_once(store: SqliteLocalStore) -> None:
    poll = replace(send("p1"), content=POLL)
    await store.persist_pending(poll, 10)
    ack = CommittedMessage("general", "p1", "00000000-0000-7000-8000-000000000009", 9, 5_000)
    with pytest.raises(LocalStoreFailure):
        await store.resolve_pending(ack, MessageContent(MessageType.TEXT, b"{}"))
    message = await store.resolve_pending(ack, POLL)
    assert message is not None and message.origin is Origin.OWN
    assert message.record.content == POLL and message.seq == 9
    assert await store.resolve_pending(ack, POLL) is None
    [stored] = await store.messages("general")
    assert stored.record.content.custom_type == "poll"
    assert stored.record.content.message_type is MessageType.CUSTOM
    assert await store.pending() == []
    again = await store.persist_pending(poll, 20)  # a host's repeat: already through
    assert again.confirmed and await store.pending() == []
    with pytest.raises(DuplicateClientMessageId):  # the id, with other content
        await store.persist_pending(replace(poll, content=POLL_OTHER), 30)


async def test_two_messages_at_one_seq_fail_and_write_nothing(store: SqliteLocalStore) -> None:
    await store.apply_history(hpage([record(1)]))
    other = replace(record(1), message_id="00000000-0000-7000-8000-0000000000ff")
    with pytest.raises(LocalStoreFailure):
        await store.apply_history(hpage([record(2), other]))
    assert [m.seq for m in await store.messages("general")] == [1]


async def test_rebuild_progress_survives_a_resume_and_restarts_on_a_new_expiry(
    store: SqliteLocalStore,
) -> None:
    listed = [
        ConversationSummary("general", 3, 2),
        ConversationSummary("big", 1, 5000, "conversation:big"),
    ]
    first = ExpiredCursor("inbox", 1, 40, "trimmed")
    await store.apply_mailbox_page(page([record(1)], 0), MailboxCursor("inbox", 1, 1))
    await store.begin_rebuild(first, listed, [("general", 0)], 100)
    [b] = await store.backfills("inbox")
    assert b == Backfill("inbox", "general", 0)
    moved = replace(b, anchor=30, fetched=10)
    await store.apply_backfill(moved, hpage([record(31)], 30))
    await store.begin_rebuild(first, listed, [("general", 25)], 200)  # resumed: kept
    assert await store.backfills("inbox") == [moved]
    await store.begin_rebuild(replace(first, trim_watermark=60), listed, [("general", 25)], 300)
    assert await store.backfills("inbox") == [Backfill("inbox", "general", 0)]  # floor kept
    assert await store.rebuilding() == [replace(first, trim_watermark=60)]
    views = {v.conversation: v for v in await store.conversations()}
    assert views["big"].lane == "conversation:big" and views["big"].listed
    await store.finish_rebuild(MailboxCursor("inbox", 1, 60))
    assert await store.cursor("inbox") == MailboxCursor("inbox", 1, 60)
    assert await store.rebuilding() == [] and await store.backfills("inbox") == []
    assert len(await store.messages("general")) == 2  # local messages kept


async def test_reset_for_rebuild_keeps_pending_only(store: SqliteLocalStore) -> None:
    await store.persist_pending(send("keep"), 10)
    await store.apply_mailbox_page(page([record(1)], 0), MailboxCursor("inbox", 1, 1))
    report = await store.reset_for_rebuild("test")
    assert report.kept_pending == 1
    assert await store.cursor("inbox") is None
    assert await store.messages("general") == [] and await store.conversations() == []
    assert [p.cmid for p in await store.pending()] == ["keep"]


async def test_the_store_belongs_to_one_account(store: SqliteLocalStore) -> None:
    await store.bind_account(ME)
    with pytest.raises(AccountMismatch):
        await store.bind_account(ConnectRequest("acme", "mallory", "phone"))


async def test_a_file_store_is_durable_locked_and_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "durable.db"
    s = await open_local_store(path)
    assert s.persistent and not in_memory_store_for_test().persistent
    await s.bind_account(ME)
    await s.persist_pending(send("c1"), 10)
    with pytest.raises(LocalStoreBusy):
        await open_local_store(path)
    await s.close()
    again = await open_local_store(path)
    assert [p.cmid for p in await again.pending()] == ["c1"]
    await again.close()
    import sqlite3

    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
