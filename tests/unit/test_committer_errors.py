"""What the committer hands back when it cannot finish: a Recoverable that names
the key, the conversation and the stage (the gRPC error details are built from
them, and a client resumes with them), and no per-key state left behind.

Each case was a surviving mutant (docs/mutation.md): a Recoverable built with
the conversation or the key missing would turn a retryable UNAVAILABLE into an
error the details cannot even be encoded for.
"""

from __future__ import annotations

import pytest

from backends.memory import open_memory_backend
from service.domain.committer import MessageCommitter
from service.domain.errors import QuotaExceeded, Recoverable, StoreConflict
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.ids import CommitKey
from service.domain.limits import CommitLimits
from service.domain.model import CommitIntent, LoadedCommit
from service.domain.ports import Backend, MessageStore
from tests.support import NO_QUOTA, send, unique
from toolkit.campaign.faulty import CallFault, FaultyStore


class _VanishingStore(FaultyStore):
    """Refuses put_record as another worker's advance would, then reads nothing."""

    async def put_record(self, intent: CommitIntent) -> None:
        raise StoreConflict("intent does not match the stored one")

    async def load_commit(self, key: CommitKey, conversation: str) -> LoadedCommit | None:
        return None


async def _setup(store_of: type[FaultyStore] = FaultyStore) -> tuple[Backend, FaultyStore, str]:
    backend = open_memory_backend()
    tenant = unique("t")
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    return backend, store_of(backend.store), tenant


def _committer(backend: Backend, store: MessageStore, max_steps: int = 8) -> MessageCommitter:
    return MessageCommitter(
        store, backend.membership, backend.outbox, limits=NO_QUOTA, max_steps=max_steps
    )


@pytest.mark.parametrize(
    ("operation", "fault", "stage"),
    [
        ("reserve", CallFault.FAIL, "reserve failed"),
        ("put_record", CallFault.REFUSE, "store refused failed"),
        ("mark_published_and_committed", CallFault.REFUSE, "store refused failed"),
    ],
)
async def test_a_recoverable_names_key_conversation_and_stage(
    operation: str, fault: CallFault, stage: str
) -> None:
    backend, store, tenant = await _setup()
    req = send(tenant)
    store.inject(operation, fault)
    with pytest.raises(Recoverable) as caught:
        await _committer(backend, store).commit_send(req)
    exc = caught.value
    assert (exc.key, exc.conversation, exc.reason) == (req.key, "c1", stage)
    assert exc.cause in ("StoreUnavailable", "StoreCorrupt")


async def test_an_intent_that_vanished_on_re_read_is_recoverable_for_its_key() -> None:
    backend, store, tenant = await _setup(_VanishingStore)
    req = send(tenant)
    with pytest.raises(Recoverable) as caught:
        await _committer(backend, store).commit_send(req)
    exc = caught.value
    assert (exc.key, exc.conversation, exc.reason) == (req.key, "c1", "intent unreadable failed")
    assert exc.cause == "StoreConflict"


async def test_no_progress_is_recoverable_for_its_key() -> None:
    backend, store, tenant = await _setup()
    req = send(tenant)
    store.inject("mark_published_and_committed", CallFault.FAIL, times=100)
    with pytest.raises(Recoverable) as caught:
        await _committer(backend, store, max_steps=3).commit_send(req)
    exc = caught.value
    assert (exc.key, exc.conversation, exc.reason, exc.cause) == (
        req.key, "c1", "no progress after retries", "NoProgress",
    )  # fmt: skip


async def test_no_per_key_state_outlives_a_call_and_each_fresh_send_costs_one_token() -> None:
    backend = open_memory_backend()
    tenant = unique("t")
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    limits = CommitLimits(sender_rate_per_s=0.001, sender_burst=3)
    c = MessageCommitter(backend.store, backend.membership, backend.outbox, limits=limits)
    first = send(tenant)
    ack = await c.commit_send(first)
    assert await c.commit_send(first) == ack  # a replay is refunded
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit_send(send(tenant))
    assert not c._attempts  # nothing per key is kept once a call returns or fails
    await c.commit_send(send(tenant))  # the third token
    with pytest.raises(QuotaExceeded):
        await c.commit_send(send(tenant))
    assert not c._attempts
