"""``SqliteLocalStore``: the LocalStore on the standard library's ``sqlite3``.

One connection, used by one worker thread (so the event loop never blocks on
the disk), in WAL mode with ``synchronous=FULL`` by default: a transaction
that returned is on disk. Each LocalStore method is one ``BEGIN IMMEDIATE``
... ``COMMIT``; an exception (an injected crash included) rolls it back.

A file store is locked (``flock`` on ``<name>.lock``) for the life of the
store: a second runtime on the same file gets LocalStoreBusy.

Dedupe: ``messages.message_id`` is the primary key, so a message applied
twice (a mailbox page retried, a history page overlapping it) is written
once and reported once; ``(conversation, seq)`` is unique, so two different
messages at one seq fail loudly instead of hiding each other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from google.protobuf.message import DecodeError

from client import codec
from client.errors import (
    AccountMismatch,
    DuplicateClientMessageId,
    LocalSchemaError,
    LocalStoreBusy,
    LocalStoreCorrupt,
    LocalStoreFailure,
)
from client.faults import ClientFaults, ClientPoint
from client.model import (
    INBOX,
    Backfill,
    ConnectRequest,
    ConversationSummary,
    ConversationView,
    ExpiredCursor,
    LocalMessage,
    MailboxCursor,
    MailboxPage,
    Origin,
    PendingSend,
)
from client.sqlite import schema
from client.store import (
    CONFLICT_PROBLEM,
    Applied,
    Confirmation,
    Conflict,
    LocalStore,
    ResetReport,
)
from service.domain.model import (
    AuthenticatedSend,
    CommittedMessage,
    HistoryPage,
    MessageContent,
    MessageRecord,
)

T = TypeVar("T")
_PENDING_SELECT = (
    "SELECT send, created_ms, attempts, first_attempt_ms, parked, problem FROM pending"
)
_MESSAGE_INSERT = (
    "INSERT INTO messages (message_id, conversation, seq, sender, cmid, message_type,"
    " custom_type, server_ts_ms, origin, record) VALUES (?,?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT (message_id) DO NOTHING"
)
_PROJECT = (
    "INSERT INTO conversations (conversation, lane, last_seq, last_message_id, last_ts_ms,"
    " message_count) VALUES (?,?,?,?,?,1) ON CONFLICT (conversation) DO UPDATE SET"
    " message_count = message_count + 1,"
    " lane = CASE WHEN excluded.lane != 'inbox' THEN excluded.lane ELSE lane END,"
    " last_message_id = CASE WHEN excluded.last_seq > last_seq"
    "   THEN excluded.last_message_id ELSE last_message_id END,"
    " last_ts_ms = CASE WHEN excluded.last_seq > last_seq"
    "   THEN excluded.last_ts_ms ELSE last_ts_ms END,"
    " last_seq = MAX(last_seq, excluded.last_seq)"
)


async def open_local_store(
    path: str | Path,
    *,
    synchronous: str = "FULL",
    faults: ClientFaults | None = None,
    busy_timeout_s: float = 5.0,
) -> SqliteLocalStore:
    """Open (creating, migrating or, if it is unusable, resetting) the store at
    ``path`` (``~`` expanded; ``":memory:"`` is refused: a test that wants a
    store in memory picks ``in_memory_store_for_test``).

    A transient error (locked or busy past ``busy_timeout_s``, I/O, disk full)
    raises LocalStoreFailure and leaves the file as it was."""
    if str(path) == ":memory:":
        raise ValueError("a store in memory is lost with the object: in_memory_store_for_test()")
    return await asyncio.to_thread(_open, Path(path), synchronous, faults, busy_timeout_s)


def in_memory_store_for_test(faults: ClientFaults | None = None) -> SqliteLocalStore:
    """A store in memory: lost with the object. Only for tests that choose it."""
    db = schema.connect(":memory:", "OFF")
    schema.migrate(db)
    return SqliteLocalStore(db, persistent=False, faults=faults)


def _open(
    path: Path, synchronous: str, faults: ClientFaults | None, busy_timeout_s: float
) -> SqliteLocalStore:
    if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
        raise ValueError("synchronous must be FULL, NORMAL or EXTRA")
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock(path)
    try:
        schema.finish_interrupted_reset(path)
        report = None
        try:
            db = _open_checked(path, synchronous, busy_timeout_s)
        except (LocalSchemaError, sqlite3.DatabaseError) as exc:
            if isinstance(exc, sqlite3.Error) and schema.is_transient(exc):
                raise _transient(exc) from exc
            reason = str(exc) if isinstance(exc, LocalSchemaError) else _unusable(exc)
            report = _reset(path, reason)
            db = _open_checked(path, synchronous, busy_timeout_s)
    except BaseException:
        lock.close()
        raise
    store = SqliteLocalStore(
        db, persistent=True, lock=lock, faults=faults, path=path, synchronous=synchronous
    )
    store.reset_report = report
    return store


def _reset(path: Path, reason: str) -> ResetReport:
    """Rebuild the file at ``path`` keeping the pending sends that can be read
    (``schema`` says how a crash in the middle is safe)."""
    salvage = schema.salvage_pending(path, _decodes)
    report = ResetReport(reason, len(salvage.rows), salvage.lost)
    ours = (report.reason, report.kept_pending, int(report.lost_pending))
    schema.rebuild_file(path, salvage.rows, [*salvage.resets, ours])
    return report


def _open_checked(path: Path, synchronous: str, busy_timeout_s: float) -> sqlite3.Connection:
    db = schema.connect(str(path), synchronous, busy_timeout_s)
    try:
        schema.quick_check(db)
        schema.migrate(db)
        schema.verify(db)
    except BaseException:
        db.close()
        raise
    return db


def _decodes(send: bytes) -> bool:
    try:
        codec.send_from_bytes(send)
    except (DecodeError, ValueError):
        return False
    return True


def _transient(exc: sqlite3.Error) -> LocalStoreFailure:
    return LocalStoreFailure(
        f"the local store could not be opened now ({type(exc).__name__}: {exc});"
        " the file was left as it is"
    )


def _unusable(exc: sqlite3.DatabaseError) -> str:
    return f"the local store file is not a usable database ({type(exc).__name__})"


def _lock(path: Path) -> IO[bytes]:
    handle = path.with_name(path.name + ".lock").open("ab")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise LocalStoreBusy("another runtime has this local store open") from None
    return handle


class SqliteLocalStore(LocalStore):
    def __init__(
        self,
        db: sqlite3.Connection,
        *,
        persistent: bool,
        lock: IO[bytes] | None = None,
        faults: ClientFaults | None = None,
        path: Path | None = None,
        synchronous: str = "FULL",
    ) -> None:
        self._db: sqlite3.Connection | None = db
        self.persistent = persistent
        self._path = path
        self._synchronous = synchronous
        self._lock = lock
        self._faults = faults or ClientFaults()
        self._user = ""
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="local-store")

    # --- plumbing ------------------------------------------------------------------

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            if self._db is None:
                raise LocalStoreFailure("the local store is closed")
            try:
                return work(self._db)
            except sqlite3.Error as exc:
                text = f"local store: {type(exc).__name__}: {exc}"
                if schema.is_corrupt(exc):
                    raise LocalStoreCorrupt(text) from exc
                raise LocalStoreFailure(text) from exc
            except DecodeError as exc:  # a stored blob that no longer parses
                raise LocalStoreCorrupt("local store: a stored row does not decode") from exc

        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    @staticmethod
    @contextlib.contextmanager
    def _tx(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    async def repair(self, reason: str) -> ResetReport:
        def reset() -> ResetReport:
            if self._db is None or self._path is None:
                raise LocalStoreFailure("only an open file store can be repaired")
            self._db.close()
            self._db = None
            report = _reset(self._path, reason)
            self._db = _open_checked(self._path, self._synchronous, 5.0)
            return report

        report = await asyncio.get_running_loop().run_in_executor(self._pool, reset)
        self.reset_report = report
        return report

    async def untaken_resets(self) -> list[ResetReport]:
        def read(db: sqlite3.Connection) -> list[ResetReport]:
            rows = db.execute(
                "SELECT id, reason, kept_pending, lost_pending FROM resets ORDER BY id"
            ).fetchall()
            return [ResetReport(r[1], int(r[2]), bool(r[3]), report_id=int(r[0])) for r in rows]

        return await self._run(read)

    async def taken_reset(self, report_id: int) -> None:
        await self._run(lambda db: db.execute("DELETE FROM resets WHERE id = ?", (report_id,)))

    async def close(self) -> None:
        def shut(db: sqlite3.Connection) -> None:
            if db.in_transaction:
                db.execute("ROLLBACK")
            db.close()

        if self._db is not None:
            with contextlib.suppress(LocalStoreFailure):
                await self._run(shut)
            self._db = None
        self._pool.shutdown(wait=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # --- the account -------------------------------------------------------------------

    async def bind_account(self, account: ConnectRequest) -> None:
        wanted = json.dumps([account.tenant, account.user, account.device])

        def bind(db: sqlite3.Connection) -> None:
            with self._tx(db):
                row = db.execute("SELECT value FROM meta WHERE key = 'account'").fetchone()
                if row is None:
                    db.execute("INSERT INTO meta (key, value) VALUES ('account', ?)", (wanted,))
                elif row[0] != wanted:
                    raise AccountMismatch("this local store belongs to another account")

        await self._run(bind)
        self._user = account.user

    # --- pending sends ---------------------------------------------------------------

    async def persist_pending(self, send: AuthenticatedSend, now_ms: int) -> PendingSend:
        data = codec.send_to_bytes(send)

        def persist(db: sqlite3.Connection) -> PendingSend:
            with self._tx(db):
                row = db.execute(_PENDING_SELECT + " WHERE cmid = ?", (send.cmid,)).fetchone()
                if row is not None:
                    if codec.send_from_bytes(row[0]) != send:
                        raise DuplicateClientMessageId(
                            "client_message_id is pending for a different send"
                        )
                    return _pending(row)
                own = _own(db, send.sender, send.cmid)
                if own is not None:
                    if codec.same_identity(own.record, send):  # a repeat of a send that went
                        return PendingSend(send, now_ms, confirmed=True)
                    raise DuplicateClientMessageId("client_message_id was already committed")
                db.execute(
                    "INSERT INTO pending (cmid, position, conversation, send, created_ms)"
                    " VALUES (?, (SELECT COALESCE(MAX(position), 0) + 1 FROM pending), ?, ?, ?)",
                    (send.cmid, send.conversation, data, now_ms),
                )
            return PendingSend(send, now_ms)

        return await self._run(persist)

    async def mark_attempt(self, cmid: str, now_ms: int) -> None:
        await self._update(
            "UPDATE pending SET attempts = attempts + 1, first_attempt_ms ="
            " CASE WHEN first_attempt_ms = 0 THEN ? ELSE first_attempt_ms END WHERE cmid = ?",
            (now_ms, cmid),
        )

    async def park_pending(self, cmid: str, problem: str) -> None:
        await self._update(
            "UPDATE pending SET parked = 1, problem = ? WHERE cmid = ?", (problem, cmid)
        )

    async def unpark_pending(self, cmid: str) -> bool:
        return (
            await self._update(
                "UPDATE pending SET parked = 0, problem = '', attempts = 0"
                " WHERE cmid = ? AND parked = 1",
                (cmid,),
            )
            > 0
        )

    async def discard_pending(self, cmid: str) -> bool:
        return await self._update("DELETE FROM pending WHERE cmid = ?", (cmid,)) > 0

    async def _update(self, sql: str, args: tuple[object, ...]) -> int:
        def update(db: sqlite3.Connection) -> int:
            with self._tx(db):
                return db.execute(sql, args).rowcount

        return await self._run(update)

    async def next_sendable(self) -> PendingSend | None:
        def read(db: sqlite3.Connection) -> PendingSend | None:
            row = db.execute(
                _PENDING_SELECT + " WHERE parked = 0 ORDER BY position LIMIT 1"
            ).fetchone()
            return _pending(row) if row else None

        return await self._run(read)

    async def pending(self) -> list[PendingSend]:
        def read(db: sqlite3.Connection) -> list[PendingSend]:
            rows = db.execute(_PENDING_SELECT + " ORDER BY position").fetchall()
            return [_pending(r) for r in rows]

        return await self._run(read)

    async def resolve_pending(
        self, committed: CommittedMessage, content: MessageContent
    ) -> LocalMessage | None:
        def resolve(db: sqlite3.Connection) -> LocalMessage | None:
            with self._tx(db):
                row = db.execute(
                    "SELECT send FROM pending WHERE cmid = ?", (committed.cmid,)
                ).fetchone()
                if row is None:
                    return None
                send = codec.send_from_bytes(row[0])
                if send.conversation != committed.conversation or send.content != content:
                    raise LocalStoreFailure("the ACK does not match the pending send of its cmid")
                record = codec.committed_record(
                    send, committed.seq, committed.message_id, committed.server_ts_ms
                )
                _insert(db, record, Origin.OWN, INBOX)
                db.execute("DELETE FROM pending WHERE cmid = ?", (committed.cmid,))
            return LocalMessage(record, Origin.OWN)

        return await self._run(resolve)

    # --- batches -------------------------------------------------------------------------

    async def apply_mailbox_page(self, page: MailboxPage, cursor: MailboxCursor) -> Applied:
        records = [e.record for e in page.events if e.record is not None]  # opaque: seq only

        def apply(db: sqlite3.Connection) -> Applied:
            with self._tx(db):
                applied = self._write(db, records, Origin.MAILBOX, page.lane)
                self._faults.check(ClientPoint.MID_BATCH)
                db.execute(
                    "INSERT INTO cursors (lane, epoch, seq, updated_ms) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (lane) DO UPDATE SET epoch = excluded.epoch,"
                    " seq = excluded.seq, updated_ms = excluded.updated_ms",
                    (cursor.lane, cursor.epoch, cursor.seq, _now_ms()),
                )
            return applied

        return await self._run(apply)

    async def apply_history(self, page: HistoryPage) -> Applied:
        def apply(db: sqlite3.Connection) -> Applied:
            with self._tx(db):
                return self._write(db, list(page.records), Origin.HISTORY, INBOX)

        return await self._run(apply)

    def _write(
        self, db: sqlite3.Connection, records: Sequence[MessageRecord], origin: Origin, lane: str
    ) -> Applied:
        added: list[LocalMessage] = []
        confirmed: list[Confirmation] = []
        conflicts: list[Conflict] = []
        for record in records:
            mine = self._pending_of(db, record)
            if mine is False:
                conflicts.append(Conflict(record.cmid, record.conversation))
                db.execute(
                    "UPDATE pending SET parked = 1, problem = ? WHERE cmid = ?",
                    (CONFLICT_PROBLEM, record.cmid),
                )
            if _insert(db, record, Origin.OWN if mine else origin, lane) and not mine:
                added.append(LocalMessage(record, origin))
            if mine:
                db.execute("DELETE FROM pending WHERE cmid = ?", (record.cmid,))
                r = record
                confirmed.append(
                    Confirmation(
                        r.cmid,
                        CommittedMessage(
                            r.conversation, r.cmid, r.message_id, r.seq, r.server_ts_ms
                        ),
                    )
                )
        return Applied(tuple(added), tuple(confirmed), tuple(conflicts))

    def _pending_of(self, db: sqlite3.Connection, record: MessageRecord) -> bool | None:
        """Whether ``record`` is the commit of this user's unparked pending send of
        its cmid: True (its identity), False (the cmid with another identity: a
        conflict), None (no such pending send)."""
        if record.sender != self._user:
            return None
        row = db.execute(
            "SELECT send, parked FROM pending WHERE cmid = ?", (record.cmid,)
        ).fetchone()
        if row is None:
            return None
        if codec.same_identity(record, codec.send_from_bytes(row[0])):
            return True
        return None if row[1] else False

    # --- reads ------------------------------------------------------------------------------

    async def cursor(self, lane: str) -> MailboxCursor | None:
        def read(db: sqlite3.Connection) -> MailboxCursor | None:
            row = db.execute("SELECT epoch, seq FROM cursors WHERE lane = ?", (lane,)).fetchone()
            return MailboxCursor(lane, row[0], row[1]) if row else None

        return await self._run(read)

    async def cursors(self) -> list[MailboxCursor]:
        def read(db: sqlite3.Connection) -> list[MailboxCursor]:
            rows = db.execute("SELECT lane, epoch, seq FROM cursors ORDER BY lane").fetchall()
            return [MailboxCursor(*r) for r in rows]

        return await self._run(read)

    async def find_own(self, sender: str, cmid: str) -> LocalMessage | None:
        return await self._run(lambda db: _own(db, sender, cmid))

    async def messages(
        self, conversation: str, *, limit: int = 50, before_seq: int = 0
    ) -> list[LocalMessage]:
        def read(db: sqlite3.Connection) -> list[LocalMessage]:
            rows = db.execute(
                "SELECT record, origin FROM messages WHERE conversation = ? AND (? = 0 OR seq < ?)"
                " ORDER BY seq DESC LIMIT ?",
                (conversation, before_seq, before_seq, limit),
            ).fetchall()
            return [_message(r) for r in reversed(rows)]

        return await self._run(read)

    async def max_seq(self, conversation: str) -> int:
        def read(db: sqlite3.Connection) -> int:
            row = db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE conversation = ?",
                (conversation,),
            ).fetchone()
            return int(row[0])

        return await self._run(read)

    async def newest_read_ms(self, lane: str) -> int:
        def read(db: sqlite3.Connection) -> int:
            row = db.execute(
                "SELECT COALESCE(MAX(m.server_ts_ms), 0) FROM messages m"
                " JOIN conversations c ON c.conversation = m.conversation"
                " WHERE c.lane = ? AND m.origin = ?",
                (lane, Origin.MAILBOX.value),
            ).fetchone()
            return int(row[0])

        return await self._run(read)

    async def conversations(self) -> list[ConversationView]:
        def read(db: sqlite3.Connection) -> list[ConversationView]:
            rows = db.execute(
                "SELECT conversation, lane, last_seq, last_message_id, last_ts_ms, message_count,"
                " member_count, listed FROM conversations ORDER BY conversation"
            ).fetchall()
            return [
                ConversationView(r[0], r[1], r[2], r[3], r[4], r[5], r[6], listed=bool(r[7]))
                for r in rows
            ]

        return await self._run(read)

    # --- rebuild and reset --------------------------------------------------------------

    async def begin_rebuild(
        self,
        expired: ExpiredCursor,
        listed: Sequence[ConversationSummary],
        floors: Sequence[tuple[str, int]],
        now_ms: int,
    ) -> None:
        e = expired

        def begin(db: sqlite3.Connection) -> None:
            with self._tx(db):
                old = db.execute(
                    "SELECT epoch, trim_watermark FROM rebuilds WHERE lane = ?", (e.lane,)
                ).fetchone()
                if old is None or tuple(old) != (e.epoch, e.trim_watermark):
                    db.execute(
                        "INSERT OR REPLACE INTO rebuilds (lane, epoch, trim_watermark, why,"
                        " started_ms) VALUES (?, ?, ?, ?, ?)",
                        (e.lane, e.epoch, e.trim_watermark, e.why, now_ms),
                    )
                    db.execute(
                        "UPDATE backfills SET anchor = 0, fetched = 0, done = 0 WHERE lane = ?",
                        (e.lane,),
                    )
                db.executemany(
                    "INSERT OR IGNORE INTO backfills (lane, conversation, floor_seq)"
                    " VALUES (?, ?, ?)",
                    [(e.lane, conversation, floor) for conversation, floor in floors],
                )
                db.execute("UPDATE conversations SET listed = 0")
                for c in listed:
                    db.execute(
                        "INSERT INTO conversations (conversation, lane, member_count, version,"
                        " listed) VALUES (?, ?, ?, ?, 1) ON CONFLICT (conversation) DO UPDATE SET"
                        " lane = excluded.lane, member_count = excluded.member_count,"
                        " version = excluded.version, listed = 1",
                        (c.conversation, c.lane, c.member_count, c.version),
                    )

        await self._run(begin)

    async def backfills(self, lane: str) -> list[Backfill]:
        def read(db: sqlite3.Connection) -> list[Backfill]:
            rows = db.execute(
                "SELECT lane, conversation, floor_seq, anchor, fetched, done FROM backfills"
                " WHERE lane = ? ORDER BY conversation",
                (lane,),
            ).fetchall()
            return [Backfill(r[0], r[1], r[2], r[3], r[4], done=bool(r[5])) for r in rows]

        return await self._run(read)

    async def apply_backfill(self, progress: Backfill, page: HistoryPage) -> Applied:
        p = progress

        def apply(db: sqlite3.Connection) -> Applied:
            with self._tx(db):
                applied = self._write(db, list(page.records), Origin.HISTORY, INBOX)
                db.execute(
                    "UPDATE backfills SET anchor = ?, fetched = ?, done = ?"
                    " WHERE lane = ? AND conversation = ?",
                    (p.anchor, p.fetched, int(p.done), p.lane, p.conversation),
                )
            return applied

        return await self._run(apply)

    async def rebuilding(self) -> list[ExpiredCursor]:
        def read(db: sqlite3.Connection) -> list[ExpiredCursor]:
            rows = db.execute(
                "SELECT lane, epoch, trim_watermark, why FROM rebuilds ORDER BY lane"
            ).fetchall()
            return [ExpiredCursor(*r) for r in rows]

        return await self._run(read)

    async def finish_rebuild(self, cursor: MailboxCursor) -> None:
        def finish(db: sqlite3.Connection) -> None:
            with self._tx(db):
                db.execute(
                    "INSERT OR REPLACE INTO cursors (lane, epoch, seq, updated_ms)"
                    " VALUES (?, ?, ?, ?)",
                    (cursor.lane, cursor.epoch, cursor.seq, _now_ms()),
                )
                db.execute("DELETE FROM rebuilds WHERE lane = ?", (cursor.lane,))
                db.execute("DELETE FROM backfills WHERE lane = ?", (cursor.lane,))

        await self._run(finish)

    async def reset_for_rebuild(self, reason: str) -> ResetReport:
        def reset(db: sqlite3.Connection) -> ResetReport:
            with self._tx(db):
                for table in ("messages", "conversations", "cursors", "rebuilds", "backfills"):
                    db.execute(f"DELETE FROM {table}")
                kept = db.execute("SELECT COUNT(*) FROM pending").fetchone()[0]
            return ResetReport(reason, int(kept))

        return await self._run(reset)


def _insert(db: sqlite3.Connection, record: MessageRecord, origin: Origin, lane: str) -> bool:
    """Write ``record`` unless its message id is there; True when it was new."""
    r = record
    try:
        added = (
            db.execute(
                _MESSAGE_INSERT,
                (
                    r.message_id,
                    r.conversation,
                    r.seq,
                    r.sender,
                    r.cmid,
                    r.content.message_type.value,
                    r.content.custom_type,
                    r.server_ts_ms,
                    origin.value,
                    codec.record_to_bytes(r),
                ),
            ).rowcount
            == 1
        )
    except sqlite3.IntegrityError:
        raise LocalStoreFailure(
            "two different messages arrived for one conversation seq;"
            " the local store kept the first"
        ) from None
    if added:
        db.execute(_PROJECT, (r.conversation, lane, r.seq, r.message_id, r.server_ts_ms))
    return added


def _own(db: sqlite3.Connection, sender: str, cmid: str) -> LocalMessage | None:
    row = db.execute(
        "SELECT record, origin FROM messages WHERE sender = ? AND cmid = ? ORDER BY seq LIMIT 1",
        (sender, cmid),
    ).fetchone()
    return _message(row) if row else None


def _message(row: tuple[Any, ...]) -> LocalMessage:
    data, origin = row
    return LocalMessage(codec.record_from_bytes(data), Origin(origin))


def _pending(row: tuple[Any, ...]) -> PendingSend:
    data, created, attempts, first, parked, problem = row
    return PendingSend(
        send=codec.send_from_bytes(data),
        created_ms=int(created),
        attempts=int(attempts),
        first_attempt_ms=int(first),
        parked=bool(parked),
        problem=str(problem),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
