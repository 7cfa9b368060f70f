"""The memory outbox: a list standing in for a stream; positions are 1-based indexes.

The relay reads it as partitions (``backends.memory.partitions``); a publish
wakes a relay waiting for entries."""

from __future__ import annotations

from backends.memory.state import MemoryState
from service.domain.errors import StoreInvalid
from service.domain.model import CommitIntent, OutboxEntry, OutboxPage, OutboxPublication
from service.domain.ports import Clock, Hook, Outbox, SystemClock

STREAM = "memory"


class MemoryOutbox(Outbox):
    def __init__(self, state: MemoryState, clock: Clock | None = None) -> None:
        self._state = state
        self._clock = clock or SystemClock()

    async def publish(self, intent: CommitIntent, sent: Hook | None = None) -> OutboxPublication:
        entries = self._state.outbox
        publication = OutboxPublication(STREAM, str(len(entries) + 1))
        r, d = intent.record, intent.delivery
        entries.append(
            OutboxEntry(
                publication,
                r.tenant,
                r.conversation,
                r.seq,
                r.message_id,
                d.recipients,
                d.membership_version,
                self._clock.now_ms(),
            )
        )
        self._state.delivery.ring()
        if sent is not None:
            sent()
        return publication

    async def read(self, after: str, limit: int) -> OutboxPage:
        if after and not after.isdigit():
            raise StoreInvalid("outbox position is not one this outbox returned")
        start = int(after) if after else 0
        batch = self._state.outbox[start : start + max(0, limit)]
        return OutboxPage(tuple(batch), str(start + len(batch)))

    async def readiness(self) -> None:
        return None
