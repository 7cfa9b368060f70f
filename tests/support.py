"""Builders shared by the test suites."""

from __future__ import annotations

import itertools
import uuid

import pytest

from service.domain.committer import MessageCommitter
from service.domain.errors import ConversationNotFound, NotAMember
from service.domain.limits import CommitLimits
from service.domain.model import (
    AuthenticatedSend,
    BodyReference,
    MessageContent,
    MessageType,
)
from service.domain.ports import Backend, Clock

_counter = itertools.count(1)
NO_QUOTA = CommitLimits(sender_rate_per_s=0)


def unique(prefix: str) -> str:
    """An id no other test uses (tests share real backends)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def text(body: str) -> MessageContent:
    return MessageContent(MessageType.TEXT, body.encode())


def send(
    tenant: str,
    conversation: str = "c1",
    *,
    sender: str = "alice",
    device: str = "phone",
    cmid: str | None = None,
    content: MessageContent | None = None,
    mentions: tuple[str, ...] = (),
    reply_to: str = "",
) -> AuthenticatedSend:
    return AuthenticatedSend(
        tenant=tenant,
        sender=sender,
        device=device,
        conversation=conversation,
        cmid=cmid or f"cm-{next(_counter)}",
        content=content or text("hello"),
        mentions=mentions,
        reply_to=reply_to,
    )


def referenced(uri: str = "s3://bucket/obj", size: int = 1234) -> MessageContent:
    return MessageContent(MessageType.IMAGE, body_ref=BodyReference(uri, size, "ab" * 32))


async def members(
    backend: Backend, tenant: str, conv: str = "c1", version: int | None = None, page: int = 1000
) -> list[str]:
    """Every member of ``conv`` at ``version`` (None: now), through the paged listing."""
    found: list[str] = []
    after = ""
    for _ in range(100_000):
        got = await backend.membership.members_at(tenant, conv, version, after, page)
        found += got.members
        if not got.next_after:
            return found
        after = got.next_after
    raise AssertionError("the member listing did not end")


async def conversation(
    backend: Backend, tenant: str, conv: str = "c1", members: tuple[str, ...] = ("alice", "bob")
) -> None:
    await backend.membership.create_conversation(tenant, conv, members)


def committer(
    backend: Backend, clock: Clock | None = None, limits: CommitLimits = NO_QUOTA
) -> MessageCommitter:
    return MessageCommitter(
        backend.store, backend.membership, backend.outbox, limits=limits, clock=clock
    )


DEDUPE_WINDOW_MS = 100_000
DEDUPE_GROUPS = ((2, 0), (3, 10_000), (4, 20_000), (5, 20_000))
"""(last seq, appended ms) of a lane's first groups; the next, seq 6, is appended at
each case's ``now``, and a count bound of 2 then leaves the watermark at 4."""
DEDUPE_CASES = (
    (20_000, 0),  # (now, the dedupe mark): 1-4 trimmed by count, all remembered
    (DEDUPE_WINDOW_MS - 1, 0),
    (DEDUPE_WINDOW_MS, 2),  # the group 1-2 is forgotten, whole
    (DEDUPE_WINDOW_MS + 10_000, 3),  # the group 3, ten seconds younger
    (DEDUPE_WINDOW_MS + 20_000, 4),  # 4 as it is trimmed: it is as old; never 5 (held)
)
"""The one case table of ``service.domain.mailbox.dedupe_cut``: tests/unit checks the
rule, tests/conformance every backend (the Redis script mirrors it)."""


async def refused_admissions(c: MessageCommitter, tenant: str, known_cmid: str) -> None:
    """Three sends admission refuses in conversation "c1"'s tenant: a non-member, a
    conversation that does not exist, and ``known_cmid`` (a committed key) sent to
    that conversation (refused as no conversation, not answered from the key)."""
    with pytest.raises(NotAMember):
        await c.commit_send(send(tenant, sender="mallory"))
    with pytest.raises(ConversationNotFound):
        await c.commit_send(send(tenant, conversation="nowhere"))
    with pytest.raises(ConversationNotFound):
        await c.commit_send(send(tenant, conversation="nowhere", cmid=known_cmid))
