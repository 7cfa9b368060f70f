"""Two backend instances (two replicas) committing into one conversation at once."""

from __future__ import annotations

import asyncio

import pytest

from service.domain.committer import MessageCommitter
from service.domain.errors import Recoverable, Unavailable
from service.domain.model import AuthenticatedSend, CommittedMessage
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, conversation, send, text, unique
from toolkit.campaign.invariants import Ledger, check_invariants, read_history

pytestmark = pytest.mark.scylla

PER_REPLICA = 12


async def _commit(c: MessageCommitter, req: AuthenticatedSend) -> CommittedMessage:
    for _ in range(10):  # contention on a loaded machine may time out: the same key finishes it
        try:
            return await c.commit_send(req)
        except (Recoverable, Unavailable):
            await asyncio.sleep(0.1)
    return await c.commit_send(req)


async def test_two_replicas_never_give_one_seq_to_two_messages(scylla: ScyllaHarness) -> None:
    one, two = await scylla.open(), await scylla.open()
    tenant = unique("t")
    await conversation(one, tenant)
    c1, c2 = committer(one), committer(two)
    reqs = [send(tenant, content=text(f"m{i}")) for i in range(2 * PER_REPLICA)]
    acks = await asyncio.gather(*(_commit(c1 if i % 2 else c2, req) for i, req in enumerate(reqs)))
    seqs = sorted(a.seq for a in acks)
    assert seqs == list(range(1, 2 * PER_REPLICA + 1))  # distinct, and no gap either
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    for req, ack in zip(reqs, acks, strict=True):
        ledger.acked(req, ack)
        assert await _commit(c1 if ack.seq % 2 else c2, req) == ack  # either replica replays
    assert await check_invariants(two, ledger) == []
    history = await read_history(one, tenant, "c1", "bob")
    assert [r.seq for r in history] == seqs
