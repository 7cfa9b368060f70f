"""The memory outbox: a list standing in for a stream; positions are 1-based indexes."""

from __future__ import annotations

from backends.memory.state import MemoryState
from service.domain.errors import StoreInvalid
from service.domain.model import CommitIntent, OutboxEntry, OutboxPage, OutboxPublication
from service.domain.ports import Hook, Outbox

STREAM = "memory"


class MemoryOutbox(Outbox):
    def __init__(self, state: MemoryState) -> None:
        self._state = state

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
            )
        )
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
