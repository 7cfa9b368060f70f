"""Two tenants with identical ids never see or affect each other, on any RPC or backend.

Every test makes a fresh pair of tenants and gives both the very same
conversation, senders, devices and client message ids; whatever is done in
one (commit, resume, recovery, membership changes) must leave the other
exactly as it was, read both through the API and straight from the backend.
"""

from __future__ import annotations

import time

import grpc
import pytest

from service.domain.faults import FaultPoint
from service.domain.model import Committed, InProgress
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import membership_pb2 as mpb
from tests.security.conftest import Served, fails, ok, snapshot, unique_tenant

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

NOT_MEMBER = (grpc.StatusCode.PERMISSION_DENIED, "NOT_A_MEMBER")
NO_CONVERSATION = (grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND")
NO_COMMIT = (grpc.StatusCode.NOT_FOUND, "COMMIT_NOT_FOUND")
INTERNAL = (grpc.StatusCode.INTERNAL, "INTERNAL")


def message(
    tenant: str, body: bytes, cmid: str = "same-1", sender: str = "alice"
) -> pb.AuthenticatedSend:
    """The same ids in every tenant; only the tenant and the body vary."""
    return pb.AuthenticatedSend(
        tenant=tenant,
        sender=sender,
        device="phone",
        conversation="c1",
        client_message_id=cmid,
        content=pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=body),
        mentions=["bob"],
    )


async def two_tenants(
    served: Served, members: tuple[str, ...] = ("alice", "bob")
) -> tuple[str, str]:
    a, b = unique_tenant("a"), unique_tenant("b")
    for tenant in (a, b):
        created = await ok(
            served.channel,
            "CreateConversation",
            mpb.CreateConversationRequest(tenant=tenant, conversation="c1", members=members),
            mpb.CreateConversationResponse,
        )
        assert (created.membership.version, created.membership.tenant) == (1, tenant)
    return a, b


async def commit(served: Served, send: pb.AuthenticatedSend) -> pb.CommittedMessage:
    answer = await ok(served.channel, "Commit", pb.CommitRequest(send=send), pb.CommitResponse)
    return answer.message


async def page(served: Served, tenant: str, actor: str = "bob") -> pb.HistoryPage:
    request = pb.HistoryRequest(
        tenant=tenant, conversation="c1", actor=actor, direction=pb.DIRECTION_FORWARD
    )
    return (await ok(served.channel, "History", request, pb.HistoryResponse)).page


def contents(history: pb.HistoryPage) -> list[tuple[str, int, str, bytes]]:
    return [(r.tenant, r.seq, r.message_id, r.content.inline_body) for r in history.records]


async def test_the_same_key_is_a_fresh_commit_in_each_tenant(served: Served) -> None:
    a, b = await two_tenants(served)
    ack_a = await commit(served, message(a, b"from A"))
    assert (await page(served, b)).last_seq == 0

    # The same key with a different body is not a conflict in B: it is B's first message.
    ack_b = await commit(served, message(b, b"from B"))
    assert ack_b.seq == 1 and ack_b.message_id != ack_a.message_id
    assert await commit(served, message(a, b"from A")) == ack_a
    assert await commit(served, message(b, b"from B")) == ack_b

    second = await commit(served, message(a, b"A again", cmid="same-2"))
    assert second.seq == 2
    assert contents(await page(served, a)) == [
        (a, 1, ack_a.message_id, b"from A"),
        (a, 2, second.message_id, b"A again"),
    ]
    history_b = await page(served, b)
    assert contents(history_b) == [(b, 1, ack_b.message_id, b"from B")]
    assert history_b.last_seq == 1
    for tenant, ack in ((a, ack_a), (b, ack_b)):
        stored = await served.committed(tenant, "alice", "same-1", "c1")
        assert (stored.message.message_id, stored.message.seq) == (ack.message_id, ack.seq)


async def test_resume_and_resume_existing_never_cross_tenants(served: Served) -> None:
    a, b = await two_tenants(served)
    ack_a = await commit(served, message(a, b"from A"))
    before = await snapshot(served.backend, [(a, "c1"), (b, "c1")])

    resume_b = pb.ResumeRequest(
        tenant=b, sender="alice", client_message_id="same-1", conversation="c1"
    )
    await fails(served.channel, "Resume", resume_b, NO_COMMIT)
    existing_b = pb.ResumeExistingRequest(send=message(b, b"from A"))
    found = await ok(served.channel, "ResumeExisting", existing_b, pb.ResumeExistingResponse)
    assert not found.found and not found.HasField("message")
    assert await served.load(b, "alice", "same-1", "c1") is None
    assert await snapshot(served.backend, [(a, "c1"), (b, "c1")]) == before

    resume_a = pb.ResumeRequest(
        tenant=a, sender="alice", client_message_id="same-1", conversation="c1"
    )
    assert (await ok(served.channel, "Resume", resume_a, pb.ResumeResponse)).message == ack_a
    existing_a = pb.ResumeExistingRequest(send=message(a, b"from A"))
    again = await ok(served.channel, "ResumeExisting", existing_a, pb.ResumeExistingResponse)
    assert again.found and again.message == ack_a

    ack_b = await commit(served, message(b, b"from B"))
    assert (await ok(served.channel, "Resume", resume_b, pb.ResumeResponse)).message == ack_b
    assert (await ok(served.channel, "Resume", resume_a, pb.ResumeResponse)).message == ack_a


async def test_members_of_one_tenant_are_strangers_in_the_other(served: Served) -> None:
    a, b = await two_tenants(served)
    await ok(
        served.channel,
        "AddMembers",
        mpb.AddMembersRequest(tenant=a, conversation="c1", members=["carol"]),
        mpb.AddMembersResponse,
    )
    await commit(served, message(a, b"carol in A", sender="carol"))
    await fails(
        served.channel,
        "Commit",
        pb.CommitRequest(send=message(b, b"x", sender="carol")),
        NOT_MEMBER,
    )
    history = pb.HistoryRequest(tenant=b, conversation="c1", actor="carol")
    await fails(served.channel, "History", history, NOT_MEMBER)
    assert await served.load(b, "carol", "same-1", "c1") is None
    assert [r.sender for r in (await page(served, a, actor="carol")).records] == ["carol"]
    assert (await page(served, b)).records == []


async def test_membership_changes_stay_in_their_tenant(served: Served) -> None:
    a, b = await two_tenants(served)
    watched_b = [(b, "c1")]
    before_b = await snapshot(served.backend, watched_b)

    added = await ok(
        served.channel,
        "AddMembers",
        mpb.AddMembersRequest(tenant=a, conversation="c1", members=["carol", "dave"]),
        mpb.AddMembersResponse,
    )
    assert (added.membership.version, added.membership.member_count) == (2, 4)
    removed = await ok(
        served.channel,
        "RemoveMembers",
        mpb.RemoveMembersRequest(tenant=a, conversation="c1", members=["bob"]),
        mpb.RemoveMembersResponse,
    )
    assert (removed.membership.version, removed.membership.member_count) == (3, 3)
    assert await snapshot(served.backend, watched_b) == before_b

    listed_a = await ok(
        served.channel,
        "ListMembers",
        mpb.ListMembersRequest(tenant=a, conversation="c1"),
        mpb.ListMembersResponse,
    )
    listed_b = await ok(
        served.channel,
        "ListMembers",
        mpb.ListMembersRequest(tenant=b, conversation="c1"),
        mpb.ListMembersResponse,
    )
    assert (list(listed_a.members), listed_a.version) == (["alice", "carol", "dave"], 3)
    assert (list(listed_b.members), listed_b.version) == (["alice", "bob"], 1)

    # bob, removed in A, still sends and reads in B; in A he is a stranger now.
    await commit(served, message(b, b"bob in B", sender="bob"))
    assert [r.sender for r in (await page(served, b)).records] == ["bob"]
    await fails(
        served.channel, "Commit", pb.CommitRequest(send=message(a, b"x", sender="bob")), NOT_MEMBER
    )

    # Removing B's members leaves A's alone, too.
    before_a = await snapshot(served.backend, [(a, "c1")])
    await ok(
        served.channel,
        "RemoveMembers",
        mpb.RemoveMembersRequest(tenant=b, conversation="c1", members=["alice"]),
        mpb.RemoveMembersResponse,
    )
    assert await snapshot(served.backend, [(a, "c1")]) == before_a


async def test_a_conversation_of_one_tenant_does_not_exist_in_the_other(served: Served) -> None:
    a, b = unique_tenant("a"), unique_tenant("b")
    await ok(
        served.channel,
        "CreateConversation",
        mpb.CreateConversationRequest(tenant=a, conversation="c1", members=["alice", "bob"]),
        mpb.CreateConversationResponse,
    )
    before = await snapshot(served.backend, [(a, "c1"), (b, "c1")])
    for rpc, request in (
        ("AddMembers", mpb.AddMembersRequest(tenant=b, conversation="c1", members=["x"])),
        ("RemoveMembers", mpb.RemoveMembersRequest(tenant=b, conversation="c1", members=["bob"])),
        ("ListMembers", mpb.ListMembersRequest(tenant=b, conversation="c1")),
        ("History", pb.HistoryRequest(tenant=b, conversation="c1", actor="bob")),
        ("Commit", pb.CommitRequest(send=message(b, b"x"))),
    ):
        await fails(served.channel, rpc, request, NO_CONVERSATION)
    assert await snapshot(served.backend, [(a, "c1"), (b, "c1")]) == before

    # Creating it in B is a creation (version 1, B's members), not ALREADY_EXISTS.
    created = await ok(
        served.channel,
        "CreateConversation",
        mpb.CreateConversationRequest(tenant=b, conversation="c1", members=["carol"]),
        mpb.CreateConversationResponse,
    )
    assert (created.membership.version, created.membership.member_count) == (1, 1)
    after = await snapshot(served.backend, [(a, "c1")])
    assert after.conversations == {(a, "c1"): before.conversations[(a, "c1")]}


async def test_recovery_finishes_each_tenant_s_own_intent(served: Served) -> None:
    a, b = await two_tenants(served)
    served.faults.arm(FaultPoint.AFTER_RESERVE)
    await fails(served.channel, "Commit", pb.CommitRequest(send=message(a, b"from A")), INTERNAL)
    assert isinstance(await served.load(a, "alice", "same-1", "c1"), InProgress)

    ack_b = await commit(served, message(b, b"from B"))  # B's key is B's own, not A's intent
    assert ack_b.seq == 1
    before_b = await snapshot(served.backend, [(b, "c1")])

    due = pb.RecoverDueRequest(older_than_ms=int(time.time() * 1000) + 60_000)
    recovered = await ok(served.channel, "RecoverDue", due, pb.RecoverDueResponse)
    assert recovered.recovered == 1
    after_b = await snapshot(served.backend, [(b, "c1")])
    assert after_b.conversations == before_b.conversations

    finished = await served.load(a, "alice", "same-1", "c1")
    assert isinstance(finished, Committed) and finished.message.message_id != ack_b.message_id
    assert contents(await page(served, a)) == [(a, 1, finished.message.message_id, b"from A")]
    assert contents(await page(served, b)) == [(b, 1, ack_b.message_id, b"from B")]
    resume_a = pb.ResumeRequest(
        tenant=a, sender="alice", client_message_id="same-1", conversation="c1"
    )
    replay = await ok(served.channel, "Resume", resume_a, pb.ResumeResponse)
    assert replay.message.message_id == finished.message.message_id
