"""Versioned migrations of the local SQLite schema and the reset that keeps pending sends."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from client import ClientRuntime, ConnectRequest, GrpcConnector, LocalStoreReset, open_local_store
from client.codec import send_to_bytes
from client.sqlite import schema
from service.domain.model import AuthenticatedSend, MessageContent, MessageType
from toolkit.ports import free_port

SEND = AuthenticatedSend(
    "acme", "alice", "phone", "general", "p-1", MessageContent(MessageType.TEXT, b"keep me")
)


def version_one(path: Path) -> None:
    """A database as the first schema version left it, with a pending send and a message."""
    db = sqlite3.connect(path, isolation_level=None)
    schema.migrate(db, schema.MIGRATIONS[:1])
    db.execute(
        "INSERT INTO pending (cmid, position, conversation, send, created_ms) VALUES (?,1,?,?,5)",
        ("p-1", "general", send_to_bytes(SEND)),
    )
    db.execute(
        "INSERT INTO messages VALUES ('m-1','general',1,'bob','b-1','text','',7,'mailbox',x'')"
    )
    db.execute("INSERT INTO cursors VALUES ('inbox', 1, 1, 7)")
    db.close()


async def test_a_new_file_is_at_the_latest_version() -> None:
    assert schema.LATEST == len(schema.MIGRATIONS) == 4


async def test_a_version_one_file_is_migrated_keeping_everything(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    version_one(path)
    store = await open_local_store(path)
    assert store.reset_report is None
    assert [p.send for p in await store.pending()] == [SEND]
    assert (await store.cursor("inbox")) is not None
    assert await store.rebuilding() == []
    await store.close()
    db = sqlite3.connect(path)
    assert schema.version_of(db) == schema.LATEST
    db.close()


def _set(path: Path, *statements: str) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        db.execute(statement)
    db.close()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (("PRAGMA user_version = 7",), "newer than this runtime"),
        (("ALTER TABLE messages DROP COLUMN sender",), "migration to version 2 failed"),
    ],
)
async def test_an_unusable_version_is_reset_keeping_pending(
    tmp_path: Path, damage: tuple[str, ...], reason: str
) -> None:
    path = tmp_path / "bad.db"
    version_one(path)
    _set(path, *damage)
    store = await open_local_store(path)
    assert store.reset_report is not None
    assert reason in store.reset_report.reason
    assert store.reset_report.kept_pending == 1 and not store.reset_report.lost_pending
    [pending] = await store.pending()
    assert pending.send == SEND and pending.created_ms == 5
    assert await store.cursor("inbox") is None  # the cursor went with the messages
    assert await store.messages("general") == []
    await store.bind_account(ConnectRequest("acme", "alice", "phone"))  # a fresh binding
    await store.close()
    assert (tmp_path / "bad.db.before-reset").exists()
    assert not (tmp_path / "bad.db.new").exists()


async def test_a_table_without_its_columns_is_reset(tmp_path: Path) -> None:
    path = tmp_path / "cols.db"
    version_one(path)
    clean = await open_local_store(path)
    assert clean.reset_report is None
    await clean.close()
    _set(path, "ALTER TABLE conversations DROP COLUMN listed")
    store = await open_local_store(path)
    assert store.reset_report is not None
    assert "conversations lacks columns" in store.reset_report.reason
    assert [p.send for p in await store.pending()] == [SEND]
    await store.close()


async def test_garbage_is_moved_aside_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database file at all" * 100)
    store = await open_local_store(path)
    assert store.reset_report is not None
    assert store.reset_report.lost_pending and store.reset_report.kept_pending == 0
    assert await store.pending() == []
    await store.close()
    assert (tmp_path / "garbage.db.before-reset").read_bytes().startswith(b"this is not")


async def test_a_reset_interrupted_after_moving_the_old_file_is_finished(tmp_path: Path) -> None:
    path = tmp_path / "half.db"
    version_one(path)
    salvage = schema.salvage_pending(path, lambda send: True)
    new = path.with_name(path.name + ".new")
    db = sqlite3.connect(new, isolation_level=None)
    schema.migrate(db)
    db.execute(
        f"INSERT INTO pending ({', '.join(schema.PENDING_COLUMNS)}) VALUES "
        f"({', '.join('?' * len(schema.PENDING_COLUMNS))})",
        salvage.rows[0],
    )
    db.close()
    path.rename(path.with_name(path.name + ".before-reset"))  # the crash came here
    store = await open_local_store(path)
    assert store.reset_report is None
    assert [p.send for p in await store.pending()] == [SEND]
    await store.close()


async def test_a_reset_report_outlives_a_process_that_died_before_its_host_took_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dies.db"
    version_one(path)
    _set(path, "PRAGMA user_version = 7")
    first = await open_local_store(path)  # reset: the report is written into the new file
    assert first.reset_report is not None
    await first.close()  # the process dies before any host reads LocalStoreReset
    _set(path, "PRAGMA user_version = 8")  # and the next open resets again
    second = await open_local_store(path)
    await second.close()  # unread again

    third = await open_local_store(path)
    assert third.reset_report is None  # a good file now: nothing reset this time
    runtime = ClientRuntime(third, GrpcConnector(f"127.0.0.1:{free_port()}"))
    await runtime.connect(ConnectRequest("acme", "alice", "phone"))
    said = [await asyncio.wait_for(runtime.next_event(), 10) for _ in range(2)]
    assert all(isinstance(e, LocalStoreReset) for e in said), said
    assert [e.kept_pending for e in said if isinstance(e, LocalStoreReset)] == [1, 1]
    assert "newer than this runtime" in str(said[0])
    await runtime.close()

    fourth = await open_local_store(path)  # taken by the host: not said again
    assert await fourth.untaken_resets() == []
    [pending] = await fourth.pending()
    assert pending.send == SEND
    await fourth.close()


async def test_a_reset_report_announced_but_not_taken_comes_again(tmp_path: Path) -> None:
    path = tmp_path / "untaken.db"
    version_one(path)
    _set(path, "PRAGMA user_version = 7")
    store = await open_local_store(path)
    runtime = ClientRuntime(store, GrpcConnector(f"127.0.0.1:{free_port()}"))
    await runtime.connect(ConnectRequest("acme", "alice", "phone"))
    await runtime.close()  # the event was queued, never read
    again = await open_local_store(path)
    [report] = await again.untaken_resets()
    assert "newer than this runtime" in report.reason and report.kept_pending == 1
    await again.close()
