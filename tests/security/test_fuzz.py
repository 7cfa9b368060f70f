"""Property-based fuzzing of every request message against one real server (memory backend).

Hypothesis builds arbitrary requests of both services: any unicode in string
fields, any bytes in bodies, any integer a field's proto type can carry,
fields left unset at random, and ids drawn often enough from a small pool
(tenants t1/t2, conversations c1/c2, members alice/bob/carol) that many
requests succeed, replay or conflict instead of all failing validation.

Properties, per request:

* the server never answers INTERNAL or UNKNOWN, nor anything outside the
  README's error table (code and ErrorInfo reason together);
* a rejected request wrote nothing: the memory backend's whole state is the
  same before and after;
* no answer echoes an inline body or a body reference it was sent;
* an accepted Commit is in history at its sequence number with exactly the
  content sent; an accepted History page holds only its own conversation.

One server serves every example: a module-scoped ``asyncio.Runner`` keeps a
loop for it, and each example runs on that loop (Hypothesis drives a plain,
synchronous test). ``test_the_server_is_healthy_after_fuzzing`` then checks
that it still answers health and commits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.message import Message
from grpc import aio
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from backends.memory import MemoryMessageStore, MemoryState, open_memory_backend
from backends.memory.rows import record_of
from backends.memory.state import Commit
from service.domain.membership import is_member
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import membership_pb2 as mpb
from service.server import CommitServer
from tests.e2e.conftest import BASE_CONFIG, health_check
from tests.security.conftest import DOCUMENTED, Failure, invoke

pytestmark = [pytest.mark.e2e, pytest.mark.memory]

T = TypeVar("T")
EXAMPLES = 200
EXAMPLE_TIMEOUT_S = 30.0
U32, U64, I32, I64 = 2**32 - 1, 2**64 - 1, 2**31, 2**63
NEVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


@dataclass
class Live:
    """The server every example talks to, and the loop it runs on."""

    runner: asyncio.Runner
    server: CommitServer
    state: MemoryState
    channel: aio.Channel

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(asyncio.wait_for(coro, EXAMPLE_TIMEOUT_S))


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    from service.bootstrap import build_server

    backend = open_memory_backend()
    assert isinstance(backend.store, MemoryMessageStore)
    state = backend.store.state
    config = replace(BASE_CONFIG, readiness_interval=1.0)
    with asyncio.Runner() as runner:
        server = build_server(config, backend)
        runner.run(server.start())

        async def connect() -> aio.Channel:
            return aio.insecure_channel(f"127.0.0.1:{server.grpc_port}")

        channel = runner.run(connect())
        here = Live(runner, server, state, channel)
        try:
            for tenant in ("t1", "t2"):
                for conversation, members in (("c1", ["alice", "bob"]), ("c2", ["alice", "carol"])):
                    request = mpb.CreateConversationRequest(
                        tenant=tenant, conversation=conversation, members=members
                    )
                    created = here.run(invoke(channel, "CreateConversation", request))
                    assert not isinstance(created, Failure), created
            yield here
        finally:
            runner.run(channel.close())
            runner.run(server.stop(grace_s=0.5))


# --- strategies ------------------------------------------------------------------------

ID_ALPHABET = "ABCXYZabcxyz0189._~:-"
any_text = st.text(max_size=140)
id_like = st.text(alphabet=ID_ALPHABET, min_size=1, max_size=130)


def mostly(valid: st.SearchStrategy[T], junk: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """``valid`` four times out of five, else ``junk``: most requests get past
    validation (and commit, replay or conflict), enough of them do not."""
    return st.integers(0, 9).flatmap(lambda n: valid if n < 8 else junk)


def ids(*pool: str) -> st.SearchStrategy[str | None]:
    """A known id, or junk, an id-shaped string, or unset (None)."""
    return mostly(st.sampled_from(pool), st.one_of(any_text, id_like, st.none()))


def unsigned(top: int, usual: int) -> st.SearchStrategy[int | None]:
    return mostly(
        st.one_of(st.none(), st.integers(0, usual)),
        st.one_of(st.integers(0, top), st.sampled_from([usual + 1, top])),
    )


tenants = ids("t1", "t2")
conversations = ids("c1", "c2", "c3")
users = ids("alice", "bob", "carol", "mallory")
cmids = mostly(
    st.one_of(st.sampled_from(["k-1", "k-2", "k-3", "k-4"]), *[st.uuids().map(str)] * 2),
    st.one_of(any_text, id_like, st.none()),
)
bodies = mostly(
    st.binary(min_size=1, max_size=256),
    st.one_of(st.just(b""), st.sampled_from([65_536, 65_537]).map(lambda n: b"B" * n)),
)
hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
references = mostly(
    st.builds(
        pb.BodyReference,
        uri=st.text(min_size=1, max_size=60),
        size_bytes=st.integers(0, 1 << 40),
        sha256=st.one_of(st.just(""), hex64),
    ),
    st.builds(
        pb.BodyReference,
        uri=st.one_of(st.just(""), st.sampled_from([2048, 2049]).map(lambda n: "u" * n)),
        size_bytes=st.integers(0, U64),
        sha256=st.one_of(
            st.text(alphabet="0123456789abcdefABCDEF", min_size=62, max_size=66), any_text
        ),
    ),
)


@st.composite
def valid_contents(draw: st.DrawFn) -> pb.MessageContent:
    kind = draw(st.integers(1, 7))
    msg = pb.MessageContent(
        message_type=pb.MessageType.ValueType(kind),
        custom_type="poll" if kind == pb.MESSAGE_TYPE_CUSTOM else "",
    )
    if draw(st.integers(0, 3)):
        msg.inline_body = draw(st.binary(min_size=1, max_size=256))
    else:
        msg.body_ref.CopyFrom(draw(references))
    return msg


def _set(msg: Message, **fields: Any) -> None:
    """Set the fields that were drawn; None leaves a field unset."""
    for name, value in fields.items():
        if value is not None:
            setattr(msg, name, value)


SEND_IDS = ("tenant", "sender", "device", "conversation", "client_message_id", "reply_to")
SEND_PARTS = (*SEND_IDS, "mentions", "content", "message_type", "custom_type", "body")
junk_ids = st.one_of(any_text, id_like, st.none())


def _spoil(draw: st.DrawFn, msg: pb.AuthenticatedSend, part: str) -> None:
    """Replace one part of a valid send by junk, or leave it unset."""
    content = msg.content
    if part in SEND_IDS:
        value = draw(junk_ids)
        if value is None:
            msg.ClearField(part)  # type: ignore[arg-type]
        else:
            setattr(msg, part, value)
    elif part == "mentions":
        del msg.mentions[:]
        msg.mentions.extend(
            draw(
                st.one_of(
                    st.lists(st.one_of(st.sampled_from(["bob"]), any_text), min_size=1, max_size=4),
                    st.integers(99, 102).map(lambda n: [f"u{i}" for i in range(n)]),
                )
            )
        )
    elif part == "content":
        msg.ClearField("content")
    elif part == "message_type":
        content.message_type = pb.MessageType.ValueType(draw(st.integers(-I32, I32 - 1)))
    elif part == "custom_type":
        content.custom_type = draw(st.one_of(any_text, st.just("poll"), st.just("")))
    else:
        form = draw(st.sampled_from(["none", "inline", "ref"]))
        if form == "none":
            content.ClearField("body")
        elif form == "inline":
            content.inline_body = draw(bodies)
        else:
            content.body_ref.CopyFrom(draw(references))


@st.composite
def sends(draw: st.DrawFn) -> pb.AuthenticatedSend:
    """A valid send (ids from the pool), then none, one or a few parts spoiled."""
    msg = pb.AuthenticatedSend(
        tenant=draw(st.sampled_from(["t1", "t2"])),
        sender=draw(st.sampled_from(["alice", "alice", "alice", "alice", "bob", "carol"])),
        device=draw(st.sampled_from(["phone", "tablet"])),
        conversation=draw(st.sampled_from(["c1", "c1", "c2"])),
        client_message_id=draw(
            st.one_of(st.sampled_from(["k-1", "k-2", "k-3", "k-4"]), *[st.uuids().map(str)] * 4)
        ),
        reply_to=draw(st.sampled_from(["", "01a22a20-5697-7d07"])),
        content=draw(valid_contents()),
        mentions=draw(
            st.lists(st.sampled_from(["alice", "bob", "carol"]), unique=True, max_size=3)
        ),
    )
    spoiled = draw(st.sampled_from([0, 0, 0, 0, 1, 1, 2, 3]))
    for part in draw(
        st.lists(st.sampled_from(SEND_PARTS), unique=True, min_size=spoiled, max_size=spoiled)
    ):
        _spoil(draw, msg, part)
    return msg


Request = tuple[str, Message]


@st.composite
def commit_requests(draw: st.DrawFn) -> Request:
    rpc = draw(st.sampled_from(["Commit", "Commit", "Commit", "ResumeExisting"]))
    wrapper = pb.CommitRequest() if rpc == "Commit" else pb.ResumeExistingRequest()
    if draw(st.integers(0, 19)):
        wrapper.send.CopyFrom(draw(sends()))
    return rpc, wrapper


@st.composite
def history_requests(draw: st.DrawFn) -> Request:
    msg = pb.HistoryRequest()
    _set(
        msg,
        tenant=draw(tenants),
        conversation=draw(conversations),
        actor=draw(users),
        direction=draw(mostly(st.integers(0, 2), st.integers(-I32, I32 - 1))),
        anchor_seq=draw(unsigned(U64, 30)),
        limit=draw(unsigned(U32, 200)),
        max_bytes=draw(mostly(st.sampled_from([0, 1024, 4 << 20]), st.one_of(st.integers(0, U32)))),
    )
    return "History", msg


@st.composite
def resume_requests(draw: st.DrawFn) -> Request:
    if draw(st.booleans()):
        msg: Message = pb.ResumeRequest()
        _set(
            msg,
            tenant=draw(tenants),
            sender=draw(users),
            client_message_id=draw(cmids),
            conversation=draw(conversations),
        )
        return "Resume", msg
    recover = pb.RecoverDueRequest()
    _set(
        recover,
        older_than_ms=draw(mostly(st.none(), st.integers(-I64, I64 - 1))),
        max_items=draw(unsigned(U32, 10_000)),
    )
    return "RecoverDue", recover


@st.composite
def admin_requests(draw: st.DrawFn) -> Request:
    rpc = draw(
        st.sampled_from(["CreateConversation", "AddMembers", "RemoveMembers", "ListMembers"])
    )
    # Mostly conversations no send goes to, so that senders keep their memberships.
    tenant = draw(tenants)
    conversation = draw(mostly(st.sampled_from(["c3", "c4"]), conversations))
    if rpc == "ListMembers":
        listing = mpb.ListMembersRequest()
        _set(
            listing,
            tenant=tenant,
            conversation=conversation,
            page_size=draw(unsigned(U32, 1000)),
            page_token=draw(mostly(st.sampled_from(["", "alice", "bob"]), any_text)),
        )
        return rpc, listing
    members = draw(
        mostly(
            st.lists(st.sampled_from(["alice", "bob", "carol", "dave"]), min_size=1, max_size=3),
            st.one_of(
                st.lists(any_text, max_size=3),
                st.sampled_from([10_000, 10_001]).map(lambda n: [f"u{i}" for i in range(n)]),
            ),
        )
    )
    kinds: dict[str, type[Message]] = {
        "CreateConversation": mpb.CreateConversationRequest,
        "AddMembers": mpb.AddMembersRequest,
        "RemoveMembers": mpb.RemoveMembersRequest,
    }
    msg = kinds[rpc]()
    _set(msg, tenant=tenant, conversation=conversation)
    msg.members.extend(members)  # type: ignore[attr-defined]
    return rpc, msg


# Half of them commits (st.one_of would not weigh repeated alternatives).
_KINDS = (
    [commit_requests()] * 5 + [history_requests()] * 2 + [resume_requests(), admin_requests()] * 2
)
requests = st.integers(0, len(_KINDS) - 1).flatmap(lambda n: _KINDS[n])


# --- properties ------------------------------------------------------------------------


def fingerprint(state: MemoryState) -> tuple[object, ...]:
    """Everything the memory backend holds, in a comparable form."""
    return (
        {
            key: (c.conversation, c.identity, c.intent, c.committed, c.publication)
            for key, c in ((k, Commit.of(s)) for k, s in state.commits.items())
        },
        {
            key: (dict(c.intervals), c.version, c.last_seq, c.available_from, dict(c.history))
            for key, c in state.conversations.items()
        },
        {key: dataclasses.astuple(entry) for key, entry in state.queue.items()},
        state.outbox.published,  # the relay drops what it delivered: count what was published
    )


def sent_secrets(rpc: str, request: Message) -> list[bytes]:
    if not isinstance(request, pb.CommitRequest | pb.ResumeExistingRequest):
        return []
    content = request.send.content
    found = []
    if content.WhichOneof("body") == "inline_body" and len(content.inline_body) >= 16:
        found.append(content.inline_body[:4096])
    if content.WhichOneof("body") == "body_ref" and len(content.body_ref.uri) >= 16:
        found.append(content.body_ref.uri.encode())
    return found


def check_committed(live: Live, send: pb.AuthenticatedSend, ack: pb.CommittedMessage) -> None:
    """The ACK's record is in history with exactly the content sent."""
    conversation = live.state.conversations[(send.tenant, send.conversation)]
    row = conversation.history.get(ack.seq)
    assert row is not None, f"ACK seq {ack.seq} is not in history"
    record = record_of(row)
    assert (record.tenant, record.conversation, record.message_id) == (
        send.tenant,
        send.conversation,
        ack.message_id,
    )
    assert (record.sender, record.device, record.cmid) == (
        send.sender,
        send.device,
        send.client_message_id,
    )
    content = send.content
    assert record.content.message_type.name == pb.MessageType.Name(content.message_type)[13:]
    assert record.content.custom_type == content.custom_type
    if content.WhichOneof("body") == "inline_body":
        assert (record.content.body, record.content.body_ref) == (content.inline_body, None)
    else:
        ref = content.body_ref
        assert record.content.body == b"" and record.content.body_ref is not None
        stored = record.content.body_ref
        assert (stored.uri, stored.size_bytes, stored.sha256) == (
            ref.uri,
            ref.size_bytes,
            ref.sha256,
        )
    assert (record.mentions, record.reply_to) == (tuple(send.mentions), send.reply_to)
    if is_member(conversation.intervals.get(send.sender, ())):  # and as its sender reads it
        query = pb.HistoryRequest(
            tenant=send.tenant,
            conversation=send.conversation,
            actor=send.sender,
            anchor_seq=ack.seq + 1,
            limit=1,
        )
        answer = live.run(invoke(live.channel, "History", query))
        assert isinstance(answer, pb.HistoryResponse), answer
        assert [(r.seq, r.message_id) for r in answer.page.records] == [(ack.seq, ack.message_id)]
        read = answer.page.records[0]
        assert (read.content, list(read.mentions), read.reply_to) == (
            send.content,
            list(send.mentions),
            send.reply_to,
        )


def check_page(request: pb.HistoryRequest, answer: pb.HistoryResponse) -> None:
    for record in answer.page.records:
        assert (record.tenant, record.conversation) == (request.tenant, request.conversation)
    assert len(answer.page.records) <= (request.limit or 50)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
@given(call=requests)
def test_any_request_gets_a_documented_answer_and_rejections_write_nothing(
    live: Live, call: Request
) -> None:
    rpc, request = call
    before = fingerprint(live.state)
    answer = live.run(invoke(live.channel, rpc, request))
    event(f"{rpc}: {answer.code.name if isinstance(answer, Failure) else 'OK'}")
    if isinstance(answer, Failure):
        assert answer.code not in NEVER, f"{rpc}: {answer.code.name} {answer.message}"
        assert (answer.code, answer.details.reason) in DOCUMENTED, answer
        assert answer.message and "internal" not in answer.message.lower()
        for secret in sent_secrets(rpc, request):
            assert secret not in answer.text(), f"{rpc}: the answer echoes what was sent"
        assert fingerprint(live.state) == before, f"{rpc} was rejected but wrote: {request}"
        return
    if isinstance(request, pb.CommitRequest) and isinstance(answer, pb.CommitResponse):
        check_committed(live, request.send, answer.message)
    if isinstance(request, pb.HistoryRequest) and isinstance(answer, pb.HistoryResponse):
        check_page(request, answer)
    if isinstance(request, pb.ResumeExistingRequest) and isinstance(
        answer, pb.ResumeExistingResponse
    ):
        if answer.found:
            check_committed(live, request.send, answer.message)
        else:
            assert fingerprint(live.state) == before


def test_the_server_is_healthy_after_fuzzing(live: Live) -> None:
    async def probe() -> health_pb2.HealthCheckResponse:
        await live.server.probe.probe_once()
        return await health_check(live.channel)(health_pb2.HealthCheckRequest(), timeout=5)

    assert live.run(probe()).status == health_pb2.HealthCheckResponse.SERVING
    send = pb.AuthenticatedSend(
        tenant="t-after",
        sender="alice",
        device="phone",
        conversation="c1",
        client_message_id=f"after-{time.time_ns()}",
        content=pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=b"still here"),
    )
    create = mpb.CreateConversationRequest(tenant="t-after", conversation="c1", members=["alice"])
    created = live.run(invoke(live.channel, "CreateConversation", create))
    assert not isinstance(created, Failure), created
    answer = live.run(invoke(live.channel, "Commit", pb.CommitRequest(send=send)))
    assert isinstance(answer, pb.CommitResponse), answer
    check_committed(live, send, answer.message)
