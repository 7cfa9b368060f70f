"""The storage ports: MessageStore (DESIGN §4), MembershipStore and Outbox.

A backend subclasses these; the bookkeeping that is the same for every
backend (load and identity comparison, the default two-step commit) lives
here so a backend fills in only its own small hooks.
"""

from __future__ import annotations

import abc
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from service.domain.errors import StoreNotFound
from service.domain.ids import CommitKey
from service.domain.model import (
    AuthenticatedSend,
    CommitIntent,
    Committed,
    CommittedMessage,
    Conflict,
    FrozenDeliveryInput,
    HistoryPage,
    HistoryQuery,
    InProgress,
    LoadedCommit,
    MemberPage,
    Membership,
    OutboxEntry,
    OutboxPublication,
    ReserveCandidate,
    ReserveResult,
)

DAY_MS = 86_400_000


class Clock(Protocol):
    """Where stores and the committer read "now" (epoch milliseconds)."""

    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock time."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


@dataclass
class ManualClock:
    """A clock tests move by hand."""

    now: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Retention settings every backend honours."""

    idempotency_window_ms: int = 7 * DAY_MS
    """How long a COMMITTED record (and so ACK replay) is kept. Unfinished
    intents never expire."""

    history_retention_ms: int = 30 * DAY_MS
    """How long a committed message stays readable in history, from commit."""


@dataclass(frozen=True, slots=True)
class StoredCommit:
    """What a backend read for one key, before any interpretation.

    ``intent`` is None once the record was compacted at COMMITTED; then
    ``committed`` carries the coordinates.
    """

    identity: bytes
    conversation: str
    intent: CommitIntent | None
    committed: CommittedMessage | None


class MessageStore(abc.ABC):
    """The commit fact source. Every step is conditional, retry-safe, forward-only."""

    atomic_publish_commit: bool = False
    """True when ``mark_published_and_committed`` is one atomic backend step."""

    @abc.abstractmethod
    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        """Persist the intent and allocate a seq on the key's first call.

        Later calls return the stored coordinates (InProgress / Committed) or
        Conflict when the stored identity differs; they consume nothing.
        """

    @abc.abstractmethod
    async def put_record(self, intent: CommitIntent) -> None:
        """Write exactly ``intent.record`` into history (RESERVED → RECORDED)."""

    @abc.abstractmethod
    async def mark_outbox_published(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> None:
        """RECORDED → OUTBOXED with ``publication``; same value retry-safe,
        a different publication raises StoreConflict."""

    @abc.abstractmethod
    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        """OUTBOXED → COMMITTED; only with evidence of record and publication."""

    async def mark_published_and_committed(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> CommittedMessage:
        """RECORDED + publication → COMMITTED.

        Backends with an atomic step override this (and set
        ``atomic_publish_commit``). The default is the two-step path: if the
        second step fails, OUTBOXED with its publication stays recoverable.
        """
        await self.mark_outbox_published(intent, publication)
        return await self.mark_committed(intent.advanced(intent.state, publication))

    @abc.abstractmethod
    async def _load(self, key: CommitKey) -> StoredCommit | None:
        """Read whatever is stored for ``key`` (expired committed records: None)."""

    async def load_commit(self, key: CommitKey, conversation: str) -> LoadedCommit | None:
        """The key's state within ``conversation``; a key of another
        conversation reads as absent."""
        stored = await self._load(key)
        if stored is None or stored.conversation != conversation:
            return None
        return _interpret(stored)

    async def load_commit_for_request(self, request: AuthenticatedSend) -> LoadedCommit | None:
        """The key's state if its durable identity is this request's, else Conflict."""
        stored = await self._load(request.key)
        if stored is None:
            return None
        if not request.matches_identity(stored.identity):
            return Conflict(request.key)
        return _interpret(stored)

    @abc.abstractmethod
    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[CommitIntent]:
        """Unfinished intents created before ``older_than_ms``, oldest first,
        at most ``max_items``, read from a recovery index (never a full scan)."""

    @abc.abstractmethod
    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        """One page of history, after authorising ``query.actor`` as a member."""

    @abc.abstractmethod
    async def readiness(self) -> None:
        """Touch the real dependency; raise StoreUnavailable when it fails."""

    async def close(self) -> None:
        """Release connections. Idempotent."""
        return None


def _interpret(stored: StoredCommit) -> LoadedCommit:
    if stored.committed is not None:
        return Committed(stored.committed)
    assert stored.intent is not None
    return InProgress(stored.intent)


class MembershipStore(abc.ABC):
    """Conversations and their members, with a version bumped on every change."""

    @abc.abstractmethod
    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> Membership:
        """Create at version 1; StoreAlreadyExists when it exists."""

    @abc.abstractmethod
    async def add_members(self, tenant: str, conversation: str, users: Iterable[str]) -> Membership:
        """Add users (already-members are ignored); the version moves only on change."""

    @abc.abstractmethod
    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> Membership:
        """Remove users (non-members are ignored); the version moves only on change."""

    @abc.abstractmethod
    async def membership(self, tenant: str, conversation: str) -> Membership | None:
        """The current membership, or None when the conversation does not exist."""

    async def list_members(
        self, tenant: str, conversation: str, page_token: str, limit: int
    ) -> MemberPage:
        """Members sorted by id, after ``page_token`` (the last id of the previous page)."""
        current = await self.membership(tenant, conversation)
        if current is None:
            raise StoreNotFound("conversation not found")
        ordered = sorted(m for m in current.members if m > page_token)
        page = tuple(ordered[:limit])
        more = len(ordered) > limit
        return MemberPage(page, current.version, page[-1] if more and page else "")


class Outbox(abc.ABC):
    """Hands committed messages to downstream delivery, at least once."""

    @abc.abstractmethod
    async def publish(self, intent: CommitIntent) -> OutboxPublication:
        """Append the record's delivery entry; return its durable position."""

    @abc.abstractmethod
    async def read(self, after: str, limit: int) -> list[OutboxEntry]:
        """Entries after position ``after`` ("" = from the start), in order."""

    @abc.abstractmethod
    async def readiness(self) -> None:
        """Touch the real dependency; raise StoreUnavailable when it fails."""


@dataclass
class Backend:
    """One wired backend: the three ports over one dependency."""

    name: str
    store: MessageStore
    membership: MembershipStore
    outbox: Outbox
    durable: bool
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    """Backend requests issued, by kind ("redis_call", "lwt", "statement"...);
    the backend increments it, the metrics layer exports it."""

    async def close(self) -> None:
        for close in self.closers:
            await close()
        self.closers.clear()
