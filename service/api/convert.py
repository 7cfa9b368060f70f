"""Conversion between the protos and the domain types, in both directions.

The server turns requests into domain values (``*_from_proto``) and domain
results into responses (``*_to_proto``); the client does the reverse. Wire
defaults that mean "use the default" (0 or unset) are resolved here, in one
place, so a servicer never has to know them.
"""

from __future__ import annotations

from service.domain.errors import InvalidRequest
from service.domain.ids import CommitKey
from service.domain.model import (
    AuthenticatedSend,
    BodyReference,
    CommittedMessage,
    Direction,
    HistoryPage,
    HistoryQuery,
    MessageContent,
    MessageRecord,
    MessageType,
)
from service.gen.message_committer.v1 import committer_pb2 as pb

DEFAULT_HISTORY_LIMIT = 50
DEFAULT_HISTORY_BYTES = 1 << 20

_TYPES: dict[pb.MessageType.ValueType, MessageType] = {
    pb.MESSAGE_TYPE_TEXT: MessageType.TEXT,
    pb.MESSAGE_TYPE_IMAGE: MessageType.IMAGE,
    pb.MESSAGE_TYPE_FILE: MessageType.FILE,
    pb.MESSAGE_TYPE_AUDIO: MessageType.AUDIO,
    pb.MESSAGE_TYPE_VIDEO: MessageType.VIDEO,
    pb.MESSAGE_TYPE_LOCATION: MessageType.LOCATION,
    pb.MESSAGE_TYPE_CUSTOM: MessageType.CUSTOM,
}
_TYPE_NUMBERS = {kind: number for number, kind in _TYPES.items()}
_DIRECTIONS: dict[pb.Direction.ValueType, Direction] = {
    pb.DIRECTION_UNSPECIFIED: Direction.BACKWARD,
    pb.DIRECTION_BACKWARD: Direction.BACKWARD,
    pb.DIRECTION_FORWARD: Direction.FORWARD,
}
_DIRECTION_NUMBERS = {
    Direction.BACKWARD: pb.DIRECTION_BACKWARD,
    Direction.FORWARD: pb.DIRECTION_FORWARD,
}


# --- content -------------------------------------------------------------------


def content_from_proto(msg: pb.MessageContent) -> MessageContent:
    kind = _TYPES.get(msg.message_type)
    if kind is None:
        raise InvalidRequest("content.message_type must be a known, non-UNSPECIFIED message type")
    body_form = msg.WhichOneof("body")
    ref = None
    if body_form == "body_ref":
        r = msg.body_ref
        ref = BodyReference(uri=r.uri, size_bytes=r.size_bytes, sha256=r.sha256)
    return MessageContent(
        message_type=kind,
        body=msg.inline_body if body_form == "inline_body" else b"",
        body_ref=ref,
        custom_type=msg.custom_type,
    )


def content_to_proto(content: MessageContent) -> pb.MessageContent:
    msg = pb.MessageContent(
        message_type=_TYPE_NUMBERS[content.message_type], custom_type=content.custom_type
    )
    if content.body_ref is not None:
        ref = content.body_ref
        msg.body_ref.CopyFrom(
            pb.BodyReference(uri=ref.uri, size_bytes=ref.size_bytes, sha256=ref.sha256)
        )
    else:
        msg.inline_body = content.body
    return msg


# --- sends and keys ------------------------------------------------------------


def send_from_proto(msg: pb.AuthenticatedSend) -> AuthenticatedSend:
    return AuthenticatedSend(
        tenant=msg.tenant,
        sender=msg.sender,
        device=msg.device,
        conversation=msg.conversation,
        cmid=msg.client_message_id,
        content=content_from_proto(msg.content),
        mentions=tuple(msg.mentions),
        reply_to=msg.reply_to,
    )


def send_to_proto(send: AuthenticatedSend) -> pb.AuthenticatedSend:
    return pb.AuthenticatedSend(
        tenant=send.tenant,
        sender=send.sender,
        device=send.device,
        conversation=send.conversation,
        client_message_id=send.cmid,
        content=content_to_proto(send.content),
        mentions=list(send.mentions),
        reply_to=send.reply_to,
    )


def key_from_resume(msg: pb.ResumeRequest) -> CommitKey:
    return CommitKey(msg.tenant, msg.sender, msg.client_message_id)


# --- committed messages ----------------------------------------------------------


def committed_to_proto(message: CommittedMessage) -> pb.CommittedMessage:
    return pb.CommittedMessage(
        conversation=message.conversation,
        client_message_id=message.cmid,
        message_id=message.message_id,
        seq=message.seq,
        server_ts_ms=message.server_ts_ms,
    )


def committed_from_proto(msg: pb.CommittedMessage) -> CommittedMessage:
    return CommittedMessage(
        conversation=msg.conversation,
        cmid=msg.client_message_id,
        message_id=msg.message_id,
        seq=msg.seq,
        server_ts_ms=msg.server_ts_ms,
    )


# --- history ---------------------------------------------------------------------


def history_query_from_proto(msg: pb.HistoryRequest) -> HistoryQuery:
    direction = _DIRECTIONS.get(msg.direction)
    if direction is None:
        raise InvalidRequest("direction must be a known direction")
    return HistoryQuery(
        tenant=msg.tenant,
        conversation=msg.conversation,
        actor=msg.actor,
        direction=direction,
        anchor_seq=msg.anchor_seq,
        limit=msg.limit or DEFAULT_HISTORY_LIMIT,
        max_bytes=msg.max_bytes or DEFAULT_HISTORY_BYTES,
    )


def history_query_to_proto(query: HistoryQuery) -> pb.HistoryRequest:
    return pb.HistoryRequest(
        tenant=query.tenant,
        conversation=query.conversation,
        actor=query.actor,
        direction=_DIRECTION_NUMBERS[query.direction],
        anchor_seq=query.anchor_seq,
        limit=query.limit,
        max_bytes=query.max_bytes,
    )


def record_to_proto(record: MessageRecord) -> pb.MessageRecord:
    return pb.MessageRecord(
        tenant=record.tenant,
        conversation=record.conversation,
        seq=record.seq,
        message_id=record.message_id,
        sender=record.sender,
        device=record.device,
        client_message_id=record.cmid,
        content=content_to_proto(record.content),
        mentions=list(record.mentions),
        reply_to=record.reply_to,
        server_ts_ms=record.server_ts_ms,
    )


def record_from_proto(msg: pb.MessageRecord) -> MessageRecord:
    return MessageRecord(
        tenant=msg.tenant,
        conversation=msg.conversation,
        seq=msg.seq,
        message_id=msg.message_id,
        sender=msg.sender,
        device=msg.device,
        cmid=msg.client_message_id,
        content=content_from_proto(msg.content),
        mentions=tuple(msg.mentions),
        reply_to=msg.reply_to,
        server_ts_ms=msg.server_ts_ms,
    )


def page_to_proto(page: HistoryPage) -> pb.HistoryPage:
    return pb.HistoryPage(
        conversation=page.conversation,
        direction=_DIRECTION_NUMBERS[page.direction],
        anchor_seq=page.anchor_seq,
        max_bytes=page.max_bytes,
        records=[record_to_proto(r) for r in page.records],
        available_from_seq=page.available_from_seq,
        last_seq=page.last_seq,
        next_anchor=page.next_anchor,
        truncated_by_bytes=page.truncated_by_bytes,
        abandoned_seqs=page.abandoned_seqs,
        hidden_seqs=page.hidden_seqs,
    )


def page_from_proto(msg: pb.HistoryPage) -> HistoryPage:
    return HistoryPage(
        conversation=msg.conversation,
        direction=_DIRECTIONS[msg.direction],
        anchor_seq=msg.anchor_seq,
        max_bytes=msg.max_bytes,
        records=tuple(record_from_proto(r) for r in msg.records),
        available_from_seq=msg.available_from_seq,
        last_seq=msg.last_seq,
        next_anchor=msg.next_anchor,
        truncated_by_bytes=msg.truncated_by_bytes,
        abandoned_seqs=tuple(msg.abandoned_seqs),
        hidden_seqs=tuple(msg.hidden_seqs),
    )
