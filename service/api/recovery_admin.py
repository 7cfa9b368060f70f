"""The RecoveryAdminService servicer: the recovery queue's quarantine, for operators.

Items carry ids, coordinates, the state and the last problem (an error class
and a step), never content. Page tokens are opaque: the store's own token,
wrapped so a client cannot build or edit one.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from grpc import aio

from service.api import convert
from service.domain.committer import MessageCommitter
from service.domain.errors import InvalidRequest
from service.domain.ids import CommitKey
from service.domain.model import AbandonOutcome, CommitState, RecoveryItem
from service.gen.message_committer.v1 import recovery_pb2 as pb
from service.gen.message_committer.v1 import recovery_pb2_grpc

Context = aio.ServicerContext[Any, Any]

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
_TOKEN_TAG = b"q1\x00"
_STATES = {
    CommitState.RESERVED: pb.INTENT_STATE_RESERVED,
    CommitState.RECORDED: pb.INTENT_STATE_RECORDED,
    CommitState.OUTBOXED: pb.INTENT_STATE_OUTBOXED,
}


def wrap_token(store_token: str) -> str:
    if not store_token:
        return ""
    return base64.urlsafe_b64encode(_TOKEN_TAG + store_token.encode()).decode().rstrip("=")


def unwrap_token(token: str) -> str:
    if not token:
        return ""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        if not raw.startswith(_TOKEN_TAG):
            raise ValueError
        return raw[len(_TOKEN_TAG) :].decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("page_token is not one this service issued") from None


def item_to_proto(item: RecoveryItem) -> pb.RecoveryItem:
    msg = pb.RecoveryItem(
        tenant=item.key.tenant,
        sender=item.key.sender,
        client_message_id=item.key.cmid,
        conversation=item.conversation,
        created_at_ms=item.created_at_ms,
        attempts=item.attempts,
        quarantined=item.quarantined,
        problem=item.problem,
        decodable=item.intent is not None,
    )
    if item.intent is not None:
        msg.state = _STATES.get(item.intent.state, pb.INTENT_STATE_UNSPECIFIED)
        msg.seq = item.intent.record.seq
        msg.message_id = item.intent.record.message_id
    return msg


def _key(
    request: pb.GetRecoveryItemRequest | pb.RetryQuarantinedRequest | pb.AbandonQuarantinedRequest,
) -> CommitKey:
    return CommitKey(request.tenant, request.sender, request.client_message_id).validate()


class RecoveryAdminServicer(recovery_pb2_grpc.RecoveryAdminServiceServicer):
    """Serves message_committer.v1.RecoveryAdminService over a MessageCommitter."""

    def __init__(self, committer: MessageCommitter) -> None:
        self._committer = committer

    async def ListQuarantined(
        self, request: pb.ListQuarantinedRequest, context: Context
    ) -> pb.ListQuarantinedResponse:
        if request.page_size > MAX_PAGE_SIZE:
            raise InvalidRequest(f"page_size must be at most {MAX_PAGE_SIZE}")
        page = await self._committer.quarantined(
            unwrap_token(request.page_token), request.page_size or DEFAULT_PAGE_SIZE
        )
        return pb.ListQuarantinedResponse(
            items=[item_to_proto(i) for i in page.items],
            next_page_token=wrap_token(page.next_token),
        )

    async def GetRecoveryItem(
        self, request: pb.GetRecoveryItemRequest, context: Context
    ) -> pb.GetRecoveryItemResponse:
        item = await self._committer.recovery_item(_key(request))
        return pb.GetRecoveryItemResponse(item=item_to_proto(item))

    async def RetryQuarantined(
        self, request: pb.RetryQuarantinedRequest, context: Context
    ) -> pb.RetryQuarantinedResponse:
        message = await self._committer.retry_quarantined(_key(request))
        return pb.RetryQuarantinedResponse(message=convert.committed_to_proto(message))

    async def AbandonQuarantined(
        self, request: pb.AbandonQuarantinedRequest, context: Context
    ) -> pb.AbandonQuarantinedResponse:
        done = await self._committer.abandon_quarantined(
            _key(request), request.operator, request.reason
        )
        return pb.AbandonQuarantinedResponse(
            abandoned_now=done.outcome is AbandonOutcome.ABANDONED,
            conversation=done.conversation,
            seq=done.seq,
            abandoned_at_ms=done.at_ms,
            operator=done.operator,
            reason=done.reason,
        )
