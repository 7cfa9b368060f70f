"""Everything a memory backend holds, in one ``MemoryState`` (see the package docs)."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from backends.memory.delivery_state import DeliveryState
from backends.memory.outbox_log import OutboxLog
from backends.memory.rows import CommittedRow, RecordRow
from service.domain.membership import Intervals
from service.domain.model import (
    Abandonment,
    CommitIntent,
    CommittedMessage,
    OutboxPublication,
)

Key3 = tuple[str, str, str]
ConvKey = tuple[str, str]


@dataclass
class Commit:
    """One CommitKey until COMMITTED: the intent (or, abandoned, its audit record).
    A committed key is kept as a ``CommittedRow``; ``Commit.of`` reads one back."""

    identity: bytes
    conversation: str
    intent: CommitIntent | None
    committed: CommittedMessage | None = None
    publication: OutboxPublication | None = None
    abandoned: Abandonment | None = None
    """An operator abandoned the quarantined intent: the audit record, kept with
    the key for the idempotency window (``intent`` and ``committed`` are None)."""

    @staticmethod
    def of(stored: Commit | CommittedRow) -> Commit:
        """``stored`` as a Commit: a committed row becomes a read-only view (a
        committed key is never changed, only replaced or dropped)."""
        if isinstance(stored, Commit):
            return stored
        identity, conversation, cmid, message_id, seq, ts, stream, position = stored
        message = CommittedMessage(conversation, cmid, message_id, seq, ts)
        return Commit(identity, conversation, None, message, OutboxPublication(stream, position))

    def committed_row(self) -> CommittedRow:
        """This COMMITTED key's row (its identity already a digest)."""
        m, p = self.committed, self.publication
        assert m is not None and p is not None
        return (
            self.identity, m.conversation, m.cmid, m.message_id, m.seq, m.server_ts_ms,
            p.stream, p.position,
        )  # fmt: skip


@dataclass
class QueueEntry:
    """The recovery queue's bookkeeping for one unfinished key."""

    created_at_ms: int
    due_ms: int
    attempts: int = 0
    problem: str = ""
    quarantined: bool = False


@dataclass
class Conversation:
    """Versioned members, the seq counter and history of one conversation."""

    version: int = 1
    member_count: int = 0
    intervals: dict[str, Intervals] = field(default_factory=dict)
    current: list[str] = field(default_factory=list)
    """The members now, sorted: the order members are listed in."""
    removals: list[tuple[int, str]] = field(default_factory=list)
    """(version, user) of each removal, in version order; a user re-added or removed
    again since is skipped when read (its intervals say so)."""
    last_seq: int = 0
    available_from: int = 1
    wanted_cut: int = 0
    """The highest seq retention wants gone; applied up to the lowest pinned seq."""
    pinned: list[int] = field(default_factory=list)
    """Sorted seqs retention must not cut: unfinished intents', and those of intents
    committed after retention had passed their seq, until their own retention."""
    seqs: list[int] = field(default_factory=list)
    history: dict[int, RecordRow] = field(default_factory=dict)
    """Per recorded seq, its record as a row (``backends.memory.rows``)."""
    reading_versions: dict[int, int] = field(default_factory=dict)
    """Per recorded seq, the membership version its commit froze (absent: 0, unknown)."""
    abandoned: list[int] = field(default_factory=list)
    """Sorted seqs an operator abandoned: permanent gaps, kept while readable."""

    def joined(self, users: list[str]) -> None:
        """Users who became members: into the sorted listing order."""
        if len(users) > 16:
            self.current = sorted({*self.current, *users})
        else:
            for user in users:
                bisect.insort(self.current, user)

    def left(self, users: list[str], version: int) -> None:
        """Users removed at ``version``: out of the listing order, into the removals."""
        gone = set(users)
        self.current = [u for u in self.current if u not in gone]
        self.removals += [(version, u) for u in sorted(gone)]

    def pin(self, seq: int) -> None:
        bisect.insort(self.pinned, seq)

    def unpin(self, seq: int) -> None:
        at = bisect.bisect_left(self.pinned, seq)
        if at < len(self.pinned) and self.pinned[at] == seq:
            del self.pinned[at]

    def trim(self) -> None:
        """Apply retention as a prefix, stopping below the lowest unfinished seq."""
        cut = self.wanted_cut
        if self.pinned:
            cut = min(cut, self.pinned[0] - 1)
        if cut < self.available_from:
            return
        end = bisect.bisect_right(self.seqs, cut)
        for old in self.seqs[:end]:
            del self.history[old]
            self.reading_versions.pop(old, None)
        del self.seqs[:end]
        del self.abandoned[: bisect.bisect_right(self.abandoned, cut)]
        self.available_from = cut + 1

    def abandon(self, seq: int) -> None:
        """``seq`` will never be recorded: drop a record written before the intent
        was quarantined, release the pin, remember the gap."""
        if self.history.pop(seq, None) is not None:
            del self.seqs[bisect.bisect_left(self.seqs, seq)]
        self.reading_versions.pop(seq, None)
        self.unpin(seq)
        if seq >= self.available_from and seq not in self.abandoned:
            bisect.insort(self.abandoned, seq)
        self.trim()


@dataclass
class MemoryState:
    """All data of one memory backend; survives a close/reopen of the stores."""

    commits: dict[Key3, Commit | CommittedRow] = field(default_factory=dict)
    """Per key: a Commit while unfinished or abandoned, a CommittedRow once committed."""
    conversations: dict[ConvKey, Conversation] = field(default_factory=dict)
    queue: dict[Key3, QueueEntry] = field(default_factory=dict)
    commit_expiry: deque[tuple[int, Key3]] = field(default_factory=deque)
    history_expiry: deque[tuple[int, ConvKey, int]] = field(default_factory=deque)
    outbox: OutboxLog = field(default_factory=OutboxLog)
    delivery: DeliveryState = field(default_factory=DeliveryState)
