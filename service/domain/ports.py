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
from typing import TYPE_CHECKING, Protocol

from service.domain.ids import CommitKey
from service.domain.model import (
    Abandoned,
    Abandonment,
    Admission,
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
    MembershipInfo,
    MembersSlice,
    OutboxPage,
    OutboxPublication,
    QuarantinePage,
    RecoveryItem,
    RecoveryStats,
    ReserveCandidate,
    ReserveResult,
)

if TYPE_CHECKING:
    from service.domain.delivery import DeliveryPorts

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
class OffsetClock:
    """Wall-clock time plus a fixed offset: a replica whose clock is wrong
    (``MC_TEST_CLOCK_OFFSET``; tests and the nemesis only)."""

    offset_ms: int

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Retention settings every backend honours."""

    idempotency_window_ms: int = 7 * DAY_MS
    """How long a COMMITTED record (and so ACK replay) is kept. Unfinished
    intents never expire."""

    history_retention_ms: int = 30 * DAY_MS
    """How long a committed message stays readable in history, from commit.
    Never shorter than the idempotency window (``validate``)."""

    def validate(self) -> StoreSettings:
        """Refuse a retention that would drop a record whose key still replays."""
        if self.idempotency_window_ms <= 0 or self.history_retention_ms <= 0:
            raise ValueError("retention and the idempotency window must be positive")
        if self.history_retention_ms < self.idempotency_window_ms:
            raise ValueError(
                "history retention must be at least the idempotency window: a replayed ACK"
                " must point at a record history still holds"
            )
        return self


@dataclass(frozen=True, slots=True)
class StoredCommit:
    """What a backend read for one key, before any interpretation.

    ``intent`` is None once the record was compacted at COMMITTED; then
    ``committed`` carries the coordinates. ``abandoned``: an operator abandoned
    the key's quarantined intent (``intent`` and ``committed`` are None).
    """

    identity: bytes
    conversation: str
    intent: CommitIntent | None
    committed: CommittedMessage | None
    abandoned: bool = False


Hook = Callable[[], None]


class MessageStore(abc.ABC):
    """The commit fact source. Every step is conditional, retry-safe, forward-only."""

    atomic_publish_commit: bool = False
    """True when ``mark_published_and_committed`` is one atomic backend step (a
    capability the store declares; the committer does not branch on it)."""

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
        self, intent: CommitIntent, publication: OutboxPublication, between: Hook | None = None
    ) -> CommittedMessage:
        """RECORDED + publication → COMMITTED.

        Backends with an atomic step override this (and set
        ``atomic_publish_commit``); they never call ``between``. The default is
        the two-step path, with ``between`` called after the publish-mark (the
        committer's M-COMMIT-05): if the second step fails, OUTBOXED with its
        publication stays recoverable.
        """
        await self.mark_outbox_published(intent, publication)
        if between is not None:
            between()
        return await self.mark_committed(intent.advanced(intent.state, publication))

    # --- fewer round trips (optional capabilities; the defaults decline) ------------

    admits_in_reserve: bool = False
    """True when ``reserve_admitted`` checks the sender's admission inside reserve
    (one step instead of a membership read, then reserve)."""

    async def reserve_admitted(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput | None,
        candidate: ReserveCandidate,
    ) -> ReserveResult | Admission | None:
        """``reserve``, with the sender's admission at the current membership
        version decided in the same step, after the key's stored state (a known
        key is answered whatever the membership says, as ``before_admission``
        would). ``delivery`` None: frozen at the version the step read. Returns
        an Admission (not a member) or None (no conversation) when it refused;
        then nothing was written. Only called when ``admits_in_reserve``."""
        raise NotImplementedError

    def pipelines_with(self, outbox: Outbox) -> bool:
        """True when ``finish_pipelined`` can send a RESERVED intent's remaining
        steps through ``outbox`` together (the committer asks before each use)."""
        return False

    async def finish_pipelined(
        self, intent: CommitIntent, outbox: Outbox, steps: int = 3
    ) -> CommittedMessage | None:
        """The first ``steps`` of put_record, the outbox append and
        ``mark_published_and_committed`` for a RESERVED ``intent``, each its own
        conditional step, sent together. Each step checks its precondition where
        it runs and refuses cleanly when the one before did not apply, so a
        refusal leaves RESERVED or RECORDED, which the steps path resumes.
        Returns the CommittedMessage after all three, None after fewer (the
        committer splits there for an armed fault point); StoreConflict when a
        step refused. Only called when ``pipelines_with(outbox)``."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _load(self, key: CommitKey) -> StoredCommit | None:
        """Read whatever is stored for ``key`` (expired committed records: None)."""

    reads_before_admission: bool = False
    """True when ``before_admission`` reads the store; the committer does not call
    it otherwise (its answer would be None, and the call costs a timed step)."""

    async def before_admission(self, request: AuthenticatedSend) -> LoadedCommit | None:
        """The key's state for ``request`` when the backend reads it before reserve
        anyway; the committer then answers a replay, a conflict or an unfinished
        intent without the admission lookup (a committed key replays for a removed
        member too, DESIGN §5). None: nothing known here, ask ``reserve`` (the
        default: backends whose reserve decides in one step need nothing else)."""
        return None

    async def load_commit(self, key: CommitKey, conversation: str) -> LoadedCommit | None:
        """The key's state within ``conversation``; a key of another
        conversation reads as absent."""
        stored = await self._load(key)
        if stored is None or stored.conversation != conversation:
            return None
        return _interpret(key, stored)

    async def load_commit_for_request(self, request: AuthenticatedSend) -> LoadedCommit | None:
        """The key's state if its durable identity is this request's, else Conflict."""
        stored = await self._load(request.key)
        if stored is None:
            return None
        if not stored.abandoned and not request.matches_identity(stored.identity):
            return Conflict(request.key)  # an abandoned key refuses every send alike
        return _interpret(request.key, stored)

    # --- the recovery queue (DESIGN §12) ------------------------------------------

    @abc.abstractmethod
    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[RecoveryItem]:
        """Due items of the recovery queue, read from an index (never a full scan).

        An item is due when it is not quarantined and its due time is before
        ``older_than_ms``: its creation time at first, after a failed attempt
        the retry time ``defer_recovery`` set. Oldest due first, at most
        ``max_items``. An intent that cannot be decoded is returned with
        ``intent=None`` and ``problem`` set: one bad entry never fails a scan.
        """

    @abc.abstractmethod
    async def defer_recovery(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None:
        """Record a failed attempt: ``attempts + 1`` and due again ``retry_after_ms``
        from now (by the store's time), or quarantined. Nothing when the key
        has been committed or reserved anew meanwhile."""

    @abc.abstractmethod
    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        """Quarantined items in a stable order, from the token ``after`` ("" = start)."""

    @abc.abstractmethod
    async def recovery_item(self, key: CommitKey) -> RecoveryItem | None:
        """The queue item of ``key`` (queued or quarantined), or None when the key
        has no unfinished intent."""

    @abc.abstractmethod
    async def release_quarantined(self, key: CommitKey) -> bool:
        """Move a quarantined item back into the queue, due now, attempts 0;
        False when ``key`` is not quarantined."""

    @abc.abstractmethod
    async def abandon_quarantined(self, key: CommitKey, operator: str, reason: str) -> Abandonment:
        """An operator's final word on a quarantined intent, in one atomic step:
        the intent leaves the queue and the quarantine, the key keeps a tombstone
        with the audit record (who, when by the store's time, why) that answers
        Abandoned until the idempotency window has passed, the seq is recorded as
        a permanent history gap and retention's pin on it is released.
        ALREADY_ABANDONED (and the first audit record) for a key abandoned
        before; NOT_QUARANTINED, with nothing written, for any other key."""

    @abc.abstractmethod
    async def recovery_stats(self) -> RecoveryStats:
        """The oldest queued (not quarantined) intent's creation time and the
        quarantine size, from the indexes alone."""

    @abc.abstractmethod
    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        """One page of history, after authorising ``query.actor`` as a member."""

    @abc.abstractmethod
    async def readiness(self) -> None:
        """Touch the real dependency; raise StoreUnavailable when it fails."""

    async def close(self) -> None:
        """Release connections. Idempotent."""
        return None


def _interpret(key: CommitKey, stored: StoredCommit) -> LoadedCommit:
    if stored.abandoned:
        return Abandoned(key)
    if stored.committed is not None:
        return Committed(stored.committed)
    assert stored.intent is not None
    return InProgress(stored.intent)


class MembershipStore(abc.ABC):
    """Conversations and their members, versioned (DESIGN §9).

    Every change makes a new version; a version's member set stays readable
    (``members_at``) so a delivery frozen at it resolves to the same
    recipients forever. Nothing here reads or writes a whole member set at
    once: changes and listings go in pages, admission is a point lookup.
    """

    @abc.abstractmethod
    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipInfo:
        """Create at version 1 with ``members``; StoreAlreadyExists when it exists."""

    @abc.abstractmethod
    async def add_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        """Add users (already-members are ignored); a new version only on change."""

    @abc.abstractmethod
    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        """Remove users (non-members are ignored); a new version only on change."""

    @abc.abstractmethod
    async def admission(self, tenant: str, conversation: str, user: str) -> Admission | None:
        """Is ``user`` a member at the current version (a point lookup)? None when
        the conversation does not exist."""

    @abc.abstractmethod
    async def member_intervals(
        self, tenant: str, conversation: str, user: str
    ) -> tuple[int, ...] | None:
        """The versions ``user`` was a member at, as intervals
        (``service.domain.membership``; () when it never was), a point lookup like
        ``admission``. None when the conversation does not exist."""

    @abc.abstractmethod
    async def members_at(
        self, tenant: str, conversation: str, version: int | None, after: str, limit: int
    ) -> MembersSlice:
        """Members at ``version`` (None: the current one) whose id sorts after
        ``after``, at most ``limit``, in id order. StoreNotFound without the
        conversation, StoreInvalid for a version it never had."""

    @abc.abstractmethod
    async def membership_info(self, tenant: str, conversation: str) -> MembershipInfo | None:
        """The current version and member count, or None without the conversation."""


class Outbox(abc.ABC):
    """Hands committed messages to downstream delivery, at least once."""

    @abc.abstractmethod
    async def publish(self, intent: CommitIntent, sent: Hook | None = None) -> OutboxPublication:
        """Append the record's delivery entry; return its durable position.

        ``sent`` is called once the append has reached the outbox, before its
        position is handed back: the committer's M-COMMIT-03 ("sent, ack not
        seen") fires there, inside the call.
        """

    @abc.abstractmethod
    async def read(self, after: str, limit: int) -> OutboxPage:
        """Entries after the token ``after`` ("" = from the start), partition by
        partition, each in order (for tests and tools; the relay consumes
        partitions with leases)."""

    @abc.abstractmethod
    async def readiness(self) -> None:
        """Touch the real dependency; raise StoreUnavailable when it fails."""

    def underlying(self) -> Outbox:
        """The outbox doing the work: this one, or the one a pass-through wrapper
        (tracing) wraps. A store pipelines with that one (``pipelines_with``), so
        turning tracing on does not change what a commit sends."""
        return self


@dataclass
class Backend:
    """One wired backend: the three ports over one dependency, and its delivery side."""

    name: str
    store: MessageStore
    membership: MembershipStore
    outbox: Outbox
    durable: bool
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    """Backend requests issued, by kind ("redis_call", "lwt", "statement"...);
    the backend increments it, the metrics layer exports it."""
    events: Counter[str] = field(default_factory=Counter)
    """What the backend noticed about itself, by kind (Scylla: "direct_path_refused",
    the direct send path turned off; "direct_timeout", a request it sent got no
    answer in time); exported like ``requests``."""
    delivery: DeliveryPorts | None = None
    """Mailboxes, outbox partitions, the conversation index and history records
    (``service.domain.delivery``); None only for wrappers built by tests."""
    server_time: Callable[[], Awaitable[int]] | None = None
    """The backend's own clock (epoch ms) where it has one (Redis ``TIME``): the
    service takes "now" from it (``service.backend_clock``), never a replica's."""
    clock_offset_ms: Callable[[], float | None] | None = None
    """The backend's clock minus this replica's (ms) as last measured, None before the
    first measurement, where the backend measures it itself (Scylla's skew guard);
    exported as ``message_committer_backend_clock_offset_seconds``."""

    async def close(self) -> None:
        for close in self.closers:
            await close()
        self.closers.clear()
