"""The Scylla MessageStore: the commit state machine over conditional writes.

LWTs per fresh commit (no contention): the seq batch and the intent at
reserve, the publish-mark, the commit-mark: 4. A replay of a committed key
reads one row: 0. Every other statement is a plain, idempotent read or
write. The steps (see docs/scylla.md for the statement counts):

==========================  =======================================================
step                        writes
==========================  =======================================================
reserve                     plain read of the intent; if absent: seq batch (LWT,
                            ``conversations``), recovery entry + minute (plain),
                            intent ``IF state = null`` (LWT)
put_record                  plain read of the intent; plain insert of exactly its
                            record into history (no TTL yet)
mark_outbox_published       plain reads of intent and history record (the record
                            evidence); ``IF state = 'reserved'`` (LWT)
mark_committed              plain read; history rewrite with expiry + retention
                            schedule (plain); compact ``IF state = 'outboxed'``
                            (LWT, TTL = idempotency window); delete recovery entry
==========================  =======================================================

Stored states are reserved, outboxed and committed; an intent whose record
is in history reads back as RECORDED. A refused or unknown conditional write
is never taken as success: the row is re-read at serial consistency and the
decision is made from what is there (only the ``[applied]`` flag of a
conditional write is used; the columns it returns differ between ScyllaDB
and Cassandra). When the re-read cannot decide, StoreOutcomeUnknown.

Expiry: a committed row carries ``expires_at_ms`` (by the store's clock) and
a TTL a minute longer, so reads honour the window to the millisecond and the
server removes the row afterwards. The row is written by UPDATEs only (no row
marker), so when its cells expire, nothing of it is left.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

from backends.scylla.codec import (
    BODY_COLUMNS,
    Row,
    body_values,
    committed_from_row,
    intent_from_row,
    new_intent,
    publication_of,
    state_of,
)
from backends.scylla.conversations import ScyllaMembershipStore
from backends.scylla.history import TTL_SLACK_S, History, ttl_s
from backends.scylla.recovery import Entry, RecoveryIndex, Verdict, entry_of
from backends.scylla.session import CqlSession
from service.domain.errors import StoreConflict, StoreOutcomeUnknown, StoreUnavailable
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
_DROP_BODY = ", ".join(f"{c} = null" for c in (*BODY_COLUMNS, "created_at_ms", "recipients"))

STATEMENTS = {
    "c.get": f"SELECT * FROM {{ks}}.commits {_KEY}",
    "c.reserve": f"UPDATE {{ks}}.commits SET state = 'reserved', {_INTENT_SET} {_KEY}"
    " IF state = null",
    "c.reserve_over": f"UPDATE {{ks}}.commits SET state = 'reserved', {_INTENT_SET},"
    f" pub_stream = null, pub_position = null, expires_at_ms = null {_KEY}"
    " IF state = 'committed' AND expires_at_ms = ?",
    "c.outboxed": "UPDATE {ks}.commits SET state = 'outboxed', pub_stream = ?, pub_position = ?"
    f" {_KEY} IF state = 'reserved' AND message_id = ?",
    "c.commit": "UPDATE {ks}.commits USING TTL ? SET state = 'committed', identity = ?,"
    " conversation = ?, seq = ?, message_id = ?, server_ts_ms = ?, pub_stream = ?,"
    f" pub_position = ?, expires_at_ms = ?, membership_version = null, {_DROP_BODY}"
    f" {_KEY} IF state = 'outboxed' AND message_id = ?",
}

ReadinessProbe = Callable[[], Awaitable[None]]
MAX_RESERVE_ROUNDS = 4
ABSENT_ENTRY_GRACE_MS = 10 * 60_000


class ScyllaMessageStore(MessageStore):
    atomic_publish_commit = False  # two conditional writes: publish-mark, then commit-mark

    def __init__(
        self,
        cql: CqlSession,
        conversations: ScyllaMembershipStore,
        history: History,
        recovery: RecoveryIndex,
        settings: StoreSettings,
        clock: Clock,
        identity_form: Literal["digest", "whole"],
        readiness: ReadinessProbe,
    ) -> None:
        self._cql = cql
        self._conversations = conversations
        self._history = history
        self._recovery = recovery
        self._settings = settings
        self._clock = clock
        self._whole_identity = identity_form == "whole"
        self._readiness = readiness
        self.commit_ttl_s = ttl_s(settings.idempotency_window_ms, TTL_SLACK_S)

    @property
    def cql(self) -> CqlSession:
        """The driver session (tests install an ``interceptor`` on it)."""
        return self._cql

    # --- reading one key ---------------------------------------------------------

    async def _row(self, key: CommitKey, *, serial: bool = False) -> Row | None:
        rows = await self._cql.read("c.get", (key.tenant, key.sender, key.cmid), serial=serial)
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
            stale = row if row is not None else None  # an expired committed intent
            seq = await self._conversations.allocate_seq(
                key.tenant, request.conversation, key.sender, key.cmid,
                stale.get("seq") if stale else None,
            )  # fmt: skip
            identity = request.stored_identity(self._whole_identity)
            intent = new_intent(request, identity, delivery, candidate, seq, self._clock.now_ms())
            entry = entry_of(intent)
            await self._recovery.add(entry)
            if await self._write_intent(intent, stale):
                return Reserved(intent)
            row = await self._row(key, serial=True)
            if row is not None and _same_coordinates(row, intent.record):
                return Reserved(intent)  # our write applied after all
            if row is None or row.get("created_at_ms") != intent.created_at_ms:
                await self._recovery.remove_quietly(entry)
        raise StoreUnavailable("scylla: reserve did not settle")

    async def _write_intent(self, intent: CommitIntent, stale: Row | None) -> bool:
        """The intent's LWT; False when refused or unknown (the caller re-reads)."""
        r, k = intent.record, intent.key
        values = (
            r.conversation,
            intent.identity,
            r.seq,
            r.message_id,
            r.server_ts_ms,
            intent.created_at_ms,
            *body_values(r, unset_absent=stale is None),
            list(intent.delivery.recipients),
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
                (
                    publication.stream,
                    publication.position,
                    k.tenant,
                    k.sender,
                    k.cmid,
                    stored.record.message_id,
                ),
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
        if stored is None:
            return committed_from_row(intent.key, row)
        publication = publication_of(row)
        if stored.state is not CommitState.OUTBOXED or publication is None:
            raise StoreConflict("record and publication must both be recorded first")
        now = self._clock.now_ms()
        await self._history.committed(stored.record, now, stored.created_at_ms)
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
                    k.tenant,
                    k.sender,
                    k.cmid,
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
        await self._recovery.remove_quietly(entry_of(stored))
        return stored.committed_message()

    # --- recovery, history, readiness ----------------------------------------------

    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[CommitIntent]:
        return await self._recovery.scan(older_than_ms, max_items, self._judge)

    async def _judge(self, entry: Entry) -> tuple[Verdict, CommitIntent | None]:
        row = self._live(await self._row(entry.key))
        if row is None:
            young = entry.created_at_ms >= self._clock.now_ms() - ABSENT_ENTRY_GRACE_MS
            return (Verdict.SKIP if young else Verdict.DROP), None
        if (
            state_of(row) is CommitState.COMMITTED
            or row.get("created_at_ms") != entry.created_at_ms
        ):
            return Verdict.DROP, None
        return Verdict.KEEP, await self._unfinished(entry.key, row)

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
