"""The memory backend's delivery side: mailboxes, the conversation index, history records.

Everything lives in ``MemoryState.delivery`` (a ``DeliveryState``), so a
reopened backend sees it, as it sees commits. Each call runs without an
await in between, so every append is atomic, as the Redis scripts are. This
module is the behavioural spec of ``MailboxStore`` for the other backends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.memory.state import MemoryState
from service.domain import mailbox as rules
from service.domain.delivery import (
    AppendOutcome,
    AppendRequest,
    ConversationIndex,
    HistoryRecords,
    LeftConversation,
    LeftMark,
    MailboxSettings,
    MailboxStore,
)
from service.domain.errors import StoreInvalid
from service.domain.lane_marks import moved_back
from service.domain.mailbox import LaneRead, LaneState, Mailbox, MailboxEntry
from service.domain.model import MessageRecord
from service.domain.ports import Clock
from service.domain.relay import DeadLetter, Fence, RetryMark


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
    stored: list[MailboxEntry] = field(default_factory=list)
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

    def add(self, entry: MailboxEntry) -> None:
        self.stored.append(entry)
        self.ids[entry.record.message_id] = entry.seq

    def after(self, seq: int, limit: int) -> list[MailboxEntry]:
        """Up to ``limit`` entries with a seq above ``seq``."""
        if self.front == len(self.stored):
            return []
        start = self.front + max(0, seq + 1 - self.stored[self.front].seq)
        return self.stored[start : start + max(0, limit)]

    def trim_to(self, cut: int) -> None:
        """Drop the entries through ``cut``; their ids stay until ``forget``."""
        if cut <= self.watermark:
            return
        stored = self.stored
        while self.front < len(stored) and stored[self.front].seq <= cut:
            entry = stored[self.front]
            self.trimmed_ids.append((entry.seq, entry.record.message_id))
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


class MemoryMailboxStore(MailboxStore):
    def __init__(self, state: MemoryState, settings: MailboxSettings, clock: Clock) -> None:
        self._delivery = state.delivery
        self.settings = settings.validate()
        self._clock = clock

    async def append(self, requests: Sequence[AppendRequest], fence: Fence) -> list[AppendOutcome]:
        return [self._append(r, fence) for r in requests]

    def _append(self, request: AppendRequest, fence: Fence) -> AppendOutcome:
        if len(request.items) > rules.MAX_GROUP_ENTRIES:
            raise StoreInvalid(f"one append holds at most {rules.MAX_GROUP_ENTRIES} items")
        lane = self._delivery.lane(request.mailbox)
        if lane.fences.get(fence.partition, 0) > fence.token:
            return AppendOutcome(fenced=True)
        if moved_back(request.floor, lane.epoch, lane.head):
            return AppendOutcome(epoch=lane.epoch, head=lane.head, moved_back=True)
        lane.fences[fence.partition] = fence.token
        held = (i.message_id for i in request.items if i.message_id in lane.ids)
        fresh = rules.new_items(request.items, held)  # not the whole lane's ids
        now = self._clock.now_ms()
        first = lane.head + 1
        for offset, item in enumerate(fresh):
            lane.add(MailboxEntry(first + offset, first, item.record, now, item.membership_version))
        if fresh:
            lane.head = first + len(fresh) - 1
            lane.group_ends.append((lane.head, now))
        self._retain(lane, now)
        return AppendOutcome(
            added=len(fresh),
            duplicates=len(request.items) - len(fresh),
            first_seq=first if fresh else 0,
            epoch=lane.epoch,
            head=lane.head,
        )

    def _retain(self, lane: Lane, now: int) -> None:
        s = self.settings
        cut = rules.trim_cut(
            lane.state,
            lane.group_ends,
            now_ms=now,
            retention_ms=s.retention_ms,
            max_entries=s.max_entries,
        )
        lane.trim_to(cut)
        lane.forget(now, s.dedupe_ms)

    async def _read(self, mailbox: Mailbox, after_seq: int, limit: int) -> LaneRead:
        lane = self._delivery.lanes.get((mailbox.tenant, mailbox.kind.value, mailbox.owner))
        if lane is None:
            return LaneRead(LaneState(), ())
        self._retain(lane, self._clock.now_ms())
        taken = lane.after(after_seq, limit)
        if taken:  # complete the last group
            group = taken[-1].group_id
            rest = lane.after(taken[-1].seq, rules.MAX_GROUP_ENTRIES)
            taken += [e for e in rest if e.group_id == group]
        return LaneRead(lane.state, tuple(taken))

    async def lane_state(self, mailboxes: Sequence[Mailbox]) -> list[LaneState]:
        found = self._delivery.lanes
        result = []
        for m in mailboxes:
            lane = found.get((m.tenant, m.kind.value, m.owner))
            result.append(lane.state if lane is not None else LaneState())
        return result

    async def contains(
        self, queries: Sequence[tuple[Mailbox, tuple[str, ...]]]
    ) -> list[frozenset[str]]:
        result = []
        for mailbox, ids in queries:
            lane = self._delivery.lanes.get((mailbox.tenant, mailbox.kind.value, mailbox.owner))
            held = lane.ids if lane is not None else {}
            result.append(frozenset(i for i in ids if i in held))
        return result

    async def trim(self, mailbox: Mailbox, through_seq: int) -> LaneState:
        lane = self._delivery.lane(mailbox)
        cut = lane.watermark
        for end, _ in lane.group_ends:
            if end > through_seq:
                break
            cut = end
        lane.trim_to(cut)
        lane.forget(self._clock.now_ms(), self.settings.dedupe_ms)
        return lane.state

    async def new_epoch(self, mailbox: Mailbox, above: int = 0) -> LaneState:
        lane = self._delivery.lane(mailbox)
        fences = lane.fences
        fresh = Lane(epoch=max(lane.epoch, above) + 1, fences=fences)
        self._delivery.lanes[(mailbox.tenant, mailbox.kind.value, mailbox.owner)] = fresh
        return fresh.state


class MemoryConversationIndex(ConversationIndex):
    def __init__(self, state: MemoryState) -> None:
        self._index = state.delivery.index
        self._left = state.delivery.left

    async def add(self, tenant: str, conversation: str, users: Sequence[str]) -> None:
        for user in users:
            self._index.setdefault((tenant, user), set()).add(conversation)

    async def remove(self, tenant: str, conversation: str, users: Sequence[str]) -> None:
        for user in users:
            self._index.get((tenant, user), set()).discard(conversation)

    async def conversations(
        self, tenant: str, user: str, after: str, limit: int
    ) -> tuple[tuple[str, ...], str]:
        ids = sorted(c for c in self._index.get((tenant, user), set()) if c > after)
        page = tuple(ids[:limit])
        return page, page[-1] if len(ids) > limit else ""

    async def record_left(
        self, tenant: str, conversation: str, users: Sequence[str], version: int, at_ms: int
    ) -> None:
        for user in users:
            entry = LeftConversation(conversation, version, at_ms)
            self._left.setdefault((tenant, user), {})[conversation] = entry

    async def left(
        self, tenant: str, user: str, after: LeftMark, limit: int
    ) -> tuple[tuple[LeftConversation, ...], LeftMark | None]:
        entries = sorted(
            (e for e in self._left.get((tenant, user), {}).values() if e.mark > after),
            key=lambda e: e.mark,
        )
        page = tuple(entries[:limit])
        return page, page[-1].mark if len(entries) > limit else None


class MemoryHistoryRecords(HistoryRecords):
    def __init__(self, state: MemoryState) -> None:
        self._state = state

    async def records(
        self, tenant: str, conversation: str, seqs: Sequence[int]
    ) -> dict[int, MessageRecord]:
        conv = self._state.conversations.get((tenant, conversation))
        if conv is None:
            return {}
        return {s: conv.history[s] for s in seqs if s in conv.history}
