"""One item's unexpected failure during recovery costs that item only (issue 24 item 5):
``recover_due`` caught only Recoverable, so any other exception while driving one
intent ended the whole run and left every later item unrecovered."""

from __future__ import annotations

import pytest

from backends.memory import open_memory_backend
from service.domain.committer import MessageCommitter
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.ids import CommitKey
from service.domain.model import CommitIntent
from service.domain.ports import ManualClock
from service.domain.recovery import RecoveryPolicy
from tests.support import NO_QUOTA, conversation, send, unique
from toolkit.campaign.faulty import FaultyStore

POLICY = RecoveryPolicy(first_retry_ms=1_000, max_retry_ms=4_000, quarantine_after=3)


class BuggyStore(FaultyStore):
    """A real store whose ``put_record`` of one key raises what no store should."""

    bad: CommitKey | None = None

    async def put_record(self, intent: CommitIntent) -> None:
        if intent.key == self.bad:
            raise RuntimeError("a defect, not a store error")
        await super().put_record(intent)


async def test_an_unexpected_exception_while_driving_one_item_does_not_end_the_run() -> None:
    clock = ManualClock()
    backend = open_memory_backend(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    store = BuggyStore(backend.store)
    c = MessageCommitter(store, backend.membership, backend.outbox, limits=NO_QUOTA, clock=clock,
                         recovery=POLICY)  # fmt: skip
    stuck = []
    for _ in range(4):
        request = send(tenant)
        c.faults.arm(FaultPoint.AFTER_RESERVE)
        with pytest.raises(InjectedCrash):
            await c.commit_send(request)
        stuck.append(request)
        clock.advance(1_000)
    store.bad = stuck[0].key  # the oldest: the scan meets it first
    clock.advance(60_000)
    report = await c.recover_due(clock.now_ms(), 100)
    assert (report.scanned, report.committed, report.failed) == (4, 3, 1)
    item = await c.recovery_item(stuck[0].key)
    assert item.attempts == 1 and "RuntimeError" in item.problem and not item.quarantined
