"""The Scylla MessageStore: the commit state machine over conditional writes.

LWTs per fresh commit (no contention): the seq batch and the intent at
reserve, the publish-mark, the commit-mark: 4. A replay of a committed key
reads one row: 0. Every other statement is a plain, idempotent read or
write. The steps (docs/scylla.md has the statement counts):

==========================  =======================================================
step                        writes
==========================  =======================================================
reserve                     plain read of the intent; if absent: seq batch (LWT,
                            ``conversations``); one batch of the recovery entries
                            and the retention pin (plain); intent
                            ``IF state = null`` (LWT)
put_record                  plain read of the intent; plain insert of exactly its
                            record into history (no TTL yet)
mark_outbox_published       plain reads of intent and history record (the record
                            evidence); ``IF state = 'reserved'`` (LWT)
mark_committed              plain read; compact ``IF state = 'outboxed'`` (LWT, TTL
                            = idempotency window); then one batch: history rewrite
                            with expiry, retention schedule, pin, recovery entries
==========================  =======================================================

Stored states are reserved, outboxed and committed; an intent whose record
is in history reads back as RECORDED. A refused or unknown conditional write
is never taken as success: the row is re-read at serial consistency and the
decision is made from what is there. When the re-read cannot decide,
StoreOutcomeUnknown.

The commit's bookkeeping batch runs after the commit-mark. A crash between
the two leaves the intent COMMITTED with its recovery entry and pin still in
place; the next recovery scan finds the entry and writes the batch
(``_repair``), so nothing is left behind and retention never passes the seq
in the meantime.

Expiry: a committed row carries ``expires_at_ms`` (by the store's clock) and
a TTL a minute longer, so reads honour the window to the millisecond and the
server removes the row afterwards. The row is written by UPDATEs only (no row
marker), so when its cells expire, nothing of it is left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from cassandra.query import UNSET_VALUE

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
from backends.scylla.history import BATCHED_RECORD_BYTES, History, pin_removal, pin_write
from backends.scylla.recovery import Entry, RecoveryIndex, quarantine_token
from backends.scylla.sequence import SeqAllocator
from backends.scylla.session import CqlSession, Params
from service.domain.errors import (
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from service.domain.identity import as_digest
from service.domain.ids import CommitKey
from service.domain.model import (
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
    MessageRecord,
    OutboxPublication,
    QuarantinePage,
    RecoveryItem,
    RecoveryStats,
    ReserveCandidate,
    Reserved,
    ReserveResult,
)
from service.domain.ports import Clock, MessageStore, StoredCommit, StoreSettings

_KEY = "WHERE tenant = ? AND sender = ? AND cmid = ?"
_INTENT_SET = ", ".join(
    f"{c} = ?"
    for c in (
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
)
_QUEUE_COLUMNS = ("rq_attempts", "rq_due_ms", "rq_problem", "rq_quarantined")
_DROP_BODY = ", ".join(
    f"{c} = null" for c in (*BODY_COLUMNS, "created_at_ms", "recipients", *_QUEUE_COLUMNS)
)

STATEMENTS = {
    "c.get": f"SELECT * FROM {{ks}}.commits {_KEY}",
    "c.reserve": f"UPDATE {{ks}}.commits SET state = 'reserved', {_INTENT_SET} {_KEY}"
    " IF state = null",
    "c.reserve_over": f"UPDATE {{ks}}.commits SET state = 'reserved', {_INTENT_SET},"
    " pub_stream = null, pub_position = null, expires_at_ms = null, rq_attempts = null,"
    f" rq_due_ms = null, rq_problem = null, rq_quarantined = null {_KEY}"
    " IF state = 'committed' AND expires_at_ms = ?",
    "c.outboxed": "UPDATE {ks}.commits SET state = 'outboxed', pub_stream = ?, pub_position = ?"
    f" {_KEY} IF state = 'reserved' AND message_id = ?",
    "c.commit": "UPDATE {ks}.commits USING TTL ? SET state = 'committed', identity = ?,"
    " conversation = ?, seq = ?, message_id = ?, server_ts_ms = ?, pub_stream = ?,"
    f" pub_position = ?, expires_at_ms = ?, membership_version = null, {_DROP_BODY}"
    f" {_KEY} IF state = 'outboxed' AND message_id = ?",
    "c.defer": "UPDATE {ks}.commits SET rq_attempts = ?, rq_problem = ?, rq_due_ms = ?,"
    f" rq_quarantined = ? {_KEY} IF created_at_ms = ?",
    "c.release": "UPDATE {ks}.commits SET rq_attempts = 0, rq_due_ms = ?, rq_quarantined = false"
    f" {_KEY} IF rq_quarantined = true AND created_at_ms = ?",
}

ReadinessProbe = Callable[[], Awaitable[None]]
MAX_RESERVE_ROUNDS = 4
ABSENT_ENTRY_GRACE_MS = 10 * 60_000
JUDGE_CONCURRENCY = 32
MAX_QUARANTINE_PAGES = 100
PROBLEM_CHARS = 200


def _key_of(key: CommitKey) -> tuple[str, str, str]:
    return (key.tenant, key.sender, key.cmid)


class ScyllaMessageStore(MessageStore):
    atomic_publish_commit = False  # two conditional writes: publish-mark, then commit-mark

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
    ) -> None:
        self._cql = cql
        self._sequence = sequence
        self._history = history
        self._recovery = recovery
        self._settings = settings
        self._clock = clock
        self._whole_identity = identity_form == "whole"
        self._readiness = readiness
        self.commit_ttl_s = commit_ttl_s

    @property
    def cql(self) -> CqlSession:
        """The driver session (tests install an ``interceptor`` on it)."""
        return self._cql

    # --- reading one key ---------------------------------------------------------

    async def _row(self, key: CommitKey, *, serial: bool = False) -> Row | None:
        rows = await self._cql.read("c.get", _key_of(key), serial=serial)
        return rows[0] if rows and rows[0].get("state") is not None else None

    def _expired(self, row: Row) -> bool:
        """A committed row past the idempotency window (by this store's clock)."""
        expires = row.get("expires_at_ms")
        return (
            row.get("state") == CommitState.COMMITTED.value
            and expires is not None
            and expires <= self._clock.now_ms()
        )

    def _live(self, row: Row | None) -> Row | None:
        return None if row is None or self._expired(row) else row

    async def _unfinished(self, key: CommitKey, row: Row) -> CommitIntent:
        """The intent of a live, unfinished row; RECORDED once history holds its record."""
        state = state_of(row)
        intent = intent_from_row(key, row, state)
        if state is CommitState.RESERVED and await self._recorded(intent.record):
            intent = intent.advanced(CommitState.RECORDED)
        return intent

    async def _recorded(self, record: MessageRecord) -> bool:
        return await self._history.get(record) == record

    async def _load(self, key: CommitKey) -> StoredCommit | None:
        row = self._live(await self._row(key))
        if row is None:
            return None
        identity = row.get("identity") or b""
        conversation = row.get("conversation") or ""
        if state_of(row) is CommitState.COMMITTED:
            return StoredCommit(identity, conversation, None, committed_from_row(key, row))
        return StoredCommit(identity, conversation, await self._unfinished(key, row), None)

    async def _existing(self, request: AuthenticatedSend, row: Row) -> ReserveResult:
        if not request.matches_identity(row.get("identity") or b""):
            return Conflict(request.key)
        if state_of(row) is CommitState.COMMITTED:
            return Committed(committed_from_row(request.key, row))
        return InProgress(await self._unfinished(request.key, row))

    # --- reserve -------------------------------------------------------------------

    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        key = request.key
        row = await self._row(key)
        for _ in range(MAX_RESERVE_ROUNDS):
            if (live := self._live(row)) is not None:
                return await self._existing(request, live)
            stale = row  # an expired committed intent, or None
            seq = await self._sequence.allocate(
                key.tenant, request.conversation, key.sender, key.cmid,
                stale.get("seq") if stale else None,
            )  # fmt: skip
            identity = request.stored_identity(self._whole_identity)
            intent = new_intent(request, identity, delivery, candidate, seq, self._clock.now_ms())
            await self._cql.write_batch(self._indexed(intent))
            if await self._write_intent(intent, stale):
                return Reserved(intent)
            row = await self._row(key, serial=True)
            if row is not None and _same_coordinates(row, intent.record):
                return Reserved(intent)  # our write applied after all
            if row is not None and row.get("created_at_ms") != intent.created_at_ms:
                # Another intent holds the key: our entries are stale (a scan would
                # drop them too); the pin stays when that intent holds our seq.
                await self._quietly(self._unindexed(intent, keep_pin=row.get("seq") == seq))
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

    async def _quietly(self, writes: Sequence[tuple[str, Params]]) -> None:
        """Best-effort cleanup: a scan removes what this leaves behind."""
        if writes:
            with contextlib.suppress(StoreError):
                await self._cql.write_batch(writes)

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
        row = self._live(await self._row(intent.key))
        if row is None:
            raise StoreConflict("no intent for this key")
        if state_of(row) is CommitState.COMMITTED:
            if row.get("message_id") != intent.record.message_id:
                raise StoreConflict("intent does not match the stored one")
            return row, None
        stored = intent_from_row(intent.key, row, state_of(row))
        if stored.record != intent.record:
            raise StoreConflict("intent does not match the stored one")
        return row, stored

    async def put_record(self, intent: CommitIntent) -> None:
        _, stored = await self._stored(intent)
        if stored is None or stored.state is not CommitState.RESERVED:
            return  # committed or past RECORDED: the record is there (retry-safe)
        await self._history.put(stored.record, stored.created_at_ms)

    async def mark_outbox_published(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> None:
        row, stored = await self._stored(intent)
        if _has_publication(row, publication):
            return
        assert stored is not None  # a committed row always has its publication
        if not await self._recorded(stored.record):
            raise StoreConflict("the record is not written yet")
        k = intent.key
        try:
            applied = await self._cql.cas(
                "c.outboxed",
                (publication.stream, publication.position, *_key_of(k), stored.record.message_id),
            )
        except StoreOutcomeUnknown:
            applied = False
        if applied:
            return
        after = self._live(await self._row(k, serial=True))
        if after is None or after.get("message_id") != stored.record.message_id:
            raise StoreConflict("no intent for this key")
        if not _has_publication(after, publication):
            raise StoreOutcomeUnknown("scylla: the publish-mark did not apply")

    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        row, stored = await self._stored(intent)
        if stored is None:  # committed already: make sure its bookkeeping was written
            expires = int(row.get("expires_at_ms") or 0)
            await self._finish(intent, expires - self._settings.idempotency_window_ms, row)
            return committed_from_row(intent.key, row)
        publication = publication_of(row)
        if stored.state is not CommitState.OUTBOXED or publication is None:
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
                    *_key_of(k),
                    r.message_id,
                ),
            )
        except StoreOutcomeUnknown:
            applied = False
        if not applied:
            after = self._live(await self._row(k, serial=True))
            if after is None or after.get("message_id") != r.message_id:
                raise StoreConflict("no intent for this key")
            if state_of(after) is not CommitState.COMMITTED:
                raise StoreOutcomeUnknown("scylla: the commit-mark did not apply")
            now = int(after.get("expires_at_ms") or 0) - self._settings.idempotency_window_ms
        await self._finish(stored, now, row)
        return stored.committed_message()

    async def _finish(self, intent: CommitIntent, committed_ms: int, row: Row) -> None:
        """After the commit-mark: the record's expiry, the retention schedule, the pin
        and the recovery entries, in one batch (a large record on its own beside it).
        Best effort: what a failure leaves, the next scan finishes (``_repair``)."""
        due = row.get("rq_due_ms")
        writes, rewrite = self._history.committed_writes(
            intent.record, committed_ms, intent.created_at_ms, self._clock.now_ms()
        )
        writes += [
            self._recovery.entry_removal(intent.key, int(due or intent.created_at_ms)),
            self._recovery.created_removal(intent.key, intent.created_at_ms),
        ]
        if row.get("rq_quarantined"):
            writes.append(self._recovery.quarantine_removal(intent.key))
        with contextlib.suppress(StoreError):
            if intent.record.size_bytes() <= BATCHED_RECORD_BYTES:
                await self._cql.write_batch([rewrite, *writes])
            else:
                await asyncio.gather(self._cql.write(*rewrite), self._cql.write_batch(writes))

    # --- the recovery queue ------------------------------------------------------------

    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[RecoveryItem]:
        found: list[RecoveryItem] = []
        if max_items <= 0:
            return found
        async for entries in self._recovery.due(older_than_ms, max_items):
            for start in range(0, len(entries), JUDGE_CONCURRENCY):
                chunk = entries[start : start + JUDGE_CONCURRENCY]
                judged = await asyncio.gather(*(self._judge(e, older_than_ms) for e in chunk))
                found += [item for item in judged if item is not None]
                if len(found) >= max_items:
                    return found[:max_items]
        return found

    async def _judge(self, entry: Entry, older_than_ms: int) -> RecoveryItem | None:
        """The item of a due entry, or None after dealing with a stale one."""
        key = entry.key
        row = self._live(await self._row(key))
        if row is None:
            if entry.created_at_ms >= self._clock.now_ms() - ABSENT_ENTRY_GRACE_MS:
                return None  # maybe a reserve in flight
            await self._quietly(self._stale(entry, None))
            return None
        if row.get("state") == CommitState.COMMITTED.value:
            if entry.message_id is not None and row.get("message_id") == entry.message_id:
                await self._repair(entry, row)
            else:
                await self._quietly(self._stale(entry, row))
            return None
        created = row.get("created_at_ms")
        mine = (entry.message_id is None or row.get("message_id") == entry.message_id) and (
            created == entry.created_at_ms
        )
        if not mine:
            await self._quietly(self._stale(entry, row))
            return None
        if row.get("rq_quarantined"):
            await self._into_quarantine(entry, row)
            return None
        due = int(row.get("rq_due_ms") or entry.created_at_ms)
        if due != entry.due_ms:  # a defer that stopped before moving its entry
            moved = Entry(due, *_key_of(key), entry.conversation, entry.seq, entry.message_id,
                          entry.created_ms)  # fmt: skip
            await self._cql.write_batch(self._recovery.entry_writes(moved))
            await self._quietly([self._recovery.entry_removal(key, entry.due_ms)])
            if due >= older_than_ms:
                return None
        return await self._item(key, row, quarantined=False)

    def _stale(self, entry: Entry, row: Row | None) -> list[tuple[str, Params]]:
        """Removals for an entry that belongs to no live intent (an orphan of a
        reserve that never wrote its intent, or a lost duplicate's)."""
        writes = [
            self._recovery.entry_removal(entry.key, entry.due_ms),
            self._recovery.created_removal(entry.key, entry.created_at_ms),
        ]
        seq, conversation = entry.seq, entry.conversation
        if seq is not None and conversation is not None and (row is None or row.get("seq") != seq):
            writes.append(pin_removal(entry.tenant, conversation, seq))
        return writes

    async def _repair(self, entry: Entry, row: Row) -> None:
        """A commit whose bookkeeping batch never ran: write it now."""
        conversation = row.get("conversation") or entry.conversation or ""
        seq = int(row.get("seq") or 0)
        record = await self._history.at(entry.tenant, conversation, seq)
        if record is None or record.message_id != entry.message_id:
            await self._quietly([self._recovery.entry_removal(entry.key, entry.due_ms)])
            return
        committed_ms = int(row.get("expires_at_ms") or 0) - self._settings.idempotency_window_ms
        writes, rewrite = self._history.committed_writes(
            record, committed_ms, entry.created_at_ms, self._clock.now_ms()
        )
        writes += [
            self._recovery.entry_removal(entry.key, entry.due_ms),
            self._recovery.created_removal(entry.key, entry.created_at_ms),
        ]
        await self._quietly([rewrite])
        await self._quietly(writes)

    async def _into_quarantine(self, entry: Entry, row: Row) -> None:
        conversation = row.get("conversation") or ""
        # Quarantined intents leave the creation view: the oldest-unfinished gauge
        # watches what recovery can still finish, the quarantine has its own count.
        await self._cql.write_batch(
            [
                self._recovery.quarantine_write(entry.key, entry.created_at_ms, conversation),
                self._recovery.created_removal(entry.key, entry.created_at_ms),
            ]
        )
        await self._quietly([self._recovery.entry_removal(entry.key, entry.due_ms)])

    async def _item(self, key: CommitKey, row: Row, *, quarantined: bool) -> RecoveryItem:
        """The queue item of an unfinished row; undecodable: no intent, a problem."""
        created = int(row.get("created_at_ms") or 0)
        conversation = str(row.get("conversation") or "")
        attempts = int(row.get("rq_attempts") or 0)
        problem = str(row.get("rq_problem") or "")
        try:
            intent = await self._unfinished(key, row)
        except (StoreCorrupt, ValueError, TypeError, KeyError) as exc:
            return RecoveryItem(key, conversation, created, attempts, None,
                                problem or type(exc).__name__, quarantined)  # fmt: skip
        return RecoveryItem(key, conversation, created, attempts, intent, problem, quarantined)

    async def defer_recovery(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None:
        row = self._live(await self._row(item.key))
        if (
            row is None
            or row.get("state") == CommitState.COMMITTED.value
            or row.get("created_at_ms") != item.created_at_ms
        ):
            return  # committed, or a new intent for this key since the scan
        old_due = int(row.get("rq_due_ms") or item.created_at_ms)
        due = self._clock.now_ms() + retry_after_ms
        applied = await self._cql.cas(
            "c.defer",
            (item.attempts + 1, problem[:PROBLEM_CHARS], None if quarantine else due, quarantine,
             *_key_of(item.key), item.created_at_ms),
        )  # fmt: skip
        if not applied:
            return
        entry = _entry_of_row(item.key, row, old_due)
        if quarantine:
            await self._into_quarantine(entry, row)
            return
        moved = Entry(due, *_key_of(item.key), entry.conversation, entry.seq, entry.message_id,
                      entry.created_ms)  # fmt: skip
        await self._cql.write_batch(self._recovery.entry_writes(moved))
        if old_due != due:
            await self._quietly([self._recovery.entry_removal(item.key, old_due)])

    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        items: list[RecoveryItem] = []
        token = after
        for _ in range(MAX_QUARANTINE_PAGES):
            asked = max(1, limit - len(items))
            rows = await self._recovery.quarantine_page(token, asked)
            keys = [CommitKey(r["tenant"], r["sender"], r["cmid"]) for r in rows]
            stored = await asyncio.gather(*(self._row(k) for k in keys))
            for key, row in zip(keys, stored, strict=True):
                live = self._live(row)
                if (
                    live is None
                    or live.get("state") == CommitState.COMMITTED.value
                    or not (live.get("rq_quarantined"))
                ):
                    await self._quietly([self._recovery.quarantine_removal(key)])
                    continue
                items.append(await self._item(key, live, quarantined=True))
            if len(rows) < asked:
                return QuarantinePage(tuple(items), "")
            token = quarantine_token(keys[-1])
            if len(items) >= limit:
                return QuarantinePage(tuple(items), token)
        return QuarantinePage(tuple(items), token)

    async def recovery_item(self, key: CommitKey) -> RecoveryItem | None:
        row = self._live(await self._row(key))
        if row is None or row.get("state") == CommitState.COMMITTED.value:
            return None
        return await self._item(key, row, quarantined=bool(row.get("rq_quarantined")))

    async def release_quarantined(self, key: CommitKey) -> bool:
        row = self._live(await self._row(key))
        if row is None or row.get("state") == CommitState.COMMITTED.value:
            return False
        if not row.get("rq_quarantined"):
            return False
        created = int(row.get("created_at_ms") or 0)
        due = min(created, self._clock.now_ms())
        if not await self._cql.cas("c.release", (due, *_key_of(key), created)):
            return False
        await self._cql.write_batch(
            [
                *self._recovery.entry_writes(_entry_of_row(key, row, due)),
                *self._recovery.created_writes(key, created),
            ]
        )
        await self._quietly([self._recovery.quarantine_removal(key)])
        return True

    async def recovery_stats(self) -> RecoveryStats:
        oldest, quarantined = await asyncio.gather(
            self._recovery.oldest_created(self._clock.now_ms()),
            self._recovery.quarantine_size(),
        )
        return RecoveryStats(oldest, quarantined)

    # --- history, readiness ----------------------------------------------------------

    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        return await self._history.page(query)

    async def readiness(self) -> None:
        await self._readiness()

    async def close(self) -> None:
        await self._cql.close()


def _entry_of_row(key: CommitKey, row: Row, due_ms: int) -> Entry:
    seq = row.get("seq")
    created = row.get("created_at_ms")
    return Entry(
        due_ms, *_key_of(key), row.get("conversation"),
        int(seq) if seq is not None else None, row.get("message_id"),
        int(created) if created is not None else None,
    )  # fmt: skip


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
