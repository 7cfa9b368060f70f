"""MailboxService and ListConversations over real gRPC, on a server whose relay runs
inside serve (memory): Sync pages, CURSOR_EXPIRED, authorisation, Subscribe hints,
big-conversation lanes and bad input."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from service.domain.errors import (
    ConversationNotFound,
    CursorExpired,
    InvalidRequest,
    NotAMember,
)
from service.domain.mailbox import Mailbox, MailboxCursor
from service.gen.message_committer.v1 import mailbox_pb2
from tests.e2e.conftest import Running, StartServer, eventually
from tests.support import send

pytestmark = pytest.mark.e2e


async def _synced(running: Running, user: str, cursor: MailboxCursor) -> list[tuple[str, int]]:
    page = await running.client.sync("t1", user, cursor, limit=1000)
    return [(e.record.conversation, e.record.seq) for e in page.entries]


async def test_committed_messages_reach_each_members_inbox_through_sync(running: Running) -> None:
    client = running.client
    await client.create_conversation("t1", "c1", ["alice", "bob"])
    await client.create_conversation("t1", "c2", ["bob", "carol"])
    for n in range(3):
        await client.commit(send("t1", "c1", cmid=f"a{n}"))
    await client.commit(send("t1", "c2", sender="carol", cmid="c0"))

    async def delivered() -> bool:
        return len(await _synced(running, "bob", MailboxCursor())) == 4

    await eventually(delivered)
    page = await client.sync("t1", "bob", MailboxCursor(), limit=1000)
    by_conversation = [(e.record.conversation, e.record.seq) for e in page.entries]
    assert [s for c, s in by_conversation if c == "c1"] == [1, 2, 3]
    assert page.next_cursor.epoch == 1 and page.next_cursor.seq == 4 and not page.more
    assert page.entries[0].record.content.body == b"hello"
    assert all(e.appended_ms >= e.record.server_ts_ms for e in page.entries)
    again = await client.sync("t1", "bob", page.next_cursor)
    assert again.entries == () and again.next_cursor == page.next_cursor
    assert await _synced(running, "alice", MailboxCursor()) == [("c1", 1), ("c1", 2), ("c1", 3)]
    listed, token = await client.list_conversations("t1", "bob")
    assert [(c.conversation, c.lane, c.member_count) for c in listed] == [
        ("c1", "inbox", 2),
        ("c2", "inbox", 2),
    ]
    assert token == ""


async def test_a_trim_answers_cursor_expired_never_an_empty_page(running: Running) -> None:
    client = running.client
    await client.create_conversation("t1", "c1", ["alice", "bob"])
    for n in range(4):  # one at a time: each its own group, so a trim may cut after any
        await client.commit(send("t1", "c1", cmid=f"a{n}"))

        async def delivered(count: int = n + 1) -> bool:
            return len(await _synced(running, "bob", MailboxCursor())) == count

        await eventually(delivered)
    assert running.backend.delivery is not None
    state = await running.backend.delivery.mailbox.trim(Mailbox.inbox("t1", "bob"), 2)
    assert state.watermark >= 2
    for cursor in (MailboxCursor(), MailboxCursor("inbox", 1, 1), MailboxCursor("inbox", 7, 4)):
        with pytest.raises(CursorExpired) as caught:
            await client.sync("t1", "bob", cursor)
        assert (caught.value.lane, caught.value.epoch) == ("inbox", 1)
        assert caught.value.trim_watermark == state.watermark
    rest = await client.sync("t1", "bob", MailboxCursor("inbox", 1, state.watermark))
    assert [e.seq for e in rest.entries] == list(range(state.watermark + 1, 5))
    assert rest.trim_watermark == state.watermark


async def test_big_conversations_sync_their_own_lane_for_members_only(
    start_server: StartServer,
) -> None:
    running = await start_server(fanout_threshold=2)
    client = running.client
    await client.create_conversation("t1", "big", ["u1", "u2", "u3"])
    await client.create_conversation("t1", "small", ["u1", "u2"])
    await client.commit(send("t1", "big", sender="u1", cmid="b0"))
    await client.commit(send("t1", "small", sender="u1", cmid="s0"))
    lane = MailboxCursor("conversation:big")

    async def delivered() -> bool:  # the two conversations may sit in different partitions
        inbox = await _synced(running, "u2", MailboxCursor())
        return len(await _synced(running, "u2", lane)) == 1 and len(inbox) == 1

    await eventually(delivered)
    assert await _synced(running, "u2", MailboxCursor()) == [("small", 1)]  # not the big one
    listed, _ = await client.list_conversations("t1", "u2")
    assert [(c.conversation, c.lane) for c in listed] == [
        ("big", "conversation:big"),
        ("small", "inbox"),
    ]
    with pytest.raises(NotAMember):
        await client.sync("t1", "mallory", lane)
    with pytest.raises(ConversationNotFound):
        await client.sync("t1", "u2", MailboxCursor("conversation:nope"))
    await client.remove_members("t1", "big", ["u3"])
    # u3 keeps reading what was sent while it was a member (tests/e2e/test_lane_reading.py)
    assert await _synced(running, "u3", lane) == [("big", 1)]
    listed, _ = await client.list_conversations("t1", "u3")
    assert listed == []  # the index entry is gone, and would be filtered anyway


async def test_list_conversations_pages_and_never_shows_a_stale_entry(running: Running) -> None:
    client = running.client
    for n in range(5):
        await client.create_conversation("t1", f"c{n}", ["alice", "bob"])
    assert running.backend.delivery is not None
    await running.backend.delivery.index.add("t1", "ghost", ["alice"])  # a crash left it there
    first, token = await client.list_conversations("t1", "alice", page_size=3)
    assert [c.conversation for c in first] == ["c0", "c1", "c2"] and token
    second, end = await client.list_conversations("t1", "alice", page_size=3, page_token=token)
    assert [c.conversation for c in second] == ["c3", "c4"]  # "ghost" was filtered out
    assert end == ""
    with pytest.raises(InvalidRequest):
        await client.list_conversations("t1", "alice", page_token="not-ours")


async def test_list_left_conversations_pages_departures_and_skips_members_again(
    running: Running,
) -> None:
    client = running.client
    for n in range(3):
        await client.create_conversation("t1", f"c{n}", ["alice", "bob"])
        await client.remove_members("t1", f"c{n}", ["alice"])
    await client.add_members("t1", "c1", ["alice"])  # a member again: ListConversations has it
    first, token = await client.list_left_conversations("t1", "alice", page_size=2)
    assert [c.conversation for c in first] == ["c0"] and token  # c1 confirmed away
    assert (first[0].lane, first[0].left_at_version) == ("inbox", 2)
    second, end = await client.list_left_conversations("t1", "alice", page_size=2, page_token=token)
    assert [c.conversation for c in second] == ["c2"] and end == ""
    assert first[0].left_at_ms <= second[0].left_at_ms
    later, _ = await client.list_left_conversations(
        "t1", "alice", left_after_ms=second[0].left_at_ms + 1
    )
    assert later == []
    assert (await client.list_left_conversations("t1", "bob"))[0] == []
    _, other_listing = await client.list_conversations("t1", "bob", page_size=1)
    for bad in (
        {"page_token": "not-ours"},
        {"page_token": other_listing},
        {"page_size": 1001},
        {"left_after_ms": 2**63},
    ):
        with pytest.raises(InvalidRequest):
            await client.list_left_conversations("t1", "alice", **bad)
    with pytest.raises(InvalidRequest):
        await client.list_left_conversations("t1", "bad user")


async def test_subscribe_sends_hints_and_heartbeats_and_never_entries(running: Running) -> None:
    client = running.client
    await client.create_conversation("t1", "c1", ["alice", "bob"])
    stream = client.subscribe("t1", "bob", heartbeat_seconds=1)
    seen: list[mailbox_pb2.SubscribeResponse] = []

    async def read() -> None:
        async for message in stream:
            seen.append(message)

    reader = asyncio.create_task(read())
    try:
        await eventually(lambda: _has(seen, "hint", 0))
        await client.commit(send("t1", "c1", cmid="a0"))
        await eventually(lambda: _has(seen, "hint", 1), timeout_s=10)
        await eventually(lambda: _has(seen, "heartbeat", 0), timeout_s=10)
        hints = [m.hint for m in seen if m.WhichOneof("kind") == "hint"]
        assert [(h.lane, h.epoch) for h in hints] == [("inbox", 1), ("inbox", 1)]
        assert [h.seq for h in hints] == [0, 1]
    finally:
        stream.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader


async def _has(seen: list[mailbox_pb2.SubscribeResponse], kind: str, seq: int) -> bool:
    for message in seen:
        if message.WhichOneof("kind") == kind and (kind != "hint" or message.hint.seq == seq):
            return True
    return False


@pytest.mark.parametrize(
    ("request_fields", "fragment"),
    [
        ({"tenant": "t1", "user": "bob", "limit": 1001}, "limit"),
        ({"tenant": "t1", "user": "bob", "max_bytes": 10}, "max_bytes"),
        ({"tenant": "t1", "user": "b o b"}, "user"),
        ({"tenant": "t1", "user": "bob", "cursor": {"lane": "outbox"}}, "cursor.lane"),
        ({"tenant": "t1", "user": "bob", "cursor": {"lane": "inbox", "seq": 5}}, "epoch 0"),
        # uint64 on the wire, bigint on Scylla (a query it cannot encode): issue 23, item 9
        ({"tenant": "t1", "user": "bob", "cursor": {"epoch": 1, "seq": 2**63}}, "below 2^63"),
        ({"tenant": "t1", "user": "bob", "cursor": {"epoch": 2**64 - 1}}, "below 2^63"),
    ],
)
async def test_bad_sync_requests_are_invalid_argument(
    running: Running, request_fields: dict[str, object], fragment: str
) -> None:
    cursor = request_fields.pop("cursor", None)
    request = mailbox_pb2.SyncRequest(**request_fields)  # type: ignore[arg-type]
    if isinstance(cursor, dict):
        request.cursor.CopyFrom(mailbox_pb2.MailboxCursor(**cursor))
    channel = aio.insecure_channel(running.target)
    try:
        call = channel.unary_unary(
            "/message_committer.v1.MailboxService/Sync",
            request_serializer=mailbox_pb2.SyncRequest.SerializeToString,
            response_deserializer=mailbox_pb2.SyncResponse.FromString,
        )
        with pytest.raises(aio.AioRpcError) as caught:
            await call(request, timeout=5)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in (caught.value.details() or "")
    finally:
        await channel.close()
