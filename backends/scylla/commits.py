"""Reading one CommitKey's row of ``commits``, and what the reads taught this replica.

The store and the recovery queue both read commit rows; this is the one
place that reads, judges expiry (by the store's clock) and decodes them, and
that tells ``KnownIntents`` what was read, so a later step can skip the read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from backends.scylla.codec import BODY_COLUMNS, Row, intent_from_row, state_of
from backends.scylla.history import History
from backends.scylla.known import Known, KnownIntents
from backends.scylla.session import CqlSession, Params
from service.domain.errors import StoreError
from service.domain.ids import CommitKey
from service.domain.model import CommitIntent, CommitState, MessageRecord
from service.domain.ports import Clock

INTENT_COLUMNS = (
    "conversation",
    "identity",
    "seq",
    "message_id",
    "server_ts_ms",
    "created_at_ms",
    *BODY_COLUMNS,
    "recipients",
    "membership_version",
)
"""What reserve writes of an intent, besides its key and state."""
QUEUE_COLUMNS = ("rq_attempts", "rq_due_ms", "rq_problem", "rq_quarantined")
"""The recovery queue's bookkeeping on the intent."""
COLUMNS = (
    "tenant",
    "sender",
    "cmid",
    "state",
    *INTENT_COLUMNS,
    "pub_stream",
    "pub_position",
    "expires_at_ms",
    *QUEUE_COLUMNS,
)
"""Every column of ``commits``, named (a read that names its columns comes back
without metadata: ``direct.py``); tests/scylla/test_direct.py checks the list."""

STATEMENTS = {
    "c.get": f"SELECT {', '.join(COLUMNS)} FROM {{ks}}.commits"
    " WHERE tenant = ? AND sender = ? AND cmid = ?",
}


FINISHED_STATES = (CommitState.COMMITTED.value, "abandoned")
"""Row states that end a key's intent: expire with the window, never in the queue."""


def key_of(key: CommitKey) -> tuple[str, str, str]:
    return (key.tenant, key.sender, key.cmid)


class CommitRows:
    """Reads of ``commits`` rows and their interpretation."""

    def __init__(self, cql: CqlSession, history: History, clock: Clock) -> None:
        self.cql = cql
        self._history = history
        self._clock = clock
        self.known = KnownIntents()

    async def row(self, key: CommitKey, *, serial: bool = False) -> Row | None:
        rows = await self.cql.read("c.get", key_of(key), serial=serial)
        return rows[0] if rows and rows[0].get("state") is not None else None

    def expired(self, row: Row) -> bool:
        """A committed row past the idempotency window (by this store's clock)."""
        expires = row.get("expires_at_ms")
        return (
            row.get("state") in FINISHED_STATES
            and expires is not None
            and expires <= self._clock.now_ms()
        )

    def live(self, row: Row | None) -> Row | None:
        return None if row is None or self.expired(row) else row

    async def live_row(self, key: CommitKey) -> Row | None:
        return self.live(await self.row(key))

    async def unfinished(self, key: CommitKey, row: Row) -> CommitIntent:
        """The intent of a live, unfinished row; RECORDED once history holds its record."""
        state = state_of(row)
        intent = intent_from_row(key, row, state)
        recorded = state is not CommitState.RESERVED
        if not recorded and await self.recorded(intent.record):
            intent, recorded = intent.advanced(CommitState.RECORDED), True
        self.remember(intent, row, recorded=recorded)
        return intent

    def remember(self, intent: CommitIntent, row: Row | None, *, recorded: bool) -> Known:
        due = row.get("rq_due_ms") if row else None
        quarantined = bool(row.get("rq_quarantined")) if row else False
        return self.known.remember(intent, recorded=recorded, due_ms=due, quarantined=quarantined)

    async def recorded(self, record: MessageRecord) -> bool:
        return await self._history.get(record) == record

    async def quietly(self, writes: Sequence[tuple[str, Params]]) -> None:
        """Best-effort cleanup: a scan removes what this leaves behind."""
        if writes:
            with contextlib.suppress(StoreError):
                await self.cql.write_batch(writes)
