"""The bench lets the relay inside the server deliver earlier phases' commits before
a phase starts (issue 27): the in-process floors commit some 150,000 messages in a
few seconds, and their delivery was billed to the next round's gRPC floor (its
server CPU per Check 637 to 999 us instead of about 290, p99 0.9 to 1.3 s).

A real in-process server (the bench's own) with its relay; the commits go
through the server's backend in-process, as the floors' do.
"""

from __future__ import annotations

from service.domain.mailbox import Mailbox
from service.domain.ports import SystemClock
from tests.conformance.relay_support import inbox
from tests.support import committer, send, unique
from toolkit.bench.environment import BackendAddress, Environment, run_tag

MESSAGES = 2_000
DRAIN_LIMIT_S = 120.0


async def test_the_bench_waits_for_the_in_process_relay_to_deliver_earlier_commits() -> None:
    env = Environment(BackendAddress(), run_tag())
    target = await env.start("memory")
    try:
        backend = target.floor_backend
        assert backend is not None and target.server is not None
        tenant = unique("t")
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        c = committer(backend, SystemClock())
        for n in range(MESSAGES):  # a memory commit never suspends: the relay waits
            await c.commit_send(send(tenant, "c1", cmid=f"m{n}"))
        assert (await backend.outbox.read("", 1)).entries  # a backlog, as after the floors

        waited = await target.relay_drained(DRAIN_LIMIT_S)

        assert waited is not None and waited > 0
        assert not (await backend.outbox.read("", 1)).entries
        bob = await inbox(backend, Mailbox.inbox(tenant, "bob"))
        assert bob == [("c1", seq) for seq in range(1, MESSAGES + 1)]
    finally:
        await target.close()
        env.close()


async def test_without_an_in_process_relay_there_is_nothing_to_wait_for() -> None:
    env = Environment(BackendAddress(), run_tag())
    target = await env.start("memory")
    try:
        assert target.server is not None
        target.server.relay = None  # as on Redis and Scylla: the relay is a process
        assert await target.relay_drained(DRAIN_LIMIT_S) == 0.0
    finally:
        await target.close()
        env.close()
