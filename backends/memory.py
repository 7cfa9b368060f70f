"""The memory backend: embedded, complete, and NOT durable.

Everything lives in one ``MemoryState`` held by the process; a restart of
the process loses it all. Each operation runs without awaiting in between,
so on one event loop every transition is atomic, including
``mark_published_and_committed``.

Layout (every map is keyed by tuples, so ids never collide across tenants):

* ``commits[(tenant, sender, cmid)]``: the intent until COMMITTED, then the
  compact form (identity digest, coordinates, publication, expiry);
* ``conversations[(tenant, conversation)]``: members, membership version,
  the last allocated seq, history by seq, the first still-available seq;
* ``recovery``: unfinished keys in reserve order, for bounded scans;
* ``outbox``: a list; a publication's position is its 1-based index.

Retention is swept lazily at the start of each operation: committed records
past the idempotency window are dropped; history expires as a prefix (when
a record expires, every lower seq goes with it and ``available_from_seq``
moves past it), so a page can always tell "expired" from "a gap".
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from service.domain.errors import (
    StoreAlreadyExists,
    StoreConflict,
    StoreForbidden,
    StoreNotFound,
)
from service.domain.history import build_page
from service.domain.identity import as_digest
from service.domain.ids import CommitKey
from service.domain.model import (
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
    Membership,
    MessageRecord,
    OutboxEntry,
    OutboxPublication,
    ReserveCandidate,
    Reserved,
    ReserveResult,
)
from service.domain.ports import (
    Backend,
    Clock,
    MembershipStore,
    MessageStore,
    Outbox,
    StoredCommit,
    StoreSettings,
    SystemClock,
)

log = logging.getLogger(__name__)

STREAM = "memory"
NOT_DURABLE = "memory backend: not durable, every message is lost when the process stops"


@dataclass
class _Commit:
    identity: bytes
    conversation: str
    intent: CommitIntent | None
    committed: CommittedMessage | None = None
    publication: OutboxPublication | None = None


@dataclass
class _Conversation:
    members: set[str]
    version: int = 1
    last_seq: int = 0
    available_from: int = 1
    seqs: list[int] = field(default_factory=list)
    history: dict[int, MessageRecord] = field(default_factory=dict)


@dataclass
class MemoryState:
    """All data of one memory backend; survives a close/reopen of the stores."""

    commits: dict[tuple[str, str, str], _Commit] = field(default_factory=dict)
    conversations: dict[tuple[str, str], _Conversation] = field(default_factory=dict)
    recovery: dict[tuple[str, str, str], int] = field(default_factory=dict)
    commit_expiry: deque[tuple[int, tuple[str, str, str]]] = field(default_factory=deque)
    history_expiry: deque[tuple[int, tuple[str, str], int]] = field(default_factory=deque)
    outbox: list[OutboxEntry] = field(default_factory=list)


def _k(key: CommitKey) -> tuple[str, str, str]:
    return (key.tenant, key.sender, key.cmid)


class MemoryMessageStore(MessageStore, MembershipStore):
    """MessageStore and MembershipStore over a MemoryState."""

    atomic_publish_commit = True

    def __init__(
        self,
        state: MemoryState | None = None,
        settings: StoreSettings | None = None,
        clock: Clock | None = None,
        identity_form: Literal["digest", "whole"] = "digest",
    ) -> None:
        self.state = state if state is not None else MemoryState()
        self._settings = settings or StoreSettings()
        self._clock = clock or SystemClock()
        self._whole_identity = identity_form == "whole"  # what versions < 1 wrote

    # --- retention ---------------------------------------------------------

    def _sweep(self) -> None:
        now, s = self._clock.now_ms(), self.state
        while s.commit_expiry and s.commit_expiry[0][0] <= now:
            _, key = s.commit_expiry.popleft()
            stored = s.commits.get(key)
            if stored is not None and stored.committed is not None:
                del s.commits[key]
        while s.history_expiry and s.history_expiry[0][0] <= now:
            _, conv_key, seq = s.history_expiry.popleft()
            conv = s.conversations.get(conv_key)
            if conv is None or seq < conv.available_from:
                continue
            cut = bisect.bisect_right(conv.seqs, seq)
            for old in conv.seqs[:cut]:
                del conv.history[old]
            del conv.seqs[:cut]
            conv.available_from = seq + 1

    # --- MessageStore --------------------------------------------------------

    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        self._sweep()
        key = _k(request.key)
        existing = self.state.commits.get(key)
        if existing is not None:
            if not request.matches_identity(existing.identity):
                return Conflict(request.key)
            if existing.committed is not None:
                return Committed(existing.committed)
            assert existing.intent is not None
            return InProgress(existing.intent)
        conv = self._conversation(request.tenant, request.conversation)
        conv.last_seq += 1
        record = request.record_at(conv.last_seq, candidate)
        identity = request.stored_identity(self._whole_identity)
        intent = CommitIntent(
            key=request.key,
            identity=identity,
            record=record,
            delivery=delivery,
            state=CommitState.RESERVED,
            created_at_ms=self._clock.now_ms(),
        )
        self.state.commits[key] = _Commit(identity, request.conversation, intent)
        self.state.recovery[key] = intent.created_at_ms
        return Reserved(intent)

    def _unfinished(self, intent: CommitIntent) -> _Commit:
        """The stored commit for ``intent``, checked to be the same intent."""
        stored = self.state.commits.get(_k(intent.key))
        if stored is None:
            raise StoreConflict("no intent for this key")
        current = stored.intent.record if stored.intent else None
        if stored.committed is not None:
            if stored.committed.message_id != intent.record.message_id:
                raise StoreConflict("intent does not match the stored one")
        elif current != intent.record:
            raise StoreConflict("intent does not match the stored one")
        return stored

    async def put_record(self, intent: CommitIntent) -> None:
        self._sweep()
        stored = self._unfinished(intent)
        if stored.intent is None or stored.intent.state is not CommitState.RESERVED:
            return  # already recorded: retry-safe
        record = stored.intent.record
        conv = self._conversation(record.tenant, record.conversation)
        if record.seq not in conv.history:
            bisect.insort(conv.seqs, record.seq)
            conv.history[record.seq] = record
        stored.intent = stored.intent.advanced(CommitState.RECORDED)

    def _has_record(self, intent: CommitIntent) -> bool:
        r = intent.record
        conv = self.state.conversations.get((r.tenant, r.conversation))
        return conv is not None and conv.history.get(r.seq) == r

    def _check_publication(self, stored: _Commit, publication: OutboxPublication) -> bool:
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
        self, intent: CommitIntent, publication: OutboxPublication
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

    def _commit(self, stored: _Commit) -> CommittedMessage:
        """COMMITTED: compact, drop the recovery candidate, register expiries."""
        assert stored.intent is not None
        intent, now = stored.intent, self._clock.now_ms()
        message = intent.committed_message()
        key = _k(intent.key)
        stored.committed, stored.intent = message, None
        stored.identity = as_digest(stored.identity)
        self.state.recovery.pop(key, None)
        self.state.commit_expiry.append((now + self._settings.idempotency_window_ms, key))
        conv_key = (intent.key.tenant, intent.conversation)
        expires = now + self._settings.history_retention_ms
        self.state.history_expiry.append((expires, conv_key, intent.record.seq))
        return message

    async def _load(self, key: CommitKey) -> StoredCommit | None:
        self._sweep()
        stored = self.state.commits.get(_k(key))
        if stored is None:
            return None
        return StoredCommit(stored.identity, stored.conversation, stored.intent, stored.committed)

    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[CommitIntent]:
        self._sweep()
        found: list[CommitIntent] = []
        for key, created in self.state.recovery.items():  # reserve order = age order
            if created >= older_than_ms or len(found) >= max_items:
                break
            intent = self.state.commits[key].intent
            if intent is not None:
                found.append(intent)
        return found

    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        self._sweep()
        conv = self._conversation(query.tenant, query.conversation)
        if query.actor not in conv.members:
            raise StoreForbidden("reader is not a member of the conversation")
        seqs = conv.seqs
        if query.direction is Direction.BACKWARD:
            end = bisect.bisect_left(seqs, query.anchor_seq) if query.anchor_seq else len(seqs)
            chosen = reversed(seqs[max(0, end - query.limit - 1) : end])
        else:
            start = bisect.bisect_right(seqs, query.anchor_seq)
            chosen = iter(seqs[start : start + query.limit + 1])
        return build_page(
            query,
            (conv.history[s] for s in chosen),
            available_from_seq=conv.available_from,
            last_seq=conv.last_seq,
        )

    async def readiness(self) -> None:
        return None  # the dependency is this process; the bootstrap logs NOT_DURABLE

    # --- MembershipStore -----------------------------------------------------

    def _conversation(self, tenant: str, conversation: str) -> _Conversation:
        conv = self.state.conversations.get((tenant, conversation))
        if conv is None:
            raise StoreNotFound("conversation not found")
        return conv

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> Membership:
        if (tenant, conversation) in self.state.conversations:
            raise StoreAlreadyExists("conversation already exists")
        conv = _Conversation(set(members))
        self.state.conversations[(tenant, conversation)] = conv
        return Membership(tenant, conversation, frozenset(conv.members), conv.version)

    async def add_members(self, tenant: str, conversation: str, users: Iterable[str]) -> Membership:
        conv = self._conversation(tenant, conversation)
        new = set(users) - conv.members
        if new:
            conv.members |= new
            conv.version += 1
        return Membership(tenant, conversation, frozenset(conv.members), conv.version)

    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> Membership:
        conv = self._conversation(tenant, conversation)
        gone = set(users) & conv.members
        if gone:
            conv.members -= gone
            conv.version += 1
        return Membership(tenant, conversation, frozenset(conv.members), conv.version)

    async def membership(self, tenant: str, conversation: str) -> Membership | None:
        conv = self.state.conversations.get((tenant, conversation))
        if conv is None:
            return None
        return Membership(tenant, conversation, frozenset(conv.members), conv.version)


class MemoryOutbox(Outbox):
    """A list standing in for a stream; positions are 1-based indexes."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    async def publish(self, intent: CommitIntent) -> OutboxPublication:
        entries = self._state.outbox
        publication = OutboxPublication(STREAM, str(len(entries) + 1))
        r = intent.record
        entries.append(
            OutboxEntry(
                publication,
                r.tenant,
                r.conversation,
                r.seq,
                r.message_id,
                intent.delivery.recipients,
            )
        )
        return publication

    async def read(self, after: str, limit: int) -> list[OutboxEntry]:
        start = int(after) if after else 0
        return self._state.outbox[start : start + limit]

    async def readiness(self) -> None:
        return None


def open_memory_backend(
    state: MemoryState | None = None,
    settings: StoreSettings | None = None,
    clock: Clock | None = None,
    identity_form: Literal["digest", "whole"] = "digest",
) -> Backend:
    """A memory backend; pass the ``state`` of a closed one to "reopen" it."""
    store = MemoryMessageStore(state, settings, clock, identity_form)
    return Backend(
        name="memory",
        store=store,
        membership=store,
        outbox=MemoryOutbox(store.state),
        durable=False,
    )
