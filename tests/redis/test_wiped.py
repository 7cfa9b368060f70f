"""A Redis whose shards lost the deployment identity: every script refuses, writes nothing.

The identity is checked at start-up and by readiness, and again by every
script (``lua.PROLOGUE``) on the shard it touches, so a Redis wiped or
replaced under a running replica (FLUSHALL, an empty replica promoted) can
neither start seqs again at 1 nor answer from half a data set. Found by the
Lua mutation campaign (docs/mutation.md): without the scripts' check, the
Redis suites still passed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from service.domain.errors import StoreWiped
from service.domain.ids import CommitKey
from service.domain.model import (
    CommitState,
    Direction,
    FrozenDeliveryInput,
    HistoryQuery,
    OutboxPublication,
    RecoveryItem,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import ManualClock
from tests.redis.conftest import snapshot
from tests.servers.redis_server import RedisHarness
from tests.support import committer, conversation, send, unique

pytestmark = pytest.mark.redis


async def _identities(raw: Redis, redis_h: RedisHarness) -> dict[str, bytes]:
    found = {}
    for shard in redis_h.keys.all_shards():
        value = await raw.get(shard.identity)
        assert isinstance(value, bytes)
        found[shard.identity] = value
    return found


@pytest.mark.parametrize("loss", ["replaced", "deleted"])
async def test_every_script_refuses_a_shard_without_the_deployment_identity(
    redis_h: RedisHarness, raw: Redis, loss: str
) -> None:
    backend = await redis_h.open(clock=ManualClock())
    store, members = backend.store, backend.membership
    tenant = unique("t")
    await conversation(backend, tenant)
    done = await committer(backend).commit_send(send(tenant))
    req = send(tenant)
    delivery = FrozenDeliveryInput(("alice", "bob"), 1)
    reserved = await store.reserve(req, delivery, ReserveCandidate("m-1", 1))
    assert isinstance(reserved, Reserved)
    intent = reserved.intent
    recorded = intent.advanced(CommitState.RECORDED)
    pub = OutboxPublication("s", "1-0")
    item = RecoveryItem(intent.key, "c1", intent.created_at_ms, 0, intent)
    identities = await _identities(raw, redis_h)

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "reserve": lambda: store.reserve(send(tenant), delivery, ReserveCandidate("m-2", 2)),
        "reserve again": lambda: store.reserve(req, delivery, ReserveCandidate("m-3", 3)),
        "put_record": lambda: store.put_record(intent),
        "mark_outbox_published": lambda: store.mark_outbox_published(recorded, pub),
        "mark_published_and_committed": lambda: store.mark_published_and_committed(recorded, pub),
        "mark_committed": lambda: store.mark_committed(recorded.advanced(CommitState.OUTBOXED)),
        "load_commit": lambda: store.load_commit(intent.key, "c1"),
        "load_commit_for_request": lambda: store.load_commit_for_request(req),
        "load by key": lambda: store.load_commit(CommitKey(tenant, "alice", done.cmid), "c1"),
        "history_page": lambda: store.history_page(
            HistoryQuery(tenant, "c1", "bob", Direction.BACKWARD)
        ),
        "defer_recovery": lambda: store.defer_recovery(
            item, retry_after_ms=1, quarantine=True, problem="p"
        ),
        "release_quarantined": lambda: store.release_quarantined(intent.key),
        "abandon_quarantined": lambda: store.abandon_quarantined(intent.key, "ops", "why"),
        "recovery_item": lambda: store.recovery_item(intent.key),
        "admission": lambda: members.admission(tenant, "c1", "alice"),
        "members_at": lambda: members.members_at(tenant, "c1", None, "", 10),
        "membership_info": lambda: members.membership_info(tenant, "c1"),
        "add_members": lambda: members.add_members(tenant, "c1", ["carol"]),
        "remove_members": lambda: members.remove_members(tenant, "c1", ["bob"]),
        "create_conversation": lambda: members.create_conversation(tenant, "c2", ["alice"]),
    }
    for key in identities:
        if loss == "replaced":
            await raw.set(key, "another-deployment")
        else:
            await raw.delete(key)
    before = await snapshot(raw, redis_h.prefix)
    for name, call in calls.items():
        with pytest.raises(StoreWiped):
            await call()
            pytest.fail(f"{name} ran on a shard without the deployment identity")
    assert await snapshot(raw, redis_h.prefix) == before  # nothing was written

    for key, value in identities.items():
        await raw.set(key, value)
    again = await committer(backend).commit_send(req)
    assert again.message_id == "m-1" and again.seq == intent.record.seq == done.seq + 1
