"""Recovery on Redis when stored data is bad: an intent whose bytes no decoder
can take, and queue members whose commit hash is gone (issue 24, items 5 and 6)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from service.domain.committer import MessageCommitter
from service.domain.errors import Recoverable
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.model import AuthenticatedSend, CommittedMessage
from service.domain.ports import Backend, ManualClock
from service.domain.recovery import RecoveryPolicy
from tests.servers.redis_server import RedisHarness
from tests.support import NO_QUOTA, conversation, send, unique

pytestmark = pytest.mark.redis

POLICY = RecoveryPolicy(first_retry_ms=1_000, max_retry_ms=4_000, quarantine_after=3)


async def _stuck(
    redis_h: RedisHarness, clock: ManualClock, count: int
) -> tuple[MessageCommitter, Backend, list[AuthenticatedSend]]:
    backend = await redis_h.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c = MessageCommitter(
        backend.store, backend.membership, backend.outbox, limits=NO_QUOTA, clock=clock,
        recovery=POLICY,
    )  # fmt: skip
    stuck = []
    for _ in range(count):
        request = send(tenant)
        c.faults.arm(FaultPoint.AFTER_RESERVE)
        with pytest.raises(InjectedCrash):
            await c.commit_send(request)
        stuck.append(request)
        clock.advance(1_000)
    clock.advance(60_000)
    return c, backend, stuck


def _commit_key(redis_h: RedisHarness, request: AuthenticatedSend) -> str:
    ck = redis_h.keys.conversation(request.key.tenant, request.conversation)
    return ck.commit(request.key.sender, request.key.cmid)


DEEP_LIST = b"[" * 200_000 + b"]" * 200_000  # json.loads: RecursionError, not ValueError


@pytest.mark.parametrize(
    ("field", "blob"),
    [
        ("r", DEEP_LIST),
        ("r", b'{"i":' * 5_000 + b"1" + b"}" * 5_000),
        ("r", b"\xff\xfe not json"),
        ("d", DEEP_LIST),  # the frozen delivery goes through the same bounded decoder
        ("d", b"\xff\xfe not json"),
        ("s", b"\xff not a seq"),
        ("ca", b"\xff not a time"),
    ],
    ids=["record-deep-list", "record-deep-object", "record-bytes", "delivery-deep-list",
         "delivery-bytes", "seq-bytes", "created-bytes"],
)  # fmt: skip
async def test_an_intent_no_decoder_can_take_is_quarantined_alone(
    redis_h: RedisHarness, raw: Redis, field: str, blob: bytes
) -> None:
    """One field of the commit hash, as stored bytes, rewritten (no wrapper): the
    real decoders meet it, and whatever they raise, that one intent is
    quarantined, a retry of it is never ACKed, and the others are finished."""
    clock = ManualClock()
    c, _, stuck = await _stuck(redis_h, clock, 4)
    poison = stuck[0]
    assert await raw.hset(_commit_key(redis_h, poison), field, blob) == 0  # overwritten
    report = await c.recover_due(clock.now_ms() - 30_000, 100)
    assert (report.scanned, report.committed, report.quarantined) == (4, 3, 1)
    item = await c.recovery_item(poison.key)
    assert item.quarantined and item.intent is None and item.problem
    assert (await c.recover_due(clock.now_ms(), 100)).scanned == 0
    with pytest.raises(Recoverable):  # a client retry is never ACKed while it is bad
        await c.commit_send(poison)
    for request in stuck[1:]:
        assert isinstance(await c.commit_send(request), CommittedMessage)


async def test_orphaned_queue_entries_at_the_head_are_removed_and_never_stop_recovery(
    redis_h: RedisHarness, raw: Redis
) -> None:
    """Queue members whose commit hash is gone (evicted, deleted by hand) leave
    every index; a batch of them at the head neither stops recovery nor pins
    the oldest-unfinished gauge."""
    clock = ManualClock()
    c, backend, stuck = await _stuck(redis_h, clock, 6)
    orphans, live = stuck[:4], stuck[4:]
    for request in orphans:
        assert await raw.delete(_commit_key(redis_h, request)) == 1
    report = await c.recover_due(clock.now_ms() - 30_000, 2)
    assert (report.scanned, report.committed) == (2, 2)
    assert (await backend.store.recovery_stats()).oldest_unfinished_ms is None
    shard = redis_h.keys.conversation(live[0].key.tenant, "c1").shard
    for index in (shard.queue, shard.created, shard.quarantine):
        assert await raw.zcard(index) == 0, index
    assert await raw.hlen(shard.attempts) == 0


async def test_orphans_do_not_pin_the_oldest_unfinished_gauge(
    redis_h: RedisHarness, raw: Redis
) -> None:
    clock = ManualClock()
    c, backend, stuck = await _stuck(redis_h, clock, 3)
    for request in stuck[:2]:
        assert await raw.delete(_commit_key(redis_h, request)) == 1
    assert (await c.recover_due(clock.now_ms() - 30_000, 1)).scanned == 1
    assert (await backend.store.recovery_stats()).oldest_unfinished_ms is None
