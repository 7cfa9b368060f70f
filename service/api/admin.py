"""The ConversationMembershipService servicer: conversation membership administration.

Validates ids and sizes, calls the MembershipStore, and translates the
store's errors into the CommitError family in one place (``_store_errors``),
so the interceptor's table can answer them without any backend text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from grpc import aio

from service.api.errors import ConversationExists
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
from service.domain.model import Membership
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
        raise InvalidRequest("the membership request is not valid") from exc
    except StoreUnavailable as exc:
        raise Unavailable("membership is unavailable: backend error") from exc


def _conversation(tenant: str, conversation: str) -> tuple[str, str]:
    return check_id("tenant", tenant), check_id("conversation", conversation)


def _members(users: Sequence[str]) -> list[str]:
    if not 1 <= len(users) <= MAX_MEMBERS_PER_CALL:
        raise InvalidRequest(f"members must list 1 to {MAX_MEMBERS_PER_CALL} users")
    return [check_id("members", user) for user in users]


def _version(membership: Membership) -> pb.MembershipVersion:
    return pb.MembershipVersion(
        tenant=membership.tenant,
        conversation=membership.conversation,
        version=membership.version,
        member_count=len(membership.members),
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
        if request.page_token:
            check_id("page_token", request.page_token)
        with _store_errors():
            page = await self._store.list_members(
                tenant, conversation, request.page_token, request.page_size or DEFAULT_PAGE_SIZE
            )
        return pb.ListMembersResponse(
            members=list(page.members), version=page.version, next_page_token=page.next_page_token
        )
