"""The memory MessageStore: every transition runs without an await, so it is atomic."""

from __future__ import annotations

import bisect
import heapq
from dataclasses import replace
from typing import Literal

from backends.memory.members import MemoryMembershipStore, admission_of
from backends.memory.outbox import MemoryOutbox
from backends.memory.rows import record_of, record_row
from backends.memory.state import Commit, Key3, MemoryState, QueueEntry
from service.domain.errors import StoreConflict, StoreInvalid
from service.domain.history import build_page, reader_of
from service.domain.identity import as_digest
from service.domain.ids import CommitKey
from service.domain.model import (
    Abandoned,
    Abandonment,
    AbandonOutcome,
    Admission,
    AuthenticatedSend,
    CommitIntent,
    CommitState,
    Committed,
    CommittedMessage,
    Conflict,
    Direction,
    FrozenDeliveryInput,
    HistoryPage,
    HistoryQuery,
    InProgress,
    OutboxPublication,
    QuarantinePage,
    RecoveryItem,
    RecoveryStats,
    ReserveCandidate,
    Reserved,
    ReserveResult,
)
from service.domain.ports import Clock, Hook, MessageStore, Outbox, StoredCommit, StoreSettings


def _k(key: CommitKey) -> Key3:
    return (key.tenant, key.sender, key.cmid)


class MemoryMessageStore(MessageStore):
    """MessageStore over a MemoryState (its clock is the "server's" clock)."""

    atomic_publish_commit = True

    def __init__(
        self,
        state: MemoryState,
        members: MemoryMembershipStore,
        settings: StoreSettings,
        clock: Clock,
        identity_form: Literal["digest", "whole"] = "digest",
    ) -> None:
        self.state = state
        self._members = members
        self._settings = settings
        self._clock = clock
        self._whole_identity = identity_form == "whole"  # what versions < 1 wrote

    # --- retention ---------------------------------------------------------

    def _sweep(self) -> None:
        now, s = self._clock.now_ms(), self.state
        while s.commit_expiry and s.commit_expiry[0][0] <= now:
            _, key = s.commit_expiry.popleft()
            stored = s.commits.get(key)
            if stored is not None and (
                not isinstance(stored, Commit) or stored.abandoned is not None
            ):
                del s.commits[key]  # committed or abandoned: its window is over
        touched = set()
        while s.history_expiry and s.history_expiry[0][0] <= now:
            _, conv_key, seq = s.history_expiry.popleft()
            conv = s.conversations.get(conv_key)
            if conv is not None:
                conv.unpin(seq)  # a late commit's pin ends with its own retention
                conv.wanted_cut = max(conv.wanted_cut, seq)
                touched.add(conv_key)
        for conv_key in touched:
            s.conversations[conv_key].trim()

    # --- MessageStore --------------------------------------------------------

    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        result = self._reserve(request, delivery, candidate, admit=False)
        assert not isinstance(result, Admission) and result is not None
        return result

    admits_in_reserve = True

    async def reserve_admitted(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput | None,
        candidate: ReserveCandidate,
    ) -> ReserveResult | Admission | None:
        return self._reserve(request, delivery, candidate, admit=True)

    def _reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput | None,
        candidate: ReserveCandidate,
        *,
        admit: bool,
    ) -> ReserveResult | Admission | None:
        """Reserve; with ``admit``, the sender's admission is decided after the
        key's stored state and before anything is written (a refusal writes
        nothing). ``delivery`` None: frozen at the version read here."""
        self._sweep()
        conv = self.state.conversations.get((request.tenant, request.conversation))
        if conv is None and admit:
            return None  # as the admission lookup answers it, before any key
        key = _k(request.key)
        existing = self._stored(key)
        if existing is not None:
            if existing.abandoned is not None:
                return Abandoned(request.key)
            if not request.matches_identity(existing.identity):
                return Conflict(request.key)
            if existing.committed is not None:
                return Committed(existing.committed)
            assert existing.intent is not None
            return InProgress(existing.intent)
        if conv is None:
            conv = self._members.conversation(request.tenant, request.conversation)  # raises
        if admit and not (admission := admission_of(conv, request.sender)).member:
            return admission
        conv.last_seq += 1
        conv.pin(conv.last_seq)
        now = self._clock.now_ms()
        identity = request.stored_identity(self._whole_identity)
        intent = CommitIntent(
            key=request.key,
            identity=identity,
            record=request.record_at(conv.last_seq, candidate),
            delivery=delivery or FrozenDeliveryInput.at_version(conv.version),
            state=CommitState.RESERVED,
            created_at_ms=now,
        )
        self.state.commits[key] = Commit(identity, request.conversation, intent)
        self.state.queue[key] = QueueEntry(created_at_ms=now, due_ms=now)
        return Reserved(intent)

    def _stored(self, key: Key3) -> Commit | None:
        stored = self.state.commits.get(key)
        return None if stored is None else Commit.of(stored)

    def _unfinished(self, intent: CommitIntent) -> Commit:
        """The stored commit for ``intent``, checked to be the same intent."""
        stored = self._stored(_k(intent.key))
        if stored is None:
            raise StoreConflict("no intent for this key")
        if stored.committed is not None:
            if stored.committed.message_id != intent.record.message_id:
                raise StoreConflict("intent does not match the stored one")
        elif stored.intent is None or stored.intent.record != intent.record:
            raise StoreConflict("intent does not match the stored one")
        return stored

    async def put_record(self, intent: CommitIntent) -> None:
        self._sweep()
        stored = self._unfinished(intent)
        if stored.intent is None or stored.intent.state is not CommitState.RESERVED:
            return  # already recorded: retry-safe
        self._record(stored, stored.intent)

    def _record(self, stored: Commit, intent: CommitIntent) -> None:
        """RESERVED → RECORDED: the record into history (once)."""
        record = intent.record
        conv = self._members.conversation(record.tenant, record.conversation)
        if record.seq not in conv.history:
            bisect.insort(conv.seqs, record.seq)
            conv.history[record.seq] = record_row(record)
            conv.reading_versions[record.seq] = intent.delivery.reading_version
        stored.intent = intent.advanced(CommitState.RECORDED)

    def _has_record(self, intent: CommitIntent) -> bool:
        r = intent.record
        conv = self.state.conversations.get((r.tenant, r.conversation))
        return conv is not None and conv.history.get(r.seq) == record_row(r)

    def _check_publication(self, stored: Commit, publication: OutboxPublication) -> bool:
        """True when already at (or past) OUTBOXED with this very publication."""
        if stored.publication is None:
            return False
        if stored.publication != publication:
            raise StoreConflict("a different publication is already recorded")
        return True

    async def mark_outbox_published(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> None:
        self._sweep()
        stored = self._unfinished(intent)
        if self._check_publication(stored, publication):
            return
        assert stored.intent is not None
        if stored.intent.state is not CommitState.RECORDED or not self._has_record(intent):
            raise StoreConflict("the record is not written yet")
        stored.publication = publication
        stored.intent = stored.intent.advanced(CommitState.OUTBOXED, publication)

    async def mark_published_and_committed(
        self, intent: CommitIntent, publication: OutboxPublication, between: Hook | None = None
    ) -> CommittedMessage:
        self._sweep()
        stored = self._unfinished(intent)
        if stored.committed is not None:
            self._check_publication(stored, publication)
            return stored.committed
        assert stored.intent is not None
        if stored.publication is not None:
            self._check_publication(stored, publication)
        elif stored.intent.state is not CommitState.RECORDED:
            raise StoreConflict("the record is not written yet")
        if not self._has_record(stored.intent):
            raise StoreConflict("the record is missing from history")
        stored.publication = publication
        return self._commit(stored)

    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        self._sweep()
        stored = self._unfinished(intent)
        if stored.committed is not None:
            return stored.committed
        assert stored.intent is not None
        if stored.publication is None or not self._has_record(stored.intent):
            raise StoreConflict("record and publication must both be recorded first")
        return self._commit(stored)

    # --- a fresh commit's last three steps without an await between them ----------

    def pipelines_with(self, outbox: Outbox) -> bool:
        """With this state's own outbox (under tracing's wrapper; not another state's)."""
        outbox = outbox.underlying()
        return isinstance(outbox, MemoryOutbox) and outbox.state is self.state

    async def finish_pipelined(
        self, intent: CommitIntent, outbox: Outbox, steps: int = 3
    ) -> CommittedMessage | None:
        """put_record, the outbox append and the commit mark, the first ``steps``
        of them, in one call. Each step is the one the steps path takes; only a
        RESERVED intent is taken (else StoreConflict, nothing written: the
        committer re-reads and goes on from the stored state)."""
        if not self.pipelines_with(outbox) or not 1 <= steps <= 3:
            raise StoreInvalid("this outbox cannot be pipelined with this store")
        outbox = outbox.underlying()
        assert isinstance(outbox, MemoryOutbox)
        self._sweep()
        stored = self._unfinished(intent)
        if stored.intent is None or stored.intent.state is not CommitState.RESERVED:
            raise StoreConflict("the intent is past RESERVED")
        self._record(stored, stored.intent)
        if steps == 1:
            return None
        publication = outbox.append(stored.intent)
        if steps == 2:
            return None
        stored.publication = publication
        return self._commit(stored)

    def _commit(self, stored: Commit) -> CommittedMessage:
        """COMMITTED: compact, leave the queue, unpin, register expiries."""
        assert stored.intent is not None
        intent, now = stored.intent, self._clock.now_ms()
        message = intent.committed_message()
        key = _k(intent.key)
        stored.committed, stored.intent = message, None
        stored.identity = as_digest(stored.identity)
        self.state.commits[key] = stored.committed_row()  # untracked (``rows``)
        self.state.queue.pop(key, None)
        self.state.commit_expiry.append((now + self._settings.idempotency_window_ms, key))
        conv_key = (intent.key.tenant, intent.conversation)
        conv = self.state.conversations.get(conv_key)
        if conv is not None and intent.record.seq > conv.wanted_cut:
            conv.unpin(intent.record.seq)  # else: stay pinned until our own retention is due
            conv.trim()
        expires = now + self._settings.history_retention_ms
        self.state.history_expiry.append((expires, conv_key, intent.record.seq))
        return message

    async def _load(self, key: CommitKey) -> StoredCommit | None:
        self._sweep()
        stored = self._stored(_k(key))
        if stored is None:
            return None
        return StoredCommit(
            stored.identity,
            stored.conversation,
            stored.intent,
            stored.committed,
            abandoned=stored.abandoned is not None,
        )

    # --- the recovery queue ------------------------------------------------------

    def _item(self, key: Key3, entry: QueueEntry) -> RecoveryItem | None:
        stored = self.state.commits.get(key)
        if not isinstance(stored, Commit) or stored.intent is None:
            return None
        return RecoveryItem(
            key=CommitKey(*key),
            conversation=stored.conversation,
            created_at_ms=entry.created_at_ms,
            attempts=entry.attempts,
            intent=stored.intent,
            problem=entry.problem,
            quarantined=entry.quarantined,
        )

    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[RecoveryItem]:
        self._sweep()
        due = (
            (entry.due_ms, entry.created_at_ms, key)
            for key, entry in self.state.queue.items()
            if not entry.quarantined and entry.due_ms < older_than_ms
        )
        found = []
        for _, _, key in heapq.nsmallest(max(0, max_items), due):
            item = self._item(key, self.state.queue[key])
            if item is not None:
                found.append(item)
        return found

    async def defer_recovery(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None:
        entry = self.state.queue.get(_k(item.key))
        if entry is None or entry.created_at_ms != item.created_at_ms:
            return  # committed, or a new intent for this key since the scan
        entry.attempts = item.attempts + 1
        entry.problem = problem
        entry.quarantined = quarantine
        entry.due_ms = self._clock.now_ms() + retry_after_ms

    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        keys = sorted(k for k, e in self.state.queue.items() if e.quarantined)
        start = 0
        if after:
            last = tuple(after.split("\x1f"))
            if len(last) != 3:
                raise StoreInvalid("page token is not one this store issued")
            start = bisect.bisect_right(keys, last)
        page = keys[start : start + limit]
        items = [i for k in page if (i := self._item(k, self.state.queue[k])) is not None]
        more = start + limit < len(keys)
        return QuarantinePage(tuple(items), "\x1f".join(page[-1]) if more and page else "")

    async def recovery_item(self, key: CommitKey) -> RecoveryItem | None:
        entry = self.state.queue.get(_k(key))
        return None if entry is None else self._item(_k(key), entry)

    async def release_quarantined(self, key: CommitKey) -> bool:
        entry = self.state.queue.get(_k(key))
        if entry is None or not entry.quarantined:
            return False
        entry.quarantined, entry.attempts = False, 0
        entry.due_ms = min(entry.created_at_ms, self._clock.now_ms())
        return True

    async def abandon_quarantined(self, key: CommitKey, operator: str, reason: str) -> Abandonment:
        self._sweep()
        k = _k(key)
        stored, entry = self._stored(k), self.state.queue.get(k)
        if stored is not None and stored.abandoned is not None:
            return replace(stored.abandoned, outcome=AbandonOutcome.ALREADY_ABANDONED)
        if stored is None or stored.intent is None or entry is None or not entry.quarantined:
            return Abandonment(AbandonOutcome.NOT_QUARANTINED)
        now, seq = self._clock.now_ms(), stored.intent.record.seq
        audit = Abandonment(
            AbandonOutcome.ABANDONED, stored.conversation, seq, now, operator, reason
        )
        stored.intent, stored.publication, stored.abandoned = None, None, audit
        stored.identity = as_digest(stored.identity)
        del self.state.queue[k]
        self.state.commit_expiry.append((now + self._settings.idempotency_window_ms, k))
        conv = self.state.conversations.get((key.tenant, stored.conversation))
        if conv is not None:
            conv.abandon(seq)
        return audit

    async def recovery_stats(self) -> RecoveryStats:
        queue = self.state.queue.values()
        oldest = min((e.created_at_ms for e in queue if not e.quarantined), default=None)
        return RecoveryStats(oldest, sum(1 for e in queue if e.quarantined))

    # --- history and readiness ---------------------------------------------------

    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        self._sweep()
        conv = self._members.conversation(query.tenant, query.conversation)
        reader = reader_of(conv.intervals.get(query.actor, ()))
        seqs = conv.seqs
        if query.direction is Direction.BACKWARD:
            end = bisect.bisect_left(seqs, query.anchor_seq) if query.anchor_seq else len(seqs)
            chosen = reversed(seqs[max(0, end - query.limit - 1) : end])
        else:
            start = bisect.bisect_right(seqs, query.anchor_seq)
            chosen = iter(seqs[start : start + query.limit + 1])
        return build_page(
            query,
            ((record_of(conv.history[s]), conv.reading_versions.get(s, 0)) for s in chosen),
            reader=reader,
            available_from_seq=conv.available_from,
            last_seq=conv.last_seq,
            abandoned=conv.abandoned,
        )

    async def readiness(self) -> None:
        return None  # the dependency is this process; the bootstrap logs NOT_DURABLE
