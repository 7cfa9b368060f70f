"""The MessageCommitterService servicer: protos in, committer calls, protos out.

Handlers only convert; every rule lives in the committer and every error
becomes a status in the interceptor (``service.api.errors``).
"""

from __future__ import annotations

from typing import Any

from grpc import aio

from service.api import convert
from service.domain.committer import MessageCommitter
from service.domain.errors import InvalidRequest
from service.domain.ids import check_id
from service.domain.model import AuthenticatedSend
from service.domain.ports import Clock
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import committer_pb2_grpc

Context = aio.ServicerContext[Any, Any]

DEFAULT_RECOVER_ITEMS = 100
MAX_RECOVER_ITEMS = 10_000


def _send(request: pb.CommitRequest | pb.ResumeExistingRequest) -> AuthenticatedSend:
    if not request.HasField("send"):
        raise InvalidRequest("send is required")
    return convert.send_from_proto(request.send)


class CommitterServicer(committer_pb2_grpc.MessageCommitterServiceServicer):
    """Serves message_committer.v1.MessageCommitterService over a MessageCommitter."""

    def __init__(
        self, committer: MessageCommitter, clock: Clock, *, idempotency_window_ms: int = 0
    ) -> None:
        self._committer = committer
        self._clock = clock
        self._window_ms = idempotency_window_ms

    async def Commit(self, request: pb.CommitRequest, context: Context) -> pb.CommitResponse:
        message = await self._committer.commit_send(_send(request))
        return pb.CommitResponse(message=convert.committed_to_proto(message))

    async def Resume(self, request: pb.ResumeRequest, context: Context) -> pb.ResumeResponse:
        check_id("conversation", request.conversation)
        key = convert.key_from_resume(request)
        message = await self._committer.resume(key, request.conversation)
        return pb.ResumeResponse(message=convert.committed_to_proto(message))

    async def ResumeExisting(
        self, request: pb.ResumeExistingRequest, context: Context
    ) -> pb.ResumeExistingResponse:
        message = await self._committer.resume_existing(_send(request))
        if message is None:
            return pb.ResumeExistingResponse(found=False, idempotency_window_ms=self._window_ms)
        return pb.ResumeExistingResponse(
            found=True,
            message=convert.committed_to_proto(message),
            idempotency_window_ms=self._window_ms,
        )

    async def RecoverDue(
        self, request: pb.RecoverDueRequest, context: Context
    ) -> pb.RecoverDueResponse:
        if request.max_items > MAX_RECOVER_ITEMS:
            raise InvalidRequest(f"max_items must be at most {MAX_RECOVER_ITEMS}")
        if request.older_than_ms < 0:
            raise InvalidRequest("older_than_ms must not be negative")
        older_than = request.older_than_ms or self._clock.now_ms()
        report = await self._committer.recover_due(
            older_than, request.max_items or DEFAULT_RECOVER_ITEMS
        )
        return pb.RecoverDueResponse(
            recovered=report.committed,
            scanned=report.scanned,
            failed=report.failed,
            quarantined=report.quarantined,
        )

    async def History(self, request: pb.HistoryRequest, context: Context) -> pb.HistoryResponse:
        page = await self._committer.history(convert.history_query_from_proto(request))
        return pb.HistoryResponse(page=convert.page_to_proto(page))
