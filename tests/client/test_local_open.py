"""What opening the local store does with errors (issue 22, items 1 and 7): a
transient error leaves the file alone, only an unusable file is reset, and the
reset never mixes an old WAL with a new file."""

from __future__ import annotations

import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from client import (
    ConnectRequest,
    LocalStoreFailure,
    LocalStoreReset,
    SendConfirmed,
    open_local_store,
)
from client.codec import send_to_bytes
from client.errors import LocalSchemaError, LocalStoreCorrupt
from client.faults import ClientCrash, ClientPoint
from client.sqlite import schema
from service.domain.model import AuthenticatedSend, MessageContent, MessageType
from tests.client.support import Client, MemoryServers, eventually, history

ACCOUNT = ConnectRequest("acme", "alice", "phone")
SEND = AuthenticatedSend(
    "acme", "alice", "phone", "general", "p-1", MessageContent(MessageType.TEXT, b"keep me")
)


async def _store_with_a_pending_send(path: Path) -> None:
    store = await open_local_store(path)
    await store.bind_account(ACCOUNT)
    await store.persist_pending(SEND, 5)
    await store.close()


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


async def test_a_locked_file_is_a_local_store_failure_and_stays_untouched(tmp_path: Path) -> None:
    path = tmp_path / "local.db"
    await _store_with_a_pending_send(path)
    before = _files(tmp_path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("PRAGMA locking_mode=EXCLUSIVE")
        other.execute("BEGIN EXCLUSIVE")
        other.execute("INSERT INTO meta (key, value) VALUES ('held', 'x')")
        with pytest.raises(LocalStoreFailure) as raised:
            await open_local_store(path, busy_timeout_s=0.2)
        assert not isinstance(raised.value, LocalSchemaError)
        assert "locked" in str(raised.value) or "busy" in str(raised.value).lower()
        other.execute("ROLLBACK")
    finally:
        other.close()
    after = _files(tmp_path)
    assert not [name for name in after if ".before-reset" in name]
    assert after["local.db"] == before["local.db"]
    store = await open_local_store(path)
    assert store.reset_report is None
    assert [p.send for p in await store.pending()] == [SEND]
    await store.close()


async def test_a_reset_interrupted_before_the_new_file_moved_in_never_replays_the_old_wal(
    tmp_path: Path,
) -> None:
    """A crash after the old main file was moved aside and before the old WAL was:
    the next open must not put the new file beside the old WAL."""
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    live.mkdir()
    crashed.mkdir()
    path = live / "local.db"
    await _store_with_a_pending_send(path)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.executemany(  # pages in the WAL only (never checkpointed)
        "INSERT INTO meta (key, value) VALUES (?, ?)", [(f"k{i}", "v" * 500) for i in range(200)]
    )
    for name in ("local.db", "local.db-wal"):
        shutil.copyfile(live / name, crashed / name)
    writer.close()
    target = crashed / "local.db"
    new = sqlite3.connect(crashed / "local.db.new", isolation_level=None)  # the reset's new file
    new.execute("PRAGMA journal_mode=DELETE")
    schema.migrate(new)
    other = replace(SEND, cmid="p-9")
    new.execute(
        "INSERT INTO pending (cmid, position, conversation, send, created_ms) VALUES (?,1,?,?,9)",
        ("p-9", "general", send_to_bytes(other)),
    )
    new.close()
    target.rename(crashed / "local.db.before-reset")  # the crash is right after this
    store = await open_local_store(target)
    await store.bind_account(ACCOUNT)
    assert [p.send for p in await store.pending()] == [other]
    await store.close()
    db = sqlite3.connect(target)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT COUNT(*) FROM meta WHERE key LIKE 'k%'").fetchone()[0] == 0
    db.close()


async def test_a_damaged_page_found_by_quick_check_resets_keeping_pending(tmp_path: Path) -> None:
    path = tmp_path / "local.db"
    await _store_with_a_pending_send(path)
    db = sqlite3.connect(path, isolation_level=None)
    db.executemany(
        "INSERT INTO messages VALUES (?, 'general', ?, 'bob', ?, 'text', '', 7, 'mailbox', ?)",
        [(f"m-{i}", i, f"c-{i}", b"x" * 300) for i in range(1, 400)],
    )
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.close()
    with path.open("r+b") as f:  # a cell pointer array of a messages page turns to garbage
        f.seek(page_size * (pages - 3) + 8)
        f.write(b"\xa5" * 16)
    store = await open_local_store(path)
    try:
        assert store.reset_report is not None
        assert "damaged" in store.reset_report.reason
        assert [p.send for p in await store.pending()] == [SEND]
        assert await store.messages("general") == []
    finally:
        await store.close()


async def test_an_undecodable_row_is_a_local_store_corruption(tmp_path: Path) -> None:
    path = tmp_path / "local.db"
    await _store_with_a_pending_send(path)
    store = await open_local_store(path)
    try:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("UPDATE pending SET send = x'ffffffff'")
        other.close()
        with pytest.raises(LocalStoreFailure) as raised:  # never a bare DecodeError
            await store.pending()
        assert isinstance(raised.value, LocalStoreCorrupt)
    finally:
        await store.close()


@pytest.mark.e2e
async def test_corruption_found_in_use_resets_keeping_pending_and_the_send_goes_out(
    servers: MemoryServers, tmp_path: Path
) -> None:
    alice = Client("alice", tmp_path / "alice.db", lambda: servers.target)
    try:
        await alice.start()
        await alice.online()
        alice.faults.arm(ClientPoint.AFTER_PERSIST)  # persisted, never sent
        with pytest.raises(ClientCrash):
            await alice.send("general", "kept through a repair", cmid="good-1")
        await alice.crash()
        db = sqlite3.connect(alice.path, isolation_level=None)
        db.execute(  # a row damaged on disk: it no longer decodes
            "INSERT INTO pending (cmid, position, conversation, send, created_ms)"
            " VALUES ('bad-1', 2, 'general', x'ffffffff', 6)"
        )
        db.close()
        await alice.start()

        async def confirmed() -> bool:
            return any(isinstance(e, SendConfirmed) and e.cmid == "good-1" for e in alice.events)

        await eventually(confirmed, 20)
        [reset] = [e for e in alice.events if isinstance(e, LocalStoreReset)]
        assert reset.kept_pending == 1 and reset.lost_pending
        assert not alice.rt.unexpected
        assert [r.cmid for r in await history(servers.target, "general", "alice")] == ["good-1"]
    finally:
        await alice.crash()


async def test_memory_is_only_the_explicit_test_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="in_memory_store_for_test"):
        await open_local_store(":memory:")
    assert not _files(tmp_path)  # not a file named ":memory:" (nor its lock)


async def test_a_home_relative_path_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    store = await open_local_store("~/app/alice.sqlite3")
    await store.close()
    assert (tmp_path / "home" / "app" / "alice.sqlite3").exists()
    assert not (tmp_path / "~").exists()
