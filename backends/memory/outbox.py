"""The memory outbox: an ``OutboxLog`` standing in for a stream; a position is the
publish's number, from 1.

The relay reads it as partitions (``backends.memory.partitions``) and drops
what it settled; a publish wakes the relay waiting for its partition."""

from __future__ import annotations

import itertools

from backends.memory.state import MemoryState
from service.domain.errors import StoreInvalid
from service.domain.model import CommitIntent, OutboxEntry, OutboxPage, OutboxPublication
from service.domain.ports import Clock, Hook, Outbox, SystemClock

STREAM = "memory"


class MemoryOutbox(Outbox):
    def __init__(self, state: MemoryState, clock: Clock | None = None) -> None:
        self._state = state
        self._clock = clock or SystemClock()

    @property
    def state(self) -> MemoryState:
        return self._state

    def append(self, intent: CommitIntent) -> OutboxPublication:
        """Publish without an await (the store's pipelined commit calls this)."""
        log = self._state.outbox
        position = log.next_position()
        publication = OutboxPublication(STREAM, str(position))
        r, d = intent.record, intent.delivery
        log.add(
            position,
            OutboxEntry(
                publication,
                r.tenant,
                r.conversation,
                r.seq,
                r.message_id,
                d.recipients,
                d.membership_version,
                self._clock.now_ms(),
            ),
        )
        return publication

    async def publish(self, intent: CommitIntent, sent: Hook | None = None) -> OutboxPublication:
        publication = self.append(intent)
        if sent is not None:
            sent()
        return publication

    async def read(self, after: str, limit: int) -> OutboxPage:
        if after and not after.isdigit():
            raise StoreInvalid("outbox position is not one this outbox returned")
        start = int(after) if after else 0
        batch = tuple(itertools.islice(self._state.outbox.after(start), max(0, limit)))
        last = int(batch[-1].publication.position) if batch else start
        return OutboxPage(batch, str(last))

    async def readiness(self) -> None:
        return None
