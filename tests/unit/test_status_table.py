"""The error table: every row travels to a status and back to the same exception."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2

from service.api import errors
from service.api.errors import (
    STATUS_TABLE,
    ConversationExists,
    FailClosed,
    RemoteError,
    RequestTooLarge,
)
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
    StoreConflict,
    StoreUnavailable,
    Unavailable,
)
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.ids import CommitKey

KEY = CommitKey("t1", "alice", "m-1")
README = Path(__file__).resolve().parents[2] / "README.md"

EXAMPLES: list[tuple[CommitError, grpc.StatusCode]] = [
    (InvalidClientMessageId("client_message_id must be ..."), grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequest("device must be ..."), grpc.StatusCode.INVALID_ARGUMENT),
    (NotAMember("sender is not a member"), grpc.StatusCode.PERMISSION_DENIED),
    (IdempotencyConflict(KEY), grpc.StatusCode.ALREADY_EXISTS),
    (ConversationExists("conversation already exists"), grpc.StatusCode.ALREADY_EXISTS),
    (QuotaExceeded("slow down", retry_after_s=0.25), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (RequestTooLarge("the request is larger than 10 bytes"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Recoverable(KEY, "c1", "reserve failed"), grpc.StatusCode.UNAVAILABLE),
    (CommitNotFound("no commit"), grpc.StatusCode.NOT_FOUND),
    (ConversationNotFound("conversation not found"), grpc.StatusCode.NOT_FOUND),
    (
        CursorExpired("inbox", 2, 17, "entries after it were trimmed"),
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
    (CommitAbandoned(), grpc.StatusCode.FAILED_PRECONDITION),
    (NotQuarantined("this key has no quarantined intent"), grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable("membership is unavailable: backend error"), grpc.StatusCode.UNAVAILABLE),
    (FailClosed("writes refused until the backend is fixed: ..."), grpc.StatusCode.UNAVAILABLE),
]


def _round_trip(exc: BaseException) -> tuple[grpc.StatusCode, str, CommitError]:
    status = errors.to_status(exc)
    details = errors.parse_details(list(status.trailing_metadata))
    return status.code, status.details, errors.from_status(status.code, status.details, details)


def test_every_domain_error_class_has_an_example() -> None:
    assert {type(e) for e, _ in EXAMPLES} == {c for c in STATUS_TABLE if issubclass(c, CommitError)}


@pytest.mark.parametrize(("exc", "code"), EXAMPLES, ids=lambda v: type(v).__name__)
def test_each_row_round_trips(exc: CommitError, code: grpc.StatusCode) -> None:
    got_code, _message, back = _round_trip(exc)
    assert got_code == code
    assert type(back) is type(exc)
    assert str(back) == str(exc) or isinstance(exc, Unavailable)


def test_keys_and_retry_hints_survive() -> None:
    _, _, conflict = _round_trip(IdempotencyConflict(KEY))
    assert isinstance(conflict, IdempotencyConflict) and conflict.key == KEY
    _, _, recoverable = _round_trip(Recoverable(KEY, "c1", "reserve failed"))
    assert isinstance(recoverable, Recoverable)
    assert (recoverable.key, recoverable.conversation, recoverable.reason) == (
        KEY,
        "c1",
        "reserve failed",
    )
    _, _, quota = _round_trip(QuotaExceeded("slow down", retry_after_s=0.25))
    assert isinstance(quota, QuotaExceeded) and quota.retry_after_s == pytest.approx(0.25)


def test_cursor_expired_carries_the_lane_epoch_and_watermark() -> None:
    status = errors.to_status_proto(
        CursorExpired("conversation:c9", 3, 41, "the lane is in another epoch")
    )
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == "CURSOR_EXPIRED"
    assert dict(info.metadata) == {
        "lane": "conversation:c9",
        "epoch": "3",
        "trim_watermark": "41",
        "why": "the lane is in another epoch",
    }
    _, _, back = _round_trip(
        CursorExpired("conversation:c9", 3, 41, "the lane is in another epoch")
    )
    assert isinstance(back, CursorExpired)
    assert (back.lane, back.epoch, back.trim_watermark) == ("conversation:c9", 3, 41)


def test_recoverable_error_info_names_the_key() -> None:
    status = errors.to_status_proto(Recoverable(KEY, "c1", "reserve failed"))
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain) == ("COMMIT_RECOVERABLE", "message-committer.v1")
    assert dict(info.metadata) == {
        "tenant": "t1",
        "sender": "alice",
        "cmid": "m-1",
        "conversation": "c1",
        "stage": "reserve failed",
    }


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("connection to redis://:pw@10.0.0.1 refused"),
        InjectedCrash(FaultPoint.AFTER_RESERVE),
        StoreConflict("script mc_reserve refused key mc:{t1}:c"),
    ],
)
def test_anything_else_is_internal_with_no_text(exc: Exception) -> None:
    code, message, back = _round_trip(exc)
    assert (code, message) == (grpc.StatusCode.INTERNAL, "internal error")
    assert isinstance(back, RemoteError) and back.code is grpc.StatusCode.INTERNAL


def test_unavailable_never_carries_the_backend_text() -> None:
    for exc in (Unavailable("backend not ready: host 10.0.0.1:6379"), StoreUnavailable("10.0.0.1")):
        code, message, back = _round_trip(exc)
        assert (code, message) == (
            grpc.StatusCode.UNAVAILABLE,
            "the backend is unavailable; retry later",
        )
        assert isinstance(back, Unavailable)


def test_a_status_without_details_still_maps() -> None:
    empty = errors.StatusDetails()
    assert isinstance(errors.from_status(grpc.StatusCode.UNAVAILABLE, "", empty), Unavailable)
    other = errors.from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "late", empty)
    assert isinstance(other, RemoteError) and other.code is grpc.StatusCode.DEADLINE_EXCEEDED


def test_the_readme_documents_every_row() -> None:
    readme = README.read_text()
    for rule in [*STATUS_TABLE.values(), errors.INTERNAL_RULE]:
        assert f"`{rule.reason}`" in readme, rule.reason
        assert f"`{rule.code.name}`" in readme
