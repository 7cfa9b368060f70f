"""The ConversationMembershipService servicer: conversation membership administration.

Validates ids and sizes, calls the MembershipStore, and translates the
store's errors into the CommitError family in one place (``_store_errors``),
so the interceptor's table can answer them without any backend text.

Membership is changed and listed in pages (up to 10,000 users per call, up to
1,000 per listed page), so a conversation of a million members is managed
like a small one. ListMembers' page token is opaque and pins the version the
first page was read at (``service.domain.membership.page_token``).

The per-user conversation index (``ConversationIndex``) behind
ListConversations is written so that it never misses a membership: users are
indexed *before* they are added (a failed add leaves an extra entry), and
unindexed only *after* they were removed (a failed cleanup leaves an extra
entry, and the call fails so the caller retries). Extra entries never show:
ListConversations confirms every entry with an admission lookup. It reports
each conversation's lane: its own (``conversation:<id>``) when it has more
members than the fan-out threshold or has had its own lane, else ``inbox``.

RemoveMembers also records each removed user's departure (conversation, the
version the removal made, server time) *after* the removal and before the
unindexing; a failed record fails the call, and the retry records it again.
ListLeftConversations lists them by time from a bound the caller gives (a
rebuilding device: what it may have missed), never older than History's
retention, and skips the conversations the user is a member of again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from grpc import aio

from service.api.errors import ConversationExists
from service.domain import membership as rules
from service.domain.delivery import DeliveryPorts, LeftConversation, LeftMark
from service.domain.errors import (
    ConversationNotFound,
    InvalidRequest,
    StoreAlreadyExists,
    StoreInvalid,
    StoreNotFound,
    StoreOutcomeUnknown,
    StoreUnavailable,
    Unavailable,
)
from service.domain.ids import check_id
from service.domain.mailbox import INBOX, Mailbox, conversation_lane
from service.domain.model import MembershipInfo
from service.domain.ports import Clock, MembershipStore
from service.gen.message_committer.v1 import membership_pb2 as pb
from service.gen.message_committer.v1 import membership_pb2_grpc

Context = aio.ServicerContext[Any, Any]

MAX_MEMBERS_PER_CALL = 10_000
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
LOOKUP_CONCURRENCY = 32
_TOKEN_TAG = b"c1\x00"
_LEFT_TAG = b"l1\x00"
MAX_MS = 2**63


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
    except StoreOutcomeUnknown as exc:  # applied on the primary, maybe not on its replicas
        raise Unavailable(
            "the membership change was not confirmed in time (it may have been applied);"
            " retry it: adding or removing the same members again is harmless"
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


def _token(tag: bytes, text: str) -> str:
    """An opaque page token: ``tag`` (which listing issued it) and ``text``."""
    return base64.urlsafe_b64encode(tag + text.encode()).decode().rstrip("=")


def _untoken(tag: bytes, token: str) -> str:
    """The non-empty text of a token ``_token(tag, ...)`` made, else InvalidRequest."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        if not raw.startswith(tag) or len(raw) == len(tag):
            raise ValueError
        return raw[len(tag) :].decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("page_token is not one this service issued") from None


def _conversations_token(after: str) -> str:
    return _token(_TOKEN_TAG, after)


def _parse_conversations_token(token: str) -> str:
    return _untoken(_TOKEN_TAG, token)


def _left_token(mark: LeftMark) -> str:
    return _token(_LEFT_TAG, f"{mark.at_ms}:{mark.conversation}")


def _parse_left_token(token: str) -> LeftMark:
    at, sep, conversation = _untoken(_LEFT_TAG, token).partition(":")
    try:
        if not sep or not at.isdigit() or int(at) >= MAX_MS or not conversation:
            raise ValueError
        return LeftMark(int(at), check_id("conversation", conversation))
    except (ValueError, InvalidRequest):
        raise InvalidRequest("page_token is not one this service issued") from None


class MembershipServicer(membership_pb2_grpc.ConversationMembershipServiceServicer):
    """Serves message_committer.v1.ConversationMembershipService over a MembershipStore
    and the per-user conversation index of the backend's delivery side."""

    def __init__(
        self,
        store: MembershipStore,
        delivery: DeliveryPorts,
        threshold: int,
        clock: Clock,
        *,
        history_retention_ms: int = 0,
    ) -> None:
        self._store = store
        self._delivery = delivery
        self._threshold = threshold
        self._clock = clock
        self._history_retention_ms = history_retention_ms

    async def CreateConversation(
        self, request: pb.CreateConversationRequest, context: Context
    ) -> pb.CreateConversationResponse:
        tenant, conversation = _conversation(request.tenant, request.conversation)
        members = _members(request.members)
        with _store_errors():
            await self._delivery.index.add(tenant, conversation, sorted(set(members)))
            created = await self._store.create_conversation(tenant, conversation, members)
        return pb.CreateConversationResponse(membership=_version(created))

    async def AddMembers(
        self, request: pb.AddMembersRequest, context: Context
    ) -> pb.AddMembersResponse:
        tenant, conversation = _conversation(request.tenant, request.conversation)
        members = _members(request.members)
        with _store_errors():
            if await self._store.membership_info(tenant, conversation) is None:
                raise StoreNotFound("conversation not found")
            await self._delivery.index.add(tenant, conversation, sorted(set(members)))
            changed = await self._store.add_members(tenant, conversation, members)
        return pb.AddMembersResponse(membership=_version(changed))

    async def RemoveMembers(
        self, request: pb.RemoveMembersRequest, context: Context
    ) -> pb.RemoveMembersResponse:
        tenant, conversation = _conversation(request.tenant, request.conversation)
        members = _members(request.members)
        with _store_errors():
            changed = await self._store.remove_members(tenant, conversation, members)
            users = sorted(set(members))
            await self._delivery.index.record_left(
                tenant, conversation, users, changed.version, self._clock.now_ms()
            )
            await self._delivery.index.remove(tenant, conversation, users)
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

    async def ListConversations(
        self, request: pb.ListConversationsRequest, context: Context
    ) -> pb.ListConversationsResponse:
        tenant, user = check_id("tenant", request.tenant), check_id("user", request.user)
        if request.page_size > MAX_PAGE_SIZE:
            raise InvalidRequest(f"page_size must be at most {MAX_PAGE_SIZE}")
        after = _parse_conversations_token(request.page_token) if request.page_token else ""
        with _store_errors():
            ids, next_after = await self._delivery.index.conversations(
                tenant, user, after, request.page_size or DEFAULT_PAGE_SIZE
            )
            summaries = await self._summaries(tenant, user, ids)
        token = _conversations_token(next_after) if next_after else ""
        return pb.ListConversationsResponse(conversations=summaries, next_page_token=token)

    async def ListLeftConversations(
        self, request: pb.ListLeftConversationsRequest, context: Context
    ) -> pb.ListLeftConversationsResponse:
        tenant, user = check_id("tenant", request.tenant), check_id("user", request.user)
        if request.page_size > MAX_PAGE_SIZE:
            raise InvalidRequest(f"page_size must be at most {MAX_PAGE_SIZE}")
        if request.left_after_ms >= MAX_MS:
            raise InvalidRequest("left_after_ms must be below 2^63")
        floor = request.left_after_ms
        if self._history_retention_ms:  # History holds nothing of older departures
            floor = max(floor, self._clock.now_ms() - self._history_retention_ms)
        after = LeftMark(floor)  # every id sorts after ""
        if request.page_token:
            after = max(after, _parse_left_token(request.page_token))
        with _store_errors():
            entries, next_mark = await self._delivery.index.left(
                tenant, user, after, request.page_size or DEFAULT_PAGE_SIZE
            )
            left = await self._departures(tenant, user, entries)
        token = _left_token(next_mark) if next_mark is not None else ""
        return pb.ListLeftConversationsResponse(conversations=left, next_page_token=token)

    async def _departures(
        self, tenant: str, user: str, entries: Sequence[LeftConversation]
    ) -> list[pb.LeftConversation]:
        """The departures of ``entries`` whose conversation exists and does not
        have ``user`` as a member now, with their lanes (one per conversation)."""
        limit = asyncio.Semaphore(LOOKUP_CONCURRENCY)
        latest = {e.conversation: e for e in entries}  # by time: the last one wins

        async def look(entry: LeftConversation) -> MembershipInfo | None:
            async with limit:
                admission = await self._store.admission(tenant, entry.conversation, user)
                if admission is None or admission.member:
                    return None  # gone, or a member again: ListConversations has it
                return await self._store.membership_info(tenant, entry.conversation)

        found = await asyncio.gather(*(look(e) for e in latest.values()))
        infos = [i for i in found if i is not None]
        lanes = await self._lanes(infos)
        return [
            pb.LeftConversation(
                conversation=info.conversation,
                lane=lane,
                left_at_version=latest[info.conversation].version,
                left_at_ms=latest[info.conversation].at_ms,
            )
            for info, lane in zip(infos, lanes, strict=True)
        ]

    async def _lanes(self, infos: Sequence[MembershipInfo]) -> list[str]:
        """Each conversation's lane: its own when big or once given one, else the inbox."""
        states = await self._delivery.mailbox.lane_state(
            [Mailbox.conversation(i.tenant, i.conversation) for i in infos]
        )
        result = []
        for info, state in zip(infos, states, strict=True):
            big = info.member_count > self._threshold or state.head > 0 or state.epoch > 1
            result.append(conversation_lane(info.conversation) if big else INBOX)
        return result

    async def _summaries(
        self, tenant: str, user: str, ids: Sequence[str]
    ) -> list[pb.ConversationSummary]:
        """The indexed conversations ``user`` is a member of now, with their lanes."""
        limit = asyncio.Semaphore(LOOKUP_CONCURRENCY)

        async def look(conversation: str) -> MembershipInfo | None:
            async with limit:
                admission = await self._store.admission(tenant, conversation, user)
                if admission is None or not admission.member:
                    return None  # a stale index entry: never shown
                return await self._store.membership_info(tenant, conversation)

        infos = [i for i in await asyncio.gather(*(look(c) for c in ids)) if i is not None]
        return [
            pb.ConversationSummary(
                conversation=info.conversation,
                version=info.version,
                member_count=info.member_count,
                lane=lane,
            )
            for info, lane in zip(infos, await self._lanes(infos), strict=True)
        ]
