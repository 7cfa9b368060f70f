"""Node routes: with ``node_routes`` every CQL request reaches its node through that
node's proxy, never the address and port the cluster announces.

Three Toxiproxy proxies, one per node of the three-node cluster. The driver's hosts
are the proxies' endpoints; a latency toxic on every proxy slows each request of a
commit by that latency (so every request went through a proxy); cutting one proxy
makes that node unreachable (commits go on at QUORUM with two); cutting all three
leaves the backend unavailable although every node is up, so nothing goes around the
proxies.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from backends.scylla import open_scylla_backend
from service.domain.committer import MessageCommitter
from service.domain.errors import CommitError, Recoverable, StoreError, Unavailable
from service.domain.ports import Backend
from tests.scylla.conftest import store_of
from tests.servers.cql_cluster import ClusterServer
from tests.support import committer, conversation, send, unique
from toolkit.nemesis.toxiproxy import Toxiproxy, latency
from toolkit.ports import free_port

pytestmark = [pytest.mark.scylla, pytest.mark.cluster]
LATENCY_MS = 150
COMMITS = 4


async def timed_commits(c: MessageCommitter, tenant: str, backend: Backend) -> float:
    """Seconds per backend request over COMMITS sequential commits."""
    requests = sum(backend.requests.values())
    began = time.monotonic()
    for _ in range(COMMITS):
        await c.commit_send(send(tenant))
    return (time.monotonic() - began) / (sum(backend.requests.values()) - requests)


async def routed_backend(
    cql_cluster: ClusterServer, keyspace: str, toxiproxy: Toxiproxy
) -> tuple[Backend, dict[str, str]]:
    routes: dict[str, tuple[str, int]] = {}
    names: dict[str, str] = {}
    for i, host in enumerate(cql_cluster.hosts):
        name = f"routes-{unique('n')}-{i}"
        port = free_port()
        toxiproxy.create_proxy(name, f"127.0.0.1:{port}", f"{host}:{cql_cluster.port}")
        routes[host] = ("127.0.0.1", port)
        names[host] = name
    backend = await open_scylla_backend(
        cql_cluster.hosts,
        port=cql_cluster.port,
        keyspace=keyspace,
        consistency="QUORUM",
        serial_consistency="SERIAL",
        node_routes=routes,
        request_timeout_s=3.0,
    )
    return backend, names


async def test_every_node_is_reached_through_its_proxy(
    cql_cluster: ClusterServer, cql_cluster_keyspace: str, toxiproxy: Toxiproxy
) -> None:
    backend, names = await routed_backend(cql_cluster, cql_cluster_keyspace, toxiproxy)
    try:
        endpoints = {str(h.endpoint) for h in store_of(backend).cql._cluster.metadata.all_hosts()}
        assert endpoints == {
            f"127.0.0.1:{toxiproxy.proxies()[n]['listen'].rpartition(':')[2]}"
            for n in names.values()
        }
        tenant = unique("t")
        await conversation(backend, tenant)
        c = committer(backend)
        await c.commit_send(send(tenant))  # warm: statements prepared, pools open
        plain = await timed_commits(c, tenant, backend)
        for name in names.values():
            toxiproxy.add_toxic(name, latency(LATENCY_MS))
        slowed = await timed_commits(c, tenant, backend)
        print(
            f"per request, {COMMITS} commits: {plain * 1000:.1f} ms direct,"
            f" {slowed * 1000:.1f} ms with {LATENCY_MS} ms on every proxy's replies"
        )
        # Requests of a commit run one after another and each waits for a delayed reply,
        # so each took at least the latency: every request went through a proxy. (Not
        # "slowed - plain >= latency": on a loaded box the plain run has been slow enough,
        # 97 ms per request against 205 ms slowed, to fail that.)
        assert slowed >= 0.9 * LATENCY_MS / 1000
    finally:
        await backend.close()


async def test_a_cut_proxy_makes_its_node_unreachable_and_nothing_goes_around(
    cql_cluster: ClusterServer, cql_cluster_keyspace: str, toxiproxy: Toxiproxy
) -> None:
    backend, names = await routed_backend(cql_cluster, cql_cluster_keyspace, toxiproxy)
    try:
        tenant = unique("t")
        await conversation(backend, tenant)
        c = committer(backend)
        first, *rest = names.values()
        toxiproxy.set_enabled(first, False)
        for _ in range(5):  # QUORUM of the two others still commits
            request = send(tenant)
            for attempt in range(3):
                try:
                    await c.commit_send(request)
                    break
                except (Recoverable, Unavailable):
                    # A request that was in flight on the cut node's connection ends
                    # ConnectionShutdown: retried with the same key, as a client does.
                    if attempt == 2:
                        raise
        for name in rest:
            toxiproxy.set_enabled(name, False)
        with pytest.raises((StoreError, CommitError)):
            await asyncio.wait_for(c.commit_send(send(tenant)), 30)
        for name in names.values():
            toxiproxy.set_enabled(name, True)
        for _ in range(60):  # the driver reconnects within RECONNECT_MAX_DELAY_S
            try:
                await c.commit_send(send(tenant))
                break
            except (StoreError, CommitError):
                await asyncio.sleep(0.5)
        else:
            pytest.fail("the backend did not come back after the proxies were enabled")
    finally:
        await backend.close()
