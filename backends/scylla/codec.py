"""Rows <-> domain values. Deterministic both ways: the same record always
binds the same values, so rewriting a row with the same record is a no-op
in content."""

from __future__ import annotations

from typing import Any

from cassandra.query import UNSET_VALUE

from service.domain.errors import StoreCorrupt
from service.domain.ids import CommitKey
from service.domain.model import (
    AuthenticatedSend,
    BodyReference,
    CommitIntent,
    CommitState,
    CommittedMessage,
    FrozenDeliveryInput,
    MessageContent,
    MessageRecord,
    MessageType,
    OutboxPublication,
    ReserveCandidate,
)

Row = dict[str, Any]

BODY_COLUMNS = (
    "device",
    "message_type",
    "custom_type",
    "body",
    "body_ref_uri",
    "body_ref_size",
    "body_ref_sha256",
    "mentions",
    "reply_to",
)
"""The record body: what compaction drops from a committed intent."""


def body_values(record: MessageRecord, *, unset_absent: bool) -> tuple[object, ...]:
    """Values for BODY_COLUMNS. ``unset_absent`` binds UNSET (no tombstone) for
    an absent body reference instead of null."""
    content = record.content
    ref = content.body_ref
    absent: object = UNSET_VALUE if unset_absent else None
    return (
        record.device,
        content.message_type.value,
        content.custom_type,
        content.body,
        ref.uri if ref else absent,
        ref.size_bytes if ref else absent,
        ref.sha256 if ref else absent,
        list(record.mentions),
        record.reply_to,
    )


def _text(row: Row, column: str) -> str:
    value = row.get(column)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise StoreCorrupt("a stored text column has the wrong type")
    return value


def _int(row: Row, column: str) -> int:
    value = row.get(column)
    if not isinstance(value, int):
        raise StoreCorrupt("a stored number is missing")
    return value


def content_from_row(row: Row) -> MessageContent:
    try:
        message_type = MessageType(_text(row, "message_type"))
    except ValueError:
        raise StoreCorrupt("a stored message type is unknown") from None
    ref = None
    if row.get("body_ref_uri") is not None:
        ref = BodyReference(
            _text(row, "body_ref_uri"), _int(row, "body_ref_size"), _text(row, "body_ref_sha256")
        )
    body = row.get("body") or b""
    return MessageContent(message_type, bytes(body), ref, _text(row, "custom_type"))


def record_from_row(
    tenant: str, conversation: str, sender: str, cmid: str, row: Row
) -> MessageRecord:
    """A record from a history or commits row (``sender``/``cmid`` given by the key)."""
    return MessageRecord(
        tenant=tenant,
        conversation=conversation,
        seq=_int(row, "seq"),
        message_id=_text(row, "message_id"),
        sender=sender,
        device=_text(row, "device"),
        cmid=cmid,
        content=content_from_row(row),
        mentions=tuple(row.get("mentions") or ()),
        reply_to=_text(row, "reply_to"),
        server_ts_ms=_int(row, "server_ts_ms"),
    )


def history_record(tenant: str, conversation: str, row: Row) -> MessageRecord:
    return record_from_row(tenant, conversation, _text(row, "sender"), _text(row, "cmid"), row)


def state_of(row: Row) -> CommitState:
    try:
        return CommitState(_text(row, "state"))
    except ValueError:
        raise StoreCorrupt("a stored commit state is unknown") from None


def publication_of(row: Row) -> OutboxPublication | None:
    stream, position = row.get("pub_stream"), row.get("pub_position")
    if stream is None or position is None:
        return None
    return OutboxPublication(stream, position)


def committed_from_row(key: CommitKey, row: Row) -> CommittedMessage:
    return CommittedMessage(
        _text(row, "conversation"),
        key.cmid,
        _text(row, "message_id"),
        _int(row, "seq"),
        _int(row, "server_ts_ms"),
    )


def intent_from_row(key: CommitKey, row: Row, state: CommitState) -> CommitIntent:
    """An unfinished intent from its full (never compacted) commits row."""
    identity = row.get("identity")
    if not isinstance(identity, bytes):
        raise StoreCorrupt("a stored identity is missing")
    record = record_from_row(key.tenant, _text(row, "conversation"), key.sender, key.cmid, row)
    delivery = delivery_of(row)
    return CommitIntent(
        key=key,
        identity=identity,
        record=record,
        delivery=delivery,
        state=state,
        created_at_ms=_int(row, "created_at_ms"),
        publication=publication_of(row),
    )


def delivery_of(row: Row) -> FrozenDeliveryInput:
    """By reference (no ``recipients``), or release 1's inline recipient list."""
    recipients = row.get("recipients")
    inline = None if recipients is None else tuple(str(r) for r in recipients)
    return FrozenDeliveryInput(inline, _int(row, "membership_version"))


def recipients_value(delivery: FrozenDeliveryInput) -> list[str] | None:
    """The ``recipients`` column: None for a delivery by reference."""
    return None if delivery.recipients is None else list(delivery.recipients)


def new_intent(
    request: AuthenticatedSend,
    identity: bytes,
    delivery: FrozenDeliveryInput,
    candidate: ReserveCandidate,
    seq: int,
    created_at_ms: int,
) -> CommitIntent:
    """The RESERVED intent a first reserve writes: the candidate's coordinates at ``seq``."""
    record = request.record_at(seq, candidate)
    return CommitIntent(
        key=request.key,
        identity=identity,
        record=record,
        delivery=delivery,
        state=CommitState.RESERVED,
        created_at_ms=created_at_ms,
    )
