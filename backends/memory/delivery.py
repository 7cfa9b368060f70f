"""The memory backend's delivery side: mailboxes, the conversation index, history records
(the data they keep is ``backends.memory.delivery_state``'s).

Everything lives in ``MemoryState.delivery`` (a ``DeliveryState``), so a
reopened backend sees it, as it sees commits. Each call runs without an
await in between, so every append is atomic, as the Redis scripts are. This
module is the behavioural spec of ``MailboxStore`` for the other backends.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.memory.delivery_state import Lane
from backends.memory.rows import RecordRow, entry_row, record_of, record_row
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
from service.domain.mailbox import LaneRead, LaneState, Mailbox
from service.domain.model import MessageRecord
from service.domain.ports import Clock
from service.domain.relay import Fence


class MemoryMailboxStore(MailboxStore):
    def __init__(self, state: MemoryState, settings: MailboxSettings, clock: Clock) -> None:
        self._delivery = state.delivery
        self.settings = settings.validate()
        self._clock = clock

    async def append(self, requests: Sequence[AppendRequest], fence: Fence) -> list[AppendOutcome]:
        made: dict[int, RecordRow] = {}  # one row per record of this call, by id()
        return [self._append(r, fence, made) for r in requests]

    def _append(
        self, request: AppendRequest, fence: Fence, made: dict[int, RecordRow]
    ) -> AppendOutcome:
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
            row = made.get(id(item.record))
            if row is None:
                row = made[id(item.record)] = record_row(item.record)
            lane.add(entry_row(first + offset, first, now, item.membership_version, row))
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
        history = conv.history
        return {s: record_of(history[s]) for s in seqs if s in history}
