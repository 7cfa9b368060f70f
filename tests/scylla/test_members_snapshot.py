"""A membership change decided from quorum reads that are not one snapshot loses
nothing, on the CQL node.

A change reads the conversation's statics, then the rows of the users it names,
and writes ``IF version = <read>``. While an earlier change's Paxos commit is still
reaching the replicas, a plain statics read can see its version and the users' read
miss its rows (the mailbox append had exactly this, found by the e2e nemesis on the
3-node cluster). The session below answers the users' read from before the earlier
change until a serial read is made (a serial read finishes the change on a quorum).
Before the fix the statics were read plain: a removal answered "done" and changed
nothing (the user stayed a member), and an add rewrote the user's row from nothing,
losing the intervals of an earlier membership (History's authorisation of that
period). Now the statics are read serially first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from backends.scylla.members import STATEMENTS, ScyllaMembershipStore
from backends.scylla.session import CqlSession, Row
from service.domain.ports import ManualClock
from tests.servers.cql_server import ScyllaHarness
from tests.support import unique

pytestmark = pytest.mark.scylla


class LaggingUsers:
    """A session whose plain reads of users' rows (``mem.users``) answer from replicas
    that have not applied the earlier change, until a serial read has been made: a
    serial read finishes the change on a quorum (Paxos commits what it finds on some
    replicas only), after which no quorum read misses it. Every other request is the
    node's."""

    def __init__(self, cql: CqlSession, before: list[Row]) -> None:
        self._cql = cql
        self._before = before
        self.repaired = False

    async def read(self, name: str, params: Any, *, serial: bool = False) -> list[Row]:
        self.repaired = self.repaired or serial
        if name == "mem.users" and not self.repaired:
            return self._before
        return await self._cql.read(name, params, serial=serial)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cql, name)


@pytest.fixture
async def cql(scylla: ScyllaHarness) -> AsyncIterator[CqlSession]:
    session = await CqlSession.connect(
        [scylla.host], port=scylla.port, keyspace=scylla.keyspace, requests=Counter()
    )
    try:
        await session.prepare(STATEMENTS)
        yield session
    finally:
        await session.close()


async def test_a_removal_whose_users_read_lags_still_removes(cql: CqlSession) -> None:
    clock = ManualClock()
    tenant = unique("t")
    store = ScyllaMembershipStore(cql, clock)
    await store.create_conversation(tenant, "c1", ["alice"])
    await store.add_members(tenant, "c1", ["mallory"])  # version 2; a lagging read misses it

    lagging = LaggingUsers(cql, before=[])
    info = await ScyllaMembershipStore(cast(CqlSession, lagging), clock).remove_members(
        tenant, "c1", ["mallory"]
    )

    assert info.version == 3
    member, _ = await store.member_now(tenant, "c1", "mallory")
    assert not member


async def test_an_add_whose_users_read_lags_keeps_the_earlier_intervals(cql: CqlSession) -> None:
    clock = ManualClock()
    tenant = unique("t")
    store = ScyllaMembershipStore(cql, clock)
    await store.create_conversation(tenant, "c1", ["alice", "bob"])  # version 1
    await store.remove_members(tenant, "c1", ["bob"])  # version 2; a lagging read misses it

    lagging = LaggingUsers(cql, before=[])  # as if bob had never been a member
    info = await ScyllaMembershipStore(cast(CqlSession, lagging), clock).add_members(
        tenant, "c1", ["bob"]
    )

    assert info.version == 3
    assert await store.member_intervals(tenant, "c1", "bob") == (1, 2, 3)
