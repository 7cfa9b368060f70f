"""A restart of the CQL node keeps what was committed, and what was in progress."""

from __future__ import annotations

import uuid

import pytest

from backends.scylla.migrate import migrate
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.model import Direction, HistoryQuery, InProgress
from tests.servers.cql_server import CqlServer, ScyllaHarness
from tests.support import committer, conversation, send, unique
from toolkit.campaign.invariants import Ledger, check_invariants

pytestmark = [pytest.mark.scylla, pytest.mark.slow]


async def test_committed_data_survives_a_node_restart(
    own_cql_node: CqlServer, cql_server: CqlServer, cql_keyspace: str
) -> None:
    node = own_cql_node.node
    assert node is not None
    if own_cql_node is cql_server:
        keyspace = cql_keyspace
    else:  # a private node: it needs its own schema
        keyspace = f"mct_{uuid.uuid4().hex[:16]}"
        await migrate([node.host], port=node.port, keyspace=keyspace)
    harness = ScyllaHarness(node.host, node.port, keyspace)
    try:
        backend = await harness.open()
        tenant = unique("t")
        await conversation(backend, tenant)
        c = committer(backend)
        done = [send(tenant) for _ in range(3)]
        acks = [await c.commit_send(req) for req in done]
        pending = send(tenant)
        c.faults.arm(FaultPoint.BETWEEN_MARKS)
        with pytest.raises(InjectedCrash):
            await c.commit_send(pending)
        await harness.close_all()

        node.restart()

        reopened = await harness.open()
        c2 = committer(reopened)
        for req, ack in zip(done, acks, strict=True):
            assert await c2.commit_send(req) == ack
        loaded = await reopened.store.load_commit(pending.key, "c1")
        assert isinstance(loaded, InProgress) and loaded.intent.publication is not None
        finished = await c2.commit_send(pending)
        assert finished.seq == 4
        page = await c2.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
        assert [r.seq for r in page.records] == [1, 2, 3, 4]
        ledger = Ledger()
        ledger.conversation(tenant, "c1", "bob")
        for req, ack in [*zip(done, acks, strict=True), (pending, finished)]:
            ledger.acked(req, ack)
        assert await check_invariants(reopened, ledger) == []
    finally:
        await harness.close_all()
