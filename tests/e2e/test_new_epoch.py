"""``message-committer mailbox-new-epoch`` on a real Redis, as a real subprocess (issue 23,
item 3: an operator command that starts a lane's next epoch on purpose)."""

from __future__ import annotations

import pytest

from service.domain.errors import CursorExpired
from service.domain.mailbox import Mailbox, MailboxCursor
from service.domain.ports import ManualClock
from tests.conformance.relay_support import drain, ports
from tests.e2e.process import run_cli
from tests.servers.redis_server import initialise_prefix, open_initialised
from tests.support import committer, send, unique

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


async def test_an_operator_starts_a_new_epoch_and_old_cursors_expire(redis_url: str) -> None:
    prefix, tenant = unique("mc-epoch"), unique("t")
    await initialise_prefix(redis_url, prefix, shards=4)
    clock = ManualClock()
    backend = await open_initialised(redis_url, prefix, test_clock=clock)
    env = {"MC_REDIS_URL": redis_url, "MC_REDIS_PREFIX": prefix}
    bob = Mailbox.inbox(tenant, "bob")
    try:
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        for n in range(2):
            await committer(backend, clock).commit_send(send(tenant, "c1", cmid=f"m{n}"))
        await drain(backend, "relay-a", clock)
        (state,) = await ports(backend).mailbox.lane_state([bob])
        assert (state.epoch, state.head) == (1, 2)

        for bad in (
            ["--tenant", tenant, "--user", "bob", "--conversation", "c1"],  # both
            ["--tenant", tenant],  # neither
            ["--tenant", tenant, "--user", "not an id"],
        ):
            done = run_cli(["mailbox-new-epoch", "--backend", "redis", *bad], env)
            assert done.returncode == 2, done.stderr
            assert done.stderr.strip()
        memory = run_cli(
            ["mailbox-new-epoch", "--backend", "memory", "--tenant", tenant, "--user", "bob"], {}
        )
        assert memory.returncode == 2 and "inside serve" in memory.stderr
        assert await ports(backend).mailbox.lane_state([bob]) == [state]  # nothing written

        done = run_cli(
            ["mailbox-new-epoch", "--backend", "redis", "--tenant", tenant, "--user", "bob"], env
        )
        assert done.returncode == 0, done.stderr
        assert "lane inbox of user bob: epoch 1 (head 2) -> epoch 2" in done.stdout
        assert redis_url not in done.stdout + done.stderr
        with pytest.raises(CursorExpired) as caught:
            await ports(backend).mailbox.sync(bob, MailboxCursor("inbox", 1, 2), 100, 1 << 20)
        assert caught.value.epoch == 2
        alice = Mailbox.inbox(tenant, "alice")  # another lane is untouched
        assert [s.epoch for s in await ports(backend).mailbox.lane_state([alice])] == [1]
    finally:
        await backend.close()
