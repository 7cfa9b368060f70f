"""Bytes of what the local store keeps: sends and records in their wire form.

A pending send is stored as its ``AuthenticatedSend`` protobuf, the very
message Commit and ResumeExisting carry, so a resend after a restart is the
same request byte for byte and the server's identity check accepts it.
"""

from __future__ import annotations

from service.api import convert
from service.domain.model import AuthenticatedSend, MessageRecord, ReserveCandidate
from service.gen.message_committer.v1 import committer_pb2 as pb


def send_to_bytes(send: AuthenticatedSend) -> bytes:
    return convert.send_to_proto(send).SerializeToString(deterministic=True)


def send_from_bytes(data: bytes) -> AuthenticatedSend:
    return convert.send_from_proto(pb.AuthenticatedSend.FromString(data))


def record_to_bytes(record: MessageRecord) -> bytes:
    return convert.record_to_proto(record).SerializeToString(deterministic=True)


def record_from_bytes(data: bytes) -> MessageRecord:
    return convert.record_from_proto(pb.MessageRecord.FromString(data))


def send_of(record: MessageRecord) -> AuthenticatedSend:
    """The send a record was committed from (what its sender's pending holds)."""
    return AuthenticatedSend(
        tenant=record.tenant,
        sender=record.sender,
        device=record.device,
        conversation=record.conversation,
        cmid=record.cmid,
        content=record.content,
        mentions=record.mentions,
        reply_to=record.reply_to,
    )


def same_identity(record: MessageRecord, send: AuthenticatedSend) -> bool:
    """Whether ``record`` is the commit of ``send``: the identity digest the
    server compares (tenant, sender, device, conversation, cmid, content,
    mentions, reply-to), not the cmid alone."""
    return send_of(record).reserve_identity_digest() == send.reserve_identity_digest()


def committed_record(
    send: AuthenticatedSend, seq: int, message_id: str, server_ts_ms: int
) -> MessageRecord:
    """The record the server holds for ``send`` committed at these coordinates."""
    return send.record_at(seq, ReserveCandidate(message_id, server_ts_ms))
