"""The Scylla MessageStore: the commit state machine over conditional writes.

A fresh commit is 10 CQL requests, 4 of them conditional (the seq batch, the
intent, the publish-mark, the commit-mark); a replay of a committed key is 1
(docs/scylla.md has what proves each fact that a removed read used to):

==========================  =======================================================
step                        requests
==========================  =======================================================
before_admission            read the key's row (a replay ends here)
reserve                     seq batch (LWT, ``sequence.py``, no read before it);
                            one batch of the recovery entries and the retention
                            pin; intent ``IF state = null`` (LWT)
put_record                  insert exactly its record into history (no TTL yet)
mark_outbox_published       ``IF state = 'reserved' AND message_id = ?`` (LWT)
mark_committed              compact ``IF state = 'outboxed' AND message_id = ? AND
                            pub_stream = ? AND pub_position = ?`` (LWT, TTL = the
                            idempotency window); then one batch: the record with
                            its expiry, the retention schedule, the pin, the
                            recovery entries (``recovery_queue.py``)
==========================  =======================================================

The steps skip re-reading an intent this store wrote or read back
(``known.py``); each step's condition checks the stored state, and an intent
not known here is read and checked first, so a forged or stale one is refused
as before. Stored states are reserved, outboxed and committed; an intent whose
record is in history reads back as RECORDED. A refused or unknown conditional
write is never taken as success: the row is re-read at serial consistency and
the decision is made from what is there; when the re-read cannot decide,
StoreOutcomeUnknown.

The commit's bookkeeping batch runs after the commit-mark. A crash between
the two leaves the intent COMMITTED with its recovery entry and pin still in
place; the next recovery scan finds the entry and writes the batch, so
nothing is left behind and retention never passes the seq meanwhile.

Expiry: a committed row carries ``expires_at_ms`` (by the store's clock) and
a TTL a minute longer, so reads honour the window to the millisecond and the
server removes the row afterwards. The row is written by UPDATEs only (no row
marker), so when its cells expire, nothing of it is left.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Literal

from cassandra.query import UNSET_VALUE

from backends.recovery_delegation import DelegatedRecovery
from backends.scylla.abandon import ABANDONED, Abandoner
from backends.scylla.codec import (
    BODY_COLUMNS,
    Row,
    body_values,
    committed_from_row,
    intent_from_row,
    new_intent,
    publication_of,
    recipients_value,
    state_of,
)
from backends.scylla.commits import INTENT_COLUMNS, QUEUE_COLUMNS, CommitRows, key_of
from backends.scylla.history import History, pin_removal, pin_write
from backends.scylla.known import Known
from backends.scylla.recovery import Entry, RecoveryIndex
from backends.scylla.recovery_queue import RecoveryQueue
from backends.scylla.sequence import SeqAllocator, claim
from backends.scylla.session import CqlSession, Params
from service.domain.errors import (
    StoreConflict,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from service.domain.identity import as_digest
from service.domain.ids import CommitKey
from service.domain.model import (
    Abandoned,
    Abandonment,
    AuthenticatedSend,
    CommitIntent,
    CommitState,
    Committed,
    CommittedMessage,
    Conflict,
    FrozenDeliveryInput,
    HistoryPage,
    HistoryQuery,
    InProgress,
    LoadedCommit,
    MessageRecord,
    OutboxPublication,
    ReserveCandidate,
    Reserved,
    ReserveResult,
)
from service.domain.ports import Clock, MessageStore, StoredCommit, StoreSettings

_KEY = "WHERE tenant = ? AND sender = ? AND cmid = ?"
_INTENT_SET = ", ".join(f"{c} = ?" for c in INTENT_COLUMNS)
_DROP_BODY = ", ".join(
    f"{c} = null" for c in (*BODY_COLUMNS, "created_at_ms", "recipients", *QUEUE_COLUMNS)
)

STATEMENTS = {
    "c.reserve": f"UPDATE {{ks}}.commits SET state = 'reserved', {_INTENT_SET} {_KEY}"
    " IF state = null",
    "c.reserve_over": f"UPDATE {{ks}}.commits SET state = 'reserved', {_INTENT_SET},"
    " pub_stream = null, pub_position = null, expires_at_ms = null, rq_attempts = null,"
    f" rq_due_ms = null, rq_problem = null, rq_quarantined = null {_KEY}"
    " IF state IN ('committed', 'abandoned') AND expires_at_ms = ?",
    "c.outboxed": "UPDATE {ks}.commits SET state = 'outboxed', pub_stream = ?, pub_position = ?"
    f" {_KEY} IF state = 'reserved' AND message_id = ?",
    "c.commit": "UPDATE {ks}.commits USING TTL ? SET state = 'committed', identity = ?,"
    " conversation = ?, seq = ?, message_id = ?, server_ts_ms = ?, pub_stream = ?,"
    f" pub_position = ?, expires_at_ms = ?, membership_version = null, {_DROP_BODY}"
    f" {_KEY} IF state = 'outboxed' AND message_id = ? AND pub_stream = ? AND pub_position = ?",
}

ReadinessProbe = Callable[[], Awaitable[None]]
MAX_RESERVE_ROUNDS = 4
PEEK_S = 2.0
"""How long the row ``before_admission`` read stands in for reserve's own read."""
PEEKS = 10_000


class ScyllaMessageStore(DelegatedRecovery, MessageStore):
    atomic_publish_commit = False  # two conditional writes: publish-mark, then commit-mark
    _queue: RecoveryQueue  # the queue operations (DelegatedRecovery), and finish

    def __init__(
        self,
        cql: CqlSession,
        sequence: SeqAllocator,
        history: History,
        recovery: RecoveryIndex,
        settings: StoreSettings,
        clock: Clock,
        identity_form: Literal["digest", "whole"],
        readiness: ReadinessProbe,
        commit_ttl_s: int,
        clock_guard: ReadinessProbe | None = None,
    ) -> None:
        """``clock_guard`` raises StoreMisconfigured when this replica's clock is
        beyond the skew bound; it runs before every reserve over an expired key."""
        self._cql = cql
        self._sequence = sequence
        self._history = history
        self._recovery = recovery
        self._settings = settings
        self._clock = clock
        self._whole_identity = identity_form == "whole"
        self._readiness = readiness
        self._clock_guard = clock_guard
        self.commit_ttl_s = commit_ttl_s
        self._rows = CommitRows(cql, history, clock)
        self._queue = RecoveryQueue(self._rows, recovery, history, settings, clock)
        self._abandoner = Abandoner(cql, self._rows, recovery, clock, settings)
        self._peeked: OrderedDict[CommitKey, tuple[float, Row | None]] = OrderedDict()

    @property
    def cql(self) -> CqlSession:
        """The driver session (tests install an ``interceptor`` on it)."""
        return self._cql

    # --- reading one key (commits.py) --------------------------------------------------

    async def _load(self, key: CommitKey) -> StoredCommit | None:
        row = self._rows.live(await self._rows.row(key))
        if row is None:
            return None
        identity = row.get("identity") or b""
        conversation = row.get("conversation") or ""
        if row.get("state") == ABANDONED:
            return StoredCommit(identity, conversation, None, None, abandoned=True)
        if state_of(row) is CommitState.COMMITTED:
            return StoredCommit(identity, conversation, None, committed_from_row(key, row))
        return StoredCommit(identity, conversation, await self._rows.unfinished(key, row), None)

    async def _existing(self, request: AuthenticatedSend, row: Row) -> LoadedCommit:
        if row.get("state") == ABANDONED:
            return Abandoned(request.key)
        if not request.matches_identity(row.get("identity") or b""):
            return Conflict(request.key)
        if state_of(row) is CommitState.COMMITTED:
            return Committed(committed_from_row(request.key, row))
        return InProgress(await self._rows.unfinished(request.key, row))

    # --- reserve -------------------------------------------------------------------

    reads_before_admission = True

    async def before_admission(self, request: AuthenticatedSend) -> LoadedCommit | None:
        """Reserve's first read, done before admission: a committed, unfinished or
        conflicting key is answered from it (a replay costs this one read); for a
        fresh key, reserve uses the row instead of reading it again."""
        row = await self._rows.row(request.key)
        self._peeked[request.key] = (time.monotonic(), row)
        if len(self._peeked) > PEEKS:
            self._peeked.popitem(last=False)
        live = self._rows.live(row)
        return None if live is None else await self._existing(request, live)

    async def _first_read(self, key: CommitKey) -> Row | None:
        peeked = self._peeked.pop(key, None)
        if peeked is not None and time.monotonic() - peeked[0] < PEEK_S:
            return peeked[1]  # a stale "absent" only makes the intent's LWT refuse
        return await self._rows.row(key)

    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        key = request.key
        digest = request.reserve_identity_digest()  # names this request's seq reservation
        row = await self._first_read(key)
        for _ in range(MAX_RESERVE_ROUNDS):
            if (live := self._rows.live(row)) is not None:
                return await self._existing(request, live)
            stale = row  # an expired committed intent, or None
            if stale is not None and self._clock_guard is not None:
                # Expiry was judged by this replica's clock: a clock that jumped since
                # the last probe must not re-reserve an ACKed key (issue 24 item 3).
                await self._clock_guard()
            seq = await self._sequence.allocate(
                key.tenant, request.conversation, key.sender, claim(key.cmid, digest),
                stale.get("seq") if stale else None,
            )  # fmt: skip
            identity = request.canonical_identity() if self._whole_identity else digest
            intent = new_intent(request, identity, delivery, candidate, seq, self._clock.now_ms())
            indexed = self._indexed(intent)
            await self._cql.write_batch(indexed)
            self._recovery.listed(indexed)
            if await self._write_intent(intent, stale):
                self._rows.remember(intent, None, recorded=False)
                return Reserved(intent)
            row = await self._rows.row(key, serial=True)
            if row is not None and _same_coordinates(row, intent.record):
                self._rows.remember(intent, None, recorded=False)
                return Reserved(intent)  # our write applied after all
            if row is not None and row.get("created_at_ms") != intent.created_at_ms:
                # Another intent holds the key: our entries are stale (a scan would
                # drop them too); the pin stays when that intent holds our seq.
                await self._rows.quietly(self._unindexed(intent, keep_pin=row.get("seq") == seq))
        raise StoreUnavailable("scylla: reserve did not settle")

    def _entry(self, intent: CommitIntent, due_ms: int) -> Entry:
        k, r = intent.key, intent.record
        return Entry(due_ms, k.tenant, k.sender, k.cmid, r.conversation, r.seq, r.message_id,
                     intent.created_at_ms)  # fmt: skip

    def _indexed(self, intent: CommitIntent) -> list[tuple[str, Params]]:
        """What reserve writes before the intent: recovery entries and the pin."""
        r = intent.record
        return [
            *self._recovery.entry_writes(self._entry(intent, intent.created_at_ms)),
            *self._recovery.created_writes(intent.key, intent.created_at_ms),
            pin_write(r.tenant, r.conversation, r.seq),
        ]

    def _unindexed(self, intent: CommitIntent, *, keep_pin: bool) -> list[tuple[str, Params]]:
        r = intent.record
        writes = [
            self._recovery.entry_removal(intent.key, intent.created_at_ms),
            self._recovery.created_removal(intent.key, intent.created_at_ms),
        ]
        if not keep_pin:
            writes.append(pin_removal(r.tenant, r.conversation, r.seq))
        return writes

    async def _write_intent(self, intent: CommitIntent, stale: Row | None) -> bool:
        """The intent's LWT; False when refused or unknown (the caller re-reads)."""
        r, k = intent.record, intent.key
        recipients = recipients_value(intent.delivery)
        values = (
            r.conversation,
            intent.identity,
            r.seq,
            r.message_id,
            r.server_ts_ms,
            intent.created_at_ms,
            *body_values(r, unset_absent=stale is None),
            UNSET_VALUE if recipients is None and stale is None else recipients,
            intent.delivery.membership_version,
            k.tenant,
            k.sender,
            k.cmid,
        )
        try:
            if stale is None:
                return await self._cql.cas("c.reserve", values)
            return await self._cql.cas("c.reserve_over", (*values, stale.get("expires_at_ms")))
        except StoreOutcomeUnknown:
            return False

    # --- the two marks ---------------------------------------------------------------

    async def _stored(self, intent: CommitIntent) -> tuple[Row, CommitIntent | None]:
        """The live row for ``intent``, checked to be the same intent; the stored
        intent (None once committed)."""
        row = self._rows.live(await self._rows.row(intent.key))
        if row is None:
            raise StoreConflict("no intent for this key")
        if row.get("state") == ABANDONED:
            raise StoreConflict("the intent was abandoned")
        if state_of(row) is CommitState.COMMITTED:
            if row.get("message_id") != intent.record.message_id:
                raise StoreConflict("intent does not match the stored one")
            return row, None
        stored = intent_from_row(intent.key, row, state_of(row))
        if stored.record != intent.record:
            raise StoreConflict("intent does not match the stored one")
        return row, stored

    async def put_record(self, intent: CommitIntent) -> None:
        known = self._rows.known.get(intent)
        if known is None:  # not known here: read it, and refuse a forged or stale one
            row, stored = await self._stored(intent)
            if stored is None or stored.state is not CommitState.RESERVED:
                return  # committed or past RECORDED: the record is there (retry-safe)
            known = self._rows.remember(stored, row, recorded=False)
        # Known to be the stored intent: writing its record again is harmless at any
        # later state (the same values, with a timestamp older than the commit's).
        intent = known.intent
        await self._history.put(
            intent.record, intent.created_at_ms, intent.delivery.reading_version
        )
        known.recorded = True

    async def mark_outbox_published(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> None:
        known = self._rows.known.get(intent)
        if known is None or not known.recorded:
            row, stored = await self._stored(intent)
            if _has_publication(row, publication):
                return
            assert stored is not None  # a committed row always has its publication
            if not await self._rows.recorded(stored.record):
                raise StoreConflict("the record is not written yet")
            known = self._rows.remember(stored, row, recorded=True)
        k, message_id = intent.key, known.intent.record.message_id
        try:
            applied = await self._cql.cas(
                "c.outboxed", (publication.stream, publication.position, *key_of(k), message_id)
            )
        except StoreOutcomeUnknown:
            applied = False
        if applied:
            self._rows.known.published(known, publication)
            return
        after = self._rows.live(await self._rows.row(k, serial=True))
        if after is None or after.get("message_id") != message_id:
            raise StoreConflict("no intent for this key")
        if not _has_publication(after, publication):
            raise StoreOutcomeUnknown("scylla: the publish-mark did not apply")
        self._rows.known.published(known, publication)

    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        known = self._rows.known.get(intent)
        if known is None:
            row, stored = await self._stored(intent)
            if stored is None:  # committed already: make sure its bookkeeping was written
                expires = int(row.get("expires_at_ms") or 0)
                await self._finish(intent, expires - self._settings.idempotency_window_ms, None)
                return committed_from_row(intent.key, row)
            if stored.state is not CommitState.OUTBOXED or publication_of(row) is None:
                raise StoreConflict("record and publication must both be recorded first")
            known = self._rows.remember(stored, row, recorded=True)
        stored = known.intent
        publication = intent.publication or stored.publication
        if publication is None:
            raise StoreConflict("record and publication must both be recorded first")
        now = self._clock.now_ms()
        r, k = stored.record, intent.key
        try:
            applied = await self._cql.cas(
                "c.commit",
                (
                    self.commit_ttl_s,
                    as_digest(stored.identity),
                    r.conversation,
                    r.seq,
                    r.message_id,
                    r.server_ts_ms,
                    publication.stream,
                    publication.position,
                    now + self._settings.idempotency_window_ms,
                    *key_of(k),
                    r.message_id,
                    publication.stream,
                    publication.position,
                ),
            )
        except StoreOutcomeUnknown:
            applied = False
        if not applied:
            now = await self._commit_refused(k, r.message_id, publication)
        await self._finish(stored, now, known)
        self._rows.known.forget(k)
        return stored.committed_message()

    async def _commit_refused(
        self, key: CommitKey, message_id: str, publication: OutboxPublication
    ) -> int:
        """After a refused or unknown commit-mark: the commit time when the intent is
        committed after all, else the reason it cannot be."""
        after = self._rows.live(await self._rows.row(key, serial=True))
        if after is None or after.get("message_id") != message_id:
            raise StoreConflict("no intent for this key")
        if after.get("state") == CommitState.COMMITTED.value:
            return int(after.get("expires_at_ms") or 0) - self._settings.idempotency_window_ms
        stored = publication_of(after)
        if stored is None:
            raise StoreConflict("record and publication must both be recorded first")
        if stored != publication:
            raise StoreConflict("a different publication is already recorded")
        raise StoreOutcomeUnknown("scylla: the commit-mark did not apply")

    async def _finish(self, intent: CommitIntent, committed_ms: int, known: Known | None) -> None:
        await self._queue.finish(
            intent.record, intent.key, reading_version=intent.delivery.reading_version,
            committed_ms=committed_ms, created_ms=intent.created_at_ms,
            due_ms=int((known.due_ms if known else None) or intent.created_at_ms),
            quarantined=known is not None and known.quarantined,
        )  # fmt: skip

    # --- the recovery queue (recovery_queue.py) ------------------------------------------

    async def abandon_quarantined(self, key: CommitKey, operator: str, reason: str) -> Abandonment:
        return await self._abandoner.abandon(key, operator, reason)

    # --- history, readiness ----------------------------------------------------------

    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        return await self._history.page(query)

    async def readiness(self) -> None:
        await self._readiness()

    async def close(self) -> None:
        await self._cql.close()


def _same_coordinates(row: Row, record: MessageRecord) -> bool:
    return row.get("message_id") == record.message_id and row.get("seq") == record.seq


def _has_publication(row: Row, publication: OutboxPublication) -> bool:
    """True when ``row`` already carries ``publication``; StoreConflict for another one."""
    current = publication_of(row)
    if current is None:
        return False
    if current != publication:
        raise StoreConflict("a different publication is already recorded")
    return True
