"""Conditional writes whose outcome is unknown (a CAS write timeout) converge.

An interceptor on the backend's driver session makes one conditional
statement time out as Paxos would: either after it applied (``applied``) or
before (``lost``). The commit must still reach exactly one history record at
the first seq, without a gap, and never be reported from guesswork.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from cassandra import ConsistencyLevel, ReadTimeout, WriteTimeout, WriteType

from backends.scylla.session import Row, Send
from service.domain.errors import Recoverable, StoreOutcomeUnknown
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.model import CommitState, InProgress, OutboxPublication
from tests.conformance.harness import Harness
from tests.scylla.conftest import store_of
from tests.support import committer, conversation, send, unique
from toolkit.campaign.invariants import Ledger, check_invariants

pytestmark = pytest.mark.scylla


@pytest.fixture(
    params=["single", pytest.param("cluster", marks=pytest.mark.cluster)],
    ids=["single-node", "cluster"],
)
async def scylla(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """The single node (RF 1) and the three-node cluster (RF 3, QUORUM / SERIAL)."""
    name = "scylla_harness" if request.param == "single" else "scylla_cluster_harness"
    harness: Harness = request.getfixturevalue(name)
    try:
        yield harness
    finally:
        await harness.close_all()


CONDITIONAL = ["batch:conv.seq", "c.reserve", "c.outboxed", "c.commit"]


def cas_timeout() -> WriteTimeout:
    return WriteTimeout(
        "injected",
        consistency=ConsistencyLevel.LOCAL_SERIAL,
        required_responses=1,
        received_responses=0,
        write_type=WriteType.CAS,
    )


class TimeoutOnce:
    """Times out the next send of one statement, after or instead of sending it."""

    def __init__(self, statement: str, applied: bool) -> None:
        self.statement = statement
        self.applied = applied
        self.fired = 0

    async def __call__(self, name: str, send_it: Send) -> list[Row]:
        if name != self.statement or self.fired:
            return await send_it()
        self.fired += 1
        if self.applied:
            await send_it()
        raise cas_timeout()


class BlindAfterCommit:
    """The commit-mark applies but times out, and every re-read of the intent fails."""

    def __init__(self) -> None:
        self.committed = False

    async def __call__(self, name: str, send_it: Send) -> list[Row]:
        if name == "c.commit":
            await send_it()
            self.committed = True
            raise cas_timeout()
        if name == "c.get" and self.committed:
            raise ReadTimeout("injected", consistency=ConsistencyLevel.LOCAL_SERIAL)
        return await send_it()


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "lost"])
@pytest.mark.parametrize("statement", CONDITIONAL)
async def test_a_cas_timeout_converges_to_one_commit_without_a_gap(
    scylla: Harness, statement: str, applied: bool
) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    fault = TimeoutOnce(statement, applied)
    store_of(backend).cql.interceptor = fault
    c = committer(backend)
    req = send(tenant)
    try:
        ack = await c.commit_send(req)
    except Recoverable:
        ack = await c.commit_send(req)
    assert fault.fired == 1
    assert ack.seq == 1
    assert await c.commit_send(req) == ack
    nxt = send(tenant)
    follow = await c.commit_send(nxt)
    assert follow.seq == 2  # an unknown outcome cost no seq
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    ledger.acked(req, ack)
    ledger.acked(nxt, follow)
    assert await check_invariants(backend, ledger) == []


async def test_an_undecidable_commit_mark_is_outcome_unknown_never_success(
    scylla: Harness,
) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    req = send(tenant)
    c.faults.arm(FaultPoint.BETWEEN_MARKS)
    with pytest.raises(InjectedCrash):
        await c.commit_send(req)
    loaded = await backend.store.load_commit(req.key, "c1")
    assert isinstance(loaded, InProgress) and loaded.intent.state is CommitState.OUTBOXED

    store_of(backend).cql.interceptor = BlindAfterCommit()
    with pytest.raises(StoreOutcomeUnknown):
        await backend.store.mark_committed(loaded.intent)
    store_of(backend).cql.interceptor = None
    ack = await c.commit_send(req)  # the commit did apply: the same key replays it
    assert ack == loaded.intent.committed_message()


async def test_a_lost_publish_mark_is_outcome_unknown_never_success(scylla: Harness) -> None:
    """The committer's next step would refuse too, but the publish-mark itself must not
    report a write it cannot see (a mutant dropping this re-read check lived)."""
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    req = send(tenant)
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit_send(req)
    loaded = await backend.store.load_commit(req.key, "c1")
    assert isinstance(loaded, InProgress)
    await backend.store.put_record(loaded.intent)
    recorded = loaded.intent.advanced(CommitState.RECORDED)
    fault = TimeoutOnce("c.outboxed", applied=False)
    store_of(backend).cql.interceptor = fault
    with pytest.raises(StoreOutcomeUnknown):
        await backend.store.mark_outbox_published(recorded, OutboxPublication("s", "1"))
    store_of(backend).cql.interceptor = None
    assert fault.fired == 1
    after = await backend.store.load_commit(req.key, "c1")
    assert isinstance(after, InProgress) and after.intent.state is CommitState.RECORDED
