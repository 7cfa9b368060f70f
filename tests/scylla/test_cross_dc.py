"""Two data centres: what LOCAL_SERIAL does to a send retried in the other DC.

Cluster: dc1 = 127.0.0.11, .12 (the seed is .11), dc2 = 127.0.0.13; keyspace
NetworkTopologyStrategy dc1=2, dc2=1; hinted handoff off (as in the launcher).

LOCAL_SERIAL (LOCAL_QUORUM): with dc2 down, a replica in dc1 commits a send; dc2
comes back, dc1 goes down, and a replica in dc2 retries the very same send. dc2 has
never seen the intent, so its Paxos round (a quorum of dc2 alone) reserves the key
again: a second ACK, another message id, for one CommitKey: DESIGN §7.3 broken.

SERIAL (QUORUM): the same steps. With dc1 down, two of three replicas are gone, so
the retry by the replica in dc2 is refused (unavailable: retry the same key), never
ACKed anew; once dc1 is back, the same retry returns the identical ACK.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.scylla import open_scylla_backend
from backends.scylla.migrate import migrate
from service.domain.errors import CommitError, StoreError
from service.domain.model import AuthenticatedSend, CommittedMessage
from service.domain.ports import Backend
from tests.servers.cql_cluster import ClusterServer, start_cluster
from tests.support import committer, conversation, send, unique

pytestmark = [pytest.mark.scylla, pytest.mark.cluster, pytest.mark.slow]
DC1, DC2 = (0, 1), (2,)


@pytest.fixture(scope="module")
def two_dcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    server = start_cluster(Path(tmp_path_factory.mktemp("two-dcs")), 3, dcs=2)
    assert server.cluster is not None
    assert [server.cluster.dc_of(i) for i in range(3)] == ["dc1", "dc1", "dc2"]
    try:
        yield server
    finally:
        server.cluster.stop()


async def open_in(server: ClusterServer, keyspace: str, dc: str, serial: str) -> Backend:
    local = serial == "LOCAL_SERIAL"
    return await open_scylla_backend(
        server.hosts,
        port=server.port,
        keyspace=keyspace,
        local_dc=dc,
        consistency="LOCAL_QUORUM" if local else "QUORUM",
        serial_consistency=serial,
        request_timeout_s=3.0,
    )


async def set_nodes(server: ClusterServer, down: tuple[int, ...]) -> None:
    """Nodes in ``down`` stopped, every other node running (started before stopping,
    so that a restarting node always finds the seed)."""
    cluster = server.cluster
    assert cluster is not None
    for i in range(3):
        if i not in down and not cluster.nodes[i].is_running():
            await asyncio.to_thread(cluster.start_node, i)
    for i in down:
        await asyncio.to_thread(cluster.stop_node, i)


async def commit_or_error(backend: Backend, req: AuthenticatedSend) -> object:
    """The ACK ``backend``'s committer gives ``req``, or the error it raised."""
    try:
        return await committer(backend).commit_send(req)
    except (CommitError, StoreError) as exc:
        return exc


@pytest.mark.parametrize("serial", ["LOCAL_SERIAL", "SERIAL"])
async def test_a_send_retried_in_the_other_dc(two_dcs: ClusterServer, serial: str) -> None:
    await set_nodes(two_dcs, down=())  # the other case may have left a DC down
    keyspace = unique("mcdc").replace("-", "_")
    await migrate(two_dcs.hosts, port=two_dcs.port, keyspace=keyspace,
                  replication=two_dcs.replication, request_timeout_s=30)  # fmt: skip
    tenant = unique("t")
    setup = await open_in(two_dcs, keyspace, "dc1", "SERIAL")
    await conversation(setup, tenant)  # written to every node while all are up
    await setup.close()
    req = send(tenant)

    await set_nodes(two_dcs, down=DC2)
    dc1 = await open_in(two_dcs, keyspace, "dc1", serial)
    first: CommittedMessage = await committer(dc1).commit_send(req)
    await dc1.close()

    await set_nodes(two_dcs, down=())
    dc2 = await open_in(two_dcs, keyspace, "dc2", serial)  # a replica running in dc2
    try:
        await set_nodes(two_dcs, down=DC1)
        retried = await commit_or_error(dc2, req)
        print(f"\n{serial}: ACK in dc1 {first}\n{serial}: same send retried in dc2 -> {retried!r}")
        if serial == "LOCAL_SERIAL":
            assert isinstance(retried, CommittedMessage)
            assert retried.message_id != first.message_id  # a second ACK for one key
            return
        assert not isinstance(retried, CommittedMessage)  # refused: no quorum of all replicas
        await set_nodes(two_dcs, down=())
        again = await commit_or_error(dc2, req)
        print(f"{serial}: retried in dc2 once dc1 is back -> {again!r}")
        assert again == first
    finally:
        await dc2.close()
