"""An append decided from two quorum reads that are not one snapshot appends nothing
twice, on the CQL node (issue 25: the e2e nemesis on the 3-node cluster found one
message at seqs 70 and 71 of one inbox, after a relay handover).

An append reads the lane's statics and the dedupe rows of its messages in parallel.
While an earlier append's Paxos commit is still reaching the replicas, the statics
read can already see its version and the dedupe read miss its rows. The test makes
that happen deterministically: the second append's dedupe read answers what the
replicas held before the first append (nothing), its statics read the truth. Before
the fix the batch was conditional on ``version`` alone and applied: the message was
appended again at the next seq.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest

from backends.scylla.mailbox import STATEMENTS, ScyllaMailboxStore
from backends.scylla.session import CqlSession, Row
from service.domain.delivery import AppendRequest, MailboxSettings
from service.domain.mailbox import Mailbox, MailboxItem
from service.domain.model import MessageRecord
from service.domain.ports import ManualClock
from service.domain.relay import Fence
from tests.servers.cql_server import ScyllaHarness
from tests.support import text, unique

pytestmark = pytest.mark.scylla

FENCE = Fence("p-test", 1)


class LaggingDedupe:
    """A session whose first dedupe read (``mb.ids``) answers from replicas that
    have not applied the earlier append yet; every other request is the node's."""

    def __init__(self, cql: CqlSession) -> None:
        self._cql = cql
        self.lagged = 0

    async def read(self, name: str, params: Any, *, serial: bool = False) -> list[Row]:
        if name == "mb.ids" and not serial and not self.lagged:
            self.lagged += 1
            return []
        return await self._cql.read(name, params, serial=serial)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cql, name)


def item(tenant: str) -> MailboxItem:
    record = MessageRecord(
        tenant=tenant,
        conversation="c1",
        seq=1,
        message_id=unique("m"),
        sender="alice",
        device="d1",
        cmid="k1",
        content=text("hi"),
        mentions=(),
        reply_to="",
        server_ts_ms=1_700_000_000_000,
    )
    return MailboxItem(record, membership_version=1)


async def test_an_append_whose_dedupe_read_lags_its_statics_read_appends_nothing_twice(
    scylla: ScyllaHarness,
) -> None:
    cql = await CqlSession.connect(
        [scylla.host], port=scylla.port, keyspace=scylla.keyspace, requests=Counter()
    )
    try:
        await cql.prepare(STATEMENTS)
        clock = ManualClock()
        tenant = unique("t")
        inbox = Mailbox.inbox(tenant, "bob")
        message = item(tenant)
        store = ScyllaMailboxStore(cql, MailboxSettings(), clock)
        first = await store.append([AppendRequest(inbox, (message,))], FENCE)
        assert (first[0].added, first[0].head) == (1, 1)

        lagging = LaggingDedupe(cql)
        relay_b = ScyllaMailboxStore(cast(CqlSession, lagging), MailboxSettings(), clock)
        again = await relay_b.append([AppendRequest(inbox, (message,))], FENCE)

        assert lagging.lagged == 1  # the lagging read did answer this append
        assert (again[0].added, again[0].duplicates, again[0].head) == (0, 1, 1)
        (lane,) = await store.lane_state([inbox])
        assert lane.head == 1  # one entry: the message was not appended again
    finally:
        await cql.close()
