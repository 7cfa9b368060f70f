"""The local SQLite schema: versioned migrations, a check, and the reset.

The schema version is ``PRAGMA user_version``; ``MIGRATIONS[i]`` takes a
database from version ``i`` to ``i + 1``, each step in one transaction
(``user_version`` is part of the database header, so it commits or rolls
back with the step).

=======  ====================================================================
version  change
=======  ====================================================================
1        meta (the bound account), pending, messages, conversations, cursors
2        rebuilds (a REBUILD begun and not finished) and backfills (its progress
         per conversation); messages by (sender, cmid)
3        pending by (parked, position): the next send is one indexed read, so
         draining a queue is linear
4        resets: the reports of resets the host has not taken yet (written into
         the new file by the reset itself, so a process that dies before its
         host reads ``LocalStoreReset`` leaves the report for the next one)
=======  ====================================================================

The ``pending`` table's columns are frozen across versions: a reset (and a
runtime of any later version) can always read ``cmid`` and ``send``.

A database the runtime cannot use (not a database, corrupt pages that
``PRAGMA quick_check`` finds, a version newer than ``LATEST``, a migration
that fails deterministically, a table without its columns) is *reset*: the
pending sends that can still be read are kept, everything else (the account
binding, messages, the projection, cursors) is dropped, the old files are
kept beside it as ``<name>.before-reset``. A transient error (busy, locked,
I/O, disk full, cannot open, read-only: ``is_transient``) is never a reason
to reset: it is raised, and the file is left as it was.

Reset order, so that a crash at any point leaves either the old database
(main file with its own WAL) or the new one, and never the new main file
beside the old WAL (SQLite would replay the old pages onto it):

1. build the new database as ``<name>.new`` (rollback journal, so it is one
   file when closed), fsynced;
2. move the old main file aside (``<name>.before-reset``);
3. move the old ``-wal`` and ``-shm`` aside, then fsync the directory;
4. move ``<name>.new`` in, fsync the directory.

An open that finds ``<name>.new`` and no main file (a crash after step 2)
repeats steps 3 and 4; before step 2 the old files are intact and the stale
``.new`` is rebuilt by the next reset.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from client.errors import LocalSchemaError, LocalStoreCorrupt

V1 = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE pending (
        cmid TEXT PRIMARY KEY,
        position INTEGER NOT NULL UNIQUE,
        conversation TEXT NOT NULL,
        send BLOB NOT NULL,
        created_ms INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        first_attempt_ms INTEGER NOT NULL DEFAULT 0,
        parked INTEGER NOT NULL DEFAULT 0,
        problem TEXT NOT NULL DEFAULT ''
    )""",
    """CREATE TABLE messages (
        message_id TEXT PRIMARY KEY,
        conversation TEXT NOT NULL,
        seq INTEGER NOT NULL,
        sender TEXT NOT NULL,
        cmid TEXT NOT NULL,
        message_type TEXT NOT NULL,
        custom_type TEXT NOT NULL,
        server_ts_ms INTEGER NOT NULL,
        origin TEXT NOT NULL,
        record BLOB NOT NULL,
        UNIQUE (conversation, seq)
    )""",
    """CREATE TABLE conversations (
        conversation TEXT PRIMARY KEY,
        lane TEXT NOT NULL DEFAULT 'inbox',
        last_seq INTEGER NOT NULL DEFAULT 0,
        last_message_id TEXT NOT NULL DEFAULT '',
        last_ts_ms INTEGER NOT NULL DEFAULT 0,
        message_count INTEGER NOT NULL DEFAULT 0,
        member_count INTEGER NOT NULL DEFAULT 0,
        version INTEGER NOT NULL DEFAULT 0,
        listed INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE cursors (
        lane TEXT PRIMARY KEY,
        epoch INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL
    )""",
)
V2 = (
    "CREATE INDEX messages_by_sender_cmid ON messages (sender, cmid)",
    """CREATE TABLE rebuilds (
        lane TEXT PRIMARY KEY,
        epoch INTEGER NOT NULL,
        trim_watermark INTEGER NOT NULL,
        why TEXT NOT NULL,
        started_ms INTEGER NOT NULL
    )""",
    """CREATE TABLE backfills (
        lane TEXT NOT NULL,
        conversation TEXT NOT NULL,
        floor_seq INTEGER NOT NULL,
        anchor INTEGER NOT NULL DEFAULT 0,
        fetched INTEGER NOT NULL DEFAULT 0,
        done INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (lane, conversation)
    )""",
)
V3 = ("CREATE INDEX pending_by_state ON pending (parked, position)",)
V4 = (
    """CREATE TABLE resets (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        reason TEXT NOT NULL,
        kept_pending INTEGER NOT NULL,
        lost_pending INTEGER NOT NULL
    )""",
)
MIGRATIONS: tuple[tuple[str, ...], ...] = (V1, V2, V3, V4)
LATEST = len(MIGRATIONS)

EXPECTED_COLUMNS: dict[str, frozenset[str]] = {
    "meta": frozenset({"key", "value"}),
    "pending": frozenset(
        {
            "cmid",
            "position",
            "conversation",
            "send",
            "created_ms",
            "attempts",
            "first_attempt_ms",
            "parked",
            "problem",
        }
    ),
    "messages": frozenset(
        {
            "message_id",
            "conversation",
            "seq",
            "sender",
            "cmid",
            "message_type",
            "custom_type",
            "server_ts_ms",
            "origin",
            "record",
        }
    ),
    "conversations": frozenset(
        {
            "conversation",
            "lane",
            "last_seq",
            "last_message_id",
            "last_ts_ms",
            "message_count",
            "member_count",
            "version",
            "listed",
        }
    ),
    "cursors": frozenset({"lane", "epoch", "seq", "updated_ms"}),
    "rebuilds": frozenset({"lane", "epoch", "trim_watermark", "why", "started_ms"}),
    "backfills": frozenset({"lane", "conversation", "floor_seq", "anchor", "fetched", "done"}),
}
PENDING_COLUMNS = (
    "cmid",
    "position",
    "conversation",
    "send",
    "created_ms",
    "attempts",
    "first_attempt_ms",
    "parked",
    "problem",
)


_TRANSIENT = frozenset(
    {
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_INTERRUPT,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOLFS,
        sqlite3.SQLITE_AUTH,
    }
)
_CORRUPT = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def is_transient(exc: sqlite3.Error) -> bool:
    """An error of the moment (busy, locked, I/O, full, cannot open), not of the
    file: never a reason to reset. An error without a code counts as transient."""
    code = _primary_code(exc)
    return code is None or code in _TRANSIENT


def is_corrupt(exc: sqlite3.Error) -> bool:
    """The file is not a database or has a damaged page."""
    return _primary_code(exc) in _CORRUPT


QUICK_CHECK_ERRORS = 10
"""``PRAGMA quick_check(N)`` stops after N problems (a bound on its report)."""


def connect(path: str, synchronous: str, busy_timeout_s: float = 5.0) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL for files."""
    db = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
    )
    try:
        if path != ":memory:":
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise LocalSchemaError("the local store could not switch to WAL mode")
        db.execute(f"PRAGMA synchronous={synchronous}")
    except BaseException:
        db.close()
        raise
    return db


def version_of(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite3.Connection, migrations: Sequence[Sequence[str]] = MIGRATIONS) -> int:
    """Bring ``db`` to the latest version, step by step; the version it had before.

    LocalSchemaError when it is newer than this runtime or a step fails
    deterministically (that step is rolled back; earlier steps stay); a
    transient error (``is_transient``) is raised as it is.
    """
    start = version_of(db)
    if start > len(migrations):
        raise LocalSchemaError(
            f"the local schema is version {start}, newer than this runtime's {len(migrations)}"
        )
    for target in range(start + 1, len(migrations) + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in migrations[target - 1]:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {target}")
        except sqlite3.Error as exc:
            db.execute("ROLLBACK")
            if is_transient(exc):
                raise  # not the migration's fault: the file stays as it is
            raise LocalSchemaError(
                f"the local migration to version {target} failed ({type(exc).__name__})"
            ) from exc
        db.execute("COMMIT")
    return start


def quick_check(db: sqlite3.Connection) -> None:
    """LocalStoreCorrupt when SQLite's ``quick_check`` finds a damaged page."""
    rows = db.execute(f"PRAGMA quick_check({QUICK_CHECK_ERRORS})").fetchall()
    if [tuple(r) for r in rows] != [("ok",)]:
        raise LocalStoreCorrupt(f"the local store has damaged pages ({len(rows)} found)")


def verify(db: sqlite3.Connection) -> None:
    """LocalSchemaError unless every table has the columns this runtime uses."""
    for table, columns in EXPECTED_COLUMNS.items():
        found = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if not columns <= found:
            raise LocalSchemaError(f"the local table {table} lacks columns this runtime needs")


# --- the reset -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Salvage:
    rows: tuple[tuple[object, ...], ...]
    """Pending rows in PENDING_COLUMNS order, ``send`` as the stored bytes."""
    lost: bool
    """True when the pending table, or a row of it, could not be read."""
    resets: tuple[tuple[str, int, int], ...] = ()
    """Reports of earlier resets the host had not taken (reason, kept, lost), as
    far as they can be read: they go into the new file too."""


def salvage_pending(path: Path, readable: Callable[[bytes], bool]) -> Salvage:
    """The pending rows of a database about to be reset, as far as they can be
    read: a row whose ``send`` is not ``readable`` (does not decode) is dropped,
    and ``lost`` says so."""
    try:
        db = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
    except sqlite3.Error:
        return Salvage((), True)
    try:
        try:
            rows = db.execute(
                f"SELECT {', '.join(PENDING_COLUMNS)} FROM pending ORDER BY position"
            ).fetchall()
        except sqlite3.Error:
            try:  # the frozen core columns only
                core = db.execute("SELECT cmid, send FROM pending ORDER BY rowid").fetchall()
            except sqlite3.Error:
                return Salvage((), True)
            rows = [(c, i + 1, "", s, 0, 0, 0, 0, "") for i, (c, s) in enumerate(core)]
        kept = tuple(tuple(r) for r in rows if isinstance(r[3], bytes) and readable(r[3]))
        return Salvage(kept, len(kept) < len(rows), _unread_resets(db))
    finally:
        db.close()


def _unread_resets(db: sqlite3.Connection) -> tuple[tuple[str, int, int], ...]:
    try:
        rows = db.execute("SELECT reason, kept_pending, lost_pending FROM resets ORDER BY id")
        return tuple((str(r), int(k), int(lo)) for r, k, lo in rows.fetchall())
    except (sqlite3.Error, ValueError, TypeError):
        return ()  # a file from before version 4, or that table is damaged too


def sidecars(path: Path, suffix: str = "") -> list[Path]:
    base = path.with_name(path.name + suffix)
    return [base, base.with_name(base.name + "-wal"), base.with_name(base.name + "-shm")]


def finish_interrupted_reset(path: Path) -> None:
    """A reset that crashed after moving the old main file aside: move the old
    WAL and shm aside too (steps 3), then the new file in (step 4)."""
    new = path.with_name(path.name + ".new")
    if new.exists() and not path.exists():
        _swap_in(path, new)


def rebuild_file(
    path: Path,
    rows: Sequence[Sequence[object]],
    resets: Sequence[tuple[str, int, int]] = (),
) -> None:
    """Replace ``path`` with a fresh database holding only ``rows`` as pending and
    ``resets`` (reason, kept, lost) as reports the host has not taken yet."""
    new = path.with_name(path.name + ".new")
    for stale in sidecars(path, ".new"):
        stale.unlink(missing_ok=True)
    db = sqlite3.connect(str(new), isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("PRAGMA synchronous=FULL")
        migrate(db)
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            f"INSERT OR IGNORE INTO pending ({', '.join(PENDING_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(PENDING_COLUMNS))})",
            [tuple(r) for r in rows],
        )
        db.executemany(
            "INSERT INTO resets (reason, kept_pending, lost_pending) VALUES (?, ?, ?)", resets
        )
        db.execute("COMMIT")
    finally:
        db.close()
    _fsync_dir(path.parent)
    main_aside = sidecars(path, ".before-reset")[0]
    for stale in sidecars(path, ".before-reset"):  # an earlier reset's old files
        stale.unlink(missing_ok=True)
    if path.exists():
        os.replace(path, main_aside)  # step 2
    _swap_in(path, new)


def _swap_in(path: Path, new: Path) -> None:
    """Steps 3 and 4: the old WAL and shm aside (durably), then the new file in."""
    _, wal, shm = sidecars(path)
    _, wal_aside, shm_aside = sidecars(path, ".before-reset")
    for old, aside in ((wal, wal_aside), (shm, shm_aside)):
        if old.exists():
            os.replace(old, aside)
    _fsync_dir(path.parent)
    os.replace(new, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
