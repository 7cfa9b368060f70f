"""The Redis topology launchers: Sentinel fails over to the replica, and a write
acknowledged before the replica had it is lost with the old master; a Redis Cluster
of 3 masters + 3 replicas serves hash-tagged keys of one slot from one master and
fails a master over to its replica."""

from __future__ import annotations

import asyncio
import time

import pytest

from backends.redis.link import CALL
from service.domain.errors import Recoverable
from tests.servers.redis_server import open_initialised
from tests.servers.redis_topologies import RedisClusterTopology, RedisNode, SentinelTopology
from tests.support import committer, conversation, send, unique

pytestmark = [pytest.mark.redis, pytest.mark.cluster]


def test_sentinel_fails_over_and_keeps_what_the_replica_acknowledged(
    redis_sentinel: SentinelTopology,
) -> None:
    # the roles as the Sentinels see them now (on a loaded machine they may already
    # have swapped the two nodes during startup)
    redis_sentinel.wait_replicated()
    old = redis_sentinel.current_master()
    [replica] = [n for n in redis_sentinel.data_nodes if n is not old]
    with old.client() as c:
        c.set("kept", "1")
        assert c.execute_command("WAIT", 1, 2000) == 1  # the replica has it
        replica.pause()
        c.execute_command("CLIENT", "KILL", "TYPE", "replica")  # cut the replication link
        c.set("lost", "1")  # ACKed by the master alone
        assert c.execute_command("WAIT", 1, 200) == 0
    old.kill()
    replica.resume()
    began = time.monotonic()
    port = redis_sentinel.wait_failover(old.port)
    print(f"sentinel failover took {time.monotonic() - began:.1f}s")
    with redis_sentinel.current_master().client() as c:
        assert port == replica.port
        assert c.get("kept") == "1"
        assert c.get("lost") is None  # async replication: an ACK before WAIT can be lost
    old.start()  # the old master comes back and is turned into a replica ...
    redis_sentinel.wait_replicated()
    # ... of the new timeline: what it alone had ACKed does not come back. (On a
    # starved machine the Sentinels may since have failed over again, with the old
    # node promoted once it had resynced: the property holds on both nodes alike.)
    for node in redis_sentinel.data_nodes:
        with node.client() as c:
            assert (c.get("kept"), c.get("lost")) == ("1", None), node.port


async def test_behind_sentinel_a_replay_with_wait_is_one_round_trip(
    redis_sentinel: SentinelTopology,
) -> None:
    """The reserve that finds the key committed, the shard's barrier and WAIT go in
    one pipeline on the connection to the master Sentinel names (main: 2 calls)."""
    redis_sentinel.wait_replicated()
    backend = await open_initialised(redis_sentinel.url, wait_replicas=1, wait_timeout_ms=2000)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        c = committer(backend)
        kept = await c.commit_send(send(tenant))
        before = backend.requests[CALL]
        assert await c.commit_send(send(tenant, cmid=kept.cmid)) == kept
        assert backend.requests[CALL] - before == 1
    finally:
        await backend.close()


def test_redis_cluster_serves_one_slot_per_hash_tag_and_fails_over(
    redis_cluster: RedisClusterTopology,
) -> None:
    masters = redis_cluster.masters()
    assert len(masters) == 3
    with masters[0].client() as c:
        slots = {c.execute_command("CLUSTER", "KEYSLOT", f"mc:{{t1:c1}}:{part}")
                 for part in ("seq", "history", "commit:x")}  # fmt: skip
        assert len(slots) == 1
    victim = masters[0]
    victim.kill()
    began = time.monotonic()
    redis_cluster.wait_masters(3)
    print(f"redis cluster failover took {time.monotonic() - began:.1f}s")
    assert victim not in redis_cluster.masters()  # a replica took over the victim's slots


def _owner_and_replica(cluster: RedisClusterTopology, key: str) -> tuple[RedisNode, RedisNode]:
    """The master that owns ``key``'s slot and its replica."""
    by_port = {node.port: node for node in cluster.nodes}
    with cluster.masters()[0].client() as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        owner = next(
            by_port[int(port)]
            for start, end, (_, port, *_), *_ in c.execute_command("CLUSTER", "SLOTS")
            if int(start) <= slot <= int(end)
        )
    with owner.client() as c:
        replica = c.info("replication")["slave0"]
    return owner, by_port[int(replica["port"])]


async def test_on_a_cluster_an_ack_waits_for_the_slots_replica_and_survives_its_failover(
    redis_cluster: RedisClusterTopology,
) -> None:
    backend = await open_initialised(redis_cluster.url, wait_replicas=1, wait_timeout_ms=300)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        c = committer(backend)
        kept = await c.commit_send(send(tenant))  # script + WAIT on the slot owner's connection
        before = backend.requests[CALL]
        assert await c.commit_send(send(tenant, cmid=kept.cmid)) == kept
        # admission, the pointer's claim (its own slot), then reserve + barrier + WAIT
        # in one pipeline on the slot owner's connection (the barrier was a 4th call)
        assert backend.requests[CALL] - before == 3
        keys = backend.store._keys  # type: ignore[attr-defined]
        commit_key = keys.conversation(tenant, "c1").commit("alice", kept.cmid)
        owner, replica = _owner_and_replica(redis_cluster, commit_key)
        replica.pause()
        try:
            with pytest.raises(Recoverable):  # the owner has it, its replica does not: no ACK
                await c.commit_send(send(tenant))
        finally:
            replica.resume()
        redis_cluster.wait_replicas_linked()
        owner.kill()  # the replica that acknowledged `kept` takes over the slot
        redis_cluster.wait_masters(3)
        owner.start()  # back as the new master's replica: WAIT 1 can be met again
        redis_cluster.wait_replicas_linked()
        deadline = time.monotonic() + 30
        while True:  # recoverable until the moved slot is learnt
            try:
                again = await c.commit_send(send(tenant, cmid=kept.cmid))
                break
            except Recoverable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        assert again == kept
    finally:
        await backend.close()
