"""Every RPC of both v1 services, and every error code, over a real server and client."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc import aio

from service.api import errors
from service.api.errors import ConversationExists
from service.domain.errors import (
    CommitNotFound,
    ConversationNotFound,
    IdempotencyConflict,
    InvalidClientMessageId,
    InvalidRequest,
    NotAMember,
    QuotaExceeded,
    Recoverable,
    Unavailable,
)
from service.domain.faults import FaultPoint
from service.domain.ids import CommitKey
from service.domain.model import (
    BodyReference,
    Direction,
    HistoryQuery,
    MessageContent,
    MessageType,
)
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import committer_pb2_grpc, membership_pb2_grpc
from service.gen.message_committer.v1 import membership_pb2 as mpb
from tests.e2e.conftest import Running, StartServer
from tests.support import send, text
from toolkit.campaign.faulty import CallFault

pytestmark = pytest.mark.e2e

T = "t1"


@pytest.fixture
async def chat(running: Running) -> Running:
    await running.client.create_conversation(T, "c1", ["alice", "bob"])
    return running


@pytest.fixture
async def raw(running: Running) -> AsyncIterator[aio.Channel]:
    async with aio.insecure_channel(running.target) as channel:
        yield channel


async def status_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str, errors.StatusDetails]:
    """The code, message and parsed details of a call that must fail."""
    with pytest.raises(aio.AioRpcError) as caught:
        await call
    err = caught.value
    trailers = [(k, v) for k, v in err.trailing_metadata() or ()]
    return err.code(), err.details() or "", errors.parse_details(trailers)


def history(conversation: str = "c1", actor: str = "bob", **kw: Any) -> HistoryQuery:
    return HistoryQuery(tenant=T, conversation=conversation, actor=actor, **kw)


async def test_commit_replay_and_conflict(chat: Running) -> None:
    client = chat.client
    first = await client.commit(send(T, cmid="m-1", content=text("hi")))
    assert (first.conversation, first.cmid, first.seq) == ("c1", "m-1", 1)
    assert await client.commit(send(T, cmid="m-1", content=text("hi"))) == first
    with pytest.raises(IdempotencyConflict) as conflict:
        await client.commit(send(T, cmid="m-1", content=text("hi, edited")))
    assert conflict.value.key == CommitKey(T, "alice", "m-1")
    page = await client.history(history())
    assert [(r.seq, r.cmid, r.content.body) for r in page.records] == [(1, "m-1", b"hi")]


async def test_every_rpc_round_trips(chat: Running) -> None:
    client = chat.client
    image = MessageContent(MessageType.IMAGE, body_ref=BodyReference("s3://b/o", 123, "ab" * 32))
    custom = MessageContent(MessageType.CUSTOM, body=b"{}", custom_type="poll")
    acks = [
        await client.commit(send(T, cmid="a", content=text("one"), mentions=("bob",))),
        await client.commit(send(T, cmid="b", content=image, sender="bob")),
        await client.commit(
            send(T, cmid="c", content=custom, reply_to="01a22a20-5697-7d07-b8d6-97d3bdc6084c")
        ),
    ]
    assert [a.seq for a in acks] == [1, 2, 3]

    back = await client.history(history(limit=2))
    assert [r.seq for r in back.records] == [3, 2] and back.next_anchor == 2
    assert (
        back.records[0].content == custom
        and back.records[0].reply_to == "01a22a20-5697-7d07-b8d6-97d3bdc6084c"
    )
    assert back.records[1].content == image
    rest = await client.history(history(limit=2, anchor_seq=back.next_anchor))
    assert [r.seq for r in rest.records] == [1] and rest.next_anchor == 0
    assert rest.records[0].mentions == ("bob",)
    forward = await client.history(history(direction=Direction.FORWARD, limit=5))
    assert [r.seq for r in forward.records] == [1, 2, 3] and forward.last_seq == 3

    key = CommitKey(T, "alice", "a")
    assert await client.resume(key, "c1") == acks[0]
    assert (
        await client.resume_existing(send(T, cmid="a", content=text("one"), mentions=("bob",)))
        == acks[0]
    )
    assert await client.resume_existing(send(T, cmid="never")) is None
    assert (await client.recover_due()).committed == 0

    added = await client.add_members(T, "c1", ["carol", "dave", "bob"])
    assert (added.version, added.member_count) == (2, 4)
    assert (await client.add_members(T, "c1", ["carol"])).version == 2  # no change, no bump
    first = await client.list_members(T, "c1", page_size=3)
    second = await client.list_members(T, "c1", page_size=3, page_token=first.next_page_token)
    assert first.members + second.members == ("alice", "bob", "carol", "dave")
    assert second.next_page_token == ""
    removed = await client.remove_members(T, "c1", ["dave", "nobody"])
    assert (removed.version, removed.member_count) == (3, 3)
    assert await client.health() == "SERVING"


async def test_resume_existing_of_an_unknown_key_writes_nothing(chat: Running) -> None:
    assert await chat.client.resume_existing(send(T, cmid="x")) is None
    page = await chat.client.history(history())
    assert page.records == () and page.last_seq == 0


def _bad_sends() -> list[tuple[str, pb.CommitRequest, grpc.StatusCode, str]]:
    ok = send(T, cmid="ok")
    from service.api.convert import send_to_proto

    def variant(**kw: Any) -> pb.CommitRequest:
        msg = send_to_proto(ok)
        for name, value in kw.items():
            if name == "content":
                msg.content.CopyFrom(value)
            else:
                setattr(msg, name, value)
        return pb.CommitRequest(send=msg)

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    return [
        ("bad cmid", variant(client_message_id="has space"), invalid, "INVALID_CLIENT_MESSAGE_ID"),
        ("empty cmid", variant(client_message_id=""), invalid, "INVALID_CLIENT_MESSAGE_ID"),
        ("no send", pb.CommitRequest(), invalid, "INVALID_REQUEST"),
        ("bad device", variant(device="é"), invalid, "INVALID_REQUEST"),
        (
            "no type",
            variant(content=pb.MessageContent(inline_body=b"x")),
            invalid,
            "INVALID_REQUEST",
        ),
        (
            "no body",
            variant(content=pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT)),
            invalid,
            "INVALID_REQUEST",
        ),
        (
            "custom type on text",
            variant(
                content=pb.MessageContent(
                    message_type=pb.MESSAGE_TYPE_TEXT, custom_type="x", inline_body=b"x"
                )
            ),
            invalid,
            "INVALID_REQUEST",
        ),
        (
            "body too large",
            variant(
                content=pb.MessageContent(
                    message_type=pb.MESSAGE_TYPE_TEXT, inline_body=b"x" * 70_000
                )
            ),
            invalid,
            "INVALID_REQUEST",
        ),
        (
            "not a member",
            variant(sender="mallory"),
            grpc.StatusCode.PERMISSION_DENIED,
            "NOT_A_MEMBER",
        ),
        (
            "no conversation",
            variant(conversation="nope"),
            grpc.StatusCode.NOT_FOUND,
            "CONVERSATION_NOT_FOUND",
        ),
    ]


@pytest.mark.parametrize(
    ("name", "request_", "code", "reason"), _bad_sends(), ids=[c[0] for c in _bad_sends()]
)
async def test_bad_sends_are_rejected_and_write_nothing(
    chat: Running,
    raw: aio.Channel,
    name: str,
    request_: pb.CommitRequest,
    code: grpc.StatusCode,
    reason: str,
) -> None:
    stub = committer_pb2_grpc.MessageCommitterServiceStub(raw)
    got_code, message, details = await status_of(stub.Commit(request_))
    assert (got_code, details.reason) == (code, reason)
    assert message and "internal" not in message
    page = await chat.client.history(history())
    assert page.records == () and page.last_seq == 0
    assert chat.backend.store.inner.state.queue == {}  # type: ignore[attr-defined]


async def test_client_raises_the_typed_errors(chat: Running) -> None:
    c = chat.client
    with pytest.raises(InvalidClientMessageId):
        await c.commit(send(T, cmid="a b"))
    with pytest.raises(InvalidRequest):
        await c.history(history(limit=1000))
    with pytest.raises(NotAMember):
        await c.history(history(actor="mallory"))
    with pytest.raises(ConversationNotFound):
        await c.add_members(T, "nope", ["x"])
    with pytest.raises(ConversationNotFound):
        await c.list_members(T, "nope")
    with pytest.raises(ConversationExists):
        await c.create_conversation(T, "c1", ["alice"])
    with pytest.raises(CommitNotFound):
        await c.resume(CommitKey(T, "alice", "never"), "c1")
    with pytest.raises(InvalidRequest):
        await c.create_conversation(T, "c2", [])
    with pytest.raises(InvalidRequest):
        await c.recover_due(max_items=10_001)
    with pytest.raises(InvalidRequest):
        await c.list_members(T, "c1", page_size=5000)


async def test_quota_is_resource_exhausted_with_retry_info(start_server: StartServer) -> None:
    running = await start_server(sender_rate_per_s=0.5, sender_burst=1)
    await running.client.create_conversation(T, "c1", ["alice", "bob"])
    first = await running.client.commit(send(T, cmid="q-1"))
    async with aio.insecure_channel(running.target) as channel:
        stub = committer_pb2_grpc.MessageCommitterServiceStub(channel)
        from service.api.convert import send_to_proto

        request = pb.CommitRequest(send=send_to_proto(send(T, cmid="q-2")))
        code, _, details = await status_of(stub.Commit(request))
    assert (code, details.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "SENDER_QUOTA_EXCEEDED")
    assert details.retry_after_s is not None and 0 < details.retry_after_s <= 2.0
    with pytest.raises(QuotaExceeded) as caught:
        await running.client.commit(send(T, cmid="q-3"))
    assert caught.value.retry_after_s > 0
    # A replay of an admitted key is never charged.
    assert await running.client.commit(send(T, cmid="q-1")) == first


async def test_recoverable_carries_the_key_and_the_client_retries_it(
    chat: Running, raw: aio.Channel
) -> None:
    from service.api.convert import send_to_proto

    stub = committer_pb2_grpc.MessageCommitterServiceStub(raw)
    chat.store.inject("reserve", CallFault.FAIL)
    request = pb.CommitRequest(send=send_to_proto(send(T, cmid="r-1", content=text("secret body"))))
    code, message, details = await status_of(stub.Commit(request))
    assert (code, details.reason) == (grpc.StatusCode.UNAVAILABLE, "COMMIT_RECOVERABLE")
    assert details.metadata is not None
    assert {k: details.metadata[k] for k in ("tenant", "sender", "cmid", "conversation")} == {
        "tenant": T,
        "sender": "alice",
        "cmid": "r-1",
        "conversation": "c1",
    }
    assert "injected" not in message and "secret" not in message
    assert details.retry_after_s is not None

    # The client retries the same key through two more failures and converges.
    chat.store.inject("reserve", CallFault.FAIL, times=2)
    before = chat.client.retries
    ack = await chat.client.commit(send(T, cmid="r-1", content=text("secret body")))
    assert chat.client.retries - before == 2
    assert ack.seq == 1
    page = await chat.client.history(history())
    assert [r.cmid for r in page.records] == ["r-1"]

    # Out of attempts, the client raises the typed Recoverable with the key.
    chat.store.inject("reserve", CallFault.FAIL, times=100)
    with pytest.raises(Recoverable) as caught:
        await chat.client.commit(send(T, cmid="r-2"))
    assert caught.value.key == CommitKey(T, "alice", "r-2")
    chat.heal()


async def test_a_failing_read_is_unavailable_without_backend_text(
    chat: Running, raw: aio.Channel
) -> None:
    chat.store.inject("history_page", CallFault.FAIL)
    stub = committer_pb2_grpc.MessageCommitterServiceStub(raw)
    code, message, details = await status_of(
        stub.History(pb.HistoryRequest(tenant=T, conversation="c1", actor="bob"))
    )
    assert (code, details.reason) == (grpc.StatusCode.UNAVAILABLE, "BACKEND_UNAVAILABLE")
    assert message == "the backend is unavailable; retry later"
    chat.store.inject("history_page", CallFault.FAIL)
    assert (await chat.client.history(history())).records == ()  # retried, then served
    chat.store.inject("history_page", CallFault.FAIL, times=100)
    with pytest.raises(Unavailable):
        await chat.client.history(history())
    chat.heal()


async def test_a_crash_is_internal_and_resume_or_recovery_finishes_it(
    chat: Running, raw: aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    from service.api.convert import send_to_proto

    stub = committer_pb2_grpc.MessageCommitterServiceStub(raw)
    chat.faults.arm(FaultPoint.AFTER_PUT_RECORD)
    request = pb.CommitRequest(send=send_to_proto(send(T, cmid="x-1", content=text("body-1"))))
    with caplog.at_level(logging.ERROR, logger="service.api.interceptor"):
        code, message, details = await status_of(stub.Commit(request))
    assert (code, message, details.reason) == (
        grpc.StatusCode.INTERNAL,
        "internal error",
        "INTERNAL",
    )
    assert "InjectedCrash" in caplog.text and "M-COMMIT" not in caplog.text
    assert re.search(r"unexpected InjectedCrash at \w+\.py:\d+ \w+", caplog.text)
    assert "body-1" not in caplog.text
    ack = await chat.client.resume(CommitKey(T, "alice", "x-1"), "c1")
    assert ack.seq == 1

    chat.faults.arm(FaultPoint.AFTER_RESERVE)
    request = pb.CommitRequest(send=send_to_proto(send(T, cmid="x-2")))
    code, _, _ = await status_of(stub.Commit(request))
    assert code is grpc.StatusCode.INTERNAL
    report = await chat.client.recover_due(older_than_ms=int(time.time() * 1000) + 1000)
    assert (report.scanned, report.committed, report.failed) == (1, 1, 0)
    replay = await chat.client.resume_existing(send(T, cmid="x-2"))
    assert replay is not None and replay.seq == 2
    page = await chat.client.history(history())
    assert sorted(r.seq for r in page.records) == [1, 2]


async def test_admin_errors_over_the_wire(chat: Running, raw: aio.Channel) -> None:
    stub = membership_pb2_grpc.ConversationMembershipServiceStub(raw)
    cases: list[tuple[Callable[[], Awaitable[Any]], grpc.StatusCode, str]] = [
        (
            lambda: stub.CreateConversation(
                mpb.CreateConversationRequest(tenant=T, conversation="c1", members=["a"])
            ),
            grpc.StatusCode.ALREADY_EXISTS,
            "CONVERSATION_EXISTS",
        ),
        (
            lambda: stub.AddMembers(
                mpb.AddMembersRequest(tenant=T, conversation="zz", members=["a"])
            ),
            grpc.StatusCode.NOT_FOUND,
            "CONVERSATION_NOT_FOUND",
        ),
        (
            lambda: stub.RemoveMembers(
                mpb.RemoveMembersRequest(tenant=T, conversation="c1", members=["bad id"])
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_REQUEST",
        ),
        (
            lambda: stub.ListMembers(mpb.ListMembersRequest(tenant="", conversation="c1")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_REQUEST",
        ),
    ]
    for make, code, reason in cases:
        got, _, details = await status_of(make())
        assert (got, details.reason) == (code, reason)
    members = await chat.client.list_members(T, "c1")
    assert (members.members, members.version) == (("alice", "bob"), 1)
