"""Dead letters are kept for MC_RELAY_DEAD_LETTER_RETENTION, then the relay drops
them, counted (issue 23, item 9: they grew forever). On every backend: a trim
within the retention drops nothing and reports what is held; past it, every
letter goes and each drop is counted; a requeue removes what it requeued."""

from __future__ import annotations

from service.domain.delivery import DeadLetterTrim, DeliverySettings
from service.domain.model import FrozenDeliveryInput, ReserveCandidate
from service.domain.ports import Backend, ManualClock
from tests.conformance.harness import Harness
from tests.conformance.relay_support import POLICY, Seen, drain, ports
from tests.support import committer, send, unique

RETENTION_MS = 3_600_000
LETTERS = 3


async def _trim_all(backend: Backend, owner: str) -> DeadLetterTrim:
    parts = ports(backend).partitions
    dropped = held = 0
    for partition in parts.partitions():
        lease = await parts.acquire(partition, owner, POLICY.lease_ms)
        assert lease is not None
        trim = await parts.trim_dead_letters(lease)
        dropped, held = dropped + trim.dropped, held + trim.held
        await parts.release(lease)
    return DeadLetterTrim(dropped, held)


async def _letters(backend: Backend) -> list[str]:
    parts = ports(backend).partitions
    found = []
    for partition in parts.partitions():
        page, _ = await parts.dead_letters(partition, "", 100)
        found += [d.entry.message_id for d in page]
    return found


async def test_dead_letters_are_kept_for_the_retention_then_dropped_and_counted(
    harness: Harness,
) -> None:
    clock = ManualClock()
    settings = DeliverySettings(dead_letter_retention_ms=RETENTION_MS)
    backend = await harness.open(clock=clock, delivery=settings)
    tenant = unique("t")
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    never = FrozenDeliveryInput.at_version(99)  # a version the conversation never had
    for n in range(1, LETTERS + 1):
        await c.commit(send(tenant, "c1", cmid=f"bad{n}"), never, ReserveCandidate(f"m-{n}", n))
    seen = Seen()
    leases = await drain(backend, "relay-a", clock, seen=seen)
    assert seen.dead == LETTERS
    for lease in leases.values():
        await ports(backend).partitions.release(lease)

    assert await _trim_all(backend, "relay-b") == DeadLetterTrim(0, LETTERS)
    assert sorted(await _letters(backend)) == [f"m-{n}" for n in range(1, LETTERS + 1)]

    clock.advance(RETENTION_MS - 60_000)  # still within the retention
    assert await _trim_all(backend, "relay-b") == DeadLetterTrim(0, LETTERS)

    clock.advance(120_000)  # a minute past it (the letters were written a moment ago)
    assert await _trim_all(backend, "relay-b") == DeadLetterTrim(LETTERS, 0)
    assert await _letters(backend) == []
    assert await _trim_all(backend, "relay-b") == DeadLetterTrim(0, 0)


async def test_a_requeue_removes_the_letters_it_moved_back(harness: Harness) -> None:
    clock = ManualClock()
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    never = FrozenDeliveryInput.at_version(99)
    await c.commit(send(tenant, "c1", cmid="bad"), never, ReserveCandidate("m-1", 1))
    leases = await drain(backend, "relay-a", clock)
    for lease in leases.values():
        await ports(backend).partitions.release(lease)
    parts = ports(backend).partitions
    moved = 0
    for partition in parts.partitions():
        page, _ = await parts.dead_letters(partition, "", 100)
        moved += await parts.requeue(partition, [d.letter for d in page])
    assert moved == 1
    assert await _letters(backend) == []
    assert await _trim_all(backend, "relay-b") == DeadLetterTrim(0, 0)
