"""The memory backend's delivery data: lanes, the relay's per-partition bookkeeping
and the conversation index, all inside ``MemoryState.delivery`` (a
``DeliveryState``). Plain data with the lane's own bookkeeping; the mailbox
rules that act on it are ``backends.memory.delivery``'s."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from backends.memory import rows
from backends.memory.rows import EntryRow
from service.domain import mailbox as rules
from service.domain.delivery import LeftConversation
from service.domain.mailbox import LaneState, Mailbox, MailboxEntry
from service.domain.relay import DeadLetter, RetryMark


@dataclass
class Lane:
    """One mailbox lane: its entries above the watermark, in seq order.

    Seqs are gap-free within an epoch, so the entry of seq ``s`` is at
    ``front + s - first seq`` of ``stored``: a read slices, a trim moves
    ``front`` (the list is compacted once the dead prefix is the larger part),
    and neither looks at the rest of the lane.

    ``ids`` holds the message id of every entry kept and of every trimmed entry
    whose group the dedupe window still covers (``forgotten`` is the dedupe mark,
    ``trimmed_ids`` and ``trimmed_groups`` what a dedupe cut drops next).
    """

    epoch: int = 1
    head: int = 0
    watermark: int = 0
    stored: list[EntryRow] = field(default_factory=list)
    """The entries as rows (``backends.memory.rows``: untracked by the collector)."""
    front: int = 0
    """Index in ``stored`` of the first entry above the watermark."""
    ids: dict[str, int] = field(default_factory=dict)
    fences: dict[str, int] = field(default_factory=dict)
    group_ends: deque[tuple[int, int]] = field(default_factory=deque)
    """(last seq, appended ms) of the groups above the watermark."""
    trimmed_groups: deque[tuple[int, int]] = field(default_factory=deque)
    """The same of trimmed groups whose ids are still remembered."""
    trimmed_ids: deque[tuple[int, str]] = field(default_factory=deque)
    """(seq, message id) of trimmed entries whose ids are still remembered."""
    forgotten: int = 0

    @property
    def state(self) -> LaneState:
        return LaneState(self.epoch, self.head, self.watermark)

    def add(self, row: EntryRow) -> None:
        self.stored.append(row)
        self.ids[row[rows.ENTRY_MESSAGE_ID]] = row[rows.ENTRY_SEQ]

    def after(self, seq: int, limit: int) -> list[MailboxEntry]:
        """Up to ``limit`` entries with a seq above ``seq``."""
        if self.front == len(self.stored):
            return []
        start = self.front + max(0, seq + 1 - self.stored[self.front][rows.ENTRY_SEQ])
        return [rows.entry_of(r) for r in self.stored[start : start + max(0, limit)]]

    def trim_to(self, cut: int) -> None:
        """Drop the entries through ``cut``; their ids stay until ``forget``."""
        if cut <= self.watermark:
            return
        stored = self.stored
        while self.front < len(stored) and stored[self.front][rows.ENTRY_SEQ] <= cut:
            row = stored[self.front]
            seq, message_id = row[rows.ENTRY_SEQ], row[rows.ENTRY_MESSAGE_ID]
            self.trimmed_ids.append((seq, message_id))
            self.front += 1
        while self.group_ends and self.group_ends[0][0] <= cut:
            self.trimmed_groups.append(self.group_ends.popleft())
        if self.front > len(stored) // 2:
            del stored[: self.front]
            self.front = 0
        self.watermark = cut

    def forget(self, now_ms: int, window_ms: int) -> None:
        """Forget the ids the dedupe window no longer covers (``rules.dedupe_cut``)."""
        cut = rules.dedupe_cut(
            self.forgotten, self.watermark, self.trimmed_groups, now_ms=now_ms, window_ms=window_ms
        )
        if cut <= self.forgotten:
            return
        while self.trimmed_groups and self.trimmed_groups[0][0] <= cut:
            self.trimmed_groups.popleft()
        while self.trimmed_ids and self.trimmed_ids[0][0] <= cut:
            self.ids.pop(self.trimmed_ids.popleft()[1], None)
        self.forgotten = cut


@dataclass
class PartitionState:
    """One memory outbox partition's relay bookkeeping."""

    owner: str = ""
    token: int = 0
    expires_ms: int = 0
    sending: dict[str, int] = field(default_factory=dict)
    """Position -> the token it was claimed under, in claim order (sending or retryable)."""
    retry: dict[str, RetryMark] = field(default_factory=dict)
    dead: dict[str, DeadLetter] = field(default_factory=dict)
    """Dead letters by their id (a counter, in order)."""
    dead_ms: dict[str, int] = field(default_factory=dict)
    """When each dead letter was written (the backend's clock), for the retention."""
    letters: int = 0


@dataclass
class DeliveryState:
    """The delivery data of one memory backend."""

    lanes: dict[tuple[str, str, str], Lane] = field(default_factory=dict)
    index: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    left: dict[tuple[str, str], dict[str, LeftConversation]] = field(default_factory=dict)
    """(tenant, user) -> conversation -> its latest departure."""
    partitions: dict[str, PartitionState] = field(default_factory=dict)
    relays: dict[str, int] = field(default_factory=dict)

    def lane(self, mailbox: Mailbox) -> Lane:
        key = (mailbox.tenant, mailbox.kind.value, mailbox.owner)
        found = self.lanes.get(key)
        if found is None:
            found = self.lanes[key] = Lane()
        return found
