"""The delivery ports (DESIGN §10): outbox partitions, mailboxes, the per-user
conversation index and history records, one implementation per backend.

``DeliveryPorts`` bundles them for one backend. Every port raises only the
StoreError family; texts never carry keys, addresses or message bodies.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from service.domain.errors import StoreNotReplicated
from service.domain.lane_marks import LaneMark
from service.domain.mailbox import (
    LaneRead,
    LaneState,
    Mailbox,
    MailboxCursor,
    MailboxItem,
    MailboxPage,
    Reader,
    build_page,
)
from service.domain.model import MessageRecord
from service.domain.relay import DeadLetter, Fence, Lease, PartitionEntry, Settlement


@dataclass(frozen=True, slots=True)
class MailboxSettings:
    """Retention of every mailbox lane."""

    retention_ms: int = 7 * 86_400_000
    """Entries appended longer ago than this are trimmed (the watermark moves)."""
    max_entries: int = 10_000
    """A lane keeps at most this many entries; older groups are trimmed."""
    dedupe_window_ms: int = 86_400_000
    """How long a lane remembers the message id of an entry trimmed by count (or
    by hand) after its group was appended, so a redelivery is still deduped;
    the relay and requeue refuse messages older than the window
    (``service.domain.mailbox.dedupe_cut``, ``too_old_to_deliver``)."""

    @property
    def dedupe_ms(self) -> int:
        """The window in force: never longer than retention (an age trim forgets
        the ids of what it trims)."""
        return min(self.dedupe_window_ms, self.retention_ms)

    def validate(self) -> MailboxSettings:
        if self.retention_ms <= 0 or self.max_entries <= 0 or self.dedupe_window_ms <= 0:
            raise ValueError("mailbox retention, size and dedupe window must be positive")
        return self


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    """What a backend's delivery side is opened with."""

    mailbox: MailboxSettings = MailboxSettings()
    outbox_retention_ms: int = 86_400_000
    """Delivered outbox entries are kept this long, then trimmed (Redis streams;
    Scylla hour buckets, once every entry in them is settled)."""
    settle_window_ms: int = 10_000
    """Scylla: entries younger than this are delivered but not yet acknowledged
    (a writer with a slower clock may still add one before them)."""
    dead_letter_retention_ms: int = 30 * 86_400_000
    """Dead letters older than this are dropped by the relay, counted and logged
    (``OutboxPartitions.trim_dead_letters``)."""


@dataclass(frozen=True, slots=True)
class DeadLetterTrim:
    """What one trim of a partition's dead letters did."""

    dropped: int
    """Letters older than the retention that this trim deleted."""
    held: int
    """Letters the partition still holds after it."""


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """Items for one mailbox; they become one group (duplicates left out)."""

    mailbox: Mailbox
    items: tuple[MailboxItem, ...]
    floor: LaneMark | None = None
    """The highest (epoch, head) the writer saw this lane at: a lane below it
    moved backwards, and the append is refused (``moved_back``), nothing written."""

    def with_floor(self, floor: LaneMark | None) -> AppendRequest:
        """This request with ``floor``: made per mailbox per relay step, so built
        directly (``dataclasses.replace`` cost twice as much; keep it in step
        with the fields)."""
        return AppendRequest(self.mailbox, self.items, floor)


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """What one append did: how many entries it added (from ``first_seq``) and how
    many items were already there; ``fenced`` when it was refused for an old token,
    ``moved_back`` when the lane was below the request's floor. ``epoch`` and
    ``head`` are the lane's after the append (or when it was refused for its floor)."""

    added: int = 0
    duplicates: int = 0
    first_seq: int = 0
    fenced: bool = False
    epoch: int = 0
    head: int = 0
    moved_back: bool = False


class AppendNotReplicated(StoreNotReplicated):
    """The appends were applied on the primary, so readers may have seen them, but
    too few replicas acknowledged them in time. ``outcomes`` (one per request) says
    what they did: the writer still learns each lane's head, and a failover that
    loses those entries is then seen as the lane moving back."""

    def __init__(self, message: str, outcomes: Sequence[AppendOutcome]) -> None:
        super().__init__(message)
        self.outcomes = tuple(outcomes)


class MailboxStore(abc.ABC):
    """Per-mailbox lanes with gap-free seqs, dedupe by message id and fencing."""

    settings: MailboxSettings
    """Retention and the dedupe window the store trims by (the relay refuses what
    the window no longer covers)."""

    @abc.abstractmethod
    async def append(self, requests: Sequence[AppendRequest], fence: Fence) -> list[AppendOutcome]:
        """Each request in one atomic step of its mailbox: refuse it (``fenced``)
        when the mailbox has seen a newer token of ``fence.partition``, or
        (``moved_back``) when the lane's (epoch, head) is below the request's
        ``floor`` (``service.domain.lane_marks.moved_back``); else record the
        token, leave out the items whose message id the lane holds or still
        remembers (trimmed within the dedupe window: ``mailbox.dedupe_cut``),
        give the others the next seqs as one group, and trim by retention.
        Requests are independent: an error may leave some applied."""

    @abc.abstractmethod
    async def _read(self, mailbox: Mailbox, after_seq: int, limit: int) -> LaneRead:
        """The lane's state and its entries after ``after_seq`` (see LaneRead), atomically."""

    async def sync(
        self,
        mailbox: Mailbox,
        cursor: MailboxCursor,
        limit: int,
        max_bytes: int,
        reader: Reader = None,
    ) -> MailboxPage:
        """One page after ``cursor`` as ``reader`` sees it (``build_page``;
        CursorExpired when it cannot continue)."""
        read = await self._read(mailbox, cursor.seq, limit)
        return build_page(mailbox.lane, cursor, read, limit, max_bytes, reader)

    @abc.abstractmethod
    async def lane_state(self, mailboxes: Sequence[Mailbox]) -> list[LaneState]:
        """Each mailbox's epoch, head and watermark (for hints)."""

    @abc.abstractmethod
    async def contains(
        self, queries: Sequence[tuple[Mailbox, tuple[str, ...]]]
    ) -> list[frozenset[str]]:
        """For each (mailbox, message ids): the ids its lane holds or remembers now
        (an entry trimmed within the dedupe window was delivered)."""

    @abc.abstractmethod
    async def trim(self, mailbox: Mailbox, through_seq: int) -> LaneState:
        """Trim every group ending at or below ``through_seq`` now."""

    @abc.abstractmethod
    async def new_epoch(self, mailbox: Mailbox, above: int = 0) -> LaneState:
        """Start the lane's next epoch, empty (after a restore or a rebuild): one
        above both its current epoch and ``above`` (an epoch seen before a roll-back)."""

    async def readiness(self) -> None:
        return None


class OutboxPartitions(abc.ABC):
    """The outbox as partitions that relays lease (one implementation per backend).

    Entries of one conversation are in one partition, in publication order.
    Every method that changes a partition takes the caller's lease and raises
    LeaseLost unless its token is the partition's latest.
    """

    @abc.abstractmethod
    def partitions(self) -> tuple[str, ...]:
        """Every partition, legacy ones first."""

    @abc.abstractmethod
    async def acquire(self, partition: str, owner: str, ttl_ms: int) -> Lease | None:
        """Renew ``owner``'s live lease (same token), or take a free or expired one
        (token + 1, ``taken_over``); None while another owner's lease is live."""

    @abc.abstractmethod
    async def release(self, lease: Lease) -> None:
        """Let the lease go now (nothing when it is not the latest any more)."""

    @abc.abstractmethod
    async def unsettled(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        """The oldest entries claimed under any token and not settled (sending or
        retryable), now held by this lease: what a new holder reconciles first."""

    @abc.abstractmethod
    async def claim(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        """The next pending entries, now sending under this lease."""

    @abc.abstractmethod
    async def settle(self, lease: Lease, settlement: Settlement) -> None:
        """Record sent, retryable and dead-lettered entries in one step;
        IllegalTransition for an entry that is not this lease's to settle."""

    @abc.abstractmethod
    async def oldest_pending_ms(self, lease: Lease) -> int | None:
        """Publication time of the oldest entry not yet sent (relay lag); None when
        the partition is drained."""

    @abc.abstractmethod
    async def dead_letters(
        self, partition: str, after: str, limit: int
    ) -> tuple[list[DeadLetter], str]:
        """Dead letters in order from the token ``after`` ("" = start), and the next token."""

    @abc.abstractmethod
    async def requeue(self, partition: str, letters: Sequence[str]) -> int:
        """Move the named dead letters back into the partition as new pending
        entries (an operator action; mailboxes dedupe what was delivered
        already). Returns how many were moved."""

    @abc.abstractmethod
    async def trim_dead_letters(self, lease: Lease) -> DeadLetterTrim:
        """Drop the partition's dead letters older than the dead-letter retention
        (LeaseLost unless the lease is the latest); what was dropped and what is held."""

    @abc.abstractmethod
    async def relays(self, owner: str, ttl_ms: int) -> int:
        """Announce ``owner`` as a live relay for ``ttl_ms``; the number of live relays."""

    has_doorbell: bool = False
    """True when ``wait`` really waits for new entries (else the caller polls)."""

    async def wait(self, partitions: Sequence[str], timeout_ms: int) -> Sequence[str]:
        """Wait until some of these partitions may have entries their last claim
        did not see, at most ``timeout_ms``; return those partitions (none after
        a timeout). Only with ``has_doorbell``; the default returns them all at once."""
        return partitions

    async def readiness(self) -> None:
        return None


class ConversationIndex(abc.ABC):
    """user -> conversations, maintained next to membership (never authoritative
    alone: every listed entry is confirmed by an admission lookup on read)."""

    @abc.abstractmethod
    async def add(self, tenant: str, conversation: str, users: Sequence[str]) -> None:
        """Index ``users`` as members of ``conversation`` (idempotent)."""

    @abc.abstractmethod
    async def remove(self, tenant: str, conversation: str, users: Sequence[str]) -> None:
        """Drop the entries (idempotent)."""

    @abc.abstractmethod
    async def conversations(
        self, tenant: str, user: str, after: str, limit: int
    ) -> tuple[tuple[str, ...], str]:
        """Indexed conversations of ``user`` sorted after ``after``, at most
        ``limit``, and where to continue ("" at the end)."""

    @abc.abstractmethod
    async def record_left(
        self, tenant: str, conversation: str, users: Sequence[str], version: int, at_ms: int
    ) -> None:
        """Remember that ``users`` left ``conversation`` at membership ``version``
        and server time ``at_ms`` (idempotent; a later departure replaces or
        joins an earlier one)."""

    @abc.abstractmethod
    async def left(
        self, tenant: str, user: str, after: LeftMark, limit: int
    ) -> tuple[tuple[LeftConversation, ...], LeftMark | None]:
        """Departures of ``user`` ordered by (time, conversation) strictly after
        ``after``, at most ``limit``, and where to continue (None at the end).
        Never authoritative alone: the reader confirms the user is not a member now."""


@dataclass(frozen=True, slots=True, order=True)
class LeftMark:
    """A position in a user's departures: (left at ms, conversation)."""

    at_ms: int
    conversation: str = ""


@dataclass(frozen=True, slots=True)
class LeftConversation:
    """A conversation a user left: when, and the membership version that removal made."""

    conversation: str
    version: int
    at_ms: int

    @property
    def mark(self) -> LeftMark:
        return LeftMark(self.at_ms, self.conversation)


class HistoryRecords(abc.ABC):
    """Committed records by seq, for the relay (no reader to authorise)."""

    @abc.abstractmethod
    async def records(
        self, tenant: str, conversation: str, seqs: Sequence[int]
    ) -> dict[int, MessageRecord]:
        """The records history holds at ``seqs`` (absent ones: trimmed or expired)."""


@dataclass
class DeliveryPorts:
    """The delivery side of one backend."""

    mailbox: MailboxStore
    partitions: OutboxPartitions
    index: ConversationIndex
    records: HistoryRecords
    shared: bool = True
    """False for a backend whose data lives in one process (memory): its relay
    runs inside ``serve``."""

    async def readiness(self) -> None:
        await self.mailbox.readiness()
        await self.partitions.readiness()


__all__ = [
    "AppendNotReplicated",
    "AppendOutcome",
    "AppendRequest",
    "ConversationIndex",
    "DeadLetterTrim",
    "DeliveryPorts",
    "DeliverySettings",
    "HistoryRecords",
    "LeftConversation",
    "LeftMark",
    "MailboxSettings",
    "MailboxStore",
    "OutboxPartitions",
]
