"""Subscribe streams have limits of their own, apart from unary RPCs (issue 23, item 6),
over real gRPC on the real server.

Before the fix every stream held one of the ``MC_MAX_CONCURRENT_RPCS`` slots for its
whole life: as many idle subscribers as the limit made Commit and Sync answer
RESOURCE_EXHAUSTED; and one user could open streams without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import grpc
import pytest
from grpc import aio

from backends.memory import open_memory_backend
from service.bootstrap import build_server
from service.client import CommitClient
from service.domain.delivery import MailboxStore
from service.domain.mailbox import LaneState, Mailbox, MailboxCursor
from service.gen.message_committer.v1 import mailbox_pb2
from tests.conformance.relay_support import FlakyMailbox
from tests.e2e.conftest import BASE_CONFIG, FAST_RETRY, Running, StartServer
from tests.support import send

pytestmark = pytest.mark.e2e

LIMIT = 3
WAIT_S = 10.0
Stream = aio.UnaryStreamCall[mailbox_pb2.SubscribeRequest, mailbox_pb2.SubscribeResponse]


@contextlib.asynccontextmanager
async def streams(
    running: Running, users: list[str]
) -> AsyncIterator[
    list[aio.UnaryStreamCall[mailbox_pb2.SubscribeRequest, mailbox_pb2.SubscribeResponse]]
]:
    """One Subscribe stream per entry of ``users``, each past its first message."""
    calls = [running.client.subscribe("t1", user, heartbeat_seconds=60) for user in users]
    try:
        yield calls
    finally:
        for call in calls:
            call.cancel()


async def _first(call: Stream) -> mailbox_pb2.SubscribeResponse:
    response = await asyncio.wait_for(call.read(), WAIT_S)
    assert isinstance(response, mailbox_pb2.SubscribeResponse)
    return response


async def test_idle_subscribers_do_not_take_the_slots_of_unary_rpcs(
    start_server: StartServer,
) -> None:
    running = await start_server(max_concurrent_rpcs=LIMIT)
    await running.client.create_conversation("t1", "c1", ["alice", "bob"])
    users = [f"idle{n}" for n in range(2 * LIMIT)]
    async with streams(running, users) as calls:
        for call in calls:
            assert (await _first(call)).hint.lane == "inbox"
        ack = await running.client.commit(send("t1", "c1", cmid="while-subscribed"))
        assert ack.seq == 1
        page = await running.client.sync("t1", "bob", MailboxCursor())
        assert page.next_cursor.epoch == 1


async def test_one_user_cannot_open_streams_without_bound(start_server: StartServer) -> None:
    running = await start_server(max_streams_per_user=LIMIT)
    async with streams(running, ["alice"] * LIMIT) as calls:
        for call in calls:
            await _first(call)
        async with streams(running, ["alice", "bob"]) as (extra, other):
            with pytest.raises(aio.AioRpcError) as caught:
                await _first(extra)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "per user" in (caught.value.details() or "")
            assert (await _first(other)).hint.lane == "inbox"  # another user: served
    async with streams(running, ["alice"]) as (again,):  # the slots were given back
        assert (await _first(again)).hint.lane == "inbox"


async def test_a_replica_serves_at_most_its_streams(start_server: StartServer) -> None:
    running = await start_server(max_streams=LIMIT)
    await running.client.create_conversation("t1", "c1", ["alice", "bob"])
    async with streams(running, [f"u{n}" for n in range(LIMIT)]) as calls:
        for call in calls:
            await _first(call)
        async with streams(running, ["one-more"]) as (extra,):
            with pytest.raises(aio.AioRpcError) as caught:
                await _first(extra)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"more than {LIMIT} streams on this replica" in (caught.value.details() or "")
        ack = await running.client.commit(send("t1", "c1", cmid="unary-still-served"))
        assert ack.seq == 1


class CountedLanes(FlakyMailbox):
    """A real mailbox store (nothing injected) that records each ``lane_state`` call."""

    def __init__(self, inner: MailboxStore) -> None:
        super().__init__(inner)
        self.calls: list[frozenset[Mailbox]] = []

    async def lane_state(self, mailboxes: Sequence[Mailbox]) -> list[LaneState]:
        self.calls.append(frozenset(mailboxes))
        return await self.inner.lane_state(mailboxes)


async def test_lanes_are_watched_once_per_process_not_polled_per_stream() -> None:
    backend = open_memory_backend()
    assert backend.delivery is not None
    counted = CountedLanes(backend.delivery.mailbox)
    backend = replace(backend, delivery=replace(backend.delivery, mailbox=counted))
    server = build_server(replace(BASE_CONFIG, subscribe_poll_interval=0.05), backend)
    await server.start()
    client = CommitClient.connect(f"127.0.0.1:{server.grpc_port}", retry=FAST_RETRY)
    idle = [f"idle{n}" for n in range(20)]
    lanes = {Mailbox.inbox("t1", u) for u in idle}
    calls = [client.subscribe("t1", user, heartbeat_seconds=60) for user in [*idle, "bob"]]
    try:
        await client.create_conversation("t1", "c1", ["alice", "bob"])
        for call in calls:
            await _first(call)
        counted.calls.clear()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while len([c for c in counted.calls if c & lanes]) < 10:  # ten rounds of the watcher
            assert loop.time() < deadline, "the lanes were not watched"
            await asyncio.sleep(0.01)
        watching = [c for c in counted.calls if c & lanes]
        assert all(lanes <= c for c in watching), "a stream read its own lanes"
        await client.commit(send("t1", "c1", cmid="wake-bob"))
        for _ in range(10):  # bob's stream is woken with the new head
            response = await asyncio.wait_for(calls[-1].read(), WAIT_S)
            assert isinstance(response, mailbox_pb2.SubscribeResponse)
            if response.HasField("hint") and response.hint.seq == 1:
                break
        else:
            raise AssertionError("no hint for the delivered message")
    finally:
        for call in calls:
            call.cancel()
        await client.close()
        await server.stop(grace_s=0.5)
