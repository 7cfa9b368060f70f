"""Subscribe streams have limits of their own, apart from unary RPCs (issue 23, item 6),
over real gRPC on the real server.

Before the fix every stream held one of the ``MC_MAX_CONCURRENT_RPCS`` slots for its
whole life: as many idle subscribers as the limit made Commit and Sync answer
RESOURCE_EXHAUSTED; and one user could open streams without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio

from service.api.limits import MAX_STREAMS_PER_USER
from service.domain.mailbox import MailboxCursor
from service.gen.message_committer.v1 import mailbox_pb2
from tests.e2e.conftest import Running, StartServer
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
    running = await start_server()
    async with streams(running, ["alice"] * MAX_STREAMS_PER_USER) as calls:
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
