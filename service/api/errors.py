"""The one table from errors to gRPC status codes, used both ways.

The server's interceptor (``service.api.interceptor``) turns an exception
raised by a servicer into a status with ``to_status``; the client
(``service.client``) turns a status back into the same exception class with
``from_status``. Every mapped status carries a ``google.rpc.ErrorInfo``
detail whose ``reason`` names the row, so the client can tell apart rows that
share a code (Recoverable and Unavailable are both UNAVAILABLE).

Messages: CommitError messages are written for the caller (they name fields
and rules, never bodies or backend text) and are passed through; rows with a
fixed ``message`` replace the exception's text, so no backend condition, key
or address can leak. Anything not in the table is INTERNAL "internal error".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from service.domain.errors import (
    CommitAbandoned,
    CommitError,
    CommitNotFound,
    ConversationNotFound,
    CursorExpired,
    IdempotencyConflict,
    InvalidClientMessageId,
    InvalidRequest,
    NotAMember,
    NotQuarantined,
    QuotaExceeded,
    Recoverable,
    StoreUnavailable,
    Unavailable,
)
from service.domain.ids import CommitKey

DOMAIN = "message-committer.v1"
STATUS_DETAILS_KEY = "grpc-status-details-bin"
UNAVAILABLE_RETRY_S = 0.2


class ConversationExists(CommitError):
    """CreateConversation met a conversation that already exists."""


class RequestTooLarge(CommitError):
    """The request is over the server's size limit (``MC_MAX_MESSAGE_BYTES``)."""


class FailClosed(Unavailable):
    """Writes are refused: the backend is in a state that could lose ACKed data
    (``service.api.gate``); the message says which, for the operator."""


class RemoteError(CommitError):
    """(client side) A status outside the table: INTERNAL, DEADLINE_EXCEEDED, ..."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class StatusRule:
    """How one exception class travels as a status."""

    code: grpc.StatusCode
    reason: str
    message: str | None = None
    """A fixed message replacing the exception's own text; None passes it on."""
    retry_after_s: float | None = None
    """A RetryInfo hint; QuotaExceeded computes its own."""


STATUS_TABLE: dict[type[Exception], StatusRule] = {
    InvalidClientMessageId: StatusRule(
        grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CLIENT_MESSAGE_ID"
    ),
    InvalidRequest: StatusRule(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
    NotAMember: StatusRule(grpc.StatusCode.PERMISSION_DENIED, "NOT_A_MEMBER"),
    IdempotencyConflict: StatusRule(grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_CONFLICT"),
    ConversationExists: StatusRule(grpc.StatusCode.ALREADY_EXISTS, "CONVERSATION_EXISTS"),
    QuotaExceeded: StatusRule(grpc.StatusCode.RESOURCE_EXHAUSTED, "SENDER_QUOTA_EXCEEDED"),
    RequestTooLarge: StatusRule(grpc.StatusCode.RESOURCE_EXHAUSTED, "REQUEST_TOO_LARGE"),
    Recoverable: StatusRule(
        grpc.StatusCode.UNAVAILABLE, "COMMIT_RECOVERABLE", retry_after_s=UNAVAILABLE_RETRY_S
    ),
    FailClosed: StatusRule(grpc.StatusCode.UNAVAILABLE, "FAIL_CLOSED", retry_after_s=1.0),
    CommitNotFound: StatusRule(grpc.StatusCode.NOT_FOUND, "COMMIT_NOT_FOUND"),
    CommitAbandoned: StatusRule(grpc.StatusCode.FAILED_PRECONDITION, "COMMIT_ABANDONED"),
    NotQuarantined: StatusRule(grpc.StatusCode.FAILED_PRECONDITION, "NOT_QUARANTINED"),
    ConversationNotFound: StatusRule(grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND"),
    CursorExpired: StatusRule(grpc.StatusCode.FAILED_PRECONDITION, "CURSOR_EXPIRED"),
    Unavailable: StatusRule(
        grpc.StatusCode.UNAVAILABLE,
        "BACKEND_UNAVAILABLE",
        "the backend is unavailable; retry later",
        UNAVAILABLE_RETRY_S,
    ),
    # Stores should never leak past the committer; if one does, it is still
    # answered without its text.
    StoreUnavailable: StatusRule(
        grpc.StatusCode.UNAVAILABLE,
        "BACKEND_UNAVAILABLE",
        "the backend is unavailable; retry later",
        UNAVAILABLE_RETRY_S,
    ),
}
INTERNAL_RULE = StatusRule(grpc.StatusCode.INTERNAL, "INTERNAL", "internal error")


def rule_for(exc: BaseException) -> StatusRule | None:
    """The row of the most specific class of ``exc`` in the table, if any."""
    for cls in type(exc).__mro__:
        rule = STATUS_TABLE.get(cls)
        if rule is not None:
            return rule
    return None


def _metadata(exc: BaseException) -> dict[str, str]:
    """Ids that let the caller retry or reconcile (never content)."""
    if isinstance(exc, Recoverable):
        k = exc.key
        return {
            "tenant": k.tenant,
            "sender": k.sender,
            "cmid": k.cmid,
            "conversation": exc.conversation,
            "stage": exc.reason,
        }
    if isinstance(exc, IdempotencyConflict):
        return {"tenant": exc.key.tenant, "sender": exc.key.sender, "cmid": exc.key.cmid}
    if isinstance(exc, CursorExpired):
        return {
            "lane": exc.lane,
            "epoch": str(exc.epoch),
            "trim_watermark": str(exc.trim_watermark),
            "why": exc.why,
        }
    return {}


def _pack(message: error_details_pb2.ErrorInfo | error_details_pb2.RetryInfo) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def to_status_proto(exc: BaseException) -> status_pb2.Status:
    """The ``google.rpc.Status`` for ``exc`` (INTERNAL for anything unmapped)."""
    rule = rule_for(exc) or INTERNAL_RULE
    message = rule.message if rule.message is not None else str(exc)
    details = [
        _pack(
            error_details_pb2.ErrorInfo(reason=rule.reason, domain=DOMAIN, metadata=_metadata(exc))
        )
    ]
    retry = exc.retry_after_s if isinstance(exc, QuotaExceeded) else rule.retry_after_s
    if retry is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(max(0, int(retry * 1e9)))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    return status_pb2.Status(code=rule.code.value[0], message=message, details=details)


def to_status(exc: BaseException) -> grpc.Status:
    """``to_status_proto`` as a ``grpc.Status`` for ``abort_with_status``."""
    return rpc_status.to_status(to_status_proto(exc))


# --- client side ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusDetails:
    """What the client reads back from a status."""

    reason: str = ""
    metadata: Mapping[str, str] | None = None
    retry_after_s: float | None = None


def parse_details(trailing: Sequence[tuple[str, str | bytes]] | None) -> StatusDetails:
    """The ErrorInfo and RetryInfo of a status, from its trailing metadata."""
    for key, value in trailing or ():
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        reason, metadata, retry = "", None, None
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.domain == DOMAIN:
                reason, metadata = info.reason, dict(info.metadata)
            hint = error_details_pb2.RetryInfo()
            if detail.Unpack(hint):
                retry = hint.retry_delay.ToNanoseconds() / 1e9
        return StatusDetails(reason, metadata, retry)
    return StatusDetails()


_BY_REASON = {
    rule.reason: cls for cls, rule in STATUS_TABLE.items() if issubclass(cls, CommitError)
}


def from_status(code: grpc.StatusCode, message: str, details: StatusDetails) -> CommitError:
    """The exception a status stands for (the inverse of ``to_status``)."""
    cls = _BY_REASON.get(details.reason)
    md = details.metadata or {}
    if cls is None:
        if code is grpc.StatusCode.UNAVAILABLE:
            return Unavailable(message or "the server is unavailable")
        return RemoteError(code, message)
    if cls is IdempotencyConflict:
        return IdempotencyConflict(_key(md))
    if cls is Recoverable:
        return Recoverable(_key(md), md.get("conversation", ""), md.get("stage", "unknown"))
    if cls is QuotaExceeded:
        return QuotaExceeded(message, details.retry_after_s or 1.0)
    if cls is CursorExpired:
        return CursorExpired(
            md.get("lane", ""),
            _number(md.get("epoch")),
            _number(md.get("trim_watermark")),
            md.get("why", ""),
        )
    return cls(message)


def _number(text: str | None) -> int:
    return int(text) if text and text.isdigit() else 0


def _key(md: Mapping[str, str]) -> CommitKey:
    return CommitKey(md.get("tenant", ""), md.get("sender", ""), md.get("cmid", ""))
