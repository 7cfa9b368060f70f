"""The memory outbox as leased partitions, for the relay that runs inside ``serve``.

The partitions are the ``OutboxLog``'s queues (``backends.memory.outbox_log``:
by conversation, each in publication order). Per partition ``PartitionState``
keeps the lease (owner, token, expiry by the backend's clock), the entries
claimed and not settled, retry marks and dead letters. A claim takes from the
front of its queue, a settle drops what it settled from the log, the doorbell
looks at the queues it was asked about: each call costs the entries it
handles. Each call runs without an await in between: atomic.

Dead letters are kept for the dead-letter retention (by the backend's clock)
and at most ``MAX_DEAD_LETTERS`` per partition, the oldest dropped first;
both only when the relay trims them, so each drop is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import replace

from backends.memory.delivery_state import DeliveryState, PartitionState
from backends.memory.outbox_log import NAMES, OutboxLog
from backends.memory.state import MemoryState
from service.domain.delivery import DeadLetterTrim, DeliverySettings, OutboxPartitions
from service.domain.errors import IllegalTransition, LeaseLost, StoreInvalid
from service.domain.model import OutboxEntry, OutboxPublication
from service.domain.ports import Clock
from service.domain.relay import DeadLetter, Lease, PartitionEntry, Settlement

MAX_DEAD_LETTERS = 10_000
"""Most dead letters one memory partition keeps (they live in the process)."""


class MemoryOutboxPartitions(OutboxPartitions):
    def __init__(
        self,
        state: MemoryState,
        clock: Clock,
        dead_letter_retention_ms: int = DeliverySettings().dead_letter_retention_ms,
    ) -> None:
        self._log: OutboxLog = state.outbox
        self._delivery: DeliveryState = state.delivery
        self._clock = clock
        self._dead_retention_ms = dead_letter_retention_ms

    def partitions(self) -> tuple[str, ...]:
        return NAMES

    def _state(self, partition: str) -> PartitionState:
        if partition not in NAMES:
            raise StoreInvalid("no such outbox partition")
        return self._delivery.partitions.setdefault(partition, PartitionState())

    def _held(self, lease: Lease) -> PartitionState:
        p = self._state(lease.partition)
        if p.token != lease.token:
            raise LeaseLost("another relay holds a newer lease on this partition")
        return p

    async def acquire(self, partition: str, owner: str, ttl_ms: int) -> Lease | None:
        p = self._state(partition)
        now = self._clock.now_ms()
        taken_over = False
        if p.owner != owner or p.expires_ms <= now:
            if p.owner and p.owner != owner and p.expires_ms > now:
                return None
            p.token += 1
            p.owner = owner
            taken_over = True
        p.expires_ms = now + ttl_ms
        return Lease(partition, owner, p.token, p.expires_ms, taken_over)

    async def release(self, lease: Lease) -> None:
        p = self._state(lease.partition)
        if p.token == lease.token:
            p.expires_ms = 0

    def _entry(self, position: str) -> OutboxEntry:
        return self._log.entry(position)

    async def unsettled(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        p = self._held(lease)
        for position in p.sending:
            p.sending[position] = lease.token
        result = []
        for position in list(p.sending)[:limit]:
            mark = p.retry.get(position)
            result.append(PartitionEntry(self._entry(position), mark.attempts if mark else 0))
        return result

    async def claim(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        p = self._held(lease)
        queue = self._log.queues[lease.partition]
        result: list[PartitionEntry] = []
        while queue and len(result) < limit:
            entry = self._log.entries[queue.popleft()]
            p.sending[entry.publication.position] = lease.token
            result.append(PartitionEntry(entry))
        return result

    async def settle(self, lease: Lease, settlement: Settlement) -> None:
        p = self._held(lease)
        touched = [
            *settlement.sent,
            *(m.position for m in settlement.retry),
            *(d.entry.publication.position for d in settlement.dead),
        ]
        for position in touched:
            if p.sending.get(position) != lease.token:
                raise IllegalTransition("an outbox entry that is not sending under this lease")
        for position in settlement.sent:
            del p.sending[position]
            p.retry.pop(position, None)
            self._log.drop(position)
        for mark in settlement.retry:
            p.retry[mark.position] = mark
        for dead in settlement.dead:
            position = dead.entry.publication.position
            del p.sending[position]
            p.retry.pop(position, None)
            self._log.drop(position)  # the dead letter keeps its own copy
            p.letters += 1
            letter = f"{p.letters:012d}"
            p.dead[letter] = replace(dead, letter=letter)
            p.dead_ms[letter] = self._clock.now_ms()

    async def oldest_pending_ms(self, lease: Lease) -> int | None:
        p = self._state(lease.partition)
        times = [self._entry(pos).published_ms for pos in p.sending]
        queue = self._log.queues[lease.partition]
        if queue:
            times.append(self._log.entries[queue[0]].published_ms)
        return min(times) if times else None

    async def dead_letters(
        self, partition: str, after: str, limit: int
    ) -> tuple[list[DeadLetter], str]:
        dead = self._state(partition).dead
        ids = sorted(i for i in dead if i > after)
        page = [dead[i] for i in ids[:limit]]
        return page, page[-1].letter if len(ids) > limit else ""

    async def requeue(self, partition: str, letters: Sequence[str]) -> int:
        p = self._state(partition)
        moved = 0
        for letter in letters:
            dead = p.dead.pop(letter, None)
            if dead is None:
                continue
            p.dead_ms.pop(letter, None)
            position = self._log.next_position()
            publication = OutboxPublication(dead.entry.publication.stream, str(position))
            self._log.add(
                position,
                replace(dead.entry, publication=publication, published_ms=self._clock.now_ms()),
            )
            moved += 1
        return moved

    async def trim_dead_letters(self, lease: Lease) -> DeadLetterTrim:
        p = self._held(lease)
        cutoff = self._clock.now_ms() - self._dead_retention_ms
        excess = len(p.dead) - MAX_DEAD_LETTERS
        dropped = 0
        for letter in list(p.dead):  # oldest first: ids count up
            if p.dead_ms.get(letter, 0) >= cutoff and dropped >= excess:
                break
            del p.dead[letter]
            p.dead_ms.pop(letter, None)
            dropped += 1
        return DeadLetterTrim(dropped, len(p.dead))

    async def relays(self, owner: str, ttl_ms: int) -> int:
        now = self._clock.now_ms()
        live = self._delivery.relays
        live[owner] = now + ttl_ms
        for name, until in list(live.items()):
            if until <= now:
                del live[name]
        return len(live)

    has_doorbell = True

    async def wait(self, partitions: Sequence[str], timeout_ms: int) -> Sequence[str]:
        for name in partitions:
            self._state(name)
        ready = self._ready(partitions)
        if ready:
            return ready  # published since the last claim: no need to wait
        event = asyncio.Event()
        for name in partitions:
            self._log.waiters[name].add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_ms / 1000)
        finally:
            for name in partitions:
                self._log.waiters[name].discard(event)
        return self._ready(partitions)

    def _ready(self, partitions: Sequence[str]) -> list[str]:
        """The partitions with entries nobody claimed yet."""
        return [name for name in partitions if self._log.queues[name]]
