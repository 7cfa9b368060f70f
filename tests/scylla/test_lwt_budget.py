"""What a commit costs in conditional writes, as the backend counts them."""

from __future__ import annotations

import asyncio

import pytest

from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, conversation, send, unique
from toolkit.campaign.invariants import Ledger, check_invariants

pytestmark = pytest.mark.scylla


async def test_fresh_commit_costs_four_lwts_and_six_reads_or_writes_a_replay_one_read(
    scylla: ScyllaHarness,
) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    await c.commit_send(send(tenant))  # first use of the outbox day row
    for _ in range(3):
        req = send(tenant)
        backend.requests.clear()
        ack = await c.commit_send(req)
        fresh = dict(backend.requests)
        assert fresh.get("lwt") == 4, fresh
        assert fresh.get("serial_read", 0) == 0, fresh
        assert fresh.get("statement") == 6, fresh  # 10 in all (issue 14; the wire agrees:
        backend.requests.clear()  # tests/scylla/test_wire_budget.py)
        assert await c.commit_send(req) == ack
        replay = dict(backend.requests)
        assert replay == {"statement": 1}, replay  # the commit row, before admission


async def test_concurrent_duplicates_consume_no_seq_across_two_backends(
    scylla: ScyllaHarness,
) -> None:
    one, two = await scylla.open(), await scylla.open()
    tenant = unique("t")
    await conversation(one, tenant)
    req = send(tenant)
    acks = await asyncio.gather(
        *(committer(b).commit_send(req) for b in (one, two) for _ in range(8))
    )
    assert len(set(acks)) == 1 and acks[0].seq == 1
    nxt = send(tenant)
    follow = await committer(two).commit_send(nxt)
    assert follow.seq == 2  # the duplicates took no seq of their own
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    for ack in acks:
        ledger.acked(req, ack)
    ledger.acked(nxt, follow)
    assert await check_invariants(one, ledger) == []
