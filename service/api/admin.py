"""The ConversationMembershipService servicer: conversation membership administration.

Validates ids and sizes, calls the MembershipStore, and translates the
store's errors into the CommitError family in one place (``_store_errors``),
so the interceptor's table can answer them without any backend text.

Membership is changed and listed in pages (up to 10,000 users per call, up to
1,000 per listed page), so a conversation of a million members is managed
like a small one. ListMembers' page token is opaque and pins the version the
first page was read at (``service.domain.membership.page_token``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from grpc import aio

from service.api.errors import ConversationExists
from service.domain import membership as rules
from service.domain.errors import (
    ConversationNotFound,
    InvalidRequest,
    StoreAlreadyExists,
    StoreInvalid,
    StoreNotFound,
    StoreUnavailable,
    Unavailable,
)
from service.domain.ids import check_id
from service.domain.model import MembershipInfo
from service.domain.ports import MembershipStore
from service.gen.message_committer.v1 import membership_pb2 as pb
from service.gen.message_committer.v1 import membership_pb2_grpc

Context = aio.ServicerContext[Any, Any]

MAX_MEMBERS_PER_CALL = 10_000
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


@contextmanager
def _store_errors() -> Iterator[None]:
    try:
        yield
    except StoreNotFound as exc:
        raise ConversationNotFound("conversation not found") from exc
    except StoreAlreadyExists as exc:
        raise ConversationExists("conversation already exists") from exc
    except StoreInvalid as exc:
        raise InvalidRequest(
            "the membership request cannot be served (a page token of a version that is"
            " no longer readable?); start the listing again"
        ) from exc
    except StoreUnavailable as exc:
        raise Unavailable("membership is unavailable: backend error") from exc


def _conversation(tenant: str, conversation: str) -> tuple[str, str]:
    return check_id("tenant", tenant), check_id("conversation", conversation)


def _members(users: Sequence[str]) -> list[str]:
    if not 1 <= len(users) <= MAX_MEMBERS_PER_CALL:
        raise InvalidRequest(f"members must list 1 to {MAX_MEMBERS_PER_CALL} users")
    return [check_id("members", user) for user in users]


def _version(membership: MembershipInfo) -> pb.MembershipVersion:
    return pb.MembershipVersion(
        tenant=membership.tenant,
        conversation=membership.conversation,
        version=membership.version,
        member_count=membership.member_count,
    )


class MembershipServicer(membership_pb2_grpc.ConversationMembershipServiceServicer):
    """Serves message_committer.v1.ConversationMembershipService over a MembershipStore."""

    def __init__(self, store: MembershipStore) -> None:
        self._store = store

    async def CreateConversation(
        self, request: pb.CreateConversationRequest, context: Context
    ) -> pb.CreateConversationResponse:
        tenant, conversation = _conversation(request.tenant, request.conversation)
        members = _members(request.members)
        with _store_errors():
            created = await self._store.create_conversation(tenant, conversation, members)
        return pb.CreateConversationResponse(membership=_version(created))

    async def AddMembers(
        self, request: pb.AddMembersRequest, context: Context
    ) -> pb.AddMembersResponse:
        tenant, conversation = _conversation(request.tenant, request.conversation)
        members = _members(request.members)
        with _store_errors():
            changed = await self._store.add_members(tenant, conversation, members)
        return pb.AddMembersResponse(membership=_version(changed))

    async def RemoveMembers(
        self, request: pb.RemoveMembersRequest, context: Context
    ) -> pb.RemoveMembersResponse:
        tenant, conversation = _conversation(request.tenant, request.conversation)
        members = _members(request.members)
        with _store_errors():
            changed = await self._store.remove_members(tenant, conversation, members)
        return pb.RemoveMembersResponse(membership=_version(changed))

    async def ListMembers(
        self, request: pb.ListMembersRequest, context: Context
    ) -> pb.ListMembersResponse:
        tenant, conversation = _conversation(request.tenant, request.conversation)
        if request.page_size > MAX_PAGE_SIZE:
            raise InvalidRequest(f"page_size must be at most {MAX_PAGE_SIZE}")
        version, after = None, ""
        if request.page_token:
            version, after = rules.parse_page_token(request.page_token)
        with _store_errors():
            page = await self._store.members_at(
                tenant, conversation, version, after, request.page_size or DEFAULT_PAGE_SIZE
            )
        token = rules.page_token(page.version, page.next_after) if page.next_after else ""
        return pb.ListMembersResponse(
            members=list(page.members), version=page.version, next_page_token=token
        )
