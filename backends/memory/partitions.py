"""The memory outbox as leased partitions, for the relay that runs inside ``serve``.

The memory outbox is one list (``MemoryState.outbox``; a position is a
1-based index). It is cut into ``PARTITIONS`` partitions by conversation
(``crc32(tenant:conversation)``), so all entries of one conversation are in
one partition, in publication order. Per partition ``PartitionState`` keeps
the lease (owner, token, expiry by the backend's clock), how far the list
was scanned, the entries claimed and not settled, retry marks and dead
letters. Each call runs without an await in between: atomic.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Sequence
from dataclasses import replace

from backends.memory.delivery import DeliveryState, PartitionState
from backends.memory.state import MemoryState
from service.domain.delivery import OutboxPartitions
from service.domain.errors import IllegalTransition, LeaseLost, StoreInvalid
from service.domain.model import OutboxEntry, OutboxPublication
from service.domain.ports import Clock
from service.domain.relay import DeadLetter, Lease, PartitionEntry, Settlement

PARTITIONS = 4
_NAMES = tuple(f"memory:{n}" for n in range(PARTITIONS))


def partition_of(tenant: str, conversation: str) -> str:
    key = f"{len(tenant)}:{tenant}:{conversation}".encode()
    return _NAMES[zlib.crc32(key) % PARTITIONS]


class MemoryOutboxPartitions(OutboxPartitions):
    def __init__(self, state: MemoryState, clock: Clock) -> None:
        self._outbox = state.outbox
        self._delivery: DeliveryState = state.delivery
        self._clock = clock

    def partitions(self) -> tuple[str, ...]:
        return _NAMES

    def _state(self, partition: str) -> PartitionState:
        if partition not in _NAMES:
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
        return self._outbox[int(position) - 1]

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
        result: list[PartitionEntry] = []
        index = p.scanned
        while index < len(self._outbox) and len(result) < limit:
            entry = self._outbox[index]
            index += 1
            if partition_of(entry.tenant, entry.conversation) == lease.partition:
                p.sending[entry.publication.position] = lease.token
                result.append(PartitionEntry(entry))
        p.scanned = index
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
        for mark in settlement.retry:
            p.retry[mark.position] = mark
        for dead in settlement.dead:
            position = dead.entry.publication.position
            del p.sending[position]
            p.retry.pop(position, None)
            p.letters += 1
            letter = f"{p.letters:012d}"
            p.dead[letter] = replace(dead, letter=letter)

    async def oldest_pending_ms(self, lease: Lease) -> int | None:
        p = self._state(lease.partition)
        times = [self._entry(pos).published_ms for pos in p.sending]
        for entry in self._outbox[p.scanned :]:
            if partition_of(entry.tenant, entry.conversation) == lease.partition:
                times.append(entry.published_ms)
                break
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
            position = OutboxPublication(dead.entry.publication.stream, str(len(self._outbox) + 1))
            self._outbox.append(
                replace(dead.entry, publication=position, published_ms=self._clock.now_ms())
            )
            moved += 1
        if moved:
            self._delivery.ring()
        return moved

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
        ready = [name for name in partitions if self._has_new(name)]
        if ready:
            return ready  # published since the last claim: no need to wait
        event = asyncio.Event()
        self._delivery.waiters.add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_ms / 1000)
        finally:
            self._delivery.waiters.discard(event)
        return [name for name in partitions if self._has_new(name)]

    def _has_new(self, partition: str) -> bool:
        p = self._state(partition)
        return any(
            partition_of(e.tenant, e.conversation) == partition for e in self._outbox[p.scanned :]
        )
