"""The nemesis's Redis Cluster sends the service through the node proxies.

Its nodes announce their Toxiproxy proxies, so the backend's cluster client, given
only the proxies' addresses, follows CLUSTER SLOTS and MOVED to proxies alone: every
master's proxy holds client connections and carries their bytes, and a toxic on one
master's proxy holds the commands of that master's slots and no other's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.crc import key_slot

from backends.redis import open_link
from backends.redis.link import RedisLink
from toolkit.nemesis import toxiproxy as tp
from toolkit.nemesis.redis_cluster import SHARD_SLOTS, RedisClusterTopology, clients_through
from toolkit.nemesis.topology import _pid

pytestmark = pytest.mark.redis


def _key_of(shard: int) -> str:
    """A key whose slot the master of ``shard`` serves."""
    last = [*SHARD_SLOTS[1:], 16384][shard]
    return next(
        k for i in range(100_000) if SHARD_SLOTS[shard] <= key_slot((k := f"k{i}").encode()) < last
    )


async def _touch_every_shard(link: RedisLink) -> None:
    for shard in range(len(SHARD_SLOTS)):
        await link.call("SET", _key_of(shard), "v", write=True)


def test_a_toxic_on_a_masters_proxy_holds_the_service_traffic_of_its_slots(
    tmp_path: Path, toxiproxy: tp.Toxiproxy
) -> None:
    topology = RedisClusterTopology(tmp_path, toxiproxy)
    try:
        asyncio.run(topology.start())  # refuses a slot map naming anything but proxies
        masters = [topology.shard_master(s) for s in range(len(SHARD_SLOTS))]
        ours = {pid for n in topology.nodes if (pid := _pid(n)) is not None}

        def sent_on(node: int) -> int:
            return toxiproxy.byte_counters(topology.proxies[node]).get("upstream sent", 0)

        before = [sent_on(m) for m in masters]

        async def scenario() -> list[str]:
            link = open_link(topology.serve_env()["MC_REDIS_URL"], socket_timeout_s=1.0)
            try:
                await _touch_every_shard(link)
                held = [clients_through(topology.proxy_ports[m], ours) for m in masters]
                assert all(n > 0 for n in held), held
                toxic = toxiproxy.add_toxic(topology.proxies[masters[0]], tp.timeout(0))
                outcomes = []
                for shard in range(len(SHARD_SLOTS)):
                    try:
                        await link.call("GET", _key_of(shard), write=False)
                        outcomes.append("answered")
                    except Exception as exc:
                        outcomes.append(type(exc).__name__)
                toxiproxy.remove_toxic(topology.proxies[masters[0]], toxic)
                return outcomes
            finally:
                await link.close()

        outcomes = asyncio.run(scenario())
        assert outcomes[0] != "answered" and outcomes[1:] == ["answered", "answered"], outcomes
        # the client's connections closed: Toxiproxy has counted their bytes
        assert all(sent_on(m) > b for m, b in zip(masters, before, strict=True))
    finally:
        topology.close()
