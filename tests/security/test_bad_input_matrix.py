"""A table-driven bad-input matrix over the real gRPC API.

Rows refused by validation (INVALID_ARGUMENT, before any store call) run once,
on the memory backend; rows whose answer depends on what a store holds
(membership, an existing key or conversation, a commit) run on every backend.

Requests are built from the raw generated messages (``service/gen``) and,
where a message cannot express the input at all (both body forms, a negative
number in an unsigned field, bytes that are not UTF-8), as raw wire bytes.
Each row is sent to a real replica (``served``: memory, Redis, CQL) and
asserts:

* the documented status code and ``ErrorInfo.reason`` (README, "Errors");
* an actionable message: it names the offending field;
* nothing the caller sent as content (the body, the body reference) comes
  back, in the message or in any trailing metadata;
* nothing was written: read directly, the backend holds no commit for the
  row's key, and every watched membership, history boundary, the outbox and
  the recovery index are exactly as before.

Rows whose input is documented as valid (``0`` meaning "the default",
inclusive bounds) are in ``ACCEPTED``: answered OK, and reads still write
nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf.message import DecodeError, Message

from service.domain.model import Committed
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import membership_pb2 as mpb
from tests.security.conftest import (
    DOCUMENTED,
    Failure,
    Served,
    invoke,
    ok,
    snapshot,
    unique_tenant,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

INVALID = grpc.StatusCode.INVALID_ARGUMENT
BAD_REQUEST = (INVALID, "INVALID_REQUEST")
BAD_CMID = (INVALID, "INVALID_CLIENT_MESSAGE_ID")
NOT_MEMBER = (grpc.StatusCode.PERMISSION_DENIED, "NOT_A_MEMBER")
NO_CONVERSATION = (grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND")
NO_COMMIT = (grpc.StatusCode.NOT_FOUND, "COMMIT_NOT_FOUND")
CONFLICT = (grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_CONFLICT")
EXISTS = (grpc.StatusCode.ALREADY_EXISTS, "CONVERSATION_EXISTS")

U64_MAX = 2**64 - 1  # -1 as an int64 on the wire; a uint32 field reads it as 2^32-1
TIB = 1 << 40
MESSAGE_ID = "01a22a20-5697-7d07-b8d6-97d3bdc6084c"  # a message id, where other ids go

BAD_IDS = [
    ("space", "a b"),
    ("slash", "a/b"),
    ("non-ASCII", "é"),
    ("NUL", "a\x00b"),
    ("newline", "a\nb"),
    ("percent-encoded", "a%2Fb"),
    ("emoji", "\U0001f600"),
    ("oversize", "x" * 129),
    ("empty", ""),
]
BAD_CMIDS = [
    ("colon (valid in a user id)", "user:alice"),
    ("space", "a b"),
    ("slash", "a/b"),
    ("non-ASCII", "é"),
    ("NUL", "a\x00b"),
    ("plus", "a+b"),
    ("oversize", "x" * 65),
    ("empty", ""),
]


# --- wire bytes ---------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


# --- the world every row runs in ------------------------------------------------------


@dataclass(frozen=True)
class World:
    """Conversations of the module: c1 (alice, bob), c2 (alice, carol) in ``tenant``;
    ``elsewhere`` (alice, bob) only in ``other``; one committed message in c1."""

    served: Served
    tenant: str
    other: str
    known_cmid: str
    known: pb.CommittedMessage

    @property
    def conversations(self) -> list[tuple[str, str]]:
        return [(self.tenant, "c1"), (self.tenant, "c2"), (self.other, "elsewhere")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(served: Served) -> World:
    tenant, other = unique_tenant(), unique_tenant()
    for t, conversation, members in (
        (tenant, "c1", ["alice", "bob"]),
        (tenant, "c2", ["alice", "carol"]),
        (other, "elsewhere", ["alice", "bob"]),
    ):
        await ok(
            served.channel,
            "CreateConversation",
            mpb.CreateConversationRequest(tenant=t, conversation=conversation, members=members),
            mpb.CreateConversationResponse,
        )
    known = pb.AuthenticatedSend(
        tenant=tenant,
        sender="alice",
        device="phone",
        conversation="c1",
        client_message_id="known-1",
        content=pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=b"known"),
    )
    answer = await ok(served.channel, "Commit", pb.CommitRequest(send=known), pb.CommitResponse)
    return World(served, tenant, other, "known-1", answer.message)


@dataclass(frozen=True)
class Ctx:
    """What one row builds its request from: fresh ids and fresh secrets."""

    world: World
    cmid: str
    body: bytes
    uri: str

    @property
    def tenant(self) -> str:
        return self.world.tenant

    @property
    def secrets(self) -> tuple[bytes, ...]:
        return (self.body, self.uri.encode())


def _ctx(world: World) -> Ctx:
    tag = uuid.uuid4().hex
    return Ctx(world, f"m-{tag[:16]}", f"SECRET-BODY-{tag}".encode(), f"s3://SECRET-URI-{tag}")


Build = Callable[[Ctx], Message | bytes]
Setup = Callable[[Ctx], Awaitable[pb.CommittedMessage]]


@dataclass(frozen=True)
class Case:
    name: str
    rpc: str
    build: Build
    code: grpc.StatusCode
    reason: str
    field: str
    """A word the message must contain: the field (or the thing) to fix."""
    setup: Setup | None = None
    """Runs before the snapshot; returns the ACK of a commit the row then collides with."""


def case(
    name: str, rpc: str, build: Build, expected: tuple[grpc.StatusCode, str], field: str
) -> Case:
    return Case(name, rpc, build, expected[0], expected[1], field)


# --- builders -------------------------------------------------------------------------

ContentOf = Callable[[Ctx], pb.MessageContent]


def text(c: Ctx) -> pb.MessageContent:
    return pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=c.body)


def typed(kind: int, custom_type: str = "") -> ContentOf:
    return lambda c: pb.MessageContent(
        message_type=pb.MessageType.ValueType(kind),  # unknown numbers on purpose
        custom_type=custom_type,
        inline_body=c.body,
    )


def ref(uri: str | None = None, size: int = 10, sha256: str = "") -> ContentOf:
    return lambda c: pb.MessageContent(
        message_type=pb.MESSAGE_TYPE_IMAGE,
        body_ref=pb.BodyReference(
            uri=c.uri if uri is None else uri, size_bytes=size, sha256=sha256
        ),
    )


def make_send(c: Ctx, content: ContentOf = text, /, **fields: Any) -> pb.AuthenticatedSend:
    msg = pb.AuthenticatedSend(
        tenant=c.tenant,
        sender="alice",
        device="phone",
        conversation="c1",
        client_message_id=c.cmid,
        content=content(c),
    )
    for name, value in fields.items():
        if name == "mentions":
            msg.mentions.extend(value)
        else:
            setattr(msg, name, value)
    return msg


def commit(content: ContentOf = text, /, **fields: Any) -> Build:
    return lambda c: pb.CommitRequest(send=make_send(c, content, **fields))


def commit_in(tenant_of: Callable[[Ctx], str], **fields: Any) -> Build:
    return lambda c: pb.CommitRequest(send=make_send(c, tenant=tenant_of(c), **fields))


def no_content(c: Ctx) -> pb.CommitRequest:
    msg = make_send(c)
    msg.ClearField("content")
    return pb.CommitRequest(send=msg)


def both_forms(first: ContentOf, last: ContentOf) -> Build:
    """Both body forms of the oneof on the wire; proto keeps the one that comes last."""

    def build(c: Ctx) -> bytes:
        base = pb.CommitRequest(send=make_send(c, first)).SerializeToString()
        return base + _len_field(1, _len_field(6, last(c).SerializeToString()))

    return build


def bad_utf8_tenant(c: Ctx) -> bytes:
    base = pb.CommitRequest(send=make_send(c)).SerializeToString()
    return base + _len_field(1, _len_field(1, b"t\xff\xfe"))


async def commit_original(c: Ctx) -> pb.CommittedMessage:
    request = pb.CommitRequest(send=make_send(c))
    answer = await ok(c.world.served.channel, "Commit", request, pb.CommitResponse)
    return answer.message


def reused(name: str, content: ContentOf = text, /, **fields: Any) -> Case:
    return Case(
        f"reused key, {name}",
        "Commit",
        commit(content, **fields),
        *CONFLICT,
        "client_message_id",
        setup=commit_original,
    )


def edited(c: Ctx) -> pb.MessageContent:
    return pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=c.body + b"-edited")


# --- Commit ---------------------------------------------------------------------------


def _commit_cases() -> list[Case]:
    cases = [
        case("no send", "Commit", lambda c: pb.CommitRequest(), BAD_REQUEST, "send"),
        case("no content", "Commit", no_content, BAD_REQUEST, "content.message_type"),
        case("garbage bytes", "Commit", lambda c: b"\xff\xff\xff\xff", BAD_REQUEST, "request"),
        case("tenant not UTF-8 (wire)", "Commit", bad_utf8_tenant, BAD_REQUEST, "request"),
    ]
    for field in ("tenant", "sender", "device", "conversation"):
        for label, value in BAD_IDS:
            cases.append(
                case(f"{field} {label}", "Commit", commit(**{field: value}), BAD_REQUEST, field)
            )
    for label, value in BAD_CMIDS:
        cases.append(
            case(
                f"client_message_id {label}",
                "Commit",
                commit(client_message_id=value),
                BAD_CMID,
                "client_message_id",
            )
        )
    for label, value in BAD_IDS[:-1]:  # an empty reply_to means "not a reply"
        cases.append(
            case(f"reply_to {label}", "Commit", commit(reply_to=value), BAD_REQUEST, "reply_to")
        )
    for label, value in BAD_IDS:
        cases.append(
            case(
                f"mention {label}",
                "Commit",
                commit(mentions=["bob", value]),
                BAD_REQUEST,
                "mentions",
            )
        )
    body = "content.body"
    custom = "content.custom_type"
    kind = "content.message_type"
    cases += [
        case("message type UNSPECIFIED", "Commit", commit(typed(0)), BAD_REQUEST, kind),
        case("message type 8 (unknown)", "Commit", commit(typed(8)), BAD_REQUEST, kind),
        case("message type 99 (unknown)", "Commit", commit(typed(99)), BAD_REQUEST, kind),
        case("message type -1", "Commit", commit(typed(-1)), BAD_REQUEST, kind),
        case("message type 2^31-1", "Commit", commit(typed(2**31 - 1)), BAD_REQUEST, kind),
        case("custom without custom_type", "Commit", commit(typed(7)), BAD_REQUEST, custom),
        case(
            "custom_type oversize",
            "Commit",
            commit(typed(7, "p" * 65)),
            BAD_REQUEST,
            custom,
        ),
        case(
            "custom_type bad characters",
            "Commit",
            commit(typed(7, "poll vote")),
            BAD_REQUEST,
            custom,
        ),
        case("custom_type non-ASCII", "Commit", commit(typed(7, "pöll")), BAD_REQUEST, custom),
        case("custom_type on text", "Commit", commit(typed(1, "poll")), BAD_REQUEST, custom),
        case("custom_type on image", "Commit", commit(typed(2, "poll")), BAD_REQUEST, custom),
        case(
            "neither body form",
            "Commit",
            commit(lambda c: pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT)),
            BAD_REQUEST,
            "content",
        ),
        case(
            "empty inline body",
            "Commit",
            commit(lambda c: pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=b"")),
            BAD_REQUEST,
            "content",
        ),
        case(
            "inline body oversize",
            "Commit",
            commit(
                lambda c: pb.MessageContent(
                    message_type=pb.MESSAGE_TYPE_TEXT, inline_body=c.body * 4096
                )
            ),
            BAD_REQUEST,
            body,
        ),
        case(
            "both forms, an empty reference last",
            "Commit",
            both_forms(text, lambda c: pb.MessageContent(body_ref=pb.BodyReference())),
            BAD_REQUEST,
            "content.body_ref.uri",
        ),
        case(
            "both forms, an empty inline body last",
            "Commit",
            both_forms(ref(), lambda c: pb.MessageContent(inline_body=b"")),
            BAD_REQUEST,
            "content",
        ),
        case(
            "empty body reference",
            "Commit",
            commit(
                lambda c: pb.MessageContent(
                    message_type=pb.MESSAGE_TYPE_IMAGE, body_ref=pb.BodyReference()
                )
            ),
            BAD_REQUEST,
            "content.body_ref.uri",
        ),
        case(
            "reference uri oversize",
            "Commit",
            commit(ref(uri="s3://SECRET-URI-" + "u" * 2040)),
            BAD_REQUEST,
            "content.body_ref.uri",
        ),
        case(
            "reference uri over 2048 bytes in 1025 characters",
            "Commit",
            commit(ref(uri="é" * 1025)),
            BAD_REQUEST,
            "content.body_ref.uri",
        ),
        case(
            "reference size 1 TiB + 1",
            "Commit",
            commit(ref(size=TIB + 1)),
            BAD_REQUEST,
            "content.body_ref.size_bytes",
        ),
        case(
            "reference size -1 (wire)",
            "Commit",
            commit(ref(size=U64_MAX)),
            BAD_REQUEST,
            "content.body_ref.size_bytes",
        ),
    ]
    for label, sha in (
        ("uppercase", "AB" * 32),
        ("63 characters", "a" * 63),
        ("65 characters", "a" * 65),
        ("not hex", "g" * 64),
        ("with a newline", "a" * 63 + "\n"),
    ):
        cases.append(
            case(
                f"sha256 {label}",
                "Commit",
                commit(ref(sha256=sha)),
                BAD_REQUEST,
                "content.body_ref.sha256",
            )
        )
    cases += [
        case(
            "101 mentions",
            "Commit",
            commit(mentions=[f"u{i}" for i in range(101)]),
            BAD_REQUEST,
            "mentions",
        ),
        case(
            "repeated mention",
            "Commit",
            commit(mentions=["bob", "carol", "bob"]),
            BAD_REQUEST,
            "mentions",
        ),
        case(
            "unknown conversation",
            "Commit",
            commit(conversation="nowhere"),
            NO_CONVERSATION,
            "conversation",
        ),
        case(
            "a message id as conversation",
            "Commit",
            commit(conversation=MESSAGE_ID),
            NO_CONVERSATION,
            "conversation",
        ),
        case("non-member sender", "Commit", commit(sender="mallory"), NOT_MEMBER, "sender"),
        case(
            "a message id as sender",
            "Commit",
            commit(sender=MESSAGE_ID),
            NOT_MEMBER,
            "sender",
        ),
        case(
            "member of another conversation only",
            "Commit",
            commit(sender="carol"),
            NOT_MEMBER,
            "sender",
        ),
        case(
            "conversation only in another tenant",
            "Commit",
            commit(conversation="elsewhere"),
            NO_CONVERSATION,
            "conversation",
        ),
        case(
            "the other tenant's conversation under its own name",
            "Commit",
            commit_in(lambda c: unique_tenant(), conversation="elsewhere"),
            NO_CONVERSATION,
            "conversation",
        ),
        reused("different body", edited),
        reused("different type", ref()),
        reused("different device", device="tablet"),
        reused("different conversation", conversation="c2"),
        reused("different mentions", mentions=["bob"]),
        reused("different reply_to", reply_to=MESSAGE_ID),
    ]
    return cases


COMMIT_CASES = _commit_cases()


# --- History ------------------------------------------------------------------------


def history_request(c: Ctx, **fields: Any) -> pb.HistoryRequest:
    msg = pb.HistoryRequest(tenant=c.tenant, conversation="c1", actor="bob")
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


def history(**fields: Any) -> Build:
    return lambda c: history_request(c, **fields)


def history_wire(number: int, value: int) -> Build:
    """A HistoryRequest with one varint field as a 10-byte (negative) varint."""
    return lambda c: history_request(c).SerializeToString() + _varint_field(number, value)


HISTORY_CASES = [
    case("non-member actor", "History", history(actor="mallory"), NOT_MEMBER, "actor"),
    case("member of another conversation", "History", history(actor="carol"), NOT_MEMBER, "actor"),
    case("empty actor", "History", history(actor=""), BAD_REQUEST, "actor"),
    case("actor bad characters", "History", history(actor="bob smith"), BAD_REQUEST, "actor"),
    case("empty tenant", "History", history(tenant=""), BAD_REQUEST, "tenant"),
    case("empty conversation", "History", history(conversation=""), BAD_REQUEST, "conversation"),
    case(
        "oversize conversation",
        "History",
        history(conversation="c" * 129),
        BAD_REQUEST,
        "conversation",
    ),
    case(
        "unknown conversation",
        "History",
        history(conversation="nowhere"),
        NO_CONVERSATION,
        "conversation",
    ),
    case(
        "conversation only in another tenant",
        "History",
        history(conversation="elsewhere"),
        NO_CONVERSATION,
        "conversation",
    ),
    case("limit 201", "History", history(limit=201), BAD_REQUEST, "limit"),
    case("limit 10^9", "History", history(limit=10**9), BAD_REQUEST, "limit"),
    case("limit -1 (wire)", "History", history_wire(6, U64_MAX), BAD_REQUEST, "limit"),
    case("max_bytes 1", "History", history(max_bytes=1), BAD_REQUEST, "max_bytes"),
    case("max_bytes 1023", "History", history(max_bytes=1023), BAD_REQUEST, "max_bytes"),
    case(
        "max_bytes 4 MiB + 1", "History", history(max_bytes=(4 << 20) + 1), BAD_REQUEST, "max_bytes"
    ),
    case("max_bytes -1 (wire)", "History", history_wire(7, U64_MAX), BAD_REQUEST, "max_bytes"),
    case("anchor -1 (wire)", "History", history_wire(5, U64_MAX), BAD_REQUEST, "anchor_seq"),
    case("anchor 2^63", "History", history(anchor_seq=2**63), BAD_REQUEST, "anchor_seq"),
    case("direction 3 (unknown)", "History", history(direction=3), BAD_REQUEST, "direction"),
    case("direction -1", "History", history(direction=-1), BAD_REQUEST, "direction"),
    case("garbage bytes", "History", lambda c: b"\x0a\xff", BAD_REQUEST, "request"),
]


# --- Resume, ResumeExisting, RecoverDue ------------------------------------------------


def resume(**fields: Any) -> Build:
    def build(c: Ctx) -> pb.ResumeRequest:
        msg = pb.ResumeRequest(
            tenant=c.tenant, sender="alice", client_message_id=c.world.known_cmid, conversation="c1"
        )
        for name, value in fields.items():
            setattr(msg, name, value)
        return msg

    return build


def resume_existing(content: ContentOf = text, /, **fields: Any) -> Build:
    return lambda c: pb.ResumeExistingRequest(send=make_send(c, content, **fields))


def resume_known(**fields: Any) -> Build:
    """ResumeExisting with the known key but a different request."""
    return lambda c: pb.ResumeExistingRequest(
        send=make_send(c, client_message_id=c.world.known_cmid, **fields)
    )


def recover(**fields: Any) -> Build:
    return lambda c: pb.RecoverDueRequest(**fields)


RESUME_CASES = [
    case("empty tenant", "Resume", resume(tenant=""), BAD_REQUEST, "tenant"),
    case("empty sender", "Resume", resume(sender=""), BAD_REQUEST, "sender"),
    case("empty cmid", "Resume", resume(client_message_id=""), BAD_CMID, "client_message_id"),
    case("empty conversation", "Resume", resume(conversation=""), BAD_REQUEST, "conversation"),
    case(
        "cmid with a colon",
        "Resume",
        resume(client_message_id="a:b"),
        BAD_CMID,
        "client_message_id",
    ),
    case(
        "oversize cmid", "Resume", resume(client_message_id="k" * 65), BAD_CMID, "client_message_id"
    ),
    case("sender bad characters", "Resume", resume(sender="a b"), BAD_REQUEST, "sender"),
    case("unknown key", "Resume", resume(client_message_id="never-used"), NO_COMMIT, "key"),
    case("known key, another conversation", "Resume", resume(conversation="c2"), NO_COMMIT, "key"),
    case("known key, another sender", "Resume", resume(sender="bob"), NO_COMMIT, "key"),
    case(
        "known key, another tenant",
        "Resume",
        lambda c: resume(tenant=c.world.other)(c),
        NO_COMMIT,
        "key",
    ),
    case(
        "known key, unknown conversation",
        "Resume",
        resume(conversation="nowhere"),
        NO_COMMIT,
        "key",
    ),
    case("no send", "ResumeExisting", lambda c: pb.ResumeExistingRequest(), BAD_REQUEST, "send"),
    case(
        "bad cmid",
        "ResumeExisting",
        resume_existing(client_message_id="a b"),
        BAD_CMID,
        "client_message_id",
    ),
    case("empty tenant", "ResumeExisting", resume_existing(tenant=""), BAD_REQUEST, "tenant"),
    case(
        "unknown message type",
        "ResumeExisting",
        resume_existing(typed(42)),
        BAD_REQUEST,
        "content.message_type",
    ),
    case("bad sha256", "ResumeExisting", resume_existing(ref(sha256="x")), BAD_REQUEST, "sha256"),
    case(
        "known key, different body", "ResumeExisting", resume_known(), CONFLICT, "client_message_id"
    ),
    case(
        "known key, different device",
        "ResumeExisting",
        resume_known(device="tablet"),
        CONFLICT,
        "client_message_id",
    ),
    case("max_items 10001", "RecoverDue", recover(max_items=10_001), BAD_REQUEST, "max_items"),
    case("max_items 10^9", "RecoverDue", recover(max_items=10**9), BAD_REQUEST, "max_items"),
    case(
        "max_items -1 (wire)",
        "RecoverDue",
        lambda c: _varint_field(2, U64_MAX),
        BAD_REQUEST,
        "max_items",
    ),
    case("older_than_ms -1", "RecoverDue", recover(older_than_ms=-1), BAD_REQUEST, "older_than_ms"),
    case(
        "older_than_ms -2^63",
        "RecoverDue",
        recover(older_than_ms=-(2**63)),
        BAD_REQUEST,
        "older_than_ms",
    ),
]


# --- membership administration ------------------------------------------------------

ADMIN_REQUESTS: dict[str, Callable[..., Message]] = {
    "CreateConversation": mpb.CreateConversationRequest,
    "AddMembers": mpb.AddMembersRequest,
    "RemoveMembers": mpb.RemoveMembersRequest,
}


def admin(
    rpc: str, conversation: str = "c1", members: list[str] | None = None, tenant: str | None = None
) -> Build:
    def build(c: Ctx) -> Message:
        return ADMIN_REQUESTS[rpc](
            tenant=c.tenant if tenant is None else tenant,
            conversation=conversation,
            members=["dave"] if members is None else members,
        )

    return build


def list_request(c: Ctx, **fields: Any) -> mpb.ListMembersRequest:
    msg = mpb.ListMembersRequest(tenant=c.tenant, conversation="c1")
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


def listing(**fields: Any) -> Build:
    return lambda c: list_request(c, **fields)


def _admin_cases() -> list[Case]:
    cases = [
        case(
            "duplicate create",
            "CreateConversation",
            admin("CreateConversation", "c1", ["alice", "mallory"]),
            EXISTS,
            "conversation",
        ),
        case(
            "create with a repeated member only",
            "CreateConversation",
            admin("CreateConversation", "c1", ["alice", "alice"]),
            EXISTS,
            "conversation",
        ),
        case(
            "create with no members",
            "CreateConversation",
            admin("CreateConversation", "new-1", []),
            BAD_REQUEST,
            "members",
        ),
        case(
            "create with 10001 members",
            "CreateConversation",
            admin("CreateConversation", "new-2", [f"u{i}" for i in range(10_001)]),
            BAD_REQUEST,
            "members",
        ),
        case(
            "create with an empty member id",
            "CreateConversation",
            admin("CreateConversation", "new-3", ["alice", ""]),
            BAD_REQUEST,
            "members",
        ),
        case(
            "create with a message-id-looking but spaced member",
            "CreateConversation",
            admin("CreateConversation", "new-4", [f"{MESSAGE_ID} x"]),
            BAD_REQUEST,
            "members",
        ),
        case("garbage bytes", "CreateConversation", lambda c: b"\x12\xff", BAD_REQUEST, "request"),
    ]
    for rpc in ("CreateConversation", "AddMembers", "RemoveMembers"):
        for label, value in BAD_IDS:
            cases.append(
                case(f"tenant {label}", rpc, admin(rpc, tenant=value), BAD_REQUEST, "tenant")
            )
            cases.append(
                case(f"conversation {label}", rpc, admin(rpc, value), BAD_REQUEST, "conversation")
            )
            cases.append(
                case(
                    f"member {label}",
                    rpc,
                    admin(rpc, "new-5", ["bob", value]),
                    BAD_REQUEST,
                    "members",
                )
            )
    for rpc in ("AddMembers", "RemoveMembers"):
        cases += [
            case(
                "unknown conversation", rpc, admin(rpc, "nowhere"), NO_CONVERSATION, "conversation"
            ),
            case(
                "conversation only in another tenant",
                rpc,
                admin(rpc, "elsewhere"),
                NO_CONVERSATION,
                "conversation",
            ),
            case("no members", rpc, admin(rpc, "c1", []), BAD_REQUEST, "members"),
            case(
                "10001 members",
                rpc,
                admin(rpc, "c1", [f"u{i}" for i in range(10_001)]),
                BAD_REQUEST,
                "members",
            ),
        ]
    cases += [
        case("page_size 1001", "ListMembers", listing(page_size=1001), BAD_REQUEST, "page_size"),
        case("page_size 10^9", "ListMembers", listing(page_size=10**9), BAD_REQUEST, "page_size"),
        case(
            "page_size -1 (wire)",
            "ListMembers",
            lambda c: list_request(c).SerializeToString() + _varint_field(3, U64_MAX),
            BAD_REQUEST,
            "page_size",
        ),
        case(
            "page_token bad characters",
            "ListMembers",
            listing(page_token="a b"),
            BAD_REQUEST,
            "page_token",
        ),
        case(
            "page_token oversize",
            "ListMembers",
            listing(page_token="p" * 129),
            BAD_REQUEST,
            "page_token",
        ),
        case("empty tenant", "ListMembers", listing(tenant=""), BAD_REQUEST, "tenant"),
        case(
            "empty conversation",
            "ListMembers",
            listing(conversation=""),
            BAD_REQUEST,
            "conversation",
        ),
        case(
            "unknown conversation",
            "ListMembers",
            listing(conversation="nowhere"),
            NO_CONVERSATION,
            "conversation",
        ),
        case(
            "conversation only in another tenant",
            "ListMembers",
            listing(conversation="elsewhere"),
            NO_CONVERSATION,
            "conversation",
        ),
    ]
    return cases


ADMIN_CASES = _admin_cases()


# --- running a row ----------------------------------------------------------------------

_REQUEST_TYPES: dict[str, type[Message]] = {
    "Commit": pb.CommitRequest,
    "ResumeExisting": pb.ResumeExistingRequest,
    "Resume": pb.ResumeRequest,
    "History": pb.HistoryRequest,
    "RecoverDue": pb.RecoverDueRequest,
    "CreateConversation": mpb.CreateConversationRequest,
    "AddMembers": mpb.AddMembersRequest,
    "RemoveMembers": mpb.RemoveMembersRequest,
    "ListMembers": mpb.ListMembersRequest,
}


def _parsed(rpc: str, request: Message | bytes) -> Message | None:
    if not isinstance(request, bytes):
        return request
    try:
        return _REQUEST_TYPES[rpc].FromString(request)
    except DecodeError:
        return None


def _send_of(message: Message | None) -> pb.AuthenticatedSend | None:
    if isinstance(message, pb.CommitRequest | pb.ResumeExistingRequest) and message.HasField(
        "send"
    ):
        return message.send
    return None


def _conversation_of(message: Message | None) -> tuple[str, str] | None:
    send = _send_of(message)
    if send is not None:
        return (send.tenant, send.conversation)
    tenant, conversation = getattr(message, "tenant", None), getattr(message, "conversation", None)
    if isinstance(tenant, str) and isinstance(conversation, str):
        return (tenant, conversation)
    return None


async def run_row(world: World, row: Case) -> None:
    served = world.served
    c = _ctx(world)
    original = await row.setup(c) if row.setup is not None else None
    request = row.build(c)
    parsed = _parsed(row.rpc, request)
    watched = list(world.conversations)
    named = _conversation_of(parsed)
    if named is not None and named not in watched:
        watched.append(named)
    before = await snapshot(served.backend, watched)

    answer = await invoke(served.channel, row.rpc, request)

    assert isinstance(answer, Failure), f"{row.name}: accepted, answered {answer}"
    assert (answer.code, answer.details.reason) == (row.code, row.reason), (
        f"{row.name}: {answer.code.name} {answer.details.reason}: {answer.message}"
    )
    assert (answer.code, answer.details.reason) in DOCUMENTED
    assert row.field in answer.message, f"{row.name}: the message does not name {row.field!r}"
    assert "internal" not in answer.message.lower()
    seen = answer.text()
    for secret in (*c.secrets, b"SECRET-"):
        assert secret not in seen, f"{row.name}: the answer echoes what was sent"

    after = await snapshot(served.backend, watched)
    assert after == before, f"{row.name}: the backend changed"
    send = _send_of(parsed)
    if send is not None:
        loaded = await served.load(
            send.tenant, send.sender, send.client_message_id, send.conversation
        )
        if original is None or send.conversation != original.conversation:
            assert loaded is None or row.rpc == "ResumeExisting", f"{row.name}: a commit exists"
        if original is not None:
            kept = await served.committed(
                send.tenant, send.sender, send.client_message_id, original.conversation
            )
            assert (kept.message.message_id, kept.message.seq) == (
                original.message_id,
                original.seq,
            )
        if row.rpc == "ResumeExisting" and send.client_message_id == world.known_cmid:
            assert isinstance(loaded, Committed)
            assert loaded.message.message_id == world.known.message_id


def _ids(cases: list[Case]) -> list[str]:
    return [f"{c.rpc}: {c.name}" for c in cases]


def _validated(rows: list[Case]) -> list[Case]:
    """Rows refused by validation, before any store call: the same on every backend."""
    return [r for r in rows if r.code is INVALID]


def _reached(rows: list[Case]) -> list[Case]:
    """Rows whose answer comes from what the store holds: run on every backend."""
    return [r for r in rows if r.code is not INVALID]


VALIDATED = [*_validated(COMMIT_CASES), *_validated(HISTORY_CASES)]
VALIDATED += [*_validated(RESUME_CASES), *_validated(ADMIN_CASES)]


@pytest.mark.parametrize("served", ["memory"], indirect=True)
@pytest.mark.parametrize("row", VALIDATED, ids=_ids(VALIDATED))
async def test_validation_rejections(world: World, row: Case) -> None:
    """Backend-independent: proven once, on the memory backend (nothing reaches a
    store, and the snapshot shows nothing was written)."""
    await run_row(world, row)


@pytest.mark.parametrize("row", _reached(COMMIT_CASES), ids=_ids(_reached(COMMIT_CASES)))
async def test_commit_rejections(world: World, row: Case) -> None:
    await run_row(world, row)


@pytest.mark.parametrize("row", _reached(HISTORY_CASES), ids=_ids(_reached(HISTORY_CASES)))
async def test_history_rejections(world: World, row: Case) -> None:
    await run_row(world, row)


@pytest.mark.parametrize("row", _reached(RESUME_CASES), ids=_ids(_reached(RESUME_CASES)))
async def test_resume_and_recovery_rejections(world: World, row: Case) -> None:
    await run_row(world, row)


@pytest.mark.parametrize("row", _reached(ADMIN_CASES), ids=_ids(_reached(ADMIN_CASES)))
async def test_membership_rejections(world: World, row: Case) -> None:
    await run_row(world, row)


# --- documented zeroes and bounds are accepted, and reads write nothing ----------------

Check = Callable[[World, Message], None]


@dataclass(frozen=True)
class Accepted:
    name: str
    rpc: str
    build: Build
    check: Check


def _a_page(world: World, answer: Message) -> None:
    """A page of c1 in order; read forward, it starts with the known message (seq 1)."""
    assert isinstance(answer, pb.HistoryResponse)
    page = answer.page
    seqs = [r.seq for r in page.records]
    assert seqs and {(r.tenant, r.conversation) for r in page.records} == {(world.tenant, "c1")}
    if page.direction == pb.DIRECTION_FORWARD:
        assert seqs == sorted(set(seqs)) and page.records[0].message_id == world.known.message_id
    else:
        assert seqs == sorted(set(seqs), reverse=True) and seqs[0] == page.last_seq


def _recovered_nothing(world: World, answer: Message) -> None:
    assert isinstance(answer, pb.RecoverDueResponse) and answer.recovered == 0


def _members(world: World, answer: Message) -> None:
    assert isinstance(answer, mpb.ListMembersResponse)
    assert list(answer.members) == ["alice", "bob"] and answer.next_page_token == ""


def _not_found(world: World, answer: Message) -> None:
    assert isinstance(answer, pb.ResumeExistingResponse) and not answer.found


def _replayed(world: World, answer: Message) -> None:
    assert isinstance(answer, pb.ResumeResponse) and answer.message == world.known


ACCEPTED = [
    Accepted("History zeroes mean the defaults", "History", history(), _a_page),
    Accepted("History limit 200", "History", history(limit=200), _a_page),
    Accepted("History max_bytes 1 KiB", "History", history(max_bytes=1024), _a_page),
    Accepted("History max_bytes 4 MiB", "History", history(max_bytes=4 << 20), _a_page),
    Accepted("History forward", "History", history(direction=2), _a_page),
    Accepted("History anchor 2^63-1", "History", history(anchor_seq=2**63 - 1), _a_page),
    Accepted("History anchor 10^6, past the end", "History", history(anchor_seq=10**6), _a_page),
    Accepted("RecoverDue zeroes", "RecoverDue", recover(), _recovered_nothing),
    Accepted(
        "RecoverDue max_items 10000", "RecoverDue", recover(max_items=10_000), _recovered_nothing
    ),
    Accepted(
        "RecoverDue older_than_ms 2^63-1",
        "RecoverDue",
        recover(older_than_ms=2**63 - 1),
        _recovered_nothing,
    ),
    Accepted("ListMembers page_size 0", "ListMembers", listing(), _members),
    Accepted("ListMembers page_size 1000", "ListMembers", listing(page_size=1000), _members),
    Accepted("ResumeExisting of an unknown key", "ResumeExisting", resume_existing(), _not_found),
    Accepted("Resume of the known key", "Resume", resume(), _replayed),
]


@pytest.mark.parametrize("row", ACCEPTED, ids=[a.name for a in ACCEPTED])
async def test_documented_defaults_are_accepted_and_write_nothing(
    world: World, row: Accepted
) -> None:
    c = _ctx(world)
    before = await snapshot(world.served.backend, world.conversations)
    answer = await invoke(world.served.channel, row.rpc, row.build(c))
    assert not isinstance(answer, Failure), f"{row.name}: {answer}"
    row.check(world, answer)
    assert await snapshot(world.served.backend, world.conversations) == before
    assert await world.served.load(c.tenant, "alice", c.cmid, "c1") is None
