"""The e2e nemesis's ``new-epoch`` fault (``toolkit/nemesis/e2e/epochs.py``) on a real
Redis: it opens the backend from serve's flags and environment, starts the next epoch
of one user's inbox (old cursors then expire), and proves it by the epoch it reads
before and after; an inbox it never began in is no proof."""

from __future__ import annotations

import pytest

from service.domain.errors import CursorExpired
from service.domain.mailbox import Mailbox, MailboxCursor
from service.domain.ports import ManualClock
from tests.conformance.relay_support import drain, ports
from tests.servers.redis_server import open_initialised
from tests.support import committer, send, unique
from toolkit.nemesis.e2e.epochs import LaneEpochs

pytestmark = pytest.mark.redis


async def test_new_epoch_starts_the_users_inbox_next_epoch_and_proves_it(redis_url: str) -> None:
    prefix, tenant = unique("mc-nemesis-epoch"), unique("t")
    clock = ManualClock()
    backend = await open_initialised(redis_url, prefix, test_clock=clock)
    epochs = LaneEpochs(["--backend", "redis", "--redis-prefix", prefix],
                        {"MC_REDIS_URL": redis_url}, tenant)  # fmt: skip
    bob = Mailbox.inbox(tenant, "bob")
    try:
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m0"))
        await drain(backend, "relay-a", clock)
        assert await epochs.epoch("bob") == 1

        await epochs.begin("bob")
        assert await epochs.prove("bob") == (True, "inbox of bob: epoch 1 -> 2")
        with pytest.raises(CursorExpired):
            await ports(backend).mailbox.sync(bob, MailboxCursor("inbox", 1, 1), 100, 1 << 20)
        assert await epochs.epoch("alice") == 1  # another user's inbox is untouched
    finally:
        await epochs.close()
        await backend.close()


async def test_an_inbox_no_new_epoch_began_in_is_no_proof(redis_url: str) -> None:
    prefix, tenant = unique("mc-nemesis-epoch"), unique("t")
    backend = await open_initialised(redis_url, prefix)  # initialises the prefix
    await backend.close()
    epochs = LaneEpochs(["--backend", "redis", "--redis-prefix", prefix],
                        {"MC_REDIS_URL": redis_url}, tenant)  # fmt: skip
    try:
        await epochs.begin("bob")
        ok, _ = await epochs.prove("bob")
        assert ok
        ok, what = await epochs.prove("carol")  # never began
        assert (ok, what) == (False, "inbox of carol: no new epoch began (epoch 1)")
    finally:
        await epochs.close()


async def test_the_memory_backend_has_no_lane_outside_serve() -> None:
    epochs = LaneEpochs(["--backend", "memory"], {}, "t")
    with pytest.raises(RuntimeError, match="inside serve"):
        await epochs.begin("bob")
    await epochs.close()
